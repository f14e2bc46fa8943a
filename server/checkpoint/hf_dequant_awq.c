/* Back to float from AutoAWQ GEMM (quant_method "awq", version "gemm", 4 bits, zero points):
 * what hf_awq.c writes and AutoAWQ's save_quantized holds. Per Linear <m>.qweight (int32 [in,
 * out / 8]), <m>.qzeros (int32 [in / group, out / 8]) and <m>.scales (f16 [in / group, out]), of
 * the weight transposed ([in, out]); each word holds 8 columns, column 8j + k in nibble
 * (0, 4, 1, 5, 2, 6, 3, 7)[k] (AutoAWQ's pack order 0 2 4 6 1 3 5 7).
 *
 * The peer is AutoAWQ's dequantize_gemm (awq/utils/packing_utils.py): the nibbles unpacked and put
 * back in column order, (q - z) as integers times the f16 scale, the product rounded to f16 (a
 * torch f16 op), the result [in, out] transposed to the Linear's [out, in]; then that f16 value
 * cast to the output dtype. */
#include <stdio.h>
#include <string.h>

#include "../../kernels/fp.h"
#include "checkpoint/hf_dequant.h"

static const int nibble_of_column[8] = {0, 4, 1, 5, 2, 6, 3, 7};

static const cJSON *member(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* the 4-bit value of column c of row r of a [rows, cols / 8] int32 tensor */
static int nibble(const uint8_t *words, int64_t cols, int64_t r, int64_t c)
{
    uint32_t w;
    memcpy(&w, words + (size_t)(r * (cols / 8) + c / 8) * 4, 4);
    return (int)((w >> (4 * nibble_of_column[c % 8])) & 15);
}

/* rows [r0, r1) of the Linear's weight */
static int dequant(const struct qd_hf_out *t, const void *in, void *out, int64_t r0, int64_t r1)
{
    const int64_t n_out = t->shape[0], n_in = t->shape[1], group = t->block[0];
    const enum qd_dtype odt = qd_hf_st_to_dtype(t->dtype);
    for (int64_t o = r0; o < r1; o++)
        for (int64_t k = 0; k < n_in; k++) { /* element [o, k] of the Linear: [k, o] of AutoAWQ's */
            const int64_t g = k / group;
            uint16_t h;
            memcpy(&h, t->scale->data + (size_t)(g * n_out + o) * 2, 2);
            const int d = nibble(in, n_out, k, o) - nibble(t->zero->data, n_out, g, o);
            const float v = qd_f16_to_f32(qd_f32_to_f16((float)d * qd_f16_to_f32(h))); /* exact, then f16 */
            qd_hf_store(out, (size_t)(o * n_in + k), v, odt);
        }
    return 0;
}

/* <m>.<suffix> beside <m>.qweight */
static const struct qd_st_entry *beside(const struct qd_hf_shard *sh, const char *qweight, const char *suffix)
{
    char name[1024];
    const size_t m = strlen(qweight) - strlen("qweight");
    if (m + strlen(suffix) >= sizeof name)
        return NULL;
    memcpy(name, qweight, m);
    strcpy(name + m, suffix);
    return qd_hf_tensor_named(sh, name);
}

static int plan(const cJSON *q, const struct qd_hf_shard *sh, int i, struct qd_hf_out *out, char *err, size_t errlen)
{
    const struct qd_st_entry *t = &sh->st.t[i];
    if (qd_hf_ends_with(t->name, "qzeros") || qd_hf_ends_with(t->name, "scales")) {
        char w[1024];
        const size_t m = strlen(t->name) - strlen(qd_hf_ends_with(t->name, "qzeros") ? "qzeros" : "scales");
        snprintf(w, sizeof w, "%.*sqweight", (int)m, t->name);
        return qd_hf_tensor_named(sh, w) ? 2 : 0; /* a component of a quantized Linear */
    }
    if (!qd_hf_ends_with(t->name, "qweight"))
        return 0;
    const cJSON *bits = member(q, "bits"), *gs = member(q, "group_size"), *zp = member(q, "zero_point");
    const struct qd_st_entry *z = beside(sh, t->name, "qzeros"), *s = beside(sh, t->name, "scales");
    const int64_t n_in = t->ndim == 2 ? t->shape[0] : 0, n_out = t->ndim == 2 ? t->shape[1] * 8 : 0;
    const int group = cJSON_IsNumber(gs) ? gs->valueint : 0;
    if (!cJSON_IsNumber(bits) || bits->valueint != 4 || cJSON_IsFalse(zp) || group <= 0 || strcmp(t->dtype, "I32") ||
        n_in % group || !z || !s || strcmp(z->dtype, "I32") || z->ndim != 2 || z->shape[0] != n_in / group ||
        z->shape[1] != n_out / 8 || strcmp(s->dtype, "F16") || s->ndim != 2 || s->shape[0] != n_in / group ||
        s->shape[1] != n_out || n_in == 0) {
        snprintf(err, errlen, "convert: tensor '%.200s': back to float reads AutoAWQ GEMM weights of 4 bits with zero "
                 "points (I32 qweight [in, out/8], I32 qzeros and F16 scales per group_size rows of it, group_size "
                 "from quantization_config) beside each other in the same file", t->name);
        return -1;
    }
    char *name = qd_hf_concat("", "", t->name); /* <m>.qweight -> <m>.weight */
    if (!name)
        return -1;
    strcpy(name + strlen(name) - strlen("qweight"), "weight");
    out->name = name;
    out->shape[0] = n_out, out->shape[1] = n_in;
    out->scale = s;
    out->zero = z;
    out->block[0] = group;
    out->mid = QD_F16;
    out->dequant = dequant;
    return 1;
}

const struct qd_hf_dequant_family qd_hf_dequant_awq = {.plan = plan};
