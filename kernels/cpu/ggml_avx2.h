/* AVX2 forms of the q8_0/q8_1 and q4_0 block quantizers: the same arithmetic as kernels/ggml.h
 * (the _ref functions), eight lanes at a time, the same bytes. A block holding NaN/Inf goes
 * to the scalar code (its sequential max defines what such a block gives), as does one whose
 * 1/d overflows. */
#ifndef QD_CPU_GGML_AVX2_H
#define QD_CPU_GGML_AVX2_H

#include "../ggml.h"

#ifdef __AVX2__
#include <immintrin.h>

#define QD_GGML_AVX2 1

/* 32 int32 codes (four vectors, in order) to 32 bytes in order. */
static inline __attribute__((always_inline)) __m256i pack_codes(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i all = _mm256_packs_epi16(ab, cd);
    /* packs interleave 128-bit lanes: dwords come out as 0 4 1 5 2 6 3 7 */
    return _mm256_permutevar8x32_epi32(all, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* f16 bits of a finite f32, rounded to nearest even: F16C, the same as qd_f32_to_f16 there. */
static inline void put_f16_finite(uint8_t *p, float v)
{
    uint16_t h = (uint16_t)_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
    memcpy(p, &h, 2);
}

/* max |x| of the block as bits: for non-negative floats the unsigned order of the bits is the
 * numeric one, and NaN/Inf sort above every finite value. */
static inline __attribute__((always_inline)) uint32_t block_amax_bits(const __m256 *v)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i m = _mm256_max_epu32(
        _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(v[0]), abs_mask),
                         _mm256_and_si256(_mm256_castps_si256(v[1]), abs_mask)),
        _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(v[2]), abs_mask),
                         _mm256_and_si256(_mm256_castps_si256(v[3]), abs_mask)));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(h);
}

/* Returns 0 (writing nothing) for a block the vector code does not take: one holding NaN/Inf,
 * or one so small that 1/d overflows (the scalar code's out-of-range casts define those). */
static inline __attribute__((always_inline)) int qd_ggml_q8_avx2(int type, const float *x, uint8_t *blk)
{
    __m256 v[4] = {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)};
    uint32_t bits = block_amax_bits(v);
    if (bits >= 0x7f800000u)
        return 0;
    const float d = qd_bits_f32(bits) / 127.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    if (!qd_isfinite(inv))
        return 0;
    const __m256 id = _mm256_set1_ps(inv);
    /* roundf(s) = trunc(s + copysign(0.49999997, s)), exact for every float */
    const __m256 below_half = _mm256_set1_ps(0.49999997f);
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256i q[4];
    for (int k = 0; k < 4; k++) {
        __m256 s = _mm256_mul_ps(v[k], id);
        __m256 h = _mm256_or_ps(below_half, _mm256_and_ps(s, sign_mask));
        q[k] = _mm256_cvttps_epi32(_mm256_add_ps(s, h));
    }
    int off = type == QD_Q8_1 ? 4 : 2;
    _mm256_storeu_si256((__m256i *)(blk + off), pack_codes(q[0], q[1], q[2], q[3]));
    put_f16_finite(blk, d);
    if (type == QD_Q8_1) {
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        put_f16_finite(blk + 2, (float)_mm_cvtsi128_si32(h) * d);
    }
    return 1;
}

