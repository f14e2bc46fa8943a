/* AVX2 form of the q4_K / q5_K sub-block search (kernels/kquants.h qd_kq_make_qkx2 with the
 * rms(x) + |x| weights): the eight sub-blocks of a super-block run in the eight lanes, each
 * lane doing exactly the scalar code's operations in the scalar code's order (sums over the
 * elements stay sequential within a lane, branches become per-lane selects), so the scales,
 * minimums and codes are the same bits. */
#ifndef QD_CPU_KQUANT_AVX2_H
#define QD_CPU_KQUANT_AVX2_H

#include "../kquants.h"

#ifdef __AVX2__
#include <immintrin.h>

#define QD_KQUANT_AVX2 1

/* qd_kq_round, eight lanes */
static inline __attribute__((always_inline)) __m256i kq_round8(__m256 v)
{
    __m256i i = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0f)));
    return _mm256_sub_epi32(_mm256_and_si256(i, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
}

static inline __attribute__((always_inline)) __m256i kq_clamp8(__m256i v, int hi)
{
    return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_setzero_si256()), _mm256_set1_epi32(hi));
}

/* qd_kq_make_qkx2 in eight lanes: lane j fits the n values xt[0..n)[j] with weights w[..][j];
 * scales, mins (the_min) and codes per lane. x - min is kept per element until a lane takes a
 * new minimum (the same difference, computed once), and the codes stay floats until the end
 * (small integers: exact), so each trial costs fewer operations than it would afresh. */
static inline __attribute__((always_inline)) void kq_make_qkx2_8(const __m256 *xt, const __m256 *w, int n, int nmax,
                                                                 float rmin, float rdelta, int nstep, int use_mad,
                                                                 float *scales, float *mins, __m256i *Lv)
{
    const __m256 zero = _mm256_setzero_ps(), absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 min = xt[0], max = xt[0], sum_w = w[0], sum_x = _mm256_mul_ps(w[0], xt[0]);
    for (int i = 1; i < n; i++) {
        min = _mm256_min_ps(xt[i], min); /* x < min ? x : min */
        max = _mm256_max_ps(xt[i], max); /* x > max ? x : max */
        sum_w = _mm256_add_ps(sum_w, w[i]);
        sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(w[i], xt[i]));
    }
    min = _mm256_blendv_ps(min, zero, _mm256_cmp_ps(min, zero, _CMP_GT_OQ));
    const __m256 flat = _mm256_cmp_ps(max, min, _CMP_EQ_OQ); /* max == min: codes 0, scale 0 */
    __m256 iscale = _mm256_div_ps(_mm256_set1_ps((float)nmax), _mm256_sub_ps(max, min));
    __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.0f), iscale);
    __m256 La[32], Lf[32], xm[32]; /* xm[i] = x - min for the current min */
    __m256 best = zero;
    for (int i = 0; i < n; i++) {
        xm[i] = _mm256_sub_ps(xt[i], min);
        Lf[i] = _mm256_cvtepi32_ps(kq_clamp8(kq_round8(_mm256_mul_ps(iscale, xm[i])), nmax));
        __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, Lf[i]), min), xt[i]);
        diff = use_mad ? _mm256_and_ps(diff, absmask) : _mm256_mul_ps(diff, diff);
        best = _mm256_add_ps(best, _mm256_mul_ps(w[i], diff));
    }
    for (int is = 0; is <= nstep; is++) {
        /* min is the best one so far (the scalar code moves it as it goes) */
        iscale = _mm256_div_ps(_mm256_set1_ps(rmin + rdelta * (float)is + (float)nmax), _mm256_sub_ps(max, min));
        __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
        for (int i = 0; i < n; i++) {
            __m256 l = _mm256_cvtepi32_ps(kq_clamp8(kq_round8(_mm256_mul_ps(iscale, xm[i])), nmax));
            __m256 wl = _mm256_mul_ps(w[i], l);
            La[i] = l;
            sum_l = _mm256_add_ps(sum_l, wl);
            sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, l));
            sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, xt[i]));
        }
        __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
        __m256 ok = _mm256_cmp_ps(D, zero, _CMP_GT_OQ);
        if (!_mm256_movemask_ps(ok))
            continue;
        __m256 this_scale = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), D);
        __m256 this_min = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), D);
        __m256 pos = _mm256_cmp_ps(this_min, zero, _CMP_GT_OQ);
        this_min = _mm256_blendv_ps(this_min, zero, pos);
        this_scale = _mm256_blendv_ps(this_scale, _mm256_div_ps(sum_xl, sum_l2), pos);
        __m256 cur = zero;
        for (int i = 0; i < n; i++) {
            __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(this_scale, La[i]), this_min), xt[i]);
            diff = use_mad ? _mm256_and_ps(diff, absmask) : _mm256_mul_ps(diff, diff);
            cur = _mm256_add_ps(cur, _mm256_mul_ps(w[i], diff));
        }
        __m256 take = _mm256_and_ps(ok, _mm256_cmp_ps(cur, best, _CMP_LT_OQ));
        if (!_mm256_movemask_ps(take))
            continue;
        best = _mm256_blendv_ps(best, cur, take);
        scale = _mm256_blendv_ps(scale, this_scale, take);
        min = _mm256_blendv_ps(min, this_min, take);
        for (int i = 0; i < n; i++) {
            Lf[i] = _mm256_blendv_ps(Lf[i], La[i], take);
            xm[i] = _mm256_sub_ps(xt[i], min);
        }
    }
    __m256i flati = _mm256_castps_si256(flat);
    for (int i = 0; i < n; i++)
        Lv[i] = _mm256_andnot_si256(flati, _mm256_cvttps_epi32(Lf[i]));
    _mm256_storeu_ps(scales, _mm256_blendv_ps(scale, zero, flat));
    /* -min, as C's negation: the sign bit flipped (0 - min would make -0.0 of +0.0 wrongly) */
    _mm256_storeu_ps(mins, _mm256_xor_ps(min, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u))));
}

