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

#define BNB_THREADS 256
#define BNB_PER_THREAD 16 /* elements per thread: bitsandbytes blocks (>= 32) span 2+ threads */

/* p = ftz(ftz(x) * inv), the scaled() of the CPU backend, in one instruction. */
__device__ __forceinline__ float scaled_ftz(float x, float inv)
{
    float p;
    asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(p) : "f"(x), "f"(inv));
    return p;
}

/* 16 elements from `first` (zero beyond n: bitsandbytes pads the last block with 0.0) and the
 * largest |x| as f32 bits: above 0x7f800000 exactly when one is NaN, equal when the largest is
 * Inf. For 16-bit inputs the magnitudes are compared two at a time on the raw halves. */
template <int DT>
__device__ __forceinline__ uint32_t bnb_load16(const void *x, int64_t first, int64_t n, float *v)
{
    uint32_t top = 0;
    if (DT != QD_F32 && first + BNB_PER_THREAD <= n) {
        const uint4 *p = (const uint4 *)((const uint16_t *)x + first);
        uint4 q[2] = {__ldg(p), __ldg(p + 1)};
        uint32_t w[8] = {q[0].x, q[0].y, q[0].z, q[0].w, q[1].x, q[1].y, q[1].z, q[1].w}, m = 0;
#pragma unroll
        for (int h = 0; h < 8; h++) {
            m = __vmaxu2(m, w[h] & 0x7fff7fffu);
            uint16_t lo = (uint16_t)(w[h] & 0xffff), hi = (uint16_t)(w[h] >> 16);
            v[2 * h] = DT == QD_F16 ? qd_f16_to_f32(lo) : qd_bf16_to_f32(lo);
            v[2 * h + 1] = DT == QD_F16 ? qd_f16_to_f32(hi) : qd_bf16_to_f32(hi);
        }
        uint32_t m16 = max(m & 0xffffu, m >> 16);
        return DT == QD_F16 ? (m16 >= 0x7c00u ? 0x7f800000u + (m16 - 0x7c00u) : qd_f32_bits(qd_f16_to_f32((uint16_t)m16)))
                            : m16 << 16;
    }
    if (first + BNB_PER_THREAD <= n)
        qd_load_block<DT, BNB_PER_THREAD>(x, first, v);
    else
        for (int j = 0; j < BNB_PER_THREAD; j++)
            v[j] = first + j < n ? qd_load<DT>(x, first + j) : 0.0f;
#pragma unroll
    for (int j = 0; j < BNB_PER_THREAD; j++)
        top = max(top, qd_f32_bits(v[j]) & 0x7fffffffu);
    return top;
}

/* One thread per 16 consecutive elements (two 16-byte loads of bf16/f16; 8 bytes of codes
 * out, coalesced across the warp); a bitsandbytes block of B elements is a group of B/16
 * consecutive threads, its absmax taken by shuffles (and through shared memory when the group
 * spans warps). The grid is sized to fill the GPU once and each CTA walks many tiles. With
 * `bins`, each block's absmax also goes into the exact sum of the double-quant offset
 * (kernels/bnb4.h): a group leader adds its blocks into a register window of 8 neighbouring
 * bins (a block of finite data rarely falls outside the window of the leader's first block),
 * the rest into per-CTA bins, which reach the global ones once per CTA. */
