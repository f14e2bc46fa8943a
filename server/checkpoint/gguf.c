/* GGUF v3 reader and metadata writer (see gguf.h). Every count and length is checked against
 * the bytes left before anything is allocated or read; errors name the field and both numbers. */
#include "checkpoint/gguf.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/ggml_blocks.h"
#include "checkpoint/names.h"

/* ggml.c type_traits: name, elements per block, bytes per block (the block structs of
 * kernels/ggml_blocks.h); llama-quant.cpp's fallback for the 256-block types;
 * llama-model-loader.cpp's guessed file type. */
#define BLOCK(type, elems) elems, (int)sizeof(struct qd_block_##type)
#define K QD_QK_K
static const struct qd_ggml_type ggml_types[QD_GGML_TYPE_COUNT] = {
    [0] = {"f32", 1, 4, 0, 0},
    [1] = {"f16", 1, 2, 0, 1},
    [2] = {"q4_0", BLOCK(q4_0, QD_GGML_QK), 0, 2},
    [3] = {"q4_1", BLOCK(q4_1, QD_GGML_QK), 0, 3},
    [6] = {"q5_0", BLOCK(q5_0, QD_GGML_QK), 0, 8},
    [7] = {"q5_1", BLOCK(q5_1, QD_GGML_QK), 0, 9},
    [8] = {"q8_0", BLOCK(q8_0, QD_GGML_QK), 0, 7},
    [9] = {"q8_1", BLOCK(q8_1, QD_GGML_QK)},
    [10] = {"q2_K", BLOCK(q2_K, K), QD_GGML_Q4_0, 10},
    [11] = {"q3_K", BLOCK(q3_K, K), QD_GGML_Q4_0, 12},
    [12] = {"q4_K", BLOCK(q4_K, K), QD_GGML_Q5_0, 15},
    [13] = {"q5_K", BLOCK(q5_K, K), QD_GGML_Q5_1, 17},
    [14] = {"q6_K", BLOCK(q6_K, K), QD_GGML_Q8_0, 18},
    [15] = {"q8_K", BLOCK(q8_K, K)},
    [16] = {"iq2_xxs", BLOCK(iq2_xxs, K), QD_GGML_IQ4_NL, 19},
    [17] = {"iq2_xs", BLOCK(iq2_xs, K), QD_GGML_IQ4_NL, 20},
    [18] = {"iq3_xxs", BLOCK(iq3_xxs, K), QD_GGML_IQ4_NL, 23},
    [19] = {"iq1_s", BLOCK(iq1_s, K), QD_GGML_IQ4_NL, 24},
    [20] = {"iq4_nl", BLOCK(iq4_nl, QD_GGML_QK), 0, 25},
    [21] = {"iq3_s", BLOCK(iq3_s, K), QD_GGML_IQ4_NL, 26},
    [22] = {"iq2_s", BLOCK(iq2_s, K), QD_GGML_IQ4_NL, 28},
    [23] = {"iq4_xs", BLOCK(iq4_xs, K), QD_GGML_IQ4_NL, 30},
    [24] = {"i8", 1, 1},
    [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},
    [27] = {"i64", 1, 8},
    [28] = {"f64", 1, 8},
    [29] = {"iq1_m", BLOCK(iq1_m, K), QD_GGML_IQ4_NL, 31},
    [30] = {"bf16", 1, 2, 0, 32},
    [34] = {"tq1_0", BLOCK(tq1_0, K), QD_GGML_Q4_0, 36},
    [35] = {"tq2_0", BLOCK(tq2_0, K), QD_GGML_Q4_0, 37},
    [39] = {"mxfp4", BLOCK(mxfp4_ggml, QD_GGML_QK)},
    [40] = {"nvfp4", BLOCK(nvfp4_ggml, QD_GGML_NVFP4_QK), 0, 39},
    [41] = {"q1_0", BLOCK(q1_0, QD_GGML_Q1_0_QK), 0, 40},
    [42] = {"q2_0", BLOCK(q2_0, QD_GGML_Q2_0_QK), QD_GGML_Q4_0, 41},
};
#undef K
#undef BLOCK

const struct qd_ggml_type *qd_ggml_type(uint32_t type)
{
    return type < QD_GGML_TYPE_COUNT && ggml_types[type].name ? &ggml_types[type] : NULL;
}

