/* ggml's iq3_xxs, iq1_s and iq1_m on the GPU, with the CPU's super-block code
 * (kernels/iqgrid_quants.h, built without FMA contraction): a lane per 4-value group to quantize
 * iq3_xxs (iq3xxs_lanes.cuh), a thread per sub-block for iq1_s (weighted by the importance when
 * one is given; its searches shared by the warp), one thread per 256-element super-block for
 * iq1_m's quantize, and a thread per 8 values to dequantize, over a device copy of the grid
 * tables the host built (kernels/iqgrid.c), made once per context (1.6 MB for the IQ1 grid,
 * 0.13 MB for IQ3_XXS's). Copied per call from pageable memory, the IQ1 grid cost iq1_s 0.13 ms
 * of its 1.89 ms quantize of a 4096^2 tensor and 0.08 of its 0.19 ms dequantize
 * (measured: the git history of docs/BENCHMARKS.md). */
#include "../iqgrid_quants.h"
#include "iq1s_regs.cuh"
#include "iq3xxs_lanes.cuh"
#include "iqwarp.cuh"
#include "subblock.cuh"
#include "tile.cuh"

#define IQG_THREADS 64

template <int DT, int TYPE>
__global__ void __launch_bounds__(IQG_THREADS) iqgrid_quantize_kernel(const void *x, int64_t nblocks, int64_t cols,
                                                                     const float *imp, int64_t mrows,
                                                                     struct qd_iq_grid g, uint8_t *out,
                                                                     unsigned long long *bad)
{
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    const int64_t e0 = b * QD_QK_K;
    float v[QD_QK_K];
    if (qd_load_block_top<DT, QD_QK_K>(x, e0, v) >= 0x7f800000u)
        qd_note_first_nonfinite<QD_QK_K>(bad, v, e0);
    const float *qw = imp ? (mrows ? imp + e0 / cols / mrows * cols : imp) + e0 % cols : NULL;
    qd_iqgrid_quantize_block(TYPE, &g, v, qw, out + b * qd_iqgrid_block_bytes(TYPE));
}

/* iq1_s: a thread per 32-element sub-block (subblock.cuh), 8 super-blocks a CTA. A thread's
 * sort and split search run on its values in registers (iq1s_regs.cuh); the off-grid 8-tuples'
 * neighbour searches are shared by the warp (iqwarp.cuh): with each lane searching its own
 * tuples (two of its four off the grid, 93 candidates a list, on N(0, 0.02) weights with an
 * importance), a warp waited each time for its longest lists. A lane's values and weights sit
 * in its row of shared memory for the others to read, at an odd stride (the lanes' same entries
 * in different banks); the group's super-block row (for sigma2, read before any of it is
 * written) shares its lanes' space. The group's lane 0 starts the block (its bytes cleared) and
 * ends it from the sub-blocks' scales, high bits and shifts, in the CPU's order. */
#define IQG_SB 8
#define IQ1_ROW 65
#define IQ1_X 0
#define IQ1_W 32

/* a level l of an IQ1 point stands for l - 1 shifted by delta (qd_iq1_value) */
struct iq1_value {
    static __device__ __forceinline__ float of(int l, float delta) { return qd_iq1_value(l, delta); }
};

/* qd_iq_tuple over the IQ1 grid (8 levels of 2 bits), with constant shifts */
__device__ __forceinline__ int iq1_tuple(const int8_t *L)
{
    int u = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
        u |= L[i] << 2 * i;
    return u;
}

/* (64, 8): at most 128 registers, 8 CTAs an SM (9 by shared memory); with 6 (168 registers)
 * it took 2.07-2.13 ms at 4096^2 against 2.01 */
