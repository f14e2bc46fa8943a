/* ggml's iq4_nl, iq4_xs, tq1_0, tq2_0 and MXFP4 on the GPU, with the CPU's block code
 * (kernels/iquants.h, built without FMA contraction): one thread per block for quantize (the
 * iq4 searches weighted by the importance when one is given) and for dequantize. */
#include "../iquants.h"
#include "tile.cuh"

#define IQ_THREADS 64

template <int DT, int TYPE>
__global__ void __launch_bounds__(IQ_THREADS) iquant_quantize_kernel(const void *x, int64_t nblocks, int64_t cols,
                                                                     const float *imp, int64_t mrows, uint8_t *out,
                                                                     unsigned long long *bad)
{
    constexpr int N = (TYPE == QD_IQ4_NL || TYPE == QD_MXFP4_GGML) ? 32 : QD_QK_K;
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    const int64_t e0 = b * N;
    float v[N];
    if (qd_load_block_top<DT, N>(x, e0, v) >= 0x7f800000u)
        qd_note_first_nonfinite<N>(bad, v, e0);
    const float *qw = imp ? (mrows ? imp + e0 / cols / mrows * cols : imp) + e0 % cols : NULL;
    qd_iquant_quantize_block(TYPE, v, qw, out + b * qd_iquant_block_bytes(TYPE));
}

template <int DT, int TYPE>
__global__ void __launch_bounds__(IQ_THREADS) iquant_dequantize_kernel(const uint8_t *in, int64_t nblocks, void *y)
{
    constexpr int N = (TYPE == QD_IQ4_NL || TYPE == QD_MXFP4_GGML) ? 32 : QD_QK_K;
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float v[N];
    qd_iquant_dequantize_block(TYPE, in + b * qd_iquant_block_bytes(TYPE), v);
    qd_store_block<DT, N>(y, b * N, v);
}

#define IQUANT_TYPE_SWITCH(t, TYPE, ...)                                                        \
    switch (t) {                                                                                \
    case QD_IQ4_NL: { constexpr int TYPE = QD_IQ4_NL; __VA_ARGS__; } break;                     \
    case QD_IQ4_XS: { constexpr int TYPE = QD_IQ4_XS; __VA_ARGS__; } break;                     \
    case QD_TQ1_0: { constexpr int TYPE = QD_TQ1_0; __VA_ARGS__; } break;                       \
    case QD_TQ2_0: { constexpr int TYPE = QD_TQ2_0; __VA_ARGS__; } break;                       \
    default: { constexpr int TYPE = QD_MXFP4_GGML; __VA_ARGS__; } break;                        \
    }

extern "C" enum qd_status qd_cuda_iquant_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                  struct qd_params *p, void *const *out)
{
    const int64_t nblocks = qd_tensor_numel(in) / f->block_elems;
    /* only the iq4 searches read the importance (ggml ignores it for the others) */
    const int weighted = p->importance && (f->code == QD_IQ4_NL || f->code == QD_IQ4_XS);
    const int64_t mrows = weighted ? qd_cuda_importance_matrix_rows(p, in) : 0;
    float *imp = NULL;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK)
        return s;
    if (weighted && (s = qd_cuda_importance(p, &imp)) != QD_OK)
        return s;
    QD_DTYPE_SWITCH(in->dtype, DT, IQUANT_TYPE_SWITCH(f->code, TYPE,
                    iquant_quantize_kernel<DT, TYPE><<<qd_grid(nblocks, IQ_THREADS), IQ_THREADS, 0, qd_stream()>>>(
                        in->data, nblocks, in->cols, imp, mrows, (uint8_t *)out[0], bad)));
    CUDA_LAUNCHED();
    if (imp)
        CUDA_CHECK(cudaFreeAsync(imp, qd_stream()));
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_iquant_dequantize(const struct qd_format *f, const void *const *in,
                                                    const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    const int64_t nblocks = qd_tensor_numel(out) / f->block_elems;
    QD_DTYPE_SWITCH(out->dtype, DT, IQUANT_TYPE_SWITCH(f->code, TYPE,
                    iquant_dequantize_kernel<DT, TYPE><<<qd_grid(nblocks, IQ_THREADS), IQ_THREADS, 0, qd_stream()>>>(
                        (const uint8_t *)in[0], nblocks, out->data)));
    CUDA_LAUNCHED();
    return QD_OK;
}
