/* ggml's iq3_xxs quantize on the GPU with a lane per 4-value group: a CTA of 64 lanes per
 * 256-element super-block, 8 lanes per 32-element sub-block, each lane holding its group's 4
 * values, weights and their roots.
 *
 * Why: with a lane per sub-block (what iq1_s still runs, iqgrid.cu) a lane held the sub-block's
 * 96 floats and levels (158 registers and a 384-byte stack: 18 % occupancy) and searched its 8
 * groups' neighbour lists one after another at each of the 31 trial scales. Here a lane searches
 * one list per trial scale, so a warp still waits for its longest list at each scale (192 list
 * entries per sub-block against 193 before, counted on N(0, 0.02) rows) but holds a tenth of
 * the state, and many more warps hide the lookups' latency.
 *
 * The CPU's operations in the CPU's order (kernels/iq3xxs.h, built without FMA contraction):
 * what the CPU folds over a sub-block's values in order (the sign flip's least weighted value,
 * the largest |x|, the weighted sums of every trial) runs as a chain over the 8 lanes, lane k
 * taking the fold over from lane k - 1 with a shuffle; a group's own work (its levels, its
 * neighbour search, its grid index) is the CPU's per-group code, the search's distances summed
 * from terms the lane makes once with the CPU's operations (iqlanes.cuh: iq3l_search). */
#ifndef QD_CUDA_IQ3XXS_LANES_CUH
#define QD_CUDA_IQ3XXS_LANES_CUH

#include "../iq3xxs.h"
#include "iqlanes.cuh"

/* qd_iq3xxs_best_neighbour for the lane's group (iq3l_search over its column col of the CTA's
 * terms): the winner's levels into L, its grid index. */
__device__ __forceinline__ int iq3l_best_neighbour(const struct qd_iq_grid &g, int u, float *col, const float *xv,
                                                   const float *wa, float scale, int8_t *L)
{
    const int at = -g.map[u] - 1;
    const int j = iq3l_search(g.codes + at, col, xv, wa, scale);
    iq3l_code_levels(__ldg(g.codes + at + j), L);
    return __ldg(g.neighbours + at + j);
}

/* qd_iq3xxs_signs for the lane's 4 values (k even: the first half of an 8, k odd: the second):
 * |x| into xv, the 8's seven stored sign bits returned (both lanes of the pair hold them), the
 * sub-block's largest xv into *max. */
__device__ __forceinline__ uint8_t iq3l_signs(unsigned seg, int k, const float *xb, const float *w, float *xv, float *max)
{
    const int half = k & 1;
    int nflip = 0;
    uint32_t s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (xb[i] >= 0.0f) {
            xv[i] = xb[i];
        } else {
            xv[i] = -xb[i];
            nflip++;
            s |= 1u << (i + 4 * half);
        }
    }
    nflip += __shfl_xor_sync(seg, nflip, 1, 8);
    s |= __shfl_xor_sync(seg, s, 1, 8);
    /* the least weighted x^2 of the 8, first of equals: the CPU's scan, the first half's lane
       then the second's (run by every pair, used where the count of negatives is odd) */
    float mn = 0.0f;
    int imin = 0;
#pragma unroll
    for (int part = 0; part < 2; part++) {
        if (half == part) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float ax = w[i] * xb[i] * xb[i];
                if (part == 0 && i == 0) {
                    mn = ax;
                } else if (ax < mn) {
                    mn = ax;
                    imin = i + 4 * part;
                }
            }
        }
        mn = __shfl_sync(seg, mn, (k & ~1) + part, 8);
        imin = __shfl_sync(seg, imin, (k & ~1) + part, 8);
    }
    if (nflip % 2) { /* an odd count: that value takes the other sign */
#pragma unroll
        for (int i = 0; i < 4; i++) /* (a constant index: xv stays in registers) */
            if (imin == i + 4 * half)
                xv[i] = -xv[i];
        s ^= 1u << imin;
    }
    *max = iq3l_max(seg, k, xv);
    return (uint8_t)(s & 127);
}