template <int DT>
__global__ void __launch_bounds__(8 * IQG_SB, 8) iq1s_warp_quantize_kernel(const void *x, int64_t nblocks, int64_t cols,
                                                                          const float *imp, int64_t mrows,
                                                                          struct qd_iq_grid g, uint8_t *out,
                                                                          unsigned long long *bad)
{
    constexpr int BYTES = QD_IQ1S_BYTES;
    static_assert(8 * IQ1_ROW >= QD_QK_K, "a group's rows hold its super-block");
    __shared__ float rows[8 * IQG_SB * IQ1_ROW];
    __shared__ qd_warp_search<4> search[8 * IQG_SB / 32];
    __shared__ uint32_t sblk[IQG_SB][(BYTES + 3) / 4];
    __shared__ float sscale[IQG_SB][8];
    __shared__ uint32_t sword[IQG_SB][8]; /* the high bits */
    __shared__ int8_t sflag[IQG_SB][8], sshift[IQG_SB][8];
    const int gi = threadIdx.x / 8, ib = threadIdx.x % 8;
    const int64_t b = blockIdx.x * (int64_t)IQG_SB + gi, e0 = b * QD_QK_K;
    const bool live = b < nblocks; /* a dead lane still joins its warp's searches */
    float *row = rows + gi * 8 * IQ1_ROW, *own = rows + threadIdx.x * IQ1_ROW;
    const unsigned lanes = qd_sub_lanes<8>(gi);
    uint8_t *blk = (uint8_t *)sblk[gi];
    struct qd_iq1s_block b1, mine;
    int8_t L[32];
    float scale = 0.0f;
    int shift = 0, coded = 0;
    const uint16_t *lists[4] = {NULL, NULL, NULL, NULL};
    int grid[4]; /* each tuple's map entry: its grid index, or its list */
    if (live) {
        float xb[32], w[32];
        qd_sub_load<DT, 8>(x, e0, ib, xb, row, bad);
        __syncwarp(lanes);
        const float sigma2 = ib == 0 ? qd_iq1s_begin(row, blk, &b1) : qd_imx_block_sigma2(row, 2.0f);
        __syncwarp(lanes); /* every lane's sigma2 read the row before the rows are written */
        const float max = qd_iq1s_sub_weights(xb, qd_sub_importance<8>(imp, mrows, cols, e0, ib), sigma2, w);
#pragma unroll
        for (int i = 0; i < 32; i++) {
            own[IQ1_X + i] = xb[i];
            own[IQ1_W + i] = w[i];
        }
        if (max >= QD_IQ1S_ZERO) {
            uint32_t rk[8];
            float srt[64], sumx[33], sumw[33];
            iq1s_ranks(own + IQ1_X, own + IQ1_W, rk, srt, sumx, sumw); /* (read by index) */
            coded = iq1s_levels(rk, iq1s_split(sumx, sumw, max), L, &scale, &shift);
        }
        if (coded)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                grid[k] = __ldg(&g.map[iq1_tuple(L + 8 * k)]);
                lists[k] = grid[k] < 0 ? g.neighbours + (-grid[k] - 1) : NULL;
            }
    }
    __syncwarp();
    qd_warp_point8<iq1_value, 4> point; /* (iqwarp.cuh: why 4) */
    point.codes = g.codes;
    point.base = g.neighbours;
    int best[4];
    const float delta = qd_iq1s_delta(shift);
    qd_warp_neighbours<4, 8, IQ1_X, IQ1_W>(&search[threadIdx.x / 32], rows + (threadIdx.x & ~31) * IQ1_ROW, IQ1_ROW,
                                           scale, lists, point, best, delta);
    if (!live)
        return;
    qd_iq1s_block_init(&mine); /* this sub-block's entries as qd_iq1s_begin leaves them */
    if (coded) { /* qd_iq1_codes with the warp's searches */
        uint16_t index[4];
        const float deltas[4] = {delta, delta, delta, delta};
#pragma unroll
        for (int k = 0; k < 4; k++)
            index[k] = (uint16_t)(lists[k] ? __ldg(lists[k] + best[k]) : grid[k]);
        if (lists[0] || lists[1] || lists[2] || lists[3])
            scale = qd_iq1_refit(&g, 32, own + IQ1_X, own + IQ1_W, scale, deltas, index);
        qd_iq1s_sub_store(index, scale, shift, ib, &mine, blk);
    }
    sscale[gi][ib] = mine.scales[ib];
    sword[gi][ib] = mine.qh[ib];
    sshift[gi][ib] = mine.shifts[ib];
    sflag[gi][ib] = (int8_t)coded;
    __syncwarp(lanes);
    if (ib == 0) {
        for (int k = 0; k < 8; k++) {
            b1.qh[k] = (uint16_t)sword[gi][k];
            b1.scales[k] = sscale[gi][k];
            b1.shifts[k] = sshift[gi][k];
            if (sflag[gi][k]) /* the largest scale folded in the CPU's order */
                b1.max_scale = b1.max_scale > sscale[gi][k] ? b1.max_scale : sscale[gi][k];
        }
        qd_iq1s_finish(&b1, blk);
    }
    __syncwarp(lanes);
    qd_sub_store<8>(blk, out + b * BYTES, BYTES, ib);
}

/* a thread per 8 values, a super-block's 32 threads its groups in order */
template <int DT, int TYPE>
__global__ void __launch_bounds__(QD_EIGHT_THREADS) iqgrid_dequantize_kernel(const uint8_t *in, int64_t ngroups,
                                                                          struct qd_iq_grid g, void *y)
{
    const int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (k >= ngroups)
        return;
    float v[8];
    qd_iqgrid_dequantize_eight(TYPE, &g, in + k / 32 * qd_iqgrid_block_bytes(TYPE), (int)(k % 32), v);
    qd_store_block<DT, 8>(y, k * 8, v);
}

#define IQGRID_TYPE_SWITCH(t, TYPE, ...)                                                        \
    switch (t) {                                                                                \
    case QD_IQ3_XXS: { constexpr int TYPE = QD_IQ3_XXS; __VA_ARGS__; } break;                   \
    case QD_IQ1_S: { constexpr int TYPE = QD_IQ1_S; __VA_ARGS__; } break;                       \
    case QD_IQ1_M: { constexpr int TYPE = QD_IQ1_M; __VA_ARGS__; } break;                       \
    default: QD_SWITCH_UNKNOWN();                                                               \
    }

