/* What every CUDA family file shares: error checking, the thread's context, element loads and
 * stores for f32/f16/bf16 (16-byte vector accesses where the block allows), the non-finite
 * flag, and whole-tensor range reductions. */
#ifndef QD_CUDA_COMMON_CUH
#define QD_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../fp.h"
#include "cuda.h"

/* Every CUDA call goes through this: a failure becomes QD_EDEVICE with file:line remembered. */
void qd_cuda_note_error(cudaError_t e, const char *file, int line);
#define CUDA_CHECK(call)                                                                        \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            qd_cuda_note_error(e_, __FILE__, __LINE__);                                         \
            return e_ == cudaErrorMemoryAllocation ? QD_ENOMEM : QD_EDEVICE;                    \
        }                                                                                       \
    } while (0)
#define CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())
/* The default arm of every *_SWITCH dispatch: a code this backend has no kernel for (the registry
 * and the backend disagree) is refused with file:line, never run as another kernel. */
#define QD_SWITCH_UNKNOWN() CUDA_CHECK(cudaErrorInvalidValue)

static inline cudaStream_t qd_stream(void) { return (cudaStream_t)qd_cuda_ctx_get()->stream; }

/* Layout of the scratch buffer. */
struct qd_scratch {
    unsigned long long bad;       /* first non-finite index, ~0 when none */
    float offset;                 /* bnb4's double-quant offset, computed on the device */
    float scale;                  /* nvfp4's per-tensor scale computed on the device (bad, offset and
                                     it come back to the host in one copy) */
    float range[3];               /* amax, min, max of the whole tensor */
    unsigned int blocks_done;     /* grid-wide reduction ticket */
    unsigned int amax_bits;       /* largest |x| of a tensor as f32 bits, folded by atomicMax (fp8) */
    float partial[3 * 1024];      /* per-CTA partial ranges */
    unsigned long long bins[256]; /* exact-sum bins of the bnb double-quant offset (bnb4.h) */
    float consts[8];              /* per-call constants a kernel computed for the next (nvfp4) */
};

static inline struct qd_scratch *qd_scratch_dev(void) { return (struct qd_scratch *)qd_cuda_ctx_get()->scratch; }
static inline struct qd_scratch *qd_scratch_host(void) { return (struct qd_scratch *)qd_cuda_ctx_get()->host_scratch; }

/* Loads element i of a tensor of dtype DT as f32. */
template <int DT> __device__ __forceinline__ float qd_load(const void *x, int64_t i)
{
    if (DT == QD_F32)
        return ((const float *)x)[i];
    if (DT == QD_F16)
        return qd_f16_to_f32(((const uint16_t *)x)[i]);
    return qd_bf16_to_f32(((const uint16_t *)x)[i]);
}

/* Loads N consecutive elements starting at `first` (N * size a multiple of 16 bytes and the
 * start 16-byte aligned, as every block start is) with 16-byte loads. */
template <int DT, int N> __device__ __forceinline__ void qd_load_block(const void *x, int64_t first, float *v)
{
    if (DT == QD_F32) {
        const float4 *p = (const float4 *)((const float *)x + first);
#pragma unroll
        for (int k = 0; k < N / 4; k++) {
            float4 q = __ldg(p + k);
            v[4 * k] = q.x, v[4 * k + 1] = q.y, v[4 * k + 2] = q.z, v[4 * k + 3] = q.w;
        }
    } else {
        const uint4 *p = (const uint4 *)((const uint16_t *)x + first);
#pragma unroll
        for (int k = 0; k < N / 8; k++) {
            uint4 q = __ldg(p + k);
            uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int h = 0; h < 4; h++) {
                uint16_t lo = (uint16_t)(w[h] & 0xffff), hi = (uint16_t)(w[h] >> 16);
                v[8 * k + 2 * h] = DT == QD_F16 ? qd_f16_to_f32(lo) : qd_bf16_to_f32(lo);
                v[8 * k + 2 * h + 1] = DT == QD_F16 ? qd_f16_to_f32(hi) : qd_bf16_to_f32(hi);
            }
        }
    }
}

/* The larger of two packed f16/bf16 magnitudes (sign bits clear) as f32 bits, keeping the
 * order NaN above Inf above finite (an f16 NaN maps above 0x7f800000, not to a float NaN). */
