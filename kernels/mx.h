/* OCP MX (MXFP4/6/8) and NVFP4 blocks, shared by the CPU and CUDA backends. Arithmetic follows
 * torchao's prototype/mx_formats: to_mx (mx_tensor.py) and nvfp4_quantize (nvfp4_tensor.py). */
#ifndef QD_MX_H
#define QD_MX_H

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

#endif
