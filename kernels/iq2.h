/* ggml's 2-bit "i-quants" IQ2_XXS, IQ2_XS and IQ2_S, one 256-element super-block at a time, for
 * every backend. Each group of 8 values has its |x| coded as one point of a grid in 8 dimensions
 * (every coordinate one of three levels), its signs apart; a 4-bit scale per 32 (IQ2_XXS) or 16
 * (IQ2_XS, IQ2_S) values and an f16 d per super-block. The grids hold 256, 512 and 1024 points.
 * The contract is quantize_iq2_xxs / quantize_iq2_xs / quantize_iq2_s (what ggml_quantize_chunk
 * and llama-quantize run) and dequantize_row_iq2_* of ggml/src/ggml-quants.c: the same float
 * operations in the same order (built without FMA contraction), integers narrowed as ggml's
 * stores narrow them. The searches read a struct qd_iq2_tables built once on the host
 * (kernels/iq2.c, as ggml's iq2xs_init_impl builds its kmap and neighbour lists); a device copy
 * of it serves the CUDA kernel. docs/formats.md says what each type stores. */
#ifndef QD_IQ2_H
#define QD_IQ2_H

#include "imatrix.h"

enum qd_iq2_type { QD_IQ2_XXS, QD_IQ2_XS, QD_IQ2_S };

/* The tuples of 8 levels in 0..2 (base 3, coordinate 0 the least significant digit): the only
 * ones a search can reach, as its levels are clamped to 0..2 and every grid point is one. */
#define QD_IQ2_TUPLES 6561
#define QD_IQ2_GRID_MAX 1024
/* room for the longest neighbour lists (the 512-point grid's: 196,972 entries, aligned); iq2.c checks */
#define QD_IQ2_NEIGHBOURS_MAX 200704

struct qd_iq2_tables {
    int grid_size;
    uint8_t grid[QD_IQ2_GRID_MAX][8]; /* point i's coordinates 2 l + 1 (1, 3 or 5) */
    int32_t map[QD_IQ2_TUPLES];       /* tuple -> its grid index, or -(offset + 1) of its neighbour list */
    const uint16_t *neighbours;       /* per off-grid tuple: the count, then grid indices (host or device;
                                         placed as kernels/iqlist.h says) */
    const uint16_t *codes;            /* beside each neighbours entry, its point's levels, 2 bits a
                                         coordinate (ggml's grid word; in a count's slot the count): a
                                         GPU search reads a candidate in one load */
    int64_t n_neighbours;
};

/* type's tables, built on first use (kernels/iq2.c); NULL where memory ran out */
#ifdef __cplusplus
extern "C"
#endif
const struct qd_iq2_tables *qd_iq2_tables(int type);

/* a block's bytes (kernels/ggml_blocks.h), as a constant expression where type is one (a GPU
 * kernel's shared memory) */
#define QD_IQ2_BLOCK_BYTES(type)                                                                \
    ((type) == QD_IQ2_XXS ? (int)sizeof(struct qd_block_iq2_xxs)                              \
     : (type) == QD_IQ2_XS ? (int)sizeof(struct qd_block_iq2_xs) : (int)sizeof(struct qd_block_iq2_s))
QD_HD int qd_iq2_block_bytes(int type) { return QD_IQ2_BLOCK_BYTES(type); }

/* ggml's grid for each type (iq2_data_index / iq2_grid_size) */
QD_HD int qd_iq2_grid_size(int type) { return type == QD_IQ2_XXS ? 256 : type == QD_IQ2_XS ? 512 : 1024; }

/* The level of x at inverse scale id: round((id x - 1) / 2), in 0..2 */
QD_HD int qd_iq2_level(float id, float x) { return qd_kq_clampi(qd_kq_round(0.5f * (id * x - 1.0f)), 0, 2); }

QD_HD int qd_iq2_tuple(const int8_t *L)
{
    int u = 0;
    for (int i = 7; i >= 0; i--)
        u = 3 * u + qd_kq_clampi(L[i], 0, 2); /* the clamp only matters where ggml aborts */
    return u;
}

/* The levels of grid point g (its coordinates are 2 l + 1) into L */
QD_HD void qd_iq2_point_levels(const struct qd_iq2_tables *QD_RESTRICT t, int g, int8_t *L)
{
    for (int i = 0; i < 8; i++)
        L[i] = (int8_t)((t->grid[g][i] - 1) / 2);
}

