/* OCP MX (mxfp4, mxfp6_e2m3/e3m2, mxfp8_e4m3/e5m2) and NVFP4 on the GPU: one thread per block
 * (32 or 16 elements), the block arithmetic of kernels/mx.h, scales linear or in the swizzled
 * 128x4 tensor-core tiling (zero padding cleared first, as on the CPU). Packed blocks and
 * dequantized elements move through shared memory per CTA (tile.cuh); the element encoders
 * are those of convert.cuh (Hopper's fp8 cvt where it gives the same bits). Blocks holding
 * NaN/Inf (allowed by the caller) take the reference block code of mx.h. compressed-tensors'
 * arithmetic (mxfp4 scale_rounding=even, nvfp4 flow=compressed_tensors) runs the block code of
 * mx.h, shared with the CPU. */
#include "../mx.h"
#include "convert.cuh"
#include "tile.cuh"

#define MX_THREADS 128

struct mx_geom {
    int elem, rceil, unpacked, swizzled, data_bytes;
    int even; /* scale_rounding=even: compressed-tensors' MXFP4 (kernels/mx.h), by the input's dtype */
    int64_t scale_cols;
};

/* Where block b's scale goes: its index, or its place in the swizzled tiling. b must be the
 * CTA's first block + threadIdx.x (32-bit division when the block count allows: 64-bit
 * division costs tens of instructions). */
__device__ __forceinline__ int64_t scale_pos(int64_t b, int64_t scale_cols, int swizzled)
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

__device__ __forceinline__ int64_t scale_index(const struct mx_geom &g, int64_t block)
{
    return scale_pos(block, g.scale_cols, g.swizzled);
}

/* Packs the 32 codes of one block (pairs from qd_mx_encode2, low byte first) into 32-bit
 * words, as qd_mx_pack lays them out. Returns the number of words (4, 6 or 8). */
template <int ELEM>
__device__ __forceinline__ int mx_pack_words(const uint32_t *pair, int unpacked, uint32_t *w)
{
    if (ELEM == QD_E2M1) { /* two codes per byte, the first in the low nibble */
        for (int k = 0; k < 4; k++) {
            uint32_t b = 0;
            for (int h = 0; h < 4; h++) {
                uint32_t p = pair[4 * k + h];
                b |= ((p & 15) | (p >> 8 & 15) << 4) << (8 * h);
            }
            w[k] = b;
        }
        return 4;
    }
    if ((ELEM == QD_E2M3 || ELEM == QD_E3M2) && !unpacked) { /* 4 codes per 3 bytes */
        uint8_t bytes[24];
        for (int g = 0; g < 8; g++) {
            uint32_t p0 = pair[2 * g], p1 = pair[2 * g + 1];
            uint32_t v = (p0 & 63) | (p0 >> 8 & 63) << 6 | (p1 & 63) << 12 | (p1 >> 8 & 63) << 18;
            bytes[3 * g] = (uint8_t)v, bytes[3 * g + 1] = (uint8_t)(v >> 8), bytes[3 * g + 2] = (uint8_t)(v >> 16);
        }
        for (int k = 0; k < 6; k++)
            w[k] = bytes[4 * k] | bytes[4 * k + 1] << 8 | bytes[4 * k + 2] << 16 | (uint32_t)bytes[4 * k + 3] << 24;
        return 6;
    }
    for (int k = 0; k < 8; k++) /* one code per byte */
        w[k] = (pair[2 * k] & 0xffff) | pair[2 * k + 1] << 16;
    return 8;
}

