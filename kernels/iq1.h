/* ggml's IQ1_S and IQ1_M, one 256-element super-block at a time, for every backend: each 8-tuple
 * of x coded as a point of a 2048-point grid of ternary values (-1, 0, 1) shifted by +-1/8 per
 * sub-block, the shift and a 3-bit scale per sub-block (32 elements in IQ1_S, 16 in IQ1_M) and
 * one f16 scale per super-block (IQ1_M spreads its bits over the four scale words). The
 * contract is quantize_iq1_s (which ggml runs only with an importance: ggml_quantize_chunk
 * asserts one) and quantize_iq1_m (with or without), and dequantize_row_iq1_s/_m; the same
 * float operations in the same order (built without FMA contraction). The grid tables:
 * kernels/iqgrid.h, levels 0..2 standing for -1..1. */
#ifndef QD_IQ1_H
#define QD_IQ1_H

#include "imatrix.h"
#include "iqgrid.h"
#include "kquants.h"

/* kernels/ggml_blocks.h */
#define QD_IQ1S_BYTES ((int)sizeof(struct qd_block_iq1_s))
#define QD_IQ1M_BYTES ((int)sizeof(struct qd_block_iq1_m))
#define QD_IQ1_DELTA 0.125f /* IQ1S_DELTA and IQ1M_DELTA */

/* Sorts idx[0..n) by x[idx] ascending, equal values in index order: what glibc's qsort (a
 * stable merge sort for arrays this small) gives ggml's compare of the values alone. */
QD_HD void qd_iq1_sort(const float *x, int n, int *idx)
{
    for (int j = 0; j < n; j++) {
        int i = j;
        for (; i > 0 && x[idx[i - 1]] > x[j]; i--)
            idx[i] = idx[i - 1];
        idx[i] = j;
    }
}

/* The value of level l (0..2 for -1..1) shifted by delta (+-IQ1_DELTA): ggml's x_p[l] or x_m[l],
 * exactly (each sum is exact in f32), without an array to index (a GPU thread kept the arrays
 * in local memory, read once per level of every candidate). */
QD_HD float qd_iq1_value(int l, float delta) { return (float)(l - 1) + delta; }

/* iq1_find_best_neighbour2: the neighbour of off-grid tuple u whose values at this scale (level
 * values shifted by delta) come nearest xval, weighted (the first of equals); its levels into L,
 * its index. ggml searches the whole grid where no distance is below FLT_MAX, reading past the 8
 * values (and aborts if still none); quantd takes the first neighbour there. Each candidate is
 * its packed tuple (one load), the next one's loaded before this one's distance. */
