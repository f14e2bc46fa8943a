/* ggml's IQ3_XXS, one 256-element super-block at a time, for every backend: eight 32-element
 * sub-blocks, each 4-tuple of |x| coded as a point of a 256-point grid in 4 dimensions (levels
 * 0..7, values 2 * level + 1), seven sign bits per 8 values (the eighth is their parity), a
 * 4-bit scale per sub-block and an f16 d. The contract is quantize_iq3_xxs (what
 * ggml_quantize_chunk and llama-quantize run, with or without an importance: quantize_row_
 * iq3_xxs_impl with grid size 256) and dequantize_row_iq3_xxs; the same float operations in
 * the same order (built without FMA contraction). The grid tables: kernels/iqgrid.h. */
#ifndef QD_IQ3XXS_H
#define QD_IQ3XXS_H

#include "imatrix.h"
#include "iqgrid.h"
#include "kquants.h"

#define QD_IQ3XXS_BYTES ((int)sizeof(struct qd_block_iq3_xxs)) /* kernels/ggml_blocks.h */

/* The neighbour of off-grid tuple u nearest xval at this scale, weighted (the first of equals):
 * its levels into L, its index. ggml aborts where every distance overflows (values near f32's
 * range); quantd takes the first neighbour there. */
QD_HD int qd_iq3xxs_best_neighbour(const struct qd_iq_grid *g, int u, const float *xval, const float *w,
                                   float scale, int8_t *L)
{
    const uint16_t *nb = qd_iq_neighbours(g, u);
    float best_d2 = QD_IQ_FLT_MAX;
    int best = -1;
    for (int j = 1; j <= nb[0]; j++) {
        const uint8_t *p = qd_iq_point(g, nb[j]);
        float d2 = 0.0f;
        for (int i = 0; i < 4; i++) {
            const float diff = scale * (float)(2 * p[i] + 1) - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    if (best < 0)
        best = nb[1];
    for (int i = 0; i < 4; i++)
        L[i] = (int8_t)qd_iq_point(g, best)[i];
    return best;
}

/* level of x at inverse scale id: round((id x - 1) / 2) in [0, 7] */
QD_HD int qd_iq3xxs_level(float id, float x) { return qd_kq_clampi(qd_kq_round(0.5f * (id * x - 1.0f)), 0, 7); }

/* The start of quantize_row_iq3_xxs_impl: blk's codes and d cleared. Returns sigma2 (2 mean(x^2)
 * over the super-block). */
QD_HD float qd_iq3xxs_begin(const float *x, uint8_t *blk)
{
    for (int i = 0; i < 96; i++)
        blk[2 + i] = 0;
    qd_put_f16(blk, 0.0f);
    return qd_imx_block_sigma2(x, 2.0f);
}

/* Sub-block xb's weights (importance qwb at sigma2, or x^2 where qwb is NULL) and their square
 * roots, |x| into xval and each 8's seven stored sign bits into bsigns; where an 8 has an odd
 * count of negatives its least weighted x^2 takes the other sign. Returns the largest xval. */
QD_HD float qd_iq3xxs_signs(const float *xb, const float *qwb, float sigma2, float *weight, float *waux, float *xval,
                            uint8_t *bsigns)
{
    for (int i = 0; i < 32; i++)
        weight[i] = qwb ? qwb[i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
    for (int i = 0; i < 32; i++)
        waux[i] = sqrtf(weight[i]);
    for (int k = 0; k < 4; k++) {
        int nflip = 0;
        uint8_t s = 0;
        for (int i = 0; i < 8; i++) {
            const float v = xb[8 * k + i];
            if (v >= 0.0f) {
                xval[8 * k + i] = v;
            } else {
                xval[8 * k + i] = -v;
                nflip++;
                s |= (uint8_t)(1 << i);
            }
        }
        if (nflip % 2) { /* an odd count: the least weighted x^2 takes the other sign */
            int imin = 0;
            float min = weight[8 * k] * xb[8 * k] * xb[8 * k];
            for (int i = 1; i < 8; i++) {
                const float ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if (ax < min) {
                    min = ax;
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= (uint8_t)(1 << imin);
        }
        bsigns[k] = s & 127;
    }
    float max = xval[0];
    for (int i = 1; i < 32; i++)
        max = max > xval[i] ? max : xval[i];
    return max;
}

/* A sub-block's grid indices (levels L, on the grid) into qs8[0..8) and its sign word (no scale
 * bits yet) into *sas, at scale made positive with the signs flipped (ggml's guard); returns that
 * scale. */
QD_HD float qd_iq3xxs_sub_put(const struct qd_iq_grid *g, float scale, const int8_t *L, uint8_t *bsigns, uint8_t *qs8,
                              uint32_t *sas)
{
    if (scale < 0.0f) { /* ggml's guard: a positive scale, the signs flipped */
        scale = -scale;
        for (int k = 0; k < 4; k++)
            bsigns[k] = (uint8_t)(~bsigns[k] & 127);
    }
    for (int k = 0; k < 8; k++)
        qs8[k] = (uint8_t)g->map[qd_iq_tuple(g, L + 4 * k)]; /* on the grid by construction */
    *sas = (uint32_t)bsigns[0] | (uint32_t)bsigns[1] << 7 | (uint32_t)bsigns[2] << 14 | (uint32_t)bsigns[3] << 21;
    return scale;
}

/* The end of quantize_row_iq3_xxs_impl: d and each sub-block's 4-bit scale on top of its sign
 * word sas[ib], or, where every scale is 0, the codes cleared. */
QD_HD void qd_iq3xxs_finish(float max_scale, const float *scales, uint32_t *sas, uint8_t *blk)
{
    uint8_t *qs = blk + 2, *ss = blk + 66;
    if (max_scale == 0.0f) { /* ggml clears the whole block */
        for (int i = 0; i < 96; i++)
            qs[i] = 0;
        return;
    }
    const float d = max_scale / 31.0f;
    qd_put_f16(blk, d * 1.0125f);
    const float id = 1.0f / d;
    for (int ib = 0; ib < 8; ib++) {
        const int l = qd_kq_clampi(qd_kq_round(0.5f * (id * scales[ib] - 1.0f)), 0, 15);
        sas[ib] |= (uint32_t)l << 28;
        for (int b = 0; b < 4; b++)
            ss[4 * ib + b] = (uint8_t)(sas[ib] >> 8 * b);
    }
}

/* The scale and levels L of a sub-block that qd_iq3xxs_signs prepared (its largest xval max not
 * below 1e-8): 31 trial scales around max / 15, then the tuples chosen off the grid again at the
 * final scale. */
QD_HD float qd_iq3xxs_sub_search(const struct qd_iq_grid *QD_RESTRICT g, const float *xval, const float *weight,
                                 const float *waux, float max, int8_t *L)
{
    int8_t Laux[32];
    int on_grid[8], on_grid_aux[8];
    for (int i = 0; i < 32; i++)
        L[i] = 0;
    float best = 0.0f, scale = max / 15.0f;
    for (int k = 0; k < 8; k++)
        on_grid[k] = 1;
    for (int is = -15; is <= 15; is++) {
        const float id = (15.0f + (float)is * 0.2f) / max, this_scale = 1.0f / id;
        for (int k = 0; k < 8; k++) {
            for (int i = 0; i < 4; i++)
                Laux[4 * k + i] = (int8_t)qd_iq3xxs_level(id, xval[4 * k + i]);
            const int u = qd_iq_tuple(g, Laux + 4 * k);
            on_grid_aux[k] = g->map[u] >= 0;
            if (!on_grid_aux[k])
                qd_iq3xxs_best_neighbour(g, u, xval + 4 * k, waux + 4 * k, this_scale, Laux + 4 * k);
        }
        float sumqx, sumq2;
        qd_kq_odd_sums(32, weight, xval, Laux, &sumqx, &sumq2);
        qd_kq_take_trial(sumqx, sumq2, &scale, &best, Laux, L, on_grid_aux, on_grid);
    }
    int off_grid = 0;
    for (int k = 0; k < 8; k++)
        off_grid += !on_grid[k];
    if (off_grid > 0 && scale > 0.0f) { /* the tuples chosen off the grid, again at the final scale */
        const float id = 1.0f / scale;
        for (int k = 0; k < 8; k++) {
            if (on_grid[k])
                continue;
            int8_t l[4];
            for (int i = 0; i < 4; i++)
                l[i] = (int8_t)qd_iq3xxs_level(id, xval[4 * k + i]);
            const int u = qd_iq_tuple(g, l);
            const int gi = g->map[u] >= 0 ? g->map[u]
                                          : qd_iq3xxs_best_neighbour(g, u, xval + 4 * k, waux + 4 * k, scale, L + 4 * k);
            for (int i = 0; i < 4; i++)
                L[4 * k + i] = (int8_t)qd_iq_point(g, gi)[i];
        }
        scale = qd_kq_refit(32, weight, xval, L, scale);
    }
    return scale;
}

/* Sub-block ib (values xb, importance qwb or NULL) of a super-block qd_iq3xxs_begin started: its
 * grid indices into blk and its sign word into *sas; returns its scale, or 0 with *zero set where
 * its largest |x| is below GROUP_MAX_EPS_IQ3_XXS (codes, signs and scale stay 0). */
QD_HD float qd_iq3xxs_sub(const struct qd_iq_grid *QD_RESTRICT g, const float *xb, const float *qwb, float sigma2,
                          int ib, uint8_t *blk, uint32_t *sas, int *zero)
{
    float weight[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t bsigns[4];
    *sas = 0;
    const float max = qd_iq3xxs_signs(xb, qwb, sigma2, weight, waux, xval, bsigns);
    *zero = max < 1e-8f;
    if (*zero)
        return 0.0f;
    const float scale = qd_iq3xxs_sub_search(g, xval, weight, waux, max, L);
    return qd_iq3xxs_sub_put(g, scale, L, bsigns, blk + 2 + 8 * ib, sas);
}

/* quantize_row_iq3_xxs_impl (grid size 256) for one super-block; qw its importance or NULL. The
 * pieces above are shared with the AVX2 form (kernels/cpu/iqgrid_avx2.h); the GPU runs the same
 * operations a lane per 4-value group (kernels/cuda/iq3xxs_lanes.cuh, which uses
 * qd_iq3xxs_level and qd_iq3xxs_finish). */
QD_HD void qd_iq3xxs_quantize(const struct qd_iq_grid *QD_RESTRICT g, const float *QD_RESTRICT x,
                              const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    uint32_t sas[8];
    float scales[8], max_scale = 0.0f;
    const float sigma2 = qd_iq3xxs_begin(x, blk);
    for (int ib = 0; ib < 8; ib++) {
        int zero;
        scales[ib] = qd_iq3xxs_sub(g, x + 32 * ib, qw ? qw + 32 * ib : NULL, sigma2, ib, blk, &sas[ib], &zero);
        if (!zero)
            max_scale = max_scale > scales[ib] ? max_scale : scales[ib];
    }
    qd_iq3xxs_finish(max_scale, scales, sas, blk);
}

/* ggml's iq3xxs_grid: the value of a level (4, 12, ..., 52, then 62 for level 7) */
QD_HD int qd_iq3xxs_value(int level) { return level == 7 ? 62 : 8 * level + 4; }

/* dequantize_row_iq3_xxs for the super-block's group k of 8 values (0..31: sub-block k / 4, its
 * two 4-value points 2 (k % 4) and the next) */
QD_HD void qd_iq3xxs_dequantize_eight(const struct qd_iq_grid *QD_RESTRICT g, const uint8_t *QD_RESTRICT blk, int k,
                                      float *QD_RESTRICT y)
{
    const float d = qd_get_f16(blk);
    const int ib = k / 4, l = k % 4;
    const uint8_t *qs = blk + 2 + 8 * ib, *ss = blk + 66 + 4 * ib;
    const uint32_t aux = (uint32_t)ss[0] | (uint32_t)ss[1] << 8 | (uint32_t)ss[2] << 16 | (uint32_t)ss[3] << 24;
    const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
    int signs = (aux >> 7 * l) & 127;
    signs |= (qd_popcount7(signs) & 1) << 7; /* ksigns_iq2xs: the eighth sign is the parity */
    const uint8_t *g1 = qd_iq_point(g, qs[2 * l]), *g2 = qd_iq_point(g, qs[2 * l + 1]);
    for (int j = 0; j < 4; j++) {
        y[j] = db * (float)qd_iq3xxs_value(g1[j]) * (signs & (1 << j) ? -1.0f : 1.0f);
        y[j + 4] = db * (float)qd_iq3xxs_value(g2[j]) * (signs & (1 << (j + 4)) ? -1.0f : 1.0f);
    }
}

QD_HD void qd_iq3xxs_dequantize(const struct qd_iq_grid *QD_RESTRICT g, const uint8_t *QD_RESTRICT blk,
                                float *QD_RESTRICT y)
{
    for (int k = 0; k < 32; k++)
        qd_iq3xxs_dequantize_eight(g, blk, k, y + 8 * k);
}

#endif
