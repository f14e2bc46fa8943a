/* AVX2 form of ggml's IQ2_XXS search (kernels/iq2.h qd_iq2_quantize_block with qd_iq2xxs_sub):
 * the eight 32-element sub-blocks of a super-block run side by side in the eight lanes. Each
 * lane does exactly the scalar code's float operations in the scalar order (the sums over a
 * sub-block's elements and over a point's 8 coordinates stay sequential within the lane,
 * branches become per-lane selects, no FMA), so scales and codes are the same bits. The kmap
 * lookup is a gather; an off-grid group's neighbour list is walked as a masked loop over the
 * longest list among the lanes, a lane taking a point only while its own list lasts and only on
 * a strictly smaller distance (the scalar first-of-equals). What stays scalar: the signs, the
 * weights, make_qp_quants' starting scale and levels (one call per sub-block: its levels stay
 * where no trial wins and the scale is not positive, a NaN scale from Inf weights) and the
 * packing. */
#ifndef QD_CPU_IQ2_AVX2_H
#define QD_CPU_IQ2_AVX2_H

#include "../iq2.h"

#ifdef __AVX2__
#include <immintrin.h>

#define QD_IQ2_AVX2 1

#define IQ2_INLINE static inline __attribute__((always_inline))

/* qd_kq_round in eight lanes: the same 1.5 * 2^23 trick, so the same ints for every input */
IQ2_INLINE __m256i iq2_round8(__m256 v)
{
    const __m256i i = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0f)));
    return _mm256_sub_epi32(_mm256_and_si256(i, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
}

/* nb[at] for eight offsets at >= 1 without reading past the list's end: the 32 bits at
 * at - 1 hold it in their high half (little endian). Lanes outside mask read 0. */
IQ2_INLINE __m256i iq2_nb_at8(const uint16_t *nb, __m256i at, __m256i mask)
{
    const __m256i w = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(const void *)(nb - 1), at,
                                                  mask, 2);
    return _mm256_srli_epi32(w, 16);
}

/* The two 32-bit halves of grid point p (8 coordinate bytes), eight lanes */
IQ2_INLINE void iq2_point8(const struct qd_iq2_tables *t, __m256i p, __m256i *lo, __m256i *hi)
{
    const int *base = (const int *)(const void *)t->grid[0];
    const __m256i at = _mm256_slli_epi32(p, 1); /* in 4-byte units: 8 bytes a point */
    *lo = _mm256_i32gather_epi32(base, at, 4);
    *hi = _mm256_i32gather_epi32(base + 1, at, 4);
}

/* coordinate i (0..7) of the point whose halves are lo, hi */
IQ2_INLINE __m256i iq2_coord8(__m256i lo, __m256i hi, int i)
{
    const __m256i h = i < 4 ? lo : hi;
    return _mm256_and_si256(_mm256_srli_epi32(h, 8 * (i & 3)), _mm256_set1_epi32(255));
}

/* qd_iq2_group in eight lanes: group levels of x (xt[0..8)) at inverse scale id, the nearest
 * listed neighbour at scale where they fall off the grid (weights wa). Levels into L[0..8). */
