/* The neighbour searches of a warp's off-grid groups, shared by its 32 lanes. In iq2_xxs's trial
 * loop a group whose levels fall off the grid looks for the nearest point of a list of
 * candidates (23 on average on N(0, 0.02) weights with an importance, over a hundred at
 * times); a lane per sub-block searching its own groups one after another kept the warp as
 * long as its longest list each time. Here each lane names its groups' lists, each list is cut
 * into tasks of POINT::TASK candidates, and the warp deals the tasks out in order, a run to
 * each lane. A lane readies a task's group (its distances' terms) and then takes all the
 * task's candidates in one unrolled step, their loads issued together. Where a group's tasks
 * span lanes, the smallest (distance, position in the list) over them is what ggml's loop
 * keeps: the first of the nearest, a distance counting only below FLT_MAX (NaN never).
 * Dealing single candidates instead left some lane readying a new group at almost every step
 * of the warp (Nsight Compute: 10.1 M of 11.0 M steps on iq2_xxs at 4096^2), each time for
 * the whole warp; a task's fixed width makes every lane ready its group at the same step.
 * Its users: iq2_xxs (4 groups a lane), iq2_xs and iq2_s (2: 3.7x and 2.1x faster than a
 * lane's own loop at 4096^2, IQ2_XS's lists 30 candidates on average and up to 292) and iq1_s.
 * iq3_xxs's short lists (8 groups of 4 a sub-block, 31 trial scales) made a warp search
 * slower, 2.3x with a loop per group and 1.28x with these tasks, so iq3_xxs keeps a lane's own
 * search (measured: the git history of docs/BENCHMARKS.md). */
#ifndef QD_CUDA_IQWARP_CUH
#define QD_CUDA_IQWARP_CUH

#include "common.cuh"
#include "iqlist.cuh"

/* A warp's shared state for G groups a lane. A list is kept as its offset in the tables' lists
 * and its count in 16 bits (not a pointer and an int): iq2_xxs's six CTAs an SM then take under
 * 196 KB of shared memory (31.8 KB each, was 33.3) and the driver leaves L1 the rest, 2 % faster
 * at 4096^2 (with the carveout forced to the largest, the old speed; the git history of
 * docs/BENCHMARKS.md). */
template <int G> struct qd_warp_search {
    unsigned long long best[32 * G]; /* (ordered distance << 32) | position, the least */
    int start[32 * G + 1];           /* each group's first task in the deal */
    uint16_t count[32 * G];          /* its candidates */
    uint32_t list[32 * G];           /* its list (the count, then grid indices): at point.base + this */
    float scale[32];                 /* the owner lane's trial scale */
    float aux[32];                   /* and what else its point's values take (iq1's shift) */
};

/* d2's bits in an order that unsigned comparison keeps (-0 as +0) */
__device__ __forceinline__ uint32_t qd_ordered_bits(float d2)
{
    const uint32_t u = d2 == 0.0f ? 0u : __float_as_uint(d2);
    return u >> 31 ? ~u : u | 0x80000000u;
}

/* Every lane of the warp calls this together. The lane's group k (of G, DIM values each)
 * searches list[k] (NULL: none) at the lane's scale; the lane's row of rows (stride floats a
 * lane, from the warp's first) holds its values at XOFF + DIM k and their weights at WOFF +
 * DIM k (iq2_xxs: |x| and the weights' roots; iq1_s: x and the weights). point.enter(list, xv,
 * w, s, aux) readies a group (values, weights, scale, the lane's aux), point.task(j, c) loads
 * its list's candidates j .. j + POINT::TASK - 1 (a task) and point.d2(code) gives the distance
 * to one, ggml's sum in ggml's order; every list lies in the table at point.base, placed as
 * kernels/iqlist.h says.
 * best[k] gets the chosen candidate's place in its list, 1 to the count (1 where no distance
 * counts, as quantd's CPU code takes the first listed): list[k][best[k]] is its grid index and
 * point.codes_of(list[k])[best[k]] its code (its levels). Each list's count is read from the
 * codes beside it, slot 0: the search reads the codes alone, not the lists too (for iq2_xxs,
 * with its levels taken from the chosen code, 17 % fewer L2 reads and 5 % faster at 4096^2). */
template <int G, int DIM, int XOFF, int WOFF, class POINT>
__device__ __forceinline__ void qd_warp_neighbours(qd_warp_search<G> *sh, const float *rows, int stride, float scale,
                                                   const uint16_t *const *list, POINT &point, int *best,
                                                   float aux = 0.0f)
{
    constexpr int T = POINT::TASK;
    const int lane = threadIdx.x & 31;
    int count[G], total = 0;
#pragma unroll
    for (int k = 0; k < G; k++) {
        count[k] = list[k] ? __ldg(point.codes_of(list[k])) : 0;
        sh->start[G * lane + k] = total; /* made absolute below */
        total += (count[k] + T - 1) / T;
    }
    int incl = total;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d)
            incl += v;
    }
    const int all = __shfl_sync(0xffffffffu, incl, 31);
    if (all == 0) { /* (uniform) */
#pragma unroll
        for (int k = 0; k < G; k++)
            if (list[k])
                best[k] = 1;
        return;
    }