template <int DT> __device__ __forceinline__ uint32_t qd_half_pair_top(uint32_t m)
{
    uint32_t t16 = max(m & 0xffffu, m >> 16);
    if (DT == QD_BF16)
        return t16 << 16;
    return t16 >= 0x7c00u ? 0x7f800000u + (t16 - 0x7c00u) : qd_f32_bits(qd_f16_to_f32((uint16_t)t16));
}

/* qd_load_block, also returning the largest |x| as f32 bits: above 0x7f800000 exactly when
 * one is NaN, equal when the largest is Inf. 16-bit inputs compare their raw halves two at a
 * time (no float compares); the f32 is exact (f16: its conversion). */
template <int DT, int N> __device__ __forceinline__ uint32_t qd_load_block_top(const void *x, int64_t first, float *v)
{
    uint32_t top = 0;
    if (DT == QD_F32) {
        qd_load_block<DT, N>(x, first, v);
#pragma unroll
        for (int j = 0; j < N; j++)
            top = max(top, qd_f32_bits(v[j]) & 0x7fffffffu);
        return top;
    }
    const uint4 *p = (const uint4 *)((const uint16_t *)x + first);
#pragma unroll
    for (int k = 0; k < N / 8; k++) {
        uint4 q = __ldg(p + k);
        uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int h = 0; h < 4; h++) {
            top = __vmaxu2(top, w[h] & 0x7fff7fffu);
            uint16_t lo = (uint16_t)(w[h] & 0xffff), hi = (uint16_t)(w[h] >> 16);
            v[8 * k + 2 * h] = DT == QD_F16 ? qd_f16_to_f32(lo) : qd_bf16_to_f32(lo);
            v[8 * k + 2 * h + 1] = DT == QD_F16 ? qd_f16_to_f32(hi) : qd_bf16_to_f32(hi);
        }
    }
    return qd_half_pair_top<DT>(top);
}

/* Min (MAX = 0) or max of two packed f16/bf16 pairs, NaN ignored (the other input returned). */
template <int DT, int MAX> __device__ __forceinline__ uint32_t qd_pair_fold(uint32_t a, uint32_t b)
{
    uint32_t r;
    if (DT == QD_F16) {
        __half2 x = *(__half2 *)&a, y = *(__half2 *)&b, m = MAX ? __hmax2(x, y) : __hmin2(x, y);
        r = *(uint32_t *)&m;
    } else {
        __nv_bfloat162 x = *(__nv_bfloat162 *)&a, y = *(__nv_bfloat162 *)&b, m = MAX ? __hmax2(x, y) : __hmin2(x, y);
        r = *(uint32_t *)&m;
    }
    return r;
}
template <int DT> __device__ __forceinline__ uint32_t qd_pair_min(uint32_t a, uint32_t b) { return qd_pair_fold<DT, 0>(a, b); }
template <int DT> __device__ __forceinline__ uint32_t qd_pair_max(uint32_t a, uint32_t b) { return qd_pair_fold<DT, 1>(a, b); }

/* The f16/bf16 value in half `hi` (0: low, 1: high) of a packed pair, as f32. */
template <int DT> __device__ __forceinline__ float qd_half_f32(uint32_t w, int hi)
{
    uint16_t h = (uint16_t)(hi ? w >> 16 : w & 0xffff);
    return DT == QD_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
}

template <int DT> __device__ __forceinline__ void qd_store(void *y, int64_t i, float v)
{
    if (DT == QD_F32)
        ((float *)y)[i] = v;
    else if (DT == QD_F16)
        ((uint16_t *)y)[i] = qd_f32_to_f16(v);
    else
        ((uint16_t *)y)[i] = qd_f32_to_bf16(v);
}

/* Two values as a f16/bf16 pair (a low, b high), rounded to nearest even. sm_80+ has
 * cvt.rn.{bf16x2,f16x2}.f32, which equals qd_f32_to_bf16/qd_f32_to_f16 on every non-NaN input
 * (checked on all 2^32 inputs by qd_cuda_conversion_mismatches); a NaN takes the software
 * rule (sign and payload kept), called, not inlined, so the common path stays short. */
