/* compressed-tensors' 4-bit float weight schemes (llm-compressor NVFP4A16 and MXFP4A16, formats
 * nvfp4-pack-quantized and mxfp4-pack-quantized), one block at a time, for every backend:
 * quantd's nvfp4 with flow=compressed_tensors and mxfp4 with scale_rounding=even. The contract
 * is llm-compressor 0.14's memoryless min-max observer (generate_gparam for NVFP4's global scale)
 * and compressed-tensors 0.19's calculate_qparams and compressors, which run on the weight in
 * its own dtype: a torch op on a bf16 (f16) tensor computes in f32 and rounds to bf16 (f16), so
 * quantd rounds where they do (qd_ct_round). docs/formats.md has the whole flow. */
#ifndef QD_CTFP_H
#define QD_CTFP_H

#include "ctint.h"
#include "mx.h"

/* A block whose compressed-tensors MX scale is infinite in the weight's dtype (noted like a
 * non-finite input, with the block's first element: kernels/quantize.c words the error). */
#define QD_BAD_MX_SCALE_RANGE ((int64_t)1 << 61)

/* generate_gparam for a tensor (or a fused q/k/v or gate/up group) of dtype dt (0 f32, 1 f16,
 * 2 bf16) whose largest |x| is amax: 448 * 6 / max(amax, finfo(dt).tiny). Python evaluates
 * `2688.0 / tensor` as tensor.reciprocal() * 2688, two ops rounded to the dtype; an infinite
 * or NaN result (an f16 amax below 0.041 overflows) becomes 1 (nan_to_num). */
QD_HD float qd_ct_nvfp4_global_scale(float amax, int dt)
{
    if (amax != amax)
        return 1.0f;
    const float tiny = dt == 1 ? 0x1p-14f : 0x1p-126f;
    float r = qd_ct_round(1.0f / (amax > tiny ? amax : tiny), dt);
    float g = qd_ct_round(r * 2688.0f, dt);
    return qd_isfinite(g) ? g : 1.0f;
}

/* The E2M1 code compressed-tensors packs for v: cast_to_fp4 rounds to the nearest grid value
 * (ties to even) after the clamp to +-6 and multiplies by torch.sign(v), which is 0 for -0.0:
 * the sign bit is set only for v < 0, so a negative value that rounds to zero packs as 8 and
 * -0.0 as 0. */
QD_HD uint8_t qd_ct_e2m1(float v)
{
    return v == 0.0f ? (uint8_t)0 : qd_f32_to_floatx(qd_clamp(v, -6.0f, 6.0f), 2, 1);
}

/* An NVFP4 block's scale byte from its amax (TENSOR_GROUP strategy, global scale gs):
 * calculate_qparams takes amax / 6 in the dtype, times gs in f32, clamped to +-448 and cast to
 * e4m3 (a zero becomes eps 0.125); *eff is what the compressor divides by, scale / gs in f32. */
QD_HD uint8_t qd_ct_nvfp4_scale(float gs, int dt, float amax, float *eff)
{
    uint8_t sb = qd_f32_to_e4m3(qd_clamp(gs * qd_ct_round(amax / 6.0f, dt), -448.0f, 448.0f));
    if ((sb & 0x7f) == 0)
        sb = 0x20; /* 0.125 */
    *eff = qd_e4m3_to_f32(sb) / gs;
    return sb;
}

/* One NVFP4 block of 16: the E4M3 scale byte and 8 bytes of codes x / eff, the first element
 * in the low nibble (pack_fp4_to_uint8). */
QD_HD uint8_t qd_ct_nvfp4_block(float gs, int dt, const float *x, uint8_t *out)
{
    float eff;
    uint8_t sb = qd_ct_nvfp4_scale(gs, dt, qd_block_amax(x, QD_NVFP4_BLOCK), &eff);
    for (int j = 0; j < QD_NVFP4_BLOCK / 2; j++)
        out[j] = (uint8_t)(qd_ct_e2m1(x[2 * j] / eff) | qd_ct_e2m1(x[2 * j + 1] / eff) << 4);
    return sb;
}

/* The decompressor: e2m1 * (scale / gs) in f32 (rounded once to the output dtype after). */
QD_HD void qd_ct_nvfp4_dequantize_block(float gs, uint8_t sb, const uint8_t *in, float *y)
{
    float eff = qd_e4m3_to_f32(sb) / gs;
    for (int j = 0; j < QD_NVFP4_BLOCK; j++)
        y[j] = qd_floatx_to_f32((uint8_t)((in[j / 2] >> ((j & 1) * 4)) & 15), 2, 1) * eff;
}

/* generate_mx_scales as calculate_qparams runs it on a block's amax in the dtype:
 * round_to_power_2 adds 2^(m-2) to the bits (m mantissa bits) and keeps sign and exponent, so
 * the amax goes up to the next power of two from a mantissa of 1.75; floor(log2) of it, minus
 * floor(log2(6)) = 2, plus 127, clamped to [0, 255] (an amax that rounds to 0 gives -inf,
 * hence 0). The scale 2^(byte - 127) then goes back into the dtype: in f16 one below 2^-24
 * underflows to 0 and calculate_qparams puts 1 (the uint8 eps) in its place, byte 127.
 * -1 where the rounded amax is infinite (f16 amax >= 57344, f32 >= 1.75 * 2^127): torch would
 * store an infinite scale. */
QD_HD int qd_ct_mx_scale(float amax, int dt)
{
    if (dt == 1) { /* on the f16 bits: subnormals (no implicit bit) round differently */
        uint32_t r = ((uint32_t)qd_f32_to_f16(amax) + 0x100u) & 0xfc00u;
        if (r >= 0x7c00u)
            return -1;
        return r == 0 ? 127 : 127 + (int)(r >> 10) - 15 - 2;
    }
    /* bf16's bits are f32's top half: adding 2^5 there is adding 2^21 here */
    uint32_t r = (qd_f32_bits(amax) + (1u << 21)) & 0xff800000u;
    if (r >= 0x7f800000u)
        return -1;
    int b = r == 0 ? 0 : (int)(r >> 23) - 2;
    return b < 0 ? 0 : b;
}

/* The code of x in a block with scale byte sb (inv = 2^(127 - sb)): on a CUDA device
 * compressed-tensors divides in its Triton kernel, in f32 (div.rn.f32, subnormals kept), and
 * _round_to_fp4 takes the sign from `quotient < 0`: a negative weight whose quotient is an f32
 * subnormal packs as 8 even where the weight's dtype would round that quotient to -0.0 (its
 * eager CPU fallback writes 0 there). x * inv is that quotient: inv is a power of two. */
QD_HD uint8_t qd_ct_mx_code(float x, float inv) { return qd_ct_e2m1(x * inv); }

/* One MXFP4 block of 32: its scale byte (255 where qd_ct_mx_scale refuses; *overflow set) and
 * 16 bytes of codes, low nibble first. */
QD_HD uint8_t qd_ct_mx_block(int dt, const float *x, uint8_t *out, int *overflow)
{
    int b = qd_ct_mx_scale(qd_block_amax(x, QD_MX_BLOCK), dt);
    *overflow = b < 0;
    uint8_t sb = b < 0 ? (uint8_t)255 : (uint8_t)b;
    float inv = b < 0 ? 0.0f : qd_e8m0_reciprocal(sb); /* x / inf = 0 */
    for (int j = 0; j < QD_MX_BLOCK / 2; j++)
        out[j] = (uint8_t)(qd_ct_mx_code(x[2 * j], inv) | qd_ct_mx_code(x[2 * j + 1], inv) << 4);
    return sb;
}

#endif