#pragma unroll
    for (int k = 0; k < G; k++) {
        sh->start[G * lane + k] += incl - total;
        sh->count[G * lane + k] = (uint16_t)count[k];
        sh->list[G * lane + k] = list[k] ? (uint32_t)(list[k] - point.base) : 0u;
        sh->best[G * lane + k] = ~0ull;
    }
    if (lane == 31)
        sh->start[32 * G] = all;
    sh->scale[lane] = scale;
    sh->aux[lane] = aux;
    __syncwarp();
    const int run = (all + 31) / 32, t0 = lane * run, t1 = min(all, t0 + run);
    int tk = 0;
    if (t0 < t1) {
        int hi = 32 * G - 1; /* the last group starting at or before t0 */
        while (tk < hi) {
            const int mid = (tk + hi + 1) / 2;
            if (sh->start[mid] <= t0)
                tk = mid;
            else
                hi = mid - 1;
        }
    }
    for (int t = t0; t < t1; t++) {
        while (sh->start[tk + 1] <= t)
            tk++;
        const int owner = tk / G, k = tk % G, n = sh->count[tk], j0 = 1 + T * (t - sh->start[tk]);
        const float *row = rows + owner * stride;
        point.enter(point.base + sh->list[tk], row + XOFF + DIM * k, row + WOFF + DIM * k, sh->scale[owner],
                    sh->aux[owner]);
        unsigned code[T];
        point.task(j0, code);
        float best_d2 = 3.40282347e38f;
        int best_j = -1;
#pragma unroll
        for (int q = 0; q < T; q++) {
            const float d2 = point.d2(code[q]);
            if (j0 + q <= n && d2 < best_d2) {
                best_d2 = d2;
                best_j = j0 + q;
            }
        }
        if (best_j >= 0)
            atomicMin(&sh->best[tk], (unsigned long long)qd_ordered_bits(best_d2) << 32 | (unsigned)best_j);
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < G; k++)
        if (list[k]) {
            const unsigned long long key = count[k] ? sh->best[G * lane + k] : ~0ull;
            best[k] = key == ~0ull ? 1 : (int)(uint32_t)key;
        }
    __syncwarp(); /* read before the next call writes */
}

/* A point of 8 coordinates, each a level 0..2 of a 16-bit code (2 bits a level: the grid
 * tables' codes beside each list) standing for the value VALUE::of(l, aux). A coordinate's term
 * w (s v - x)^2 takes three values: enter makes the 24 with ggml's own operations, and a
 * candidate's distance adds its eight in ggml's order, picked by its levels (its code, not its
 * index and then its point). The tables start each list's candidates on a multiple of 4 entries
 * (kernels/iqlist.h), so a task's codes are aligned 8-byte loads, 4 codes each.
 * TASK, the candidates a task (4 or 8): a group entered (its 24 terms) serves that many. iq2_xxs
 * takes 8 (3.45-3.47 -> 3.27-3.30 ms at 4096^2, within its 168 registers), iq2_xs and iq2_s
 * too (iq2_xs with 16: no faster);
 * iq1_s, held to 128 registers for 8 CTAs an SM, 4 (8: 1.90-2.03 -> 2.01-2.06 ms;
 * the git history of docs/BENCHMARKS.md). */
template <class VALUE, int TASK_> struct qd_warp_point8 {
    static constexpr int TASK = TASK_;
    static_assert(TASK % QD_IQ_LIST_ALIGN == 0 && TASK <= QD_IQ_LIST_LOAD, "whole aligned loads within the table");
    const uint16_t *codes, *base; /* the tables' codes and the lists they stand beside */
    const uint16_t *at;           /* the entered list's codes */
    float term[8][3];
    /* the codes beside list (its count, then its candidates' codes) */
    __device__ __forceinline__ const uint16_t *codes_of(const uint16_t *list) const { return codes + (list - base); }
    __device__ __forceinline__ void enter(const uint16_t *list, const float *xv, const float *w, float s, float aux)
    {
        at = codes_of(list);
#pragma unroll
        for (int d = 0; d < 8; d++)
#pragma unroll
            for (int l = 0; l < 3; l++) {
                const float diff = s * VALUE::of(l, aux) - xv[d];
                term[d][l] = w[d] * diff * diff;
            }
    }
    /* candidates j .. j + TASK - 1 (j - 1 a multiple of TASK) of the entered list: those past its
     * end are read too (the table's next slots; the caller ignores them) */
    __device__ __forceinline__ void task(int j, unsigned *c) const
    {
#pragma unroll
        for (int q = 0; q < TASK; q += 4)
            qd_iq_code4(at + j + q, c + q);
    }
    __device__ __forceinline__ float d2(unsigned c) const
    {
        float d2 = 0.0f;
#pragma unroll
        for (int d = 0; d < 8; d++) {
            const unsigned l = c >> 2 * d & 3u;
            d2 += l & 2u ? term[d][2] : l & 1u ? term[d][1] : term[d][0];
        }
        return d2;
    }
};

#endif
