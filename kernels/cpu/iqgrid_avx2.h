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
#include "iqscan.h"

#ifdef __AVX2__
#include <immintrin.h>

#define QD_IQGRID_AVX2 1

#define IQG_INLINE static inline __attribute__((always_inline))

/* qd_kq_round in eight lanes: the same 1.5 * 2^23 trick, so the same ints for every input */
IQG_INLINE __m256i iqg_round8(__m256 v)
{
    const __m256i i = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0f)));
    return _mm256_sub_epi32(_mm256_and_si256(i, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
}

/* The 4 levels of IQ3_XXS grid point p, one per byte */
IQG_INLINE __m256i iq3_point8(const struct qd_iq_grid *g, __m256i p)
{
    return _mm256_i32gather_epi32((const int *)(const void *)g->levels, p, 4);
}

IQG_INLINE __m256i iq3_level_of(__m256i point, int i)
{
    return _mm256_and_si256(_mm256_srli_epi32(point, 8 * i), _mm256_set1_epi32(255));
}

/* What the lanes' groups read: element i of sub-block (lane) l's |x| and sqrt(weight) at
 * x[l][i], wa[l][i], for the neighbour scans, which run one lane at a time. */
struct iq3_lanes {
    const struct qd_iq_scan *scan;
    const float (*x)[32], (*wa)[32];
};

/* One group of 4 in eight lanes: the levels of xt[0..4) at inverse scale id, and where they fall
 * off the grid the nearest listed neighbour at scale (weights wa). Levels into L[0..4); returns
 * the lanes that fell off. Each off-grid lane scans its own list, eight candidates at a time
 * (qd_iq_scan_pick): the distance terms of the 8 levels of each coordinate are computed once
 * per list, w (s q - x)^2 with the scalar's operations, so a candidate costs a table read and an
 * add per coordinate and no gather. */
IQG_INLINE __m256i iq3_group8(const struct qd_iq_grid *g, const struct iq3_lanes *lanes, int k, const __m256 *xt,
                              __m256 id, __m256 scale, __m256i *L)
{
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    const __m256i seven = _mm256_set1_epi32(7), zero = _mm256_setzero_si256();
    __m256i u = zero;
    for (int i = 0; i < 4; i++) {
        const __m256 v = _mm256_mul_ps(half, _mm256_sub_ps(_mm256_mul_ps(id, xt[i]), one));
        L[i] = _mm256_min_epi32(_mm256_max_epi32(iqg_round8(v), zero), seven);
        u = _mm256_or_si256(u, _mm256_slli_epi32(L[i], 3 * i));
    }
    const __m256i m = _mm256_i32gather_epi32(g->map, u, 4);
    const __m256i off = _mm256_cmpgt_epi32(zero, m);
    if (_mm256_testz_si256(off, off))
        return off;
    int32_t us[8], best[8] = {0};
    float scales[8];
    _mm256_storeu_si256((__m256i *)us, u);
    _mm256_storeu_ps(scales, scale);
    const __m256 q = _mm256_setr_ps(1.0f, 3.0f, 5.0f, 7.0f, 9.0f, 11.0f, 13.0f, 15.0f); /* 2 l + 1 */
    for (unsigned lanes_off = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(off)); lanes_off;
         lanes_off &= lanes_off - 1) {
        const int l = __builtin_ctz(lanes_off);
        const float *x = lanes->x[l] + 4 * k, *wa = lanes->wa[l] + 4 * k;
        const __m256 sq = _mm256_mul_ps(_mm256_set1_ps(scales[l]), q);
        __m256 table[4];
        for (int i = 0; i < 4; i++) { /* the scalar's diff = scale q - x; w diff diff */
            const __m256 diff = _mm256_sub_ps(sq, _mm256_set1_ps(x[i]));
            table[i] = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(wa[i]), diff), diff);
        }
        best[l] = qd_iq_scan_pick(lanes->scan, us[l], table, 4, 0);
    }
    const __m256i pt = iq3_point8(g, _mm256_loadu_si256((const __m256i *)best)); /* on-grid lanes read point 0 */
    for (int i = 0; i < 4; i++)
        L[i] = _mm256_blendv_epi8(L[i], iq3_level_of(pt, i), off);
    return off;
}

