/* AVX2 form of ggml's iq4_nl / iq4_xs search (kernels/iquants.h qd_iq4_quantize): eight
 * 32-element searches side by side in the eight lanes (iq4_xs: the sub-blocks of one
 * super-block; iq4_nl: eight consecutive blocks). Each lane does exactly the scalar code's float
 * operations in the scalar order (the sums over a block's elements stay sequential within the
 * lane, branches become per-lane selects, no FMA), so the scales and codes are the same bits;
 * what is one scalar chain across the lanes (iq4_xs's sigma2 over 256 values, the largest
 * sub-block scale, the 6-bit scales) stays scalar. */
#ifndef QD_CPU_IQUANT_AVX2_H
#define QD_CPU_IQUANT_AVX2_H

#include "../iquants.h"

#ifdef __AVX2__
#include <immintrin.h>

#define QD_IQUANT_AVX2 1

#define IQ4_INLINE static inline __attribute__((always_inline))

/* qd_iq4_best_index(x) is the number of midpoints m_k = (v[k] + v[k + 1]) / 2 (k = 0..14) that x
 * is not below. Within [v[k], v[k + 1]) the scalar test x - v[k] < v[k + 1] - x can only turn
 * from true to false as x grows (each rounded difference is monotonic in x), and it turns at
 * m_k exactly: for x near m_k both differences are exact (multiples of x's ulp, fewer than 2^24
 * of them: |m_k| >= 4.5 and half a gap is at most 12), so x < m_k decides, and a tie (x = m_k)
 * goes up as in the scalar code. Below v[0] the count is 0 and from v[15] on it is 15, as
 * there; "not below" is true for NaN, which the scalar binary search also sends up to 15 (all
 * 2^32 f32 patterns give the scalar index: checked once). The count runs in two levels: x
 * against m_3, m_7, m_11 gives the group g, then against m_{4g}, m_{4g+1}, m_{4g+2}. */
static const float iq4_mid_in_group[3][8] = {
    {-115.5f, -42.0f, 7.0f, 61.0f}, /* m_{4g} */
    {-93.5f, -28.5f, 19.0f, 79.0f}, /* m_{4g+1} */
    {-74.0f, -16.0f, 31.5f, 101.0f}, /* m_{4g+2} */
};
static const float iq4_values[16] = {-127.0f, -104.0f, -83.0f, -65.0f, -49.0f, -35.0f, -22.0f, -10.0f,
                                     1.0f,    13.0f,   25.0f,  38.0f,  53.0f,  69.0f,  89.0f,  113.0f};

struct iq4_grid8 {
    __m256 mid[3], low, high; /* the in-group midpoints by group, the values 0..7 and 8..15 */
};

IQ4_INLINE struct iq4_grid8 iq4_grid8_load(void)
{
    struct iq4_grid8 g;
    for (int r = 0; r < 3; r++)
        g.mid[r] = _mm256_loadu_ps(iq4_mid_in_group[r]);
    g.low = _mm256_loadu_ps(iq4_values);
    g.high = _mm256_loadu_ps(iq4_values + 8);
    return g;
}

/* qd_iq4_best_index in eight lanes: the index, and in *q the grid value. */
IQ4_INLINE __m256i iq4_nearest8(const struct iq4_grid8 *g, __m256 x, __m256 *q)
{
    const __m256 a = _mm256_cmp_ps(x, _mm256_set1_ps(-57.0f), _CMP_NLT_UQ); /* m_3 */
    const __m256 b = _mm256_cmp_ps(x, _mm256_set1_ps(-4.5f), _CMP_NLT_UQ);  /* m_7: index >= 8 */
    const __m256 c = _mm256_cmp_ps(x, _mm256_set1_ps(45.5f), _CMP_NLT_UQ);  /* m_11 */
    /* the masks are -1 where set: subtracting counts them */
    const __m256i group = _mm256_sub_epi32(
        _mm256_sub_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_castps_si256(a)), _mm256_castps_si256(b)),
        _mm256_castps_si256(c));
    __m256i index = _mm256_slli_epi32(group, 2);
    for (int r = 0; r < 3; r++)
        index = _mm256_sub_epi32(
            index, _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_permutevar8x32_ps(g->mid[r], group), _CMP_NLT_UQ)));
    /* the permute reads the index's low three bits; b says which half of the grid */
    *q = _mm256_blendv_ps(_mm256_permutevar8x32_ps(g->low, index), _mm256_permutevar8x32_ps(g->high, index), b);
    return index;
}