/* Sizes of the scalar value types (0 for string and array). */
static const size_t value_size[QD_GGUF_VALUE_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

struct reader {
    const uint8_t *buf;
    size_t len, pos;
    const volatile int *cancel;
    char *err;
    size_t errlen;
};

/* Long loops (keys, tensors, the strings of an array) look at the cancel flag this often. */
#define CANCEL_EVERY 4096

static int fail(struct reader *r, const char *fmt, ...);

static int cancelled(struct reader *r, uint64_t i)
{
    return i % CANCEL_EVERY == 0 && r->cancel && *r->cancel ? fail(r, "cancelled") : 0;
}

static int fail(struct reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(r->err, r->errlen, "gguf: ");
    vsnprintf(r->err + n, r->errlen > (size_t)n ? r->errlen - (size_t)n : 0, fmt, ap);
    va_end(ap);
    return -1;
}

static int take(struct reader *r, void *out, size_t n, const char *what)
{
    if (r->len - r->pos < n)
        return fail(r, "%s at byte %zu needs %zu bytes, %zu left", what, r->pos, n, r->len - r->pos);
    memcpy(out, r->buf + r->pos, n);
    r->pos += n;
    return 0;
}

static int u32(struct reader *r, uint32_t *v, const char *what) { return take(r, v, 4, what); }
static int u64(struct reader *r, uint64_t *v, const char *what) { return take(r, v, 8, what); }

/* A string: u64 length, then bytes. With out, a malloc'd NUL-terminated copy. */
static int string(struct reader *r, char **out, uint64_t max, const char *what)
{
    uint64_t n = 0;
    if (u64(r, &n, what))
        return -1;
    if (n > r->len - r->pos)
        return fail(r, "%s at byte %zu: length %" PRIu64 " exceeds the %zu bytes left", what, r->pos - 8, n,
                    r->len - r->pos);
    if (n > max)
        return fail(r, "%s at byte %zu: length %" PRIu64 " over the limit %" PRIu64, what, r->pos - 8, n, max);
    if (out) {
        if (!(*out = malloc(n + 1)))
            return fail(r, "no memory for %s", what);
        memcpy(*out, r->buf + r->pos, n);
        (*out)[n] = 0;
        if (strlen(*out) != n) {
            free(*out);
            *out = NULL;
            return fail(r, "%s at byte %zu holds a NUL byte", what, r->pos - 8);
        }
    }
    r->pos += n;
    return 0;
}

/* Skips one value of type t (an array: its element type, count and elements). */
static int value(struct reader *r, uint32_t t, const char *key, int in_array)
{
    if (t >= QD_GGUF_VALUE_TYPE_COUNT)
        return fail(r, "key '%s': value type %u unknown", key, t);
    if (t == QD_GGUF_STRING)
        return string(r, NULL, UINT64_MAX, "string value");
    if (t != QD_GGUF_ARRAY) {
        if (r->len - r->pos < value_size[t])
            return fail(r, "key '%s': value needs %zu bytes, %zu left", key, value_size[t], r->len - r->pos);
        r->pos += value_size[t];
        return 0;
    }
    if (in_array)
        return fail(r, "key '%s': arrays of arrays are not supported (as in ggml)", key);
    uint32_t et = 0;
    uint64_t n = 0;
    if (u32(r, &et, "array type") || u64(r, &n, "array length"))
        return -1;
    if (et >= QD_GGUF_VALUE_TYPE_COUNT || et == QD_GGUF_ARRAY)
        return fail(r, "key '%s': array element type %u not supported", key, et);
    if (et != QD_GGUF_STRING) {
        if (n > (r->len - r->pos) / value_size[et])
            return fail(r, "key '%s': %" PRIu64 " elements of %zu bytes exceed the %zu bytes left", key, n,
                        value_size[et], r->len - r->pos);
        r->pos += (size_t)n * value_size[et];
        return 0;
    }
    if (n > (r->len - r->pos) / 8) /* every string takes at least its 8-byte length */
        return fail(r, "key '%s': %" PRIu64 " strings cannot fit in the %zu bytes left", key, n, r->len - r->pos);
    for (uint64_t i = 0; i < n; i++)
        if (cancelled(r, i) || string(r, NULL, UINT64_MAX, "array string"))
            return -1;
    return 0;
}

uint32_t qd_gguf_n_dims(const int64_t *ne)
{
    for (int i = QD_GGUF_MAX_DIMS - 1; i >= 1; i--)
        if (ne[i] > 1)
            return (uint32_t)i + 1;
    return 1;
}

uint64_t qd_ggml_nbytes(uint32_t type, const int64_t *ne)
{
    const struct qd_ggml_type *t = qd_ggml_type(type);
    uint64_t rows = 1;
    for (int i = 1; i < QD_GGUF_MAX_DIMS; i++)
        rows *= (uint64_t)ne[i];
    return rows * ((uint64_t)ne[0] / (uint64_t)t->block_elems) * (uint64_t)t->block_bytes;
}

static int tensor_info(struct reader *r, struct qd_gguf_tensor *t, int64_t index)
{
    char *name = NULL;
    if (string(r, &name, QD_GGUF_MAX_NAME - 1, "tensor name"))
        return -1;
    strcpy(t->name, name);
    free(name);
    if (u32(r, &t->n_dims, "tensor dims"))
        return -1;
    if (t->n_dims < 1 || t->n_dims > QD_GGUF_MAX_DIMS)
        return fail(r, "tensor '%s': %u dimensions (1 to %d allowed)", t->name, t->n_dims, QD_GGUF_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < QD_GGUF_MAX_DIMS; i++) {
        uint64_t d = 1;
        if (i < (int)t->n_dims && u64(r, &d, "tensor dim"))
            return -1;
        if (d == 0) /* (ggml's reader divides by each dimension: it cannot take one) */
            return fail(r, "tensor '%s': dimension %d is 0 (a tensor holds at least one element)", t->name, i);
        if (d > (uint64_t)INT64_MAX || numel > (uint64_t)INT64_MAX / d)
            return fail(r, "tensor '%s': dimension %d (%" PRIu64 ") overflows the element count", t->name, i, d);
        t->ne[i] = (int64_t)d;
        numel *= d;
    }
    if (u32(r, &t->type, "tensor type") || u64(r, &t->offset, "tensor offset"))
        return -1;
    const struct qd_ggml_type *ty = qd_ggml_type(t->type);
    if (!ty)
        return fail(r, "tensor '%s' (#%" PRId64 "): ggml type %u unknown", t->name, index, t->type);
    if (t->ne[0] % ty->block_elems)
        return fail(r, "tensor '%s': row length %" PRId64 " is not a multiple of %s's block of %d", t->name, t->ne[0],
                    ty->name, ty->block_elems);
    if (numel / (uint64_t)ty->block_elems > UINT64_MAX / (uint64_t)ty->block_bytes)
        return fail(r, "tensor '%s': its byte size overflows", t->name);
    t->bytes = qd_ggml_nbytes(t->type, t->ne);
    return 0;
}

static int cmp_offset(const void *a, const void *b)
{
    const struct qd_gguf_tensor *x = *(const struct qd_gguf_tensor *const *)a, *y = *(const struct qd_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Names that appear twice (keys, or tensor names): sorted, not compared pairwise. */
static int no_duplicates(struct reader *r, const char **names, int64_t n, const char *what)
{
    const char *dup;
    qd_names_duplicate(names, (size_t)n, &dup);
    return dup ? fail(r, "%s '%s' appears twice", what, dup) : 0;
}

int qd_gguf_parse(const uint8_t *buf, size_t len, struct qd_gguf *g, const volatile int *cancel, char *err,
                  size_t errlen)
{
    struct reader r = {.buf = buf, .len = len, .cancel = cancel, .err = err, .errlen = errlen};
    memset(g, 0, sizeof *g);
    char magic[4] = {0};
    uint64_t n_tensors = 0, n_kv = 0;
    const char **names = NULL;
    if (take(&r, magic, 4, "magic") || memcmp(magic, "GGUF", 4))
        return len < 4 ? -1 : fail(&r, "not a GGUF file (magic %02x %02x %02x %02x)", (uint8_t)magic[0],
                                   (uint8_t)magic[1], (uint8_t)magic[2], (uint8_t)magic[3]);
    if (u32(&r, &g->version, "version"))
        return -1;
    if (g->version != 2 && g->version != 3)
        return fail(&r, "version %u not supported (2 or 3)%s", g->version,
                    (g->version & 0xffff) == 0 ? ": the file looks byte-swapped (big-endian)" : "");
    if (u64(&r, &n_tensors, "tensor count") || u64(&r, &n_kv, "key/value count"))
        return -1;
    /* a key/value takes at least 8 + 4 + 1 bytes, a tensor info at least 8 + 4 + 8 + 4 + 8 */
    if (n_kv > (len - r.pos) / 13 || n_tensors > (len - r.pos) / 32)
        return fail(&r, "%" PRIu64 " key/values and %" PRIu64 " tensors cannot fit in %zu bytes", n_kv, n_tensors, len);
    if (n_kv > QD_GGUF_MAX_KV || n_tensors > QD_GGUF_MAX_TENSORS)
        return fail(&r, "%" PRIu64 " key/values and %" PRIu64 " tensors: quantd reads at most %d key/values and %d "
                    "tensors (a model has tens of keys and up to a few thousand tensors)", n_kv, n_tensors,
                    QD_GGUF_MAX_KV, QD_GGUF_MAX_TENSORS);
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    names = malloc((size_t)(n_kv > n_tensors ? n_kv : n_tensors ? n_tensors : 1) * sizeof *names);
    if (!g->kv || !g->tensors || !names) {
        free(names);
        qd_gguf_free(g);
        return fail(&r, "no memory for %" PRIu64 " key/values and %" PRIu64 " tensors", n_kv, n_tensors);
    }
    g->alignment = QD_GGUF_DEFAULT_ALIGNMENT;
    for (int64_t i = 0; i < g->n_kv; i++) {
        struct qd_gguf_kv *kv = &g->kv[i];
        size_t start = r.pos;
        if (cancelled(&r, (uint64_t)i) || string(&r, &kv->key, 1 << 16, "key") || u32(&r, &kv->type, "value type"))
            goto bad;
        kv->value = buf + r.pos;
        if (value(&r, kv->type, kv->key, 0))
            goto bad;
        kv->entry = buf + start;
        kv->entry_bytes = r.pos - start;
        names[i] = kv->key;
        if (!strcmp(kv->key, "general.alignment")) {
            uint32_t a = 0;
            if (kv->type == QD_GGUF_U32) /* (the type first: a shorter value may end the file) */
                memcpy(&a, kv->value, 4);
            if (a == 0 || (a & (a - 1))) {
                fail(&r, "general.alignment must be a u32 power of two");
                goto bad;
            }
            g->alignment = a;
        }
    }
    if (no_duplicates(&r, names, g->n_kv, "key"))
        goto bad;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        if (cancelled(&r, (uint64_t)i) || tensor_info(&r, &g->tensors[i], i))
            goto bad;
        names[i] = g->tensors[i].name;
    }
    if (no_duplicates(&r, names, g->n_tensors, "tensor"))
        goto bad;
    free(names);
    names = NULL;
    g->data_offset = (r.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors && g->data_offset > len) {
        fail(&r, "data section at byte %" PRIu64 " starts past the end (%zu bytes)", g->data_offset, len);
        goto bad;
    }
    uint64_t data_len = g->n_tensors ? len - g->data_offset : 0;
    struct qd_gguf_tensor **order = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *order);
    if (!order) {
        fail(&r, "no memory");
        goto bad;
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct qd_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment || t->offset > data_len || t->bytes > data_len - t->offset) {
            fail(&r, "tensor '%s': data at offset %" PRIu64 " (%" PRIu64 " bytes) is misaligned or past the "
                 "%" PRIu64 "-byte data section", t->name, t->offset, t->bytes, data_len);
            free(order);
            goto bad;
        }
        t->data = buf + g->data_offset + t->offset;
        order[i] = t;
    }
    qsort(order, (size_t)g->n_tensors, sizeof *order, cmp_offset);
    for (int64_t i = 1; i < g->n_tensors; i++)
        if (order[i - 1]->offset + order[i - 1]->bytes > order[i]->offset) {
            fail(&r, "tensors '%s' and '%s' overlap", order[i - 1]->name, order[i]->name);
            free(order);
            goto bad;
        }
    free(order);
    return 0;
bad:
    free(names);
    qd_gguf_free(g);
    return -1;
}