QD_HD int qd_iq1_best_neighbour(const struct qd_iq_grid *g, int u, const float *xval, const float *w, float scale,
                                float delta, int8_t *L)
{
    const uint16_t *nb = qd_iq_neighbours(g, u);
    const int n = nb[0];
    float best_d2 = QD_IQ_FLT_MAX;
    int best = -1;
    uint32_t next = g->tuples[nb[1]];
    for (int j = 1; j <= n; j++) {
        const uint32_t t = next;
        if (j < n)
            next = g->tuples[nb[j + 1]];
        float d2 = 0.0f;
        for (int i = 0; i < 8; i++) {
            const float diff = scale * qd_iq1_value(qd_iq_level(t, 2, i), delta) - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    if (best < 0)
        best = nb[1];
    const uint32_t t = g->tuples[best];
    for (int i = 0; i < 8; i++)
        L[i] = (int8_t)qd_iq_level(t, 2, i);
    return best;
}

/* The scale refitted over a sub-block of n (32 or 16) values to the grid points index of its
 * n/8 tuples (tuple k's levels shifted by delta[k]), where any tuple was off the grid; else the
 * scale as it was. */
QD_HD float qd_iq1_refit(const struct qd_iq_grid *g, int n, const float *xb, const float *w, float scale,
                         const float *delta, const uint16_t *index)
{
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int k = 0; k < n / 8; k++) {
        const uint32_t t = g->tuples[index[k]];
        for (int j = 0; j < 8; j++) {
            const float wj = w[8 * k + j], q = qd_iq1_value(qd_iq_level(t, 2, j), delta[k]);
            sumqx += wj * q * xb[8 * k + j];
            sumq2 += wj * q * q;
        }
    }
    return sumqx > 0.0f && sumq2 > 0.0f ? sumqx / sumq2 : scale;
}

/* One sub-block of n (32 or 16) values after the exhaustive split search: the grid points of its
 * n/8 tuples (index), on-grid or the best neighbour at scale, and the scale refitted when any
 * was off the grid. Tuple k's levels are shifted by delta[k]. Returns the scale. */
QD_HD float qd_iq1_codes(const struct qd_iq_grid *g, int n, const float *xb, const float *w, int8_t *L, float scale,
                         const float *delta, uint16_t *index)
{
    int all_on_grid = 1;
    for (int k = 0; k < n / 8; k++) {
        const int u = qd_iq_tuple(g, L + 8 * k);
        int gi = g->map[u];
        if (gi < 0) {
            all_on_grid = 0;
            gi = qd_iq1_best_neighbour(g, u, xb + 8 * k, w + 8 * k, scale, delta[k], L + 8 * k);
        }
        index[k] = (uint16_t)gi;
    }
    return all_on_grid ? scale : qd_iq1_refit(g, n, xb, w, scale, delta, index);
}

/* What quantize_row_iq1_s_impl keeps of a super-block until d is known: each sub-block's high
 * index bits, scale and shift (1 for a zero sub-block), and the largest scale. */
struct qd_iq1s_block {
    uint16_t qh[8];
    float scales[8], max_scale;
    int8_t shifts[8];
};

/* One IQ1_S sub-block ready for the split search: its weights, idx sorting its values, the 33
 * prefix sums of weight x and of weight in that order, and its largest |x|. */
struct qd_iq1s_sub {
    float weight[32], sumx[33], sumw[33], max;
    int idx[32];
};

/* What the split search picks: the sorted positions i1 <= i2 where the levels 0|1 and 1|2 start,
 * the shift (1 up, -1 down) and the scale; i1 -1 where no split passed. */
struct qd_iq1s_split {
    int i1, i2, shift;
    float scale;
};

/* b as a super-block starts it: no high bits, scales 0, shifts +1 */
QD_HD void qd_iq1s_block_init(struct qd_iq1s_block *b)
{
    for (int ib = 0; ib < 8; ib++) {
        b->qh[ib] = 0;
        b->scales[ib] = 0.0f;
        b->shifts[ib] = 1;
    }
    b->max_scale = 0.0f;
}

/* The start of quantize_row_iq1_s_impl: blk's codes and d cleared, b empty. Returns sigma2
 * (2 mean(x^2) over the super-block). */
QD_HD float qd_iq1s_begin(const float *x, uint8_t *blk, struct qd_iq1s_block *b)
{
    for (int i = 0; i < 48; i++)
        blk[2 + i] = 0;
    qd_iq1s_block_init(b);
    qd_put_f16(blk, 0.0f);
    return qd_imx_block_sigma2(x, 2.0f);
}

/* GROUP_MAX_EPS_IQ1_S: a sub-block whose largest |x| is below it stays zero */
#define QD_IQ1S_ZERO 1e-12f

/* A sub-block's weights (importance qwb at sigma2) into weight; returns its largest |x|. */
QD_HD float qd_iq1s_sub_weights(const float *xb, const float *qwb, float sigma2, float *weight)
{
    for (int i = 0; i < 32; i++)
        weight[i] = qwb[i] * sqrtf(sigma2 + xb[i] * xb[i]);
    float max = qd_absf(xb[0]);
    for (int i = 1; i < 32; i++)
        max = max > qd_absf(xb[i]) ? max : qd_absf(xb[i]);
    return max;
}

/* Sub-block xb (importance qwb) at sigma2 into s; 0 where its largest |x| is below
 * GROUP_MAX_EPS_IQ1_S, and the sub-block stays zero (s then holds only the weights and max). */
QD_HD int qd_iq1s_sub_sums(const float *xb, const float *qwb, float sigma2, struct qd_iq1s_sub *s)
{
    const float max = qd_iq1s_sub_weights(xb, qwb, sigma2, s->weight);
    s->max = max;
    if (max < QD_IQ1S_ZERO)
        return 0;
    qd_iq1_sort(xb, 32, s->idx);
    s->sumx[0] = s->sumw[0] = 0.0f;
    for (int j = 0; j < 32; j++) {
        const int i = s->idx[j];
        s->sumx[j + 1] = s->sumx[j] + s->weight[i] * xb[i];
        s->sumw[j + 1] = s->sumw[j] + s->weight[i];
    }
    return 1;
}

/* One split of qd_iq1s_split_search: levels -1, 0, 1 from the sorted positions i1 and i2 on,
 * for either shift (the shifted levels as values: the GPU kept a selected array of ggml's x_p,
 * x_m in local memory), tried against the best so far (s, its score). sx1, sw1 and sx2, sw2 are
 * the prefix sums at i1 and i2, sx32, sw32 the totals; ax and aw the first level's terms of each
 * shift, made once an i1 (qd_iq1s_first_terms). */
QD_HD void qd_iq1s_try(const float *ax, const float *aw, float sx1, float sw1, float sx2, float sw2, float sx32,
                       float sw32, int i1, int i2, struct qd_iq1s_split *s, float *score)
{
    const float bx = sx2 - sx1, bw = sw2 - sw1, cx = sx32 - sx2, cw = sw32 - sw2;
    for (int m = 0; m < 2; m++) {
        const float v1 = m ? -QD_IQ1_DELTA : QD_IQ1_DELTA, v2 = m ? 1.0f - QD_IQ1_DELTA : 1.0f + QD_IQ1_DELTA;
        const float sumqx = ax[m] + bx * v1 + cx * v2;
        const float sumq2 = aw[m] + bw * v1 * v1 + cw * v2 * v2;
        if (sumq2 > 0.0f && sumqx * sumqx > *score * sumq2) {
            s->scale = sumqx / sumq2;
            *score = s->scale * sumqx;
            s->i1 = i1;
            s->i2 = i2;
            s->shift = m ? -1 : 1;
        }
    }
}

/* The first level's terms of either shift for a split at i1 (prefix sums sx1, sw1 there; sx0,
 * sw0 at 0) into ax, aw. */
QD_HD void qd_iq1s_first_terms(float sx1, float sw1, float sx0, float sw0, float *ax, float *aw)
{
    ax[0] = (sx1 - sx0) * (-1.0f + QD_IQ1_DELTA);
    ax[1] = (sx1 - sx0) * (-1.0f - QD_IQ1_DELTA);
    aw[0] = (sw1 - sw0) * (-1.0f + QD_IQ1_DELTA) * (-1.0f + QD_IQ1_DELTA);
    aw[1] = (sw1 - sw0) * (-1.0f - QD_IQ1_DELTA) * (-1.0f - QD_IQ1_DELTA);
}

/* Every split of the sorted values into -1, 0, 1, for either shift: the best score's (the first
 * of equals, in ggml's loop order). */
QD_HD struct qd_iq1s_split qd_iq1s_split_search(const struct qd_iq1s_sub *s)
{
    const float *sumx = s->sumx, *sumw = s->sumw;
    struct qd_iq1s_split split = {-1, -1, 0, s->max};
    float score = -QD_IQ_FLT_MAX;
    for (int i1 = 0; i1 <= 32; i1++) {
        float ax[2], aw[2];
        qd_iq1s_first_terms(sumx[i1], sumw[i1], sumx[0], sumw[0], ax, aw);
        for (int i2 = i1; i2 <= 32; i2++)
            qd_iq1s_try(ax, aw, sumx[i1], sumw[i1], sumx[i2], sumw[i2], sumx[32], sumw[32], i1, i2, &split, &score);
    }
    return split;
}

/* The levels L of a sub-block (prepared in s) at the split, and its scale and shift made
 * positive (ggml's flip of a negative scale); 0 where no split passed (the sub-block stays
 * zero). */
QD_HD int qd_iq1s_sub_levels(const struct qd_iq1s_sub *s, struct qd_iq1s_split split, int8_t *L, float *scale,
                             int *shift)
{
    *scale = split.scale;
    *shift = split.shift;
    if (split.i1 < 0 || split.i2 < 0 || *shift == 0)
        return 0;
    for (int j = 0; j < 32; j++)
        L[s->idx[j]] = (int8_t)(j < split.i1 ? 0 : j < split.i2 ? 1 : 2);
    if (*scale < 0.0f) {
        for (int j = 0; j < 32; j++)
            L[j] = (int8_t)(2 - L[j]);
        *scale = -*scale;
        *shift = -*shift;
    }
    return 1;
}

/* The shift's delta: IQ1_DELTA up (shift 1), down (-1). */
QD_HD float qd_iq1s_delta(int shift) { return shift == 1 ? QD_IQ1_DELTA : -QD_IQ1_DELTA; }

/* Sub-block ib's grid points index, scale and shift into blk (its 4 low index bytes) and b (its
 * high bits, scale, shift and b's largest scale). */
QD_HD void qd_iq1s_sub_store(const uint16_t *index, float scale, int shift, int ib, struct qd_iq1s_block *b,
                             uint8_t *blk)
{
    uint16_t h = 0;
    for (int k = 0; k < 4; k++) {
        blk[2 + 4 * ib + k] = (uint8_t)(index[k] & 255);
        h |= (uint16_t)((index[k] >> 8) << 3 * k);
    }
    b->qh[ib] = h;
    b->scales[ib] = scale;
    b->shifts[ib] = (int8_t)shift;
    b->max_scale = b->max_scale > scale ? b->max_scale : scale;
}

/* Sub-block ib (values xb, prepared in s) coded at the split: its 4 low index bytes into blk, its
 * high bits, scale and shift into b, b's largest scale updated; returns 1. A split where none
 * passed leaves the sub-block zero and returns 0. */
QD_HD int qd_iq1s_sub_put(const struct qd_iq_grid *g, const float *xb, const struct qd_iq1s_sub *s,
                           struct qd_iq1s_split split, int ib, struct qd_iq1s_block *b, uint8_t *blk)
{
    int8_t L[32];
    uint16_t index[4];
    float scale;
    int shift;
    if (!qd_iq1s_sub_levels(s, split, L, &scale, &shift))
        return 0;
    const float delta = qd_iq1s_delta(shift), deltas[4] = {delta, delta, delta, delta};
    scale = qd_iq1_codes(g, 32, xb, s->weight, L, scale, deltas, index);
    qd_iq1s_sub_store(index, scale, shift, ib, b, blk);
    return 1;
}

/* The end of quantize_row_iq1_s_impl: d and each sub-block's 3-bit scale and shift sign (where
 * any scale is not 0), then the high words. */
QD_HD void qd_iq1s_finish(struct qd_iq1s_block *b, uint8_t *blk)
{
    uint8_t *qhb = blk + 34;
    if (b->max_scale != 0.0f) {
        const float d = b->max_scale / 15.0f;
        qd_put_f16(blk, d * 1.125f);
        const float id = 1.0f / d;
        for (int ib = 0; ib < 8; ib++) {
            int l = qd_kq_clampi(qd_kq_round(0.5f * (id * b->scales[ib] - 1.0f)), 0, 7);
            if (b->shifts[ib] == -1)
                l |= 8;
            b->qh[ib] |= (uint16_t)(l << 12);
        }
    }
    for (int ib = 0; ib < 8; ib++) {
        qhb[2 * ib] = (uint8_t)b->qh[ib];
        qhb[2 * ib + 1] = (uint8_t)(b->qh[ib] >> 8);
    }
}

/* quantize_row_iq1_s_impl for one super-block; qw is required (ggml asserts it). The pieces
 * above are shared with the AVX2 form (kernels/cpu/iqgrid_avx2.h), which replaces the search. */
QD_HD void qd_iq1s_quantize(const struct qd_iq_grid *QD_RESTRICT g, const float *QD_RESTRICT x,
                            const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    struct qd_iq1s_block b;
    struct qd_iq1s_sub s;
    const float sigma2 = qd_iq1s_begin(x, blk, &b);
    for (int ib = 0; ib < 8; ib++)
        if (qd_iq1s_sub_sums(x + 32 * ib, qw + 32 * ib, sigma2, &s))
            qd_iq1s_sub_put(g, x + 32 * ib, &s, qd_iq1s_split_search(&s), ib, &b, blk);
    qd_iq1s_finish(&b, blk);
}

/* quantize_row_iq1_m_impl for one super-block; without qw the weights are x^2. */
QD_HD void qd_iq1m_quantize(const struct qd_iq_grid *QD_RESTRICT g, const float *QD_RESTRICT x,
                            const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    const float x_p[3] = {-1.0f + QD_IQ1_DELTA, QD_IQ1_DELTA, 1.0f + QD_IQ1_DELTA};
    const float x_m[3] = {-1.0f - QD_IQ1_DELTA, -QD_IQ1_DELTA, 1.0f - QD_IQ1_DELTA};
    const uint8_t masks[4] = {0x00, 0x80, 0x08, 0x88};
    uint8_t *qs = blk, *qh = blk + 32;
    uint16_t sc[4] = {0, 0, 0, 0};
    float scales[16], weight[16];
    int8_t L[16], shifts[16];
    int idx[16];
    uint16_t index[2];
    for (int i = 0; i < QD_IQ1M_BYTES; i++)
        blk[i] = 0;
    float sumx2 = 0.0f;
    for (int i = 0; i < QD_QK_K; i++)
        sumx2 += x[i] * x[i];
    const float sigma2 = 2.0f * sumx2 / (float)QD_QK_K;
    float max_scale = 0.0f;
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = x + 16 * ib;
        for (int i = 0; i < 16; i++)
            weight[i] = qw ? qw[16 * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
        float max = qd_absf(xb[0]);
        for (int i = 1; i < 16; i++)
            max = max > qd_absf(xb[i]) ? max : qd_absf(xb[i]);
        scales[ib] = 0.0f;
        shifts[ib] = 0;
        if (max < 1e-7f) /* GROUP_MAX_EPS_IQ1_M */
            continue;
        qd_iq1_sort(xb, 16, idx);
        /* prefix sums per half (each half takes its own shift); k = 2 * (first half shifted down)
         * + (second half shifted down) */
        float px[2][17], pw[2][17];
        px[0][0] = px[1][0] = pw[0][0] = pw[1][0] = 0.0f;
        for (int j = 0; j < 16; j++) {
            const int i = idx[j], h = i < 8 ? 0 : 1;
            px[h][j + 1] = px[h][j] + weight[i] * xb[i];
            px[1 - h][j + 1] = px[1 - h][j];
            pw[h][j + 1] = pw[h][j] + weight[i];
            pw[1 - h][j + 1] = pw[1 - h][j];
        }
        const float txs[2] = {px[0][16], px[1][16]}, tws[2] = {pw[0][16], pw[1][16]};
        const float p2 = x_p[2], m2 = x_m[2];
        const float cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1], cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
        const float cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1], cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
        float best_score = -QD_IQ_FLT_MAX, scale = max;
        int besti1 = -1, besti2 = -1, best_k = -1;
        for (int i1 = 0; i1 <= 16; i1++)
            for (int i2 = i1; i2 <= 16; i2++) {
                float qx_p[2], qx_m[2], q2_p[2], q2_m[2], sumqx[4], sumq2[4];
                for (int h = 0; h < 2; h++) {
                    const float sx = px[h][i1] + px[h][i2];
                    qx_p[h] = txs[h] * p2 - sx;
                    qx_m[h] = txs[h] * m2 - sx;
                    q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                    q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                }
                sumqx[0] = qx_p[0] + qx_p[1];
                sumqx[1] = qx_p[0] + qx_m[1];
                sumqx[2] = qx_m[0] + qx_p[1];
                sumqx[3] = qx_m[0] + qx_m[1];
                sumq2[0] = q2_p[0] + q2_p[1];
                sumq2[1] = q2_p[0] + q2_m[1];
                sumq2[2] = q2_m[0] + q2_p[1];
                sumq2[3] = q2_m[0] + q2_m[1];
                for (int k = 0; k < 4; k++)
                    if (sumq2[k] > 0.0f && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        besti1 = i1;
                        besti2 = i2;
                        best_k = k;
                    }
            }
        if (besti1 < 0 || besti2 < 0 || best_k < 0)
            continue;
        for (int j = 0; j < 16; j++)
            L[idx[j]] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0.0f) {
            for (int j = 0; j < 16; j++)
                L[j] = (int8_t)(2 - L[j]);
            scale = -scale;
            best_k = 3 - best_k;
        }
        const float deltas[2] = {best_k < 2 ? QD_IQ1_DELTA : -QD_IQ1_DELTA,
                                 best_k % 2 == 0 ? QD_IQ1_DELTA : -QD_IQ1_DELTA};
        scale = qd_iq1_codes(g, 16, xb, weight, L, scale, deltas, index);
        qs[2 * ib] = (uint8_t)(index[0] & 255);
        qs[2 * ib + 1] = (uint8_t)(index[1] & 255);
        qh[ib] = (uint8_t)((index[0] >> 8) | ((index[1] >> 8) << 4));
        scales[ib] = scale;
        shifts[ib] = (int8_t)best_k;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (max_scale == 0.0f)
        return;
    /* the 3-bit scales, then d refitted over the whole super-block */
    float d = max_scale / 15.0f;
    const float id = 1.0f / d;
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int ib = 0; ib < 16; ib++) {
        const int l = qd_kq_clampi(qd_kq_round(0.5f * (id * scales[ib] - 1.0f)), 0, 7);
        sc[ib / 4] |= (uint16_t)(l << 3 * (ib % 4));
        qh[ib] |= masks[shifts[ib]];
        const float *xb = x + 16 * ib;
        for (int i = 0; i < 16; i++)
            weight[i] = qw ? qw[16 * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
        for (int k = 0; k < 2; k++) {
            const float *xx = (k == 0 ? shifts[ib] < 2 : shifts[ib] % 2 == 0) ? x_p : x_m;
            const uint8_t *p = qd_iq_point(g, qs[2 * ib + k] + ((qh[ib] << (8 - 4 * k)) & 0x700));
            for (int j = 0; j < 8; j++) {
                const float w = weight[8 * k + j], q = xx[p[j]] * (float)(2 * l + 1);
                sumqx += w * q * xb[8 * k + j];
                sumq2 += w * q * q;
            }
        }
    }
    if (sumq2 > 0.0f)
        d = sumqx / sumq2;
    uint8_t h[2];
    qd_put_f16(h, d * 1.1125f);
    const uint16_t s = (uint16_t)(h[0] | h[1] << 8);
    sc[0] |= (uint16_t)((s & 0x000f) << 12);
    sc[1] |= (uint16_t)((s & 0x00f0) << 8);
    sc[2] |= (uint16_t)((s & 0x0f00) << 4);
    sc[3] |= (uint16_t)(s & 0xf000);
    for (int i = 0; i < 4; i++) {
        blk[48 + 2 * i] = (uint8_t)sc[i];
        blk[49 + 2 * i] = (uint8_t)(sc[i] >> 8);
    }
}

