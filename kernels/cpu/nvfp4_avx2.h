/* AVX2 form of the NVFP4 block quantizer (kernels/mx.h qd_nvfp4_quantize_block): the scale
 * byte computed by the same scalar code, the 16 E2M1 codes by qd_f32_to_floatx's integer
 * arithmetic eight lanes at a time, so the bytes are the same. A block holding NaN/Inf goes
 * to the scalar code. */
#ifndef QD_CPU_NVFP4_AVX2_H
#define QD_CPU_NVFP4_AVX2_H

#include "../mx.h"

#ifdef __AVX2__
#include <immintrin.h>

#define QD_NVFP4_AVX2 1

/* E2M1 codes of eight finite values, as qd_f32_to_floatx(v, 2, 1) gives them. */
static inline __attribute__((always_inline)) __m256i e2m1_codes(__m256 v)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i u = _mm256_castps_si256(v);
    __m256i sign = _mm256_andnot_si256(abs_mask, u);
    __m256i n = _mm256_and_si256(u, abs_mask);
    __m256 a = _mm256_castsi256_ps(n);
    /* subnormal (a < 1): adding 2^22, whose ulp is 0.5, rounds to the step (RNE) */
    const __m256i denorm_mask = _mm256_set1_epi32(149 << 23);
    __m256i d = _mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(denorm_mask)));
    __m256i denormal = _mm256_and_si256(_mm256_sub_epi32(d, denorm_mask), _mm256_set1_epi32(0xff));
    /* normal: rebias the exponent, round the one mantissa bit to nearest even */
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(n, 22), _mm256_set1_epi32(1));
    __m256i t = _mm256_add_epi32(n, _mm256_set1_epi32((int)((uint32_t)(1 - 127) << 23) + ((1 << 21) - 1)));
    __m256i normal = _mm256_and_si256(_mm256_srli_epi32(_mm256_add_epi32(t, odd), 22), _mm256_set1_epi32(0xff));
    __m256i small = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(1.0f), _CMP_LT_OQ));
    __m256i big = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(6.0f), _CMP_GE_OQ));
    __m256i code = _mm256_blendv_epi8(normal, denormal, small);
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(7), big);
    return _mm256_or_si256(code, _mm256_srli_epi32(sign, 28));
}

/* The codes of x * r clamped to [-6, 6], as qd_clamp then qd_f32_to_floatx give them. A
 * finite x can still make a NaN (0 * an infinite r, when a subnormal per-tensor scale makes
 * 1 / pts / scale overflow): qd_clamp lets it through and qd_f32_to_floatx reads every NaN as
 * the same one, so a NaN lane takes nan_code. */
static inline __attribute__((always_inline)) __m256i e2m1_scaled_codes(__m256 v, __m256 rv, __m256i nan_code)
{
    __m256 p = _mm256_mul_ps(v, rv);
    __m256i c = e2m1_codes(_mm256_min_ps(_mm256_max_ps(p, _mm256_set1_ps(-6.0f)), _mm256_set1_ps(6.0f)));
    return _mm256_blendv_epi8(c, nan_code, _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q)));
}

/* One block of 16; 0 (writing nothing) when it holds NaN/Inf. */
static inline __attribute__((always_inline)) int qd_nvfp4_avx2(float per_tensor_scale, const float *x, uint8_t *out,
                                                               uint8_t *sbyte)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256i m = _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(v0), abs_mask),
                                 _mm256_and_si256(_mm256_castps_si256(v1), abs_mask));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    uint32_t bits = (uint32_t)_mm_cvtsi128_si32(h);
    if (bits >= 0x7f800000u)
        return 0;
    /* the scalar code's scale, step for step */
    float block_scale = qd_bits_f32(bits) / 6.0f, r;
    if (per_tensor_scale > 0.0f) {
        *sbyte = qd_f32_to_e4m3(qd_clamp(block_scale / per_tensor_scale, QD_E4M3_TINY, 448.0f));
        r = (1.0f / per_tensor_scale) / qd_e4m3_to_f32(*sbyte);
    } else {
        *sbyte = qd_f32_to_e4m3(qd_clamp(block_scale, QD_E4M3_TINY, 448.0f));
        r = 1.0f / qd_e4m3_to_f32(*sbyte);
    }
    const __m256 rv = _mm256_set1_ps(r);
    const __m256i nan_code = _mm256_set1_epi32(qd_f32_to_floatx(qd_bits_f32(0x7fc00000u), 2, 1));
    /* x * r may overflow to Inf (a huge r): the clamp makes it 6, as qd_clamp does */
    __m256i c0 = e2m1_scaled_codes(v0, rv, nan_code), c1 = e2m1_scaled_codes(v1, rv, nan_code);
    /* byte j = code 2j | code 2j+1 << 4: pair up within each 64-bit lane, then pack */
    __m256i p0 = _mm256_or_si256(c0, _mm256_slli_epi64(_mm256_srli_epi64(c0, 32), 4));
    __m256i p1 = _mm256_or_si256(c1, _mm256_slli_epi64(_mm256_srli_epi64(c1, 32), 4));
    /* the pair bytes sit in dwords 0, 2, 4, 6 of each */
    const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    __m256i q0 = _mm256_permutevar8x32_epi32(p0, pick), q1 = _mm256_permutevar8x32_epi32(p1, pick);
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(q0), _mm256_castsi256_si128(q1));
    w = _mm_packus_epi16(w, w);
    _mm_storel_epi64((__m128i *)out, w);
    return 1;
}

