/* AutoAWQ int4 (WQLinear_GEMM layout) on the GPU: one CTA per (group, 64 columns), the tile in
 * registers for 16-bit inputs and groups of 32, 64 or 128 rows, in shared memory for f32 and
 * other groups up to 128 rows; larger groups one thread per (group, 8-column word), reading its
 * columns over the group's rows twice (the second read from L2). The arithmetic is AutoAWQ's
 * f16 flow (kernels/awq.h): weights rounded to f16 first, each op's result rounded to f16. */
#include "../awq.h"

#include "common.cuh"

/* One qzeros word from 8 columns' zero points, in the AWQ interleave. */
__device__ __forceinline__ uint32_t pack_zeros(const float *zero)
{
    const int order[8] = QD_AWQ_ORDER;
    uint32_t z = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
        z |= (uint32_t)zero[order[i]] << (4 * i);
    return z;
}

/* A group column where AutoAWQ's f16 flow overflows (kernels/awq.h). */
__device__ __forceinline__ void note_f16_overflow(unsigned long long *bad, float max16, float scale, float zero,
                                                  int64_t first)
{
    if (bad && !qd_awq_column_defined(max16, scale, zero))
        atomicMin(bad, (unsigned long long)(QD_BAD_AWQ_F16_RANGE | first));
}

template <int DT>
__global__ void awq_quantize_kernel(const void *x, int64_t K, int64_t N, int64_t G, uint32_t *qweight,
                                    uint32_t *qzeros, uint16_t *scales, unsigned long long *bad)
{
    int64_t words = N / 8, t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= (K / G) * words)
        return;
    int64_t g = t / words, j = t % words, row0 = g * G;
    const int awq_order[8] = QD_AWQ_ORDER;
    float lo[8], hi[8], v[8];
    qd_load_block<DT, 8>(x, row0 * N + 8 * j, v);
    for (int c = 0; c < 8; c++)
        lo[c] = hi[c] = v[c];
#pragma unroll 8 /* several rows' loads in flight per thread */
    for (int64_t r = 0; r < G; r++) {
        qd_load_block<DT, 8>(x, (row0 + r) * N + 8 * j, v);
        if (bad)
            qd_check_block<8>(bad, v, (row0 + r) * N + 8 * j);
        for (int c = 0; c < 8; c++) {
            lo[c] = v[c] < lo[c] ? v[c] : lo[c];
            hi[c] = v[c] > hi[c] ? v[c] : hi[c];
        }
    }
    float scale[8], zero[8];
    for (int c = 0; c < 8; c++) {
        /* f16 rounding is monotone: min and max of the halved weights */
        float lo16 = qd_f16_round(lo[c]), hi16 = qd_f16_round(hi[c]);
        scale[c] = qd_awq_scale(lo16, hi16);
        zero[c] = qd_awq_zero(lo16, scale[c]);
        scales[g * N + 8 * j + c] = qd_f32_to_f16_scale(scale[c]);
        note_f16_overflow(bad, hi16, scale[c], zero[c], row0 * N + 8 * j + c);
    }
    qzeros[g * words + j] = pack_zeros(zero);
#pragma unroll 8
    for (int64_t r = 0; r < G; r++) {
        qd_load_block<DT, 8>(x, (row0 + r) * N + 8 * j, v);
        uint32_t word = 0;
        for (int i = 0; i < 8; i++) {
            int c = awq_order[i];
            word |= qd_awq_code(qd_f16_round(v[c]), scale[c], zero[c]) << (4 * i);
        }
        qweight[(row0 + r) * words + j] = word;
    }
}

#define AWQ_TILE_COLS 64
#define AWQ_MAX_TILE_G 128
#define AWQ_PITCH 65 /* odd row pitch: column walks and row walks both spread over the banks */

/* One CTA per (group, 64 columns): the tile of G <= 128 rows is read from global memory once
 * into shared memory (coalesced 16-byte loads); 4 threads per column take its min/max, then
 * the codes are packed from the tile. */