void qd_gguf_free(struct qd_gguf *g)
{
    for (int64_t i = 0; g->kv && i < g->n_kv; i++)
        free(g->kv[i].key);
    free(g->kv);
    free(g->tensors);
    memset(g, 0, sizeof *g);
}

const struct qd_gguf_kv *qd_gguf_find(const struct qd_gguf *g, const char *key)
{
    for (int64_t i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

int qd_gguf_array(const struct qd_gguf *g, const char *key, struct qd_gguf_array *a)
{
    const struct qd_gguf_kv *kv = qd_gguf_find(g, key);
    memset(a, 0, sizeof *a);
    if (!kv || kv->type != QD_GGUF_ARRAY)
        return -1;
    memcpy(&a->type, kv->value, 4);
    memcpy(&a->n, kv->value + 4, 8);
    a->data = kv->value + 12;
    a->end = kv->entry + kv->entry_bytes;
    return 0;
}

const uint8_t *qd_gguf_array_string(const struct qd_gguf_array *a, const uint8_t **p, uint64_t *len)
{
    uint64_t n = 0;
    if (a->type != QD_GGUF_STRING || *p < a->data || a->end - *p < 8)
        return NULL;
    memcpy(&n, *p, 8);
    if (n > (uint64_t)(a->end - *p - 8))
        return NULL;
    const uint8_t *s = *p + 8;
    *p = s + n;
    *len = n;
    return s;
}

char *qd_gguf_string(const struct qd_gguf *g, const char *key)
{
    const struct qd_gguf_kv *kv = qd_gguf_find(g, key);
    if (!kv || kv->type != QD_GGUF_STRING)
        return NULL;
    uint64_t n = 0;
    memcpy(&n, kv->value, 8);
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, kv->value + 8, n);
        s[n] = 0;
    }
    return s;
}

