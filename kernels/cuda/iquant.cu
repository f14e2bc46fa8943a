/* ggml's iq4_nl, iq4_xs, tq1_0, tq2_0 and MXFP4 on the GPU, with the CPU's block code
 * (kernels/iquants.h, built without FMA contraction): one thread per block for quantize (the
 * iq4 searches weighted by the importance when one is given) but iq4_xs's, a thread per
 * sub-block; dequantize a thread per 8 values, tq1_0's and tq2_0's a thread per block. */
#include "../iquants.h"
#include "subblock.cuh"
#include "tile.cuh"

#define IQ_THREADS 64

template <int DT, int TYPE>
__global__ void __launch_bounds__(IQ_THREADS) iquant_quantize_kernel(const void *x, int64_t nblocks, int64_t cols,
                                                                     const float *imp, int64_t mrows, uint8_t *out,
                                                                     unsigned long long *bad)
{
    constexpr int N = (TYPE == QD_IQ4_NL || TYPE == QD_MXFP4_GGML) ? 32 : QD_QK_K;
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    const int64_t e0 = b * N;
    float v[N];
    if (qd_load_block_top<DT, N>(x, e0, v) >= 0x7f800000u)
        qd_note_first_nonfinite<N>(bad, v, e0);
    const float *qw = imp ? (mrows ? imp + e0 / cols / mrows * cols : imp) + e0 % cols : NULL;
    qd_iquant_quantize_block(TYPE, v, qw, out + b * qd_iquant_block_bytes(TYPE));
}

/* A thread per 8 values (item: a group), but a thread per block (item: a block) where the type's
 * block is not made of 8-value groups (QD_IQUANT_EIGHTS 0: tq1_0, tq2_0). */
template <int DT, int TYPE>
__global__ void __launch_bounds__(QD_EIGHT_THREADS) iquant_dequantize_kernel(const uint8_t *in, int64_t items, void *y)
{
    constexpr int G = QD_IQUANT_EIGHTS(TYPE);
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= items)
        return;
    if constexpr (G > 0) {
        float v[8];
        qd_iquant_dequantize_eight(TYPE, in + i / G * qd_iquant_block_bytes(TYPE), (int)(i % G), v);
        qd_store_block<DT, 8>(y, i * 8, v);
    } else {
        float v[QD_QK_K];
        qd_iquant_dequantize_block(TYPE, in + i * qd_iquant_block_bytes(TYPE), v);
        qd_store_block<DT, QD_QK_K>(y, i * QD_QK_K, v);
    }
}

/* iq4_xs: a thread per 32-element sub-block, eight per super-block, IQ4XS_SB super-blocks a CTA.
 * Each super-block's values pass through shared memory for sigma2, which each of its eight
 * threads sums in full in the CPU's order; the eight scales and scale codes meet by shuffles
 * within the eight lanes. (One thread per super-block held 256 values in local memory, and a
 * tensor of 4096^2 gave the GPU 65536 threads.) */
#define IQ4XS_SB 16

