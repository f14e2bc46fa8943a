/* fp8_e4m3 and w8a8 (kernels/fp8.h) on the GPU, the CPU's arithmetic. A channel is a block of
 * 1 x cols, so channels and blocks share the kernels, which fold the largest |x| over a CTA and
 * write the scale and the codes (16-byte loads, rows of a block read coalesced):
 * - a block of at most one 8-element chunk per thread: one CTA per block, held in registers;
 * - a 16-bit block of up to 2048 chunks (128 x 128, a channel of up to 16384 columns): one CTA
 *   per block, copied to shared memory by cp.async;
 * - larger (or f32) blocks: one CTA per block, read twice, the second time from L2;
 * - blocks (or rows) that do not split into 8-element chunks: element by element.
 * Each reads the input once but the last two. Per tensor: the amax pass, a one-thread kernel
 * for the scale, then the codes (two reads). The codes and the dequantize: four 8-element
 * chunks a thread. */
#include "../fp8.h"
#include "common.cuh"
#include "convert.cuh"

#define FP8_THREADS 256
#ifndef FP8_STREAM_CHUNKS /* the streaming kernels (per-tensor codes, dequantize): 8-element chunks a thread */
#define FP8_STREAM_CHUNKS 4
#endif
#ifndef FP8_DQ_WALK /* dequantize: step the scale indices along the row (0: divide for each chunk) */
#define FP8_DQ_WALK 1
#endif
#ifndef FP8_AMAX_CTAS /* the per-tensor amax pass: CTAs of 256 an SM */
#define FP8_AMAX_CTAS 8
#endif
#ifndef FP8_SHORT_QUOT /* 16-bit inputs: the quotient with one correction (0: two, as for f32) */
#define FP8_SHORT_QUOT 1
#endif
#ifndef FP8_SMEM_THREADS /* the shared-memory kernel's CTA */
#define FP8_SMEM_THREADS 256
#endif
#ifndef FP8_SMEM_CTAS /* its CTAs an SM the registers must allow (32 KB of shared memory each) */
#define FP8_SMEM_CTAS 5
#endif

/* the arithmetic's dtype code (ctint.h) of input dtype DT under compressed-tensors' flow */
template <int DT, int CT> struct fp8_dt {
    static constexpr int code = !CT ? 0 : DT == QD_BF16 ? 2 : DT == QD_F16 ? 1 : 0;
};

/* x / s, correctly rounded: through the reciprocal rs where qd_quotient's conditions hold (a
 * scale of 2^-20 .. 2^20, its checked range, and |x| >= 2^-80: the quotient then lies in
 * [2^-100, 2^100], as fp8.h's scales keep |x / s| near 448 or below), else the division. */
__device__ __forceinline__ float fp8_quot(float x, float s, float rs, bool fast)
{
    return fast && qd_absf(x) >= 0x1p-80f ? qd_quotient(x, s, rs) : x / s;
}

__device__ __forceinline__ bool fp8_fast_scale(float s) { return s >= 0x1p-20f && s <= 0x1p20f; }

/* The int8 code's byte: the clamp, then round to nearest even by adding 1.5 * 2^23, whose ulp is
 * 1 (rintf and the conversion to int run on the conversion unit, a quarter of the rate).
 * CLAMP false: the caller knows |q| < 127.5, where the clamp changes nothing. */
template <bool CLAMP = true> __device__ __forceinline__ uint32_t fp8_int8_byte(float q)
{
    return qd_f32_bits(__fadd_rn(CLAMP ? fminf(fmaxf(q, -128.0f), 127.0f) : q, 12582912.0f)) & 0xffu;
}

/* How fp8_code2 takes the quotients: FP8_EACH as fp8_quot decides for each value; FP8_PLAIN all
 * through the reciprocal; FP8_PLAIN_IN_RANGE also without the int8 clamp (every |q| < 127.5). */
enum { FP8_EACH, FP8_PLAIN, FP8_PLAIN_IN_RANGE };

/* A 16-bit DT: x and s (compressed-tensors' scale is in the weight's dtype) have at most 11
 * significant bits, where one correction rounds correctly and a zero's quotient is +0. */
template <int DT> constexpr bool fp8_short_quot = DT != QD_F32 && FP8_SHORT_QUOT;

/* The quotient x / s through the reciprocal rs (fp8_quot's conditions hold, or x is a zero). */
template <int DT> __device__ __forceinline__ float fp8_plain_quot(float x, float s, float rs)
{
    return fp8_short_quot<DT> ? qd_quotient_short(x, s, rs) : qd_quotient(x, s, rs);
}

/* The codes of two values (a in the low byte), as qd_fp8_code computes them: compressed-tensors'
 * from the f32 quotient (its Triton kernel's), whatever the weight's dtype. PLAIN: both
 * quotients through the reciprocal (fp8_codes8 has checked that fp8_quot would take it, or that
 * the value is a zero, whose quotient's sign the + 0 or the rounding to an integer drops). */
template <int DT, int INT8, int CT, int MODE>
__device__ __forceinline__ uint32_t fp8_code2(float a, float b, float s, float rs, bool fast)
{
    if (!CT) /* transformers: x * scale; 0 * inf (an infinite scale) is NaN, coded 0x7f */
        return qd_mx_encode2<QD_E4M3>(a * s, b * s);
    const float qa = MODE != FP8_EACH ? fp8_plain_quot<DT>(a, s, rs) : fp8_quot(a, s, rs, fast);
    const float qb = MODE != FP8_EACH ? fp8_plain_quot<DT>(b, s, rs) : fp8_quot(b, s, rs, fast);
    if (INT8)
        return fp8_int8_byte<MODE != FP8_PLAIN_IN_RANGE>(qa) | fp8_int8_byte<MODE != FP8_PLAIN_IN_RANGE>(qb) << 8;
    /* + the zero point: -0 becomes +0 (fp8_plain_quot's short form gives no -0) */
    if (MODE != FP8_EACH && fp8_short_quot<DT>)
        return qd_fp8x2_finite<QD_E4M3>(qa, qb);
    return qd_fp8x2_finite<QD_E4M3>(__fadd_rn(qa, 0.0f), __fadd_rn(qb, 0.0f));
}

