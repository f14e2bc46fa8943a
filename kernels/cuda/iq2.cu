/* ggml's iq2_xxs, iq2_xs and iq2_s on the GPU, with the CPU's block code (kernels/iq2.h, built
 * without FMA contraction): a thread per sub-block for quantize, the off-grid groups' neighbour
 * searches shared by the warp (iqwarp.cuh), one per 8 values for dequantize, all reading a
 * device copy of the host's tables (kernels/iq2.c), made once per device and type into module
 * globals (nothing to free). */
#include <pthread.h>

#include "../iq2.h"
#include "iqwarp.cuh"
#include "subblock.cuh"
#include "tile.cuh"

#define IQ2_MAX_DEVICES 64

__device__ struct qd_iq2_tables iq2_tables_dev[3];
__device__ uint16_t iq2_neighbours_dev[3][QD_IQ2_NEIGHBOURS_MAX];
__device__ __align__(16) uint16_t iq2_codes_dev[3][QD_IQ2_NEIGHBOURS_MAX]; /* (iq2_xxs's 8-byte loads) */
static const struct qd_iq2_tables *iq2_on_device[IQ2_MAX_DEVICES][3];
static pthread_mutex_t iq2_lock = PTHREAD_MUTEX_INITIALIZER;

/* type's tables on the current device (copied on first use); NULL on failure, noted */
static const struct qd_iq2_tables *iq2_device_tables(int type)
{
    const struct qd_iq2_tables *host = qd_iq2_tables(type);
    int dev = 0;
    if (!host || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= IQ2_MAX_DEVICES)
        return NULL;
    pthread_mutex_lock(&iq2_lock);
    if (!iq2_on_device[dev][type]) {
        struct qd_iq2_tables *t = NULL;
        uint16_t(*nb)[QD_IQ2_NEIGHBOURS_MAX] = NULL, (*cd)[QD_IQ2_NEIGHBOURS_MAX] = NULL;
        cudaStream_t s;
        cudaError_t e = cudaGetSymbolAddress((void **)&t, iq2_tables_dev);
        if (e == cudaSuccess)
            e = cudaGetSymbolAddress((void **)&nb, iq2_neighbours_dev);
        if (e == cudaSuccess)
            e = cudaGetSymbolAddress((void **)&cd, iq2_codes_dev);
        if (e == cudaSuccess && (e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) == cudaSuccess) {
            /* once per device and type, on its own stream, finished before anyone reads it */
            struct qd_iq2_tables copy = *host;
            const size_t bytes = (size_t)host->n_neighbours * sizeof(uint16_t);
            copy.neighbours = nb[type];
            copy.codes = cd[type];
            e = cudaMemcpyAsync(t + type, &copy, sizeof copy, cudaMemcpyHostToDevice, s);
            if (e == cudaSuccess)
                e = cudaMemcpyAsync(nb[type], host->neighbours, bytes, cudaMemcpyHostToDevice, s);
            if (e == cudaSuccess)
                e = cudaMemcpyAsync(cd[type], host->codes, bytes, cudaMemcpyHostToDevice, s);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(s);
            cudaStreamDestroy(s);
        }
        if (e != cudaSuccess)
            qd_cuda_note_error(e, __FILE__, __LINE__);
        else
            iq2_on_device[dev][type] = t + type;
    }
    const struct qd_iq2_tables *t = iq2_on_device[dev][type];
    pthread_mutex_unlock(&iq2_lock);
    return t;
}

/* A thread per sub-block, the off-grid groups' neighbour searches shared by the warp
 * (iqwarp.cuh): IQ2_XXS's sub-blocks of 32 values (4 groups of 8, 8 threads a super-block),
 * IQ2_XS's and IQ2_S's of 16 (2 groups, 16 threads). With each thread searching its own groups'
 * lists, a warp waited at every trial scale for its longest: IQ2_XS's lists hold 30 candidates
 * on average and up to 292, IQ2_S's 8 and 70, IQ2_XXS's 18 and 150. A thread's weights, their
 * roots and |x| live in its row of shared memory (the warp's lanes read each other's there), at
 * an odd stride so that the lanes' same entries fall in different banks; its group's super-block
 * row (for sigma2, read before any of it is written) shares its lanes' space. */
template <int TYPE> struct iq2_lane {
    static constexpr int V = TYPE == QD_IQ2_XXS ? 32 : 16; /* a thread's values */
    static constexpr int N = QD_QK_K / V;                  /* threads a super-block */
    static constexpr int G = V / 8;                        /* groups a thread */
    static constexpr int ROW = 3 * V + 1;                  /* its row's stride */
    static constexpr int W = 0, WAUX = V, XVAL = 2 * V;    /* weights, roots, |x| in it */
    static_assert(N * ROW >= QD_QK_K + 1, "a group's rows hold its super-block");
};

