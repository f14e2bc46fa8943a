/* bitsandbytes NF4/FP4 on the GPU, the same bytes as the CPU backend (kernels/cpu/bnb4.c):
 * one thread per 16 elements, a bitsandbytes block per group of threads (absmax by shuffles,
 * then two codes per byte, the first in the high nibble), the double-quant offset as the exact
 * sum of bnb4.h gathered on the way, then the absmax quantized with the 8-bit dynamic map. */
#include "../bnb4.h"
#include "common.cuh"
#include "convert.cuh"
#include "dynamic_code.cuh"

#define BNB_NESTED_BLOCK 256

__constant__ float nf4_values[16] = QD_NF4_VALUES;
__constant__ float fp4_magnitudes[8] = QD_FP4_MAGNITUDES;
__constant__ float dynamic_map[256] = QD_DYNAMIC_MAP;
__constant__ float fp4_type_values[16] = QD_FP4_TYPE_VALUES;

/* The quant_map component (what bitsandbytes' QuantState.code holds), written by thread i < 16
 * of one CTA; FP4's is its type values / 12 (the same division as the CPU's). */
__device__ __forceinline__ void write_quant_map(int nf4, float *quant_map)
{
    if (quant_map && blockIdx.x == 0 && threadIdx.x < 16)
        quant_map[threadIdx.x] = nf4 ? nf4_values[threadIdx.x] : fp4_type_values[threadIdx.x] / 12.0f;
}

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
 * largest |x| as f32 bits (qd_load_block_top). */