/* Whether every quotient of the 8 values goes through the reciprocal (fp8_quot's condition), or
 * the value is a zero, whose quotient's sign the + 0 or the rounding to an integer drops. */
template <int CT> __device__ __forceinline__ bool fp8_plain8(const float *v, bool fast)
{
    bool plain = CT && fast;
#pragma unroll
    for (int j = 0; j < 8; j++)
        plain &= qd_absf(v[j]) >= 0x1p-80f || v[j] == 0.0f;
    return plain;
}

/* The codes of 8 values; PLAIN as fp8_plain8 computes it (or as a caller knows it for a whole
 * block). Where it holds (the usual case) the 8 quotients are computed without a branch per
 * element, so they run side by side: a branch around each division left a thread one
 * dependent chain at a time. */
template <int DT, int INT8, int CT, int MODE>
__device__ __forceinline__ uint2 fp8_codes8_as(const float *v, float s, float rs, bool fast)
{
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; j += 2)
        w[j / 4] |= fp8_code2<DT, INT8, CT, MODE>(v[j], v[j + 1], s, rs, fast) << (8 * (j % 4));
    return make_uint2(w[0], w[1]);
}

template <int DT, int INT8, int CT>
__device__ __forceinline__ uint2 fp8_codes8(const float *v, float s, float rs, bool fast, bool plain)
{
    return plain ? fp8_codes8_as<DT, INT8, CT, FP8_PLAIN>(v, s, rs, fast)
                 : fp8_codes8_as<DT, INT8, CT, FP8_EACH>(v, s, rs, fast);
}

/* Whether a scale lets every quotient of a DT input go through the reciprocal. fp8_quot divides
 * |x| < 2^-80 in full: there the reciprocal's quotient can differ from x / s in its last bits
 * and, near f32's underflow, in whether it is zero at all. Neither changes a code while
 * |x / s| >= 2^-140: both quotients are then non-zero with x's sign and far below e4m3's
 * smallest step (code +-0) and an integer's half (code 0). The dtype's smallest non-zero |x|
 * (f16 2^-24, bf16 2^-133, f32 2^-149) keeps every quotient there for s up to that |x| * 2^140,
 * so only a bf16 block of amax above 448 * 2^7 or an f32 one above 448 * 2^-9 looks further. */
template <int DT> __device__ __forceinline__ bool fp8_all_plain(float s, bool fast)
{
    return fast && s <= (DT == QD_F16 ? 0x1p116f : DT == QD_BF16 ? 0x1p7f : 0x1p-9f);
}

/* The codes of 8 DT values, PLAIN decided for the scale or else for these 8. */
template <int DT, int INT8, int CT> __device__ __forceinline__ uint2 fp8_codes8(const float *v, float s, float rs, bool fast)
{
    return fp8_codes8<DT, INT8, CT>(v, s, rs, fast, (CT && fp8_all_plain<DT>(s, fast)) || fp8_plain8<CT>(v, fast));
}

/* The largest of the CTA's |x| (as f32 bits, NaN above Inf above finite), in every thread. */
template <int THREADS> __device__ __forceinline__ float fp8_cta_amax(uint32_t top)
{
    __shared__ uint32_t part[THREADS / 32];
    top = __reduce_max_sync(0xffffffffu, top);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = top;
    __syncthreads();
    uint32_t m = part[0];
#pragma unroll
    for (int w = 1; w < THREADS / 32; w++)
        m = max(m, part[w]);
    return qd_bits_f32(m);
}

/* Where block b sits: its first row and column, rows and columns inside the tensor, and its
 * scale's index. A channel is the block 1 x cols of one-row matrices. */
struct fp8_geom {
    int64_t cols, mrows, nbr, ncb; /* nbr block rows per matrix, ncb block columns */
    int64_t br, bc;
    qd_udiv dcols, dmrows, dbr, dbc, dcpr; /* the same divisors for 32-bit indices; cpr = bc / 8 */
};

struct fp8_block_at {
    int64_t row0, col0, scale, h, w;
};

__device__ __forceinline__ fp8_block_at fp8_block(const fp8_geom &g, uint32_t b)
{
    fp8_block_at a; /* 32-bit divisions: a grid has fewer than 2^31 CTAs */
    const uint32_t ncb = (uint32_t)g.ncb, nbr = (uint32_t)g.nbr, rb = b / ncb, bco = b - rb * ncb, m = rb / nbr;
    const int64_t bro = rb - m * nbr;
    a.row0 = (int64_t)m * g.mrows + bro * g.br;
    a.col0 = bco * g.bc;
    a.h = min(g.br, g.mrows - bro * g.br);
    a.w = min(g.bc, g.cols - a.col0);
    a.scale = b;
    return a;
}

/* 8 elements as loaded (16-bit ones stay packed: half the registers of their f32 values). */
template <int DT> struct fp8_chunk {
    uint4 q[DT == QD_F32 ? 2 : 1];
};

/* Loads the 8 elements at e (16-byte aligned); returns their largest |x| as f32 bits, above
 * 0x7f800000 exactly when one is NaN (qd_load_block_top's order). */