template <int DT, int ELEM>
__global__ void __launch_bounds__(MX_THREADS) mx_quantize_kernel(struct mx_geom g, const void *x, int64_t nblocks,
                                                                 uint8_t *data, uint8_t *scales,
                                                                 unsigned long long *bad)
{
    __shared__ __align__(16) uint32_t staged[MX_THREADS * 8];
    int64_t first = blockIdx.x * (int64_t)MX_THREADS, b = first + threadIdx.x;
    int words = g.data_bytes / 4;
    if (b < nblocks) {
        float v[QD_MX_BLOCK];
        uint32_t top = qd_load_block_top<DT, QD_MX_BLOCK>(x, b * QD_MX_BLOCK, v);
        uint32_t w[8];
        uint8_t scale;
        int n;
        if (ELEM == QD_E2M1 && g.even && top < 0x7f800000u) {
            /* mx.h's qd_ct_mx_block with the e2m1 pairs of convert.cuh: a code whose value
             * the weight's dtype rounds to zero (or -0.0) loses its sign bit */
            int sb = qd_ct_mx_scale(qd_bits_f32(top), DT);
            if (sb < 0 && bad)
                atomicMin(bad, (unsigned long long)(QD_BAD_MX_SCALE_RANGE | (b * QD_MX_BLOCK)));
            scale = sb < 0 ? (uint8_t)255 : (uint8_t)sb;
            float inv = sb < 0 ? 0.0f : qd_e8m0_reciprocal(scale);
            const float zero_below = qd_ct_zero_below(DT);
            uint32_t pair[16];
#pragma unroll
            for (int k = 0; k < 16; k++) {
                float a = v[2 * k] * inv, c = v[2 * k + 1] * inv;
                pair[k] = qd_mx_encode2_finite<ELEM>(a, c) & (fabsf(a) <= zero_below ? 0xff00u : 0xffffu) &
                          (fabsf(c) <= zero_below ? 0x00ffu : 0xffffu);
            }
            n = mx_pack_words<ELEM>(pair, g.unpacked, w);
        } else if (top >= 0x7f800000u) {
            /* NaN/Inf (allowed): the reference block code, exactly the CPU's (compressed-tensors'
             * for scale_rounding=even, mx.h's) */
            qd_note_first_nonfinite<QD_MX_BLOCK>(bad, v, b * QD_MX_BLOCK);
            uint8_t packed[32];
            if (ELEM == QD_E2M1 && g.even) {
                int overflow;
                scale = qd_ct_mx_block(DT, v, packed, &overflow);
                if (overflow && bad)
                    atomicMin(bad, (unsigned long long)(QD_BAD_MX_SCALE_RANGE | (b * QD_MX_BLOCK)));
                n = 4;
            } else {
                scale = qd_mx_quantize_block(ELEM, g.rceil, g.unpacked, v, packed);
                n = words;
            }
#pragma unroll /* w stays in registers */
            for (int k = 0; k < 8; k++)
                w[k] = k < n ? packed[4 * k] | packed[4 * k + 1] << 8 | packed[4 * k + 2] << 16 |
                                   (uint32_t)packed[4 * k + 3] << 24
                             : 0u;
        } else {
            float amax = qd_bits_f32(top); /* finite: the NaN-propagating max of the reference is a plain max */
            scale = g.rceil ? qd_e8m0_rceil(amax * (float)(1.0 / (double)qd_mx_max_pos(ELEM)))
                            : qd_e8m0_floor(amax, qd_mx_emax(ELEM));
            float inv = qd_e8m0_reciprocal(scale);
            uint32_t pair[16];
#pragma unroll
            for (int k = 0; k < 16; k++)
                pair[k] = qd_mx_encode2_finite<ELEM>(v[2 * k] * inv, v[2 * k + 1] * inv);
            n = mx_pack_words<ELEM>(pair, g.unpacked, w);
        }
        scales[scale_index(g, b)] = scale;
        if constexpr (ELEM == QD_E2M1) /* 16 bytes per thread, consecutive: already coalesced */
            ((uint4 *)data)[b] = make_uint4(w[0], w[1], w[2], w[3]);
        else
            for (int k = 0; k < n; k++)
                staged[threadIdx.x * words + k] = w[k];
    }
    if constexpr (ELEM != QD_E2M1) {
        __syncthreads();
        int nvalid = nblocks - first < MX_THREADS ? (int)(nblocks - first) : MX_THREADS;
        cta_copy(data + first * g.data_bytes, (const uint8_t *)staged, nvalid * g.data_bytes);
    }
}

/* An fp8 block's 32 values through the hardware decoder; false (nothing written) when a code
 * is NaN, which the reference decoding then handles. */