/* ---- writing -------------------------------------------------------------------------------- */

struct out {
    uint8_t *p;
    size_t len, cap;
};

static int put(struct out *o, const void *src, size_t n)
{
    if (o->len + n > o->cap) {
        size_t cap = (o->cap ? o->cap * 2 : 4096) + n;
        uint8_t *p = realloc(o->p, cap);
        if (!p)
            return -1;
        o->p = p, o->cap = cap;
    }
    memcpy(o->p + o->len, src, n);
    o->len += n;
    return 0;
}

static int put_u32(struct out *o, uint32_t v) { return put(o, &v, 4); }
static int put_u64(struct out *o, uint64_t v) { return put(o, &v, 8); }
static int put_str(struct out *o, const char *s) { return put_u64(o, strlen(s)) || put(o, s, strlen(s)); }

/* One extra key/value, typed as gguf_set_val_* writes it. */
static int put_new_kv(struct out *o, const struct qd_gguf_new_kv *e)
{
    if (put_str(o, e->key) || put_u32(o, e->type))
        return -1;
    switch (e->type) {
    case QD_GGUF_U16: case QD_GGUF_I16: {
        uint16_t v = (uint16_t)e->i;
        return put(o, &v, 2);
    }
    case QD_GGUF_BOOL: case QD_GGUF_U8: case QD_GGUF_I8: {
        uint8_t v = (uint8_t)e->i;
        return put(o, &v, 1);
    }
    case QD_GGUF_F32: {
        float v = (float)e->f;
        return put(o, &v, 4);
    }
    case QD_GGUF_STRING: return put_str(o, e->s);
    default: return put_u32(o, (uint32_t)e->i);
    }
}

