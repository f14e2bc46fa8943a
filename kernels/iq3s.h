/* ggml's IQ3_S, one super-block at a time, for every backend: 256 elements in eight 32-element
 * sub-blocks, each value |x| coded as one coordinate of a point of a 512-point grid in 4
 * dimensions (odd values 1..15), signs apart, a 4-bit scale per sub-block and an f16 d. The
 * contract is quantize_iq3_s (what ggml_quantize_chunk and llama-quantize run, with or without
 * an importance) and dequantize_row_iq3_s; the same float operations in the same order (built
 * without FMA contraction: -ffp-contract=off, nvcc --fmad=false). The grid and its off-grid
 * neighbour lists are built once on the host (kernels/iq3s.c) and read here through a const
 * table: the CPU's, or the CUDA context's copy of it. docs/formats.md says what it stores. */
#ifndef QD_IQ3S_H
#define QD_IQ3S_H

#include <math.h>

#include "kquants.h"

#define QD_IQ3S_BLOCK_BYTES ((int)sizeof(struct qd_block_iq3_s)) /* kernels/ggml_blocks.h */
#define QD_IQ3S_GRID 512
#define QD_IQ3S_MAP 4096 /* every 4-tuple of 3-bit values */
/* the neighbour lists' length: per off-grid tuple (3584 of them) its count, then the grid
 * indices at its three smallest distances, placed as kernels/iqlist.h says (28,317 entries
 * packed; checked when the tables are built) */
#define QD_IQ3S_NEIGHBOURS 33908

struct qd_iq3s_tables {
    uint8_t grid[QD_IQ3S_GRID][4];        /* point i's coordinates, odd values 1..15 */
    int32_t map[QD_IQ3S_MAP];             /* 4-tuple -> its grid index, or -(offset + 1) of its list */
    uint16_t neighbours[QD_IQ3S_NEIGHBOURS]; /* per off-grid tuple: the count, then the grid indices */
    uint16_t codes[QD_IQ3S_NEIGHBOURS];      /* beside neighbours: the count, then each listed point's
                                                tuple of levels (the GPU's search loads only these) */
};

#ifdef __cplusplus
extern "C" {
#endif
/* The tables, built on the first call (thread-safe); NULL only if that build found other
 * lists than QD_IQ3S_NEIGHBOURS says (a broken grid). */
const struct qd_iq3s_tables *qd_iq3s_tables(void);
#ifdef __cplusplus
}
#endif

/* The neighbour of tuple u (off the grid) nearest xval at this scale, weighted (the first of
 * equals); its coordinates' 3-bit values into L, and its index. */