template <int DT> __device__ __forceinline__ uint32_t fp8_chunk_load(const void *x, int64_t e, fp8_chunk<DT> &c)
{
    if constexpr (DT == QD_F32) {
        const uint4 *p = (const uint4 *)((const float *)x + e);
        uint32_t top = 0;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            c.q[k] = __ldg(p + k);
            top = max(top, max(max(c.q[k].x & 0x7fffffffu, c.q[k].y & 0x7fffffffu),
                               max(c.q[k].z & 0x7fffffffu, c.q[k].w & 0x7fffffffu)));
        }
        return top;
    } else {
        c.q[0] = __ldg((const uint4 *)((const uint16_t *)x + e));
        const uint32_t top = __vmaxu2(__vmaxu2(c.q[0].x & 0x7fff7fffu, c.q[0].y & 0x7fff7fffu),
                                      __vmaxu2(c.q[0].z & 0x7fff7fffu, c.q[0].w & 0x7fff7fffu));
        return qd_half_pair_top<DT>(top);
    }
}

template <int DT> __device__ __forceinline__ void fp8_chunk_values(const fp8_chunk<DT> &c, float *v)
{
#pragma unroll
    for (int k = 0; k < (DT == QD_F32 ? 2 : 1); k++) {
        const uint32_t w[4] = {c.q[k].x, c.q[k].y, c.q[k].z, c.q[k].w};
#pragma unroll
        for (int h = 0; h < 4; h++)
            if constexpr (DT == QD_F32)
                v[4 * k + h] = qd_bits_f32(w[h]);
            else {
                v[2 * h] = qd_half_f32<DT>(w[h], 0);
                v[2 * h + 1] = qd_half_f32<DT>(w[h], 1);
            }
    }
}

/* One CTA per block whose rows split into 8-element chunks (bc and cols multiples of 8): chunk
 * c of the block is row c / (bc / 8), chunk c % (bc / 8); K chunks per thread, in registers. */
template <int DT, int INT8, int CT, int THREADS, int K>
__global__ void __launch_bounds__(THREADS) fp8_block_reg_kernel(const void *x, fp8_geom g, uint8_t *codes, void *scales,
                                                                 unsigned long long *bad)
{
    constexpr int dt = fp8_dt<DT, CT>::code;
    const fp8_block_at a = fp8_block(g, blockIdx.x);
    const int cpr = (int)(g.bc / 8), wc = (int)(a.w / 8); /* (at most 4096 chunks) */
    fp8_chunk<DT> q[K];
    uint32_t top = 0;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int c = threadIdx.x + k * THREADS, i = c / cpr, j = c % cpr;
        if (i < a.h && j < wc) {
            const int64_t e = (a.row0 + i) * g.cols + a.col0 + 8 * j;
            const uint32_t t = fp8_chunk_load<DT>(x, e, q[k]);
            if (t >= 0x7f800000u) {
                float v[8];
                fp8_chunk_values<DT>(q[k], v);
                qd_note_first_nonfinite<8>(bad, v, e);
            }
            top = max(top, t);
        }
    }
    const float s = qd_fp8_encode_scale(fp8_cta_amax<THREADS>(top), INT8, CT, dt);
    if (threadIdx.x == 0)
        qd_fp8_put_scale(scales, a.scale, qd_fp8_stored_scale(s, CT), dt);
    const float rs = __frcp_rn(s);
    const bool fast = fp8_fast_scale(s);
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int c = threadIdx.x + k * THREADS, i = c / cpr, j = c % cpr;
        if (i < a.h && j < wc) {
            float v[8];
            fp8_chunk_values<DT>(q[k], v);
            *(uint2 *)(codes + (a.row0 + i) * g.cols + a.col0 + 8 * j) = fp8_codes8<DT, INT8, CT>(v, s, rs, fast);
        }
    }
}

/* cp.async of 16 bytes from global to shared memory, bypassing L1 (the block is read once). */
__device__ __forceinline__ void fp8_copy16_async(uint4 *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}

/* One CTA per 16-bit block of 257 .. THREADS * K 8-element chunks (a 128 x 128 block, a channel
 * of up to 16384 columns): the block is copied to shared memory asynchronously, so no register
 * holds it while the loads fly and several CTAs an SM keep the memory busy while others reduce
 * and code (a block held in registers allowed two CTAs an SM, and the memory went idle while
 * both computed). Each thread reads back the chunks it copied itself (the wait makes them
 * visible to it, so only the reduction needs a barrier), the range first, then the codes. */