template <int ELEM> __device__ __forceinline__ bool mx_fp8_decode(const uint8_t *codes, uint8_t scale, float *v)
{
    const uint4 *p = (const uint4 *)codes;
    uint4 q0 = p[0], q1 = p[1];
    uint32_t w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    bool nan = false;
#pragma unroll
    for (int k = 0; k < 8; k++)
        nan |= qd_fp8x4_has_nan<ELEM>(w[k]);
    if (nan)
        return false;
    float s = qd_e8m0_to_f32(scale);
#pragma unroll
    for (int h = 0; h < 16; h++) {
        float a, b;
        qd_fp8x2_decode_finite<ELEM>(w[h / 2] >> (16 * (h % 2)), &a, &b);
        v[2 * h] = a * s;
        v[2 * h + 1] = b * s;
    }
    return true;
}

template <int DT, int ELEM>
__global__ void __launch_bounds__(MX_THREADS) mx_dequantize_kernel(struct mx_geom g, const uint8_t *data,
                                                                   const uint8_t *scales, int64_t nblocks, void *y)
{
    __shared__ __align__(16) uint8_t staged[MX_THREADS * 32];
    __shared__ uint4 tile[MX_THREADS * qd_tile<DT, QD_MX_BLOCK>::CH];
    int64_t first = blockIdx.x * (int64_t)MX_THREADS, b = first + threadIdx.x;
    int nvalid = nblocks - first < MX_THREADS ? (int)(nblocks - first) : MX_THREADS;
    cta_copy(staged, data + first * g.data_bytes, nvalid * g.data_bytes);
    __syncthreads();
    if (b < nblocks) {
        float v[QD_MX_BLOCK];
        uint8_t sc = scales[scale_index(g, b)];
        if (!((ELEM == QD_E4M3 || ELEM == QD_E5M2) && mx_fp8_decode<ELEM>(staged + threadIdx.x * 32, sc, v)))
            qd_mx_dequantize_block(ELEM, g.unpacked, sc, staged + threadIdx.x * g.data_bytes, v);
        tile_put<DT, QD_MX_BLOCK>(tile, v);
    }
    __syncthreads();
    tile_store<DT, QD_MX_BLOCK>(tile, (uint8_t *)y + first * QD_MX_BLOCK * qd_tile<DT, QD_MX_BLOCK>::esize, nvalid);
}

#define QD_ELEM_SWITCH(e, ELEM, ...)                                                            \
    switch (e) {                                                                                \
    case QD_E2M1: { constexpr int ELEM = QD_E2M1; __VA_ARGS__; } break;                         \
    case QD_E2M3: { constexpr int ELEM = QD_E2M3; __VA_ARGS__; } break;                         \
    case QD_E3M2: { constexpr int ELEM = QD_E3M2; __VA_ARGS__; } break;                         \
    case QD_E4M3: { constexpr int ELEM = QD_E4M3; __VA_ARGS__; } break;                         \
    default: { constexpr int ELEM = QD_E5M2; __VA_ARGS__; } break;                              \
    }

static struct mx_geom mx_setup(const struct qd_format *f, const struct qd_params *p, int64_t cols)
{
    struct mx_geom g;
    g.elem = f->code;
    g.rceil = p->scale_rounding == QD_ROUND_RCEIL;
    g.even = p->scale_rounding == QD_ROUND_EVEN;
    g.unpacked = p->fp6_packing == QD_FP6_UNPACKED;
    g.swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    g.data_bytes = qd_mx_block_data_bytes(g.elem, g.unpacked);
    g.scale_cols = cols / QD_MX_BLOCK;
    return g;
}

/* Whether the 128 x 4 tiles of a swizzled scale matrix hold padding (zeros by the layout). */
static int swizzle_padded(int64_t rows, int64_t scale_cols) { return rows % 128 || scale_cols % 4; }