QD_HD int qd_iq3s_best_neighbour(const struct qd_iq3s_tables *QD_RESTRICT t, int u, const float *xval,
                                 const float *w, float scale, int8_t *L)
{
    const uint16_t *nb = t->neighbours + (-t->map[u] - 1);
    float best_d2 = 3.40282347e38f;
    int best = -1;
    for (int j = 1; j <= nb[0]; j++) {
        float d2 = 0.0f;
        for (int i = 0; i < 4; i++) {
            float diff = scale * (float)t->grid[nb[j]][i] - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    if (best < 0) /* every distance overflowed (values near f32's range): ggml aborts; the first */
        best = nb[1];
    for (int i = 0; i < 4; i++)
        L[i] = (int8_t)((t->grid[best][i] - 1) / 2);
    return best;
}

QD_HD int qd_iq3s_tuple(const int8_t *L) { return L[0] | L[1] << 3 | L[2] << 6 | L[3] << 9; }

/* 3-bit value of x at inverse scale id: round((id x - 1) / 2) in [0, 7] */
QD_HD int qd_iq3s_level(float id, float x) { return qd_kq_clampi(qd_kq_round(0.5f * (id * x - 1.0f)), 0, 7); }

/* quantize_row_iq3_s_impl for one super-block (qw: its importance, or NULL). blk: d, qs[64],
 * qh[8], signs[32], scales[4]. */
QD_HD void qd_iq3s_quantize(const struct qd_iq3s_tables *QD_RESTRICT t, const float *QD_RESTRICT x,
                            const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    for (int i = 0; i < QD_IQ3S_BLOCK_BYTES; i++)
        blk[i] = 0;
    uint8_t *qs = blk + 2, *qh = blk + 66, *signs = blk + 74, *sc = blk + 106;
    float scales[8], weight[32], waux[32], xval[32];
    int8_t L[32], Laux[32];
    int on_grid[8], on_grid_aux[8];
    uint8_t bsigns[4];
    float sumx2 = 0.0f;
    for (int i = 0; i < QD_QK_K; i++)
        sumx2 += x[i] * x[i];
    const float sigma2 = 2.0f * sumx2 / (float)QD_QK_K;
    float max_scale = 0.0f;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        for (int i = 0; i < 32; i++)
            weight[i] = qw ? qw[32 * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
        for (int i = 0; i < 32; i++)
            waux[i] = sqrtf(weight[i]);
        for (int k = 0; k < 4; k++) {
            uint8_t s = 0;
            for (int i = 0; i < 8; i++) {
                const float v = xb[8 * k + i];
                xval[8 * k + i] = v >= 0.0f ? v : -v;
                if (!(v >= 0.0f))
                    s |= (uint8_t)(1 << i);
            }
            bsigns[k] = s;
        }
        float max = xval[0];
        for (int i = 1; i < 32; i++)
            max = max > xval[i] ? max : xval[i];
        for (int i = 0; i < 32; i++)
            L[i] = 0;
        if (max == 0.0f) {
            /* ggml moves on without advancing its code and sign pointers: the next sub-block's
             * land here */
            scales[ib] = 0.0f;
            continue;
        }
        float best = 0.0f, scale = max / 15.0f;
        for (int k = 0; k < 8; k++)
            on_grid[k] = 0;
        for (int is = -9; is <= 9; is++) {
            const float id = (15.0f + (float)is * 0.2f) / max, this_scale = 1.0f / id;
            for (int k = 0; k < 8; k++) {
                for (int i = 0; i < 4; i++)
                    Laux[4 * k + i] = (int8_t)qd_iq3s_level(id, xval[4 * k + i]);
                const int u = qd_iq3s_tuple(Laux + 4 * k);
                on_grid_aux[k] = t->map[u] >= 0;
                if (!on_grid_aux[k])
                    qd_iq3s_best_neighbour(t, u, xval + 4 * k, waux + 4 * k, this_scale, Laux + 4 * k);
            }
            float sumqx, sumq2;
            qd_kq_odd_sums(32, weight, xval, Laux, &sumqx, &sumq2);
            qd_kq_take_trial(sumqx, sumq2, &scale, &best, Laux, L, on_grid_aux, on_grid);
        }
        int off_grid = 0;
        for (int k = 0; k < 8; k++)
            off_grid += !on_grid[k];
        if (off_grid > 0 && scale > 0.0f) {
            const float id = 1.0f / scale;
            for (int k = 0; k < 8; k++) {
                int8_t l[4];
                for (int i = 0; i < 4; i++)
                    l[i] = (int8_t)qd_iq3s_level(id, xval[4 * k + i]);
                const int u = qd_iq3s_tuple(l);
                const int g = t->map[u] >= 0 ? t->map[u]
                                             : qd_iq3s_best_neighbour(t, u, xval + 4 * k, waux + 4 * k, scale, L + 4 * k);
                for (int i = 0; i < 4; i++)
                    L[4 * k + i] = (int8_t)((t->grid[g][i] - 1) / 2);
            }
            scale = qd_kq_refit(32, weight, xval, L, scale);
        }
        if (scale < 0.0f) { /* ggml's guard: a positive scale, the signs flipped */
            scale = -scale;
            for (int k = 0; k < 4; k++)
                bsigns[k] = (uint8_t)~bsigns[k];
        }
        for (int k = 0; k < 8; k++) {
            const int g = t->map[qd_iq3s_tuple(L + 4 * k)]; /* on the grid by construction */
            qs[k] = (uint8_t)(g & 255);
            qh[(ib * 8 + k) / 8] |= (uint8_t)((g >> 8) << ((ib * 8 + k) % 8));
        }
        qs += 8;
        for (int k = 0; k < 4; k++)
            signs[k] = bsigns[k];
        signs += 4;
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (max_scale == 0.0f)
        return; /* d stays +0 (the zeroed bytes) */
    const float d = max_scale / 31.0f;
    qd_put_f16(blk, d * 1.033f);
    const float id = 1.0f / d;
    for (int ib = 0; ib < 8; ib += 2) {
        int l1 = qd_kq_clampi(qd_kq_round(0.5f * (id * scales[ib] - 1.0f)), 0, 15);
        int l2 = qd_kq_clampi(qd_kq_round(0.5f * (id * scales[ib + 1] - 1.0f)), 0, 15);
        sc[ib / 2] = (uint8_t)(l1 | l2 << 4);
    }
}

/* dequantize_row_iq3_s for the super-block's group k of 8 values (0..31: sub-block k / 4, its
 * two 4-value points 2 (k % 4) and the next); a GPU thread takes one group */
QD_HD void qd_iq3s_dequantize_eight(const struct qd_iq3s_tables *QD_RESTRICT t, const uint8_t *QD_RESTRICT blk, int k,
                                    float *QD_RESTRICT y)
{
    const float d = qd_get_f16(blk);
    const int ib = k / 4, l = k % 4;
    const uint8_t *qs = blk + 2 + 8 * ib, *signs = blk + 74 + 4 * ib;
    const int s = blk[106 + ib / 2] >> 4 * (ib % 2) & 0xf;
    const float db = d * (float)(1 + 2 * s);
    const int h = blk[66 + ib];
    const uint8_t *g1 = t->grid[qs[2 * l] | ((h << (8 - 2 * l)) & 256)];
    const uint8_t *g2 = t->grid[qs[2 * l + 1] | ((h << (7 - 2 * l)) & 256)];
    for (int j = 0; j < 4; j++) {
        y[j] = db * (float)g1[j] * (signs[l] & (1 << j) ? -1.0f : 1.0f);
        y[j + 4] = db * (float)g2[j] * (signs[l] & (1 << (j + 4)) ? -1.0f : 1.0f);
    }
}

/* dequantize_row_iq3_s for one super-block */
QD_HD void qd_iq3s_dequantize(const struct qd_iq3s_tables *QD_RESTRICT t, const uint8_t *QD_RESTRICT blk,
                              float *QD_RESTRICT y)
{
    for (int k = 0; k < 32; k++)
        qd_iq3s_dequantize_eight(t, blk, k, y + 8 * k);
}

#endif