/* A group's distances to IQ2 grid points (qd_iq2_best_neighbour's): a level l stands for
 * 2 l + 1. */
struct iq2_value {
    static __device__ __forceinline__ float of(int l, float) { return (float)(2 * l + 1); }
};
typedef qd_warp_point8<iq2_value, 8> iq2_point; /* (iqwarp.cuh: why 8) */

/* Group k's levels at inverse scale id into L; its neighbour list where they are off the grid
 * and the lane is live, else NULL. */
__device__ __forceinline__ const uint16_t *iq2_levels(const struct qd_iq2_tables *t, const float *xval, float id,
                                                        bool live, int8_t *L)
{
#pragma unroll
    for (int i = 0; i < 8; i++)
        L[i] = (int8_t)qd_iq2_level(id, xval[i]);
    const int m = __ldg(&t->map[qd_iq2_tuple(L)]);
    return live && m < 0 ? t->neighbours + (-m - 1) : NULL;
}

/* An off-grid group's levels from the code of the candidate chosen at place j of its list (the
 * grid point's levels, 2 bits each), where the search read it, rather than from the list's grid
 * index and the grid's table. */
__device__ __forceinline__ void iq2_chosen_levels(const iq2_point &point, const uint16_t *list, int j, int8_t *L)
{
    const unsigned c = __ldg(point.codes_of(list) + j);
#pragma unroll
    for (int i = 0; i < 8; i++)
        L[i] = (int8_t)(c >> 2 * i & 3u);
}

/* One pass of a thread's groups in redo (a bit each) at inverse scale id: their levels into L and,
 * for those off the grid where the lane is live, the nearest listed point at scale (the warp's
 * search: every lane calls this together). Returns the groups that fell off the grid there. */
template <int TYPE>
__device__ __forceinline__ unsigned iq2_warp_groups(const struct qd_iq2_tables *t,
                                                    qd_warp_search<iq2_lane<TYPE>::G> *sh, const float *rows,
                                                    iq2_point &point, const float *xval, float id, float scale,
                                                    bool live, unsigned redo, int8_t *L)
{
    typedef iq2_lane<TYPE> S;
    const uint16_t *lists[S::G];
    int g[S::G];
#pragma unroll
    for (int k = 0; k < S::G; k++)
        lists[k] = redo >> k & 1 ? iq2_levels(t, xval + 8 * k, id, live, L + 8 * k) : NULL;
    qd_warp_neighbours<S::G, 8, S::XVAL, S::WAUX>(sh, rows, S::ROW, scale, lists, point, g);
    unsigned off = 0;
#pragma unroll
    for (int k = 0; k < S::G; k++)
        if (lists[k]) {
            iq2_chosen_levels(point, lists[k], g[k], L + 8 * k);
            off |= 1u << k;
        }
    return off;
}

/* qd_iq2xxs_sub (kernels/iq2.h) with the warp: the same operations in the same order, every lane
 * through every trial (a dead lane, a zero sub-block or past the tensor's end, with no lists). */
__device__ float iq2xxs_sub_warp(const struct qd_iq2_tables *t, qd_warp_search<4> *sh, const float *rows, bool live,
                                 int8_t *L, int *zero)
{
    typedef iq2_lane<QD_IQ2_XXS> S;
    const float *own = rows + (threadIdx.x & 31) * S::ROW, *weight = own + S::W, *xval = own + S::XVAL;
    iq2_point point; /* the tables' pointers read once, not at every group entered */
    point.codes = t->codes;
    point.base = t->neighbours;
    *zero = 1;
    float scale = 0.0f, eff_max = 0.0f;
    if (live) {
        float max = xval[0];
        for (int i = 1; i < 32; i++)
            max = max > xval[i] ? max : xval[i];
        if (max < QD_KQ_EPS) {
            live = false;
        } else {
            uint8_t Lq[32]; /* (the rolled refine indexes it at run time: on the stack, not L) */
            scale = qd_imx_make_qp(32, 4, xval, Lq, weight);
#pragma unroll
            for (int i = 0; i < 32; i++)
                L[i] = (int8_t)Lq[i];
            eff_max = scale * 3.0f;
            if (eff_max <= 0.0f)
                live = false;
            else
                *zero = 0;
        }
    }
    int8_t Laux[32];
    float best = 0.0f;
    /* the 13 trial scales (is = it - 6), then (it = 13) the levels again at the chosen scale, as
     * passes of one loop: the group pass is then one copy of code, not two */
    for (int it = 0; it <= 13; it++) {
        const bool last = it == 13, again = last && live && scale > 0.0f;
        const float id = last ? 1.0f / scale : (5.0f + (float)(it - 6) * 0.1f) / eff_max;
        iq2_warp_groups<QD_IQ2_XXS>(t, sh, rows, point, xval, id, last ? scale : 1.0f / id, live || last,
                                    last && !again ? 0u : 0xfu, Laux);
        if (!last) {
            if (live)
                qd_iq2xxs_take_trial(weight, xval, Laux, &scale, &best, L);
        } else if (again) {
#pragma unroll
            for (int i = 0; i < 32; i++)
                L[i] = Laux[i];
            scale = qd_kq_refit(32, weight, xval, L, scale);
        }
    }
    return live ? scale : 0.0f;
}