extern "C" enum qd_status qd_cuda_mx_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                              struct qd_params *p, void *const *out)
{
    struct mx_geom g = mx_setup(f, p, in->cols);
    int64_t nblocks = qd_tensor_numel(in) / QD_MX_BLOCK;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    if (g.swizzled && swizzle_padded(in->rows, g.scale_cols)) /* else the kernel writes every byte */
        CUDA_CHECK(cudaMemsetAsync(out[1], 0, (size_t)qd_swizzle_bytes(in->rows, g.scale_cols), qd_stream()));
    QD_DTYPE_SWITCH(in->dtype, DT, QD_ELEM_SWITCH(g.elem, ELEM,
                    mx_quantize_kernel<DT, ELEM><<<qd_grid(nblocks, MX_THREADS), MX_THREADS, 0, qd_stream()>>>(
                        g, in->data, nblocks, (uint8_t *)out[0], (uint8_t *)out[1], bad)));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_mx_dequantize(const struct qd_format *f, const void *const *in,
                                                const struct qd_params *p, struct qd_tensor *out)
{
    struct mx_geom g = mx_setup(f, p, out->cols);
    int64_t nblocks = qd_tensor_numel(out) / QD_MX_BLOCK;
    QD_DTYPE_SWITCH(out->dtype, DT, QD_ELEM_SWITCH(g.elem, ELEM,
                    mx_dequantize_kernel<DT, ELEM><<<qd_grid(nblocks, MX_THREADS), MX_THREADS, 0, qd_stream()>>>(
                        g, (const uint8_t *)in[0], (const uint8_t *)in[1], nblocks, out->data)));
    CUDA_LAUNCHED();
    return QD_OK;
}

/* ---- NVFP4 ---------------------------------------------------------------------------------- */

/* What every block of a call shares. The scale byte is cvt(clamp((amax / 6) / pts)) with two
 * IEEE divisions; amax * c with c = 1 / (6 pts) is within 4 ulp of that quotient, so the
 * codes of amax * lo and amax * hi (c widened by 2^-21 each way) agree exactly when no rounding
 * boundary of e4m3 lies between them, and then they are the code of the quotient (cvt and the
 * clamp are monotonic); otherwise, or for a block whose amax / 6 would be subnormal, the two
 * divisions run. The multiplier (1 / pts) / e4m3 takes one of 128 values: a table per CTA. */
struct nvfp4_consts {
    float pts, inv_pts, lo, hi;
    int fast; /* lo and hi are normal floats */
};
static_assert(sizeof(nvfp4_consts) <= sizeof(((struct qd_scratch *)0)->consts), "scratch holds the constants");

/* The constants of a per-tensor scale, on the host (a given scale) or on the device (one
 * computed there): the same IEEE operations either way. */
__host__ __device__ inline nvfp4_consts nvfp4_make_consts(int two_level, float pts)
{
    nvfp4_consts k;
    k.pts = two_level ? pts : 0.0f;
    k.inv_pts = two_level ? 1.0f / pts : 0.0f;
    double c = 1.0 / (6.0 * (k.pts > 0.0f ? (double)k.pts : 1.0)); /* 6 pts is exact in double */
    k.lo = (float)(c * (1.0 - 0x1p-21));
    k.hi = (float)(c * (1.0 + 0x1p-21));
    uint32_t el = qd_f32_bits(k.lo) >> 23 & 0xff, eh = qd_f32_bits(k.hi) >> 23 & 0xff;
    k.fast = el != 0 && el != 0xff && eh != 0 && eh != 0xff; /* both normal */
    return k;
}

/* torchao per_tensor_amax_to_scale: amax / (F8E4M3_MAX * F4_E2M1_MAX), as on the CPU */
#define NVFP4_SCALE_DIVISOR 2688.0f

/* The per-tensor scale from the range the device computed, without a host round trip: torchao's
 * decode scale and the kernels' constants (ct 0), or compressed-tensors' global scale (ct 1);
 * the global_scale component written, the scale left where qd_cuda_finish reads it. */
__global__ void nvfp4_scale_kernel(int ct, int dt, struct qd_scratch *s, float *global_scale)
{
    float amax = s->range[0];
    if (ct) {
        float g = qd_ct_nvfp4_global_scale(amax, dt);
        s->scale = g;
        s->consts[0] = g;
        *global_scale = g;
        return;
    }
    /* an all-zero tensor would give torchao 0/0 = NaN scales; 1 encodes it as zeros */
    float pts = amax > 0.0f ? amax / NVFP4_SCALE_DIVISOR : 1.0f;
    s->scale = pts;
    *global_scale = 1.0f / pts;
    nvfp4_consts k = nvfp4_make_consts(1, pts);
    memcpy(s->consts, &k, sizeof k);
}

__device__ __forceinline__ void nvfp4_table(const nvfp4_consts &k, float *rt)
{
    if (threadIdx.x < 128) /* the division qd_nvfp4_quantize_block makes per block */
        rt[threadIdx.x] = (k.pts > 0.0f ? k.inv_pts : 1.0f) / qd_e4m3_to_f32((uint8_t)threadIdx.x);
    __syncthreads();
}

/* qd_nvfp4_quantize_block with the e2m1 codes of convert.cuh: block b's scale byte and 8 bytes
 * of codes. */
template <int DT>
__device__ __forceinline__ uint8_t nvfp4_block(const nvfp4_consts &k, const float *rt, const void *x, int64_t b,
                                               uint32_t *w, unsigned long long *bad)
{
    float v[QD_NVFP4_BLOCK];
    uint32_t top = qd_load_block_top<DT, QD_NVFP4_BLOCK>(x, b * QD_NVFP4_BLOCK, v);
    uint8_t sc = 0;
    w[0] = w[1] = 0;
    bool reference = top >= 0x7f800000u; /* NaN/Inf in the block */
    if (reference)
        qd_note_first_nonfinite<QD_NVFP4_BLOCK>(bad, v, b * QD_NVFP4_BLOCK);
    else {
        float amax = qd_bits_f32(top); /* finite: the plain max of |x| */
        /* (satfinite clamps from above as the clamp to 448 does) */
        uint32_t c2 = qd_fp8x2_finite<QD_E4M3>(fmaxf(amax * k.lo, QD_E4M3_TINY), fmaxf(amax * k.hi, QD_E4M3_TINY));
        if (k.fast && amax >= 0x1p-123f && (c2 & 0xffu) == (c2 >> 8))
            sc = (uint8_t)c2;
        else {
            float block_scale = amax / 6.0f;
            sc = (uint8_t)qd_fp8x2_finite<QD_E4M3>(
                qd_clamp(k.pts > 0.0f ? block_scale / k.pts : block_scale, QD_E4M3_TINY, 448.0f), 0.0f);
        }
        float r = rt[sc & 0x7f];
        /* torchao clamps v * r to +-6 first; e2m1 saturates at 6 by itself (non-NaN values) */
        reference = !(r <= 3.40282347e38f); /* 1/pts overflowed: 0 * inf would be NaN */
#pragma unroll
        for (int j = 0; j < QD_NVFP4_BLOCK; j++)
            w[j / 8] |= qd_e2m1_finite(v[j] * r) << (4 * (j % 8));
    }
    if (reference) { /* NaN/Inf in the block, or an infinite r: the reference block code */
        uint8_t packed[8];
        sc = qd_nvfp4_quantize_block(k.pts, v, packed);
        w[0] = w[1] = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i / 4] |= (uint32_t)packed[i] << (8 * (i % 4));
    }
    return sc;
}

