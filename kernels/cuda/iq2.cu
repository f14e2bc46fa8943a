/* ggml's iq2_xxs, iq2_xs and iq2_s on the GPU, with the CPU's block code (kernels/iq2.h, built
 * without FMA contraction): a thread per sub-block for quantize, one per 256-element
 * super-block for dequantize, all reading a device copy of the host's tables (kernels/iq2.c), made once per
 * device and type into module globals (nothing to free). */
#include <pthread.h>

#include "../iq2.h"
#include "subblock.cuh"
#include "tile.cuh"

#define IQ2_THREADS 64
#define IQ2_MAX_DEVICES 64

__device__ struct qd_iq2_tables iq2_tables_dev[3];
__device__ uint16_t iq2_neighbours_dev[3][QD_IQ2_NEIGHBOURS_MAX];
static const struct qd_iq2_tables *iq2_on_device[IQ2_MAX_DEVICES][3];
static pthread_mutex_t iq2_lock = PTHREAD_MUTEX_INITIALIZER;

/* type's tables on the current device (copied on first use); NULL on failure, noted */
static const struct qd_iq2_tables *iq2_device_tables(int type)
{
    const struct qd_iq2_tables *host = qd_iq2_tables(type);
    int dev = 0;
    if (!host || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= IQ2_MAX_DEVICES)
        return NULL;
    pthread_mutex_lock(&iq2_lock);
    if (!iq2_on_device[dev][type]) {
        struct qd_iq2_tables *t = NULL;
        uint16_t(*nb)[QD_IQ2_NEIGHBOURS_MAX] = NULL;
        cudaStream_t s;
        cudaError_t e = cudaGetSymbolAddress((void **)&t, iq2_tables_dev);
        if (e == cudaSuccess)
            e = cudaGetSymbolAddress((void **)&nb, iq2_neighbours_dev);
        if (e == cudaSuccess && (e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) == cudaSuccess) {
            /* once per device and type, on its own stream, finished before anyone reads it */
            struct qd_iq2_tables copy = *host;
            copy.neighbours = nb[type];
            e = cudaMemcpyAsync(t + type, &copy, sizeof copy, cudaMemcpyHostToDevice, s);
            if (e == cudaSuccess)
                e = cudaMemcpyAsync(nb[type], host->neighbours, (size_t)host->n_neighbours * sizeof(uint16_t),
                                    cudaMemcpyHostToDevice, s);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(s);
            cudaStreamDestroy(s);
        }
        if (e != cudaSuccess)
            qd_cuda_note_error(e, __FILE__, __LINE__);
        else
            iq2_on_device[dev][type] = t + type;
    }
    const struct qd_iq2_tables *t = iq2_on_device[dev][type];
    pthread_mutex_unlock(&iq2_lock);
    return t;
}

/* A thread per sub-block (subblock.cuh): 8 of 32 values for IQ2_XXS, 16 of 16 for IQ2_XS and
 * IQ2_S; 64 threads a CTA. The group's lane 0 writes the block from their results. */
