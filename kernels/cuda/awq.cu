/* AutoAWQ int4 (WQLinear_GEMM layout) on the GPU: one CTA per (group, 64 columns), the tile in
 * registers for 16-bit inputs and groups of 32, 64 or 128 rows, in shared memory for f32 and
 * other groups up to 128 rows; larger groups one thread per (group, 8-column word), reading its
 * columns over the group's rows twice (the second read from L2). */
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
        scale[c] = qd_awq_scale(lo[c], hi[c]);
        zero[c] = qd_awq_zero(lo[c], scale[c]);
        scales[g * N + 8 * j + c] = qd_f32_to_f16_scale(scale[c]);
    }
    qzeros[g * words + j] = pack_zeros(zero);
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
        for (int j = 0; j < 8; j++)
            tile[r * AWQ_PITCH + 8 * w + j] = v[j];
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

/* One CTA per (group of G = 32 R rows, 64 columns), the tile held in registers: thread
 * (ty, tx) loads 8 columns (one 16-byte load of f16/bf16) of rows ty, ty + 32, ... and packs
 * one word per row. Column min/max: packed pair min/max (NaN ignored), shuffles across the 4
 * row slices of a warp, then shared memory across the 8 warps; a NaN in the group's first row
 * makes the column's min and max NaN, as AutoAWQ's sequential scan from that row does. One
 * thread per column then sets the scale, the zero and the constants below; each code is the
 * quotient w / scale exactly as the division gives it (qd_quotient), clamped and rounded as
 * the comment in the loop says. A column whose scale is not finite (NaN/Inf input) or whose
 * values reach 2^100 scales takes the division. 16-bit inputs only. */
template <int DT, int R>
__global__ void __launch_bounds__(AWQ_REG_THREADS, 4) awq_quantize_reg_kernel(const void *x, int64_t N, unsigned col_tiles,
                                                                           uint32_t *qweight,
                                                                           uint32_t *qzeros, uint16_t *scales,
                                                                           unsigned long long *bad)
{
    __shared__ struct {
        uint32_t lo[8][8][4], hi[8][8][4]; /* [warp][tx][pair]: each warp's column min/max */
        uint32_t first[32];                /* the group's first row, column pairs */
        /* scale, 1 / scale, -zero, 15 - zero (-1: take the division); column 8 w + c at
         * [c][w], so the 8 words' threads read 128 contiguous bytes (no bank conflict) */
        float4 col[8][8];
        uint32_t zword[8]; /* the qzeros words */
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
    uint32_t zword = 0;
    if (threadIdx.x < 8 * words) { /* one thread per column: the fold over the 8 warps */
        int c = threadIdx.x, cw = c / 8, j = c % 8, pair = j / 2, half = c % 2;
        uint32_t l = s.lo[0][cw][pair], h = s.hi[0][cw][pair];
        for (int wi = 1; wi < 8; wi++) {
            l = qd_pair_min<DT>(l, s.lo[wi][cw][pair]);
            h = qd_pair_max<DT>(h, s.hi[wi][cw][pair]);
        }
        float lof = qd_half_f32<DT>(l, half), hif = qd_half_f32<DT>(h, half);
        float first = qd_half_f32<DT>(s.first[c / 2], c % 2);
        if (first != first) /* the sequential scan keeps a NaN start */
            lof = hif = first;
        float sc = qd_awq_scale(lof, hif), z = qd_awq_zero(lof, sc);
        /* the fast codes need a finite scale and |w / scale| <= 2^100 (qd_quotient's range) */
        bool fast = sc <= 3.40282347e38f && fmaxf(qd_absf(lof), qd_absf(hif)) <= 0x1p100f * sc;
        s.col[j][cw] = make_float4(sc, __frcp_rn(sc), -z, fast ? 15.0f - z : -1.0f);
        s.zero[c] = z;
        scales[g * N + col0 + c] = qd_f32_to_f16_scale(sc);
        const int shift_of_col[8] = QD_AWQ_SHIFT_OF_COL;
        zword = (uint32_t)z << shift_of_col[j]; /* its nibble in the AWQ order */
    }
    if (threadIdx.x < AWQ_TILE_COLS) { /* warps 0 and 1: each word's 8 nibbles from its 8 lanes */
        for (int o = 1; o < 8; o <<= 1)
            zword |= __shfl_xor_sync(0xffffffffu, zword, o);
        if (threadIdx.x % 8 == 0 && threadIdx.x < 8 * words) {
            s.zword[threadIdx.x / 8] = zword;
            qzeros[g * (N / 8) + col0 / 8 + threadIdx.x / 8] = zword;
        }
    }
    __syncthreads();
    if (!active)
        return;
    /* Column by column, so only one column's constants are live (one 16-byte shared load).
     * code = clamp(rne(q) + z, 0, 15) = rne(clamp(q, -z, 15 - z)) + z (the bounds are
     * integers); rne by adding 1.5 * 2^23, whose bits are then 0x4B400000 + rne(...). The
     * word sums those bits shifted to their nibbles, starting from the zeros' word less the
     * 8 shifted 0x4B400000 (modulo 2^32: the nibbles' sum carries nowhere). */
    constexpr uint32_t magic8 = 0x4B400000u * 0x11111111u;
    uint32_t out[R];
    bool fast = true;
    uint32_t start = s.zword[tx] - magic8;
#pragma unroll
    for (int r = 0; r < R; r++)
        out[r] = start;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int c = order[i];
        float4 k = s.col[c][tx];
        fast &= k.w >= 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = qd_half_f32<DT>(w[r][c / 2], c % 2);
            float q = fminf(fmaxf(qd_quotient(v, k.x, k.y), k.z), k.w); /* a NaN becomes -z: code 0 */
            out[r] += qd_f32_bits(q + 12582912.0f) << (4 * i);
        }
    }
    if (!fast) /* a non-finite scale or huge values: the division */
#pragma unroll /* constant indices: w stays in registers */
        for (int r = 0; r < R; r++) {
            uint32_t word = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int c = order[i];
                float v = qd_half_f32<DT>(w[r][c / 2], c % 2);
                word |= qd_awq_code(v, s.col[c][tx].x, s.zero[8 * tx + c]) << (4 * i);
            }
            out[r] = word;
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