/* Linear scales: thread per block, in order. */
template <int DT>
__global__ void __launch_bounds__(MX_THREADS) nvfp4_quantize_kernel(nvfp4_consts kv, const nvfp4_consts *kd,
                                                                    const void *x, int64_t nblocks,
                                                                    uint8_t *data, uint8_t *scales,
                                                                    float *gs_out, float gs,
                                                                    unsigned long long *bad)
{
    const nvfp4_consts k = kd ? *kd : kv; /* kd: computed on the device by nvfp4_scale_kernel */
    if (gs_out && blockIdx.x == 0 && threadIdx.x == 0) /* the global_scale component (no copy) */
        *gs_out = gs;
    __shared__ float rt[128];
    nvfp4_table(k, rt);
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    uint32_t w[2];
    scales[b] = nvfp4_block<DT>(k, rt, x, b, w, bad);
    ((uint2 *)data)[b] = make_uint2(w[0], w[1]);
}

/* Swizzled scales: one CTA per 128 x 4 tile of the scale matrix (512 blocks, two per thread),
 * the block of each (thread, pass) chosen so that a warp's 32 scale bytes are consecutive in
 * the tile (qd_swizzle_offset: byte o of a tile is row o/16 + 32 ((o/4) % 4), column o % 4);
 * four threads in a row read 128 contiguous bytes of bf16 input. The tile is written whole by
 * one CTA instead of 4 bytes at a time by 128 CTAs far apart. */
