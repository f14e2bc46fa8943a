/* OCP MX (MXFP4/6/8) and NVFP4 blocks, shared by the CPU and CUDA backends. Arithmetic follows
 * torchao's prototype/mx_formats: to_mx (mx_tensor.py) and nvfp4_quantize (nvfp4_tensor.py). */
#ifndef QD_MX_H
#define QD_MX_H

#include "ctint.h"
#include "fp.h"

enum qd_mx_elem { QD_E2M1, QD_E2M3, QD_E3M2, QD_E4M3, QD_E5M2 };

#define QD_MX_BLOCK 32
#define QD_NVFP4_BLOCK 16

/* Exponent of the largest normal (floor rule) and the largest value of each element type. */
QD_HD int qd_mx_emax(int elem)
{
    const int emax[] = {2, 2, 4, 8, 15};
    return emax[elem];
}

QD_HD float qd_mx_max_pos(int elem)
{
    const float maxv[] = {6.0f, 7.5f, 28.0f, 448.0f, 57344.0f};
    return maxv[elem];
}

/* Packed bytes of one 32-element block's data. fp6 packed: 4 codes in 3 bytes. */
QD_HD int qd_mx_block_data_bytes(int elem, int fp6_unpacked)
{
    if (elem == QD_E2M1)
        return 16;
    if (elem == QD_E2M3 || elem == QD_E3M2)
        return fp6_unpacked ? 32 : 24;
    return 32;
}

/* Saturating, round-to-nearest-even element code of an already scaled value. */
QD_HD uint8_t qd_mx_encode(int elem, float v)
{
    switch (elem) {
    case QD_E2M1: return qd_f32_to_floatx(v, 2, 1);
    case QD_E2M3: return qd_f32_to_floatx(v, 2, 3);
    case QD_E3M2: return qd_f32_to_floatx(v, 3, 2);
    case QD_E4M3: return qd_f32_to_e4m3(v);
    default: return qd_f32_to_e5m2(v);
    }
}

QD_HD float qd_mx_decode(int elem, uint8_t c)
{
    switch (elem) {
    case QD_E2M1: return qd_floatx_to_f32(c & 15, 2, 1);
    case QD_E2M3: return qd_floatx_to_f32(c & 63, 2, 3);
    case QD_E3M2: return qd_floatx_to_f32(c & 63, 3, 2);
    case QD_E4M3: return qd_e4m3_to_f32(c);
    default: return qd_e5m2_to_f32(c);
    }
}

/* max |x| with NaN propagating, as torch.amax does. */
QD_HD float qd_block_amax(const float *x, int n)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = qd_absf(x[i]);
        amax = (a > amax || a != a) ? a : amax;
    }
    return amax;
}

/* Stores 32 codes: fp4 two per byte, the first in the low nibble (torchao pack_uint4); fp6
 * packed as 4 codes per 3 bytes, code i of a group at bits 6i..6i+5 of a little-endian 24-bit
 * word (the same low-first order); fp8 and unpacked fp6 one per byte. */
QD_HD void qd_mx_pack(int elem, int fp6_unpacked, const uint8_t *codes, uint8_t *out)
{
    if (elem == QD_E2M1) {
        for (int j = 0; j < 16; j++)
            out[j] = (uint8_t)(codes[2 * j] | codes[2 * j + 1] << 4);
    } else if ((elem == QD_E2M3 || elem == QD_E3M2) && !fp6_unpacked) {
        for (int g = 0; g < 8; g++) {
            uint32_t w = (uint32_t)codes[4 * g] | (uint32_t)codes[4 * g + 1] << 6 |
                         (uint32_t)codes[4 * g + 2] << 12 | (uint32_t)codes[4 * g + 3] << 18;
            out[3 * g] = (uint8_t)w;
            out[3 * g + 1] = (uint8_t)(w >> 8);
            out[3 * g + 2] = (uint8_t)(w >> 16);
        }
    } else {
        for (int j = 0; j < 32; j++)
            out[j] = codes[j];
    }
}

QD_HD uint8_t qd_mx_unpack(int elem, int fp6_unpacked, const uint8_t *in, int j)
{
    if (elem == QD_E2M1)
        return (uint8_t)((in[j / 2] >> ((j & 1) * 4)) & 15);
    if ((elem == QD_E2M3 || elem == QD_E3M2) && !fp6_unpacked) {
        const uint8_t *g = in + (j / 4) * 3;
        uint32_t w = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16;
        return (uint8_t)((w >> (6 * (j & 3))) & 63);
    }
    return in[j];
}

