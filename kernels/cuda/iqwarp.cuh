/* The neighbour searches of a warp's off-grid groups, shared by its 32 lanes. In iq2_xxs's trial
 * loop a group whose levels fall off the grid looks for the nearest point of a list of
 * candidates (23 on average on N(0, 0.02) weights with an importance, over a hundred at
 * times); a lane per sub-block searching its own groups one after another kept the warp as
 * long as its longest list each time. Here each lane names its groups' lists, the warp deals
 * out all their candidates in order, a run to each lane, and each lane keeps the nearest of its
 * run for every group it touches. Where a group's candidates span lanes, the smallest
 * (distance, position in the list) over them is what ggml's loop keeps: the first of the
 * nearest, a distance counting only below FLT_MAX (NaN never). Every lane steps through its
 * run in one loop (a loop per group diverged, lanes at different groups taking turns). On an
 * H200 this made iq2_xxs's kernel 11 % faster at 4096^2 and its 8B mix about 20 % (two steps,
 * each against the build before it); iq3_xxs's short lists (8 groups of 4 a sub-block) made it
 * 2.3x slower with a loop per group, so iq3_xxs keeps a lane's own search (docs/BENCHMARKS.md). */
#ifndef QD_CUDA_IQWARP_CUH
#define QD_CUDA_IQWARP_CUH

#include "common.cuh"

/* A warp's shared state for G groups a lane. */
template <int G> struct qd_warp_search {
    unsigned long long best[32 * G]; /* (ordered distance << 32) | position, the least */
    int start[32 * G + 1];           /* where each group's candidates begin in the deal */
    const uint16_t *list[32 * G];    /* its list: the count, then grid indices */
    float scale[32];                 /* the owner lane's trial scale */
};

/* d2's bits in an order that unsigned comparison keeps (-0 as +0) */
__device__ __forceinline__ uint32_t qd_ordered_bits(float d2)
{
    const uint32_t u = d2 == 0.0f ? 0u : __float_as_uint(d2);
    return u >> 31 ? ~u : u | 0x80000000u;
}

/* Every lane of the warp calls this together. The lane's group k (of G, DIM values each)
 * searches list[k] (NULL: none) at the lane's scale; the lane's row of rows (stride floats a
 * lane, from the warp's first) holds its |x| at XOFF + DIM k and their weights' roots at
 * WOFF + DIM k; point.get(g, v) puts grid point g's DIM coordinates, as the distance takes
 * them, into v. best[k] gets the grid index chosen (the first listed where no distance
 * counts, as quantd's CPU code does). */
template <int G, int DIM, int XOFF, int WOFF, class POINT>
__device__ __forceinline__ void qd_warp_neighbours(qd_warp_search<G> *sh, const float *rows, int stride, float scale,
                                                   const uint16_t *const *list, const POINT &point, int *best)
{
    const int lane = threadIdx.x & 31;
    int count[G], total = 0;
#pragma unroll
    for (int k = 0; k < G; k++) {
        count[k] = list[k] ? list[k][0] : 0;
        sh->start[G * lane + k] = total; /* made absolute below */
        total += count[k];
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
                best[k] = list[k][1];
        return;
    }
#pragma unroll
    for (int k = 0; k < G; k++) {
        sh->start[G * lane + k] += incl - total;
        sh->list[G * lane + k] = list[k];
        sh->best[G * lane + k] = ~0ull;
    }
    if (lane == 31)
        sh->start[32 * G] = all;
    sh->scale[lane] = scale;
    __syncwarp();
    /* one loop of run steps for every lane (a loop per group diverged: lanes at different
     * groups ran their steps one after the other); a lane loads a group where its run enters it */
    const int run = (all + 31) / 32, i0 = lane * run, end = min(all, i0 + run);
    int tk = 0;
    if (i0 < end) {
        int hi = 32 * G - 1; /* the last group starting at or before i0 */
        while (tk < hi) {
            const int mid = (tk + hi + 1) / 2;
            if (sh->start[mid] <= i0)
                tk = mid;
            else
                hi = mid - 1;
        }
    }
    float xv[DIM], w[DIM], s = 0.0f, best_d2 = 3.40282347e38f;
    const uint16_t *nb = NULL;
    int stop = i0, j = 0, best_j = -1;
    for (int n = 0; n < run; n++) {
        const int i = i0 + n;
        if (i >= end)
            break;
        if (i >= stop) { /* into the next group with candidates: the last one's nearest out first */
            if (best_j >= 0)
                atomicMin(&sh->best[tk], (unsigned long long)qd_ordered_bits(best_d2) << 32 | (unsigned)best_j);
            while (sh->start[tk + 1] <= i)
                tk++;
            const int owner = tk / G, k = tk % G;
            const float *row = rows + owner * stride;
#pragma unroll
            for (int d = 0; d < DIM; d++) {
                xv[d] = row[XOFF + DIM * k + d];
                w[d] = row[WOFF + DIM * k + d];
            }
            s = sh->scale[owner];
            nb = sh->list[tk];
            stop = sh->start[tk + 1];
            j = i - sh->start[tk] + 1;
            best_d2 = 3.40282347e38f;
            best_j = -1;
        }
        float p[DIM];
        point.get(nb[j], p);
        float d2 = 0.0f;
#pragma unroll
        for (int d = 0; d < DIM; d++) {
            const float diff = s * p[d] - xv[d];
            d2 += w[d] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best_j = j;
        }
        j++;
    }
    if (best_j >= 0)
        atomicMin(&sh->best[tk], (unsigned long long)qd_ordered_bits(best_d2) << 32 | (unsigned)best_j);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < G; k++)
        if (list[k]) {
            const unsigned long long key = count[k] ? sh->best[G * lane + k] : ~0ull;
            best[k] = list[k][key == ~0ull ? 1 : (int)(uint32_t)key];
        }
    __syncwarp(); /* read before the next call writes */
}

#endif
