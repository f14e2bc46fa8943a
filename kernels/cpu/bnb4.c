/* bitsandbytes NF4 / FP4 on the CPU: bitsandbytes' quantize_4bit / dequantize_4bit bytes
 * (kQuantizeBlockwise, kDequantizeBlockwise, and quantize_blockwise(blocksize=256) of the
 * absmax for double quantization). The tensor is flattened; blocks of `blocksize` elements,
 * the last one partial. */
#include <stdlib.h>

#include "../bnb4.h"
#include "cpu.h"

#define BNB_NESTED_BLOCK 256

static const float nf4_values[16] = QD_NF4_VALUES;
static const float fp4_magnitudes[8] = QD_FP4_MAGNITUDES;
static const float fp4_type_values[16] = QD_FP4_TYPE_VALUES;
static const float dynamic_map[256] = QD_DYNAMIC_MAP;

static int is_nf4(const struct qd_format *f) { return f->code == 0; }

/* x * (1/absmax) with bitsandbytes' flush-to-zero on the operand and the result. */
static inline float scaled(float x, float inv) { return qd_ftz(qd_ftz(x) * inv); }

struct bnb_ctx {
    int nf4;
    int64_t n, blocksize;
    uint8_t *data;
    float *absmax;
};

/* One span of whole blocks (the last may be partial): absmax, then the codes of x * (1/absmax),
 * two per byte, the first element in the high nibble (bitsandbytes order). */
static void bnb_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct bnb_ctx *k = c;
    (void)tid;
    for (int64_t b0 = 0; b0 < n; b0 += k->blocksize) {
        int64_t len = n - b0 < k->blocksize ? n - b0 : k->blocksize;
        const float *xb = x + b0;
        float amax = 0.0f;
        for (int64_t i = 0; i < len; i++) {
            float a = qd_ftz(qd_absf(xb[i]));
            amax = a > amax ? a : amax;
        }
        /* a zero block gives inf here and NaN codes below: bitsandbytes does the same */
        float inv = qd_rcp_approx(amax);
        k->absmax[(first + b0) / k->blocksize] = amax;
        /* codes first (a flat loop the compiler vectorizes), then two per byte, the first
         * element in the high nibble (bitsandbytes order); an odd tail pairs with the code of
         * the 0.0 the kernel pads with */
        uint8_t codes[4096 + 1];
        if (k->nf4) {
            for (int64_t i = 0; i < len; i++)
                codes[i] = qd_nf4_code(scaled(xb[i], inv));
            codes[len] = qd_nf4_code(0.0f * inv);
        } else {
            for (int64_t i = 0; i < len; i++)
                codes[i] = qd_fp4_code(scaled(xb[i], inv));
            codes[len] = qd_fp4_code(0.0f * inv);
        }
        uint8_t *out = k->data + (first + b0) / 2;
        for (int64_t j = 0; j < (len + 1) / 2; j++)
            out[j] = (uint8_t)(codes[2 * j] << 4 | codes[2 * j + 1]);
    }
}

/* quantize_blockwise(absmax - offset, blocksize=256) with the signed dynamic map. */
static void bnb_double_quant(const float *absmax, int64_t nblocks, float offset, uint8_t *codes,
                             float *nested_absmax)
{
    for (int64_t g = 0; g * BNB_NESTED_BLOCK < nblocks; g++) {
        int64_t base = g * BNB_NESTED_BLOCK;
        int64_t len = nblocks - base < BNB_NESTED_BLOCK ? nblocks - base : BNB_NESTED_BLOCK;
        float amax = 0.0f;
        for (int64_t i = 0; i < len; i++) {
            /* absmax - offset is a torch op (no flush); the kernel then flushes what it reads */
            float a = qd_ftz(qd_absf(absmax[base + i] - offset));
            amax = a > amax ? a : amax;
        }
        nested_absmax[g] = amax;
        float inv = qd_rcp_approx(amax);
        for (int64_t i = 0; i < len; i++)
            codes[base + i] = qd_dynamic_code(dynamic_map, scaled(absmax[base + i] - offset, inv));
    }
}