template <int DT, int TYPE>
__global__ void __launch_bounds__(64) iq2_sub_quantize_kernel(const struct qd_iq2_tables *t, const void *x,
                                                              int64_t nblocks, int64_t cols, const float *imp,
                                                              int64_t mrows, uint8_t *out, unsigned long long *bad)
{
    constexpr int N = TYPE == QD_IQ2_XXS ? 8 : 16, SB = 64 / N;
    __shared__ float sx[SB][QD_QK_K + 1];
    __shared__ struct qd_iq2_sub sr[SB][16];
    __shared__ uint32_t sblk[SB][(82 + 3) / 4]; /* IQ2_S's 82 bytes, the largest */
    const int gi = threadIdx.x / N, ib = threadIdx.x % N;
    const int64_t b = blockIdx.x * (int64_t)SB + gi, e0 = b * QD_QK_K;
    if (b >= nblocks) /* (a whole group) */
        return;
    float xb[QD_QK_K / N];
    qd_sub_load<DT, N>(x, e0, ib, xb, sx[gi], bad);
    const unsigned lanes = qd_sub_lanes<N>(gi);
    __syncwarp(lanes);
    const float sigma2 = qd_iq2_sigma2(TYPE, sx[gi]);
    qd_iq2_sub_block(t, TYPE, xb, qd_sub_importance<N>(imp, mrows, cols, e0, ib), sigma2, &sr[gi][ib]);
    __syncwarp(lanes);
    uint8_t *blk = (uint8_t *)sblk[gi];
    if (ib == 0)
        qd_iq2_finish(TYPE, sr[gi], blk);
    __syncwarp(lanes);
    qd_sub_store<N>(blk, out + b * qd_iq2_block_bytes(TYPE), qd_iq2_block_bytes(TYPE), ib);
}

template <int DT, int TYPE>
__global__ void __launch_bounds__(IQ2_THREADS) iq2_dequantize_kernel(const struct qd_iq2_tables *t, const uint8_t *in,
                                                                     int64_t nblocks, void *y)
{
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float v[QD_QK_K];
    qd_iq2_dequantize_block(t, TYPE, in + b * qd_iq2_block_bytes(TYPE), v);
    qd_store_block<DT, QD_QK_K>(y, b * QD_QK_K, v);
}

#define IQ2_TYPE_SWITCH(t, TYPE, ...)                                                           \
    switch (t) {                                                                                \
    case QD_IQ2_XXS: { constexpr int TYPE = QD_IQ2_XXS; __VA_ARGS__; } break;                   \
    case QD_IQ2_XS: { constexpr int TYPE = QD_IQ2_XS; __VA_ARGS__; } break;                     \
    case QD_IQ2_S: { constexpr int TYPE = QD_IQ2_S; __VA_ARGS__; } break;                       \
    default: QD_SWITCH_UNKNOWN();                                                               \
    }

extern "C" enum qd_status qd_cuda_iq2_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                               struct qd_params *p, void *const *out)
{
    const int64_t nblocks = qd_tensor_numel(in) / QD_QK_K;
    const struct qd_iq2_tables *t = iq2_device_tables(f->code);
    if (!t)
        return QD_EDEVICE;
    const int64_t mrows = p->importance ? qd_cuda_importance_matrix_rows(p, in) : 0;
    float *imp = NULL;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK)
        return s;
    if ((s = qd_cuda_importance(p, &imp)) != QD_OK)
        return s;
    QD_DTYPE_SWITCH(in->dtype, DT, IQ2_TYPE_SWITCH(f->code, TYPE,
                    iq2_sub_quantize_kernel<DT, TYPE><<<qd_grid(nblocks, TYPE == QD_IQ2_XXS ? 8 : 4), 64, 0, qd_stream()>>>(
                        t, in->data, nblocks, in->cols, imp, mrows, (uint8_t *)out[0], bad)));
    CUDA_LAUNCHED();
    if (imp)
        CUDA_CHECK(cudaFreeAsync(imp, qd_stream()));
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_iq2_dequantize(const struct qd_format *f, const void *const *in,
                                                 const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    const int64_t nblocks = qd_tensor_numel(out) / QD_QK_K;
    const struct qd_iq2_tables *t = iq2_device_tables(f->code);
    if (!t)
        return QD_EDEVICE;
    QD_DTYPE_SWITCH(out->dtype, DT, IQ2_TYPE_SWITCH(f->code, TYPE,
                    iq2_dequantize_kernel<DT, TYPE><<<qd_grid(nblocks, IQ2_THREADS), IQ2_THREADS, 0, qd_stream()>>>(
                        t, (const uint8_t *)in[0], nblocks, out->data)));
    CUDA_LAUNCHED();
    return QD_OK;
}