IQ2_INLINE void iq2_group8(const struct qd_iq2_tables *t, const __m256 *xt, const __m256 *wa, __m256 id, __m256 scale,
                           __m256i *L)
{
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    const __m256i two = _mm256_set1_epi32(2), zero = _mm256_setzero_si256();
    __m256i u = zero;
    for (int i = 0; i < 8; i++) {
        const __m256 v = _mm256_mul_ps(half, _mm256_sub_ps(_mm256_mul_ps(id, xt[i]), one));
        L[i] = _mm256_min_epi32(_mm256_max_epi32(iq2_round8(v), zero), two);
    }
    for (int i = 7; i >= 0; i--) /* qd_iq2_tuple: base 3, coordinate 0 least significant */
        u = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_add_epi32(u, u)), L[i]);
    const __m256i m = _mm256_i32gather_epi32(t->map, u, 4);
    const __m256i off = _mm256_cmpgt_epi32(zero, m);
    if (_mm256_testz_si256(off, off))
        return;
    /* the list of an off-grid lane starts at -m - 1: its count, then the points */
    const __m256i base = _mm256_and_si256(off, _mm256_sub_epi32(_mm256_set1_epi32(-1), m));
    /* the count: the low half of the 32 bits at base (the first point follows it) */
    const __m256i cnt = _mm256_and_si256(
        _mm256_mask_i32gather_epi32(zero, (const int *)(const void *)t->neighbours, base, off, 2),
        _mm256_set1_epi32(0xffff));
    int longest = 0;
    {
        int c[8];
        _mm256_storeu_si256((__m256i *)c, cnt);
        for (int j = 0; j < 8; j++)
            longest = longest > c[j] ? longest : c[j];
    }
    __m256 best_d2 = _mm256_set1_ps(3.40282347e38f);
    __m256i best = _mm256_set1_epi32(-1);
    for (int j = 1; j <= longest; j++) {
        const __m256i jv = _mm256_set1_epi32(j);
        const __m256i active = _mm256_cmpgt_epi32(_mm256_add_epi32(cnt, _mm256_set1_epi32(1)), jv); /* j <= cnt */
        const __m256i p = iq2_nb_at8(t->neighbours, _mm256_add_epi32(base, jv), active);
        __m256i lo, hi;
        iq2_point8(t, p, &lo, &hi);
        __m256 d2 = _mm256_setzero_ps();
        for (int i = 0; i < 8; i++) {
            const __m256 diff = _mm256_sub_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(iq2_coord8(lo, hi, i))), xt[i]);
            d2 = _mm256_add_ps(d2, _mm256_mul_ps(_mm256_mul_ps(wa[i], diff), diff));
        }
        const __m256i take =
            _mm256_and_si256(active, _mm256_castps_si256(_mm256_cmp_ps(d2, best_d2, _CMP_LT_OQ)));
        best_d2 = _mm256_blendv_ps(best_d2, d2, _mm256_castsi256_ps(take));
        best = _mm256_blendv_epi8(best, p, take);
    }
    /* no finite distance: the first listed point */
    const __m256i none = _mm256_and_si256(off, _mm256_cmpgt_epi32(zero, best));
    best = _mm256_blendv_epi8(best, iq2_nb_at8(t->neighbours, _mm256_add_epi32(base, _mm256_set1_epi32(1)), none),
                              none);
    best = _mm256_and_si256(best, off); /* on-grid lanes read point 0, unused */
    __m256i lo, hi;
    iq2_point8(t, best, &lo, &hi);
    for (int i = 0; i < 8; i++) /* coordinates 1, 3, 5 are levels 0, 1, 2 */
        L[i] = _mm256_blendv_epi8(L[i], _mm256_srli_epi32(iq2_coord8(lo, hi, i), 1), off);
}

/* qd_iq2_sums over 32 values in eight lanes */
IQ2_INLINE void iq2_sums8(const __m256 *w, const __m256 *xt, const __m256i *L, __m256 *sumqx, __m256 *sumq2)
{
    __m256 sx = _mm256_setzero_ps(), s2 = _mm256_setzero_ps();
    for (int i = 0; i < 32; i++) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_add_epi32(L[i], L[i]), _mm256_set1_epi32(1)));
        sx = _mm256_add_ps(sx, _mm256_mul_ps(_mm256_mul_ps(w[i], xt[i]), q));
        s2 = _mm256_add_ps(s2, _mm256_mul_ps(_mm256_mul_ps(w[i], q), q));
    }
    *sumqx = sx;
    *sumq2 = s2;
}

/* qd_iq2xxs_sub for the eight sub-blocks in the lanes (xt, wt, wat: element i of each sub-block's
 * |x|, weight and sqrt(weight)); eff_max the lanes' 3 x make_qp scale, start that scale and L
 * (in and out) its levels. The scales into scale_out, the levels into L[0..32). */