template <int DT>
__global__ void __launch_bounds__(256) nvfp4_quantize_tile_kernel(nvfp4_consts kv, const nvfp4_consts *kd,
                                                                  const void *x, int64_t rows,
                                                                  int64_t scale_cols, uint8_t *data, uint8_t *scales,
                                                                  float *gs_out, float gs,
                                                                  unsigned long long *bad)
{
    const nvfp4_consts k = kd ? *kd : kv;
    if (gs_out && blockIdx.x == 0 && threadIdx.x == 0) /* the global_scale component (no copy) */
        *gs_out = gs;
    __shared__ float rt[128];
    nvfp4_table(k, rt);
    int64_t col_tiles = (scale_cols + 3) / 4, tr = blockIdx.x / col_tiles, tc = blockIdx.x % col_tiles;
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        int o = threadIdx.x + 256 * pass;
        int64_t row = 128 * tr + o / 16 + 32 * ((o / 4) % 4), col = 4 * tc + o % 4;
        if (row >= rows || col >= scale_cols)
            continue; /* padding: the memset's zeros stay */
        int64_t b = row * scale_cols + col;
        uint32_t w[2];
        scales[(int64_t)blockIdx.x * 512 + o] = nvfp4_block<DT>(k, rt, x, b, w, bad);
        ((uint2 *)data)[b] = make_uint2(w[0], w[1]);
    }
}

/* CT: flow=compressed_tensors, whose decompressor multiplies by scale / gs (pts holds gs) */
template <int DT, bool CT>
__global__ void __launch_bounds__(MX_THREADS) nvfp4_dequantize_kernel(float pts, int swizzled, int64_t scale_cols,
                                                                      const uint8_t *data, const uint8_t *scales,
                                                                      int64_t nblocks, void *y)
{
    __shared__ uint4 tile[MX_THREADS * qd_tile<DT, QD_NVFP4_BLOCK>::CH];
    __shared__ float e2m1[16]; /* lanes index it independently: shared, not a local array */
    if (threadIdx.x < 16)
        e2m1[threadIdx.x] = qd_floatx_to_f32((uint8_t)threadIdx.x, 2, 1);
    __syncthreads();
    int64_t first = blockIdx.x * (int64_t)MX_THREADS, b = first + threadIdx.x;
    int nvalid = nblocks - first < MX_THREADS ? (int)(nblocks - first) : MX_THREADS;
    if (b < nblocks && CT) {
        float v[QD_NVFP4_BLOCK];
        qd_ct_nvfp4_dequantize_block(pts, scales[scale_pos(b, scale_cols, swizzled)], data + b * 8, v);
        tile_put<DT, QD_NVFP4_BLOCK>(tile, v);
    } else if (b < nblocks) { /* qd_nvfp4_dequantize_block, the same operations */
        uint2 w = ((const uint2 *)data)[b];
        float s = qd_e4m3_to_f32(scales[scale_pos(b, scale_cols, swizzled)]);
        float v[QD_NVFP4_BLOCK];
#pragma unroll
        for (int j = 0; j < QD_NVFP4_BLOCK; j++) {
            float e = e2m1[((j < 8 ? w.x : w.y) >> (4 * (j % 8))) & 15] * s;
            v[j] = pts > 0.0f ? e * pts : e;
        }
        tile_put<DT, QD_NVFP4_BLOCK>(tile, v);
    }
    __syncthreads();
    tile_store<DT, QD_NVFP4_BLOCK>(tile, (uint8_t *)y + first * QD_NVFP4_BLOCK * qd_tile<DT, QD_NVFP4_BLOCK>::esize,
                                   nvalid);
}

/* flow=compressed_tensors: thread per block, kernels/mx.h's block code (its IEEE divisions
 * as they are), scales linear or swizzled. */