template <int DT>
__global__ void __launch_bounds__(8 * IQ4XS_SB) iq4xs_quantize_kernel(const void *x, int64_t nblocks, int64_t cols,
                                                                      const float *imp, int64_t mrows, uint8_t *out,
                                                                      unsigned long long *bad)
{
    __shared__ float sx[IQ4XS_SB][QD_QK_K + 1]; /* (+1: the groups of a warp read different banks) */
    const int g = threadIdx.x / 8, ib = threadIdx.x % 8;
    const int64_t b = blockIdx.x * (int64_t)IQ4XS_SB + g, e0 = b * QD_QK_K;
    if (b >= nblocks) /* (a whole group: its eight lanes share b) */
        return;
    float xb[32];
    qd_sub_load<DT, 8>(x, e0, ib, xb, sx[g], bad);
    const unsigned lanes = qd_sub_lanes<8>(g);
    __syncwarp(lanes);
    const float sigma2 = qd_iq4_sigma2(sx[g], QD_QK_K);
    const float scale = qd_iq4_sub_scale(xb, qd_sub_importance<8>(imp, mrows, cols, e0, ib), sigma2);
    float scales[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        scales[k] = __shfl_sync(lanes, scale, k, 8);
    const float d = -qd_kq_max_abs_first(scales, 8) / 32.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t L[32];
    const int l = qd_iq4_xs_sub_codes(d, id, scale, xb, L);
    uint8_t *blk = out + b * qd_iquant_block_bytes(QD_IQ4_XS); /* 136: 8-byte aligned */
    uint32_t q4[4];
    qd_iq4_pack(L, (uint8_t *)q4);
    *(uint2 *)(blk + 8 + 16 * ib) = make_uint2(q4[0], q4[1]);
    *(uint2 *)(blk + 16 + 16 * ib) = make_uint2(q4[2], q4[3]);
    int ls[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        ls[k] = __shfl_sync(lanes, l, k, 8);
    if (ib == 0) {
        uint32_t head[2];
        qd_iq4_xs_put_scales(d, ls, (uint8_t *)head);
        *(uint2 *)blk = make_uint2(head[0], head[1]);
    }
}

#define IQUANT_TYPE_SWITCH(t, TYPE, ...)                                                        \
    switch (t) {                                                                                \
    case QD_IQ4_NL: { constexpr int TYPE = QD_IQ4_NL; __VA_ARGS__; } break;                     \
    case QD_IQ4_XS: { constexpr int TYPE = QD_IQ4_XS; __VA_ARGS__; } break;                     \
    case QD_TQ1_0: { constexpr int TYPE = QD_TQ1_0; __VA_ARGS__; } break;                       \
    case QD_TQ2_0: { constexpr int TYPE = QD_TQ2_0; __VA_ARGS__; } break;                       \
    default: { constexpr int TYPE = QD_MXFP4_GGML; __VA_ARGS__; } break;                        \
    }

extern "C" enum qd_status qd_cuda_iquant_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                  struct qd_params *p, void *const *out)
{
    const int64_t nblocks = qd_tensor_numel(in) / f->block_elems;
    /* only the iq4 searches read the importance (ggml ignores it for the others) */
    const int weighted = p->importance && (f->code == QD_IQ4_NL || f->code == QD_IQ4_XS);
    const int64_t mrows = weighted ? qd_cuda_importance_matrix_rows(p, in) : 0;
    float *imp = NULL;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK)
        return s;
    if (weighted && (s = qd_cuda_importance(p, &imp)) != QD_OK)
        return s;
    if (f->code == QD_IQ4_XS) {
        QD_DTYPE_SWITCH(in->dtype, DT, iq4xs_quantize_kernel<DT><<<qd_grid(nblocks, IQ4XS_SB), 8 * IQ4XS_SB, 0, qd_stream()>>>(
                            in->data, nblocks, in->cols, imp, mrows, (uint8_t *)out[0], bad));
    } else {
        QD_DTYPE_SWITCH(in->dtype, DT, IQUANT_TYPE_SWITCH(f->code, TYPE,
                        iquant_quantize_kernel<DT, TYPE><<<qd_grid(nblocks, IQ_THREADS), IQ_THREADS, 0, qd_stream()>>>(
                            in->data, nblocks, in->cols, imp, mrows, (uint8_t *)out[0], bad)));
    }
    CUDA_LAUNCHED();
    if (imp)
        CUDA_CHECK(cudaFreeAsync(imp, qd_stream()));
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_iquant_dequantize(const struct qd_format *f, const void *const *in,
                                                    const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    const int64_t items = qd_tensor_numel(out) / (QD_IQUANT_EIGHTS(f->code) > 0 ? 8 : f->block_elems);
    QD_DTYPE_SWITCH(out->dtype, DT, IQUANT_TYPE_SWITCH(f->code, TYPE,
                    iquant_dequantize_kernel<DT, TYPE><<<qd_grid(items, QD_EIGHT_THREADS), QD_EIGHT_THREADS, 0, qd_stream()>>>(
                        (const uint8_t *)in[0], items, out->data)));
    CUDA_LAUNCHED();
    return QD_OK;
}
