/* bitsandbytes NF4/FP4 on the GPU, the same bytes as the CPU backend (kernels/cpu/bnb4.c):
 * one warp per bitsandbytes block (absmax by shuffles, then two codes per byte, the first in
 * the high nibble), double quantization of the absmax with the 8-bit dynamic map. */
#include <stdlib.h>

#include "../bnb4.h"
#include "common.cuh"

#define BNB_NESTED_BLOCK 256

__constant__ float nf4_values[16] = QD_NF4_VALUES;
__constant__ float fp4_magnitudes[8] = QD_FP4_MAGNITUDES;
__constant__ float dynamic_map[256] = QD_DYNAMIC_MAP;
static const float host_nf4_values[16] = QD_NF4_VALUES;
static const float host_fp4_type_values[16] = QD_FP4_TYPE_VALUES;
static const float host_dynamic_map[256] = QD_DYNAMIC_MAP;

__device__ __forceinline__ float scaled(float x, float inv) { return qd_ftz(qd_ftz(x) * inv); }
__device__ __forceinline__ uint8_t code_of(int nf4, float v) { return nf4 ? qd_nf4_code(v) : qd_fp4_code(v); }

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

template <int DT>
__global__ void bnb_quantize_kernel(int nf4, const void *x, int64_t n, int64_t blocksize, int64_t nblocks,
                                    uint8_t *data, float *absmax, unsigned long long *bad)
{
    int64_t blk = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (blk >= nblocks)
        return;
    int64_t first = blk * blocksize, len = n - first < blocksize ? n - first : blocksize;
    float amax = 0.0f;
    for (int64_t i = lane; i < len; i += 32) {
        float v = qd_load<DT>(x, first + i);
        qd_note_nonfinite(bad, v, first + i);
        float a = qd_ftz(qd_absf(v));
        amax = a > amax ? a : amax;
    }
    amax = warp_max(amax);
    /* a zero block gives inf here and NaN codes below: bitsandbytes does the same */
    float inv = qd_rcp_approx(amax);
    if (lane == 0)
        absmax[blk] = amax;
    for (int64_t j = lane; j < (len + 1) / 2; j += 32) {
        float a = qd_load<DT>(x, first + 2 * j);
        /* an odd tail pairs with the code of the 0.0 bitsandbytes pads with */
        uint8_t hi = code_of(nf4, scaled(a, inv));
        uint8_t lo = 2 * j + 1 < len ? code_of(nf4, scaled(qd_load<DT>(x, first + 2 * j + 1), inv))
                                     : code_of(nf4, 0.0f * inv);
        data[first / 2 + j] = (uint8_t)(hi << 4 | lo);
    }
}

/* quantize_blockwise(absmax - offset, blocksize=256): one warp per group of 256 absmax. */
__global__ void bnb_double_quant_kernel(const float *absmax, int64_t nblocks, float offset, uint8_t *codes,
                                        float *nested_absmax)
{
    int64_t g = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int64_t base = g * BNB_NESTED_BLOCK;
    if (base >= nblocks)
        return;
    int64_t len = nblocks - base < BNB_NESTED_BLOCK ? nblocks - base : BNB_NESTED_BLOCK;
    float amax = 0.0f;
    for (int64_t i = lane; i < len; i += 32) {
        float a = qd_ftz(qd_absf(absmax[base + i] - offset));
        amax = a > amax ? a : amax;
    }
    amax = warp_max(amax);
    if (lane == 0)
        nested_absmax[g] = amax;
    float inv = qd_rcp_approx(amax);
    for (int64_t i = lane; i < len; i += 32)
        codes[base + i] = qd_dynamic_code(dynamic_map, scaled(absmax[base + i] - offset, inv));
}

/* One thread per packed byte (two elements). */
template <int DT>
__global__ void bnb_dequantize_kernel(int nf4, const uint8_t *data, int64_t n, int64_t blocksize,
                                      const float *absmax, const uint8_t *codes, const float *nested_absmax,
                                      const float *nested_map, float offset, void *y)
{
    int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (2 * j >= n)
        return;
    int64_t b = 2 * j / blocksize; /* blocksize is even: both elements share the block */
    float am = absmax ? absmax[b]
                      : qd_ftz(nested_map[codes[b]] * nested_absmax[b / BNB_NESTED_BLOCK]) + offset;
    uint8_t byte = data[j];
    for (int h = 0; h < 2 && 2 * j + h < n; h++) {
        uint8_t c = h ? (byte & 15) : (byte >> 4);
        float v = nf4 ? nf4_values[c] : fp4_magnitudes[c & 7] * (1.0f - 2.0f * (float)(c >> 3));
        qd_store<DT>(y, 2 * j + h, qd_ftz(v * am));
    }
}

