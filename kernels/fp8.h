/* 8-bit weights with float scales, for every backend: FP8 E4M3 (fp8_e4m3) and compressed-tensors'
 * W8A8 int8 (w8a8), one scale per tensor, per output channel (row) or per block of each matrix.
 * Two peers' arithmetic (docs/formats.md has the whole flow):
 * - compressed-tensors 0.19 as llm-compressor 0.14's data-free oneshot runs it on a CUDA device
 *   (FP8, FP8_DYNAMIC, FP8_BLOCK, W8A8). The scale is torch ops on the weight in its dtype (a
 *   torch op on a bf16 (f16) tensor computes in f32 and rounds to bf16 (f16), so quantd rounds
 *   where it does: qd_ct_round): max(|min|, |max|) / (bit range / 2), / 448 for e4m3, / 127.5
 *   for int8 (calculate_qparams), the dtype's eps where that is 0. The codes come from
 *   compressed-tensors' Triton kernel, all in f32: x / scale, plus the zero point (a zero, which
 *   turns -0 into +0), clamped and cast (e4m3) or rounded (int8), as for w4a16 (ctint.h);
 * - transformers 5.17's FineGrainedFP8 (Fp8Quantize), all in f32: the encode scale 448 / amax,
 *   which Python evaluates as amax.reciprocal() * 448 (two roundings; 1 for a zero block), codes
 *   clamp(x * scale) cast to e4m3, and the stored weight_scale_inv = 1 / scale (a reciprocal).
 * Dequantize (compressed-tensors' decompressor, transformers' Fp8Dequantize, DeepSeek-V3's
 * weight_dequant): code * scale rounded to the scale's dtype, then to the output's. */
#ifndef QD_FP8_H
#define QD_FP8_H

#include "ctint.h"
#include "registry.h"

/* the formats' codes (struct qd_format.code) */
enum { QD_FP8_E4M3 = 0, QD_FP8_INT8 = 1 };

/* At most this many elements share a block scale (the CUDA kernel keeps a block in registers). */
#define QD_FP8_MAX_BLOCK 16384

/* What a format and its parameters make of a tensor. */
struct qd_fp8_plan {
    int int8;                   /* w8a8: int8 codes (else e4m3) */
    int ct;                     /* compressed-tensors' arithmetic (else transformers') */
    int gran;                   /* QD_GRAN_TENSOR, QD_GRAN_CHANNEL or QD_GRAN_BLOCK */
    int block_rows, block_cols; /* QD_GRAN_BLOCK */
    int dt;                     /* the scale's dtype and the arithmetic's: ctint.h's 0 f32, 1 f16, 2 bf16 */
};

/* ctint.h's dtype code of a tensor dtype and of a resolved scale_dtype */
static inline int qd_fp8_dtype_code(enum qd_dtype d) { return d == QD_BF16 ? 2 : d == QD_F16 ? 1 : 0; }
static inline int qd_fp8_scale_code(int scale_dtype)
{
    return scale_dtype == QD_SCALE_BF16 ? 2 : scale_dtype == QD_SCALE_F16 ? 1 : 0;
}

/* The plan for a tensor of dtype `weight` (the output's when dequantizing: scale_dtype=auto
 * follows it, a recorded scale_dtype wins). w8a8 is compressed-tensors' channel-wise int8. */
static inline struct qd_fp8_plan qd_fp8_plan_for(const struct qd_format *f, const struct qd_params *p,
                                                 enum qd_dtype weight)
{
    struct qd_fp8_plan k;
    k.int8 = f->code == QD_FP8_INT8;
    k.ct = k.int8 || p->flow != QD_FLOW_TRANSFORMERS;
    k.gran = k.int8 ? QD_GRAN_CHANNEL : p->granularity;
    k.block_rows = p->block_rows > 0 ? p->block_rows : 1;
    k.block_cols = p->block_cols > 0 ? p->block_cols : 1;
    k.dt = !k.ct ? 0 : p->scale_dtype == QD_SCALE_AUTO ? qd_fp8_dtype_code(weight) : qd_fp8_scale_code(p->scale_dtype);
    return k;
}

/* Before quantizing: records the scale's dtype (compressed-tensors: the weight's, which it
 * computes in and keeps; transformers: f32). -1 when the parameter asks for another. */