IQ2_INLINE void iq2xxs_search8(const struct qd_iq2_tables *t, const __m256 *xt, const __m256 *wt, const __m256 *wat,
                               __m256 eff_max, __m256 start, __m256 *scale_out, __m256i *L)
{
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    __m256 scale = start, best = zero;
    __m256i Laux[32];
    for (int is = -6; is <= 6; is++) {
        const __m256 id = _mm256_div_ps(_mm256_set1_ps(5.0f + (float)is * 0.1f), eff_max);
        const __m256 this_scale = _mm256_div_ps(one, id);
        for (int k = 0; k < 4; k++)
            iq2_group8(t, xt + 8 * k, wat + 8 * k, id, this_scale, Laux + 8 * k);
        __m256 sumqx, sumq2;
        iq2_sums8(wt, xt, Laux, &sumqx, &sumq2);
        const __m256 take = _mm256_and_ps(
            _mm256_cmp_ps(sumq2, zero, _CMP_GT_OQ),
            _mm256_cmp_ps(_mm256_mul_ps(sumqx, sumqx), _mm256_mul_ps(best, sumq2), _CMP_GT_OQ));
        if (_mm256_testz_ps(take, take))
            continue;
        scale = _mm256_blendv_ps(scale, _mm256_div_ps(sumqx, sumq2), take);
        best = _mm256_blendv_ps(best, _mm256_mul_ps(scale, sumqx), take);
        for (int i = 0; i < 32; i++)
            L[i] = _mm256_blendv_epi8(L[i], Laux[i], _mm256_castps_si256(take));
    }
    const __m256 positive = _mm256_cmp_ps(scale, zero, _CMP_GT_OQ);
    if (!_mm256_testz_ps(positive, positive)) { /* the levels again at the chosen scale */
        const __m256 id = _mm256_div_ps(one, scale);
        for (int k = 0; k < 4; k++)
            iq2_group8(t, xt + 8 * k, wat + 8 * k, id, scale, Laux + 8 * k);
        __m256 sumqx, sumq2;
        iq2_sums8(wt, xt, Laux, &sumqx, &sumq2);
        const __m256 refit = _mm256_and_ps(positive, _mm256_cmp_ps(sumq2, zero, _CMP_GT_OQ));
        for (int i = 0; i < 32; i++)
            L[i] = _mm256_blendv_epi8(L[i], Laux[i], _mm256_castps_si256(positive));
        scale = _mm256_blendv_ps(scale, _mm256_div_ps(sumqx, sumq2), refit);
    }
    *scale_out = scale;
}