/* quantize_row_iq3_xxs_impl (grid size 256), a super-block per CTA of IQ3L_LANES lanes. */
template <int DT>
__global__ void __launch_bounds__(IQ3L_LANES) iq3xxs_lanes_kernel(const void *x, int64_t cols, const float *imp,
                                                                  int64_t mrows, struct qd_iq_grid g, uint8_t *out,
                                                                  unsigned long long *bad)
{
    __shared__ float row[QD_QK_K]; /* with an importance: the super-block, for sigma2 */
    __shared__ uint32_t sblk[(QD_IQ3XXS_BYTES + 3) / 4];
    __shared__ float sscale[8], ssigma2;
    __shared__ uint32_t sword[8];
    __shared__ int8_t szero[8];
    __shared__ float sterm[IQ3L_TERMS];
    const int t = threadIdx.x, ib = t / 8, k = t % 8;
    float *col = sterm + t;
    const unsigned seg = iq3l_segment(t);
    const int64_t b = blockIdx.x, e0 = b * QD_QK_K;
    float xb[4];
    iq3l_load<DT>(x, e0 + 4 * t, xb, bad);
    uint8_t *blk = (uint8_t *)sblk;
    if (t < (QD_IQ3XXS_BYTES + 3) / 4) /* qd_iq3xxs_begin: codes, scales and d (f16 0) cleared */
        sblk[t] = 0;
    iq3l_sigma2(imp, row, xb, t, &ssigma2);
    __syncthreads();
    const float *qw = qd_sub_importance<IQ3L_LANES>(imp, mrows, cols, e0, t); /* its 4 values' */
    float w[4], wa[4], xv[4];
    iq3l_weights(qw, ssigma2, xb, w, wa);
    float max;
    uint8_t bsign = iq3l_signs(seg, k, xb, w, xv, &max);
    const int zero = max < 1e-8f; /* the whole sub-block alike */
    float scale = 0.0f;
    if (!zero) { /* qd_iq3xxs_sub_search */
        int8_t L[4] = {0, 0, 0, 0}, La[4];
        int on_grid = 1;
        float best = 0.0f;
        scale = max / 15.0f;
        for (int is = -15; is <= 15; is++) {
            const float id = (15.0f + (float)is * 0.2f) / max, this_scale = 1.0f / id;
#pragma unroll
            for (int i = 0; i < 4; i++)
                La[i] = (int8_t)qd_iq3xxs_level(id, xv[i]);
            const int u = iq3l_tuple(La), on = g.map[u] >= 0;
            if (!on)
                iq3l_best_neighbour(g, u, col, xv, wa, this_scale, La);
            float sumqx, sumq2;
            iq3l_odd_sums(seg, k, w, xv, La, &sumqx, &sumq2);
            iq3l_take_trial(sumqx, sumq2, &scale, &best, La, on, L, &on_grid);
        }
        if (__any_sync(seg, !on_grid) && scale > 0.0f) { /* the tuples chosen off the grid, again */
            const float id = 1.0f / scale;
            if (!on_grid) {
                int8_t l[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    l[i] = (int8_t)qd_iq3xxs_level(id, xv[i]);
                const int u = iq3l_tuple(l);
                const int gi = g.map[u] >= 0 ? g.map[u] : iq3l_best_neighbour(g, u, col, xv, wa, scale, L);
#pragma unroll
                for (int i = 0; i < 4; i++)
                    L[i] = (int8_t)qd_iq_point(&g, gi)[i];
            }
            float sumqx, sumq2; /* qd_kq_refit */
            iq3l_odd_sums(seg, k, w, xv, L, &sumqx, &sumq2);
            scale = sumq2 > 0.0f ? sumqx / sumq2 : scale;
        }
        if (scale < 0.0f) { /* qd_iq3xxs_sub_put: ggml's guard */
            scale = -scale;
            bsign = (uint8_t)(~bsign & 127);
        }
        blk[2 + 8 * ib + k] = (uint8_t)g.map[iq3l_tuple(L)];
    }
    uint32_t sas = 0;
#pragma unroll
    for (int p = 0; p < 4; p++)
        sas |= (uint32_t)__shfl_sync(seg, bsign, 2 * p, 8) << 7 * p;
    if (k == 0) {
        sscale[ib] = scale;
        sword[ib] = zero ? 0u : sas;
        szero[ib] = (int8_t)zero;
    }
    __syncthreads();
    if (t == 0) {
        float max_scale = 0.0f;
        for (int j = 0; j < 8; j++)
            if (!szero[j])
                max_scale = max_scale > sscale[j] ? max_scale : sscale[j];
        qd_iq3xxs_finish(max_scale, sscale, sword, blk);
    }
    __syncthreads();
    if (2 * t < QD_IQ3XXS_BYTES)
        *(uint16_t *)(out + b * QD_IQ3XXS_BYTES + 2 * t) = *(const uint16_t *)(blk + 2 * t);
}

#endif
