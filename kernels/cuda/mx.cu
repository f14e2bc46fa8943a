/* OCP MX (mxfp4, mxfp6_e2m3/e3m2, mxfp8_e4m3/e5m2) on the GPU (NVFP4: nvfp4.cu): one thread per
 * block of 32 elements, the block arithmetic of kernels/mx.h, scales linear or in the swizzled
 * 128x4 tensor-core tiling (zero padding cleared first, as on the CPU). Packed blocks and
 * dequantized elements move through shared memory per CTA (tile.cuh); the element encoders
 * are those of convert.cuh (Hopper's fp8 cvt where it gives the same bits). Blocks holding
 * NaN/Inf (allowed by the caller) take the reference block code of mx.h. compressed-tensors'
 * arithmetic (mxfp4 scale_rounding=even) runs the block code of mx.h, shared with the CPU. */
#include "../mx.h"
#include "convert.cuh"
#include "tile.cuh"

#define MX_THREADS 128

struct mx_geom {
    int elem, rceil, unpacked, swizzled, data_bytes;
    int even; /* scale_rounding=even: compressed-tensors' MXFP4 (kernels/mx.h), by the input's dtype */
    int64_t scale_cols;
};

__device__ __forceinline__ int64_t scale_index(const struct mx_geom &g, int64_t block)
{
    return qd_scale_pos(block, g.scale_cols, g.swizzled);
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
            /* mx.h's qd_ct_mx_block with the e2m1 pairs of convert.cuh (the f32 quotient:
             * only -0.0 and an f32 underflow lose the sign bit, as in qd_ct_e2m1) */
            int sb = qd_ct_mx_scale(qd_bits_f32(top), DT);
            if (sb < 0 && bad)
                atomicMin(bad, (unsigned long long)(QD_BAD_MX_SCALE_RANGE | (b * QD_MX_BLOCK)));
            scale = sb < 0 ? (uint8_t)255 : (uint8_t)sb;
            float inv = sb < 0 ? 0.0f : qd_e8m0_reciprocal(scale);
            uint32_t pair[16];
#pragma unroll
            for (int k = 0; k < 16; k++) {
                float a = v[2 * k] * inv, c = v[2 * k + 1] * inv;
                pair[k] = qd_mx_encode2_finite<ELEM>(a, c) & (a == 0.0f ? 0xff00u : 0xffffu) &
                          (c == 0.0f ? 0x00ffu : 0xffffu);
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
    case QD_E5M2: { constexpr int ELEM = QD_E5M2; __VA_ARGS__; } break;                         \
    default: QD_SWITCH_UNKNOWN();                                                               \
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


extern "C" enum qd_status qd_cuda_mx_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                              struct qd_params *p, void *const *out)
{
    struct mx_geom g = mx_setup(f, p, in->cols);
    int64_t nblocks = qd_tensor_numel(in) / QD_MX_BLOCK;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    if (g.swizzled && qd_swizzle_padded(in->rows, g.scale_cols)) /* else the kernel writes every byte */
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