template <int DT>
__global__ void __launch_bounds__(MX_THREADS) nvfp4_ct_quantize_kernel(float gs, const float *gsd, int swizzled,
                                                                       int64_t scale_cols, const void *x,
                                                                       int64_t nblocks, uint8_t *data,
                                                                       uint8_t *scales, float *gs_out,
                                                                       unsigned long long *bad)
{
    if (gsd) /* computed on the device by nvfp4_scale_kernel (which wrote the component) */
        gs = *gsd;
    else if (gs_out && blockIdx.x == 0 && threadIdx.x == 0) /* the global_scale component (no copy) */
        *gs_out = gs;
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float v[QD_NVFP4_BLOCK];
    uint32_t top = qd_load_block_top<DT, QD_NVFP4_BLOCK>(x, b * QD_NVFP4_BLOCK, v);
    uint32_t w[2] = {0, 0};
    uint8_t sb;
    if (top >= 0x7f800000u) { /* NaN/Inf: noted (or allowed), the shared block code */
        qd_note_first_nonfinite<QD_NVFP4_BLOCK>(bad, v, b * QD_NVFP4_BLOCK);
        uint8_t packed[8];
        sb = qd_ct_nvfp4_block(gs, DT, v, packed);
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i / 4] |= (uint32_t)packed[i] << (8 * (i % 4));
    } else { /* qd_ct_nvfp4_block with convert.cuh's e2m1 (the same codes for non-NaN values) */
        float eff;
        sb = qd_ct_nvfp4_scale(gs, DT, qd_bits_f32(top), &eff);
#pragma unroll
        for (int j = 0; j < QD_NVFP4_BLOCK; j++) {
            float q = v[j] / eff;
            w[j / 8] |= (q == 0.0f ? 0u : qd_e2m1_finite(q)) << (4 * (j % 8));
        }
    }
    scales[scale_pos(b, scale_cols, swizzled)] = sb;
    ((uint2 *)data)[b] = make_uint2(w[0], w[1]);
}

/* The global scale a stored component holds, read back (dequantizing without the parameter). */
static enum qd_status stored_global_scale(const void *dev, float *gs)
{
    struct qd_scratch *h = qd_scratch_host();
    CUDA_CHECK(cudaMemcpyAsync(h->partial, dev, sizeof(float), cudaMemcpyDeviceToHost, qd_stream()));
    CUDA_CHECK(cudaStreamSynchronize(qd_stream()));
    *gs = h->partial[0];
    return QD_OK;
}