uint8_t *qd_gguf_write_meta(const struct qd_gguf_kv *const *kv, int n_kv, const struct qd_gguf_new_kv *extra,
                            int n_extra, const struct qd_gguf_tensor *t, int n_tensors, uint32_t alignment,
                            size_t *len)
{
    struct out o = {0};
    int bad = put(&o, "GGUF", 4) || put_u32(&o, 3) || put_u64(&o, (uint64_t)n_tensors) ||
              put_u64(&o, (uint64_t)(n_kv + n_extra));
    for (int i = 0; !bad && i < n_kv; i++)
        bad = put(&o, kv[i]->entry, kv[i]->entry_bytes);
    for (int i = 0; !bad && i < n_extra; i++)
        bad = put_new_kv(&o, &extra[i]);
    uint64_t offset = 0;
    for (int i = 0; !bad && i < n_tensors; i++) {
        uint32_t nd = qd_gguf_n_dims(t[i].ne);
        bad = put_str(&o, t[i].name) || put_u32(&o, nd);
        for (uint32_t d = 0; !bad && d < nd; d++)
            bad = put_u64(&o, (uint64_t)t[i].ne[d]);
        bad = bad || put_u32(&o, t[i].type) || put_u64(&o, offset);
        offset += (t[i].bytes + alignment - 1) / alignment * alignment;
    }
    static const uint8_t zeros[256];
    size_t pad = (alignment - o.len % alignment) % alignment;
    while (!bad && pad) {
        size_t n = pad < sizeof zeros ? pad : sizeof zeros;
        bad = put(&o, zeros, n);
        pad -= n;
    }
    if (bad) {
        free(o.p);
        return NULL;
    }
    *len = o.len;
    return o.p;
}