/* One MX block: the E8M0 scale (floor or rceil rule) and the 32 packed element codes. */
QD_HD uint8_t qd_mx_quantize_block(int elem, int rceil, int fp6_unpacked, const float *x,
                                   uint8_t *out)
{
    float amax = qd_block_amax(x, QD_MX_BLOCK);
    uint8_t scale;
    if (rceil) /* _to_mx_rceil: max_abs * (1.0 / max_pos), the python double taken as f32 */
        scale = qd_e8m0_rceil(amax * (float)(1.0 / (double)qd_mx_max_pos(elem)));
    else
        scale = qd_e8m0_floor(amax, qd_mx_emax(elem));
    float inv = qd_e8m0_reciprocal(scale);
    uint8_t codes[QD_MX_BLOCK];
    /* one loop per element type, so each is a straight loop the compiler vectorizes */
    switch (elem) {
    case QD_E2M1:
        for (int j = 0; j < QD_MX_BLOCK; j++)
            codes[j] = qd_f32_to_floatx(x[j] * inv, 2, 1);
        break;
    case QD_E2M3:
        for (int j = 0; j < QD_MX_BLOCK; j++)
            codes[j] = qd_f32_to_floatx(x[j] * inv, 2, 3);
        break;
    case QD_E3M2:
        for (int j = 0; j < QD_MX_BLOCK; j++)
            codes[j] = qd_f32_to_floatx(x[j] * inv, 3, 2);
        break;
    case QD_E4M3:
        for (int j = 0; j < QD_MX_BLOCK; j++)
            codes[j] = qd_f32_to_e4m3(x[j] * inv);
        break;
    default:
        for (int j = 0; j < QD_MX_BLOCK; j++)
            codes[j] = qd_f32_to_e5m2(x[j] * inv);
    }
    qd_mx_pack(elem, fp6_unpacked, codes, out);
    return scale;
}

QD_HD void qd_mx_dequantize_block(int elem, int fp6_unpacked, uint8_t scale, const uint8_t *in,
                                  float *y)
{
    float s = qd_e8m0_to_f32(scale);
    for (int j = 0; j < QD_MX_BLOCK; j++)
        y[j] = qd_mx_decode(elem, qd_mx_unpack(elem, fp6_unpacked, in, j)) * s;
}

/* torch.clamp: NaN passes through. */
QD_HD float qd_clamp(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

#define QD_E4M3_TINY 0.015625f /* finfo(float8_e4m3fn).tiny = 2^-6 */

/* One NVFP4 block of 16: the E4M3 scale byte and 8 bytes of E2M1 codes (low nibble first).
 * Two-level when per_tensor_scale > 0, else torchao's single-level path. */
QD_HD uint8_t qd_nvfp4_quantize_block(float per_tensor_scale, const float *x, uint8_t *out)
{
    float block_scale = qd_block_amax(x, QD_NVFP4_BLOCK) / 6.0f;
    float r;
    uint8_t sbyte;
    if (per_tensor_scale > 0.0f) {
        sbyte = qd_f32_to_e4m3(qd_clamp(block_scale / per_tensor_scale, QD_E4M3_TINY, 448.0f));
        r = (1.0f / per_tensor_scale) / qd_e4m3_to_f32(sbyte);
    } else {
        sbyte = qd_f32_to_e4m3(qd_clamp(block_scale, QD_E4M3_TINY, 448.0f));
        r = 1.0f / qd_e4m3_to_f32(sbyte);
    }
    uint8_t codes[QD_NVFP4_BLOCK];
    for (int j = 0; j < QD_NVFP4_BLOCK; j++)
        codes[j] = qd_f32_to_floatx(qd_clamp(x[j] * r, -6.0f, 6.0f), 2, 1);
    for (int j = 0; j < 8; j++)
        out[j] = (uint8_t)(codes[2 * j] | codes[2 * j + 1] << 4);
    return sbyte;
}

/* e2m1(code) * f32(e4m3) * per_tensor_scale, left to right in f32. */
QD_HD void qd_nvfp4_dequantize_block(float per_tensor_scale, uint8_t sbyte, const uint8_t *in,
                                     float *y)
{
    const float e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    float s = qd_e4m3_to_f32(sbyte);
    for (int j = 0; j < QD_NVFP4_BLOCK; j++) {
        float v = e2m1[(in[j / 2] >> ((j & 1) * 4)) & 15] * s;
        y[j] = per_tensor_scale > 0.0f ? v * per_tensor_scale : v;
    }
}

/* ---- the same blocks as compressed-tensors computes them ------------------------------ */

/* compressed-tensors' 4-bit float weight schemes (llm-compressor NVFP4A16 and MXFP4A16, formats
 * nvfp4-pack-quantized and mxfp4-pack-quantized), one block at a time, for every backend:
 * quantd's nvfp4 with flow=compressed_tensors and mxfp4 with scale_rounding=even. The contract
 * is llm-compressor 0.14's memoryless min-max observer (generate_gparam for NVFP4's global scale)
 * and compressed-tensors 0.19's calculate_qparams and compressors, which run on the weight in
 * its own dtype: a torch op on a bf16 (f16) tensor computes in f32 and rounds to bf16 (f16), so
 * quantd rounds where they do (qd_ct_round). docs/formats.md has the whole flow. */
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
