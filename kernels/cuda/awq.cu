/* AutoAWQ int4 (WQLinear_GEMM layout) on the GPU: one thread per (group, 8-column word); it
 * reads its 8 columns over the group's rows twice (range, then codes; the second read comes
 * from L2), adjacent threads reading adjacent columns. */
#include "../awq.h"
#include "common.cuh"

__constant__ int awq_order[8] = QD_AWQ_ORDER;

template <int DT>
__global__ void awq_quantize_kernel(const void *x, int64_t K, int64_t N, int64_t G, uint32_t *qweight,
                                    uint32_t *qzeros, uint16_t *scales, unsigned long long *bad)
{
    int64_t words = N / 8, t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= (K / G) * words)
        return;
    int64_t g = t / words, j = t % words, row0 = g * G;
    float lo[8], hi[8], v[8];
    qd_load_block<DT, 8>(x, row0 * N + 8 * j, v);
    for (int c = 0; c < 8; c++)
        lo[c] = hi[c] = v[c];
#pragma unroll 8 /* several rows' loads in flight per thread */
    for (int64_t r = 0; r < G; r++) {
        qd_load_block<DT, 8>(x, (row0 + r) * N + 8 * j, v);
        for (int c = 0; c < 8; c++) {
            qd_note_nonfinite(bad, v[c], (row0 + r) * N + 8 * j + c);
            lo[c] = v[c] < lo[c] ? v[c] : lo[c];
            hi[c] = v[c] > hi[c] ? v[c] : hi[c];
        }
    }
    float scale[8], zero[8];
    for (int c = 0; c < 8; c++) {
        scale[c] = qd_awq_scale(lo[c], hi[c]);
        zero[c] = qd_awq_zero(lo[c], scale[c]);
        scales[g * N + 8 * j + c] = qd_f32_to_f16(scale[c]);
    }
    uint32_t zword = 0;
    for (int i = 0; i < 8; i++)
        zword |= (uint32_t)zero[awq_order[i]] << (4 * i);
    qzeros[g * words + j] = zword;
#pragma unroll 8
    for (int64_t r = 0; r < G; r++) {
        qd_load_block<DT, 8>(x, (row0 + r) * N + 8 * j, v);
        uint32_t word = 0;
        for (int i = 0; i < 8; i++) {
            int c = awq_order[i];
            word |= qd_awq_code(v[c], scale[c], zero[c]) << (4 * i);
        }
        qweight[(row0 + r) * words + j] = word;
    }
}

/* One thread per 8 output elements (one packed word). */
template <int DT>
__global__ void awq_dequantize_kernel(const uint32_t *qweight, const uint32_t *qzeros, const uint16_t *scales,
                                      int64_t K, int64_t N, int64_t G, void *y)
{
    int64_t words = N / 8, t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= K * words)
        return;
    int64_t row = t / words, j = t % words, g = row / G;
    uint32_t q = qweight[t], z = qzeros[g * words + j];
    uint4 sv = *(const uint4 *)(scales + g * N + 8 * j); /* the word's 8 scales, one 16-byte load */
    uint32_t sw[4] = {sv.x, sv.y, sv.z, sv.w};
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int order[8] = QD_AWQ_ORDER; /* compile-time: no constant-bank lookups */
        int c = order[i];
        uint16_t sc = (uint16_t)(sw[c / 2] >> (16 * (c % 2)));
        v[c] = (float)((int)((q >> (4 * i)) & 15) - (int)((z >> (4 * i)) & 15)) * qd_f16_to_f32(sc);
    }
    qd_store_block<DT, 8>(y, row * N + 8 * j, v);
}

extern "C" enum qd_status qd_cuda_awq_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                               struct qd_params *p, void *const *out)
{
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    int64_t K = in->rows, N = in->cols, G = p->group_size, items = (K / G) * (N / 8);
    QD_DTYPE_SWITCH(in->dtype, DT,
                    awq_quantize_kernel<DT><<<qd_grid(items, 128), 128, 0, qd_stream()>>>(
                        in->data, K, N, G, (uint32_t *)out[0], (uint32_t *)out[1], (uint16_t *)out[2], bad));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_awq_dequantize(const struct qd_format *f, const void *const *in,
                                                 const struct qd_params *p, struct qd_tensor *out)
{
    int64_t K = out->rows, N = out->cols;
    QD_DTYPE_SWITCH(out->dtype, DT,
                    awq_dequantize_kernel<DT><<<qd_grid(K * (N / 8), 256), 256, 0, qd_stream()>>>(
                        (const uint32_t *)in[0], (const uint32_t *)in[1], (const uint16_t *)in[2], K, N,
                        p->group_size, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