enum qd_status qd_cpu_bnb4_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                    struct qd_params *p, void *const *out)
{
    struct bnb_ctx k = {.nf4 = is_nf4(f), .n = qd_tensor_numel(in), .blocksize = p->blocksize,
                        .data = out[0]};
    int64_t nblocks = (k.n + k.blocksize - 1) / k.blocksize;
    k.absmax = p->double_quant ? malloc((size_t)nblocks * sizeof(float)) : out[1];
    if (!k.absmax)
        return QD_ENOMEM;
    if (qd_cpu_spans(in, k.blocksize, bnb_quantize_span, &k) < 0) {
        if (p->double_quant)
            free(k.absmax);
        return QD_ENOMEM;
    }
    float *quant_map;
    if (p->double_quant) {
        if (!p->has_offset) {
            /* bitsandbytes takes torch's mean on the GPU, whose summation order is not a
             * contract; quantd's is the exact sum (any order, so the GPU agrees), rounded once */
            uint64_t bins[QD_SUM_BINS] = {0};
            for (int64_t i = 0; i < nblocks; i++) {
                uint32_t b;
                uint64_t a;
                qd_sum_bin(k.absmax[i], &b, &a);
                if (b == 255)
                    bins[255] |= a;
                else
                    bins[b] += a;
            }
            p->offset = (float)(qd_sum_bins_total(bins) / (double)nblocks);
            p->has_offset = 1;
        }
        bnb_double_quant(k.absmax, nblocks, p->offset, out[1], out[2]);
        float *nested_map = out[3];
        for (int i = 0; i < 256; i++)
            nested_map[i] = dynamic_map[i];
        quant_map = out[4];
        free(k.absmax);
    } else {
        quant_map = out[2];
    }
    for (int i = 0; i < 16; i++)
        quant_map[i] = k.nf4 ? nf4_values[i] : fp4_type_values[i] / 12.0f;
    return QD_OK;
}

struct bnb_deq_ctx {
    int nf4;
    int64_t blocksize;
    const uint8_t *data;
    const float *absmax;
};

static float bnb_value(int nf4, uint8_t code)
{
    if (nf4)
        return nf4_values[code];
    /* dDequantizeFP4Tree: magnitude times (1 - 2*sign) */
    return fp4_magnitudes[code & 7] * (1.0f - 2.0f * (float)(code >> 3));
}

static void bnb_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct bnb_deq_ctx *k = c;
    (void)tid;
    for (int64_t i = 0; i < n; i++) {
        int64_t e = first + i;
        uint8_t byte = k->data[e / 2];
        uint8_t code = (e & 1) ? (byte & 15) : (byte >> 4);
        y[i] = qd_ftz(bnb_value(k->nf4, code) * k->absmax[e / k->blocksize]); /* fast-math */
    }
}

enum qd_status qd_cpu_bnb4_dequantize(const struct qd_format *f, const void *const *in,
                                      const struct qd_params *p, struct qd_tensor *out)
{
    int64_t n = qd_tensor_numel(out);
    int64_t nblocks = (n + p->blocksize - 1) / p->blocksize;
    struct bnb_deq_ctx k = {.nf4 = is_nf4(f), .blocksize = p->blocksize, .data = in[0]};
    float *absmax = NULL;
    if (p->double_quant) {
        /* dequantize_blockwise of the codes, then + offset: two f32 operations, no FMA */
        const uint8_t *codes = in[1];
        const float *nested_absmax = in[2], *nested_map = in[3];
        absmax = malloc((size_t)nblocks * sizeof(float));
        if (!absmax)
            return QD_ENOMEM;
        for (int64_t b = 0; b < nblocks; b++) {
            float v = qd_ftz(nested_map[codes[b]] * nested_absmax[b / BNB_NESTED_BLOCK]);
            absmax[b] = v + p->offset;
        }
        k.absmax = absmax;
    } else {
        k.absmax = in[1];
    }
    int rc = qd_cpu_out_spans(out, p->blocksize, bnb_dequantize_span, &k);
    free(absmax);
    return rc < 0 ? QD_ENOMEM : QD_OK;
}
