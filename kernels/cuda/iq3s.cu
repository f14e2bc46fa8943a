/* ggml's IQ3_S on the GPU with the CPU's operations (kernels/iq3s.h; the Makefile builds every
 * .cu with --fmad=false, so no multiply-add is fused and each float operation rounds as on the
 * CPU): quantize with a lane per 4-value group (iqlanes.cuh: a CTA of 64 lanes a super-block,
 * the sub-block's folds as chains over its 8 lanes; one thread per super-block held 256 values
 * and the search's arrays in local memory), weighted by the importance when one is given;
 * dequantize a thread per 8 values. The grid, its map and neighbour lists (built on the
 * host, kernels/iq3s.c) are copied to device memory once per context. */
#include <stddef.h>

#include "../iq3s.h"
#include "iqlanes.cuh"

#define IQ3S_THREADS 64

/* the search's 8-byte loads of the codes (iqlist.cuh) need them 8-byte aligned in the copy */
static_assert(offsetof(struct qd_iq3s_tables, codes) % 8 == 0, "the codes start on 8 bytes");

/* The context's device copy of the tables, made on its first IQ3_S call (in stream order: the
 * kernels after it on the stream read it); qd_cuda_ctx_free frees it. */
static enum qd_status iq3s_device_tables(const struct qd_iq3s_tables **dev)
{
    struct qd_cuda_ctx *c = qd_cuda_ctx_get();
    if (!c->iq3s_tables) {
        const struct qd_iq3s_tables *host = qd_iq3s_tables();
        if (!host)
            return QD_EINVAL;
        void *d;
        CUDA_CHECK(cudaMalloc(&d, sizeof *host));
        /* from pageable memory: staged before the call returns; the host tables never change */
        cudaError_t e = cudaMemcpyAsync(d, host, sizeof *host, cudaMemcpyHostToDevice, qd_stream());
        if (e != cudaSuccess) {
            cudaFree(d);
            CUDA_CHECK(e);
        }
        c->iq3s_tables = d;
    }
    *dev = (const struct qd_iq3s_tables *)c->iq3s_tables;
    return QD_OK;
}

/* qd_iq3s_best_neighbour for the lane's group (iq3l_search over its column col of the CTA's
 * terms; the levels' values 2 l + 1 are the grid's): the winner's code (its tuple of levels). */
__device__ __forceinline__ unsigned iq3s_lane_neighbour(const struct qd_iq3s_tables *QD_RESTRICT t, int u, float *col,
                                                        const float *xv, const float *wa, float scale)
{
    const uint16_t *codes = t->codes + (-t->map[u] - 1);
    return __ldg(codes + iq3l_search(codes, col, xv, wa, scale));
}

/* quantize_row_iq3_s_impl, a super-block per CTA of IQ3L_LANES lanes (lane t: sub-block t / 8,
 * group t % 8). A zero sub-block (largest |x| 0) writes nothing and, as in ggml, the next ones'
 * codes and signs move up into its place (their high bits stay at their own sub-block's byte). */