/* The type's tables on the context's device (map, point tuples, neighbour lists, their codes,
 * levels), pointed to by *d: copied on the context's first call for that grid, in stream order
 * (the kernels after it on the stream read them), freed by qd_cuda_ctx_free. IQ1_S and IQ1_M
 * share a grid. */
static enum qd_status device_grid(int type, struct qd_iq_grid *d)
{
    const struct qd_iq_grid *h = qd_iqgrid_tables(type);
    if (!h)
        return QD_ENOMEM;
    enum { PARTS = 5 };
    const size_t bytes[PARTS] = {(size_t)h->map_size * sizeof(int32_t), (size_t)h->n * sizeof(uint16_t),
                                 h->neighbours_len * sizeof(uint16_t), h->neighbours_len * sizeof(uint16_t),
                                 (size_t)h->n * (size_t)h->dim};
    size_t at[PARTS], total = 0;
    for (int i = 0; i < PARTS; i++) { /* each part 16-byte aligned (loads of any width) */
        at[i] = total;
        total += (bytes[i] + 15) & ~(size_t)15;
    }
    void **mem = &qd_cuda_ctx_get()->iqgrid_tables[type == QD_IQ3_XXS ? 0 : 1];
    if (!*mem) {
        void *m;
        CUDA_CHECK(cudaMalloc(&m, total));
        /* from pageable memory: staged before each call returns; the host tables never change */
        const void *part[PARTS] = {h->map, h->tuples, h->neighbours, h->codes, h->levels};
        cudaError_t e = cudaSuccess;
        for (int i = 0; i < PARTS && e == cudaSuccess; i++)
            e = cudaMemcpyAsync((uint8_t *)m + at[i], part[i], bytes[i], cudaMemcpyHostToDevice, qd_stream());
        if (e != cudaSuccess) {
            cudaFree(m);
            CUDA_CHECK(e);
        }
        *mem = m;
    }
    const uint8_t *base = (const uint8_t *)*mem;
    *d = *h;
    d->map = (const int32_t *)(base + at[0]);
    d->tuples = (const uint16_t *)(base + at[1]);
    d->neighbours = (const uint16_t *)(base + at[2]);
    d->codes = (const uint16_t *)(base + at[3]);
    d->levels = base + at[4];
    return QD_OK;
}

extern "C" enum qd_status qd_cuda_iqgrid_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                  struct qd_params *p, void *const *out)
{
    const int64_t nblocks = qd_tensor_numel(in) / QD_QK_K;
    const int64_t mrows = p->importance ? qd_cuda_importance_matrix_rows(p, in) : 0;
    float *imp = NULL;
    struct qd_iq_grid g;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK || (s = device_grid(f->code, &g)) != QD_OK || (s = qd_cuda_importance(p, &imp)) != QD_OK)
        return s;
    if (f->code == QD_IQ3_XXS) {
        QD_DTYPE_SWITCH(in->dtype, DT, iq3xxs_lanes_kernel<DT><<<(unsigned)nblocks, IQ3L_LANES, 0, qd_stream()>>>(
                            in->data, in->cols, imp, mrows, g, (uint8_t *)out[0], bad));
    } else if (f->code == QD_IQ1_S) {
        QD_DTYPE_SWITCH(in->dtype, DT, iq1s_warp_quantize_kernel<DT><<<qd_grid(nblocks, IQG_SB), 8 * IQG_SB, 0, qd_stream()>>>(
                            in->data, nblocks, in->cols, imp, mrows, g, (uint8_t *)out[0], bad));
    } else {
        QD_DTYPE_SWITCH(in->dtype, DT, iqgrid_quantize_kernel<DT, QD_IQ1_M><<<qd_grid(nblocks, IQG_THREADS), IQG_THREADS, 0, qd_stream()>>>(
                            in->data, nblocks, in->cols, imp, mrows, g, (uint8_t *)out[0], bad));
    }
    CUDA_LAUNCHED();
    if (imp)
        CUDA_CHECK(cudaFreeAsync(imp, qd_stream()));
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_iqgrid_dequantize(const struct qd_format *f, const void *const *in,
                                                    const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    const int64_t nblocks = qd_tensor_numel(out) / QD_QK_K;
    struct qd_iq_grid g;
    enum qd_status s = device_grid(f->code, &g);
    if (s != QD_OK)
        return s;
    QD_DTYPE_SWITCH(out->dtype, DT, IQGRID_TYPE_SWITCH(f->code, TYPE,
                    iqgrid_dequantize_kernel<DT, TYPE><<<qd_grid(32 * nblocks, QD_EIGHT_THREADS), QD_EIGHT_THREADS, 0, qd_stream()>>>(
                        (const uint8_t *)in[0], 32 * nblocks, g, out->data)));
    CUDA_LAUNCHED();
    return QD_OK;
}
