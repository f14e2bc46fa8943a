/* safetensors files as checkpoints hold them (huggingface/safetensors): every dtype, any name,
 * validated the way the format's own loader does (header length bounded, JSON object, offsets
 * in order, contiguous, covering the data exactly, size = shape x dtype, no overflow), and a
 * sharded model's model.safetensors.index.json. */
#ifndef QD_CKPT_SAFETENSORS_H
#define QD_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define QD_ST_MAX_HEADER (100u << 20) /* safetensors' own limit: 100 MB */
#define QD_ST_MAX_DIMS 8

struct qd_st_entry {
    char *name;
    char dtype[12];      /* as written: "BF16", "F8_E4M3", ... */
    int elem_bits;       /* 4 for F4, 6 for F6_*, else 8 x bytes */
    int ndim;
    int64_t shape[QD_ST_MAX_DIMS];
    uint64_t begin, end; /* within the data section */
    const uint8_t *data;
};

struct qd_st_file {
    int n;
    struct qd_st_entry *t;  /* in the header's order */
    cJSON *metadata;        /* "__metadata__" or NULL */
};

/* Parses a whole file held in buf; tensors point into it. 0, or -1 with the tensor or field
 * named in err (prefixed with `what`, e.g. the file name). The header may take max_header bytes
 * (0: QD_ST_MAX_HEADER); it is walked entry by entry (checkpoint/json_span.h), so its memory is
 * the entries', a few times the header, not a JSON tree's. Names are unique and hold no NUL. */
int qd_st_parse(const uint8_t *buf, size_t len, uint64_t max_header, const char *what, struct qd_st_file *f,
                char *err, size_t errlen);
void qd_st_free(struct qd_st_file *f);

/* Bits per element of a safetensors dtype, or 0 if unknown. */
int qd_st_dtype_bits(const char *dtype);

/* A safetensors header for tensors laid out back to back in the given order (names, dtypes,
 * shapes, byte sizes), with __metadata__, padded with spaces to 8 bytes; the 8-byte length
 * first. malloc'd, *len set. */
struct qd_st_out {
    const char *name, *dtype;
    int ndim;
    int64_t shape[QD_ST_MAX_DIMS];
    uint64_t bytes;
};
uint8_t *qd_st_header(const struct qd_st_out *t, int n, const cJSON *metadata, size_t *len);

#endif