/* qd_iq2s_sub (kernels/iq2.h) with the warp: the same operations in the same order, every lane
 * through every trial (a dead lane, a zero sub-block or past the tensor's end, with no lists). */
template <int TYPE>
__device__ float iq2s_sub_warp(const struct qd_iq2_tables *t, qd_warp_search<2> *sh, const float *rows, bool live,
                               int8_t *L, int *zero)
{
    typedef iq2_lane<TYPE> S;
    const float *own = rows + (threadIdx.x & 31) * S::ROW, *weight = own + S::W, *xval = own + S::XVAL;
    iq2_point point;
    point.codes = t->codes;
    point.base = t->neighbours;
    float max = 0.0f;
    if (live) {
        max = xval[0];
        for (int i = 1; i < 16; i++)
            max = max > xval[i] ? max : xval[i];
    }
#pragma unroll
    for (int i = 0; i < 16; i++)
        L[i] = 0;
    *zero = !live || max < (TYPE == QD_IQ2_S ? 1e-8f : QD_KQ_EPS);
    live = !*zero;
    int8_t Laux[16];
    unsigned off_grid = 0; /* the chosen trial's groups off the grid */
    float best = 0.0f, scale = max / 5.0f;
    for (int is = -9; is <= 9; is++) {
        const float id = (5.0f + (float)is * 0.1f) / max, this_scale = 1.0f / id;
        const unsigned off = iq2_warp_groups<TYPE>(t, sh, rows, point, xval, id, this_scale, live, 0x3u, Laux);
        if (!live)
            continue;
        float sumqx, sumq2;
        qd_kq_odd_sums(16, weight, xval, Laux, &sumqx, &sumq2);
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
#pragma unroll
            for (int i = 0; i < 16; i++)
                L[i] = Laux[i];
            off_grid = off;
        }
    }
    /* the groups chosen off the grid, again at the chosen scale */
    const bool again = live && off_grid && scale > 0.0f;
    iq2_warp_groups<TYPE>(t, sh, rows, point, xval, 1.0f / scale, scale, true, again ? off_grid : 0u, L);
    if (again)
        scale = qd_kq_refit(16, weight, xval, L, scale);
    return live ? scale : 0.0f;
}

/* IQ2_XXS's (64, 6): at most 168 registers, for the six CTAs a SM that its shared memory allows;
 * IQ2_XS's and IQ2_S's no minimum (117 and 109 registers, eight CTAs; a minimum of 1 gave
 * iq2_xs 145, of 8 a spill) */