/* iq2_find_best_neighbour: of the grid points listed for off-grid tuple u, the one nearest xval
 * at this scale weighted by w (the first of equals); its levels into L, and its index. Where
 * every distance is Inf or NaN ggml aborts; quantd takes the first listed. */
QD_HD int qd_iq2_best_neighbour(const struct qd_iq2_tables *QD_RESTRICT t, int u, const float *xval, const float *w,
                                float scale, int8_t *L)
{
    const uint16_t *nb = t->neighbours + (-t->map[u] - 1);
    float best_d2 = 3.40282347e38f;
    int best = -1;
    for (int j = 1; j <= nb[0]; j++) {
        float d2 = 0.0f;
        for (int i = 0; i < 8; i++) {
            float diff = scale * (float)t->grid[nb[j]][i] - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    if (best < 0)
        best = nb[1];
    qd_iq2_point_levels(t, best, L);
    return best;
}

/* The grid index of the levels L (on the grid by construction; where ggml aborts on an
 * off-grid tuple, the first point of its neighbour list). */
QD_HD int qd_iq2_index(const struct qd_iq2_tables *QD_RESTRICT t, const int8_t *L)
{
    const int m = t->map[qd_iq2_tuple(L)];
    return m >= 0 ? m : t->neighbours[-m]; /* the list at -m - 1: its count, then its points */
}

/* The levels of group k (8 values) at inverse scale id; the nearest listed point where they fall
 * off the grid. Returns whether they were on it. */
QD_HD int qd_iq2_group(const struct qd_iq2_tables *QD_RESTRICT t, const float *xval, const float *waux, float id,
                       float scale, int8_t *L)
{
    for (int i = 0; i < 8; i++)
        L[i] = (int8_t)qd_iq2_level(id, xval[i]);
    const int u = qd_iq2_tuple(L);
    if (t->map[u] >= 0)
        return 1;
    qd_iq2_best_neighbour(t, u, xval, waux, scale, L);
    return 0;
}

/* The signs of group k of xb into |x| (xval); IQ2_XXS and IQ2_XS store 7 and keep the count of
 * negatives even by flipping the value of least w x^2 (which leaves it negative in xval). */
QD_HD uint8_t qd_iq2_signs(const float *xb, const float *weight, float *xval, int even)
{
    uint8_t s = 0;
    int nflip = 0;
    for (int i = 0; i < 8; i++) {
        if (xb[i] >= 0.0f) {
            xval[i] = xb[i];
        } else {
            xval[i] = -xb[i];
            nflip++;
            s |= (uint8_t)(1 << i);
        }
    }
    if (!even)
        return s;
    if (nflip % 2) {
        int imin = 0;
        float min = weight[0] * xb[0] * xb[0];
        for (int i = 1; i < 8; i++) {
            const float ax = weight[i] * xb[i] * xb[i];
            if (ax < min) {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= (uint8_t)(1 << imin);
    }
    return s & 127;
}

/* One trial of IQ2_XXS's search, its levels Laux: where its weighted fit beats *best, its scale
 * and levels become the chosen ones. */
QD_HD void qd_iq2xxs_take_trial(const float *weight, const float *xval, const int8_t *Laux, float *scale, float *best,
                                int8_t *L)
{
    float sumqx, sumq2;
    qd_kq_odd_sums(32, weight, xval, Laux, &sumqx, &sumq2);
    if (sumq2 > 0.0f && sumqx * sumqx > *best * sumq2) {
        *scale = sumqx / sumq2;
        *best = *scale * sumqx;
        for (int i = 0; i < 32; i++)
            L[i] = Laux[i];
    }
}

/* One sub-block of IQ2_XXS (32 values, 4 groups): its scale and levels L, or *zero set where
 * ggml leaves the sub-block's codes and signs 0 (its scale 0). quantize_row_iq2_xxs_impl: the
 * starting scale from make_qp_quants, 13 trial scales, then the levels again at the chosen one. */
QD_HD float qd_iq2xxs_sub(const struct qd_iq2_tables *QD_RESTRICT t, const float *xval, const float *weight,
                          const float *waux, int8_t *L, int *zero)
{
    float max = xval[0];
    for (int i = 1; i < 32; i++)
        max = max > xval[i] ? max : xval[i];
    *zero = 1;
    if (max < QD_KQ_EPS)
        return 0.0f;
    float scale = qd_imx_make_qp(32, 4, xval, (uint8_t *)L, weight);
    const float eff_max = scale * 3.0f;
    if (eff_max <= 0.0f)
        return 0.0f;
    *zero = 0;
    int8_t Laux[32];
    float best = 0.0f;
    for (int is = -6; is <= 6; is++) {
        const float id = (5.0f + (float)is * 0.1f) / eff_max, this_scale = 1.0f / id;
        for (int k = 0; k < 4; k++)
            qd_iq2_group(t, xval + 8 * k, waux + 8 * k, id, this_scale, Laux + 8 * k);
        qd_iq2xxs_take_trial(weight, xval, Laux, &scale, &best, L);
    }
    if (scale > 0.0f) {
        const float id = 1.0f / scale;
        for (int k = 0; k < 4; k++)
            qd_iq2_group(t, xval + 8 * k, waux + 8 * k, id, scale, L + 8 * k);
        scale = qd_kq_refit(32, weight, xval, L, scale);
    }
    return scale;
}

/* One sub-block of IQ2_XS or IQ2_S (16 values, 2 groups): 19 trial scales around max/5, then the
 * groups that fell off the grid again at the chosen scale. eps: a sub-block below it is zero. */
QD_HD float qd_iq2s_sub(const struct qd_iq2_tables *QD_RESTRICT t, const float *xval, const float *weight,
                        const float *waux, float eps, int8_t *L, int *zero)
{
    float max = xval[0];
    for (int i = 1; i < 16; i++)
        max = max > xval[i] ? max : xval[i];
    for (int i = 0; i < 16; i++)
        L[i] = 0;
    *zero = max < eps;
    if (*zero)
        return 0.0f;
    int8_t Laux[16];
    int on_grid[2] = {1, 1}, on_grid_aux[2];
    float best = 0.0f, scale = max / 5.0f;
    for (int is = -9; is <= 9; is++) {
        const float id = (5.0f + (float)is * 0.1f) / max, this_scale = 1.0f / id;
        for (int k = 0; k < 2; k++)
            on_grid_aux[k] = qd_iq2_group(t, xval + 8 * k, waux + 8 * k, id, this_scale, Laux + 8 * k);
        float sumqx, sumq2;
        qd_kq_odd_sums(16, weight, xval, Laux, &sumqx, &sumq2);
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            for (int i = 0; i < 16; i++)
                L[i] = Laux[i];
            on_grid[0] = on_grid_aux[0];
            on_grid[1] = on_grid_aux[1];
        }
    }
    if ((!on_grid[0] || !on_grid[1]) && scale > 0.0f) {
        const float id = 1.0f / scale;
        for (int k = 0; k < 2; k++)
            if (!on_grid[k])
                qd_iq2_group(t, xval + 8 * k, waux + 8 * k, id, scale, L + 8 * k);
        scale = qd_kq_refit(16, weight, xval, L, scale);
    }
    return scale;
}

/* The 4-bit code of a sub-block scale against d = max_scale / 31 */
QD_HD int qd_iq2_scale_code(float id, float scale) { return qd_kq_clampi(qd_kq_round(0.5f * (id * scale - 1.0f)), 0, 15); }

/* What a sub-block leaves for its super-block's bytes: zero (nothing coded), else its scale
 * (made positive, the signs flipped: ggml's guard), each 8-value group's signs and grid index. */
struct qd_iq2_sub {
    float scale;
    int zero;
    uint8_t signs[4];
    uint16_t g[4];
};

/* The importance's sigma2 of a super-block: the mean of x^2 (twice that for IQ2_S). */
QD_HD float qd_iq2_sigma2(int type, const float *x)
{
    float sumx2 = 0.0f;
    for (int i = 0; i < QD_QK_K; i++)
        sumx2 += x[i] * x[i];
    return type == QD_IQ2_S ? 2.0f * sumx2 / (float)QD_QK_K : sumx2 / (float)QD_QK_K;
}

/* Sub-block ib's start (values xb, importance qwb or NULL; 32 values for IQ2_XXS, 16 else): the
 * weights, their roots and |x| into the caller's arrays (the GPU's in shared memory), each
 * group's stored signs into r->signs. */
QD_HD void qd_iq2_sub_prepare(int type, const float *xb, const float *qwb, float sigma2, struct qd_iq2_sub *r,
                              float *weight, float *waux, float *xval)
{
    const int ng = type == QD_IQ2_XXS ? 4 : 2, group = 8 * ng;
    for (int i = 0; i < group; i++)
        weight[i] = qwb ? qwb[i] * sqrtf(sigma2 + xb[i] * xb[i]) : 0.25f * sigma2 + xb[i] * xb[i];
    for (int i = 0; i < group; i++)
        waux[i] = sqrtf(weight[i]);
    for (int k = 0; k < ng; k++)
        r->signs[k] = qd_iq2_signs(xb + 8 * k, weight + 8 * k, xval + 8 * k, type != QD_IQ2_S);
}

/* Sub-block's end from its search (scale, levels L; r->zero set by it): the scale made
 * positive, the signs flipped (ggml's guard), each group's grid index. */
QD_HD void qd_iq2_sub_result(const struct qd_iq2_tables *QD_RESTRICT t, int type, float scale, const int8_t *L,
                             struct qd_iq2_sub *r)
{
    const int ng = type == QD_IQ2_XXS ? 4 : 2;
    r->scale = 0.0f;
    if (r->zero)
        return;
    if (scale < 0.0f) { /* ggml's guard: a positive scale, the signs flipped */
        scale = -scale;
        for (int k = 0; k < ng; k++)
            r->signs[k] = (uint8_t)(type == QD_IQ2_S ? ~r->signs[k] : ~r->signs[k] & 127);
    }
    for (int k = 0; k < ng; k++)
        r->g[k] = (uint16_t)qd_iq2_index(t, L + 8 * k);
    r->scale = scale;
}

/* Sub-block ib's search (values xb, importance qwb or NULL): 32 values for IQ2_XXS, 16 else. */
QD_HD void qd_iq2_sub_block(const struct qd_iq2_tables *QD_RESTRICT t, int type, const float *xb, const float *qwb,
                            float sigma2, struct qd_iq2_sub *r)
{
    float weight[32], waux[32], xval[32];
    int8_t L[32];
    qd_iq2_sub_prepare(type, xb, qwb, sigma2, r, weight, waux, xval);
    const float scale = type == QD_IQ2_XXS ? qd_iq2xxs_sub(t, xval, weight, waux, L, &r->zero)
                                           : qd_iq2s_sub(t, xval, weight, waux, type == QD_IQ2_S ? 1e-8f : QD_KQ_EPS, L,
                                                         &r->zero);
    qd_iq2_sub_result(t, type, scale, L, r);
}

/* The super-block's bytes from its sub-blocks' results (8 for IQ2_XXS, 16 else), in ggml's
 * order: codes and signs, then d and the 4-bit scales. */
QD_HD void qd_iq2_finish(int type, const struct qd_iq2_sub *r, uint8_t *QD_RESTRICT blk)
{
    const int bytes = qd_iq2_block_bytes(type), ng = type == QD_IQ2_XXS ? 4 : 2, nsub = QD_QK_K / (8 * ng);
    for (int i = 0; i < bytes; i++)
        blk[i] = 0;
    float max_scale = 0.0f;
    for (int ib = 0; ib < nsub; ib++) {
        if (r[ib].zero)
            continue;
        for (int k = 0; k < ng; k++) {
            const int g = r[ib].g[k];
            if (type == QD_IQ2_XXS) {
                blk[2 + 8 * ib + k] = (uint8_t)g;
                const uint32_t s = (uint32_t)r[ib].signs[k] << 7 * k;
                for (int j = 0; j < 4; j++)
                    blk[6 + 8 * ib + j] |= (uint8_t)(s >> 8 * j);
            } else if (type == QD_IQ2_XS) {
                const int v = g | r[ib].signs[k] << 9, at = 2 + 2 * (2 * ib + k);
                blk[at] = (uint8_t)v;
                blk[at + 1] = (uint8_t)(v >> 8);
            } else {
                const int i8 = 2 * ib + k;
                blk[2 + i8] = (uint8_t)(g & 255);
                blk[66 + i8 / 4] |= (uint8_t)((g >> 8) << 2 * (i8 % 4));
                blk[2 + 32 + i8] = r[ib].signs[k];
            }
        }
        max_scale = max_scale > r[ib].scale ? max_scale : r[ib].scale;
    }
    if (max_scale == 0.0f) { /* d 0; IQ2_XXS and IQ2_XS clear their codes (a scale computed as 0 wrote some) */
        for (int i = 0; type != QD_IQ2_S && i < bytes; i++)
            blk[i] = 0;
        return;
    }
    const float d = max_scale / 31.0f;
    qd_put_f16(blk, type == QD_IQ2_S ? d * 0.9875f : d);
    const float id = 1.0f / d;
    for (int ib = 0; ib < nsub; ib++) {
        const int l = qd_iq2_scale_code(id, r[ib].scale);
        if (type == QD_IQ2_XXS)
            blk[6 + 8 * ib + 3] |= (uint8_t)(l << 4);
        else
            blk[(type == QD_IQ2_XS ? 66 : 74) + ib / 2] |= (uint8_t)(l << 4 * (ib % 2));
    }
}

/* One super-block of type into blk; qw its importance (ggml's quant_weights) or NULL, which only
 * IQ2_S takes (the registry refuses the others without one, as ggml_quantize_chunk asserts). */
QD_HD void qd_iq2_quantize_block(const struct qd_iq2_tables *QD_RESTRICT t, int type, const float *QD_RESTRICT x,
                                 const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    const int group = type == QD_IQ2_XXS ? 32 : 16;
    const float sigma2 = qd_iq2_sigma2(type, x);
    struct qd_iq2_sub r[16];
    for (int ib = 0; ib < QD_QK_K / group; ib++)
        qd_iq2_sub_block(t, type, x + group * ib, qw ? qw + group * ib : NULL, sigma2, &r[ib]);
    qd_iq2_finish(type, r, blk);
}

/* ksigns_iq2xs: 7 stored signs and the eighth that makes their count even */
QD_HD int qd_iq2_even_signs(int s7)
{
    int p = 0;
    for (int i = 0; i < 7; i++)
        p ^= s7 >> i & 1;
    return s7 | p << 7;
}

/* The dequantized magnitude of a grid coordinate (ggml-common.h's iq2*_grid bytes: 8, 25, 43) */
QD_HD float qd_iq2_value(int coord) { return coord == 1 ? 8.0f : coord == 3 ? 25.0f : 43.0f; }

/* 8 values of grid point g with signs s (bit j: value j negative) at scale db */
QD_HD void qd_iq2_put8(const struct qd_iq2_tables *QD_RESTRICT t, int g, int s, float db, float *y)
{
    for (int j = 0; j < 8; j++)
        y[j] = db * qd_iq2_value(t->grid[g][j]) * (s & 1 << j ? -1.0f : 1.0f);
}

/* dequantize_row_iq2_<type> for the super-block's group k of 8 values (0..31: sub-block k / 4,
 * its group k % 4), ggml's operations for them; a GPU thread takes one group */
QD_HD void qd_iq2_dequantize_eight(const struct qd_iq2_tables *QD_RESTRICT t, int type, const uint8_t *QD_RESTRICT blk,
                                   int k, float *QD_RESTRICT y)
{
    const float d = qd_get_f16(blk);
    const int ib = k / 4, l = k % 4;
    if (type == QD_IQ2_XXS) {
        const uint8_t *q = blk + 2 + 8 * ib;
        const uint32_t aux = (uint32_t)q[4] | (uint32_t)q[5] << 8 | (uint32_t)q[6] << 16 | (uint32_t)q[7] << 24;
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        qd_iq2_put8(t, q[l], qd_iq2_even_signs(aux >> 7 * l & 127), db, y);
        return;
    }
    const int sc = blk[(type == QD_IQ2_XS ? 66 : 74) + ib];
    const float db = d * (0.5f + (float)(l < 2 ? sc & 0xf : sc >> 4)) * 0.25f;
    if (type == QD_IQ2_XS) {
        const int v = blk[2 + 2 * k] | blk[3 + 2 * k] << 8;
        qd_iq2_put8(t, v & 511, qd_iq2_even_signs(v >> 9), db, y);
    } else {
        const int g = blk[2 + k] | ((blk[66 + ib] << (8 - 2 * l)) & 0x300);
        qd_iq2_put8(t, g, blk[34 + k], db, y);
    }
}

/* dequantize_row_iq2_<type> for one super-block */
QD_HD void qd_iq2_dequantize_block(const struct qd_iq2_tables *QD_RESTRICT t, int type, const uint8_t *QD_RESTRICT blk,
                                   float *QD_RESTRICT y)
{
    for (int k = 0; k < 32; k++)
        qd_iq2_dequantize_eight(t, type, blk, k, y + 8 * k);
}

#endif