template <int DT> __device__ __noinline__ uint32_t qd_pack2_soft(float a, float b)
{
    return DT == QD_F16 ? (qd_f32_to_f16(a) | (uint32_t)qd_f32_to_f16(b) << 16)
                        : (qd_f32_to_bf16(a) | (uint32_t)qd_f32_to_bf16(b) << 16);
}

template <int DT> __device__ __forceinline__ uint32_t qd_pack2(float a, float b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t r;
    if (DT == QD_F16)
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    else
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    if (a != a || b != b)
        r = qd_pack2_soft<DT>(a, b);
    return r;
#else
    return qd_pack2_soft<DT>(a, b);
#endif
}

/* Chunk c (16 bytes: 4 f32 or 8 f16/bf16 values) of v, converted to DT. */
template <int DT> __device__ __forceinline__ uint4 qd_pack_chunk(const float *v, int c)
{
    uint32_t w[4];
#pragma unroll
    for (int h = 0; h < 4; h++)
        w[h] = DT == QD_F32 ? qd_f32_bits(v[4 * c + h]) : qd_pack2<DT>(v[8 * c + 2 * h], v[8 * c + 2 * h + 1]);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int DT, int N> __device__ __forceinline__ void qd_store_block(void *y, int64_t first, const float *v)
{
    uint4 *p = (uint4 *)((uint8_t *)y + first * (DT == QD_F32 ? 4 : 2));
#pragma unroll
    for (int c = 0; c < N * (DT == QD_F32 ? 4 : 2) / 16; c++)
        p[c] = qd_pack_chunk<DT>(v, c);
}

/* A small integer (|d| < 2^22) as f32 with two ALU operations instead of the conversion unit:
 * the magic 1.5 * 2^23 (exact). */
__device__ __forceinline__ float qd_small_int_f32(int d) { return __int_as_float(0x4B400000 + d) - 12582912.0f; }

/* The IEEE quotient w / s through y = 1/s with one correction from the exact residual (the
 * first step of qd_quotient, below), enough where w and s are both f16 or both bf16 values (11
 * and 8 significant bits at most): w / s is then either exact in f32 or at least 2^-36 |w / s|
 * from any midpoint of two f32 neighbours (w - m s, for a midpoint m, is a non-zero multiple
 * of m's half-ulp times s's ulp, and s has at most 11 bits), while after one correction q + r y
 * lies within about 2^-45 |w / s| of it: rounding it gives the correctly rounded quotient.
 * Under qd_quotient's conditions (the residual exact); a zero w gives +0 (the correction adds
 * -0 to +0); a bf16 |w| below 2^-90 keeps its sign and stays far below 1/2 while |w / s| >=
 * 2^-140. Checked against the division on every pair of f16 and of bf16 values in that range
 * (elems 12, 13 of qd_cuda_conversion_mismatches). */
__device__ __forceinline__ float qd_quotient_short(float w, float s, float y)
{
    const float q = w * y;
    return __fmaf_rn(__fmaf_rn(-q, s, w), y, q);
}

/* The IEEE quotient w / s (round to nearest) for a divisor used many times: y = 1/s rounded
 * once, then q = w * y and two corrections (qd_quotient_short's, then one more) from the exact
 * residual w - q * s (fused multiply-adds). After the first, q is within an ulp of w / s; from there one more is the
 * correctly rounded quotient (Markstein's theorem), provided nothing over- or underflows,
 * the residual included: for |w| >= 2^-90 and |w / s| within [2^-100, 2^100] (callers only
 * round quotients of at most 41 to integers, and below 2^-90 / s they are far below 1/2).
 * Checked against the division on 2^32 (w, s) pairs (elem 11 of qd_cuda_conversion_mismatches). */
__device__ __forceinline__ float qd_quotient(float w, float s, float y)
{
    const float q = qd_quotient_short(w, s, y);
    return __fmaf_rn(__fmaf_rn(-q, s, w), y, q);
}

/* Records element index i as non-finite when v is (the smallest such index wins). */
__device__ __forceinline__ void qd_note_nonfinite(unsigned long long *bad, float v, int64_t i)
{
    if (bad && !qd_isfinite(v))
        atomicMin(bad, (unsigned long long)i);
}

/* 1 when any of the N values is NaN or infinite: one compare each, no branch. */
template <int N> __device__ __forceinline__ bool qd_any_nonfinite(const float *v)
{
    bool any = false;
#pragma unroll
    for (int j = 0; j < N; j++)
        any |= !(qd_absf(v[j]) <= 3.40282347e38f);
    return any;
}

/* Records the first non-finite of N values (one is known to be) when bad is given. */
template <int N> __device__ __forceinline__ void qd_note_first_nonfinite(unsigned long long *bad, const float *v, int64_t first)
{
    if (bad)
        for (int j = 0; j < N; j++)
            if (!qd_isfinite(v[j])) {
                atomicMin(bad, (unsigned long long)(first + j));
                break;
            }
}

/* The block-wise non-finite check: one branch per block; the first bad element's index is
 * recorded (the smallest index wins across the grid). Returns whether the block has one. */
template <int N> __device__ __forceinline__ bool qd_check_block(unsigned long long *bad, const float *v, int64_t first)
{
    if (!qd_any_nonfinite<N>(v))
        return false;
    qd_note_first_nonfinite<N>(bad, v, first);
    return true;
}

/* amax, min and max of some values, folded as qd_cpu_minmax does (order-free for finite values). */
struct qd_range {
    float amax, lo, hi;
};

__device__ __forceinline__ struct qd_range qd_range_empty(void)
{
    return {0.0f, 3.40282347e38f, -3.40282347e38f};
}

__device__ __forceinline__ void qd_range_add(struct qd_range *r, float v)
{
    float a = qd_absf(v);
    r->amax = a > r->amax ? a : r->amax;
    r->lo = v < r->lo ? v : r->lo;
    r->hi = v > r->hi ? v : r->hi;
}

__device__ __forceinline__ void qd_range_merge(struct qd_range *r, struct qd_range o)
{
    r->amax = o.amax > r->amax ? o.amax : r->amax;
    r->lo = o.lo < r->lo ? o.lo : r->lo;
    r->hi = o.hi > r->hi ? o.hi : r->hi;
}

/* The range over the 32 lanes of a warp, in every lane. */
__device__ __forceinline__ struct qd_range qd_range_warp(struct qd_range r)
{
    for (int o = 16; o; o >>= 1)
        qd_range_merge(&r, {__shfl_xor_sync(0xffffffffu, r.amax, o), __shfl_xor_sync(0xffffffffu, r.lo, o),
                            __shfl_xor_sync(0xffffffffu, r.hi, o)});
    return r;
}

/* Dispatches a templated launch on a runtime dtype. */
#define QD_DTYPE_SWITCH(dt, DT, ...)                                                            \
    switch (dt) {                                                                               \
    case QD_F32: { constexpr int DT = QD_F32; __VA_ARGS__; } break;                             \
    case QD_F16: { constexpr int DT = QD_F16; __VA_ARGS__; } break;                             \
    case QD_BF16: { constexpr int DT = QD_BF16; __VA_ARGS__; } break;                           \
    default: QD_SWITCH_UNKNOWN();                                                               \
    }

/* Dispatches on a runtime flag with a compile-time constant. */
#define QD_BOOL_SWITCH(flag, B, ...)                                                            \
    if (flag) {                                                                                 \
        constexpr int B = 1;                                                                    \
        __VA_ARGS__;                                                                            \
    } else {                                                                                    \
        constexpr int B = 0;                                                                    \
        __VA_ARGS__;                                                                            \
    }

/* The CTA of the dequantize kernels that run a thread per 8 values (the IQ types): a thread per
 * 256-value super-block, its values in local memory and stored at a 512-byte stride, ran at 7 %
 * of the copy's bandwidth at 16384^2 (measured: the git history of docs/BENCHMARKS.md). */
#define QD_EIGHT_THREADS 256

static inline unsigned qd_grid(int64_t items, int threads)
{
    int64_t g = (items + threads - 1) / threads;
    return (unsigned)(g < 1 ? 1 : g);
}

/* Clears the non-finite flag; returns the device pointer to pass to kernels (NULL when the
 * check is off). */
enum qd_status qd_cuda_bad_begin(int check, unsigned long long **flag);
/* Sends the flag (and the device's offset, when ctx->pending_offset) to the host mirror in
 * stream order, without waiting; qd_cuda_finish reads them once the stream has run. */
enum qd_status qd_cuda_bad_end(unsigned long long *flag);

/* The importance vector of a quantize (host memory in p) copied to new device memory in stream
 * order (*dev NULL when p has none); the caller frees it with cudaFreeAsync after its kernels.
 * kernels/cuda/imatrix.cu. */
enum qd_status qd_cuda_importance(const struct qd_params *p, float **dev);
/* The rows sharing one vector when p's importance holds several, else 0. */
int64_t qd_cuda_importance_matrix_rows(const struct qd_params *p, const struct qd_tensor *in);
/* The weighted searches (imatrix.cu) the ggml and kquant entry points hand a quantize with an
 * importance to. */
enum qd_status qd_cuda_ggml_importance_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                struct qd_params *p, void *const *out);
enum qd_status qd_cuda_kquant_importance_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                  struct qd_params *p, void *const *out);