static inline int qd_fp8_resolve_scale_dtype(const struct qd_format *f, struct qd_params *p, enum qd_dtype weight)
{
    static const int of[] = {[QD_F32] = QD_SCALE_F32, [QD_F16] = QD_SCALE_F16, [QD_BF16] = QD_SCALE_BF16};
    int want = qd_fp8_plan_for(f, p, weight).ct ? of[weight] : QD_SCALE_F32;
    if (p->scale_dtype != QD_SCALE_AUTO && p->scale_dtype != want)
        return -1;
    p->scale_dtype = want;
    return 0;
}

/* Rows of the block-scale grid: ceil(matrix_rows / block_rows) per matrix (blocks do not cross
 * matrices: transformers quantizes each [.., rows, cols] matrix of a stacked tensor alone). */
QD_HD int64_t qd_fp8_block_rows(int64_t rows, int64_t matrix_rows, int block_rows)
{
    return rows / matrix_rows * ((matrix_rows + block_rows - 1) / block_rows);
}

/* ---- the arithmetic ------------------------------------------------------------------------- */

/* The scale the codes are computed with, from the group's largest |x| (finite: NaN/Inf input is
 * refused). compressed-tensors: amax / 448 (int8: / 127.5, half of 127 - -128) rounded to the
 * dtype, eps where that is 0 (calculate_qparams). transformers: amax.reciprocal() * 448 in f32,
 * 1 for a zero block; an amax below ~2^-120 makes it infinite (as on the peer). */
QD_HD float qd_fp8_encode_scale(float amax, int int8, int ct, int dt)
{
    if (!ct)
        return amax > 0.0f ? (1.0f / amax) * 448.0f : 1.0f;
    float s = qd_ct_round(amax / (int8 ? 127.5f : 448.0f), dt);
    return s == 0.0f ? qd_ct_eps(dt) : s;
}

/* What the scale component holds: compressed-tensors' scale itself; transformers'
 * weight_scale_inv, 1 / scale in f32 (0 for an infinite scale). */
QD_HD float qd_fp8_stored_scale(float scale, int ct) { return ct ? scale : 1.0f / scale; }

/* compressed-tensors' e4m3 code of x, as its Triton _quantize_kernel computes it: the quotient
 * x / scale in f32 (div.rn.f32; not rounded to the weight's dtype, which the eager torch fallback
 * that llm-compressor takes on a CPU-only machine does), plus the zero point (an e4m3 zero: -0
 * becomes +0, anything else stays) in f32, then the clamp to +-448 and the cast (round to nearest
 * even, cvt.rn.satfinite), which qd_f32_to_e4m3's saturation is. */
QD_HD uint8_t qd_fp8_ct_code(float x, float scale) { return qd_f32_to_e4m3(x / scale + 0.0f); }

/* transformers' e4m3 code: clamp(x * scale) cast. x * inf (the infinite scale of a subnormal
 * block) saturates; 0 * inf is NaN, code 0x7f (the GPU's NaN: transformers quantizes on a GPU). */
QD_HD uint8_t qd_fp8_tf_code(float x, float scale) { return qd_f32_to_e4m3(x * scale); }

/* The stored byte of x under the plan's arithmetic (int8: two's complement, the same Triton
 * kernel's code as w8a16's with a zero point of 0). */
QD_HD uint8_t qd_fp8_code(float x, float scale, int int8, int ct)
{
    if (int8)
        return (uint8_t)(int8_t)qd_ct_int_code(x, scale, 0, 8);
    return ct ? qd_fp8_ct_code(x, scale) : qd_fp8_tf_code(x, scale);
}

/* Dequantize one byte with its stored scale: the code's value (exact in the dtype) times the
 * scale, rounded to the scale's dtype (compressed-tensors' x_q.to(scale.dtype) * scale;
 * transformers and DeepSeek multiply in f32); the caller rounds to the output dtype. */
QD_HD float qd_fp8_value(uint8_t code, float scale, int int8, int dt)
{
    float q = int8 ? (float)(int8_t)code : qd_e4m3_to_f32(code);
    return qd_ct_round(q * scale, dt);
}

/* Scale i of a component in dtype dt (aligned buffers). */
QD_HD void qd_fp8_put_scale(void *s, int64_t i, float v, int dt)
{
    if (dt == 0)
        ((float *)s)[i] = v;
    else
        ((uint16_t *)s)[i] = dt == 2 ? qd_f32_to_bf16(v) : qd_f32_to_f16(v);
}

QD_HD float qd_fp8_get_scale(const void *s, int64_t i, int dt)
{
    if (dt == 0)
        return ((const float *)s)[i];
    uint16_t h = ((const uint16_t *)s)[i];
    return dt == 2 ? qd_bf16_to_f32(h) : qd_f16_to_f32(h);
}

#endif
