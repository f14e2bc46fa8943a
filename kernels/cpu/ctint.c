/* compressed-tensors integers (kernels/ctint.h; w4a16: 4 bits, w8a16: 8, the format's code) on
 * the CPU: groups of group_size along each row of a [out, in] weight; the threads share the
 * groups (spans never split one: in % group_size == 0). weight_packed: 32 / bits codes + 2^(bits-1)
 * per int32, the first in the low bits (pack_to_int32); weight_scale: one per group, in the
 * weight's dtype; weight_zero_point (asymmetric): + 2^(bits-1), 32 / bits rows per int32 word
 * (packed along the output dimension), written after the spans. */
#include <stdlib.h>
#include <string.h>

#include "../ctint.h"
#include "cpu.h"

struct ctint_ctx {
    int64_t cols, gs;
    int bits, sym, dt;
    uint32_t *packed;
    uint8_t *scales;  /* in the dtype */
    int8_t *zp;       /* [rows, groups], asymmetric */
    const uint32_t *cpacked;
    const uint8_t *cscales;
    const uint32_t *czp;
};

static int dtype_code(enum qd_dtype d) { return d == QD_BF16 ? 2 : d == QD_F16 ? 1 : 0; }

/* the arithmetic's dtype code (ctint.h) for a resolved scale_dtype */
static int scale_code(int scale_dtype) { return scale_dtype == QD_SCALE_BF16 ? 2 : scale_dtype == QD_SCALE_F16 ? 1 : 0; }

static void put_scale(uint8_t *s, int64_t i, float v, int dt)
{
    if (dt == 0)
        memcpy(s + 4 * i, &v, 4);
    else {
        uint16_t h = dt == 2 ? qd_f32_to_bf16(v) : qd_f32_to_f16(v);
        memcpy(s + 2 * i, &h, 2);
    }
}

static float get_scale(const uint8_t *s, int64_t i, int dt)
{
    if (dt == 0) {
        float v;
        memcpy(&v, s + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, s + 2 * i, 2);
    return dt == 2 ? qd_bf16_to_f32(h) : qd_f16_to_f32(h);
}

static void ctint_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct ctint_ctx *k = c;
    (void)tid;
    for (int64_t at = 0; at < n; at += k->gs) {
        int64_t g = (first + at) / k->gs; /* the group's index in [rows, groups] order */
        int zp;
        const int per = 32 / k->bits, off = 1 << (k->bits - 1);
        const uint32_t mask = (1u << k->bits) - 1;
        float scale = qd_ct_int_qparams(x + at, (int)k->gs, k->bits, k->sym, k->dt, &zp);
        put_scale(k->scales, g, scale, k->dt);
        if (!k->sym)
            k->zp[g] = (int8_t)zp;
        uint32_t *w = k->packed + (first + at) / per;
        for (int64_t j = 0; j < k->gs; j += per) {
            uint32_t word = 0;
            for (int i = 0; i < per; i++)
                word |= ((uint32_t)(qd_ct_int_code(x[at + j + i], scale, zp, k->bits) + off) & mask)
                        << (k->bits * i);
            w[j / per] = word;
        }
    }
}

static void ctint_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct ctint_ctx *k = c;
    (void)tid;
    int64_t groups = k->cols / k->gs;
    const int per = 32 / k->bits, off = 1 << (k->bits - 1);
    const uint32_t mask = (1u << k->bits) - 1;
    for (int64_t at = 0; at < n; at++) {
        int64_t e = first + at, r = e / k->cols, g = e / k->gs;
        int code = (int)((k->cpacked[e / per] >> (k->bits * (e % per))) & mask) - off;
        int zp = k->sym ? 0 : (int)((k->czp[(r / per) * groups + g % groups] >> (k->bits * (r % per))) & mask) - off;
        y[at] = qd_ct_int_value(code, zp, get_scale(k->cscales, g, k->dt), k->dt);
    }
}

enum qd_status qd_cpu_ctint_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                     struct qd_params *p, void *const *out)
{
    static const int resolved[] = {[QD_F32] = QD_SCALE_F32, [QD_F16] = QD_SCALE_F16, [QD_BF16] = QD_SCALE_BF16};
    if (p->scale_dtype != QD_SCALE_AUTO && p->scale_dtype != resolved[in->dtype])
        return QD_EINVAL; /* compressed-tensors computes in, and keeps, the weight's dtype */
    p->scale_dtype = resolved[in->dtype]; /* recorded with the result, read back to dequantize */
    struct ctint_ctx k = {.cols = in->cols, .gs = p->group_size, .bits = f->code, .sym = p->symmetric,
                          .dt = dtype_code(in->dtype), .packed = out[0], .scales = out[1]};
    int64_t groups = in->cols / k.gs;
    if (!k.sym && !(k.zp = malloc((size_t)(in->rows * groups))))
        return QD_ENOMEM;
    if (qd_cpu_spans(in, k.gs, ctint_quantize_span, &k) < 0) {
        free(k.zp);
        return QD_ENOMEM;
    }
    if (!k.sym) { /* pack_to_int32(zero_point, bits, packed_dim=0): 32 / bits rows of a group per word */
        uint32_t *z = out[2];
        const int per = 32 / k.bits, off = 1 << (k.bits - 1);
        const uint32_t mask = (1u << k.bits) - 1;
        int64_t words = (in->rows + per - 1) / per;
        for (int64_t w = 0; w < words; w++)
            for (int64_t g = 0; g < groups; g++) {
                uint32_t word = 0;
                for (int i = 0; i < per && w * per + i < in->rows; i++)
                    word |= ((uint32_t)(k.zp[(w * per + i) * groups + g] + off) & mask) << (k.bits * i);
                z[w * groups + g] = word;
            }
        free(k.zp);
    }
    return QD_OK;
}

enum qd_status qd_cpu_ctint_dequantize(const struct qd_format *f, const void *const *in,
                                       const struct qd_params *p, struct qd_tensor *out)
{
    int dt = p->scale_dtype == QD_SCALE_AUTO ? dtype_code(out->dtype) : scale_code(p->scale_dtype);
    struct ctint_ctx k = {.cols = out->cols, .gs = p->group_size, .bits = f->code, .sym = p->symmetric, .dt = dt,
                          .cpacked = in[0], .cscales = in[1], .czp = p->symmetric ? NULL : in[2]};
    return qd_cpu_out_spans(out, 1, ctint_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
