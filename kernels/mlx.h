/* MLX's quantization (mlx.core.quantize / dequantize of mlx 0.32.4 on its CPU backend), one
 * group at a time, for every backend. Four modes:
 *   affine  per group of 32/64/128: f32 min/max arithmetic (mlx's CPU quantize kernel), codes of
 *           1-8 bits in a little-endian bit stream per row, scale and bias kept in the input dtype;
 *   mxfp4, mxfp8  groups of 32, E2M1 / E4M3 codes and an E8M0 byte; nvfp4: groups of 16, E2M1
 *           codes and an E4M3 byte. These run as mlx array ops in the input dtype D (each op
 *           computes in f32 and rounds to D), so the helpers below round where an op ends.
 * MLX's rules are its own (docs/formats.md has them all): the E8M0 exponent is the smallest e
 * with 2^e >= round_D(amax / max) (mlx rounds log2 and then steps up), a zero group's byte is 127,
 * bytes outside 0..255 wrap; E2M1 codes are mlx's argmin over its 16-entry table, so ties go to
 * the smaller magnitude and a negative value that rounds to zero takes +0's code. */
#ifndef QD_MLX_H
#define QD_MLX_H

#include "fp.h"
#include "registry.h"

enum qd_mlx_mode { QD_MLX_AFFINE, QD_MLX_MXFP4, QD_MLX_NVFP4, QD_MLX_MXFP8 };

#define QD_MLX_CHUNK 32 /* codes per packed unit: 32 codes of b bits are b whole words */
#define QD_MLX_MX_GROUP 32
#define QD_MLX_NV_GROUP 16
#define QD_MLX_NV_ENCODE 2688.0f /* F8E4M3_MAX * F4E2M1_MAX: nvfp4's global scale divides it */

/* v rounded to dtype dt (QD_F32, QD_F16, QD_BF16) and widened back: the result of one mlx op. */
QD_HD float qd_mlx_round(float v, int dt)
{
    return dt == QD_BF16 ? qd_bf16_to_f32(qd_f32_to_bf16(v)) : dt == QD_F16 ? qd_f16_round(v) : v;
}

/* ---- affine ---------------------------------------------------------------------------------- */

/* The scale_dtype parameter's value (enum qd_scale_dtype) naming dtype dt, and the dtype a
 * resolved one names (fallback for auto): mlx keeps affine scales in the input's dtype. */
QD_HD int qd_mlx_scale_dtype_of(int dt)
{
    return dt == QD_F16 ? QD_SCALE_F16 : dt == QD_BF16 ? QD_SCALE_BF16 : QD_SCALE_F32;
}

QD_HD int qd_mlx_scale_dtype_to(int scale_dtype, int fallback)
{
    return scale_dtype == QD_SCALE_F16    ? QD_F16
           : scale_dtype == QD_SCALE_BF16 ? QD_BF16
           : scale_dtype == QD_SCALE_F32  ? QD_F32
                                          : fallback;
}

/* A group's f32 scale and bias from its min and max (mlx's CPU quantize): 1 bit maps 0 to the
 * minimum and 1 to the maximum; otherwise the range over 2^bits - 1 (at least 1e-7), signed so
 * that the extreme of larger magnitude ("edge") is a whole number of steps from 0, and when that
 * number is not 0 the scale is edge / steps and the bias the edge itself. */
QD_HD void qd_mlx_affine_params(float wmin, float wmax, int bits, float *scale, float *bias)
{
    const float eps = 1e-7f;
    if (bits == 1) {
        float s = wmax - wmin;
        *scale = s < eps ? eps : s;
        *bias = wmin;
        return;
    }
    float nbins = (float)((1 << bits) - 1);
    float s = (wmax - wmin) / nbins;
    s = s < eps ? eps : s;
    int lower = qd_absf(wmin) > qd_absf(wmax);
    s = lower ? s : -s;
    float edge = lower ? wmin : wmax;
    float q0 = qd_rint(edge / s);
    *bias = 0.0f;
    if (q0 != 0.0f) {
        s = edge / q0;
        *bias = edge;
    }
    *scale = s;
}

/* The code of an element from its quotient (x - bias) / scale: rounded half to even, clamped to
 * [0, 2^bits - 1]. The quotient is NaN where a 1-bit group's range overflows f32 (inf / inf):
 * mlx's clamps keep the NaN and its cast to uint64 gives 2^63 on x86, a bit no word keeps: 0. */
