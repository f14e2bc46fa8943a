/* iq1_s's sub-block before its neighbour searches, a thread's 32 values in registers: the CPU's
 * pieces (kernels/iq1.h: qd_iq1s_sub_sums, qd_iq1s_split_search, qd_iq1s_sub_levels) with the
 * same operations in the same order, but nothing indexed by data. The CPU sorts the values
 * and walks its prefix sums by the split's ends; on the GPU those arrays lived on the stack
 * (784 bytes a thread), and the kernel waited on local memory: Nsight Compute put 61 % of its
 * cycles between instructions on L1TEX waits, with 4.5 warps a scheduler. Here each value's
 * rank stands in for the sort, the prefix sums sit in registers, and the split search jumps
 * into a chain of its 33 second ends unrolled (a switch falling through), so that every sum
 * it reads has a constant index; each split is the CPU's own step (qd_iq1s_try). Written in the C that nvcc and a C compiler share, so that
 * tests/kernels/test_iq1s_regs.c checks it against the CPU's pieces without a GPU. */
#ifndef QD_CUDA_IQ1S_REGS_CUH
#define QD_CUDA_IQ1S_REGS_CUH

#include "../iq1.h"

/* x's bits in an order that unsigned comparison keeps, -0 as +0: with the value's index below
 * (a 64-bit key), qd_iq1_sort's order, equal values by index (nothing here is NaN: iq1_s
 * refuses non-finite input). */
__device__ __forceinline__ uint32_t iq1s_key(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = x == 0.0f ? 0u : u;
    return u >> 31 ? ~u : u | 0x80000000u;
}

/* Each value's rank in qd_iq1_sort's order (ascending, equal values by index), 4 to a word of
 * rk, and the prefix sums of w x and of w in that order into sumx, sumw (33 each). x and w are
 * read by index (on the GPU the thread's row of shared memory). The sorted terms pass through
 * srt (64 floats of the thread's own): a store at each rank, then loads in order. The ranks
 * count in a loop over the other value, each step comparing it with all 32 keys: written out as
 * 32 x 32 comparisons they were about 45 KB of code that every sub-block walked once (Nsight
 * Compute: a third of the kernel's stalls waiting on instruction fetch); as a loop iq1_s took
 * 1.70 ms at 4096^2 against 1.77 (measured: the git history of docs/BENCHMARKS.md). */
__device__ __forceinline__ void iq1s_ranks(const float *x, const float *w, uint32_t *rk, float *srt, float *sumx,
                                           float *sumw)
{
    uint32_t key[32];
#pragma unroll
    for (int i = 0; i < 32; i++)
        key[i] = iq1s_key(x[i]);
#pragma unroll
    for (int q = 0; q < 8; q++)
        rk[q] = 0;
    QD_ROLLED
    for (int j = 0; j < 32; j++) {
        /* (x[j]'s key made again: key[j] at a run-time index would put key on the stack) */
        const uint64_t kj = (uint64_t)iq1s_key(x[j]) << 32 | (uint32_t)j;
#pragma unroll
        for (int i = 0; i < 32; i++)
            rk[i / 4] += kj < ((uint64_t)key[i] << 32 | (uint32_t)i) ? 1u << 8 * (i % 4) : 0u;
    }
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int r = (int)(rk[i / 4] >> 8 * (i % 4) & 255u);
        srt[r] = w[i] * x[i];
        srt[32 + r] = w[i];
    }
    sumx[0] = sumw[0] = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        sumx[j + 1] = sumx[j] + srt[j];
        sumw[j + 1] = sumw[j] + srt[32 + j];
    }
}

/* value i's rank */
__device__ __forceinline__ int iq1s_rank(const uint32_t *rk, int i) { return (int)(rk[i / 4] >> 8 * (i % 4) & 255u); }

#define IQ1S_ENDS(X)                                                                                                   \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19)      \
        X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31) X(32)

/* qd_iq1s_split_search over the prefix sums sumx, sumw (registers) of a sub-block whose largest
 * |x| is max: the best score's split (the first of equals, in ggml's loop order). */
__device__ __forceinline__ struct qd_iq1s_split iq1s_split(const float *sumx, const float *sumw, float max)
{
    struct qd_iq1s_split s = {-1, -1, 0, max};
    float score = -QD_IQ_FLT_MAX;
#pragma unroll 1
    for (int i1 = 0; i1 <= 32; i1++) {
        float sx1 = 0.0f, sw1 = 0.0f;
        switch (i1) { /* the sums at i1, by a jump */
#define IQ1S_AT(k)                                                                                                     \
    case k:                                                                                                            \
        sx1 = sumx[k];                                                                                                 \
        sw1 = sumw[k];                                                                                                 \
        break;
            IQ1S_ENDS(IQ1S_AT)
#undef IQ1S_AT
        }
        float ax[2], aw[2];
        qd_iq1s_first_terms(sx1, sw1, sumx[0], sumw[0], ax, aw);
        switch (i1) { /* i2 from i1 to 32: enter the chain at i1 and fall through */
#define IQ1S_FROM(k)                                                                                                   \
    case k:                                                                                                            \
        qd_iq1s_try(ax, aw, sx1, sw1, sumx[k], sumw[k], sumx[32], sumw[32], i1, k, &s, &score);                        \
        __attribute__((fallthrough));
            IQ1S_ENDS(IQ1S_FROM)
#undef IQ1S_FROM
        default:
            break;
        }
    }
    return s;
}

/* qd_iq1s_sub_levels from the ranks: the 32 levels L, the scale and shift made positive; 0 where
 * no split passed. */
__device__ __forceinline__ int iq1s_levels(const uint32_t *rk, struct qd_iq1s_split s, int8_t *L, float *scale,
                                           int *shift)
{
    *scale = s.scale;
    *shift = s.shift;
    if (s.i1 < 0 || s.i2 < 0 || s.shift == 0)
        return 0;
    const int flip = s.scale < 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int r = iq1s_rank(rk, i), l = r < s.i1 ? 0 : r < s.i2 ? 1 : 2;
        L[i] = (int8_t)(flip ? 2 - l : l);
    }
    if (flip) {
        *scale = -*scale;
        *shift = -*shift;
    }
    return 1;
}

#endif
