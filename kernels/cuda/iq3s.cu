/* ggml's IQ3_S on the GPU with the CPU's super-block code (kernels/iq3s.h; the Makefile builds
 * every .cu with --fmad=false, so no multiply-add is fused and each float operation rounds as
 * on the CPU): one thread per super-block for quantize (weighted by the importance when one is
 * given) and for dequantize. The grid, its map and neighbour lists (built on the host,
 * kernels/iq3s.c) are copied to device memory once per context. */
#include "../iq3s.h"
#include "common.cuh"

#define IQ3S_THREADS 64

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

template <int DT>
__global__ void __launch_bounds__(IQ3S_THREADS) iq3s_quantize_kernel(const void *x, int64_t nblocks, int64_t cols,
                                                                     const float *imp, int64_t mrows,
                                                                     const struct qd_iq3s_tables *t, uint8_t *out,
                                                                     unsigned long long *bad)
{
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    const int64_t e0 = b * QD_QK_K;
    float v[QD_QK_K];
    if (qd_load_block_top<DT, QD_QK_K>(x, e0, v) >= 0x7f800000u) {
        /* refused (iq3_s takes no allow_nonfinite): its index noted, the block not searched */
        qd_note_first_nonfinite<QD_QK_K>(bad, v, e0);
        return;
    }
    const float *qw = imp ? (mrows ? imp + e0 / cols / mrows * cols : imp) + e0 % cols : NULL;
    uint8_t blk[QD_IQ3S_BLOCK_BYTES];
    qd_iq3s_quantize(t, v, qw, blk);
    /* 110 bytes: two at a time where the output starts at an even address (a block then does too) */
    uint8_t *dst = out + b * QD_IQ3S_BLOCK_BYTES;
    if (((uintptr_t)out & 1) == 0) {
#pragma unroll
        for (int i = 0; i < QD_IQ3S_BLOCK_BYTES / 2; i++)
            ((uint16_t *)dst)[i] = (uint16_t)(blk[2 * i] | blk[2 * i + 1] << 8);
    } else {
        for (int i = 0; i < QD_IQ3S_BLOCK_BYTES; i++)
            dst[i] = blk[i];
    }
}

template <int DT>
__global__ void __launch_bounds__(IQ3S_THREADS) iq3s_dequantize_kernel(const uint8_t *in, int64_t nblocks,
                                                                       const struct qd_iq3s_tables *t, void *y)
{
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float v[QD_QK_K];
    qd_iq3s_dequantize(t, in + b * QD_IQ3S_BLOCK_BYTES, v);
    qd_store_block<DT, QD_QK_K>(y, b * QD_QK_K, v);
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
                    iq3s_quantize_kernel<DT><<<qd_grid(nblocks, IQ3S_THREADS), IQ3S_THREADS, 0, qd_stream()>>>(
                        in->data, nblocks, in->cols, imp, mrows, t, (uint8_t *)out[0], bad));
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
                    iq3s_dequantize_kernel<DT><<<qd_grid(nblocks, IQ3S_THREADS), IQ3S_THREADS, 0, qd_stream()>>>(
                        (const uint8_t *)in[0], nblocks, t, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