/* qd_iq2_quantize_block(t, QD_IQ2_XXS, x, qw, blk): t must be the IQ2_XXS tables. */
static inline void qd_iq2xxs_quantize_avx2(const struct qd_iq2_tables *QD_RESTRICT t, const float *QD_RESTRICT x,
                                           const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    float weight[8][32], waux[8][32], xval[8][32], eff[8], start[8];
    int32_t Lqp[32][8] = {{0}};
    uint8_t signs[8][4];
    int zero[8];
    for (int i = 0; i < 66; i++)
        blk[i] = 0;
    float sumx2 = 0.0f;
    for (int i = 0; i < QD_QK_K; i++)
        sumx2 += x[i] * x[i];
    const float sigma2 = sumx2 / (float)QD_QK_K;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        for (int i = 0; i < 32; i++)
            weight[ib][i] = qw ? qw[32 * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]) : 0.25f * sigma2 + xb[i] * xb[i];
        for (int i = 0; i < 32; i++)
            waux[ib][i] = sqrtf(weight[ib][i]);
        for (int k = 0; k < 4; k++)
            signs[ib][k] = qd_iq2_signs(xb + 8 * k, weight[ib] + 8 * k, xval[ib] + 8 * k, 1);
        /* qd_iq2xxs_sub's start: the zero test and make_qp_quants' scale */
        float max = xval[ib][0];
        for (int i = 1; i < 32; i++)
            max = max > xval[ib][i] ? max : xval[ib][i];
        zero[ib] = 1;
        eff[ib] = start[ib] = 1.0f; /* a zero lane searches at a harmless scale, its result unused */
        if (max < QD_KQ_EPS)
            continue;
        uint8_t Lq[32];
        const float s = qd_imx_make_qp(32, 4, xval[ib], Lq, weight[ib]);
        for (int i = 0; i < 32; i++) /* the scalar code reads these bytes as int8_t */
            Lqp[i][ib] = (int8_t)Lq[i];
        if (s * 3.0f <= 0.0f) /* a NaN goes on, as in the scalar code */
            continue;
        zero[ib] = 0;
        eff[ib] = s * 3.0f;
        start[ib] = s;
    }
    __m256 xt[32], wt[32], wat[32];
    for (int i = 0; i < 32; i++) {
        xt[i] = _mm256_set_ps(xval[7][i], xval[6][i], xval[5][i], xval[4][i], xval[3][i], xval[2][i], xval[1][i],
                              xval[0][i]);
        wt[i] = _mm256_set_ps(weight[7][i], weight[6][i], weight[5][i], weight[4][i], weight[3][i], weight[2][i],
                              weight[1][i], weight[0][i]);
        wat[i] = _mm256_set_ps(waux[7][i], waux[6][i], waux[5][i], waux[4][i], waux[3][i], waux[2][i], waux[1][i],
                               waux[0][i]);
    }
    __m256 scale_v;
    __m256i Lv[32];
    for (int i = 0; i < 32; i++)
        Lv[i] = _mm256_loadu_si256((const __m256i *)Lqp[i]);
    iq2xxs_search8(t, xt, wt, wat, _mm256_loadu_ps(eff), _mm256_loadu_ps(start), &scale_v, Lv);
    float scales[8], max_scale = 0.0f;
    int Lt[32][8];
    _mm256_storeu_ps(scales, scale_v);
    for (int i = 0; i < 32; i++)
        _mm256_storeu_si256((__m256i *)Lt[i], Lv[i]);
    for (int ib = 0; ib < 8; ib++) {
        if (zero[ib]) {
            scales[ib] = 0.0f;
            continue;
        }
        float scale = scales[ib];
        if (scale < 0.0f) { /* ggml's guard: a positive scale, the signs flipped */
            scale = -scale;
            for (int k = 0; k < 4; k++)
                signs[ib][k] = (uint8_t)(~signs[ib][k] & 127);
        }
        for (int k = 0; k < 4; k++) {
            int8_t L[8];
            for (int i = 0; i < 8; i++)
                L[i] = (int8_t)Lt[8 * k + i][ib];
            blk[2 + 8 * ib + k] = (uint8_t)qd_iq2_index(t, L);
            const uint32_t s = (uint32_t)signs[ib][k] << 7 * k;
            for (int j = 0; j < 4; j++)
                blk[6 + 8 * ib + j] |= (uint8_t)(s >> 8 * j);
        }
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (max_scale == 0.0f) { /* d 0 and every code cleared, as the scalar block does */
        for (int i = 0; i < 66; i++)
            blk[i] = 0;
        return;
    }
    const float d = max_scale / 31.0f;
    qd_put_f16(blk, d);
    const float id = 1.0f / d;
    for (int ib = 0; ib < 8; ib++)
        blk[6 + 8 * ib + 3] |= (uint8_t)(qd_iq2_scale_code(id, scales[ib]) << 4);
}

#else
#define QD_IQ2_AVX2 0
static inline void qd_iq2xxs_quantize_avx2(const struct qd_iq2_tables *t, const float *x, const float *qw,
                                           uint8_t *blk)
{
    (void)t, (void)x, (void)qw, (void)blk;
}
#endif

#endif