template <int DT, int INT8, int CT, int THREADS, int K>
__global__ void __launch_bounds__(THREADS, FP8_SMEM_CTAS) fp8_block_smem_kernel(const void *x, fp8_geom g, uint8_t *codes,
                                                                               void *scales, unsigned long long *bad)
{
    constexpr int dt = fp8_dt<DT, CT>::code;
    __shared__ uint4 buf[THREADS * K];
    const fp8_block_at a = fp8_block(g, blockIdx.x);
    const uint32_t wc = (uint32_t)(a.w / 8), n = (uint32_t)a.h * (uint32_t)(g.bc / 8);
    int64_t at[K]; /* each chunk's first element (row-major in the tensor) */
#pragma unroll
    for (int k = 0; k < K; k++) {
        const uint32_t c = threadIdx.x + k * THREADS, i = qd_udiv_do(c, g.dcpr), j = c - i * (uint32_t)(g.bc / 8);
        at[k] = c < n && j < wc ? (a.row0 + i) * g.cols + a.col0 + 8 * j : -1;
        if (at[k] >= 0)
            fp8_copy16_async(&buf[c], (const uint16_t *)x + at[k]);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    uint32_t top = 0;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (at[k] >= 0) {
            const uint4 q = buf[threadIdx.x + k * THREADS];
            const uint32_t t = qd_half_pair_top<DT>(__vmaxu2(__vmaxu2(q.x & 0x7fff7fffu, q.y & 0x7fff7fffu),
                                                             __vmaxu2(q.z & 0x7fff7fffu, q.w & 0x7fff7fffu)));
            if (t >= 0x7f800000u) {
                float v[8];
                fp8_chunk_values<DT>(fp8_chunk<DT>{{q}}, v);
                qd_note_first_nonfinite<8>(bad, v, at[k]);
            }
            top = max(top, t);
        }
    const float amax = fp8_cta_amax<THREADS>(top), s = qd_fp8_encode_scale(amax, INT8, CT, dt);
    if (threadIdx.x == 0)
        qd_fp8_put_scale(scales, a.scale, qd_fp8_stored_scale(s, CT), dt);
    const float rs = __frcp_rn(s);
    const bool fast = fp8_fast_scale(s), plain = CT && fp8_all_plain<DT>(s, fast);
    /* int8: the largest quotient (the quotient grows with |x|) below 127.5, so no code clamps:
     * the usual case, unless the stored scale rounded below amax / 127 */
    const bool in_range = INT8 && plain && qd_quotient(amax, s, rs) < 127.5f;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (at[k] >= 0) {
            float v[8];
            fp8_chunk_values<DT>(fp8_chunk<DT>{{buf[threadIdx.x + k * THREADS]}}, v);
            *(uint2 *)(codes + at[k]) = in_range ? fp8_codes8_as<DT, INT8, CT, FP8_PLAIN_IN_RANGE>(v, s, rs, fast)
                                        : plain  ? fp8_codes8_as<DT, INT8, CT, FP8_PLAIN>(v, s, rs, fast)
                                                 : fp8_codes8<DT, INT8, CT>(v, s, rs, fast);
        }
}

/* Blocks of more chunks than the CTA has threads (a row of a channel-wise 16384-column matrix,
 * a 128 x 128 block): the range pass, then the codes from a second read of the block, which the
 * CTAs resident on an SM keep in L2 (a few tens of KB each). Holding the block in registers
 * instead costs 64 registers a thread at 256 threads and half the occupancy; on an H100 it was
 * the slower of the two for compressed-tensors' arithmetic (docs/BENCHMARKS.md's git history has the
 * figures). */
template <int DT, int INT8, int CT, int THREADS>
__global__ void __launch_bounds__(THREADS) fp8_block_l2_kernel(const void *x, fp8_geom g, uint8_t *codes, void *scales,
                                                               unsigned long long *bad)
{
    constexpr int dt = fp8_dt<DT, CT>::code;
    const fp8_block_at a = fp8_block(g, blockIdx.x);
    const int cpr = (int)(g.bc / 8), wc = (int)(a.w / 8), n = (int)a.h * cpr;
    uint32_t top = 0;
#pragma unroll 4
    for (int c = threadIdx.x; c < n; c += THREADS) {
        const int i = c / cpr, j = c - i * cpr;
        if (j < wc) {
            const int64_t e = (a.row0 + i) * g.cols + a.col0 + 8 * j;
            fp8_chunk<DT> q;
            const uint32_t t = fp8_chunk_load<DT>(x, e, q);
            if (t >= 0x7f800000u) {
                float v[8];
                fp8_chunk_values<DT>(q, v);
                qd_note_first_nonfinite<8>(bad, v, e);
            }
            top = max(top, t);
        }
    }
    const float s = qd_fp8_encode_scale(fp8_cta_amax<THREADS>(top), INT8, CT, dt);
    if (threadIdx.x == 0)
        qd_fp8_put_scale(scales, a.scale, qd_fp8_stored_scale(s, CT), dt);
    const float rs = __frcp_rn(s);
    const bool fast = fp8_fast_scale(s);
#pragma unroll 4
    for (int c = threadIdx.x; c < n; c += THREADS) {
        const int i = c / cpr, j = c - i * cpr;
        if (j < wc) {
            const int64_t e = (a.row0 + i) * g.cols + a.col0 + 8 * j;
            fp8_chunk<DT> q;
            fp8_chunk_load<DT>(x, e, q);
            float v[8];
            fp8_chunk_values<DT>(q, v);
            *(uint2 *)(codes + e) = fp8_codes8<DT, INT8, CT>(v, s, rs, fast);
        }
    }
}

/* Any block: element by element, the range pass then the codes (the block read twice). */
template <int DT, int INT8, int CT>
__global__ void __launch_bounds__(FP8_THREADS) fp8_block_any_kernel(const void *x, fp8_geom g, uint8_t *codes,
                                                                    void *scales, unsigned long long *bad)
{
    constexpr int dt = fp8_dt<DT, CT>::code;
    const fp8_block_at a = fp8_block(g, blockIdx.x);
    const int64_t n = a.h * a.w;
    uint32_t top = 0;
    for (int64_t e = threadIdx.x; e < n; e += FP8_THREADS) {
        const int64_t at = (a.row0 + e / a.w) * g.cols + a.col0 + e % a.w;
        const float v = qd_load<DT>(x, at);
        qd_note_nonfinite(bad, v, at);
        top = max(top, qd_f32_bits(v) & 0x7fffffffu);
    }
    const float s = qd_fp8_encode_scale(fp8_cta_amax<FP8_THREADS>(top), INT8, CT, dt);
    if (threadIdx.x == 0)
        qd_fp8_put_scale(scales, a.scale, qd_fp8_stored_scale(s, CT), dt);
    for (int64_t e = threadIdx.x; e < n; e += FP8_THREADS) {
        const int64_t at = (a.row0 + e / a.w) * g.cols + a.col0 + e % a.w;
        codes[at] = (uint8_t)qd_fp8_code(qd_load<DT>(x, at), s, INT8, CT);
    }
}

/* Per tensor, the first pass: the largest |x| as f32 bits (NaN above Inf above finite, as
 * fp8_chunk_load orders them), FP8_STREAM_CHUNKS 8-element chunks a thread loaded before any is
 * folded, over a grid of a few CTAs an SM striding the tensor; one atomicMax a CTA into
 * sc->amax_bits, zeroed before the launch. Only the amax: compressed-tensors' symmetric scale
 * needs no min or max, and the packed 16-bit maximum takes four instructions per 8 elements. */
template <int DT>
__global__ void __launch_bounds__(256) fp8_tensor_amax_kernel(const void *x, int64_t n, struct qd_scratch *sc,
                                                              unsigned long long *bad)
{
    constexpr int U = FP8_STREAM_CHUNKS;
    const int64_t full = n / 8, tile = 256 * U;
    uint32_t top = 0;
    for (int64_t t0 = blockIdx.x * tile + threadIdx.x; t0 < full; t0 += (int64_t)gridDim.x * tile) {
        fp8_chunk<DT> q[U];
        uint32_t t[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            t[u] = t0 + u * 256 < full ? fp8_chunk_load<DT>(x, 8 * (t0 + u * 256), q[u]) : 0;
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (t[u] >= 0x7f800000u) {
                float v[8];
                fp8_chunk_values<DT>(q[u], v);
                qd_note_first_nonfinite<8>(bad, v, 8 * (t0 + u * 256));
            }
            top = max(top, t[u]);
        }
    }
    if (blockIdx.x == 0) /* the tail of fewer than 8 */
        for (int64_t i = 8 * full + threadIdx.x; i < n; i += 256) {
            const float v = qd_load<DT>(x, i);
            qd_note_nonfinite(bad, v, i);
            top = max(top, qd_f32_bits(v) & 0x7fffffffu);
        }
    const float m = fp8_cta_amax<256>(top);
    if (threadIdx.x == 0)
        atomicMax(&sc->amax_bits, qd_f32_bits(m));
}

/* Per tensor: the scale from the amax the device computed (no host round trip); the encode
 * scale goes to the scratch constants for the codes kernel. */
template <int INT8, int CT>
__global__ void fp8_tensor_scale_kernel(int dt, struct qd_scratch *sc, void *scales)
{
    const float s = qd_fp8_encode_scale(qd_bits_f32(sc->amax_bits), INT8, CT, dt);
    qd_fp8_put_scale(scales, 0, qd_fp8_stored_scale(s, CT), dt);
    sc->consts[0] = s;
}

/* The 8 elements at e (16- or 32-byte aligned) as loaded, no use of them yet. */
template <int DT> __device__ __forceinline__ void fp8_chunk_fetch(const void *x, int64_t e, fp8_chunk<DT> &c)
{
    const uint4 *p = DT == QD_F32 ? (const uint4 *)((const float *)x + e) : (const uint4 *)((const uint16_t *)x + e);
#pragma unroll
    for (int k = 0; k < (DT == QD_F32 ? 2 : 1); k++)
        c.q[k] = __ldg(p + k);
}

/* The codes with the tensor's scale, FP8_STREAM_CHUNKS chunks of 8 a thread, a CTA's chunks
 * consecutive, every load issued before the first code (as the dequantize kernel); the tail
 * of fewer than 8 one by one. */
template <int DT, int INT8, int CT>
__global__ void __launch_bounds__(256) fp8_tensor_codes_kernel(const void *x, int64_t n, const float *scale, uint8_t *codes)
{
    const int64_t t0 = (int64_t)blockIdx.x * 256 * FP8_STREAM_CHUNKS + threadIdx.x, full = n / 8;
    fp8_chunk<DT> q[FP8_STREAM_CHUNKS];
#pragma unroll
    for (int u = 0; u < FP8_STREAM_CHUNKS; u++)
        if (t0 + u * 256 < full)
            fp8_chunk_fetch<DT>(x, 8 * (t0 + u * 256), q[u]);
    const float s = *scale, rs = __frcp_rn(s);
    const bool fast = fp8_fast_scale(s);
#pragma unroll
    for (int u = 0; u < FP8_STREAM_CHUNKS; u++) {
        const int64_t t = t0 + u * 256;
        if (t < full) {
            float v[8];
            fp8_chunk_values<DT>(q[u], v);
            ((uint2 *)codes)[t] = fp8_codes8<DT, INT8, CT>(v, s, rs, fast);
        } else if (t == full)
            for (int64_t i = 8 * t; i < n; i++)
                codes[i] = qd_fp8_code(qd_load<DT>(x, i), s, INT8, CT);
    }
}

/* The scale index of element (r, c), in index type I (32-bit indices where the tensor has fewer
 * than 2^32 elements: their divisions by multiplication, a 64-bit divide costs several times
 * more). */
template <class I> __device__ __forceinline__ I fp8_div(I n, int64_t d, qd_udiv u)
{
    if constexpr (sizeof(I) == 4)
        return qd_udiv_do(n, u);
    else
        return n / (I)d;
}

template <class I> __device__ __forceinline__ I fp8_scale_of(int gran, const fp8_geom &g, I r, I c)
{
    if (gran == QD_GRAN_TENSOR)
        return 0;
    if (gran == QD_GRAN_CHANNEL)
        return r;
    const I mrows = (I)g.mrows, m = fp8_div<I>(r, g.mrows, g.dmrows);
    return (m * (I)g.nbr + fp8_div<I>(r - m * mrows, g.br, g.dbr)) * (I)g.ncb + fp8_div<I>(c, g.bc, g.dbc);
}

/* code * scale rounded to the scale's dtype SDT; rounding to the output dtype DT follows in the
 * store, so the explicit rounding is needed only where SDT is neither f32 nor DT. */
template <int DT, int INT8, int SDT> __device__ __forceinline__ float fp8_value(float q, float s)
{
    const float v = q * s;
    return SDT == 0 || SDT == (DT == QD_BF16 ? 2 : DT == QD_F16 ? 1 : 0) ? v : qd_ct_round(v, SDT);
}

/* The 8 elements of chunk t (element 8t on), their codes w as loaded. UNIFORM: the 8 share
 * one scale, su (cols a multiple of 8, and so is the block width); else each its own. */
template <int DT, int INT8, int SDT, int UNIFORM, class I>
__device__ __forceinline__ void fp8_dequantize_chunk(uint2 w, const void *scales, int gran, const fp8_geom &g, int64_t t,
                                                     float su, void *y)
{
    const int64_t e0 = 8 * t;
    float q[8];
    if (INT8) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            q[j] = (float)(int8_t)(((j < 4 ? w.x : w.y) >> (8 * (j % 4))) & 0xffu);
    } else { /* NaN codes, rare, take the software decode for all 8 (one test for them) */
#pragma unroll
        for (int j = 0; j < 8; j += 2)
            qd_fp8x2_decode_finite<QD_E4M3>(((j < 4 ? w.x : w.y) >> (8 * (j % 4))) & 0xffffu, &q[j], &q[j + 1]);
        if (qd_fp8x4_has_nan<QD_E4M3>(w.x) || qd_fp8x4_has_nan<QD_E4M3>(w.y))
            for (int j = 0; j < 8; j++)
                q[j] = qd_e4m3_to_f32((uint8_t)((j < 4 ? w.x : w.y) >> (8 * (j % 4))));
    }
    float v[8];
    if (UNIFORM) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = fp8_value<DT, INT8, SDT>(q[j], su);
    } else {
        const I cols = (I)g.cols;
        I r = fp8_div<I>((I)e0, g.cols, g.dcols), c = (I)e0 - r * cols;
        for (int j = 0; j < 8; j++) {
            v[j] = fp8_value<DT, INT8, SDT>(q[j], qd_fp8_get_scale(scales, fp8_scale_of<I>(gran, g, r, c), SDT));
            if (++c == cols)
                c = 0, r++;
        }
    }
    qd_store_block<DT, 8>(y, e0, v);
}

