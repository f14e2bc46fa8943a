/* AVX2 forms of ggml's IQ3_XXS and IQ1_S searches (kernels/iq3xxs.h qd_iq3xxs_quantize,
 * kernels/iq1.h qd_iq1s_quantize), the same bytes as the scalar code.
 *
 * IQ3_XXS: the eight 32-element sub-blocks of a super-block run side by side in the eight lanes,
 * each lane doing the scalar code's float operations in the scalar order (sums over a
 * sub-block's elements and over a point's 4 coordinates sequential within the lane, branches as
 * per-lane selects, no FMA). The grid map is a gather; an off-grid tuple's neighbour list is
 * scanned for its lane alone, eight candidates of the list at a time (kernels/cpu/iqscan.h: a
 * candidate's distance still summed over its coordinates in the scalar order, the pick the
 * scalar's first of equals). The signs, weights and packing stay scalar.
 *
 * IQ1_S: the exhaustive split search of a sub-block (every i1 <= i2, either shift) tests eight
 * consecutive candidates of the scalar order at once against the best score as it stood before
 * them; where none passes the scalar loop would not have moved either, and where one does, the
 * candidates from the first passing one on are replayed in order with the lanes' own sums (the
 * scalar bits) against the updated best. The rest (sort, prefix sums, grid codes, packing) is
 * the scalar code's. */
#ifndef QD_CPU_IQGRID_AVX2_H
#define QD_CPU_IQGRID_AVX2_H

#include "../iqgrid_quants.h"
#include "iq_lanes_avx2.h"

#ifdef __AVX2__
#include <immintrin.h>

#define QD_IQGRID_AVX2 1

#define IQG_INLINE static inline __attribute__((always_inline))

/* The 4 levels of IQ3_XXS grid point p, one per byte */
IQG_INLINE __m256i iq3_point8(const struct qd_iq_grid *g, __m256i p)
{
    return _mm256_i32gather_epi32((const int *)(const void *)g->levels, p, 4);
}

IQG_INLINE __m256i iq3_level_of(__m256i point, int i)
{
    return _mm256_and_si256(_mm256_srli_epi32(point, 8 * i), _mm256_set1_epi32(255));
}

/* One group of 4 in eight lanes: the levels of xt[0..4) at inverse scale id, and where they fall
 * off the grid the nearest listed neighbour at scale (weights wa). Levels into L[0..4); returns
 * the lanes that fell off. Each off-grid lane scans its own list, eight candidates at a time
 * (qd_iq_scan_pick): the distance terms of the 8 levels of each coordinate are computed once
 * per list, w (s q - x)^2 with the scalar's operations, so a candidate costs a table read and an
 * add per coordinate and no gather. */
IQG_INLINE __m256i iq3_group8(const struct qd_iq_grid *g, const struct qd_iq_lanes *lanes, int k, const __m256 *xt,
                              __m256 id, __m256 scale, __m256i *L)
{
    const __m256i zero = _mm256_setzero_si256();
    __m256i u = zero;
    qd_iq_levels8(xt, 4, id, 7, L);
    for (int i = 0; i < 4; i++)
        u = _mm256_or_si256(u, _mm256_slli_epi32(L[i], 3 * i));
    const __m256i off = _mm256_cmpgt_epi32(zero, _mm256_i32gather_epi32(g->map, u, 4));
    if (_mm256_testz_si256(off, off))
        return off;
    const __m256 q = _mm256_setr_ps(1.0f, 3.0f, 5.0f, 7.0f, 9.0f, 11.0f, 13.0f, 15.0f); /* 2 l + 1 */
    const __m256i pt = iq3_point8(g, qd_iq_scan_lanes8(lanes, k, 4, u, scale, off, q)); /* on-grid lanes: point 0 */
    for (int i = 0; i < 4; i++)
        L[i] = _mm256_blendv_epi8(L[i], iq3_level_of(pt, i), off);
    return off;
}

/* The trial-scale search of qd_iq3xxs_quantize for the eight sub-blocks in the lanes (xt, wt:
 * element i of each one's |x| (sign-adjusted) and weight; lanes: the same per lane, with
 * sqrt(weight); max its largest value). The scales into scale_out, the levels into L[0..32). */