template <int DT>
__global__ void __launch_bounds__(256) awq_quantize_tile_kernel(const void *x, int64_t N, unsigned col_tiles, int G,
                                                                uint32_t *qweight,
                                                                uint32_t *qzeros, uint16_t *scales,
                                                                unsigned long long *bad)
{
    __shared__ float tile[AWQ_MAX_TILE_G * AWQ_PITCH];
    __shared__ float s_scale[AWQ_TILE_COLS], s_zero[AWQ_TILE_COLS];
    const int order[8] = QD_AWQ_ORDER;
    int64_t g = blockIdx.x / col_tiles, col0 = (int64_t)(blockIdx.x % col_tiles) * AWQ_TILE_COLS, row0 = g * G;
    int cols = N - col0 < AWQ_TILE_COLS ? (int)(N - col0) : AWQ_TILE_COLS, words = cols / 8;
    for (int k = threadIdx.x; k < G * words; k += blockDim.x) {
        int r = words == 8 ? k >> 3 : k / words, w = words == 8 ? k & 7 : k % words;
        int64_t at = (row0 + r) * N + col0 + 8 * w;
        float v[8];
        qd_load_block<DT, 8>(x, at, v);
        if (bad)
            qd_check_block<8>(bad, v, at);
        for (int j = 0; j < 8; j++) /* the weight halved, as AutoAWQ does first */
            tile[r * AWQ_PITCH + 8 * w + j] = qd_f16_round(v[j]);
    }
    __syncthreads();
    /* column c, part p: rows 32i + 8p + j (banks (8p + c) % 32: distinct across a warp); each
     * part starts from row 0's value as the sequential scan does (a NaN there stays) */
    int c = threadIdx.x / 4, part = threadIdx.x % 4;
    float lo = tile[c], hi = lo;
    if (c < cols)
        for (int base = 8 * part; base < G; base += 32)
            for (int j = 0; j < 8 && base + j < G; j++) {
                float v = tile[(base + j) * AWQ_PITCH + c];
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
    for (int o = 1; o < 4; o <<= 1) {
        float l = __shfl_xor_sync(0xffffffffu, lo, o), h = __shfl_xor_sync(0xffffffffu, hi, o);
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
    }
    if (part == 0 && c < cols) {
        float sc = qd_awq_scale(lo, hi);
        s_scale[c] = sc;
        s_zero[c] = qd_awq_zero(lo, sc);
        scales[g * N + col0 + c] = qd_f32_to_f16_scale(sc);
        note_f16_overflow(bad, hi, sc, s_zero[c], row0 * N + col0 + c);
    }
    __syncthreads();
    if (threadIdx.x < words)
        qzeros[g * (N / 8) + col0 / 8 + threadIdx.x] = pack_zeros(s_zero + 8 * threadIdx.x);
    for (int k = threadIdx.x; k < G * words; k += blockDim.x) {
        int r = words == 8 ? k >> 3 : k / words, w = words == 8 ? k & 7 : k % words;
        uint32_t word = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int cc = 8 * w + order[i];
            word |= qd_awq_code(tile[r * AWQ_PITCH + cc], s_scale[cc], s_zero[cc]) << (4 * i);
        }
        qweight[(row0 + r) * (N / 8) + col0 / 8 + w] = word;
    }
}

#define AWQ_REG_THREADS 256