template <int DT, int NF4>
__global__ void __launch_bounds__(BNB_THREADS) bnb_quantize_kernel(const void *x, int64_t n, int group, int log_bs,
                                                                   uint8_t *data, float *absmax,
                                                                   unsigned long long *bins, unsigned long long *bad)
{
    __shared__ float2 lut[QD_BNB_LUT];
    __shared__ float warp_amax[BNB_THREADS / 32];
    __shared__ unsigned long long cta_bins[QD_SUM_BINS];
    qd_bnb_lut_init(NF4, lut);
    if (bins)
        for (int i = threadIdx.x; i < QD_SUM_BINS; i += blockDim.x)
            cta_bins[i] = 0;
    __syncthreads();
    uint32_t window = 0; /* the leader's lowest windowed bin (0: none yet) and their sum */
    unsigned long long window_sum = 0;
    int64_t tiles = (n + BNB_PER_THREAD * BNB_THREADS - 1) / (BNB_PER_THREAD * BNB_THREADS);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int64_t t = tile * BNB_THREADS + threadIdx.x, first = BNB_PER_THREAD * t;
        float v[BNB_PER_THREAD];
        uint32_t top = bnb_load16<DT>(x, first, n, v);
        bool finite = top < 0x7f800000u;
        float amax = qd_bits_f32(top);
        if (!finite) { /* rare: the max ignores NaN, as bitsandbytes' does; find the first bad */
            amax = 0.0f;
            for (int j = 0; j < BNB_PER_THREAD; j++) {
                float a = qd_absf(v[j]);
                amax = a > amax ? a : amax;
            }
            if (bad)
                for (int j = 0; j < BNB_PER_THREAD; j++)
                    if (!qd_isfinite(v[j])) {
                        atomicMin(bad, (unsigned long long)(first + j));
                        break;
                    }
        }
        for (int o = 1; o < group && o < 32; o <<= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o)); /* no NaN here */
        if (group > 32) { /* the group spans group/32 warps of this CTA */
            __syncthreads(); /* warp_amax of the previous tile read */
            if (threadIdx.x % 32 == 0)
                warp_amax[threadIdx.x / 32] = amax;
            __syncthreads();
            int w0 = (threadIdx.x / group) * (group / 32);
            for (int w = 0; w < group / 32; w++)
                amax = fmaxf(amax, warp_amax[w0 + w]);
        }
        amax = qd_ftz(amax);
        if (first >= n)
            continue;
        /* a zero block gives inf here and NaN codes below: bitsandbytes does the same */
        float inv = qd_rcp_approx(amax);
        uint32_t w[2] = {0, 0};
        if (finite && amax >= 0x1p-126f) { /* every scaled value in the table's domain */
            uint32_t base = qd_bnb_lut_base(lut);
#pragma unroll
            for (int j = 0; j < BNB_PER_THREAD; j++) /* byte k: element 2k in the high nibble */
                qd_bnb_code_add<NF4>(&w[j / 8], 4 * ((j & 7) ^ 1), scaled_ftz(v[j], inv), base);
        } else {
            for (int j = 0; j < BNB_PER_THREAD; j++)
                w[j / 8] |= qd_bnb_ref(NF4, scaled_ftz(v[j], inv)) << (4 * ((j & 7) ^ 1));
        }
        if (first + BNB_PER_THREAD <= n)
            ((uint2 *)data)[t] = make_uint2(w[0], w[1]);
        else
            for (int k = 0; 2 * k < n - first; k++)
                data[BNB_PER_THREAD / 2 * t + k] = (uint8_t)(w[k / 4] >> (8 * (k % 4)));
        if ((threadIdx.x & (group - 1)) == 0) {
            absmax[first >> log_bs] = amax;
            if (bins) {
                uint32_t b;
                uint64_t a;
                qd_sum_bin(amax, &b, &a);
                if (window == 0 && b != 255)
                    window = b > 4 ? b - 4 : 1;
                if (b == 255)
                    atomicOr(&cta_bins[255], (unsigned long long)a);
                else if (b - window < 8) /* a < 2^24: the window's sum cannot overflow */
                    window_sum += (unsigned long long)a << (b - window);
                else
                    atomicAdd(&cta_bins[b], (unsigned long long)a);
            }
        }
    }
    if (bins) {
        if (window_sum)
            atomicAdd(&cta_bins[window], window_sum);
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

/* Nibble s/4 of w times 4: a byte offset into a table of floats (s is a constant). */
__device__ __forceinline__ uint32_t nibble_x4(uint32_t w, int s) { return (s >= 2 ? w >> (s - 2) : w << (2 - s)) & 0x3c; }

#define BNB_UNITS 4 /* units of 8 elements per thread, BNB_THREADS apart: loads in flight */

/* Each thread takes BNB_UNITS units of 8 elements (4 bytes of codes in, 16 bytes of bf16/f16
 * or 32 of f32 out, coalesced across the warp), issuing all their loads before any math. The
 * code values and the nested map come from shared memory (lanes index them independently);
 * a nibble is extracted already scaled to a table offset. */
template <int DT>
__global__ void __launch_bounds__(BNB_THREADS) bnb_dequantize_kernel(int nf4, const uint8_t *data, int64_t n, int log_bs,
                                                                     const float *absmax, const uint8_t *codes,
                                                                     const float *nested_absmax, const float *nested_map,
                                                                     float offset, void *y)
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
    int64_t unit0 = blockIdx.x * (int64_t)(BNB_THREADS * BNB_UNITS) + threadIdx.x;
    uint32_t word[BNB_UNITS];
    float am[BNB_UNITS];
    uint32_t code[BNB_UNITS];
    float nested[BNB_UNITS];
#pragma unroll
    for (int k = 0; k < BNB_UNITS; k++) {
        int64_t first = 8 * (unit0 + k * BNB_THREADS), b = first >> log_bs;
        if (first + 8 <= n)
            word[k] = ((const uint32_t *)data)[unit0 + k * BNB_THREADS];
        if (first < n) {
            if (absmax) {
                am[k] = absmax[b];
            } else {
                code[k] = codes[b];
                nested[k] = nested_absmax[b / BNB_NESTED_BLOCK];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < BNB_UNITS; k++) {
        int64_t first = 8 * (unit0 + k * BNB_THREADS);
        if (first >= n)
            break;
        float a = absmax ? am[k] : qd_ftz(map[code[k]] * nested[k]) + offset;
        float v[8];
        if (first + 8 <= n) {
            /* every nonzero code value is >= 0.005 in magnitude: with |absmax| >= 2^-118 no
             * product is subnormal and the flush is a no-op (NaN/Inf pass either way) */
            const char *base = (const char *)value;
            if (qd_absf(a) >= 0x1p-118f) {
#pragma unroll
                for (int j = 0; j < 8; j++) /* byte j/2: element j even in the high nibble */
                    v[j] = *(const float *)(base + nibble_x4(word[k], 8 * (j / 2) + ((j & 1) ? 0 : 4))) * a;
            } else {
                for (int j = 0; j < 8; j++)
                    v[j] = qd_ftz(value[(word[k] >> (8 * (j / 2) + ((j & 1) ? 0 : 4))) & 15] * a);
            }
            qd_store_block<DT, 8>(y, first, v);
        } else {
            for (int64_t i = first; i < n; i++) {
                uint8_t byte = data[i / 2];
                qd_store<DT>(y, i, qd_ftz(value[(i & 1) ? (byte & 15) : (byte >> 4)] * a));
            }
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
    int group = (int)(bs / BNB_PER_THREAD), log_bs = 0; /* bs: a power of two, 32..4096 */
    while ((1 << log_bs) < bs)
        log_bs++;
    int64_t tiles = (n + BNB_PER_THREAD * BNB_THREADS - 1) / (BNB_PER_THREAD * BNB_THREADS);
    QD_BOOL_SWITCH(nf4, NF4, QD_DTYPE_SWITCH(in->dtype, DT, {
        auto kernel = bnb_quantize_kernel<DT, NF4>;
        kernel<<<qd_resident_grid(kernel, BNB_THREADS, tiles), BNB_THREADS, 0, qd_stream()>>>(
            in->data, n, group, log_bs, (uint8_t *)out[0], absmax, bins, bad);
    }));
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
    int dq = p->double_quant, log_bs = 0;
    while ((1 << log_bs) < p->blocksize)
        log_bs++;
    QD_DTYPE_SWITCH(out->dtype, DT,
                    bnb_dequantize_kernel<DT><<<qd_grid((n + 7) / 8, BNB_THREADS * BNB_UNITS), BNB_THREADS, 0, qd_stream()>>>(
                        f->code == 0, (const uint8_t *)in[0], n, log_bs,
                        dq ? NULL : (const float *)in[1], dq ? (const uint8_t *)in[1] : NULL,
                        dq ? (const float *)in[2] : NULL, dq ? (const float *)in[3] : NULL, p->offset, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
