/* The safetensors container (huggingface/safetensors, format described in its README): an
 * 8-byte little-endian header length N, N bytes of JSON {"name": {"dtype", "shape",
 * "data_offsets": [begin, end]}, "__metadata__": {string: string}}, then the data, offsets
 * relative to its start. quantd reads it for /dequantize and writes it for binary results, through
 * the checkpoint reader and header writer (server/checkpoint/safetensors.c). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/json_body.h"
#include "http/safetensors.h"
#include "checkpoint/safetensors.h"
#include "queue/hostmem.h"

static const char *const st_dtype_names[QD_DTYPE_COUNT] = {"F32", "F16", "BF16", "U8", "I8", "I32", "U32"};

const char *qd_safetensors_dtype(enum qd_dtype t) { return st_dtype_names[t]; }

static int st_dtype_parse(const char *s, enum qd_dtype *t)
{
    for (int i = 0; s && i < QD_DTYPE_COUNT; i++)
        if (!strcmp(s, st_dtype_names[i])) {
            *t = (enum qd_dtype)i;
            return 0;
        }
    return -1;
}

int qd_safetensors_parse(const unsigned char *buf, size_t len, size_t max_header, struct qd_st_tensor *t, int max,
                         cJSON **metadata, char *err, size_t errlen)
{
    /* the checkpoint reader's validation, then what a request body may hold */
    struct qd_st_file f;
    *metadata = NULL;
    if (qd_st_parse(buf, len, max_header ? max_header : QD_JSON_LIMIT_DEFAULT, "safetensors body", &f, err, errlen))
        return -1;
    if (f.n > max) {
        snprintf(err, errlen, "safetensors body holds more than %d tensors", max);
        qd_st_free(&f);
        return -1;
    }
    for (int i = 0; i < f.n; i++) {
        const struct qd_st_entry *e = &f.t[i];
        struct qd_st_tensor *x = &t[i];
        if (strlen(e->name) >= sizeof x->name || st_dtype_parse(e->dtype, &x->dtype) || e->ndim > QD_MAX_DIMS) {
            snprintf(err, errlen, "safetensors tensor '%.64s': name over %zu bytes, or dtype %s not taken here",
                     e->name, sizeof x->name - 1, e->dtype);
            qd_st_free(&f);
            return -1;
        }
        strcpy(x->name, e->name);
        x->ndim = e->ndim;
        memcpy(x->shape, e->shape, sizeof x->shape);
        x->data = e->data;
        x->bytes = (size_t)(e->end - e->begin);
    }
    int n = f.n;
    *metadata = f.metadata;
    f.metadata = NULL;
    qd_st_free(&f);
    return n;
}

char *qd_safetensors_header(const struct qd_st_tensor *t, int n, const cJSON *metadata, size_t *len)
{
    struct qd_st_out o[QD_MAX_COMPONENTS];
    if (n > QD_MAX_COMPONENTS)
        return NULL;
    for (int i = 0; i < n; i++) {
        o[i] = (struct qd_st_out){.name = t[i].name, .dtype = st_dtype_names[t[i].dtype], .ndim = t[i].ndim,
                                  .bytes = t[i].bytes};
        memcpy(o[i].shape, t[i].shape, sizeof o[i].shape);
    }
    return (char *)qd_st_header(o, n, metadata, len);
}

char *qd_safetensors_build(const struct qd_st_tensor *t, int n, const cJSON *metadata, size_t *out_len)
{
    size_t off = 0, hlen;
    for (int i = 0; i < n; i++)
        off += t[i].bytes;
    char *header = qd_safetensors_header(t, n, metadata, &hlen);
    char *out = header ? qd_hostmem_get(hlen + off) : NULL; /* pooled: no fresh pages to fault in */
    if (out) {
        memcpy(out, header, hlen);
        char *p = out + hlen;
        for (int i = 0; i < n; i++) {
            memcpy(p, t[i].data, t[i].bytes);
            p += t[i].bytes;
        }
        *out_len = hlen + off;
    }
    free(header);
    return out;
}