IQG_INLINE void iq3_search8(const struct qd_iq_grid *g, const struct qd_iq_lanes *lanes, const __m256 *xt,
                            const __m256 *wt, __m256 max, __m256 *scale_out, __m256i *L)
{
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    __m256 scale = _mm256_div_ps(max, _mm256_set1_ps(15.0f)), best = zero;
    __m256i Laux[32], on_grid[8], off_aux[8];
    for (int i = 0; i < 32; i++)
        L[i] = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++)
        on_grid[k] = _mm256_set1_epi32(-1);
    for (int is = -15; is <= 15; is++) {
        const __m256 id = _mm256_div_ps(_mm256_set1_ps(15.0f + (float)is * 0.2f), max);
        const __m256 this_scale = _mm256_div_ps(one, id);
        for (int k = 0; k < 8; k++)
            off_aux[k] = iq3_group8(g, lanes, k, xt + 4 * k, id, this_scale, Laux + 4 * k);
        __m256 sumqx, sumq2;
        qd_iq_sums8(wt, xt, Laux, &sumqx, &sumq2);
        const __m256i takei = qd_iq_take8(sumqx, sumq2, &scale, &best, L, Laux);
        for (int k = 0; k < 8; k++)
            on_grid[k] = _mm256_blendv_epi8(on_grid[k], _mm256_xor_si256(off_aux[k], _mm256_set1_epi32(-1)), takei);
    }
    /* lanes with a tuple chosen off the grid and a positive scale: those tuples again */
    __m256i any_off = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++)
        any_off = _mm256_or_si256(any_off, _mm256_xor_si256(on_grid[k], _mm256_set1_epi32(-1)));
    const __m256i redo = _mm256_and_si256(any_off, _mm256_castps_si256(_mm256_cmp_ps(scale, zero, _CMP_GT_OQ)));
    if (!_mm256_testz_si256(redo, redo)) {
        const __m256 id = _mm256_div_ps(one, scale);
        for (int k = 0; k < 8; k++) {
            const __m256i mask = _mm256_andnot_si256(on_grid[k], redo);
            if (_mm256_testz_si256(mask, mask))
                continue;
            (void)iq3_group8(g, lanes, k, xt + 4 * k, id, scale, Laux + 4 * k);
            for (int i = 0; i < 4; i++)
                L[4 * k + i] = _mm256_blendv_epi8(L[4 * k + i], Laux[4 * k + i], mask);
        }
        __m256 sumqx, sumq2;
        qd_iq_sums8(wt, xt, L, &sumqx, &sumq2);
        const __m256 refit = _mm256_and_ps(_mm256_castsi256_ps(redo), _mm256_cmp_ps(sumq2, zero, _CMP_GT_OQ));
        scale = _mm256_blendv_ps(scale, _mm256_div_ps(sumqx, sumq2), refit);
    }
    *scale_out = scale;
}

/* qd_iq3xxs_quantize(g, x, qw, blk) */
static inline void qd_iq3xxs_quantize_avx2(const struct qd_iq_grid *QD_RESTRICT g, const float *QD_RESTRICT x,
                                           const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    const struct qd_iq_scan *scan = qd_iq3xxs_scan();
    if (!scan) { /* no memory for the scan tables: the scalar code, the same bytes */
        qd_iq3xxs_quantize(g, x, qw, blk);
        return;
    }
    uint8_t *qs = blk + 2;
    float weight[8][32], waux[8][32], xval[8][32], maxs[8];
    uint8_t bsigns[8][4];
    int zero[8];
    const float sigma2 = qd_iq3xxs_begin(x, blk);
    for (int ib = 0; ib < 8; ib++) { /* the scalar code's weights and signs */
        const float max = qd_iq3xxs_signs(x + 32 * ib, qw ? qw + 32 * ib : NULL, sigma2, weight[ib], waux[ib],
                                          xval[ib], bsigns[ib]);
        zero[ib] = max < 1e-8f; /* GROUP_MAX_EPS_IQ3_XXS */
        maxs[ib] = zero[ib] ? 1.0f : max; /* a zero lane searches at a harmless scale, its result unused */
    }
    __m256 xt[32], wt[32];
    const struct qd_iq_lanes lanes = qd_iq_lanes_load(scan, xval, weight, waux, xt, wt);
    __m256 scale_v;
    __m256i Lv[32];
    iq3_search8(g, &lanes, xt, wt, _mm256_loadu_ps(maxs), &scale_v, Lv);
    float scales[8], max_scale = 0.0f;
    int32_t Lt[32][8];
    uint32_t sas[8];
    qd_iq_unpack8(scale_v, Lv, scales, Lt);
    for (int ib = 0; ib < 8; ib++) {
        sas[ib] = 0;
        if (zero[ib]) { /* codes, signs and scale stay 0 */
            scales[ib] = 0.0f;
            continue;
        }
        int8_t L[32];
        for (int i = 0; i < 32; i++)
            L[i] = (int8_t)Lt[i][ib];
        scales[ib] = qd_iq3xxs_sub_put(g, scales[ib], L, bsigns[ib], qs + 8 * ib, &sas[ib]);
        max_scale = max_scale > scales[ib] ? max_scale : scales[ib];
    }
    qd_iq3xxs_finish(max_scale, scales, sas, blk);
}

/* qd_iq1s_split_search(s) in lanes: the scalar loop's best i1, i2, shift and scale, in its
 * order. */