/* One pass of the search at inverse scales id (per lane): the weighted sums of q x and q^2,
 * element by element, as the scalar loop adds them. */
IQ4_INLINE void iq4_pass8(const struct iq4_grid8 *g, const __m256 *xt, const __m256 *w, __m256 id, __m256 *sumqx,
                          __m256 *sumq2)
{
    __m256 sx = _mm256_setzero_ps(), s2 = _mm256_setzero_ps();
    for (int i = 0; i < 32; i++) {
        __m256 q;
        (void)iq4_nearest8(g, _mm256_mul_ps(id, xt[i]), &q);
        const __m256 wq = _mm256_mul_ps(w[i], q);
        sx = _mm256_add_ps(sx, _mm256_mul_ps(wq, xt[i]));
        s2 = _mm256_add_ps(s2, _mm256_mul_ps(wq, q));
    }
    *sumqx = sx;
    *sumq2 = s2;
}

/* The scale search of eight 32-element blocks (lane j: xt[i] holds element i of block j, w[i]
 * its weight): scales[j] as qd_iq4_quantize's first loop leaves scales[ib], 0 for a block whose
 * largest magnitude is below QD_KQ_EPS. */
IQ4_INLINE void iq4_search8(const struct iq4_grid8 *g, const __m256 *xt, const __m256 *w, float *scales)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), zero = _mm256_setzero_ps();
    __m256 max = zero, amax = zero;
    for (int i = 0; i < 32; i++) { /* the first value of largest magnitude (strict >) */
        const __m256 ax = _mm256_and_ps(xt[i], absmask), more = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);
        amax = _mm256_blendv_ps(amax, ax, more);
        max = _mm256_blendv_ps(max, xt[i], more);
    }
    const __m256 zeroed = _mm256_cmp_ps(amax, _mm256_set1_ps(QD_KQ_EPS), _CMP_LT_OQ);
    /* -max / v0, C's negation: the sign bit flipped */
    const __m256 d0 = _mm256_div_ps(_mm256_xor_ps(max, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(-127.0f));
    __m256 sumqx, sumq2;
    iq4_pass8(g, xt, w, _mm256_div_ps(_mm256_set1_ps(1.0f), d0), &sumqx, &sumq2);
    __m256 d = _mm256_and_ps(_mm256_div_ps(sumqx, sumq2), _mm256_cmp_ps(sumq2, zero, _CMP_GT_OQ));
    __m256 best = _mm256_mul_ps(d, sumqx);
    for (int itry = -7; itry <= 7; itry++) {
        iq4_pass8(g, xt, w, _mm256_div_ps(_mm256_set1_ps((float)(itry - 127)), max), &sumqx, &sumq2);
        const __m256 take = _mm256_and_ps(_mm256_cmp_ps(sumq2, zero, _CMP_GT_OQ),
                                          _mm256_cmp_ps(_mm256_mul_ps(sumqx, sumqx), _mm256_mul_ps(best, sumq2),
                                                        _CMP_GT_OQ));
        d = _mm256_blendv_ps(d, _mm256_div_ps(sumqx, sumq2), take);
        best = _mm256_blendv_ps(best, _mm256_mul_ps(d, sumqx), take);
    }
    _mm256_storeu_ps(scales, _mm256_andnot_ps(zeroed, d));
}

/* Lane j of the result is p[stride * j + i]. */
IQ4_INLINE __m256 iq4_column8(const float *p, int stride, int i)
{
    return _mm256_set_ps(p[7 * stride + i], p[6 * stride + i], p[5 * stride + i], p[4 * stride + i],
                         p[3 * stride + i], p[2 * stride + i], p[stride + i], p[i]);
}

/* The codes of 32 values x[j] at inverse scale id (best_index(id * x[j])), packed as ggml packs
 * them: q4[j] = L[j] | L[j + 16] << 4. */