extern "C" enum qd_status qd_cuda_bnb4_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                struct qd_params *p, void *const *out)
{
    int nf4 = f->code == 0;
    int64_t n = qd_tensor_numel(in), bs = p->blocksize, nblocks = (n + bs - 1) / bs;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    float *absmax = (float *)out[1];
    if (p->double_quant)
        CUDA_CHECK(cudaMallocAsync((void **)&absmax, (size_t)nblocks * sizeof(float), qd_stream()));
    const unsigned warps = 8;
    QD_DTYPE_SWITCH(in->dtype, DT,
                    bnb_quantize_kernel<DT><<<qd_grid(nblocks, warps), 32 * warps, 0, qd_stream()>>>(
                        nf4, in->data, n, bs, nblocks, (uint8_t *)out[0], absmax, bad));
    CUDA_LAUNCHED();
    if ((s = qd_cuda_bad_end(bad)) != QD_OK) {
        if (p->double_quant)
            cudaFreeAsync(absmax, qd_stream());
        return s;
    }
    struct qd_scratch *h = qd_scratch_host();
    float *quant_map = (float *)out[p->double_quant ? 4 : 2];
    if (p->double_quant) {
        if (!p->has_offset) {
            /* the mean exactly as the CPU takes it (a double sum in block order), on the host */
            float *host = (float *)malloc((size_t)nblocks * sizeof(float));
            if (!host) {
                cudaFreeAsync(absmax, qd_stream());
                return QD_ENOMEM;
            }
            cudaError_t e = cudaMemcpyAsync(host, absmax, (size_t)nblocks * sizeof(float),
                                            cudaMemcpyDeviceToHost, qd_stream());
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(qd_stream());
            double sum = 0.0;
            for (int64_t i = 0; i < nblocks; i++)
                sum += host[i];
            free(host);
            CUDA_CHECK(e);
            p->offset = (float)(sum / (double)nblocks);
            p->has_offset = 1;
        }
        int64_t groups = (nblocks + BNB_NESTED_BLOCK - 1) / BNB_NESTED_BLOCK;
        bnb_double_quant_kernel<<<qd_grid(groups, warps), 32 * warps, 0, qd_stream()>>>(
            absmax, nblocks, p->offset, (uint8_t *)out[1], (float *)out[2]);
        CUDA_LAUNCHED();
        CUDA_CHECK(cudaFreeAsync(absmax, qd_stream()));
        for (int i = 0; i < 256; i++)
            h->partial[i] = host_dynamic_map[i];
        CUDA_CHECK(cudaMemcpyAsync(out[3], h->partial, 256 * sizeof(float), cudaMemcpyHostToDevice, qd_stream()));
    }
    for (int i = 0; i < 16; i++)
        h->partial[256 + i] = nf4 ? host_nf4_values[i] : host_fp4_type_values[i] / 12.0f;
    CUDA_CHECK(cudaMemcpyAsync(quant_map, h->partial + 256, 16 * sizeof(float), cudaMemcpyHostToDevice, qd_stream()));
    return QD_OK;
}

extern "C" enum qd_status qd_cuda_bnb4_dequantize(const struct qd_format *f, const void *const *in,
                                                  const struct qd_params *p, struct qd_tensor *out)
{
    int64_t n = qd_tensor_numel(out);
    int dq = p->double_quant;
    QD_DTYPE_SWITCH(out->dtype, DT,
                    bnb_dequantize_kernel<DT><<<qd_grid((n + 1) / 2, 256), 256, 0, qd_stream()>>>(
                        f->code == 0, (const uint8_t *)in[0], n, p->blocksize,
                        dq ? NULL : (const float *)in[1], dq ? (const uint8_t *)in[1] : NULL,
                        dq ? (const float *)in[2] : NULL, dq ? (const float *)in[3] : NULL, p->offset, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