template <int DT>
__global__ void __launch_bounds__(IQ3L_LANES) iq3s_quantize_kernel(const void *x, int64_t cols, const float *imp,
                                                                   int64_t mrows, const struct qd_iq3s_tables *t,
                                                                   uint8_t *out, unsigned long long *bad)
{
    __shared__ float row[QD_QK_K]; /* the super-block, for sigma2 */
    __shared__ uint32_t sblk[(QD_IQ3S_BLOCK_BYTES + 3) / 4];
    __shared__ float sscale[8], ssigma2;
    __shared__ int8_t szero[8];
    __shared__ float sterm[IQ3L_TERMS];
    const int tid = threadIdx.x, ib = tid / 8, k = tid % 8;
    float *col = sterm + tid;
    const unsigned seg = iq3l_segment(tid);
    const int64_t b = blockIdx.x, e0 = b * QD_QK_K;
    float xb[4];
    const bool finite = iq3l_load<DT>(x, e0 + 4 * tid, xb, bad);
    /* refused (iq3_s takes no allow_nonfinite): its index noted, the block not searched */
    if (__syncthreads_or(!finite))
        return;
    if (tid < (QD_IQ3S_BLOCK_BYTES + 3) / 4)
        sblk[tid] = 0;
    iq3l_sigma2(imp, row, xb, tid, &ssigma2);
    const float *qw = qd_sub_importance<IQ3L_LANES>(imp, mrows, cols, e0, tid); /* its 4 values' */
    float w[4], wa[4], xv[4];
    uint32_t s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        xv[i] = xb[i] >= 0.0f ? xb[i] : -xb[i];
        if (!(xb[i] >= 0.0f))
            s |= 1u << (i + 4 * (k & 1));
    }
    uint8_t bsign = (uint8_t)(s | __shfl_xor_sync(seg, s, 1, 8)); /* the 8's sign byte, both lanes */
    const float max = iq3l_max(seg, k, xv);
    const int zero = max == 0.0f;
    if (k == 0)
        szero[ib] = (int8_t)zero;
    __syncthreads(); /* sigma2, the cleared bytes, the zero flags */
    iq3l_weights(qw, ssigma2, xb, w, wa);
    uint8_t *blk = (uint8_t *)sblk;
    float scale = 0.0f;
    if (!zero) {
        int at = 0; /* where this sub-block's codes and signs go: after the coded ones before it */
        for (int j = 0; j < ib; j++)
            at += !szero[j];
        int8_t L[4] = {0, 0, 0, 0}, La[4];
        int on_grid = 0;
        float best = 0.0f;
        scale = max / 15.0f;
        for (int is = -9; is <= 9; is++) {
            const float id = (15.0f + (float)is * 0.2f) / max, this_scale = 1.0f / id;
#pragma unroll
            for (int i = 0; i < 4; i++)
                La[i] = (int8_t)qd_iq3s_level(id, xv[i]);
            const int u = iq3l_tuple(La), on = t->map[u] >= 0;
            if (!on)
                iq3l_code_levels(iq3s_lane_neighbour(t, u, col, xv, wa, this_scale), La);
            float sumqx, sumq2;
            iq3l_odd_sums(seg, k, w, xv, La, &sumqx, &sumq2);
            iq3l_take_trial(sumqx, sumq2, &scale, &best, La, on, L, &on_grid);
        }
        if (__any_sync(seg, !on_grid) && scale > 0.0f) { /* every group again at the final scale */
            const float id = 1.0f / scale;
            int8_t l[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                l[i] = (int8_t)qd_iq3s_level(id, xv[i]);
            const int u = iq3l_tuple(l);
            /* (a tuple on the grid is its point's levels) */
            iq3l_code_levels(t->map[u] >= 0 ? (unsigned)u : iq3s_lane_neighbour(t, u, col, xv, wa, scale), L);
            float sumqx, sumq2; /* qd_kq_refit */
            iq3l_odd_sums(seg, k, w, xv, L, &sumqx, &sumq2);
            scale = sumq2 > 0.0f ? sumqx / sumq2 : scale;
        }
        if (scale < 0.0f) { /* ggml's guard: a positive scale, the signs flipped */
            scale = -scale;
            bsign = (uint8_t)~bsign;
        }
        const int g = t->map[iq3l_tuple(L)]; /* on the grid by construction */
        blk[2 + 8 * at + k] = (uint8_t)(g & 255);
        const unsigned high = __ballot_sync(seg, (g >> 8) & 1) >> (8 * (tid % 32 / 8));
        if (k == 0)
            blk[66 + ib] = (uint8_t)high;
        if (!(k & 1))
            blk[74 + 4 * at + k / 2] = bsign;
    }
    if (k == 0)
        sscale[ib] = scale;
    __syncthreads();
    if (tid == 0) { /* the end of the super-block, in the CPU's order */
        float max_scale = 0.0f;
        for (int j = 0; j < 8; j++)
            if (!szero[j])
                max_scale = max_scale > sscale[j] ? max_scale : sscale[j];
        if (max_scale != 0.0f) { /* else d stays +0 (the cleared bytes) */
            const float d = max_scale / 31.0f;
            qd_put_f16(blk, d * 1.033f);
            const float id = 1.0f / d;
            for (int j = 0; j < 8; j += 2) {
                const int l1 = qd_kq_clampi(qd_kq_round(0.5f * (id * sscale[j] - 1.0f)), 0, 15);
                const int l2 = qd_kq_clampi(qd_kq_round(0.5f * (id * sscale[j + 1] - 1.0f)), 0, 15);
                blk[106 + j / 2] = (uint8_t)(l1 | l2 << 4);
            }
        }
    }
    __syncthreads();
    uint8_t *dst = out + b * QD_IQ3S_BLOCK_BYTES;
    if (((uintptr_t)out & 1) == 0) { /* 110 bytes: two at a time where the block starts even */
        if (2 * tid < QD_IQ3S_BLOCK_BYTES)
            *(uint16_t *)(dst + 2 * tid) = *(const uint16_t *)(blk + 2 * tid);
    } else {
        for (int i = tid; i < QD_IQ3S_BLOCK_BYTES; i += IQ3L_LANES)
            dst[i] = blk[i];
    }
}