/* sum w x q and sum w q^2 over the 32 values of each lane, q = 2 L + 1 */
IQG_INLINE void iq3_sums8(const __m256 *w, const __m256 *xt, const __m256i *L, __m256 *sumqx, __m256 *sumq2)
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

/* The trial-scale search of qd_iq3xxs_quantize for the eight sub-blocks in the lanes (xt, wt:
 * element i of each one's |x| (sign-adjusted) and weight; lanes: the same per lane, with
 * sqrt(weight); max its largest value). The scales into scale_out, the levels into L[0..32). */
IQG_INLINE void iq3_search8(const struct qd_iq_grid *g, const struct iq3_lanes *lanes, const __m256 *xt,
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
        iq3_sums8(wt, xt, Laux, &sumqx, &sumq2);
        const __m256 take = _mm256_and_ps(
            _mm256_cmp_ps(sumq2, zero, _CMP_GT_OQ),
            _mm256_cmp_ps(_mm256_mul_ps(sumqx, sumqx), _mm256_mul_ps(best, sumq2), _CMP_GT_OQ));
        if (_mm256_testz_ps(take, take))
            continue;
        const __m256i takei = _mm256_castps_si256(take);
        scale = _mm256_blendv_ps(scale, _mm256_div_ps(sumqx, sumq2), take);
        best = _mm256_blendv_ps(best, _mm256_mul_ps(scale, sumqx), take);
        for (int i = 0; i < 32; i++)
            L[i] = _mm256_blendv_epi8(L[i], Laux[i], takei);
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
        iq3_sums8(wt, xt, L, &sumqx, &sumq2);
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
    uint8_t *qs = blk + 2, *ss = blk + 66;
    float weight[8][32], waux[8][32], xval[8][32], maxs[8];
    uint8_t bsigns[8][4];
    int zero[8];
    for (int i = 0; i < 96; i++)
        qs[i] = 0;
    qd_put_f16(blk, 0.0f);
    float sumx2 = 0.0f;
    for (int i = 0; i < QD_QK_K; i++)
        sumx2 += x[i] * x[i];
    const float sigma2 = 2.0f * sumx2 / (float)QD_QK_K;
    for (int ib = 0; ib < 8; ib++) { /* the scalar code's weights and signs */
        const float *xb = x + 32 * ib;
        for (int i = 0; i < 32; i++)
            weight[ib][i] = qw ? qw[32 * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
        for (int i = 0; i < 32; i++)
            waux[ib][i] = sqrtf(weight[ib][i]);
        for (int k = 0; k < 4; k++) {
            int nflip = 0;
            uint8_t s = 0;
            for (int i = 0; i < 8; i++) {
                const float v = xb[8 * k + i];
                if (v >= 0.0f) {
                    xval[ib][8 * k + i] = v;
                } else {
                    xval[ib][8 * k + i] = -v;
                    nflip++;
                    s |= (uint8_t)(1 << i);
                }
            }
            if (nflip % 2) {
                int imin = 0;
                float min = weight[ib][8 * k] * xb[8 * k] * xb[8 * k];
                for (int i = 1; i < 8; i++) {
                    const float ax = weight[ib][8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                    if (ax < min) {
                        min = ax;
                        imin = i;
                    }
                }
                xval[ib][8 * k + imin] = -xval[ib][8 * k + imin];
                s ^= (uint8_t)(1 << imin);
            }
            bsigns[ib][k] = s & 127;
        }
        float max = xval[ib][0];
        for (int i = 1; i < 32; i++)
            max = max > xval[ib][i] ? max : xval[ib][i];
        zero[ib] = max < 1e-8f; /* GROUP_MAX_EPS_IQ3_XXS */
        maxs[ib] = zero[ib] ? 1.0f : max; /* a zero lane searches at a harmless scale, its result unused */
    }
    __m256 xt[32], wt[32];
    for (int i = 0; i < 32; i++) {
        xt[i] = _mm256_set_ps(xval[7][i], xval[6][i], xval[5][i], xval[4][i], xval[3][i], xval[2][i], xval[1][i],
                              xval[0][i]);
        wt[i] = _mm256_set_ps(weight[7][i], weight[6][i], weight[5][i], weight[4][i], weight[3][i], weight[2][i],
                              weight[1][i], weight[0][i]);
    }
    const struct iq3_lanes lanes = {.scan = scan, .x = (const float(*)[32])xval, .wa = (const float(*)[32])waux};
    __m256 scale_v;
    __m256i Lv[32];
    iq3_search8(g, &lanes, xt, wt, _mm256_loadu_ps(maxs), &scale_v, Lv);
    float scales[8], max_scale = 0.0f;
    int32_t Lt[32][8];
    uint32_t sas[8];
    _mm256_storeu_ps(scales, scale_v);
    for (int i = 0; i < 32; i++)
        _mm256_storeu_si256((__m256i *)Lt[i], Lv[i]);
    for (int ib = 0; ib < 8; ib++) {
        sas[ib] = 0;
        if (zero[ib]) { /* codes, signs and scale stay 0 */
            scales[ib] = 0.0f;
            continue;
        }
        float scale = scales[ib];
        if (scale < 0.0f) { /* ggml's guard: a positive scale, the signs flipped */
            scale = -scale;
            for (int k = 0; k < 4; k++)
                bsigns[ib][k] = (uint8_t)(~bsigns[ib][k] & 127);
        }
        for (int k = 0; k < 8; k++) {
            int8_t L[4];
            for (int i = 0; i < 4; i++)
                L[i] = (int8_t)Lt[4 * k + i][ib];
            qs[8 * ib + k] = (uint8_t)g->map[qd_iq_tuple(g, L)]; /* on the grid by construction */
        }
        sas[ib] = (uint32_t)bsigns[ib][0] | (uint32_t)bsigns[ib][1] << 7 | (uint32_t)bsigns[ib][2] << 14 |
                  (uint32_t)bsigns[ib][3] << 21;
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (max_scale == 0.0f) { /* the scalar code clears the whole block */
        for (int i = 0; i < 96; i++)
            qs[i] = 0;
        return;
    }
    const float d = max_scale / 31.0f;
    qd_put_f16(blk, d * 1.0125f);
    const float id = 1.0f / d;
    for (int ib = 0; ib < 8; ib++) {
        const int l = qd_kq_clampi(qd_kq_round(0.5f * (id * scales[ib] - 1.0f)), 0, 15);
        sas[ib] |= (uint32_t)l << 28;
        for (int b = 0; b < 4; b++)
            ss[4 * ib + b] = (uint8_t)(sas[ib] >> 8 * b);
    }
}

/* The split search of one IQ1_S sub-block (sumx, sumw: the 33 prefix sums over the sorted
 * values): the scalar loop's best i1, i2, shift and scale, in its order. */
IQG_INLINE void iq1s_split_search(const float *sumx, const float *sumw, float *scale_io, int *besti1_out,
                                  int *besti2_out, int *best_shift_out)
{
    const float x_p[3] = {-1.0f + QD_IQ1_DELTA, QD_IQ1_DELTA, 1.0f + QD_IQ1_DELTA};
    const float x_m[3] = {-1.0f - QD_IQ1_DELTA, -QD_IQ1_DELTA, 1.0f - QD_IQ1_DELTA};
    /* candidate c of an i1 is (i2 = i1 + c / 2, m = c % 2): even lanes shift up, odd down */
    const __m256 v0 = _mm256_setr_ps(x_p[0], x_m[0], x_p[0], x_m[0], x_p[0], x_m[0], x_p[0], x_m[0]);
    const __m256 v1 = _mm256_setr_ps(x_p[1], x_m[1], x_p[1], x_m[1], x_p[1], x_m[1], x_p[1], x_m[1]);
    const __m256 v2 = _mm256_setr_ps(x_p[2], x_m[2], x_p[2], x_m[2], x_p[2], x_m[2], x_p[2], x_m[2]);
    const __m256i pair = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 zero = _mm256_setzero_ps(), sx32 = _mm256_set1_ps(sumx[32]), sw32 = _mm256_set1_ps(sumw[32]);
    float best_score = -QD_IQ_FLT_MAX, scale = *scale_io;
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
    *scale_io = scale;
    *besti1_out = besti1;
    *besti2_out = besti2;
    *best_shift_out = best_shift;
}

/* qd_iq1s_quantize(g, x, qw, blk): the scalar code with its split search in lanes */
static inline void qd_iq1s_quantize_avx2(const struct qd_iq_grid *QD_RESTRICT g, const float *QD_RESTRICT x,
                                         const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    const float x_p[3] = {-1.0f + QD_IQ1_DELTA, QD_IQ1_DELTA, 1.0f + QD_IQ1_DELTA};
    const float x_m[3] = {-1.0f - QD_IQ1_DELTA, -QD_IQ1_DELTA, 1.0f - QD_IQ1_DELTA};
    uint8_t *qs = blk + 2, *qhb = blk + 34;
    uint16_t qh[8];
    float scales[8], weight[32], sumx[33], sumw[33];
    int8_t L[32], shifts[8];
    int idx[32];
    uint16_t index[4];
    for (int i = 0; i < 48; i++)
        qs[i] = 0;
    for (int ib = 0; ib < 8; ib++)
        qh[ib] = 0;
    qd_put_f16(blk, 0.0f);
    float sumx2 = 0.0f;
    for (int i = 0; i < QD_QK_K; i++)
        sumx2 += x[i] * x[i];
    const float sigma2 = 2.0f * sumx2 / (float)QD_QK_K;
    float max_scale = 0.0f;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        for (int i = 0; i < 32; i++)
            weight[i] = qw[32 * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]);
        float max = qd_absf(xb[0]);
        for (int i = 1; i < 32; i++)
            max = max > qd_absf(xb[i]) ? max : qd_absf(xb[i]);
        scales[ib] = 0.0f;
        shifts[ib] = 1;
        if (max < 1e-12f) /* GROUP_MAX_EPS_IQ1_S */
            continue;
        qd_iq1_sort(xb, 32, idx);
        sumx[0] = sumw[0] = 0.0f;
        for (int j = 0; j < 32; j++) {
            const int i = idx[j];
            sumx[j + 1] = sumx[j] + weight[i] * xb[i];
            sumw[j + 1] = sumw[j] + weight[i];
        }
        float scale = max;
        int besti1, besti2, best_shift;
        iq1s_split_search(sumx, sumw, &scale, &besti1, &besti2, &best_shift);
        if (besti1 < 0 || besti2 < 0 || best_shift == 0)
            continue;
        for (int j = 0; j < 32; j++)
            L[idx[j]] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0.0f) {
            for (int j = 0; j < 32; j++)
                L[j] = (int8_t)(2 - L[j]);
            scale = -scale;
            best_shift = -best_shift;
        }
        const float *xx = best_shift == 1 ? x_p : x_m;
        const float *xxk[4] = {xx, xx, xx, xx};
        scale = qd_iq1_codes(g, 32, xb, weight, L, scale, xxk, index);
        uint16_t h = 0;
        for (int k = 0; k < 4; k++) {
            qs[4 * ib + k] = (uint8_t)(index[k] & 255);
            h |= (uint16_t)((index[k] >> 8) << 3 * k);
        }
        qh[ib] = h;
        scales[ib] = scale;
        shifts[ib] = (int8_t)best_shift;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (max_scale != 0.0f) {
        const float d = max_scale / 15.0f;
        qd_put_f16(blk, d * 1.125f);
        const float id = 1.0f / d;
        for (int ib = 0; ib < 8; ib++) {
            int l = qd_kq_clampi(qd_kq_round(0.5f * (id * scales[ib] - 1.0f)), 0, 7);
            if (shifts[ib] == -1)
                l |= 8;
            qh[ib] |= (uint16_t)(l << 12);
        }
    }
    for (int ib = 0; ib < 8; ib++) {
        qhb[2 * ib] = (uint8_t)qh[ib];
        qhb[2 * ib + 1] = (uint8_t)(qh[ib] >> 8);
    }
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