/* The 8 values of grid point index at scale dl, shifted by delta (both types' dequantize) */
QD_HD void qd_iq1_put8(const struct qd_iq_grid *QD_RESTRICT g, int index, float dl, float delta, float *QD_RESTRICT y)
{
    const uint8_t *p = qd_iq_point(g, index);
    for (int j = 0; j < 8; j++)
        y[j] = dl * ((float)(p[j] - 1) + delta);
}

/* dequantize_row_iq1_s for the super-block's group k of 8 values (0..31: sub-block k / 4, its
 * point k % 4) */
QD_HD void qd_iq1s_dequantize_eight(const struct qd_iq_grid *QD_RESTRICT g, const uint8_t *QD_RESTRICT blk, int k,
                                    float *QD_RESTRICT y)
{
    const float d = qd_get_f16(blk);
    const int ib = k / 4, l = k % 4;
    const int qh = blk[34 + 2 * ib] | blk[35 + 2 * ib] << 8;
    const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -QD_IQ1_DELTA : QD_IQ1_DELTA;
    qd_iq1_put8(g, blk[2 + k] | ((qh >> 3 * l) & 7) << 8, dl, delta, y);
}

QD_HD void qd_iq1s_dequantize(const struct qd_iq_grid *QD_RESTRICT g, const uint8_t *QD_RESTRICT blk,
                              float *QD_RESTRICT y)
{
    for (int k = 0; k < 32; k++)
        qd_iq1s_dequantize_eight(g, blk, k, y + 8 * k);
}