QD_HD uint32_t qd_mlx_affine_code(float quotient, float nbins)
{
    if (quotient != quotient)
        return 0;
    float q = qd_rint(quotient);
    q = q < 0.0f ? 0.0f : q;
    q = nbins < q ? nbins : q;
    return (uint32_t)q;
}

/* Packs 32 codes of `bits` bits into `bits` words: code j at bit j * bits of the little-endian
 * stream, crossing into the next word for 3, 5 and 6 bits. Every word is written. */
QD_HD void qd_mlx_pack32(const uint32_t *codes, int bits, uint32_t *words)
{
    for (int k = 0; k < bits; k++)
        words[k] = 0;
    for (int j = 0; j < QD_MLX_CHUNK; j++) {
        int at = j * bits, w = at >> 5, sh = at & 31;
        words[w] |= codes[j] << sh;
        if (sh + bits > 32)
            words[w + 1] |= codes[j] >> (32 - sh);
    }
}

/* Code j (0..31) of a packed run of 32 codes. */
QD_HD uint32_t qd_mlx_unpack(const uint32_t *words, int bits, int j)
{
    int at = j * bits, w = at >> 5, sh = at & 31;
    uint64_t two = words[w] | (sh + bits > 32 ? (uint64_t)words[w + 1] << 32 : 0);
    return (uint32_t)(two >> sh) & ((1u << bits) - 1);
}

/* mlx's affine dequantize, in the scales' dtype sdt: (code * scale) + bias, each op rounded. */
QD_HD float qd_mlx_affine_value(uint32_t code, float scale, float bias, int sdt)
{
    return qd_mlx_round(qd_mlx_round((float)code * scale, sdt) + bias, sdt);
}

/* ---- element codes ---------------------------------------------------------------------------- */

/* mlx's E2M1 table (the index is the code) */
#define QD_MLX_E2M1_VALUES {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, \
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f}

/* The E2M1 code mlx's argmin gives for |q| <= 8: the nearest table value, the smaller magnitude on
 * a tie (the first index), and +0's code for a negative value whose nearest magnitude is 0 (+0
 * comes before -0 in the table). Every distance to a neighbouring value is exact there in any
 * dtype, so the thresholds decide as the rounded distances do. */
QD_HD uint32_t qd_mlx_e2m1_near(float q)
{
    float a = qd_absf(q);
    uint32_t m = (uint32_t)(a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) +
                 (a > 5.0f);
    return q < 0.0f && m ? m | 8u : m;
}

/* The E2M1 code for any f32 q (nvfp4's quotients, computed in f32): beyond 8 in magnitude the
 * distances |q - v| round in f32 and tie, and mlx's argmin takes the first smallest; a NaN or an
 * infinite q has every distance NaN or infinite: code 0. */
QD_HD uint32_t qd_mlx_e2m1(float q)
{
    if (qd_absf(q) <= 8.0f)
        return qd_mlx_e2m1_near(q);
    const float table[16] = QD_MLX_E2M1_VALUES;
    uint32_t best = 0;
    float d = qd_absf(q - table[0]);
    for (uint32_t i = 1; i < 16; i++) {
        float di = qd_absf(q - table[i]);
        if (di < d)
            d = di, best = i;
    }
    return best;
}

/* mlx's to_fp8 (E4M3FN): round to nearest even, saturating at +-448 (0x7e); NaN becomes 0x7e
 * with its sign (mlx saturates it like a large value). */
QD_HD uint8_t qd_mlx_e4m3(float v)
{
    if (qd_isnan(v))
        return (uint8_t)(0x7eu | ((qd_f32_bits(v) >> 24) & 0x80u));
    return qd_f32_to_e4m3(v);
}

/* ---- mxfp4 / mxfp8 ------------------------------------------------------------------------------ */

/* The smallest e with 2^e >= s, for a positive finite f32 s (subnormals included). */
QD_HD int qd_mlx_ceil_log2(float s)
{
    uint32_t u = qd_f32_bits(s), e = u >> 23, m = u & 0x7fffffu;
    if (e)
        return (int)e - 127 + (m != 0);
#ifdef __CUDA_ARCH__
    int top = 31 - __clz(m);
#else
    int top = 31 - __builtin_clz(m);
#endif
    return top - 149 + ((m & (m - 1)) != 0);
}

/* x / 2^e for e in [-149, 127], correctly rounded in f32 (as the division is): a product by the
 * exact power, split in two where 2^-e is not an f32. */
