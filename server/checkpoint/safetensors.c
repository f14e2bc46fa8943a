/* safetensors checkpoint files: the reader and header writer of safetensors.h. */
#include "checkpoint/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The dtypes of safetensors' Dtype enum and their element widths in bits. */
static const struct {
    const char *name;
    int bits;
} st_dtypes[] = {{"BOOL", 8},  {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8},
                 {"I16", 16},  {"U16", 16}, {"F16", 16}, {"BF16", 16},   {"I32", 32},    {"U32", 32},
                 {"F32", 32},  {"F64", 64}, {"I64", 64}, {"U64", 64},    {"F4", 4},      {"F6_E2M3", 6},
                 {"F6_E3M2", 6}, {NULL, 0}};

int qd_st_dtype_bits(const char *dtype)
{
    for (int i = 0; dtype && st_dtypes[i].name; i++)
        if (!strcmp(dtype, st_dtypes[i].name))
            return st_dtypes[i].bits;
    return 0;
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static int json_u53(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return -1;
    *out = (uint64_t)v->valuedouble;
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const struct qd_st_entry *x = *(const struct qd_st_entry *const *)a, *y = *(const struct qd_st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

int qd_st_parse(const uint8_t *buf, size_t len, const char *what, struct qd_st_file *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    if (len < 8) {
        snprintf(err, errlen, "%s: %zu bytes, shorter than the 8-byte header length", what, len);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > QD_ST_MAX_HEADER || hlen > len - 8) {
        snprintf(err, errlen, "%s: header length %" PRIu64 " is over the limit (%u) or past the end (%zu bytes)",
                 what, hlen, QD_ST_MAX_HEADER, len);
        return -1;
    }
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    cJSON *h = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    struct qd_st_entry **order = NULL;
    if (!cJSON_IsObject(h)) {
        snprintf(err, errlen, "%s: the header is not a JSON object", what);
        goto bad;
    }
    int count = cJSON_GetArraySize(h);
    f->t = calloc((size_t)(count ? count : 1), sizeof *f->t);
    order = calloc((size_t)(count ? count : 1), sizeof *order);
    if (!f->t || !order) {
        snprintf(err, errlen, "%s: no memory for %d tensors", what, count);
        goto bad;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, h) {
        if (!strcmp(it->string, "__metadata__")) {
            const cJSON *m;
            int ok = cJSON_IsObject(it);
            cJSON_ArrayForEach(m, it) ok &= cJSON_IsString(m);
            if (!ok) {
                snprintf(err, errlen, "%s: __metadata__ must map strings to strings", what);
                goto bad;
            }
            continue;
        }
        struct qd_st_entry *t = &f->t[f->n];
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(it, "shape"),
                    *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets"), *d;
        if (!(t->name = strdup(it->string))) {
            snprintf(err, errlen, "%s: no memory", what);
            goto bad;
        }
        f->n++;
        const char *dts = cJSON_GetStringValue(dt);
        if (!dts || strlen(dts) >= sizeof t->dtype || !(t->elem_bits = qd_st_dtype_bits(dts))) {
            snprintf(err, errlen, "%s: tensor '%.200s': dtype %.20s unknown", what, t->name, dts ? dts : "(none)");
            goto bad;
        }
        strcpy(t->dtype, dts);
        if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > QD_ST_MAX_DIMS || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2 || json_u53(cJSON_GetArrayItem(off, 0), &t->begin) ||
            json_u53(cJSON_GetArrayItem(off, 1), &t->end) || t->begin > t->end || t->end > data_len) {
            snprintf(err, errlen, "%s: tensor '%.200s': shape or data_offsets missing, malformed or past the "
                     "%" PRIu64 "-byte data", what, t->name, data_len);
            goto bad;
        }
        uint64_t numel = 1;
        cJSON_ArrayForEach(d, sh) {
            uint64_t v;
            if (json_u53(d, &v) || (v && numel > (UINT64_C(1) << 60) / v)) {
                snprintf(err, errlen, "%s: tensor '%.200s': bad or overflowing shape", what, t->name);
                goto bad;
            }
            numel *= v;
            t->shape[t->ndim++] = (int64_t)v;
        }
        uint64_t bits = numel * (uint64_t)t->elem_bits;
        if (bits % 8 || bits / 8 != t->end - t->begin) {
            snprintf(err, errlen, "%s: tensor '%.200s': %" PRIu64 " bytes for a shape and dtype that need %" PRIu64
                     "%s", what, t->name, t->end - t->begin, bits / 8, bits % 8 ? " and a bit" : "");
            goto bad;
        }
        t->data = data + t->begin;
        order[f->n - 1] = t;
    }
    /* the tensors tile the data section: in offset order, each begins where the last ended */
    qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        if (order[i]->begin != at) {
            snprintf(err, errlen, "%s: tensor '%.200s' begins at %" PRIu64 ", not where the one before ends (%" PRIu64
                     "): overlapping or a hole", what, order[i]->name, order[i]->begin, at);
            goto bad;
        }
        at = order[i]->end;
    }
    if (at != data_len) {
        snprintf(err, errlen, "%s: the tensors cover %" PRIu64 " of the %" PRIu64 " data bytes", what, at, data_len);
        goto bad;
    }
    f->metadata = cJSON_DetachItemFromObjectCaseSensitive(h, "__metadata__");
    cJSON_Delete(h);
    free(order);
    return 0;
bad:
    cJSON_Delete(h);
    free(order);
    qd_st_free(f);
    return -1;
}

void qd_st_free(struct qd_st_file *f)
{
    for (int i = 0; f->t && i < f->n; i++)
        free(f->t[i].name);
    free(f->t);
    cJSON_Delete(f->metadata);
    memset(f, 0, sizeof *f);
}

uint8_t *qd_st_header(const struct qd_st_out *t, int n, const cJSON *metadata, size_t *len)
{
    cJSON *h = cJSON_CreateObject();
    if (!h)
        return NULL;
    if (metadata)
        cJSON_AddItemToObject(h, "__metadata__", cJSON_Duplicate(metadata, 1));
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_AddObjectToObject(h, t[i].name), *sh = cJSON_CreateArray(), *o = cJSON_CreateArray();
        cJSON_AddStringToObject(x, "dtype", t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON_AddItemToObject(x, "shape", sh);
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + t[i].bytes)));
        cJSON_AddItemToObject(x, "data_offsets", o);
        off += t[i].bytes;
    }
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!text)
        return NULL;
    /* padded with spaces so that the data section, and every 8-byte dtype in it, is aligned */
    size_t tl = strlen(text), hl = (tl + 7) / 8 * 8;
    uint8_t *out = malloc(8 + hl);
    if (out) {
        for (int i = 0; i < 8; i++)
            out[i] = (uint8_t)((uint64_t)hl >> (8 * i));
        memcpy(out + 8, text, tl);
        memset(out + 8 + tl, ' ', hl - tl);
        *len = 8 + hl;
    }
    free(text);
    return out;
}
