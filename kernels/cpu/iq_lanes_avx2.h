/* What the AVX2 grid searches (kernels/cpu/iq2_avx2.h for IQ2_XXS, kernels/cpu/iqgrid_avx2.h for
 * IQ3_XXS) share: the eight 32-element sub-blocks of a super-block side by side in the eight
 * lanes, each lane doing the scalar code's float operations in the scalar order (no FMA). */
#ifndef QD_CPU_IQ_LANES_AVX2_H
#define QD_CPU_IQ_LANES_AVX2_H

#include "iqscan.h"

#ifdef __AVX2__
#include <immintrin.h>

#define IQ_LANES_INLINE static inline __attribute__((always_inline))

/* qd_kq_round in eight lanes: the same 1.5 * 2^23 trick, so the same ints for every input */
IQ_LANES_INLINE __m256i qd_iq_round8(__m256 v)
{
    const __m256i i = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0f)));
    return _mm256_sub_epi32(_mm256_and_si256(i, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
}

/* What the lanes' groups read: element i of sub-block (lane) l's |x| and sqrt(weight) at
 * x[l][i], wa[l][i], for the neighbour scans, which run one lane at a time. */
struct qd_iq_lanes {
    const struct qd_iq_scan *scan;
    const float (*x)[32], (*wa)[32];
};

/* The levels of xt[0..n) at inverse scale id in the lanes: round((id x - 1) / 2) in [0, top],
 * the scalar's operations (qd_iq3xxs_level, qd_iq2_group) */
IQ_LANES_INLINE void qd_iq_levels8(const __m256 *xt, int n, __m256 id, int top, __m256i *L)
{
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    for (int i = 0; i < n; i++) {
        const __m256 v = _mm256_mul_ps(half, _mm256_sub_ps(_mm256_mul_ps(id, xt[i]), one));
        L[i] = _mm256_min_epi32(_mm256_max_epi32(qd_iq_round8(v), _mm256_setzero_si256()), _mm256_set1_epi32(top));
    }
}

/* x[i] in the low half, x[i + 1] in the high half: the two coordinates of a shared table */
IQ_LANES_INLINE __m256 qd_iq_pair(const float *x, int i)
{
    return _mm256_blend_ps(_mm256_set1_ps(x[i]), _mm256_set1_ps(x[i + 1]), 0xf0); /* two broadcast loads, no shuffle */
}

/* The neighbour that qd_iq_scan_pick chooses for each lane in off (tuple u, the lane's scale),
 * 0 in the others. Group k of a lane is its elements dim k .. dim k + dim; values holds the 8
 * slot values of a coordinate (dim 4: one coordinate a table; dim 8: two, in the halves). The
 * slot terms w (s v - x)^2 are the scalar's operations. */
IQ_LANES_INLINE __m256i qd_iq_scan_lanes8(const struct qd_iq_lanes *lanes, int k, int dim, __m256i u, __m256 scale,
                                          __m256i off, __m256 values)
{
    int32_t us[8], best[8] = {0};
    float scales[8];
    const int pairs = dim == 8;
    _mm256_storeu_si256((__m256i *)us, u);
    _mm256_storeu_ps(scales, scale);
    for (unsigned lanes_off = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(off)); lanes_off;
         lanes_off &= lanes_off - 1) {
        const int l = __builtin_ctz(lanes_off);
        const float *x = lanes->x[l] + dim * k, *wa = lanes->wa[l] + dim * k;
        const __m256 sv = _mm256_mul_ps(_mm256_set1_ps(scales[l]), values);
        __m256 table[4];
        for (int r = 0; r < 4; r++) { /* the scalar's diff = scale v - x; w diff diff */
            const __m256 diff = _mm256_sub_ps(sv, pairs ? qd_iq_pair(x, 2 * r) : _mm256_set1_ps(x[r]));
            table[r] = _mm256_mul_ps(_mm256_mul_ps(pairs ? qd_iq_pair(wa, 2 * r) : _mm256_set1_ps(wa[r]), diff), diff);
        }
        best[l] = qd_iq_scan_pick(lanes->scan, us[l], table, dim, pairs);
    }
    return _mm256_loadu_si256((const __m256i *)best);
}

/* Element i of the eight sub-blocks v[0..8) into the lanes of out[i] (sub-block l in lane l) */
IQ_LANES_INLINE void qd_iq_columns8(const float (*v)[32], __m256 *out)
{
    for (int i = 0; i < 32; i++)
        out[i] = _mm256_set_ps(v[7][i], v[6][i], v[5][i], v[4][i], v[3][i], v[2][i], v[1][i], v[0][i]);
}

/* Eight sub-blocks into the lanes: element i of each one's |x| and weight into xt[i], wt[i];
 * returns the per-lane view (|x| and sqrt(weight) waux) the neighbour scans read. */
IQ_LANES_INLINE struct qd_iq_lanes qd_iq_lanes_load(const struct qd_iq_scan *scan, float (*xval)[32],
                                                    float (*weight)[32], float (*waux)[32], __m256 *xt, __m256 *wt)
{
    qd_iq_columns8((const float(*)[32])xval, xt);
    qd_iq_columns8((const float(*)[32])weight, wt);
    const struct qd_iq_lanes lanes = {.scan = scan, .x = (const float(*)[32])xval, .wa = (const float(*)[32])waux};
    return lanes;
}

/* sum w x q and sum w q^2 over the 32 values of each lane, q = 2 L + 1 (qd_kq_odd_sums) */
IQ_LANES_INLINE void qd_iq_sums8(const __m256 *w, const __m256 *xt, const __m256i *L, __m256 *sumqx, __m256 *sumq2)
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

/* One trial scale's step of the scalar search in the lanes: where sumq2 > 0 and sumqx^2 >
 * best sumq2, scale becomes sumqx / sumq2, best scale sumqx and L[0..32) the trial's Laux.
 * Returns the lanes that took the trial. */
IQ_LANES_INLINE __m256i qd_iq_take8(__m256 sumqx, __m256 sumq2, __m256 *scale, __m256 *best, __m256i *L,
                                    const __m256i *Laux)
{
    const __m256 take = _mm256_and_ps(
        _mm256_cmp_ps(sumq2, _mm256_setzero_ps(), _CMP_GT_OQ),
        _mm256_cmp_ps(_mm256_mul_ps(sumqx, sumqx), _mm256_mul_ps(*best, sumq2), _CMP_GT_OQ));
    const __m256i takei = _mm256_castps_si256(take);
    if (_mm256_testz_ps(take, take))
        return takei;
    *scale = _mm256_blendv_ps(*scale, _mm256_div_ps(sumqx, sumq2), take);
    *best = _mm256_blendv_ps(*best, _mm256_mul_ps(*scale, sumqx), take);
    for (int i = 0; i < 32; i++)
        L[i] = _mm256_blendv_epi8(L[i], Laux[i], takei);
    return takei;
}

/* The lanes' scales and levels back out: scales[l] and Lt[i][l] of sub-block l */
IQ_LANES_INLINE void qd_iq_unpack8(__m256 scale, const __m256i *L, float *scales, int32_t (*Lt)[8])
{
    _mm256_storeu_ps(scales, scale);
    for (int i = 0; i < 32; i++)
        _mm256_storeu_si256((__m256i *)Lt[i], L[i]);
}

#endif

#endif