/* Lane j of the n vectors to bytes L[stride * j + i]. */
static inline void kq_store_codes(const __m256i *Lv, int n, int stride, uint8_t *L)
{
    int32_t lanes[8];
    for (int i = 0; i < n; i++) {
        _mm256_storeu_si256((__m256i *)lanes, Lv[i]);
        for (int j = 0; j < 8; j++)
            L[stride * j + i] = (uint8_t)lanes[j];
    }
}

/* Eight sub-blocks of 32 (a super-block): scales[j], mins[j] (the_min) and codes L[32 * j + i]
 * as qd_kq_search_q45 gives them (nmax 15 or 31, rmin, nstep). */
static inline void qd_kq_search_q45_avx2(const float *x, int nmax, float rmin, int nstep, float *scales,
                                         float *mins, uint8_t *L)
{
    __m256 xt[32], w[32];
    __m256i Lv[32];
    for (int i = 0; i < 32; i++) /* lane j holds element i of sub-block j */
        xt[i] = _mm256_set_ps(x[224 + i], x[192 + i], x[160 + i], x[128 + i], x[96 + i], x[64 + i], x[32 + i], x[i]);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 sum_x2 = _mm256_setzero_ps();
    for (int i = 0; i < 32; i++)
        sum_x2 = _mm256_add_ps(sum_x2, _mm256_mul_ps(xt[i], xt[i]));
    __m256 av_x = _mm256_sqrt_ps(_mm256_div_ps(sum_x2, _mm256_set1_ps(32.0f)));
    for (int i = 0; i < 32; i++)
        w[i] = _mm256_add_ps(av_x, _mm256_and_ps(xt[i], absmask));
    kq_make_qkx2_8(xt, w, 32, nmax, rmin, 0.1f, nstep, 0, scales, mins, Lv);
    kq_store_codes(Lv, 32, 32, L);
}

/* Eight sub-blocks of 16 (x holds sub-block j at x + 16 * j): q2_K's search (|x| weights, the
 * absolute error): scales[j], mins[j] and codes L[16 * j + i]. */
static inline void qd_kq_search_q2_avx2(const float *x, float *scales, float *mins, uint8_t *L)
{
    __m256 xt[16], w[16];
    __m256i Lv[16];
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int i = 0; i < 16; i++) {
        xt[i] = _mm256_set_ps(x[112 + i], x[96 + i], x[80 + i], x[64 + i], x[48 + i], x[32 + i], x[16 + i], x[i]);
        w[i] = _mm256_and_ps(xt[i], absmask);
    }
    kq_make_qkx2_8(xt, w, 16, 3, -0.5f, 0.1f, 15, 1, scales, mins, Lv);
    kq_store_codes(Lv, 16, 16, L);
}

/* qd_kq_make_qx in eight lanes: lane j fits the 16 values xt[0..16)[j] with weights w[..][j]
 * (x^2 for the unweighted search, the importance for q6_K's weighted one); scales[j] and codes
 * L[16 * j + i] (code + nmax). */