static enum qd_status nvfp4_ct_quantize(const struct qd_tensor *in, struct qd_params *p, void *const *out,
                                        unsigned long long *bad)
{
    enum qd_status s;
    const float *gsd = NULL;
    struct qd_scratch *d = qd_scratch_dev();
    if (!p->has_global_scale) { /* the tensor's range first (and the non-finite check), no round trip */
        if ((s = qd_cuda_range_async(in, bad)) != QD_OK)
            return s;
        nvfp4_scale_kernel<<<1, 1, 0, qd_stream()>>>(1, in->dtype, d, (float *)out[2]);
        CUDA_LAUNCHED();
        gsd = d->consts;
        qd_cuda_ctx_get()->pending_scale = 2; /* back beside the flag: qd_cuda_finish sets p's */
    }
    int swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    int64_t scale_cols = in->cols / QD_NVFP4_BLOCK, nblocks = qd_tensor_numel(in) / QD_NVFP4_BLOCK;
    if (swizzled && swizzle_padded(in->rows, scale_cols))
        CUDA_CHECK(cudaMemsetAsync(out[1], 0, (size_t)qd_swizzle_bytes(in->rows, scale_cols), qd_stream()));
    QD_DTYPE_SWITCH(in->dtype, DT,
                    nvfp4_ct_quantize_kernel<DT><<<qd_grid(nblocks, MX_THREADS), MX_THREADS, 0, qd_stream()>>>(
                        p->global_scale, gsd, swizzled, scale_cols, in->data, nblocks, (uint8_t *)out[0],
                        (uint8_t *)out[1], (float *)out[2], bad));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_nvfp4_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                 struct qd_params *p, void *const *out)
{
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    if (p->flow == QD_FLOW_COMPRESSED_TENSORS)
        return nvfp4_ct_quantize(in, p, out, bad);
    const nvfp4_consts *kd = NULL;
    struct qd_scratch *d = qd_scratch_dev();
    if (p->two_level && !p->has_per_tensor_scale && !p->has_global_scale) {
        /* the two-pass case: the tensor's range (and the non-finite check), then the scale and
         * the constants from it on the device: no host round trip between the passes */
        if ((s = qd_cuda_range_async(in, bad)) != QD_OK)
            return s;
        nvfp4_scale_kernel<<<1, 1, 0, qd_stream()>>>(0, in->dtype, d, (float *)out[2]);
        CUDA_LAUNCHED();
        kd = (const nvfp4_consts *)d->consts;
        qd_cuda_ctx_get()->pending_scale = 1; /* back beside the flag: qd_cuda_finish sets p's */
    } else {
        if (p->two_level && !p->has_per_tensor_scale) {
            p->per_tensor_scale = 1.0f / p->global_scale;
            p->has_per_tensor_scale = 1;
        }
        if (p->two_level && !p->has_global_scale) {
            p->global_scale = 1.0f / p->per_tensor_scale;
            p->has_global_scale = 1;
        }
    }
    int swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    int64_t scale_cols = in->cols / QD_NVFP4_BLOCK, nblocks = qd_tensor_numel(in) / QD_NVFP4_BLOCK;
    if (swizzled && swizzle_padded(in->rows, scale_cols)) /* else the kernel writes every byte */
        CUDA_CHECK(cudaMemsetAsync(out[1], 0, (size_t)qd_swizzle_bytes(in->rows, scale_cols), qd_stream()));
    const nvfp4_consts k = nvfp4_make_consts(p->two_level, kd ? 1.0f : p->per_tensor_scale); /* unused with kd */
    if (swizzled) {
        int64_t tiles = (in->rows + 127) / 128 * ((scale_cols + 3) / 4);
        QD_DTYPE_SWITCH(in->dtype, DT,
                        nvfp4_quantize_tile_kernel<DT><<<qd_grid(tiles, 1), 256, 0, qd_stream()>>>(
                            k, kd, in->data, in->rows, scale_cols, (uint8_t *)out[0], (uint8_t *)out[1],
                            kd ? NULL : (float *)out[2], p->two_level ? p->global_scale : 1.0f, bad));
    } else {
        QD_DTYPE_SWITCH(in->dtype, DT,
                        nvfp4_quantize_kernel<DT><<<qd_grid(nblocks, MX_THREADS), MX_THREADS, 0, qd_stream()>>>(
                            k, kd, in->data, nblocks, (uint8_t *)out[0], (uint8_t *)out[1],
                            kd ? NULL : (float *)out[2], p->two_level ? p->global_scale : 1.0f, bad));
    }
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_nvfp4_dequantize(const struct qd_format *f, const void *const *in,
                                                   const struct qd_params *p, struct qd_tensor *out)
{
    float pts = 0.0f;
    int swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    int64_t scale_cols = out->cols / QD_NVFP4_BLOCK, nblocks = qd_tensor_numel(out) / QD_NVFP4_BLOCK;
    if (p->flow == QD_FLOW_COMPRESSED_TENSORS) {
        float gs = p->global_scale;
        enum qd_status s;
        if (!p->has_global_scale && (s = stored_global_scale(in[2], &gs)) != QD_OK)
            return s;
        QD_DTYPE_SWITCH(out->dtype, DT,
                        nvfp4_dequantize_kernel<DT, true><<<qd_grid(nblocks, MX_THREADS), MX_THREADS, 0, qd_stream()>>>(
                            gs, swizzled, scale_cols, (const uint8_t *)in[0], (const uint8_t *)in[1], nblocks,
                            out->data));
        CUDA_LAUNCHED();
        return QD_OK;
    }
    if (p->two_level) {
        pts = p->per_tensor_scale;
        enum qd_status s;
        if (!p->has_per_tensor_scale) { /* 1 / the stored global scale */
            if ((s = stored_global_scale(in[2], &pts)) != QD_OK)
                return s;
            pts = 1.0f / pts;
        }
    }
    QD_DTYPE_SWITCH(out->dtype, DT,
                    nvfp4_dequantize_kernel<DT, false><<<qd_grid(nblocks, MX_THREADS), MX_THREADS, 0, qd_stream()>>>(
                        pts, swizzled, scale_cols, (const uint8_t *)in[0], (const uint8_t *)in[1], nblocks,
                        out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
