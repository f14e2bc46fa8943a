/* The lattice grids of ggml's IQ3_XXS and IQ1_S/IQ1_M and what their searches look up, for every
 * backend: a grid of n points in dim dimensions (each coordinate a level 0..7 of `bits` bits),
 * a map from every reachable tuple of levels (tuple u = sum level_k << bits*k) to its grid index
 * or, off the grid, to its neighbour list, and the lists themselves. The host builds the tables
 * once (kernels/iqgrid.c: ggml's iq3xs_init_impl and iq2xs_init_impl); a CUDA backend copies
 * them to the device and hands the kernels a struct of device pointers. */
#ifndef QD_IQGRID_H
#define QD_IQGRID_H

#include <stddef.h>
#include <stdint.h>

#include "fp.h"

struct qd_iq_grid {
    int n, dim, bits;
    const uint8_t *levels;      /* n x dim levels */
    const int32_t *map;         /* tuple -> grid index, or -(offset + 1) of its neighbour list */
    const uint16_t *neighbours; /* per off-grid tuple: the count, then the grid indices (placed as
                                   kernels/iqlist.h says) */
    const uint16_t *codes;      /* beside neighbours: the count, then each listed point's tuple
                                   (a GPU search loads a candidate's levels without its index) */
    const uint16_t *tuples;     /* n: each point's levels packed as qd_iq_tuple packs them (one
                                   load for a point where the levels take dim) */
    int32_t map_size;           /* 1 << dim*bits */
    size_t neighbours_len;
};

#ifdef __cplusplus
extern "C" {
#endif
/* The host tables, built once on first use (thread-safe); NULL when memory ran out. */
const struct qd_iq_grid *qd_iq3xxs_grid(void); /* ggml's kgrid_256: 256 points, 4 x 3 bits */
const struct qd_iq_grid *qd_iq1_grid(void);    /* ggml's kgrid_1bit_2048: 2048 points, 8 x 2 bits */
#ifdef __cplusplus
}
#endif

/* f32 maxima as ggml writes them (FLT_MAX) */
#define QD_IQ_FLT_MAX 3.40282347e38f

QD_HD const uint8_t *qd_iq_point(const struct qd_iq_grid *g, int i) { return g->levels + (size_t)i * g->dim; }

/* level k of the tuple t, at bits a level */
QD_HD int qd_iq_level(uint32_t t, int bits, int k) { return (int)(t >> bits * k & ((1u << bits) - 1)); }

QD_HD int qd_iq_tuple(const struct qd_iq_grid *g, const int8_t *L)
{
    int u = 0;
    for (int k = 0; k < g->dim; k++)
        u |= L[k] << g->bits * k;
    return u;
}

/* bits set in the low 7 bits of v */
QD_HD int qd_popcount7(int v)
{
    int c = 0;
    for (int i = 0; i < 7; i++)
        c += v >> i & 1;
    return c;
}

/* The neighbour list of an off-grid tuple: [0] the count, then grid indices. */
QD_HD const uint16_t *qd_iq_neighbours(const struct qd_iq_grid *g, int u) { return g->neighbours + (-g->map[u] - 1); }

#endif