/* FP8_STREAM_CHUNKS chunks of 8 elements a thread, a CTA's chunks consecutive: every thread issues
 * all its 8-byte loads of codes before it decodes any, so each SM keeps that many times more
 * bytes in flight (one load a thread left the memory half idle on an H200); the tail of fewer
 * than 8 elements one by one. */
/* The scale indices of a thread's UNIFORM chunks t0 + 256 u. WALK (rows of at least 2048
 * elements, 32-bit indices): the first chunk's row and column by division, the next ones by
 * stepping 2048 columns on (at most one row further each), and the scale row's part divided
 * again only where the row changes: a 128 x 128 block's index took four divisions a chunk. */
template <int WALK, class I>
__device__ __forceinline__ void fp8_scale_indices(int gran, const fp8_geom &g, int64_t t0, I *si)
{
    if (!WALK) {
#pragma unroll
        for (int u = 0; u < FP8_STREAM_CHUNKS; u++) {
            const I e = (I)(8 * (t0 + u * 256)), r = fp8_div<I>(e, g.cols, g.dcols);
            si[u] = fp8_scale_of<I>(gran, g, r, e - r * (I)g.cols);
        }
        return;
    }
    const uint32_t cols = (uint32_t)g.cols, e = (uint32_t)(8 * t0);
    uint32_t r = qd_udiv_do(e, g.dcols), c = e - r * cols, rowpart = 0;
    const bool block = gran == QD_GRAN_BLOCK;
#pragma unroll
    for (int u = 0; u < FP8_STREAM_CHUNKS; u++) {
        if (u == 0 || c >= cols) {
            if (u)
                c -= cols, r++;
            if (block) {
                const uint32_t m = qd_udiv_do(r, g.dmrows);
                rowpart = (m * (uint32_t)g.nbr + qd_udiv_do(r - m * (uint32_t)g.mrows, g.dbr)) * (uint32_t)g.ncb;
            } else
                rowpart = gran == QD_GRAN_CHANNEL ? r : 0;
        }
        si[u] = (I)(block ? rowpart + qd_udiv_do(c, g.dbc) : rowpart);
        c += 2048;
    }
}