IQ4_INLINE void iq4_codes32(const struct iq4_grid8 *g, const float *x, float id, uint8_t *q4)
{
    const __m256 idv = _mm256_set1_ps(id);
    __m256i L[4];
    for (int k = 0; k < 4; k++) {
        __m256 q;
        L[k] = iq4_nearest8(g, _mm256_mul_ps(idv, _mm256_loadu_ps(x + 8 * k)), &q);
    }
    const __m256i lo = _mm256_or_si256(L[0], _mm256_slli_epi32(L[2], 4)); /* j = 0..7 */
    const __m256i hi = _mm256_or_si256(L[1], _mm256_slli_epi32(L[3], 4)); /* j = 8..15 */
    /* packus interleaves the 128-bit halves: 0-3, 8-11, 4-7, 12-15; the permute restores order */
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    _mm_storeu_si128((__m128i *)q4,
                     _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
}

/* The weights of eight blocks (lane j: xt[i] element i of block j, qwt[i] its importance or
 * NULL): qw * sqrt(sigma2 + x^2), or x^2 without an importance. */
IQ4_INLINE void iq4_weights8(const __m256 *xt, const __m256 *qwt, __m256 sigma2, __m256 *w)
{
    for (int i = 0; i < 32; i++) {
        const __m256 x2 = _mm256_mul_ps(xt[i], xt[i]);
        w[i] = qwt ? _mm256_mul_ps(qwt[i], _mm256_sqrt_ps(_mm256_add_ps(sigma2, x2))) : x2;
    }
}

/* qd_iq4_quantize(1, x, qw, blk): one iq4_xs super-block of 256 values (qw: their importance,
 * or NULL). */
static inline void qd_iq4_xs_quantize_avx2(const float *x, const float *qw, uint8_t *blk)
{
    const struct iq4_grid8 g = iq4_grid8_load();
    __m256 xt[32], qwt[32], w[32];
    for (int i = 0; i < 32; i++)
        xt[i] = iq4_column8(x, 32, i);
    float sigma2 = 0.0f;
    if (qw) { /* one sequential sum over the super-block, only the weights read it */
        sigma2 = qd_iq4_sigma2(x, QD_QK_K);
        for (int i = 0; i < 32; i++)
            qwt[i] = iq4_column8(qw, 32, i);
    }
    iq4_weights8(xt, qw ? qwt : NULL, _mm256_set1_ps(sigma2), w);
    float scales[8];
    iq4_search8(&g, xt, w, scales);
    /* a zero sub-block's scale 0 never wins: the scalar skip */
    const float d = -qd_kq_max_abs_first(scales, 8) / 32.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int ls[8];
    for (int ib = 0; ib < 8; ib++) {
        const int l = qd_kq_clampi(qd_kq_round(id * scales[ib]), -32, 31);
        const float dl = d * (float)l;
        iq4_codes32(&g, x + 32 * ib, dl != 0.0f ? 1.0f / dl : 0.0f, blk + 8 + 16 * ib);
        ls[ib] = l + 32;
    }
    qd_iq4_xs_put_scales(d, ls, blk);
}

/* qd_iq4_quantize(0, ...) on eight consecutive iq4_nl blocks: x holds 256 values, block j at
 * x + 32 j; qw NULL (no importance) or eight pointers, block j's importance at qw[j]. Writes
 * 8 iq4_nl blocks. */
static inline void qd_iq4_nl_quantize8_avx2(const float *x, const float *const *qw, uint8_t *blk)
{
    const struct iq4_grid8 g = iq4_grid8_load();
    __m256 xt[32], qwt[32], w[32];
    __m256 sigma2 = _mm256_setzero_ps();
    for (int i = 0; i < 32; i++)
        xt[i] = iq4_column8(x, 32, i);
    if (qw) {
        for (int i = 0; i < 32; i++) { /* each block's own sequential sum */
            sigma2 = _mm256_add_ps(sigma2, _mm256_mul_ps(xt[i], xt[i]));
            qwt[i] = _mm256_set_ps(qw[7][i], qw[6][i], qw[5][i], qw[4][i], qw[3][i], qw[2][i], qw[1][i], qw[0][i]);
        }
        sigma2 = _mm256_mul_ps(sigma2, _mm256_set1_ps(2.0f / 32.0f));
    }
    iq4_weights8(xt, qw ? qwt : NULL, sigma2, w);
    float scales[8];
    iq4_search8(&g, xt, w, scales);
    for (int j = 0; j < 8; j++) {
        uint8_t *b = blk + sizeof(struct qd_block_iq4_nl) * j;
        qd_put_f16(b, scales[j]);
        iq4_codes32(&g, x + 32 * j, scales[j] != 0.0f ? 1.0f / scales[j] : 0.0f, b + 2);
    }
}

#else
#define QD_IQUANT_AVX2 0
static inline void qd_iq4_xs_quantize_avx2(const float *x, const float *qw, uint8_t *blk)
{
    (void)x, (void)qw, (void)blk;
}
static inline void qd_iq4_nl_quantize8_avx2(const float *x, const float *const *qw, uint8_t *blk)
{
    (void)x, (void)qw, (void)blk;
}
#endif

#endif