static inline __attribute__((always_inline)) void kq_make_qx_8(const __m256 *xt, const __m256 *w, int nmax,
                                                               float *scales, int8_t *L)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), zero = _mm256_setzero_ps();
    __m256 max = zero, amax = zero;
    for (int i = 0; i < 16; i++) { /* the first value of largest magnitude (strict >) */
        __m256 ax = _mm256_and_ps(xt[i], absmask), more = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);
        amax = _mm256_blendv_ps(amax, ax, more);
        max = _mm256_blendv_ps(max, xt[i], more);
    }
    const __m256 zeroed = _mm256_cmp_ps(amax, _mm256_set1_ps(QD_KQ_EPS), _CMP_LT_OQ);
    const __m256i lo = _mm256_set1_epi32(-nmax), hi = _mm256_set1_epi32(nmax - 1), off = _mm256_set1_epi32(nmax);
    __m256i Lv[16];
    __m256 wx[16]; /* w * x, the same product in every trial */
    __m256 iscale = _mm256_div_ps(_mm256_set1_ps((float)-nmax), max);
    __m256 sumlx = zero, suml2 = zero;
    for (int i = 0; i < 16; i++) {
        __m256i l = _mm256_min_epi32(_mm256_max_epi32(kq_round8(_mm256_mul_ps(iscale, xt[i])), lo), hi);
        Lv[i] = _mm256_add_epi32(l, off);
        __m256 fl = _mm256_cvtepi32_ps(l);
        wx[i] = _mm256_mul_ps(w[i], xt[i]);
        sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(wx[i], fl));
        suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], fl), fl));
    }
    __m256 scale = _mm256_blendv_ps(_mm256_div_ps(sumlx, suml2), zero, _mm256_cmp_ps(suml2, zero, _CMP_EQ_OQ));
    __m256 best = _mm256_mul_ps(scale, sumlx);
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = _mm256_div_ps(_mm256_set1_ps(-((float)nmax + 0.1f * (float)is)), max);
        __m256i La[16];
        sumlx = suml2 = zero;
        for (int i = 0; i < 16; i++) {
            __m256i l = _mm256_min_epi32(_mm256_max_epi32(kq_round8(_mm256_mul_ps(iscale, xt[i])), lo), hi);
            La[i] = l;
            __m256 fl = _mm256_cvtepi32_ps(l);
            sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(wx[i], fl));
            suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], fl), fl));
        }
        __m256 take = _mm256_and_ps(_mm256_cmp_ps(suml2, zero, _CMP_GT_OQ),
                                    _mm256_cmp_ps(_mm256_mul_ps(sumlx, sumlx), _mm256_mul_ps(best, suml2), _CMP_GT_OQ));
        if (!_mm256_movemask_ps(take))
            continue;
        __m256i takei = _mm256_castps_si256(take);
        for (int i = 0; i < 16; i++)
            Lv[i] = _mm256_blendv_epi8(Lv[i], _mm256_add_epi32(La[i], off), takei);
        __m256 ns = _mm256_div_ps(sumlx, suml2);
        scale = _mm256_blendv_ps(scale, ns, take);
        best = _mm256_blendv_ps(best, _mm256_mul_ps(ns, sumlx), take);
    }
    scale = _mm256_blendv_ps(scale, zero, zeroed);
    _mm256_storeu_ps(scales, scale);
    __m256i zi = _mm256_castps_si256(zeroed);
    int32_t lanes[8];
    for (int i = 0; i < 16; i++) {
        _mm256_storeu_si256((__m256i *)lanes, _mm256_andnot_si256(zi, Lv[i]));
        for (int j = 0; j < 8; j++)
            L[16 * j + i] = (int8_t)lanes[j];
    }
}

/* Eight sub-blocks of 16 (x holds sub-block j at x + 16 * j): scales[j] and codes
 * L[16 * j + i] as qd_kq_make_qx(16, 32, ...) gives them (q6_K's search). */
static inline void qd_kq_search_q6_avx2(const float *x, float *scales, int8_t *L)
{
    __m256 xt[16], w[16];
    for (int i = 0; i < 16; i++) {
        xt[i] = _mm256_set_ps(x[112 + i], x[96 + i], x[80 + i], x[64 + i], x[48 + i], x[32 + i], x[16 + i], x[i]);
        w[i] = _mm256_mul_ps(xt[i], xt[i]);
    }
    kq_make_qx_8(xt, w, 32, scales, L);
}

/* Eight sub-blocks of 16 (x holds sub-block j at x + 16 * j): q3_K's search (qd_kq_make_q3,
 * nmax 4): scales[j] and codes L[16 * j + i] (code + 4). A lane whose pass changed nothing would
 * change nothing in the next pass either (the same state, the same tests), so the passes run
 * until no lane changes, at most five, with no lane masked. */
