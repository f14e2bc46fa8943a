/* bitsandbytes NF4/FP4 on the GPU, the same bytes as the CPU backend (kernels/cpu/bnb4.c):
 * one thread per 8 elements, a bitsandbytes block per group of threads (absmax by shuffles,
 * then two codes per byte, the first in the high nibble), the double-quant offset as the exact
 * sum of bnb4.h gathered on the way, then the absmax quantized with the 8-bit dynamic map. */
#include "../bnb4.h"
#include "common.cuh"
#include "convert.cuh"

#define BNB_NESTED_BLOCK 256

__constant__ float nf4_values[16] = QD_NF4_VALUES;
__constant__ float fp4_magnitudes[8] = QD_FP4_MAGNITUDES;
__constant__ float dynamic_map[256] = QD_DYNAMIC_MAP;
static const float host_nf4_values[16] = QD_NF4_VALUES;
static const float host_fp4_type_values[16] = QD_FP4_TYPE_VALUES;
static const float host_dynamic_map[256] = QD_DYNAMIC_MAP;

__device__ __forceinline__ float scaled(float x, float inv) { return qd_ftz(qd_ftz(x) * inv); }

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* One thread per 8 consecutive elements (one 16-byte load of bf16/f16, two of f32; 4 bytes of
 * codes out, coalesced across the warp). A bitsandbytes block of B elements is a group of B/8
 * consecutive threads: its absmax by shuffles within the group (and through shared memory
 * when the group spans warps). With `bins`, each block's absmax also goes into the exact sum
 * of the double-quant offset (kernels/bnb4.h), through per-CTA bins: the grid is capped and
 * each CTA walks many tiles, so the global bins see a few atomics per CTA, not per tile. */
template <int DT>
__global__ void __launch_bounds__(512) bnb_quantize_kernel(int nf4, const void *x, int64_t n, int group,
                                                            uint8_t *data, float *absmax,
                                                            unsigned long long *bins, unsigned long long *bad)
{
    __shared__ float warp_amax[16];
    __shared__ unsigned long long cta_bins[QD_SUM_BINS];
    __shared__ float2 lut[QD_BNB_LUT];
    qd_bnb_lut_init(nf4, lut); /* the __syncthreads below covers it */
    if (bins)
        for (int i = threadIdx.x; i < QD_SUM_BINS; i += blockDim.x)
            cta_bins[i] = 0;
    int64_t tiles = (n + 8 * (int64_t)blockDim.x - 1) / (8 * (int64_t)blockDim.x);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int64_t t = tile * blockDim.x + threadIdx.x, first = 8 * t;
        float v[8];
        if (first + 8 <= n) {
            qd_load_block<DT, 8>(x, first, v);
        } else {
            for (int j = 0; j < 8; j++) /* the tail: bitsandbytes pads with 0.0 */
                v[j] = first + j < n ? qd_load<DT>(x, first + j) : 0.0f;
        }
        if (bad) /* the zero padding is finite: no false alarm */
            qd_check_block<8>(bad, v, first);
        float amax = 0.0f; /* max |x|, flushed once at the end (the same as max of flushed |x|) */
        for (int j = 0; j < 8; j++) {
            float a = qd_absf(v[j]);
            amax = a > amax ? a : amax; /* a NaN never enters */
        }
        int lane = threadIdx.x % 32;
        for (int o = 1; o < group && o < 32; o <<= 1) {
            float w = __shfl_xor_sync(0xffffffffu, amax, o);
            amax = w > amax ? w : amax;
        }
        if (group > 32) { /* the group spans group/32 warps of this CTA */
            __syncthreads(); /* warp_amax of the previous tile read */
            if (lane == 0)
                warp_amax[threadIdx.x / 32] = amax;
            __syncthreads();
            int w0 = (threadIdx.x / group) * (group / 32);
            for (int w = 0; w < group / 32; w++)
                amax = warp_amax[w0 + w] > amax ? warp_amax[w0 + w] : amax;
        }
        amax = qd_ftz(amax);
        if (tile == blockIdx.x)
            __syncthreads(); /* cta_bins cleared, lut filled (the first tile of every CTA) */
        if (first < n) {
            /* a zero block gives inf here and NaN codes below: bitsandbytes does the same */
            float inv = qd_rcp_approx(amax);
            uint32_t word = 0;
            for (int j = 0; j < 8; j++) {
                /* scaled(x, inv) = ftz(ftz(x) * inv). The input flush is a select; the product's
                 * flush changes no code: NF4's thresholds are far from 0, FP4's rank neither, and
                 * its sign bit is set exactly when the flushed product is < 0, i.e. <= -2^-126 */
                float xf = qd_absf(v[j]) < 0x1p-126f ? copysignf(0.0f, v[j]) : v[j];
                float p = xf * inv;
                uint32_t c = nf4 ? qd_nf4_code_lut(p, lut) : qd_fp4_code_lut(p, p <= -0x1p-126f, lut);
                word |= c << (4 * (j ^ 1)); /* byte k: element 2k in the high nibble */
            }
            if (first + 8 <= n)
                ((uint32_t *)data)[t] = word;
            else
                for (int k = 0; 2 * k < n - first; k++)
                    data[4 * t + k] = (uint8_t)(word >> (8 * k));
            if (threadIdx.x % group == 0) {
                absmax[first / (8 * (int64_t)group)] = amax;
                if (bins) {
                    uint32_t b;
                    uint64_t a;
                    qd_sum_bin(amax, &b, &a);
                    if (b == 255)
                        atomicOr(&cta_bins[255], (unsigned long long)a);
                    else
                        atomicAdd(&cta_bins[b], (unsigned long long)a);
                }
            }
        }
    }
    if (bins) {
        __syncthreads();
        for (int i = threadIdx.x; i < QD_SUM_BINS; i += blockDim.x)
            if (cta_bins[i])
                i == 255 ? atomicOr(&bins[i], cta_bins[i]) : atomicAdd(&bins[i], cta_bins[i]);
    }
}