/* dequantize_row_iq1_m for the super-block's group k of 8 values (as iq1_s's) */
QD_HD void qd_iq1m_dequantize_eight(const struct qd_iq_grid *QD_RESTRICT g, const uint8_t *QD_RESTRICT blk, int k,
                                    float *QD_RESTRICT y)
{
    uint16_t sc[4];
    for (int i = 0; i < 4; i++)
        sc[i] = (uint16_t)(blk[48 + 2 * i] | blk[49 + 2 * i] << 8);
    const uint16_t s = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    const uint8_t h[2] = {(uint8_t)s, (uint8_t)(s >> 8)};
    const float d = qd_get_f16(h);
    const int ib = k / 4, l = k % 4;
    const int qh = blk[32 + 2 * ib + l / 2] >> 4 * (l % 2); /* the point's 3 high index bits, then its shift's sign */
    const float dl = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2))) & 7) + 1);
    const float delta = qh & 0x08 ? -QD_IQ1_DELTA : QD_IQ1_DELTA;
    qd_iq1_put8(g, blk[k] | (qh & 7) << 8, dl, delta, y);
}

QD_HD void qd_iq1m_dequantize(const struct qd_iq_grid *QD_RESTRICT g, const uint8_t *QD_RESTRICT blk,
                              float *QD_RESTRICT y)
{
    for (int k = 0; k < 32; k++)
        qd_iq1m_dequantize_eight(g, blk, k, y + 8 * k);
}

#endif