/* Unsigned 32-bit division by a divisor fixed for a kernel: a multiply-high, an add and a
 * shift (the round-up method of Granlund and Montgomery, a 33-bit multiplier whose top bit is
 * the add) where a divide is a dozen instructions. Exact for every n and d below 2^32. */
struct qd_udiv {
    uint32_t m, l;
};

static inline qd_udiv qd_udiv_make(uint32_t d)
{
    if (d == 0) /* (an empty tensor's: never divided by) */
        return {0, 0};
    uint32_t l = 0;
    while (l < 32 && ((uint64_t)1 << l) < d)
        l++;
    return {(uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << l) - d)) / d + 1), l};
}

__device__ __forceinline__ uint32_t qd_udiv_do(uint32_t n, qd_udiv u)
{
    return (uint32_t)(((uint64_t)__umulhi(n, u.m) + n) >> u.l);
}

/* Multiprocessors of the current device (1 when it cannot be read). */
int qd_cuda_sm_count(void);

/* A grid of at most `tiles` CTAs that all fit on the GPU at once (kernels that walk tiles in
 * a loop): no second, partial wave. */
template <class K> static inline unsigned qd_resident_grid(K kernel, int threads, int64_t tiles)
{
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess || per_sm < 1)
        per_sm = 1;
    int64_t cap = (int64_t)per_sm * qd_cuda_sm_count();
    return (unsigned)(tiles < 1 ? 1 : (tiles < cap ? tiles : cap));
}