template <int DT>
__device__ __forceinline__ uint32_t bnb_load16(const void *x, int64_t first, int64_t n, float *v)
{
    if (first + BNB_PER_THREAD <= n)
        return qd_load_block_top<DT, BNB_PER_THREAD>(x, first, v);
    uint32_t top = 0;
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
__global__ void __launch_bounds__(BNB_THREADS, 6) bnb_quantize_kernel(const void *x, int64_t n, int group, int log_bs,
                                                                   uint8_t *data, float *absmax, float *quant_map,
                                                                   unsigned long long *bins, unsigned long long *bad)
{
    write_quant_map(NF4, quant_map);
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
            qd_note_first_nonfinite<BNB_PER_THREAD>(bad, v, first);
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
#pragma unroll /* (w stays in registers) */
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
    qd_grid_release(); /* this CTA's tiles are done: the next kernel may be scheduled */
    if (bins) {
        if (window_sum)
            atomicAdd(&cta_bins[window], window_sum);
        __syncthreads();
        for (int i = threadIdx.x; i < QD_SUM_BINS; i += blockDim.x)
            if (cta_bins[i])
                i == 255 ? atomicOr(&bins[i], cta_bins[i]) : atomicAdd(&bins[i], cta_bins[i]);
    }
}

/* The double-quant offset from the exact-sum bins, on the device (no round trip to the host
 * between the kernels): the limbs' sums of pieces as the CPU takes them (kernels/bnb4.h), in
 * any order (integers), then one lane carries, rounds and divides by the block count. */
__global__ void bnb_offset_kernel(unsigned long long *bins, int64_t nblocks, float *offset)
{
    __shared__ unsigned long long column[QD_SUM_LIMBS];
    qd_grid_release(); /* the double quant may be scheduled; it waits for this kernel */
    qd_grid_wait();    /* the quantize kernel's bins */
    int lane = threadIdx.x;
    if (lane < QD_SUM_LIMBS)
        column[lane] = 0;
    /* lane l takes bins 8l .. 8l+7 (loads all in flight), adding each bin's three pieces to
     * the limbs they belong to: a lane-per-limb loop over ~96 bins ran ~10 us */
    unsigned long long v[QD_SUM_BINS / 32];
#pragma unroll
    for (int i = 0; i < QD_SUM_BINS / 32; i++)
        v[i] = bins[8 * lane + i];
#pragma unroll
    for (int i = 0; i < QD_SUM_BINS / 32; i++) /* left clean for the next call (no memset there) */
        bins[8 * lane + i] = 0;
    __syncwarp();
#pragma unroll
    for (int i = 0; i < QD_SUM_BINS / 32; i++) {
        int e = 8 * lane + i;
        if (e < 1 || e > 254 || !v[i])
            continue;
        for (int d = 0; d < 3 && (e - 1) / 32 + d < QD_SUM_LIMBS; d++) {
            int k = (e - 1) / 32 + d;
            atomicAdd(&column[k], (unsigned long long)qd_sum_piece(v[i], e, k));
        }
    }
    __syncwarp();
    if (lane == 31) /* (bin 255, the flags, is lane 31's last) */
        *offset = (float)(qd_sum_finish(v[QD_SUM_BINS / 32 - 1], (const uint64_t *)column) / (double)nblocks);
}

/* quantize_blockwise(absmax - offset, blocksize=256): one warp per group of 256 absmax; the
 * offset from the device when computed there. */
__global__ void bnb_double_quant_kernel(const uint2 *table, const float *absmax, int64_t nblocks, const float *offset_dev, float offset,
                                        uint8_t *codes, float *nested_absmax, float *nested_map)
{
    if (blockIdx.x == 0) /* the nested_quant_map component */
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            nested_map[i] = dynamic_map[i];
    qd_grid_wait(); /* the absmax and the offset of the kernels before */
    if (offset_dev)
        offset = *offset_dev;
    int64_t g = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int64_t base = g * BNB_NESTED_BLOCK;
    if (base >= nblocks)
        return;
    int64_t len = nblocks - base < BNB_NESTED_BLOCK ? nblocks - base : BNB_NESTED_BLOCK;
    /* lane l holds the group's values 8l .. 8l+7, loaded as two 16-byte vectors and stored as
     * one 8-byte word when the group is whole (absmax is 1 KiB-aligned per group then) */
    constexpr int PER = BNB_NESTED_BLOCK / 32;
    float v[PER], amax = 0.0f;
    const float *src = absmax + base + PER * lane;
    if (len == BNB_NESTED_BLOCK) {
        float4 p = ((const float4 *)src)[0], q = ((const float4 *)src)[1];
        v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z, v[7] = q.w;
    } else {
#pragma unroll
        for (int k = 0; k < PER; k++)
            v[k] = PER * lane + k < len ? src[k] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        v[k] = PER * lane + k < len ? v[k] - offset : 0.0f; /* beyond the end: 0 (amax ignores it) */
        float a = qd_ftz(qd_absf(v[k]));
        amax = a > amax ? a : amax;
    }
    amax = warp_max(amax);
    if (lane == 0)
        nested_absmax[g] = amax;
    float inv = qd_rcp_approx(amax);
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < PER; k++) /* (the map: rare fallbacks only) */
        w[k / 4] |= (uint32_t)qd_dq_code(scaled(v[k], inv), dynamic_map, table) << (8 * (k % 4));
    uint8_t *dst = codes + base + PER * lane;
    if (len == BNB_NESTED_BLOCK && ((uintptr_t)dst & 7) == 0)
        *(uint2 *)dst = make_uint2(w[0], w[1]);
    else
        for (int k = 0; k < PER && PER * lane + k < len; k++)
            dst[k] = (uint8_t)(w[k / 4] >> (8 * (k % 4)));
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
    float *absmax = (float *)out[1], *quant_map = (float *)out[p->double_quant ? 4 : 2];
    if (p->double_quant)
        CUDA_CHECK(cudaMallocAsync((void **)&absmax, (size_t)nblocks * sizeof(float), qd_stream()));
    struct qd_scratch *d = qd_scratch_dev();
    unsigned long long *bins = p->double_quant && !p->has_offset ? d->bins : NULL;
    struct qd_cuda_ctx *ctx = qd_cuda_ctx_get();
    const uint2 *table = p->double_quant ? qd_cuda_dq_table() : NULL; /* (built once, before the launches) */
    if (bins) {
        if (ctx->bins_dirty) /* the first call, or one that stopped before the offset kernel */
            CUDA_CHECK(cudaMemsetAsync(bins, 0, sizeof d->bins, qd_stream()));
        ctx->bins_dirty = 1; /* until the offset kernel (which zeroes them) is queued */
    }
    int group = (int)(bs / BNB_PER_THREAD), log_bs = 0; /* bs: a power of two, 32..4096 */
    while ((1 << log_bs) < bs)
        log_bs++;
    int64_t tiles = (n + BNB_PER_THREAD * BNB_THREADS - 1) / (BNB_PER_THREAD * BNB_THREADS);
    QD_BOOL_SWITCH(nf4, NF4, QD_DTYPE_SWITCH(in->dtype, DT, {
        auto kernel = bnb_quantize_kernel<DT, NF4>;
        kernel<<<qd_resident_grid(kernel, BNB_THREADS, tiles), BNB_THREADS, 0, qd_stream()>>>(
            in->data, n, group, log_bs, (uint8_t *)out[0], absmax, quant_map, bins, bad);
    }));
    CUDA_LAUNCHED();
    if (p->double_quant) {
        float *offset_dev = NULL;
        if (bins) { /* the exact mean, as the CPU takes it (any order gives the same bits) */
            offset_dev = &d->offset;
            CUDA_CHECK(qd_launch_dependent(bnb_offset_kernel, 1, 32, bins, nblocks, offset_dev));
            ctx->bins_dirty = 0;
        }
        const unsigned warps = 8;
        int64_t groups = (nblocks + BNB_NESTED_BLOCK - 1) / BNB_NESTED_BLOCK;
        CUDA_CHECK(qd_launch_dependent(bnb_double_quant_kernel, qd_grid(groups, warps), 32 * warps, table,
                                       absmax, nblocks, offset_dev, p->offset, (uint8_t *)out[1], (float *)out[2],
                                       (float *)out[3]));
        CUDA_CHECK(cudaFreeAsync(absmax, qd_stream()));
    }
    ctx->pending_offset = bins != NULL; /* it comes back beside the flag; qd_cuda_finish sets p's */
    return qd_cuda_bad_end(bad);
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