/* Lane j of the result: the unsigned max (or the sum, add = 1) of the eight lanes of v[j]. */
static inline __attribute__((always_inline)) __m256i reduce8(const __m256i *v, int add)
{
#define QD_OP(a, b) (add ? _mm256_add_epi32(a, b) : _mm256_max_epu32(a, b))
    __m256i p[4], q[2];
    for (int i = 0; i < 4; i++) /* per 128-bit half: v[2i] and v[2i+1] folded to two lanes each */
        p[i] = QD_OP(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++) /* then four vectors to one lane each, per half */
        q[i] = QD_OP(_mm256_unpacklo_epi64(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_epi64(p[2 * i], p[2 * i + 1]));
    return QD_OP(_mm256_permute2x128_si256(q[0], q[1], 0x20), _mm256_permute2x128_si256(q[0], q[1], 0x31));
#undef QD_OP
}

/* Eight q8_0/q8_1 blocks at once: the same bytes as eight qd_ggml_q8_avx2 calls, with the
 * scale divisions done once per eight blocks in vector form (IEEE division, like the scalar
 * one) so no block waits on two scalar divides in a row. Returns 0, writing nothing, when
 * one of the blocks needs the per-block path (NaN/Inf, or 1/d overflowing). */
static inline __attribute__((always_inline)) int qd_ggml_q8_avx2_x8(int type, const float *x, uint8_t *blk)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i m[8];
    for (int b = 0; b < 8; b++) {
        const __m256i *xb = (const __m256i *)(x + 32 * b);
        __m256i a0 = _mm256_and_si256(_mm256_loadu_si256(xb), abs_mask);
        __m256i a1 = _mm256_and_si256(_mm256_loadu_si256(xb + 1), abs_mask);
        __m256i a2 = _mm256_and_si256(_mm256_loadu_si256(xb + 2), abs_mask);
        __m256i a3 = _mm256_and_si256(_mm256_loadu_si256(xb + 3), abs_mask);
        m[b] = _mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3));
    }
    __m256i amax = reduce8(m, 0);
    /* NaN/Inf: bits at or above the infinity pattern (signed compare is safe: the sign bit is 0) */
    if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(amax, _mm256_set1_epi32(0x7f7fffff))))
        return 0;
    const __m256 d = _mm256_div_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(127.0f));
    const __m256 nz = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    const __m256 inv = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), nz);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(inv), inf), inf)))
        return 0;
    float invs[8];
    uint16_t dh[8];
    _mm256_storeu_ps(invs, inv);
    _mm_storeu_si128((__m128i *)dh, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
    const int bytes = type == QD_Q8_1 ? 36 : 34, off = type == QD_Q8_1 ? 4 : 2;
    const __m256 below_half = _mm256_set1_ps(0.49999997f);
    __m256i sums[8];
    for (int b = 0; b < 8; b++) {
        const __m256 id = _mm256_broadcast_ss(&invs[b]);
        __m256i q[4];
        for (int k = 0; k < 4; k++) { /* roundf(x*id) = sign(x) * trunc(|x|*id + 0.49999997): id >= 0 */
            __m256i v = _mm256_loadu_si256((const __m256i *)(x + 32 * b + 8 * k));
            __m256 s = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(v, abs_mask)), id);
            q[k] = _mm256_sign_epi32(_mm256_cvttps_epi32(_mm256_add_ps(s, below_half)), v);
        }
        uint8_t *o = blk + b * bytes;
        _mm256_storeu_si256((__m256i *)(o + off), pack_codes(q[0], q[1], q[2], q[3]));
        memcpy(o, &dh[b], 2);
        if (type == QD_Q8_1)
            sums[b] = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    }
    if (type == QD_Q8_1) {
        __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(reduce8(sums, 1)), d);
        _mm_storeu_si128((__m128i *)dh, _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT));
        for (int b = 0; b < 8; b++)
            memcpy(blk + b * bytes + 2, &dh[b], 2);
    }
    return 1;
}

static inline __attribute__((always_inline)) int qd_ggml_q4_0_avx2(const float *x, uint8_t *blk)
{
    __m256 v[4] = {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)};
    uint32_t bits = block_amax_bits(v);
    if (bits >= 0x7f800000u)
        return 0;
    /* the signed value of the first element reaching amax (the scalar loop's strict <) */
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), am = _mm256_set1_epi32((int)bits);
    uint32_t hit = 0;
    for (int k = 0; k < 4; k++)
        hit |= (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
                   _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v[k]), abs_mask), am))) << (8 * k);
    const float max = bits ? x[__builtin_ctz(hit)] : 0.0f;
    const float d = max / -8.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    if (!qd_isfinite(inv))
        return 0;
    const __m256 id = _mm256_set1_ps(inv), bias = _mm256_set1_ps(8.5f);
    const __m256i cap = _mm256_set1_epi32(15);
    __m256i q[4];
    for (int k = 0; k < 4; k++) /* (int8_t)(x*id + 8.5), capped at 15: the sum is in [0.5, 16.5] */
        q[k] = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(v[k], id), bias)), cap);
    /* byte j = code j | code j+16 << 4 */
    __m256i lo = _mm256_or_si256(q[0], _mm256_slli_epi32(q[2], 4));
    __m256i hi = _mm256_or_si256(q[1], _mm256_slli_epi32(q[3], 4));
    __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(lo, hi), _mm256_setzero_si256());
    w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128((__m128i *)(blk + 2), _mm256_castsi256_si128(w));
    put_f16_finite(blk, d);
    return 1;
}

