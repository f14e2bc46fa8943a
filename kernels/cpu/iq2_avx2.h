/* AVX2 form of ggml's IQ2_XXS search (kernels/iq2.h qd_iq2_quantize_block with qd_iq2xxs_sub):
 * the eight 32-element sub-blocks of a super-block run side by side in the eight lanes. Each
 * lane does exactly the scalar code's float operations in the scalar order (the sums over a
 * sub-block's elements and over a point's 8 coordinates stay sequential within the lane,
 * branches become per-lane selects, no FMA), so scales and codes are the same bits. The kmap
 * lookup is a gather; an off-grid group's neighbour list is scanned for its lane alone, eight
 * candidates of the list at a time (kernels/cpu/iqscan.h: a candidate's distance still summed
 * over its 8 coordinates in the scalar order, the pick the scalar's first of equals). What
 * stays scalar: the signs, the weights, make_qp_quants' starting scale and levels (one call per
 * sub-block: its levels stay where no trial wins and the scale is not positive, a NaN scale from
 * Inf weights) and the packing. */
#ifndef QD_CPU_IQ2_AVX2_H
#define QD_CPU_IQ2_AVX2_H

#include "../iq2.h"
#include "iq_lanes_avx2.h"

#ifdef __AVX2__
#include <immintrin.h>

#define QD_IQ2_AVX2 1

#define IQ2_INLINE static inline __attribute__((always_inline))

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

/* qd_iq2_group in eight lanes: group k's levels of x (xt[0..8)) at inverse scale id, the nearest
 * listed neighbour at scale where they fall off the grid. Levels into L[0..8). Each off-grid
 * lane scans its own list eight candidates at a time (qd_iq_scan_pick): the distance terms
 * w (s c - x)^2 of the 3 coordinate values are computed once per list with the scalar's
 * operations, two coordinates to a table, so a candidate costs a table read and an add per
 * coordinate and no gather. */
IQ2_INLINE void iq2_group8(const struct qd_iq2_tables *t, const struct qd_iq_lanes *lanes, int k, const __m256 *xt,
                           __m256 id, __m256 scale, __m256i *L)
{
    const __m256i zero = _mm256_setzero_si256();
    __m256i u = zero;
    qd_iq_levels8(xt, 8, id, 2, L);
    for (int i = 7; i >= 0; i--) /* qd_iq2_tuple: base 3, coordinate 0 least significant */
        u = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_add_epi32(u, u)), L[i]);
    const __m256i off = _mm256_cmpgt_epi32(zero, _mm256_i32gather_epi32(t->map, u, 4));
    if (_mm256_testz_si256(off, off))
        return;
    /* the grid's coordinate values 1, 3, 5 in slots 0..2 (even rows) and 4..6 (odd rows) */
    const __m256 c = _mm256_setr_ps(1.0f, 3.0f, 5.0f, 0.0f, 1.0f, 3.0f, 5.0f, 0.0f);
    __m256i lo, hi;
    iq2_point8(t, qd_iq_scan_lanes8(lanes, k, 8, u, scale, off, c), &lo, &hi); /* on-grid lanes read point 0 */
    for (int i = 0; i < 8; i++) /* coordinates 1, 3, 5 are levels 0, 1, 2 */
        L[i] = _mm256_blendv_epi8(L[i], _mm256_srli_epi32(iq2_coord8(lo, hi, i), 1), off);
}

/* qd_iq2xxs_sub for the eight sub-blocks in the lanes (xt, wt: element i of each sub-block's
 * |x| and weight; lanes: the same per lane, with sqrt(weight)); eff_max the lanes' 3 x make_qp scale, start that scale and L
 * (in and out) its levels. The scales into scale_out, the levels into L[0..32). */
IQ2_INLINE void iq2xxs_search8(const struct qd_iq2_tables *t, const struct qd_iq_lanes *lanes, const __m256 *xt,
                               const __m256 *wt, __m256 eff_max, __m256 start, __m256 *scale_out, __m256i *L)
{
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    __m256 scale = start, best = zero;
    __m256i Laux[32];
    for (int is = -6; is <= 6; is++) {
        const __m256 id = _mm256_div_ps(_mm256_set1_ps(5.0f + (float)is * 0.1f), eff_max);
        const __m256 this_scale = _mm256_div_ps(one, id);
        for (int k = 0; k < 4; k++)
            iq2_group8(t, lanes, k, xt + 8 * k, id, this_scale, Laux + 8 * k);
        __m256 sumqx, sumq2;
        qd_iq_sums8(wt, xt, Laux, &sumqx, &sumq2);
        (void)qd_iq_take8(sumqx, sumq2, &scale, &best, L, Laux);
    }
    const __m256 positive = _mm256_cmp_ps(scale, zero, _CMP_GT_OQ);
    if (!_mm256_testz_ps(positive, positive)) { /* the levels again at the chosen scale */
        const __m256 id = _mm256_div_ps(one, scale);
        for (int k = 0; k < 4; k++)
            iq2_group8(t, lanes, k, xt + 8 * k, id, scale, Laux + 8 * k);
        __m256 sumqx, sumq2;
        qd_iq_sums8(wt, xt, Laux, &sumqx, &sumq2);
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
    const struct qd_iq_scan *scan = qd_iq2xxs_scan();
    if (!scan) { /* no memory for the scan tables: the scalar code, the same bytes */
        qd_iq2_quantize_block(t, QD_IQ2_XXS, x, qw, blk);
        return;
    }
    float weight[8][32], waux[8][32], xval[8][32], eff[8], start[8];
    int32_t Lqp[32][8] = {{0}};
    uint8_t signs[8][4];
    int zero[8];
    for (int i = 0; i < QD_IQ2_BLOCK_BYTES(QD_IQ2_XXS); i++)
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
    __m256 xt[32], wt[32];
    const struct qd_iq_lanes lanes = qd_iq_lanes_load(scan, xval, weight, waux, xt, wt);
    __m256 scale_v;
    __m256i Lv[32];
    for (int i = 0; i < 32; i++)
        Lv[i] = _mm256_loadu_si256((const __m256i *)Lqp[i]);
    iq2xxs_search8(t, &lanes, xt, wt, _mm256_loadu_ps(eff), _mm256_loadu_ps(start), &scale_v, Lv);
    float scales[8], max_scale = 0.0f;
    int32_t Lt[32][8];
    qd_iq_unpack8(scale_v, Lv, scales, Lt);
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
        for (int i = 0; i < QD_IQ2_BLOCK_BYTES(QD_IQ2_XXS); i++)
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