QD_HD float qd_mlx_div_pow2(float x, int e)
{
    if (e >= -126)
        return x * qd_bits_f32((uint32_t)(127 - e) << 23);
    return x * 0x1p64f * qd_bits_f32((uint32_t)(127 - e - 64) << 23);
}

/* One mxfp4 (fp8 = 0) or mxfp8 (fp8 = 1) group of 32 in dtype dt: the E8M0 byte, and the codes
 * in 4 (8) words, 8 nibbles (4 bytes) per word, the first element lowest. The scale:
 * s = round_D(amax / 6 or 448), e = 0 when s is 0 and else ceil(log2 s), the byte (e + 127)
 * as mlx's cast to uint8 leaves it (modulo 256); elements round_D(x / round_D(2^e)). */
QD_HD uint8_t qd_mlx_mx_group(int dt, int fp8, const float *x, uint32_t *words)
{
    float amax = 0.0f;
    for (int j = 0; j < QD_MLX_MX_GROUP; j++) {
        float a = qd_absf(x[j]);
        amax = a > amax ? a : amax;
    }
    float s = qd_mlx_round(amax / (fp8 ? 448.0f : 6.0f), dt);
    int e = s == 0.0f ? 0 : qd_mlx_ceil_log2(s);
    /* 2^e is exact in every dtype for the e a dtype's s can give (f16: -24..14) */
    if (fp8) {
        for (int k = 0; k < 8; k++) {
            uint32_t w = 0;
            for (int h = 0; h < 4; h++)
                w |= (uint32_t)qd_mlx_e4m3(qd_mlx_round(qd_mlx_div_pow2(x[4 * k + h], e), dt)) << (8 * h);
            words[k] = w;
        }
    } else {
        for (int k = 0; k < 4; k++) {
            uint32_t w = 0;
            for (int h = 0; h < 8; h++)
                w |= qd_mlx_e2m1_near(qd_mlx_round(qd_mlx_div_pow2(x[8 * k + h], e), dt)) << (4 * h);
            words[k] = w;
        }
    }
    return (uint8_t)(e + 127);
}

/* mlx's dequantize scale 2^(byte - 127) computed in the output dtype odt: 0x7f.. 255 gives
 * 2^128 = inf; in f16, exponents above 15 overflow to inf and below -24 round to 0. */
QD_HD float qd_mlx_mx_scale(uint8_t byte, int odt)
{
    int e = (int)byte - 127;
    float p = e == 128 ? qd_bits_f32(0x7f800000u)
              : e >= -126 ? qd_bits_f32((uint32_t)(e + 127) << 23)
                          : qd_bits_f32(0x00400000u); /* e = -127 */
    return qd_mlx_round(p, odt);
}

/* ---- nvfp4 ------------------------------------------------------------------------------------------ */

/* One nvfp4 group of 16 in dtype dt: the E4M3 byte and two words of codes. enc is 2688 /
 * global_scale in f32 (1 without one): the byte is to_fp8(round_D(amax / 6) * enc); the
 * elements round_D(x / e4m3) * enc, in f32, then mlx's E2M1 argmin. A byte of 0 (a zero group,
 * or one whose scale is below e4m3's range) divides by 0: NaN or infinite quotients, code 0. */
QD_HD uint8_t qd_mlx_nv_group(int dt, float enc, const float *x, uint32_t *words)
{
    float amax = 0.0f;
    for (int j = 0; j < QD_MLX_NV_GROUP; j++) {
        float a = qd_absf(x[j]);
        amax = a > amax ? a : amax;
    }
    uint8_t byte = qd_mlx_e4m3(qd_mlx_round(amax / 6.0f, dt) * enc);
    float sv = qd_e4m3_to_f32(byte); /* exact in f16 and bf16 */
    for (int k = 0; k < 2; k++) {
        uint32_t w = 0;
        for (int h = 0; h < 8; h++)
            w |= qd_mlx_e2m1(qd_mlx_round(x[8 * k + h] / sv, dt) * enc) << (4 * h);
        words[k] = w;
    }
    return byte;
}

/* mlx's nvfp4 dequantize scale: the E4M3 value (0x7f, 0xff: NaN), times global_scale / 2688 in
 * f32 when there is one (inv > 0; mlx then answers in f32). */
QD_HD float qd_mlx_nv_scale(uint8_t byte, float inv)
{
    float s = qd_e4m3_to_f32(byte);
    return inv > 0.0f ? s * inv : s;
}

#endif