/* Programmatic dependent launch (Hopper): the kernel is launched while the one before it in
 * the stream still runs, and waits in qd_grid_wait for that kernel's completion and memory
 * before touching what it wrote; saves the launch gap between dependent kernels. */
template <class... P, class... A>
static inline cudaError_t qd_launch_dependent(void (*kernel)(P...), unsigned grid, unsigned block, A... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.stream = qd_stream();
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, ((P)args)...);
}

/* In a kernel launched by qd_launch_dependent: wait for the previous kernel (and its writes);
 * qd_grid_release lets the next dependent kernel be scheduled early. No-ops before sm_90. */
__device__ __forceinline__ void qd_grid_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void qd_grid_release(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* amax, min, max of the whole tensor into the device scratch's range (one kernel, no sync: what
 * comes next in the stream reads them there); also notes the first non-finite element into flag
 * when given, and ignores NaN. */
enum qd_status qd_cuda_range_async(const struct qd_tensor *in, unsigned long long *flag);


/* Where block b's scale goes: its index, or its place in the swizzled tiling. b must be the
 * CTA's first block + threadIdx.x (32-bit division when the block count allows: 64-bit
 * division costs tens of instructions). */
__device__ __forceinline__ int64_t qd_scale_pos(int64_t b, int64_t scale_cols, int swizzled)
{
    if (!swizzled)
        return b;
    /* row and column of block b: one division for the CTA's first block (the same in every
     * thread), then at most one wrap when a row holds at least a CTA's worth of blocks */
    int64_t first = b - threadIdx.x, r, c;
    if (first < 0xffffffffll && scale_cols < 0xffffffffll) {
        r = (uint32_t)first / (uint32_t)scale_cols;
        c = (uint32_t)first - (uint32_t)r * (uint32_t)scale_cols;
    } else {
        r = first / scale_cols;
        c = first % scale_cols;
    }
    c += threadIdx.x;
    if (scale_cols >= blockDim.x) {
        if (c >= scale_cols)
            c -= scale_cols, r++;
    } else {
        r += c / scale_cols;
        c %= scale_cols;
    }
    return qd_swizzle_offset(r, c, scale_cols);
}

#endif