static inline void qd_kq_search_q3_avx2(const float *x, float *scales, int8_t *L)
{
    __m256 xt[16], w[16];
    __m256i Lv[16];
    for (int i = 0; i < 16; i++) {
        xt[i] = _mm256_set_ps(x[112 + i], x[96 + i], x[80 + i], x[64 + i], x[48 + i], x[32 + i], x[16 + i], x[i]);
        w[i] = _mm256_mul_ps(xt[i], xt[i]);
    }
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), zero = _mm256_setzero_ps();
    __m256 max = zero, amax = zero;
    for (int i = 0; i < 16; i++) {
        __m256 ax = _mm256_and_ps(xt[i], absmask), more = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);
        amax = _mm256_blendv_ps(amax, ax, more);
        max = _mm256_blendv_ps(max, xt[i], more);
    }
    const __m256 zeroed = _mm256_cmp_ps(amax, _mm256_set1_ps(QD_KQ_EPS), _CMP_LT_OQ);
    const __m256i lo = _mm256_set1_epi32(-4), hi = _mm256_set1_epi32(3);
    __m256 iscale = _mm256_div_ps(_mm256_set1_ps(-4.0f), max);
    __m256 sumlx = zero, suml2 = zero;
    for (int i = 0; i < 16; i++) {
        Lv[i] = _mm256_min_epi32(_mm256_max_epi32(kq_round8(_mm256_mul_ps(iscale, xt[i])), lo), hi);
        __m256 fl = _mm256_cvtepi32_ps(Lv[i]);
        sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(_mm256_mul_ps(w[i], xt[i]), fl));
        suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], fl), fl));
    }
    for (int itry = 0; itry < 5; itry++) {
        __m256 changed = zero;
        for (int i = 0; i < 16; i++) {
            __m256 fl = _mm256_cvtepi32_ps(Lv[i]), wx = _mm256_mul_ps(w[i], xt[i]);
            __m256 slx = _mm256_sub_ps(sumlx, _mm256_mul_ps(wx, fl));
            __m256 pos = _mm256_cmp_ps(slx, zero, _CMP_GT_OQ); /* (no early exit: it mispredicts) */
            __m256 sl2 = _mm256_sub_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], fl), fl));
            __m256i nl = _mm256_min_epi32(
                _mm256_max_epi32(kq_round8(_mm256_div_ps(_mm256_mul_ps(xt[i], sl2), slx)), lo), hi);
            __m256 differs = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(nl, Lv[i])), pos);
            __m256 fn = _mm256_cvtepi32_ps(nl);
            slx = _mm256_add_ps(slx, _mm256_mul_ps(wx, fn));
            sl2 = _mm256_add_ps(sl2, _mm256_mul_ps(_mm256_mul_ps(w[i], fn), fn));
            __m256 better = _mm256_cmp_ps(_mm256_mul_ps(_mm256_mul_ps(slx, slx), suml2),
                                          _mm256_mul_ps(_mm256_mul_ps(sumlx, sumlx), sl2), _CMP_GT_OQ);
            __m256 take = _mm256_and_ps(_mm256_and_ps(differs, _mm256_cmp_ps(sl2, zero, _CMP_GT_OQ)), better);
            Lv[i] = _mm256_blendv_epi8(Lv[i], nl, _mm256_castps_si256(take));
            sumlx = _mm256_blendv_ps(sumlx, slx, take);
            suml2 = _mm256_blendv_ps(suml2, sl2, take);
            changed = _mm256_or_ps(changed, take);
        }
        if (!_mm256_movemask_ps(_mm256_andnot_ps(zeroed, changed)))
            break;
    }
    __m256 scale = _mm256_blendv_ps(zero, _mm256_div_ps(sumlx, suml2), _mm256_cmp_ps(suml2, zero, _CMP_GT_OQ));
    _mm256_storeu_ps(scales, _mm256_blendv_ps(scale, zero, zeroed));
    __m256i zi = _mm256_castps_si256(zeroed), four = _mm256_set1_epi32(4);
    int32_t lanes[8];
    for (int i = 0; i < 16; i++) {
        _mm256_storeu_si256((__m256i *)lanes, _mm256_andnot_si256(zi, _mm256_add_epi32(Lv[i], four)));
        for (int j = 0; j < 8; j++)
            L[16 * j + i] = (int8_t)lanes[j];
    }
}

#else
#define QD_KQUANT_AVX2 0
static inline void qd_kq_search_q3_avx2(const float *x, float *scales, int8_t *L)
{
    (void)x, (void)scales, (void)L;
}
static inline void qd_kq_search_q2_avx2(const float *x, float *scales, float *mins, uint8_t *L)
{
    (void)x, (void)scales, (void)mins, (void)L;
}
static inline void qd_kq_search_q6_avx2(const float *x, float *scales, int8_t *L)
{
    (void)x, (void)scales, (void)L;
}
static inline void qd_kq_search_q45_avx2(const float *x, int nmax, float rmin, int nstep, float *scales,
                                         float *mins, uint8_t *L)
{
    (void)x, (void)nmax, (void)rmin, (void)nstep, (void)scales, (void)mins, (void)L;
}
#endif

#endif
