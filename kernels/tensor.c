/* Status names, dtypes and tensor shapes. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"

const char *qd_strerror(enum qd_status s)
{
    static const char *const names[] = {"ok", "invalid argument", "unsupported shape",
                                        "non-finite input", "out of memory", "busy",
                                        "device error", "i/o error", "not found", "cancelled",
                                        "forbidden", "no space left"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown error";
}

static const char *const dtype_names[QD_DTYPE_COUNT] = {"f32", "f16", "bf16", "u8", "i8", "i32", "u32"};
static const size_t dtype_sizes[QD_DTYPE_COUNT] = {4, 2, 2, 1, 1, 4, 4};

const char *qd_dtype_name(enum qd_dtype t) { return dtype_names[t]; }
size_t qd_dtype_size(enum qd_dtype t) { return dtype_sizes[t]; }

int qd_dtype_parse(const char *name, enum qd_dtype *out)
{
    /* also the spellings numpy/torch users type */
    static const struct { const char *alias; enum qd_dtype t; } aliases[] = {
        {"float32", QD_F32}, {"float16", QD_F16}, {"bfloat16", QD_BF16}, {"fp32", QD_F32},
        {"fp16", QD_F16}, {"half", QD_F16}};
    for (int i = 0; name && i < QD_DTYPE_COUNT; i++)
        if (!strcmp(name, dtype_names[i])) {
            *out = (enum qd_dtype)i;
            return 0;
        }
    for (size_t i = 0; name && i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(name, aliases[i].alias)) {
            *out = aliases[i].t;
            return 0;
        }
    return -1;
}

int64_t qd_tensor_numel(const struct qd_tensor *t) { return t->rows * t->cols; }

/* Elements are limited to 2^40: far above any body the service takes, and low enough that
 * byte counts of every component stay exact in int64 arithmetic. */
#define QD_MAX_NUMEL (INT64_C(1) << 40)

enum qd_status qd_tensor_set_shape(struct qd_tensor *t, int ndim, const int64_t *shape)
{
    if (ndim < 1 || ndim > QD_MAX_DIMS)
        return QD_ESHAPE;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1 || shape[i] > QD_MAX_NUMEL || n > QD_MAX_NUMEL / shape[i])
            return QD_ESHAPE;
        n *= shape[i];
        t->shape[i] = shape[i];
    }
    t->ndim = ndim;
    t->cols = shape[ndim - 1];
    t->rows = n / t->cols;
    return QD_OK;
}

enum qd_status qd_shape_parse(const char *text, int *ndim, int64_t *shape, char *err, size_t len)
{
    const char *p = text;
    int n = 0;
    if (!p || !*p) {
        snprintf(err, len, "shape is missing (expected e.g. 4096,4096)");
        return QD_ESHAPE;
    }
    while (*p) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9' || n == QD_MAX_DIMS)
            goto bad;
        long long v = strtoll(p, &end, 10);
        if (errno || v < 1)
            goto bad;
        shape[n++] = v;
        p = end;
        if (*p == ',') /* commas only, as the docs and the API schema say */
            p++;
        else if (*p)
            goto bad;
        if (p[-1] == ',' && !*p)
            goto bad;
    }
    *ndim = n;
    struct qd_tensor t;
    if (qd_tensor_set_shape(&t, n, shape) != QD_OK) {
        snprintf(err, len, "shape '%s' is too large", text);
        return QD_ESHAPE;
    }
    return QD_OK;
bad:
    snprintf(err, len, "bad shape '%s': expected 1 to %d positive integers separated by commas",
             text, QD_MAX_DIMS);
    return QD_ESHAPE;
}
