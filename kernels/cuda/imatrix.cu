/* ggml's importance-weighted searches on the GPU (kernels/imatrix.h, the CPU's block code, built
 * without FMA contraction): the legacy types q4_0..q5_1 and the K-quants when the quantize is
 * given an importance vector. One thread per block runs the whole weighted search for it; the
 * legacy types first take each row's mean square (one thread per row, summed in order as the
 * CPU and ggml sum it). The importance goes to the device with the call (host memory in
 * struct qd_params) and is freed in stream order after the kernels. */
#include "../imatrix.h"
#include "tile.cuh"

#define IMX_THREADS 64

enum qd_status qd_cuda_importance(const struct qd_params *p, float **dev)
{
    *dev = NULL;
    if (!p->importance)
        return QD_OK;
    const size_t bytes = (size_t)p->importance_n * sizeof(float);
    CUDA_CHECK(cudaMallocAsync((void **)dev, bytes, qd_stream()));
    /* from pageable memory: the call returns once the values are staged, so the caller may
     * free them */
    cudaError_t e = cudaMemcpyAsync(*dev, p->importance, bytes, cudaMemcpyHostToDevice, qd_stream());
    if (e != cudaSuccess) {
        cudaFreeAsync(*dev, qd_stream());
        *dev = NULL;
        CUDA_CHECK(e);
    }
    return QD_OK;
}

/* Where row `row`'s importance starts: one vector for all rows, or one per run of mrows rows. */
__device__ __forceinline__ const float *imx_row(const float *imp, int64_t per_matrix_rows, int64_t row, int64_t cols)
{
    return per_matrix_rows ? imp + row / per_matrix_rows * cols : imp;
}

int64_t qd_cuda_importance_matrix_rows(const struct qd_params *p, const struct qd_tensor *in)
{
    return p->importance_n == in->cols ? 0 : qd_importance_run(p, in);
}

template <int DT> __global__ void imx_row_sigma2_kernel(const void *x, int64_t rows, int64_t cols, float *sigma2)
{
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    float s = 0.0f;
    for (int64_t j = 0; j < cols; j++) {
        const float v = qd_load<DT>(x, r * cols + j);
        s += v * v;
    }
    sigma2[r] = s / (float)cols;
}

template <int DT, int TYPE>
__global__ void __launch_bounds__(IMX_THREADS) imx_legacy_kernel(const void *x, int64_t nblocks, int64_t cols,
                                                                 const float *imp, int64_t mrows, const float *sigma2,
                                                                 int bytes, uint8_t *out, unsigned long long *bad)
{
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    const int64_t e0 = b * QD_GGML_QK, row = e0 / cols;
    float v[QD_GGML_QK];
    if (qd_load_block_top<DT, QD_GGML_QK>(x, e0, v) >= 0x7f800000u)
        qd_note_first_nonfinite<QD_GGML_QK>(bad, v, e0);
    qd_imx_quantize_legacy(TYPE, v, imx_row(imp, mrows, row, cols) + e0 % cols, sigma2[row], out + b * bytes);
}

template <int DT, int TYPE>
__global__ void __launch_bounds__(IMX_THREADS) imx_kquant_kernel(const void *x, int64_t nblocks, int64_t cols,
                                                                 const float *imp, int64_t mrows, int bytes,
                                                                 uint8_t *out, unsigned long long *bad)
{
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    const int64_t e0 = b * QD_QK_K;
    float v[QD_QK_K];
    if (qd_load_block_top<DT, QD_QK_K>(x, e0, v) >= 0x7f800000u)
        qd_note_first_nonfinite<QD_QK_K>(bad, v, e0);
    qd_imx_quantize_kquant(TYPE, v, imx_row(imp, mrows, e0 / cols, cols) + e0 % cols, out + b * bytes);
}

#define IMX_LEGACY_SWITCH(t, TYPE, ...)                                                         \
    switch (t) {                                                                                \
    case QD_Q4_0: { constexpr int TYPE = QD_Q4_0; __VA_ARGS__; } break;                         \
    case QD_Q4_1: { constexpr int TYPE = QD_Q4_1; __VA_ARGS__; } break;                         \
    case QD_Q5_0: { constexpr int TYPE = QD_Q5_0; __VA_ARGS__; } break;                         \
    default: { constexpr int TYPE = QD_Q5_1; __VA_ARGS__; } break;                              \
    }

#define IMX_KQUANT_SWITCH(t, TYPE, ...)                                                         \
    switch (t) {                                                                                \
    case QD_Q2_K: { constexpr int TYPE = QD_Q2_K; __VA_ARGS__; } break;                         \
    case QD_Q3_K: { constexpr int TYPE = QD_Q3_K; __VA_ARGS__; } break;                         \
    case QD_Q4_K: { constexpr int TYPE = QD_Q4_K; __VA_ARGS__; } break;                         \
    case QD_Q5_K: { constexpr int TYPE = QD_Q5_K; __VA_ARGS__; } break;                         \
    default: { constexpr int TYPE = QD_Q6_K; __VA_ARGS__; } break;                              \
    }

/* q4_0, q4_1, q5_0, q5_1 with p->importance (q8_0 ignores it: the caller's plain path). */
enum qd_status qd_cuda_ggml_importance_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                struct qd_params *p, void *const *out)
{
    const int64_t nblocks = qd_tensor_numel(in) / QD_GGML_QK, mrows = qd_cuda_importance_matrix_rows(p, in);
    float *imp, *sigma2;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK || (s = qd_cuda_importance(p, &imp)) != QD_OK)
        return s;
    CUDA_CHECK(cudaMallocAsync((void **)&sigma2, (size_t)in->rows * sizeof(float), qd_stream()));
    QD_DTYPE_SWITCH(in->dtype, DT,
                    imx_row_sigma2_kernel<DT><<<qd_grid(in->rows, 128), 128, 0, qd_stream()>>>(
                        in->data, in->rows, in->cols, sigma2);
                    IMX_LEGACY_SWITCH(f->code, TYPE,
                        imx_legacy_kernel<DT, TYPE><<<qd_grid(nblocks, IMX_THREADS), IMX_THREADS, 0, qd_stream()>>>(
                            in->data, nblocks, in->cols, imp, mrows, sigma2, f->block_bytes, (uint8_t *)out[0], bad)));
    CUDA_LAUNCHED();
    CUDA_CHECK(cudaFreeAsync(sigma2, qd_stream()));
    CUDA_CHECK(cudaFreeAsync(imp, qd_stream()));
    return qd_cuda_bad_end(bad);
}

/* q2_K .. q6_K with p->importance. */
enum qd_status qd_cuda_kquant_importance_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                  struct qd_params *p, void *const *out)
{
    const int64_t nblocks = qd_tensor_numel(in) / QD_QK_K, mrows = qd_cuda_importance_matrix_rows(p, in);
    float *imp;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK || (s = qd_cuda_importance(p, &imp)) != QD_OK)
        return s;
    QD_DTYPE_SWITCH(in->dtype, DT, IMX_KQUANT_SWITCH(f->code, TYPE,
                    imx_kquant_kernel<DT, TYPE><<<qd_grid(nblocks, IMX_THREADS), IMX_THREADS, 0, qd_stream()>>>(
                        in->data, nblocks, in->cols, imp, mrows, f->block_bytes, (uint8_t *)out[0], bad)));
    CUDA_LAUNCHED();
    CUDA_CHECK(cudaFreeAsync(imp, qd_stream()));
    return qd_cuda_bad_end(bad);
}
