/* Pieces of the quantize kernels that run a thread per sub-block: a group of N threads per
 * 256-element super-block, each holding its 256 / N values in registers, the whole super-block
 * in shared memory for the sums ggml takes over it in order (sigma2), the block's bytes built
 * in shared memory (sub-blocks share some bytes) and copied out by the group. A thread per
 * super-block held 256 values and the search's arrays in local memory and gave a 4096^2
 * tensor 65536 threads; the group gives it N times as many, each with 1/N of the state. */
#ifndef QD_CUDA_SUBBLOCK_CUH
#define QD_CUDA_SUBBLOCK_CUH

#include "common.cuh"

/* The mask of group gi's N lanes in its warp (N divides 32). */
template <int N> __device__ __forceinline__ unsigned qd_sub_lanes(int gi)
{
    return N == 32 ? 0xffffffffu : ((1u << N) - 1) << (N * (gi % (32 / N)));
}

/* Sub-block ib's values of the super-block at element e0 into v and into the super-block's
 * shared row; the first non-finite noted (the smallest index wins, as over the whole block). */
template <int DT, int N>
__device__ __forceinline__ void qd_sub_load(const void *x, int64_t e0, int ib, float *v, float *row, unsigned long long *bad)
{
    constexpr int M = QD_QK_K / N;
    const int64_t e = e0 + M * ib;
    if (qd_load_block_top<DT, M>(x, e, v) >= 0x7f800000u)
        qd_note_first_nonfinite<M>(bad, v, e);
#pragma unroll
    for (int j = 0; j < M; j++)
        row[M * ib + j] = v[j];
}

/* Sub-block ib's importance: the row's vector (one per run of mrows rows when mrows), or NULL. */
template <int N>
__device__ __forceinline__ const float *qd_sub_importance(const float *imp, int64_t mrows, int64_t cols, int64_t e0, int ib)
{
    return imp ? (mrows ? imp + e0 / cols / mrows * cols : imp) + e0 % cols + QD_QK_K / N * ib : NULL;
}

/* The block's bytes (an even count; dst 2-byte aligned) from shared memory to dst by the group's
 * N lanes. */
template <int N> __device__ __forceinline__ void qd_sub_store(const uint8_t *src, uint8_t *dst, int bytes, int lane)
{
    for (int i = 2 * lane; i < bytes; i += 2 * N)
        *(uint16_t *)(dst + i) = *(const uint16_t *)(src + i);
}

#endif
