/* The pieces of the IQ3 quantize kernels that run a lane per 4-value group (iq3xxs_lanes.cuh,
 * iq3s.cu): a CTA of IQ3L_LANES lanes per 256-element super-block, 8 lanes per 32-element
 * sub-block (a segment of the warp), each lane holding its group's 4 values, weights and roots.
 * What the CPU folds over a sub-block's values in order runs as a chain over the segment's 8
 * lanes, lane k taking the fold over from lane k - 1 with a shuffle. */
#ifndef QD_CUDA_IQLANES_CUH
#define QD_CUDA_IQLANES_CUH

#include "../imatrix.h"
#include "common.cuh"
#include "iqlist.cuh"
#include "subblock.cuh"

#define IQ3L_LANES 64

/* The segment of lane t (its CTA index): the sub-block's 8 lanes in the warp. */
__device__ __forceinline__ unsigned iq3l_segment(int t) { return 0xffu << (8 * (t % 32 / 8)); }

/* The 4 values at element e into v (e a multiple of 4: 8- or 16-byte aligned); the first
 * non-finite noted. Returns whether all 4 are finite. */
template <int DT> __device__ __forceinline__ bool iq3l_load(const void *x, int64_t e, float *v, unsigned long long *bad)
{
    if (DT == QD_F32) {
        const float4 q = __ldg((const float4 *)((const float *)x + e));
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        const uint2 q = __ldg((const uint2 *)((const uint16_t *)x + e));
        const uint16_t h[4] = {(uint16_t)q.x, (uint16_t)(q.x >> 16), (uint16_t)q.y, (uint16_t)(q.y >> 16)};
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = DT == QD_F16 ? qd_f16_to_f32(h[i]) : qd_bf16_to_f32(h[i]);
    }
    const bool finite = qd_isfinite(v[0]) && qd_isfinite(v[1]) && qd_isfinite(v[2]) && qd_isfinite(v[3]);
    if (!finite)
        qd_note_first_nonfinite<4>(bad, v, e);
    return finite;
}

/* The index of a 4-tuple of 3-bit levels (iq3_xxs's qd_iq_tuple over its grid, kernels/iqgrid.c,
 * and qd_iq3s_tuple), with constant shifts: the generic loop over g.dim put the levels on the
 * stack. */
__device__ __forceinline__ int iq3l_tuple(const int8_t *L) { return L[0] | L[1] << 3 | L[2] << 6 | L[3] << 9; }

/* qd_kq_odd_sums over the sub-block's 32 values: lane k adds its 4 terms to lanes 0..k-1's sums
 * (the CPU's order); every lane of the segment gets the totals. */
__device__ __forceinline__ void iq3l_odd_sums(unsigned seg, int k, const float *w, const float *xv, const int8_t *L,
                                              float *sumqx, float *sumq2)
{
    float tx[4], t2[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float q = (float)(2 * L[i] + 1);
        tx[i] = w[i] * xv[i] * q;
        t2[i] = w[i] * q * q;
    }
    float sx = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int step = 0; step < 8; step++) {
        if (k == step) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                sx += tx[i];
                s2 += t2[i];
            }
        }
        sx = __shfl_sync(seg, sx, step, 8);
        s2 = __shfl_sync(seg, s2, step, 8);
    }
    *sumqx = sx;
    *sumq2 = s2;
}

/* The largest of the sub-block's 32 values v (lane k holding 4 of them), folded in the CPU's
 * order: m = m > v ? m : v from the first value on. */
__device__ __forceinline__ float iq3l_max(unsigned seg, int k, const float *v)
{
    float m = 0.0f;
#pragma unroll
    for (int step = 0; step < 8; step++) {
        if (k == step) {
#pragma unroll
            for (int i = 0; i < 4; i++)
                m = step == 0 && i == 0 ? v[0] : (m > v[i] ? m : v[i]);
        }
        m = __shfl_sync(seg, m, step, 8);
    }
    return m;
}