/* quantize_blockwise(absmax - offset, blocksize=256): one warp per group of 256 absmax. */
__global__ void bnb_double_quant_kernel(const float *absmax, int64_t nblocks, float offset, uint8_t *codes,
                                        float *nested_absmax)
{
    __shared__ float map[256]; /* the binary search indexes it per lane: shared, not constant */
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
        map[i] = dynamic_map[i];
    __syncthreads();
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
        codes[base + i] = qd_dynamic_code(map, scaled(absmax[base + i] - offset, inv));
}

/* One thread per 8 elements: 4 bytes of codes in, 16 bytes (bf16/f16) or 32 (f32) out; the
 * code values and the nested map from shared memory (lanes index them independently). */
template <int DT>
__global__ void bnb_dequantize_kernel(int nf4, const uint8_t *data, int64_t n, int64_t blocksize,
                                      const float *absmax, const uint8_t *codes, const float *nested_absmax,
                                      const float *nested_map, float offset, void *y)
{
    __shared__ float value[16], map[256];
    if (threadIdx.x < 16) {
        int c = threadIdx.x;
        value[c] = nf4 ? nf4_values[c] : fp4_magnitudes[c & 7] * (1.0f - 2.0f * (float)(c >> 3));
    }
    if (nested_map)
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            map[i] = nested_map[i];
    __syncthreads();
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, first = 8 * t;
    if (first >= n)
        return;
    int64_t b = first / blocksize; /* blocksize is a multiple of 8: one block per thread */
    float am = absmax ? absmax[b] : qd_ftz(map[codes[b]] * nested_absmax[b / BNB_NESTED_BLOCK]) + offset;
    float v[8];
    if (first + 8 <= n) {
        uint32_t word = ((const uint32_t *)data)[t];
        /* every nonzero code value is >= 0.005 in magnitude: with |absmax| >= 2^-118 no product
         * is subnormal and the flush is a no-op (NaN/Inf pass either way) */
        bool normal = qd_absf(am) >= 0x1p-118f;
        for (int j = 0; j < 8; j++) { /* byte k: element 2k in the high nibble */
            float p = value[(word >> (8 * (j / 2) + ((j & 1) ? 0 : 4))) & 15] * am;
            v[j] = normal ? p : qd_ftz(p);
        }
        qd_store_block<DT, 8>(y, first, v);
    } else {
        for (int64_t i = first; i < n; i++) {
            uint8_t byte = data[i / 2];
            qd_store<DT>(y, i, qd_ftz(value[(i & 1) ? (byte & 15) : (byte >> 4)] * am));
        }
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
    struct qd_scratch *d = qd_scratch_dev(), *h = qd_scratch_host();
    unsigned long long *bins = p->double_quant && !p->has_offset ? d->bins : NULL;
    if (bins)
        CUDA_CHECK(cudaMemsetAsync(bins, 0, sizeof d->bins, qd_stream()));
    int group = (int)(bs / 8), threads = group > 256 ? group : 256;
    int64_t threads_needed = (n + 7) / 8;
    unsigned grid = qd_grid(threads_needed, threads), cap = 8 * (unsigned)qd_cuda_sm_count();
    if (bins && grid > cap) /* few CTAs walking many tiles: few global bin atomics */
        grid = cap;
    QD_DTYPE_SWITCH(in->dtype, DT,
                    bnb_quantize_kernel<DT><<<grid, threads, 0, qd_stream()>>>(
                        nf4, in->data, n, group, (uint8_t *)out[0], absmax, bins, bad));
    CUDA_LAUNCHED();
    if (bins) /* 2 KiB of bins back; the one sync below (or here) covers the flag too */
        CUDA_CHECK(cudaMemcpyAsync(h->bins, bins, sizeof h->bins, cudaMemcpyDeviceToHost, qd_stream()));
    if ((s = qd_cuda_bad_end(bad)) != QD_OK) {
        if (p->double_quant)
            cudaFreeAsync(absmax, qd_stream());
        return s;
    }
    const unsigned warps = 8;
    float *quant_map = (float *)out[p->double_quant ? 4 : 2];
    if (p->double_quant) {
        if (bins) { /* the exact mean, as the CPU takes it (any order gives the same bits) */
            if (!bad)
                CUDA_CHECK(cudaStreamSynchronize(qd_stream()));
            p->offset = (float)(qd_sum_bins_total((const uint64_t *)h->bins) / (double)nblocks);
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
                    bnb_dequantize_kernel<DT><<<qd_grid((n + 7) / 8, 256), 256, 0, qd_stream()>>>(
                        f->code == 0, (const uint8_t *)in[0], n, p->blocksize,
                        dq ? NULL : (const float *)in[1], dq ? (const uint8_t *)in[1] : NULL,
                        dq ? (const float *)in[2] : NULL, dq ? (const float *)in[3] : NULL, p->offset, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