template <int DT, int INT8, int SDT, int UNIFORM, int WALK, class I>
__global__ void __launch_bounds__(256) fp8_dequantize_kernel(const uint8_t *codes, const void *scales, int gran, fp8_geom g,
                                                             int64_t n, void *y)
{
    const int64_t t0 = (int64_t)blockIdx.x * 256 * FP8_STREAM_CHUNKS + threadIdx.x, full = n / 8;
    uint2 w[FP8_STREAM_CHUNKS];
#pragma unroll
    for (int u = 0; u < FP8_STREAM_CHUNKS; u++)
        if (t0 + u * 256 < full)
            w[u] = __ldg((const uint2 *)codes + t0 + u * 256);
    /* UNIFORM: every chunk's scale loaded before any chunk is decoded, so that their loads (L2
     * hits, mostly: a 128 x 128 block's scales are spread over the SMs) wait together with the
     * codes'; loaded chunk by chunk, each waited in turn between a chunk's decode and its store */
    float su[FP8_STREAM_CHUNKS] = {};
    if (UNIFORM) {
        I si[FP8_STREAM_CHUNKS];
        fp8_scale_indices<WALK, I>(gran, g, t0, si);
#pragma unroll
        for (int u = 0; u < FP8_STREAM_CHUNKS; u++)
            if (t0 + u * 256 < full)
                su[u] = qd_fp8_get_scale(scales, si[u], SDT);
    }
#pragma unroll
    for (int u = 0; u < FP8_STREAM_CHUNKS; u++) {
        const int64_t t = t0 + u * 256;
        if (t < full)
            fp8_dequantize_chunk<DT, INT8, SDT, UNIFORM, I>(w[u], scales, gran, g, t, su[u], y);
        else if (t == full)
            for (int64_t e = 8 * t; e < n; e++) {
                const int64_t r = e / g.cols;
                const float s = qd_fp8_get_scale(scales, fp8_scale_of<int64_t>(gran, g, r, e - r * g.cols), SDT);
                qd_store<DT>(y, e, fp8_value<DT, INT8, SDT>(INT8 ? (float)(int8_t)codes[e] : qd_e4m3_to_f32(codes[e]), s));
            }
    }
}