/* Bits of a half2 (low half = first element). */
__device__ __forceinline__ uint32_t half2_bits(__half2 h)
{
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* The codes of R rows of one word (8 columns, 4 pairs, register-held as w[r][pair]) on the
 * fast path, given per pair the two scales and reciprocals (div[8 p]) and the f16 clamp bounds
 * -zero and 15 - zero (bound[8 p]). Pair p holds columns 2p and 2p + 1, whose nibbles sit at
 * bits 4p and 16 + 4p: exactly the two halves of an f16 pair shifted left by 4p. Per pair: the
 * two exact quotients, rounded to f16 together (cvt.rn.f16x2), clamped to the integer bounds
 * (the same before or after a monotone rounding), then 1536 added in f16: in [1024, 2048) the
 * ulp is 1, so the sum is 1536 + round-half-even(q) and its bits 0x6600 + that integer. The
 * word sums those bits shifted, starting from the zeros' word less the 8 shifted 0x6600s
 * (modulo 2^32: the nibbles' sum carries nowhere).
 * HALVE (bf16 only): AutoAWQ's f16 weight. A bf16 is its own f16 from 2^-14 up (8 significant
 * bits; a finite scale bounds it by 65504); below, adding and taking away 0.75 rounds it to
 * the f16 subnormal grid (ulp 2^-24, ties to even). Where every scale of the word exceeds
 * 2^-13, weights below 2^-14 give quotients under 1/2 halved or not (code: the zero), so
 * the two adds are left out. */
template <int DT, int R, bool HALVE>
__device__ __forceinline__ void awq_fast_words(const uint32_t (&w)[R][4], const float4 *div, const uint2 *bound,
                                               uint32_t zword, uint32_t (&out)[R])
{
    __half2_raw k1536_raw;
    k1536_raw.x = 0x6600;
    k1536_raw.y = 0x6600;
    const __half2 k1536(k1536_raw);
#pragma unroll
    for (int r = 0; r < R; r++)
        out[r] = zword - 0x66006600u * 0x1111u;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        float4 d = div[8 * p];
        uint2 b = bound[8 * p];
        __half2 lo2, hi2;
        memcpy(&lo2, &b.x, 4);
        memcpy(&hi2, &b.y, 4);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v0 = qd_half_f32<DT>(w[r][p], 0), v1 = qd_half_f32<DT>(w[r][p], 1);
            if (HALVE) {
                v0 = __fadd_rn(__fadd_rn(v0, 0.75f), -0.75f);
                v1 = __fadd_rn(__fadd_rn(v1, 0.75f), -0.75f);
            }
            __half2 q = __floats2half2_rn(qd_quotient(v0, d.x, d.y), qd_quotient(v1, d.z, d.w));
            q = __hadd2(__hmin2(__hmax2(q, lo2), hi2), k1536); /* a NaN becomes -z: code 0 */
            out[r] += half2_bits(q) << (4 * p);
        }
    }
}

/* One CTA per (group of G = 32 R rows, 64 columns), the tile held in registers: thread
 * (ty, tx) loads 8 columns (one 16-byte load of f16/bf16) of rows ty, ty + 32, ... and packs
 * one word per row. Column min/max: packed pair min/max (NaN ignored), shuffles across the 4
 * row slices of a warp, then shared memory across the 8 warps; a NaN in the group's first row
 * makes the column's min and max NaN, as AutoAWQ's sequential scan from that row does. One
 * thread per column then sets the f16 scale and zero (kernels/awq.h) and the constants below.
 * Each code is round(f16(w / scale)) + zero, clamped: the quotient exactly as the division
 * gives it (qd_quotient), then awq_fast_words. A word with a column whose scale is not finite
 * (NaN/Inf input, or f16 overflow under allow_nonfinite) takes the division. 16-bit inputs
 * only. */
template <int DT, int R>
__global__ void __launch_bounds__(AWQ_REG_THREADS, 4) awq_quantize_reg_kernel(const void *x, int64_t N, unsigned col_tiles,
                                                                           uint32_t *qweight,
                                                                           uint32_t *qzeros, uint16_t *scales,
                                                                           unsigned long long *bad)
{
    __shared__ struct {
        uint32_t lo[8][8][4], hi[8][8][4]; /* [warp][tx][pair]: each warp's column min/max */
        uint32_t first[32];                /* the group's first row, column pairs */
        /* per column pair p = (8 w + 2p, 8 w + 2p + 1) at [p][w], so the 8 words' threads read
         * contiguous bytes (no bank conflict): the two scales and reciprocals, and the clamp
         * bounds -zero and 15 - zero as f16 pairs */
        float4 div[4][8];
        uint2 bound[4][8];
        uint32_t zword[8]; /* the qzeros words */
        int fast[8];       /* every scale of the word finite */
        int halve[8];      /* bf16: a scale of the word <= 2^-13 (see awq_fast_words) */
        float zero[AWQ_TILE_COLS];
    } s;
    const int order[8] = QD_AWQ_ORDER;
    int tx = threadIdx.x % 8, ty = threadIdx.x / 8, warp = threadIdx.x / 32;
    int64_t g = blockIdx.x / col_tiles, col0 = (int64_t)(blockIdx.x % col_tiles) * AWQ_TILE_COLS, row0 = g * 32 * R;
    int words = N - col0 < AWQ_TILE_COLS ? (int)(N - col0) / 8 : 8;
    bool active = tx < words;
    uint32_t w[R][4];
    const uint16_t *xh = (const uint16_t *)x;
#pragma unroll
    for (int r = 0; r < R; r++) {
        uint4 q = active ? __ldg((const uint4 *)(xh + (row0 + ty + 32 * r) * N + col0 + 8 * tx)) : make_uint4(0, 0, 0, 0);
        w[r][0] = q.x, w[r][1] = q.y, w[r][2] = q.z, w[r][3] = q.w;
    }
    if (bad && active) {
        uint32_t top = 0;
#pragma unroll
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++)
                top = __vmaxu2(top, w[r][k] & 0x7fff7fffu);
        uint32_t inf = DT == QD_F16 ? 0x7c00u : 0x7f80u;
        if ((top & 0xffff) >= inf || (top >> 16) >= inf) { /* rare: the first one in index order */
            unsigned long long first = ~0ull;
#pragma unroll /* constant indices: w stays in registers */
            for (int r = R - 1; r >= 0; r--)
#pragma unroll
                for (int j = 7; j >= 0; j--)
                    if (!qd_isfinite(qd_half_f32<DT>(w[r][j / 2], j % 2)))
                        first = (unsigned long long)((row0 + ty + 32 * r) * N + col0 + 8 * tx + j);
            atomicMin(bad, first);
        }
    }
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        lo[k] = hi[k] = w[0][k];
#pragma unroll
        for (int r = 1; r < R; r++) {
            lo[k] = qd_pair_min<DT>(lo[k], w[r][k]);
            hi[k] = qd_pair_max<DT>(hi[k], w[r][k]);
        }
