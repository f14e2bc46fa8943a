/* llama.cpp GGML blocks (q4_0 q4_1 q5_0 q5_1 q8_0 q8_1) on the GPU: one thread per 32-element
 * block, the same block arithmetic as the CPU (kernels/ggml.h). */
#include "../ggml.h"
#include "common.cuh"

template <int DT>
__global__ void ggml_quantize_kernel(int type, int bytes, const void *x, int64_t nblocks, uint8_t *out,
                                     unsigned long long *bad)
{
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float v[QD_GGML_QK];
    qd_load_block<DT, QD_GGML_QK>(x, b * QD_GGML_QK, v);
    if (bad)
        for (int j = 0; j < QD_GGML_QK; j++)
            qd_note_nonfinite(bad, v[j], b * QD_GGML_QK + j);
    uint8_t blk[40];
    qd_ggml_quantize_block(type, v, blk);
    uint8_t *o = out + b * bytes;
    for (int j = 0; j < bytes; j++) /* blocks are 18..36 bytes: not 16-byte aligned */
        o[j] = blk[j];
}

template <int DT>
__global__ void ggml_dequantize_kernel(int type, int bytes, const uint8_t *in, int64_t nblocks, void *y)
{
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    uint8_t blk[40];
    const uint8_t *p = in + b * bytes;
    for (int j = 0; j < bytes; j++)
        blk[j] = p[j];
    float v[QD_GGML_QK];
    qd_ggml_dequantize_block(type, blk, v);
    qd_store_block<DT, QD_GGML_QK>(y, b * QD_GGML_QK, v);
}

extern "C" enum qd_status qd_cuda_ggml_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                struct qd_params *p, void *const *out)
{
    int64_t nblocks = qd_tensor_numel(in) / QD_GGML_QK;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    QD_DTYPE_SWITCH(in->dtype, DT,
                    ggml_quantize_kernel<DT><<<qd_grid(nblocks, 128), 128, 0, qd_stream()>>>(
                        f->code, f->block_bytes, in->data, nblocks, (uint8_t *)out[0], bad));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_ggml_dequantize(const struct qd_format *f, const void *const *in,
                                                  const struct qd_params *p, struct qd_tensor *out)
{
    int64_t nblocks = qd_tensor_numel(out) / QD_GGML_QK;
    QD_DTYPE_SWITCH(out->dtype, DT,
                    ggml_dequantize_kernel<DT><<<qd_grid(nblocks, 128), 128, 0, qd_stream()>>>(
                        f->code, f->block_bytes, (const uint8_t *)in[0], nblocks, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