/* ---- host side --------------------------------------------------------------------------- */

/* The block geometry of a plan for a tensor (channels: blocks of 1 x cols). */
static fp8_geom fp8_geometry(const struct qd_fp8_plan &k, const struct qd_tensor *t)
{
    fp8_geom g;
    g.cols = t->cols;
    const bool block = k.gran == QD_GRAN_BLOCK;
    g.mrows = block && t->ndim > 1 ? t->shape[t->ndim - 2] : 1;
    g.br = block ? k.block_rows : 1;
    g.bc = block ? k.block_cols : t->cols;
    g.nbr = (g.mrows + g.br - 1) / g.br;
    g.ncb = (g.cols + g.bc - 1) / g.bc;
    /* (used for tensors of fewer than 2^32 elements, where each of these is below 2^32 too) */
    g.dcols = qd_udiv_make((uint32_t)g.cols);
    g.dmrows = qd_udiv_make((uint32_t)g.mrows);
    g.dbr = qd_udiv_make((uint32_t)g.br);
    g.dbc = qd_udiv_make((uint32_t)g.bc);
    g.dcpr = qd_udiv_make((uint32_t)(g.bc / 8));
    return g;
}

/* The three arithmetics: compressed-tensors e4m3, compressed-tensors int8, transformers e4m3. */
#define FP8_FLOW_SWITCH(k, INT8, CT, ...)                                                          \
    if ((k).int8) {                                                                             \
        constexpr int INT8 = 1, CT = 1;                                                         \
        __VA_ARGS__;                                                                            \
    } else if ((k).ct) {                                                                        \
        constexpr int INT8 = 0, CT = 1;                                                         \
        __VA_ARGS__;                                                                            \
    } else {                                                                                    \
        constexpr int INT8 = 0, CT = 0;                                                         \
        __VA_ARGS__;                                                                            \
    }

/* The shared-memory kernel for 16-bit blocks of 257 .. 2048 chunks, K chunks a thread for the
 * fewest that hold the block; cudaErrorNotSupported where it does not apply (f32: twice the
 * shared memory). The largest shared-memory carveout is asked for at each launch (a host-side
 * hint, set per device), so FP8_SMEM_CTAS CTAs of 32 KB fit an SM beside the L1. */
template <int DT, int INT8, int CT, int T, int K>
static cudaError_t fp8_launch_smem_k(const struct qd_tensor *in, const fp8_geom &g, unsigned nblocks, uint8_t *codes,
                                     void *scales, unsigned long long *bad)
{
    const cudaError_t e = cudaFuncSetAttribute(fp8_block_smem_kernel<DT, INT8, CT, T, K>,
                                               cudaFuncAttributePreferredSharedMemoryCarveout,
                                               cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess)
        return e;
    fp8_block_smem_kernel<DT, INT8, CT, T, K><<<nblocks, T, 0, qd_stream()>>>(in->data, g, codes, scales, bad);
    return cudaGetLastError();
}

template <int DT, int INT8, int CT>
static cudaError_t fp8_launch_smem(const struct qd_tensor *in, const fp8_geom &g, unsigned nblocks, int64_t chunks,
                                   uint8_t *codes, void *scales, unsigned long long *bad)
{
    constexpr int T = FP8_SMEM_THREADS;
    if constexpr (DT == QD_F32)
        return cudaErrorNotSupported;
    else if (chunks <= 512)
        return fp8_launch_smem_k<DT, INT8, CT, T, (512 + T - 1) / T>(in, g, nblocks, codes, scales, bad);
    else if (chunks <= 1024)
        return fp8_launch_smem_k<DT, INT8, CT, T, 1024 / T>(in, g, nblocks, codes, scales, bad);
    else if (chunks <= 2048)
        return fp8_launch_smem_k<DT, INT8, CT, T, 2048 / T>(in, g, nblocks, codes, scales, bad);
    return cudaErrorNotSupported;
}