/* Lane j: the unsigned max of the eight lanes of v[j] (the eight blocks' amax bits). */
static inline __attribute__((always_inline)) __m256i nvfp4_reduce8(const __m256i *v)
{
    __m256i p[4], q[2];
    for (int i = 0; i < 4; i++)
        p[i] = _mm256_max_epu32(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        q[i] = _mm256_max_epu32(_mm256_unpacklo_epi64(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_epi64(p[2 * i], p[2 * i + 1]));
    return _mm256_max_epu32(_mm256_permute2x128_si256(q[0], q[1], 0x20), _mm256_permute2x128_si256(q[0], q[1], 0x31));
}

/* Eight blocks (128 values) at once: the same bytes as eight qd_nvfp4_avx2 calls, the scale
 * of each (two or three divisions and the E4M3 rounding) computed for all eight in vector form.
 * inv_pts is 1 / per_tensor_scale as the scalar code computes it. The clamped scale lies in
 * [2^-6, 448], where E4M3 is normal: its rounding is qd_f32_to_e4m3's normal branch. 0 (writing
 * nothing) when a block holds NaN/Inf. */
static inline __attribute__((always_inline)) int qd_nvfp4_avx2_x8(float per_tensor_scale, float inv_pts, const float *x,
                                                                  uint8_t *out, uint8_t *sbytes)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i m[8];
    for (int b = 0; b < 8; b++)
        m[b] = _mm256_max_epu32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 16 * b)), abs_mask),
                                _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 16 * b + 8)), abs_mask));
    __m256i amax = nvfp4_reduce8(m);
    if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(amax, _mm256_set1_epi32(0x7f7fffff))))
        return 0;
    __m256 t = _mm256_div_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(6.0f));
    if (per_tensor_scale > 0.0f)
        t = _mm256_div_ps(t, _mm256_set1_ps(per_tensor_scale));
    t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(QD_E4M3_TINY)), _mm256_set1_ps(448.0f));
    /* E4M3, normal range: round the mantissa to 3 bits (nearest even), rebias, cap at 0x7e */
    __m256i a = _mm256_castps_si256(t);
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7ffff)),
                                 _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1)));
    __m256i code = _mm256_min_epi32(_mm256_sub_epi32(_mm256_srli_epi32(r, 20), _mm256_set1_epi32(120 << 3)),
                                    _mm256_set1_epi32(0x7e));
    __m256 sval = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(code, 20), _mm256_set1_epi32(120 << 23)));
    __m256 rv8 = _mm256_div_ps(_mm256_set1_ps(per_tensor_scale > 0.0f ? inv_pts : 1.0f), sval);
    float rs[8];
    uint32_t cs[8];
    _mm256_storeu_ps(rs, rv8);
    _mm256_storeu_si256((__m256i *)cs, code);
    const __m256i nan_code = _mm256_set1_epi32(qd_f32_to_floatx(qd_bits_f32(0x7fc00000u), 2, 1));
    const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    for (int b = 0; b < 8; b++) {
        const __m256 rv = _mm256_broadcast_ss(&rs[b]);
        __m256i c0 = e2m1_scaled_codes(_mm256_loadu_ps(x + 16 * b), rv, nan_code);
        __m256i c1 = e2m1_scaled_codes(_mm256_loadu_ps(x + 16 * b + 8), rv, nan_code);
        __m256i p0 = _mm256_or_si256(c0, _mm256_slli_epi64(_mm256_srli_epi64(c0, 32), 4));
        __m256i p1 = _mm256_or_si256(c1, _mm256_slli_epi64(_mm256_srli_epi64(c1, 32), 4));
        __m256i q0 = _mm256_permutevar8x32_epi32(p0, pick), q1 = _mm256_permutevar8x32_epi32(p1, pick);
        __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(q0), _mm256_castsi256_si128(q1));
        w = _mm_packus_epi16(w, w);
        _mm_storel_epi64((__m128i *)(out + 8 * b), w);
        sbytes[b] = (uint8_t)cs[b];
    }
    return 1;
}

#else
#define QD_NVFP4_AVX2 0
static inline int qd_nvfp4_avx2(float pts, const float *x, uint8_t *out, uint8_t *sbyte)
{
    (void)pts, (void)x, (void)out, (void)sbyte;
    return 0;
}
static inline int qd_nvfp4_avx2_x8(float pts, float inv_pts, const float *x, uint8_t *out, uint8_t *sbytes)
{
    (void)pts, (void)inv_pts, (void)x, (void)out, (void)sbytes;
    return 0;
}
#endif

#endif