#pragma unroll
        for (int o = 8; o < 32; o <<= 1) {
            lo[k] = qd_pair_min<DT>(lo[k], __shfl_xor_sync(0xffffffffu, lo[k], o));
            hi[k] = qd_pair_max<DT>(hi[k], __shfl_xor_sync(0xffffffffu, hi[k], o));
        }
    }
    if (threadIdx.x % 32 < 8)
        for (int k = 0; k < 4; k++) {
            s.lo[warp][tx][k] = lo[k];
            s.hi[warp][tx][k] = hi[k];
        }
    if (threadIdx.x < 8) /* ty 0 holds row0: no second global read after the barrier */
        for (int k = 0; k < 4; k++)
            s.first[4 * tx + k] = w[0][k];
    __syncthreads();
    if (threadIdx.x < AWQ_TILE_COLS) { /* warps 0 and 1, one thread per column */
        int c = threadIdx.x, cw = c / 8, j = c % 8, pair = j / 2, half = c % 2;
        bool valid = c < 8 * words;
        uint32_t l = s.lo[0][cw][pair], h = s.hi[0][cw][pair];
        for (int wi = 1; wi < 8; wi++) {
            l = qd_pair_min<DT>(l, s.lo[wi][cw][pair]);
            h = qd_pair_max<DT>(h, s.hi[wi][cw][pair]);
        }
        /* f16 rounding is monotone: min and max of the halved weights are these, halved */
        float lof = qd_f16_round(qd_half_f32<DT>(l, half)), hif = qd_f16_round(qd_half_f32<DT>(h, half));
        float first = qd_half_f32<DT>(s.first[c / 2], c % 2);
        if (first != first) /* the sequential scan keeps a NaN start */
            lof = hif = first;
        float sc = qd_awq_scale(lof, hif), z = qd_awq_zero(lof, sc), rcp = __frcp_rn(sc);
        if (valid) {
            s.zero[c] = z;
            scales[g * N + col0 + c] = qd_f32_to_f16_scale(sc);
            note_f16_overflow(bad, hif, sc, z, row0 * N + col0 + c);
        }
        /* the pair's constants, written by its even column */
        float sc1 = __shfl_xor_sync(0xffffffffu, sc, 1), rcp1 = __shfl_xor_sync(0xffffffffu, rcp, 1);
        float z1 = __shfl_xor_sync(0xffffffffu, z, 1);
        if (valid && half == 0) {
            s.div[pair][cw] = make_float4(sc, rcp, sc1, rcp1);
            s.bound[pair][cw] = make_uint2(half2_bits(__floats2half2_rn(-z, -z1)),
                                           half2_bits(__floats2half2_rn(15.0f - z, 15.0f - z1)));
        }
        /* qd_quotient needs |w / scale| <= 2^100: any finite f16 scale (>= 11 * 2^-24) gives it */
        int fast = qd_isfinite(sc), halve = DT == QD_BF16 && sc <= 0x1p-13f;
        const int shift_of_col[8] = QD_AWQ_SHIFT_OF_COL;
        uint32_t zword = (uint32_t)z << shift_of_col[j]; /* its nibble in the AWQ order */
        for (int o = 1; o < 8; o <<= 1) { /* each word's 8 nibbles and flags from its 8 lanes */
            zword |= __shfl_xor_sync(0xffffffffu, zword, o);
            fast &= __shfl_xor_sync(0xffffffffu, fast, o);
            halve |= __shfl_xor_sync(0xffffffffu, halve, o);
        }
        if (j == 0 && valid) {
            s.zword[cw] = zword;
            s.fast[cw] = fast;
            s.halve[cw] = halve;
            qzeros[g * (N / 8) + col0 / 8 + cw] = zword;
        }
    }
    __syncthreads();
    if (!active)
        return;
    uint32_t out[R];
    if (s.fast[tx]) {
        if (s.halve[tx])
            awq_fast_words<DT, R, true>(w, &s.div[0][tx], &s.bound[0][tx], s.zword[tx], out);
        else
            awq_fast_words<DT, R, false>(w, &s.div[0][tx], &s.bound[0][tx], s.zword[tx], out);
    } else { /* a non-finite scale: the division */
#pragma unroll /* constant indices: w stays in registers */
        for (int r = 0; r < R; r++) {
            uint32_t word = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int c = order[i];
                float v = qd_f16_round(qd_half_f32<DT>(w[r][c / 2], c % 2));
                float sc = c % 2 ? s.div[c / 2][tx].z : s.div[c / 2][tx].x;
                word |= qd_awq_code(v, sc, s.zero[8 * tx + c]) << (4 * i);
            }
            out[r] = word;
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        qweight[(row0 + ty + 32 * r) * (N / 8) + col0 / 8 + tx] = out[r];
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
        /* hardware f16 -> f32 is exact (NaN aside, which a scale from quantd never is) */
        v[c] = qd_small_int_f32((int)((q >> (4 * i)) & 15) - (int)((z >> (4 * i)) & 15)) *
               __half2float(__ushort_as_half(sc));
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
    int64_t col_tiles = (N + AWQ_TILE_COLS - 1) / AWQ_TILE_COLS;
    int R = G == 32 ? 1 : (G == 64 ? 2 : (G == 128 ? 4 : 0));
    /* one CTA per tile, the column tiles of a group on consecutive CTAs (together they read
     * whole rows: DRAM pages open once) */
    unsigned ct = (unsigned)col_tiles, grid = (unsigned)((K / G) * col_tiles);
    bool one_grid = (K / G) * col_tiles <= 0x7fffffff;
    if (R && in->dtype != QD_F32 && one_grid) {
        const void *x = in->data;
        uint32_t *qw = (uint32_t *)out[0], *qz = (uint32_t *)out[1];
        uint16_t *sc = (uint16_t *)out[2];
#define AWQ_REG(DT, RR) awq_quantize_reg_kernel<DT, RR><<<grid, AWQ_REG_THREADS, 0, qd_stream()>>>(x, N, ct, qw, qz, sc, bad)
        if (in->dtype == QD_F16)
            R == 1 ? AWQ_REG(QD_F16, 1) : (R == 2 ? AWQ_REG(QD_F16, 2) : AWQ_REG(QD_F16, 4));
        else
            R == 1 ? AWQ_REG(QD_BF16, 1) : (R == 2 ? AWQ_REG(QD_BF16, 2) : AWQ_REG(QD_BF16, 4));
#undef AWQ_REG
    } else if (G <= AWQ_MAX_TILE_G && one_grid) {
        QD_DTYPE_SWITCH(in->dtype, DT,
                        awq_quantize_tile_kernel<DT><<<grid, 256, 0, qd_stream()>>>(
                            in->data, N, ct, (int)G, (uint32_t *)out[0], (uint32_t *)out[1], (uint16_t *)out[2], bad));
    } else {
        QD_DTYPE_SWITCH(in->dtype, DT,
                        awq_quantize_kernel<DT><<<qd_grid(items, 128), 128, 0, qd_stream()>>>(
                            in->data, K, N, G, (uint32_t *)out[0], (uint32_t *)out[1], (uint16_t *)out[2], bad));
    }
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