template <int DT, int INT8, int CT>
static cudaError_t fp8_launch_blocks(const struct qd_tensor *in, const fp8_geom &g, uint8_t *codes, void *scales,
                                     unsigned long long *bad)
{
    const unsigned nblocks = (unsigned)(in->rows / g.mrows * g.nbr * g.ncb);
    const int64_t chunks = g.br * (g.bc / 8);
    cudaStream_t st = qd_stream();
    if (g.cols % 8 || g.bc % 8)
        fp8_block_any_kernel<DT, INT8, CT><<<nblocks, FP8_THREADS, 0, st>>>(in->data, g, codes, scales, bad);
    else if (chunks <= FP8_THREADS)
        fp8_block_reg_kernel<DT, INT8, CT, FP8_THREADS, 1><<<nblocks, FP8_THREADS, 0, st>>>(in->data, g, codes, scales, bad);
    else {
        const cudaError_t e = fp8_launch_smem<DT, INT8, CT>(in, g, nblocks, chunks, codes, scales, bad);
        if (e != cudaErrorNotSupported)
            return e;
        /* 512 threads: of 128, 256, 512 and 1024 the fastest on an H100 at 16384^2 */
        fp8_block_l2_kernel<DT, INT8, CT, 512><<<nblocks, 512, 0, st>>>(in->data, g, codes, scales, bad);
    }
    return cudaGetLastError();
}

extern "C" enum qd_status qd_cuda_fp8_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                               struct qd_params *p, void *const *out)
{
    if (qd_fp8_resolve_scale_dtype(f, p, in->dtype))
        return QD_EINVAL; /* (the layout refuses it first, naming it) */
    const struct qd_fp8_plan k = qd_fp8_plan_for(f, p, in->dtype);
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK)
        return s;
    uint8_t *codes = (uint8_t *)out[0];
    if (k.gran == QD_GRAN_TENSOR) {
        struct qd_scratch *d = qd_scratch_dev();
        const int64_t n = qd_tensor_numel(in);
        CUDA_CHECK(cudaMemsetAsync(&d->amax_bits, 0, sizeof d->amax_bits, qd_stream()));
        /* FP8_AMAX_CTAS CTAs an SM (or fewer, for a small tensor) */
        const unsigned cap = (unsigned)qd_cuda_sm_count() * FP8_AMAX_CTAS, tiles = qd_grid((n + 7) / 8, 256 * FP8_STREAM_CHUNKS);
        QD_DTYPE_SWITCH(in->dtype, DT, fp8_tensor_amax_kernel<DT><<<tiles < cap ? tiles : cap, 256, 0, qd_stream()>>>(
                            in->data, n, d, bad));
        CUDA_LAUNCHED();
        FP8_FLOW_SWITCH(k, INT8, CT, fp8_tensor_scale_kernel<INT8, CT><<<1, 1, 0, qd_stream()>>>(k.dt, d, out[1]));
        CUDA_LAUNCHED();
        QD_DTYPE_SWITCH(in->dtype, DT, FP8_FLOW_SWITCH(k, INT8, CT,
                        fp8_tensor_codes_kernel<DT, INT8, CT><<<qd_grid((n + 7) / 8, 256 * FP8_STREAM_CHUNKS), 256, 0, qd_stream()>>>(
                            in->data, n, d->consts, codes)));
    } else {
        const fp8_geom g = fp8_geometry(k, in);
        QD_DTYPE_SWITCH(in->dtype, DT, FP8_FLOW_SWITCH(k, INT8, CT, CUDA_CHECK((fp8_launch_blocks<DT, INT8, CT>(in, g, codes, out[1], bad)))));
    }
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_fp8_dequantize(const struct qd_format *f, const void *const *in,
                                                 const struct qd_params *p, struct qd_tensor *out)
{
    const struct qd_fp8_plan k = qd_fp8_plan_for(f, p, out->dtype);
    const fp8_geom g = fp8_geometry(k, out);
    const int64_t n = qd_tensor_numel(out);
    const bool uniform = g.cols % 8 == 0 && (k.gran != QD_GRAN_BLOCK || g.bc % 8 == 0);
    const bool small = n < ((int64_t)1 << 32);
    /* the scale indices stepped along the row (fp8_scale_indices) where a row holds a thread's
     * stride of 2048 elements and the indices are 32-bit */
    const bool walk = uniform && small && g.cols >= 2048 && FP8_DQ_WALK;
    const uint8_t *codes = (const uint8_t *)in[0];
#define FP8_DQ_I(DT, INT8, SDT, U, W, I)                                                        \
    fp8_dequantize_kernel<DT, INT8, SDT, U, W, I><<<qd_grid((n + 7) / 8, 256 * FP8_STREAM_CHUNKS), 256, 0, qd_stream()>>>( \
        codes, in[1], k.gran, g, n, out->data)
#define FP8_DQ(DT, INT8, SDT)                                                                   \
    if (walk)                                                                                   \
        FP8_DQ_I(DT, INT8, SDT, 1, 1, uint32_t);                                                \
    else                                                                                        \
        QD_BOOL_SWITCH(uniform, U, if (small) FP8_DQ_I(DT, INT8, SDT, U, 0, uint32_t); else FP8_DQ_I(DT, INT8, SDT, U, 0, int64_t))
#define FP8_DQ_SDT(DT, INT8)                                                                    \
    if (k.dt == 2) {                                                                            \
        FP8_DQ(DT, INT8, 2);                                                                    \
    } else if (k.dt == 1) {                                                                     \
        FP8_DQ(DT, INT8, 1);                                                                    \
    } else {                                                                                    \
        FP8_DQ(DT, INT8, 0);                                                                    \
    }
    QD_DTYPE_SWITCH(out->dtype, DT, QD_BOOL_SWITCH(k.int8, INT8, FP8_DQ_SDT(DT, INT8)));
#undef FP8_DQ_SDT
#undef FP8_DQ
#undef FP8_DQ_I
    CUDA_LAUNCHED();
    return QD_OK;
}