/* The super-block's sigma2 (qd_imx_block_sigma2 over its 256 values in order, by lane 0) into
 * *sigma2, where the call has an importance (without one the weights do not use it): each lane
 * puts its 4 values xb into row first. Every lane of the CTA calls it; the caller synchronizes
 * before reading *sigma2. */
__device__ __forceinline__ void iq3l_sigma2(const float *imp, float *row, const float *xb, int t, float *sigma2)
{
    if (!imp)
        return;
#pragma unroll
    for (int i = 0; i < 4; i++)
        row[4 * t + i] = xb[i];
    __syncthreads();
    if (t == 0)
        *sigma2 = qd_imx_block_sigma2(row, 2.0f);
}

/* The lane's weights w (importance qw at sigma2, or x^2 where qw is NULL) and their roots wa. */
__device__ __forceinline__ void iq3l_weights(const float *qw, float sigma2, const float *xb, float *w, float *wa)
{
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = qw ? qw[i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
#pragma unroll
    for (int i = 0; i < 4; i++)
        wa[i] = sqrtf(w[i]);
}

/* qd_kq_take_trial for the lane's group: where the trial's fit (sumqx, sumq2) beats *best, its
 * scale, the group's levels La and its on-grid flag become the chosen ones. */
__device__ __forceinline__ void iq3l_take_trial(float sumqx, float sumq2, float *scale, float *best, const int8_t *La,
                                                int on, int8_t *L, int *on_grid)
{
    if (sumq2 > 0.0f && sumqx * sumqx > *best * sumq2) {
        *scale = sumqx / sumq2;
        *best = *scale * sumqx;
#pragma unroll
        for (int i = 0; i < 4; i++)
            L[i] = La[i];
        *on_grid = on;
    }
}

/* A neighbour search's distances from terms: w (s v - x)^2 for each of the lane's 4 values and
 * each of the 8 level values v = 2 l + 1 (ggml's operations), made once a search into the lane's
 * column col of a CTA table (IQ3L_TERMS floats, a row per level and value, a column per lane:
 * the lanes' loads fall in distinct banks); a candidate's distance adds its 4 terms in ggml's
 * order. Its levels come from its code (the tables' codes beside each list: the point's tuple,
 * 3 bits a level), so a candidate costs one 16-bit load and four shared ones. */
#define IQ3L_TERMS (32 * IQ3L_LANES)

/* The position in its list (codes: the count, then the candidates' codes) of the candidate
 * nearest the lane's group (|x| xv, weights' roots wa) at scale, the first of equals; the first
 * where no distance counts (below FLT_MAX), as the CPU. */
__device__ __forceinline__ int iq3l_search(const uint16_t *codes, float *col, const float *xv, const float *wa,
                                           float scale)
{
#pragma unroll
    for (int l = 0; l < 8; l++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float diff = scale * (float)(2 * l + 1) - xv[i];
            col[(4 * l + i) * IQ3L_LANES] = wa[i] * diff * diff;
        }
    const int n = __ldg(codes);
    float best_d2 = 3.40282347e38f;
    int best = -1;
    for (int j = 1; j <= n; j += 4) { /* four codes a load (kernels/iqlist.h) */
        unsigned c[4];
        qd_iq_code4(codes + j, c);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float d2 = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++)
                d2 += col[(4 * (int)(c[q] >> 3 * i & 7u) + i) * IQ3L_LANES];
            if (j + q <= n && d2 < best_d2) {
                best_d2 = d2;
                best = j + q;
            }
        }
    }
    return best < 0 ? 1 : best;
}

/* The 4 levels of code c into L. */
__device__ __forceinline__ void iq3l_code_levels(unsigned c, int8_t *L)
{
#pragma unroll
    for (int i = 0; i < 4; i++)
        L[i] = (int8_t)(c >> 3 * i & 7u);
}

#endif