template <int DT, int TYPE>
__global__ void __launch_bounds__(64, TYPE == QD_IQ2_XXS ? 6 : 0)
    iq2_warp_quantize_kernel(const struct qd_iq2_tables *t, const void *x, int64_t nblocks, int64_t cols,
                             const float *imp, int64_t mrows, uint8_t *out, unsigned long long *bad)
{
    typedef iq2_lane<TYPE> S;
    constexpr int N = S::N, SB = 64 / N, BYTES = QD_IQ2_BLOCK_BYTES(TYPE);
    __shared__ float rows[64 * S::ROW];
    __shared__ qd_warp_search<S::G> search[2];
    __shared__ struct qd_iq2_sub sr[SB][N];
    __shared__ uint32_t sblk[SB][(BYTES + 3) / 4];
    const int gi = threadIdx.x / N, ib = threadIdx.x % N;
    const int64_t b = blockIdx.x * (int64_t)SB + gi, e0 = b * QD_QK_K;
    const bool live = b < nblocks; /* a dead lane still joins its warp's searches */
    float *row = rows + gi * N * S::ROW, *own = rows + threadIdx.x * S::ROW;
    const unsigned lanes = qd_sub_lanes<N>(gi);
    float xb[S::V];
    struct qd_iq2_sub *r = &sr[gi][ib];
    if (live) {
        qd_sub_load<DT, N>(x, e0, ib, xb, row, bad);
        __syncwarp(lanes);
        const float sigma2 = qd_iq2_sigma2(TYPE, row);
        __syncwarp(lanes); /* every lane's sigma2 read the row before the rows are written */
        qd_iq2_sub_prepare(TYPE, xb, qd_sub_importance<N>(imp, mrows, cols, e0, ib), sigma2, r, own + S::W,
                           own + S::WAUX, own + S::XVAL);
    }
    __syncwarp();
    int8_t L[S::V];
    const float *wrows = rows + (threadIdx.x & ~31) * S::ROW;
    float scale;
    if constexpr (TYPE == QD_IQ2_XXS)
        scale = iq2xxs_sub_warp(t, &search[threadIdx.x / 32], wrows, live, L, &r->zero);
    else
        scale = iq2s_sub_warp<TYPE>(t, &search[threadIdx.x / 32], wrows, live, L, &r->zero);
    if (!live)
        return;
    qd_iq2_sub_result(t, TYPE, scale, L, r);
    __syncwarp(lanes);
    uint8_t *blk = (uint8_t *)sblk[gi];
    if (ib == 0)
        qd_iq2_finish(TYPE, sr[gi], blk);
    __syncwarp(lanes);
    qd_sub_store<N>(blk, out + b * BYTES, BYTES, ib);
}

/* a thread per 8 values, a super-block's 32 threads its groups in order */
template <int DT, int TYPE>
__global__ void __launch_bounds__(QD_EIGHT_THREADS) iq2_dequantize_kernel(const struct qd_iq2_tables *t, const uint8_t *in,
                                                                        int64_t ngroups, void *y)
{
    const int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (k >= ngroups)
        return;
    float v[8];
    qd_iq2_dequantize_eight(t, TYPE, in + k / 32 * qd_iq2_block_bytes(TYPE), (int)(k % 32), v);
    qd_store_block<DT, 8>(y, k * 8, v);
}

#define IQ2_TYPE_SWITCH(t, TYPE, ...)                                                           \
    switch (t) {                                                                                \
    case QD_IQ2_XXS: { constexpr int TYPE = QD_IQ2_XXS; __VA_ARGS__; } break;                   \
    case QD_IQ2_XS: { constexpr int TYPE = QD_IQ2_XS; __VA_ARGS__; } break;                     \
    case QD_IQ2_S: { constexpr int TYPE = QD_IQ2_S; __VA_ARGS__; } break;                       \
    default: QD_SWITCH_UNKNOWN();                                                               \
    }

extern "C" enum qd_status qd_cuda_iq2_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                               struct qd_params *p, void *const *out)
{
    const int64_t nblocks = qd_tensor_numel(in) / QD_QK_K;
    const struct qd_iq2_tables *t = iq2_device_tables(f->code);
    if (!t)
        return QD_EDEVICE;
    const int64_t mrows = p->importance ? qd_cuda_importance_matrix_rows(p, in) : 0;
    float *imp = NULL;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK)
        return s;
    if ((s = qd_cuda_importance(p, &imp)) != QD_OK)
        return s;
    QD_DTYPE_SWITCH(in->dtype, DT, IQ2_TYPE_SWITCH(f->code, TYPE,
                    iq2_warp_quantize_kernel<DT, TYPE><<<qd_grid(nblocks, 64 / iq2_lane<TYPE>::N), 64, 0, qd_stream()>>>(
                        t, in->data, nblocks, in->cols, imp, mrows, (uint8_t *)out[0], bad)));
    CUDA_LAUNCHED();
    if (imp)
        CUDA_CHECK(cudaFreeAsync(imp, qd_stream()));
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_iq2_dequantize(const struct qd_format *f, const void *const *in,
                                                 const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    const int64_t nblocks = qd_tensor_numel(out) / QD_QK_K;
    const struct qd_iq2_tables *t = iq2_device_tables(f->code);
    if (!t)
        return QD_EDEVICE;
    QD_DTYPE_SWITCH(out->dtype, DT, IQ2_TYPE_SWITCH(f->code, TYPE,
                    iq2_dequantize_kernel<DT, TYPE><<<qd_grid(32 * nblocks, QD_EIGHT_THREADS), QD_EIGHT_THREADS, 0, qd_stream()>>>(
                        t, (const uint8_t *)in[0], 32 * nblocks, out->data)));
    CUDA_LAUNCHED();
    return QD_OK;
}