IQG_INLINE struct qd_iq1s_split iq1s_split_search8(const struct qd_iq1s_sub *s)
{
    const float *sumx = s->sumx, *sumw = s->sumw;
    const float x_p[3] = {-1.0f + QD_IQ1_DELTA, QD_IQ1_DELTA, 1.0f + QD_IQ1_DELTA};
    const float x_m[3] = {-1.0f - QD_IQ1_DELTA, -QD_IQ1_DELTA, 1.0f - QD_IQ1_DELTA};
    /* candidate c of an i1 is (i2 = i1 + c / 2, m = c % 2): even lanes shift up, odd down */
    const __m256 v0 = _mm256_setr_ps(x_p[0], x_m[0], x_p[0], x_m[0], x_p[0], x_m[0], x_p[0], x_m[0]);
    const __m256 v1 = _mm256_setr_ps(x_p[1], x_m[1], x_p[1], x_m[1], x_p[1], x_m[1], x_p[1], x_m[1]);
    const __m256 v2 = _mm256_setr_ps(x_p[2], x_m[2], x_p[2], x_m[2], x_p[2], x_m[2], x_p[2], x_m[2]);
    const __m256i pair = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 zero = _mm256_setzero_ps(), sx32 = _mm256_set1_ps(sumx[32]), sw32 = _mm256_set1_ps(sumw[32]);
    float best_score = -QD_IQ_FLT_MAX, scale = s->max;
    int besti1 = -1, besti2 = -1, best_shift = 0;
    for (int i1 = 0; i1 <= 32; i1++) {
        const int n = 2 * (33 - i1);
        const __m256 a_x = _mm256_set1_ps(sumx[i1] - sumx[0]), a_w = _mm256_set1_ps(sumw[i1] - sumw[0]);
        const __m256 sx1 = _mm256_set1_ps(sumx[i1]), sw1 = _mm256_set1_ps(sumw[i1]);
        for (int c0 = 0; c0 < n; c0 += 8) {
            const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - c0), lane);
            /* i2 of each lane, 32 where the lane is past the end (a valid index, unused) */
            const __m256i i2 = _mm256_min_epi32(_mm256_add_epi32(_mm256_set1_epi32(i1 + c0 / 2), pair),
                                                _mm256_set1_epi32(32));
            const __m256 sx2 = _mm256_i32gather_ps(sumx, i2, 4), sw2 = _mm256_i32gather_ps(sumw, i2, 4);
            const __m256 sumqx = _mm256_add_ps(
                _mm256_add_ps(_mm256_mul_ps(a_x, v0), _mm256_mul_ps(_mm256_sub_ps(sx2, sx1), v1)),
                _mm256_mul_ps(_mm256_sub_ps(sx32, sx2), v2));
            const __m256 sumq2 = _mm256_add_ps(
                _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(a_w, v0), v0),
                              _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(sw2, sw1), v1), v1)),
                _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(sw32, sw2), v2), v2));
            const __m256 pass = _mm256_and_ps(
                _mm256_and_ps(_mm256_castsi256_ps(valid), _mm256_cmp_ps(sumq2, zero, _CMP_GT_OQ)),
                _mm256_cmp_ps(_mm256_mul_ps(sumqx, sumqx), _mm256_mul_ps(_mm256_set1_ps(best_score), sumq2),
                              _CMP_GT_OQ));
            int bits = _mm256_movemask_ps(pass);
            if (!bits)
                continue;
            /* the scalar loop from the first passing candidate on, with the lanes' sums */
            float qx[8], q2[8];
            _mm256_storeu_ps(qx, sumqx);
            _mm256_storeu_ps(q2, sumq2);
            const int last = n - c0 < 8 ? n - c0 : 8;
            for (int l = __builtin_ctz((unsigned)bits); l < last; l++)
                if (q2[l] > 0.0f && qx[l] * qx[l] > best_score * q2[l]) {
                    scale = qx[l] / q2[l];
                    best_score = scale * qx[l];
                    besti1 = i1;
                    besti2 = i1 + (c0 + l) / 2;
                    best_shift = (c0 + l) % 2 ? -1 : 1;
                }
        }
    }
    const struct qd_iq1s_split split = {besti1, besti2, best_shift, scale};
    return split;
}

/* qd_iq1s_quantize(g, x, qw, blk): the scalar code's pieces (kernels/iq1.h) with the split
 * search in lanes */
static inline void qd_iq1s_quantize_avx2(const struct qd_iq_grid *QD_RESTRICT g, const float *QD_RESTRICT x,
                                         const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    struct qd_iq1s_block b;
    struct qd_iq1s_sub s;
    const float sigma2 = qd_iq1s_begin(x, blk, &b);
    for (int ib = 0; ib < 8; ib++)
        if (qd_iq1s_sub_sums(x + 32 * ib, qw + 32 * ib, sigma2, &s))
            qd_iq1s_sub_put(g, x + 32 * ib, &s, iq1s_split_search8(&s), ib, &b, blk);
    qd_iq1s_finish(&b, blk);
}

#else
#define QD_IQGRID_AVX2 0
static inline void qd_iq3xxs_quantize_avx2(const struct qd_iq_grid *g, const float *x, const float *qw, uint8_t *blk)
{
    (void)g, (void)x, (void)qw, (void)blk;
}
static inline void qd_iq1s_quantize_avx2(const struct qd_iq_grid *g, const float *x, const float *qw, uint8_t *blk)
{
    (void)g, (void)x, (void)qw, (void)blk;
}
#endif

#endif