/* Eight q4_0 blocks at once: the same bytes as eight qd_ggml_q4_0_avx2 calls, the two
 * divisions per block done once per eight in vector form (IEEE, like the scalar ones).
 * Returns 0, writing nothing, when a block needs the per-block path. */
static inline __attribute__((always_inline)) int qd_ggml_q4_0_avx2_x8(const float *x, uint8_t *blk)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i m[8];
    for (int b = 0; b < 8; b++) {
        const __m256i *xb = (const __m256i *)(x + 32 * b);
        __m256i a0 = _mm256_and_si256(_mm256_loadu_si256(xb), abs_mask);
        __m256i a1 = _mm256_and_si256(_mm256_loadu_si256(xb + 1), abs_mask);
        __m256i a2 = _mm256_and_si256(_mm256_loadu_si256(xb + 2), abs_mask);
        __m256i a3 = _mm256_and_si256(_mm256_loadu_si256(xb + 3), abs_mask);
        m[b] = _mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3));
    }
    __m256i amax = reduce8(m, 0);
    if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(amax, _mm256_set1_epi32(0x7f7fffff))))
        return 0;
    uint32_t ab[8];
    float maxv[8];
    _mm256_storeu_si256((__m256i *)ab, amax);
    for (int b = 0; b < 8; b++) { /* the signed value of the first element reaching amax */
        const __m256i am = _mm256_set1_epi32((int)ab[b]);
        uint32_t hit = 0;
        for (int k = 0; k < 4; k++)
            hit |= (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(
                       _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 32 * b + 8 * k)), abs_mask), am)))
                   << (8 * k);
        maxv[b] = ab[b] ? x[32 * b + __builtin_ctz(hit)] : 0.0f;
    }
    const __m256 d = _mm256_div_ps(_mm256_loadu_ps(maxv), _mm256_set1_ps(-8.0f));
    const __m256 nz = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    const __m256 inv = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), nz);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(inv), inf), inf)))
        return 0;
    float invs[8];
    uint16_t dh[8];
    _mm256_storeu_ps(invs, inv);
    _mm_storeu_si128((__m128i *)dh, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
    const __m256 bias = _mm256_set1_ps(8.5f);
    const __m256i cap = _mm256_set1_epi32(15);
    for (int b = 0; b < 8; b++) {
        const __m256 id = _mm256_broadcast_ss(&invs[b]);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_min_epi32(
                _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * b + 8 * k), id), bias)), cap);
        __m256i lo = _mm256_or_si256(q[0], _mm256_slli_epi32(q[2], 4));
        __m256i hi = _mm256_or_si256(q[1], _mm256_slli_epi32(q[3], 4));
        __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(lo, hi), _mm256_setzero_si256());
        w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        uint8_t *block = blk + sizeof(struct qd_block_q4_0) * b;
        _mm_storeu_si128((__m128i *)(block + 2), _mm256_castsi256_si128(w));
        memcpy(block, &dh[b], 2);
    }
    return 1;
}

#else /* no AVX2: the callers take the scalar code */
#define QD_GGML_AVX2 0
static inline int qd_ggml_q8_avx2(int type, const float *x, uint8_t *blk) { (void)type, (void)x, (void)blk; return 0; }
static inline int qd_ggml_q4_0_avx2(const float *x, uint8_t *blk) { (void)x, (void)blk; return 0; }
static inline int qd_ggml_q8_avx2_x8(int type, const float *x, uint8_t *blk) { (void)type, (void)x, (void)blk; return 0; }
static inline int qd_ggml_q4_0_avx2_x8(const float *x, uint8_t *blk) { (void)x, (void)blk; return 0; }
#endif
#endif
