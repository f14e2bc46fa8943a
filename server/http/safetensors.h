/* The safetensors container of requests and answers (safetensors.c): parsing one, and building
 * one for an answer. */
#ifndef QD_HTTP_SAFETENSORS_H
#define QD_HTTP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/registry.h"

struct cJSON;

/* One tensor of a safetensors container, pointing into the container. */
struct qd_st_tensor {
    char name[64];
    enum qd_dtype dtype;
    int ndim;
    int64_t shape[QD_MAX_DIMS];
    const unsigned char *data;
    size_t bytes;
};

#define QD_ST_MAX_TENSORS 16

/* Parses a safetensors container: u64 LE header length, JSON header, data. On success returns
 * the tensor count and sets *metadata to the parsed __metadata__ object (caller deletes; NULL
 * when absent). -1 with a message on malformed input. The header may take max_header bytes (0:
 * QD_JSON_LIMIT_DEFAULT). */
int qd_safetensors_parse(const unsigned char *buf, size_t len, size_t max_header, struct qd_st_tensor *t, int max,
                         struct cJSON **metadata, char *err, size_t errlen);

const char *qd_safetensors_dtype(enum qd_dtype t);
/* A container of n tensors with string-valued metadata, in a buffer from qd_hostmem_get (free
 * it with qd_hostmem_put); NULL on no memory. */
char *qd_safetensors_build(const struct qd_st_tensor *t, int n, const struct cJSON *metadata,
                           size_t *out_len);
/* Its first part alone: the length and the JSON header for those tensors (malloc'd), the data
 * to follow in order; NULL on no memory. */
char *qd_safetensors_header(const struct qd_st_tensor *t, int n, const struct cJSON *metadata, size_t *len);

#endif
