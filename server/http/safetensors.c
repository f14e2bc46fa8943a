/* The safetensors container (huggingface/safetensors, format described in its README): an
 * 8-byte little-endian header length N, N bytes of JSON {"name": {"dtype", "shape",
 * "data_offsets": [begin, end]}, "__metadata__": {string: string}}, then the data, offsets
 * relative to its start. quantd reads it for /dequantize and writes it for binary results. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/decode.h"
#include "http/encode.h"
#include "queue/hostmem.h"

static const char *const st_dtype_names[QD_DTYPE_COUNT] = {"F32", "F16", "BF16", "U8", "I8", "I32"};

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

/* A JSON number that is an exact non-negative integer below 2^53. */
static int json_uint(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

int qd_safetensors_parse(const unsigned char *buf, size_t len, struct qd_st_tensor *t, int max,
                         cJSON **metadata, char *err, size_t errlen)
{
    *metadata = NULL;
    if (len < 8) {
        snprintf(err, errlen, "safetensors body shorter than its 8-byte header length");
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > len - 8) {
        snprintf(err, errlen, "safetensors header length %llu exceeds the body",
                 (unsigned long long)hlen);
        return -1;
    }
    const unsigned char *data = buf + 8 + hlen;
    size_t data_len = len - 8 - (size_t)hlen;
    cJSON *h = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    int n = 0;
    if (!cJSON_IsObject(h)) {
        snprintf(err, errlen, "safetensors header is not a JSON object");
        goto bad;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, h) {
        if (!strcmp(it->string, "__metadata__")) {
            if (!cJSON_IsObject(it)) {
                snprintf(err, errlen, "safetensors __metadata__ must be an object");
                goto bad;
            }
            continue;
        }
        if (n == max) {
            snprintf(err, errlen, "safetensors body holds more than %d tensors", max);
            goto bad;
        }
        struct qd_st_tensor *x = &t[n];
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype"),
                    *sh = cJSON_GetObjectItemCaseSensitive(it, "shape"),
                    *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets"), *d;
        int64_t b, e;
        if (strlen(it->string) >= sizeof x->name || st_dtype_parse(cJSON_GetStringValue(dt), &x->dtype) ||
            !cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > QD_MAX_DIMS || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2 || json_uint(cJSON_GetArrayItem(off, 0), &b) ||
            json_uint(cJSON_GetArrayItem(off, 1), &e) || b > e || (uint64_t)e > data_len) {
            snprintf(err, errlen, "safetensors tensor '%.64s': bad name, dtype, shape or offsets",
                     it->string);
            goto bad;
        }
        strcpy(x->name, it->string);
        x->ndim = 0;
        int64_t numel = 1;
        cJSON_ArrayForEach(d, sh) {
            int64_t v;
            if (json_uint(d, &v) || (v && numel > (INT64_C(1) << 50) / v)) {
                snprintf(err, errlen, "safetensors tensor '%s': bad shape", x->name);
                goto bad;
            }
            numel *= v;
            x->shape[x->ndim++] = v;
        }
        if ((uint64_t)numel * qd_dtype_size(x->dtype) != (uint64_t)(e - b)) {
            snprintf(err, errlen, "safetensors tensor '%s': %lld bytes for shape and dtype needing %llu",
                     x->name, (long long)(e - b), (unsigned long long)numel * qd_dtype_size(x->dtype));
            goto bad;
        }
        x->data = data + b;
        x->bytes = (size_t)(e - b);
        n++;
    }
    *metadata = cJSON_DetachItemFromObjectCaseSensitive(h, "__metadata__");
    cJSON_Delete(h);
    return n;
bad:
    cJSON_Delete(h);
    return -1;
}

char *qd_safetensors_build(const struct qd_st_tensor *t, int n, const cJSON *metadata, size_t *out_len)
{
    cJSON *h = cJSON_CreateObject();
    if (metadata)
        cJSON_AddItemToObject(h, "__metadata__", cJSON_Duplicate(metadata, 1));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_AddObjectToObject(h, t[i].name), *sh = cJSON_AddArrayToObject(x, "shape");
        cJSON_AddStringToObject(x, "dtype", st_dtype_names[t[i].dtype]);
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *o = cJSON_AddArrayToObject(x, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + t[i].bytes)));
        off += t[i].bytes;
    }
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!text)
        return NULL;
    /* pad the header with spaces to 8 bytes so that every tensor starts aligned */
    size_t tl = strlen(text), hl = (tl + 7) / 8 * 8;
    char *out = qd_hostmem_get(8 + hl + off); /* a pooled buffer: no fresh pages to fault in */
    if (out) {
        for (int i = 0; i < 8; i++)
            out[i] = (char)((uint64_t)hl >> (8 * i));
        memcpy(out + 8, text, tl);
        memset(out + 8 + tl, ' ', hl - tl);
        char *p = out + 8 + hl;
        for (int i = 0; i < n; i++) {
            memcpy(p, t[i].data, t[i].bytes);
            p += t[i].bytes;
        }
        *out_len = 8 + hl + off;
    }
    free(text);
    return out;
}