template <int DT>
__global__ void __launch_bounds__(QD_EIGHT_THREADS) iq3s_dequantize_kernel(const uint8_t *in, int64_t ngroups,
                                                                          const struct qd_iq3s_tables *t, void *y)
{
    const int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (k >= ngroups)
        return;
    float v[8];
    qd_iq3s_dequantize_eight(t, in + k / 32 * QD_IQ3S_BLOCK_BYTES, (int)(k % 32), v);
    qd_store_block<DT, 8>(y, k * 8, v);
}

extern "C" enum qd_status qd_cuda_iq3s_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                struct qd_params *p, void *const *out)
{
    (void)f;
    const int64_t nblocks = qd_tensor_numel(in) / QD_QK_K;
    const struct qd_iq3s_tables *t;
    enum qd_status s = iq3s_device_tables(&t);
    if (s != QD_OK)
        return s;
    const int64_t mrows = p->importance ? qd_cuda_importance_matrix_rows(p, in) : 0;
    float *imp = NULL;
    unsigned long long *bad;
    if ((s = qd_cuda_bad_begin(1, &bad)) != QD_OK)
        return s;
    if ((s = qd_cuda_importance(p, &imp)) != QD_OK)
        return s;
    QD_DTYPE_SWITCH(in->dtype, DT,
                    iq3s_quantize_kernel<DT><<<(unsigned)nblocks, IQ3L_LANES, 0, qd_stream()>>>(
                        in->data, in->cols, imp, mrows, t, (uint8_t *)out[0], bad));
    /* the importance goes back to the pool whether or not the launch took */
    const cudaError_t launched = cudaGetLastError();
    const cudaError_t freed = imp ? cudaFreeAsync(imp, qd_stream()) : cudaSuccess;
    CUDA_CHECK(launched);
    CUDA_CHECK(freed);
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_iq3s_dequantize(const struct qd_format *f, const void *const *in,
                                                  const struct qd_params *p, struct qd_tensor *out)
{
    (void)f, (void)p;
    const int64_t nblocks = qd_tensor_numel(out) / QD_QK_K;
    const struct qd_iq3s_tables *t;
    enum qd_status s = iq3s_device_tables(&t);
    if (s != QD_OK)
        return s;
    QD_DTYPE_SWITCH(out->dtype, DT,
                    iq3s_dequantize_kernel<DT><<<qd_grid(32 * nblocks, QD_EIGHT_THREADS), QD_EIGHT_THREADS, 0, qd_stream()>>>(
                        (const uint8_t *)in[0], 32 * nblocks, t, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
