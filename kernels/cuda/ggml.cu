/* llama.cpp GGML blocks (q4_0 q4_1 q5_0 q5_1 q8_0 q8_1) on the GPU: one thread per 32-element
 * block, the same block arithmetic as the CPU (kernels/ggml.h), packed blocks and dequantized
 * elements staged per CTA (tile.cuh). */
#include "../ggml.h"
#include "tile.cuh"

#define GGML_THREADS 128
#define GGML_MAX_BYTES 36

/* One thread per block; the CTA's packed blocks are staged in shared memory and written out
 * together, instead of each thread storing its 18-36 bytes one by one at a stride. TYPE is a
 * template parameter: each kernel holds one type's block code (the runtime switch of the
 * shared functions folds away), which keeps registers and code small. */
template <int DT, int TYPE>
__global__ void ggml_quantize_kernel(int bytes, const void *x, int64_t nblocks, uint8_t *out,
                                     unsigned long long *bad)
{
    __shared__ __align__(16) uint8_t staged[GGML_THREADS * GGML_MAX_BYTES];
    int64_t first = blockIdx.x * (int64_t)GGML_THREADS, b = first + threadIdx.x;
    if (b < nblocks) {
        float v[QD_GGML_QK];
        bool nonfinite = qd_load_block_top<DT, QD_GGML_QK>(x, b * QD_GGML_QK, v) >= 0x7f800000u;
        if (nonfinite)
            qd_note_first_nonfinite<QD_GGML_QK>(bad, v, b * QD_GGML_QK);
        qd_ggml_quantize_block_checked(TYPE, v, staged + threadIdx.x * bytes, !nonfinite);
    }
    __syncthreads();
    int64_t nvalid = nblocks - first < GGML_THREADS ? nblocks - first : GGML_THREADS;
    cta_copy(out + first * bytes, staged, (int)(nvalid * bytes));
}

template <int DT, int TYPE>
__global__ void ggml_dequantize_kernel(int bytes, const uint8_t *in, int64_t nblocks, void *y)
{
    __shared__ __align__(16) uint8_t staged[GGML_THREADS * GGML_MAX_BYTES];
    __shared__ uint4 tile[GGML_THREADS * qd_tile<DT, QD_GGML_QK>::CH];
    int64_t first = blockIdx.x * (int64_t)GGML_THREADS, b = first + threadIdx.x;
    int nvalid = nblocks - first < GGML_THREADS ? (int)(nblocks - first) : GGML_THREADS;
    cta_copy(staged, in + first * bytes, nvalid * bytes);
    __syncthreads();
    if (b < nblocks) {
        float v[QD_GGML_QK];
        qd_ggml_dequantize_block(TYPE, staged + threadIdx.x * bytes, v);
        tile_put<DT, QD_GGML_QK>(tile, v);
    }
    __syncthreads();
    tile_store<DT, QD_GGML_QK>(tile, (uint8_t *)y + first * QD_GGML_QK * qd_tile<DT, QD_GGML_QK>::esize, nvalid);
}

#define GGML_TYPE_SWITCH(t, TYPE, ...)                                                          \
    switch (t) {                                                                                \
    case QD_Q4_0: { constexpr int TYPE = QD_Q4_0; __VA_ARGS__; } break;                         \
    case QD_Q4_1: { constexpr int TYPE = QD_Q4_1; __VA_ARGS__; } break;                         \
    case QD_Q5_0: { constexpr int TYPE = QD_Q5_0; __VA_ARGS__; } break;                         \
    case QD_Q5_1: { constexpr int TYPE = QD_Q5_1; __VA_ARGS__; } break;                         \
    case QD_Q8_0: { constexpr int TYPE = QD_Q8_0; __VA_ARGS__; } break;                         \
    case QD_Q8_1: { constexpr int TYPE = QD_Q8_1; __VA_ARGS__; } break;                         \
    default: QD_SWITCH_UNKNOWN();                                                               \
    }

extern "C" enum qd_status qd_cuda_ggml_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                struct qd_params *p, void *const *out)
{
    if (p->importance && f->code != QD_Q8_0) /* q8_0 has no weighted form: ggml ignores it */
        return qd_cuda_ggml_importance_quantize(f, in, p, out);
    int64_t nblocks = qd_tensor_numel(in) / QD_GGML_QK;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    QD_DTYPE_SWITCH(in->dtype, DT, GGML_TYPE_SWITCH(f->code, TYPE,
                    ggml_quantize_kernel<DT, TYPE><<<qd_grid(nblocks, GGML_THREADS), GGML_THREADS, 0, qd_stream()>>>(
                        f->block_bytes, in->data, nblocks, (uint8_t *)out[0], bad)));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_ggml_dequantize(const struct qd_format *f, const void *const *in,
                                                  const struct qd_params *p, struct qd_tensor *out)
{
    int64_t nblocks = qd_tensor_numel(out) / QD_GGML_QK;
    QD_DTYPE_SWITCH(out->dtype, DT, GGML_TYPE_SWITCH(f->code, TYPE,
                    ggml_dequantize_kernel<DT, TYPE><<<qd_grid(nblocks, GGML_THREADS), GGML_THREADS, 0, qd_stream()>>>(
                        f->block_bytes, (const uint8_t *)in[0], nblocks, out->data)));
    CUDA_LAUNCHED();
    return QD_OK;
}
