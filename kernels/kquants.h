/* llama.cpp's K-quant super-blocks (256 elements), one block at a time, for every backend. The
 * contract is ggml's quantize_row_<type>_ref, which llama-quantize calls when no importance
 * matrix is given, and dequantize_row_<type> (ggml/src/ggml-quants.c): the same search for
 * each sub-block's scale and minimum, the same float operations in the same order (build
 * without FMA contraction, as ggml-base is built), integers narrowed as its stores narrow
 * them. docs/formats.md says what each type stores and how it is searched. */
#ifndef QD_KQUANTS_H
#define QD_KQUANTS_H

#include <math.h>

#include "ggml.h"

enum qd_kquant_type { QD_Q2_K, QD_Q3_K, QD_Q4_K, QD_Q5_K, QD_Q6_K };

#define QD_KQ_EPS 1e-15f /* GROUP_MAX_EPS: a sub-block below it is all zero */

/* A type's super-block bytes; 0 for a code that is not a K-quant (never another type's size). */
QD_HD int qd_kquant_block_bytes(int type)
{
    switch (type) {
    case QD_Q2_K: return (int)sizeof(struct qd_block_q2_K);
    case QD_Q3_K: return (int)sizeof(struct qd_block_q3_K);
    case QD_Q4_K: return (int)sizeof(struct qd_block_q4_K);
    case QD_Q5_K: return (int)sizeof(struct qd_block_q5_K);
    case QD_Q6_K: return (int)sizeof(struct qd_block_q6_K);
    default: return 0;
    }
}

/* Round to nearest, ties to even, by adding 1.5 * 2^23 and reading the low mantissa bits
 * (ggml's nearest_int): exact for |v| < 2^22; beyond, the same bits as ggml, not a rounding.
 * A NaN reaches it from finite input too (a sub-block of subnormals makes the inverse scale
 * Inf, and Inf * 0 is NaN): on x86, where ggml runs, that NaN is the default one (payload 0),
 * which reads as 0; a GPU's NaN is 0x7fffffff, which would read as 2^22 - 1. */
QD_HD int qd_kq_round(float v)
{
#ifdef __CUDA_ARCH__
    if (v != v)
        return 0;
#endif
    int32_t i = (int32_t)qd_f32_bits(v + 12582912.0f);
    return (i & 0x007fffff) - 0x00400000;
}

QD_HD int qd_kq_clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* The value of largest |v| among n, the first of equal ones (0 where none is above 0): the
 * scale the K-quant and iq4 super-blocks code the others against. */
QD_HD float qd_kq_max_abs_first(const float *v, int n)
{
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < n; j++)
        if (qd_absf(v[j]) > amax) {
            amax = qd_absf(v[j]);
            max = v[j];
        }
    return max;
}

/* sum w x q and sum w q^2 over n values, q = 2 L + 1: the fit of a trial of the IQ2 and IQ3
 * searches */
QD_HD void qd_kq_odd_sums(int n, const float *w, const float *xval, const int8_t *L, float *sumqx, float *sumq2)
{
    float sx = 0.0f, s2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const float q = (float)(2 * L[i] + 1);
        sx += w[i] * xval[i] * q;
        s2 += w[i] * q * q;
    }
    *sumqx = sx;
    *sumq2 = s2;
}

/* The scale refit to levels L (the last step of the IQ searches): sumqx / sumq2 where sumq2 > 0,
 * else scale. */
QD_HD float qd_kq_refit(int n, const float *w, const float *xval, const int8_t *L, float scale)
{
    float sumqx, sumq2;
    qd_kq_odd_sums(n, w, xval, L, &sumqx, &sumq2);
    return sumq2 > 0.0f ? sumqx / sumq2 : scale;
}

/* One trial of the IQ3 searches (iq3_xxs, iq3_s): where its weighted fit (sumqx, sumq2) beats
 * *best, its scale, 32 levels Laux and 8 on-grid flags become the chosen ones. */
QD_HD void qd_kq_take_trial(float sumqx, float sumq2, float *scale, float *best, const int8_t *Laux, int8_t *L,
                            const int *on_grid_aux, int *on_grid)
{
    if (sumq2 > 0.0f && sumqx * sumqx > *best * sumq2) {
        *scale = sumqx / sumq2;
        *best = *scale * sumqx;
        for (int i = 0; i < 32; i++)
            L[i] = Laux[i];
        for (int k = 0; k < 8; k++)
            on_grid[k] = on_grid_aux[k];
    }
}

/* Symmetric codes in [-nmax, nmax) around the value of largest magnitude, then nine tries
 * either side of nmax for the scale that minimizes the weighted error (make_qx_quants with
 * rmse_type 1): weight qw[i] with an importance vector (quantize_row_*_impl), x[i]^2 without
 * one (qw NULL). L gets code + nmax; returns the scale. */
QD_HD float qd_kq_make_qx(int n, int nmax, const float *x, int8_t *L, const float *qw)
{
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float ax = qd_absf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < QD_KQ_EPS) {
        for (int i = 0; i < n; i++)
            L[i] = 0;
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = qd_kq_clampi(qd_kq_round(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = qd_kq_clampi(qd_kq_round(iscale * x[i]), -nmax, nmax - 1);
            float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + qd_kq_clampi(qd_kq_round(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Affine codes in [0, nmax] with a minimum <= 0, the scale and minimum refined by weighted
 * least squares over nstep + 1 trial scales (make_qkx2_quants). *the_min gets -min. */
QD_HD float qd_kq_make_qkx2(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                            uint8_t *Laux, float rmin, float rdelta, int nstep, int use_mad)
{
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0.0f)
        min = 0.0f;
    if (max == min) {
        for (int i = 0; i < n; i++)
            L[i] = 0;
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1.0f / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = qd_kq_round(iscale * (x[i] - min));
        L[i] = (uint8_t)qd_kq_clampi(l, 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? qd_absf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = qd_kq_clampi(qd_kq_round(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0.0f) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0.0f) {
                this_min = 0.0f;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0.0f;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? qd_absf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; i++)
                    L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Symmetric 3-bit codes in [-nmax, nmax), then up to five passes that move single codes
 * while the x^2-weighted fit improves (make_q3_quants with do_rmse). L gets code + nmax. */
QD_HD float qd_kq_make_q3(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float ax = qd_absf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < QD_KQ_EPS) {
        for (int i = 0; i < n; i++)
            L[i] = 0;
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = qd_kq_clampi(qd_kq_round(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0.0f) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                int nl = qd_kq_clampi(qd_kq_round(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (nl != L[i]) {
                    slx += w * x[i] * (float)nl;
                    sl2 += w * (float)nl * (float)nl;
                    if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* The 6-bit scale j and minimum j of q4_K/q5_K's 12 packed bytes (get_scale_min_k4). */
QD_HD void qd_kq_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* q4_K (nmax 15) and q5_K (31): eight sub-blocks of 32, each an affine fit weighted by
 * rms(x) + |x|; scales and minimums to 6 bits against the block's largest, f16 d and dmin;
 * then every code again from the stored scales. blk: d, dmin, scales[12], (q5_K: qh[32]),
 * qs[128]. */
/* The sub-block search of q4_K/q5_K: scales, minimums (-min) and codes per sub-block of 32. */
QD_HD void qd_kq_search_q45(int five, const float *QD_RESTRICT x, float *scales, float *mins, uint8_t *L)
{
    uint8_t Laux[32];
    float weights[32];
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++)
            weights[l] = av_x + qd_absf(x[32 * j + l]);
        scales[j] = qd_kq_make_qkx2(32, five ? 31 : 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                    five ? -0.5f : -1.0f, 0.1f, five ? 15 : 20, 0);
    }
}

/* The rest of a block from the searches' results is done in three steps, which the GPU spreads
 * over its threads: the header (sub-block scales quantized against the largest, f16 d/dmin),
 * each sub-block's codes again from the stored header (L updated in place), the packing. */

/* q4_K/q5_K header: the eight 6-bit scales and minimums (12 bytes), f16 d and dmin. */
QD_HD void qd_kq_header_q45(const float *scales, const float *mins, uint8_t *QD_RESTRICT blk)
{
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    uint8_t *sc = blk + 4;
    float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)qd_kq_round(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)qd_kq_round(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    qd_put_f16(blk, max_scale / 63.0f);
    qd_put_f16(blk + 2, max_min / 63.0f);
}

/* Sub-block j's 32 codes from the stored scale and minimum (kept from the search where the
 * stored scale is 0). */
QD_HD void qd_kq_codes_q45(int five, int j, const float *QD_RESTRICT x, const uint8_t *QD_RESTRICT blk, uint8_t *L)
{
    uint8_t s, m;
    qd_kq_scale_min(j, blk + 4, &s, &m);
    const float d = qd_get_f16(blk) * (float)s;
    if (d == 0.0f)
        return;
    const float dm = qd_get_f16(blk + 2) * (float)m;
    for (int i = 0; i < 32; i++)
        L[32 * j + i] = (uint8_t)qd_kq_clampi(qd_kq_round((x[32 * j + i] + dm) / d), 0, five ? 31 : 15);
}

/* qs[128] (two sub-blocks per 32 bytes, low nibble first) and, for q5_K, qh[32]. */
QD_HD void qd_kq_pack_q45(int five, const uint8_t *L, uint8_t *QD_RESTRICT blk)
{
    uint8_t *qh = blk + 16, *q = blk + (five ? 48 : 16);
    if (five)
        for (int j = 0; j < 32; j++)
            qh[j] = 0;
    for (int n = 0, hb = 0; n < QD_QK_K; n += 64, hb += 2) {
        for (int l = 0; l < 32; l++) {
            int a = L[n + l], b = L[n + l + 32];
            if (five) {
                if (a > 15)
                    a -= 16, qh[l] |= (uint8_t)(1 << hb);
                if (b > 15)
                    b -= 16, qh[l] |= (uint8_t)(2 << hb);
            }
            q[l] = (uint8_t)(a | (b << 4));
        }
        q += 32;
    }
}

QD_HD void qd_kq_finish_q45(int five, const float *QD_RESTRICT x, const float *scales, const float *mins, uint8_t *L,
                            uint8_t *QD_RESTRICT blk)
{
    qd_kq_header_q45(scales, mins, blk);
    for (int j = 0; j < 8; j++)
        qd_kq_codes_q45(five, j, x, blk, L);
    qd_kq_pack_q45(five, L, blk);
}

QD_HD void qd_kq_quantize_q45(int five, const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk)
{
    uint8_t L[QD_QK_K];
    float scales[8], mins[8];
    qd_kq_search_q45(five, x, scales, mins, L);
    qd_kq_finish_q45(five, x, scales, mins, L, blk);
}

/* q6_K: sixteen sub-blocks of 16, symmetric 6-bit codes (make_qx_quants); int8 scales against
 * the largest, f16 d; then every code from the stored scales. blk: ql[128], qh[64],
 * scales[16] (int8), d. */

/* The header; returns 1 when the block is all zero and complete (no codes, no packing). */
QD_HD int qd_kq_header_q6(const float *scales, uint8_t *QD_RESTRICT blk)
{
    const float max_scale = qd_kq_max_abs_first(scales, 16);
    if (qd_absf(max_scale) < QD_KQ_EPS) {
        for (int i = 0; i < 210; i++)
            blk[i] = 0;
        qd_put_f16(blk + 208, 0.0f);
        return 1;
    }
    int8_t *sc = (int8_t *)blk + 192;
    float iscale = -128.0f / max_scale;
    qd_put_f16(blk + 208, 1.0f / iscale);
    for (int ib = 0; ib < 16; ib++) {
        int v = qd_kq_round(iscale * scales[ib]);
        sc[ib] = (int8_t)(v < 127 ? v : 127);
    }
    return 0;
}

QD_HD void qd_kq_codes_q6(int j, const float *QD_RESTRICT x, const uint8_t *QD_RESTRICT blk, int8_t *L)
{
    float d = qd_get_f16(blk + 208) * (float)((const int8_t *)blk)[192 + j];
    if (d == 0.0f)
        return;
    for (int i = 0; i < 16; i++)
        L[16 * j + i] = (int8_t)(qd_kq_clampi(qd_kq_round(x[16 * j + i] / d), -32, 31) + 32);
}

QD_HD void qd_kq_pack_q6(const int8_t *L, uint8_t *QD_RESTRICT blk)
{
    uint8_t *ql = blk, *qh = blk + 128;
    for (int j = 0; j < QD_QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
            const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                              ((L[j + l + 96] >> 4) << 6));
        }
        ql += 64;
        qh += 32;
    }
}

QD_HD void qd_kq_finish_q6(const float *QD_RESTRICT x, const float *scales, int8_t *L, uint8_t *QD_RESTRICT blk)
{
    if (qd_kq_header_q6(scales, blk))
        return;
    for (int j = 0; j < 16; j++)
        qd_kq_codes_q6(j, x, blk, L);
    qd_kq_pack_q6(L, blk);
}

QD_HD void qd_kq_quantize_q6(const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk)
{
    int8_t L[QD_QK_K];
    float scales[16];
    for (int ib = 0; ib < 16; ib++)
        scales[ib] = qd_kq_make_qx(16, 32, x + 16 * ib, L + 16 * ib, NULL);
    qd_kq_finish_q6(x, scales, L, blk);
}

/* q3_K: sixteen sub-blocks of 16, 3-bit symmetric codes (make_q3_quants), 6-bit scales
 * against the largest, f16 d. blk: hmask[32], qs[64], scales[12], d. */
QD_HD void qd_kq_header_q3(const float *scales, uint8_t *QD_RESTRICT blk)
{
    const float max_scale = qd_kq_max_abs_first(scales, 16);
    uint8_t *sc = blk + 96;
    for (int i = 0; i < 12; i++)
        sc[i] = 0;
    if (max_scale != 0.0f) {
        float iscale = -32.0f / max_scale;
        for (int j = 0; j < 16; j++) {
            int8_t l = (int8_t)qd_kq_round(iscale * scales[j]);
            l = (int8_t)(qd_kq_clampi(l, -32, 31) + 32);
            if (j < 8)
                sc[j] = (uint8_t)(l & 0xF);
            else
                sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
            l = (int8_t)(l >> 4);
            sc[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
        }
        qd_put_f16(blk + 108, 1.0f / iscale);
    } else
        qd_put_f16(blk + 108, 0.0f);
}

QD_HD void qd_kq_codes_q3(int j, const float *QD_RESTRICT x, const uint8_t *QD_RESTRICT blk, int8_t *L)
{
    const uint8_t *sc = blk + 96;
    int8_t s = (int8_t)(j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4);
    s = (int8_t)((s | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
    float d = qd_get_f16(blk + 108) * (float)s;
    if (d == 0.0f)
        return;
    for (int i = 0; i < 16; i++)
        L[16 * j + i] = (int8_t)(qd_kq_clampi(qd_kq_round(x[16 * j + i] / d), -4, 3) + 4);
}

/* hmask[32] (code j's high bit at bit j / 32 of byte j % 32; ggml walks m and hm, branch-free
 * here) and qs[64]; L is changed in place. */
QD_HD void qd_kq_pack_q3(int8_t *L, uint8_t *QD_RESTRICT blk)
{
    uint8_t *hmask = blk, *qs = blk + 32;
    for (int i = 0; i < 32; i++)
        hmask[i] = 0;
    for (int j = 0; j < QD_QK_K; j++) {
        int high = L[j] > 3;
        hmask[j % 32] |= (uint8_t)(high << (j / 32));
        L[j] = (int8_t)(L[j] - 4 * high);
    }
    for (int j = 0; j < QD_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

QD_HD void qd_kq_finish_q3(const float *QD_RESTRICT x, const float *scales, int8_t *L, uint8_t *QD_RESTRICT blk)
{
    qd_kq_header_q3(scales, blk);
    for (int j = 0; j < 16; j++)
        qd_kq_codes_q3(j, x, blk, L);
    qd_kq_pack_q3(L, blk);
}

QD_HD void qd_kq_quantize_q3(const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk)
{
    int8_t L[QD_QK_K];
    float scales[16];
    for (int j = 0; j < 16; j++)
        scales[j] = qd_kq_make_q3(16, 4, x + 16 * j, L + 16 * j);
    qd_kq_finish_q3(x, scales, L, blk);
}

/* q2_K: sixteen sub-blocks of 16, affine 2-bit codes weighted by |x| with the absolute error
 * (make_qkx2_quants), 4-bit scales and minimums, f16 d and dmin. blk: scales[16], qs[64], d,
 * dmin. */
QD_HD void qd_kq_header_q2(const float *scales, const float *mins, uint8_t *QD_RESTRICT blk)
{
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 16; j++) {
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    uint8_t *sc = blk;
    if (max_scale > 0.0f) {
        float iscale = 15.0f / max_scale;
        for (int j = 0; j < 16; j++)
            sc[j] = (uint8_t)qd_kq_round(iscale * scales[j]);
        qd_put_f16(blk + 80, max_scale / 15.0f);
    } else {
        for (int j = 0; j < 16; j++)
            sc[j] = 0;
        qd_put_f16(blk + 80, 0.0f);
    }
    if (max_min > 0.0f) {
        float iscale = 15.0f / max_min;
        for (int j = 0; j < 16; j++)
            sc[j] |= (uint8_t)((unsigned)qd_kq_round(iscale * mins[j]) << 4);
        qd_put_f16(blk + 82, max_min / 15.0f);
    } else
        qd_put_f16(blk + 82, 0.0f);
}

QD_HD void qd_kq_codes_q2(int j, const float *QD_RESTRICT x, const uint8_t *QD_RESTRICT blk, uint8_t *L)
{
    const float d = qd_get_f16(blk + 80) * (float)(blk[j] & 0xF);
    if (d == 0.0f)
        return;
    const float dm = qd_get_f16(blk + 82) * (float)(blk[j] >> 4);
    for (int i = 0; i < 16; i++)
        L[16 * j + i] = (uint8_t)qd_kq_clampi(qd_kq_round((x[16 * j + i] + dm) / d), 0, 3);
}

QD_HD void qd_kq_pack_q2(const uint8_t *L, uint8_t *QD_RESTRICT blk)
{
    uint8_t *qs = blk + 16;
    for (int j = 0; j < QD_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

QD_HD void qd_kq_finish_q2(const float *QD_RESTRICT x, const float *scales, const float *mins, uint8_t *L,
                           uint8_t *QD_RESTRICT blk)
{
    qd_kq_header_q2(scales, mins, blk);
    for (int j = 0; j < 16; j++)
        qd_kq_codes_q2(j, x, blk, L);
    qd_kq_pack_q2(L, blk);
}

QD_HD void qd_kq_quantize_q2(const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk)
{
    uint8_t L[QD_QK_K], Laux[16];
    float weights[16], mins[16], scales[16];
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++)
            weights[l] = qd_absf(x[16 * j + l]);
        scales[j] = qd_kq_make_qkx2(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
    }
    qd_kq_finish_q2(x, scales, mins, L, blk);
}

QD_HD void qd_kquant_quantize_block(int type, const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk)
{
    switch (type) {
    case QD_Q2_K: qd_kq_quantize_q2(x, blk); break;
    case QD_Q3_K: qd_kq_quantize_q3(x, blk); break;
    case QD_Q4_K: qd_kq_quantize_q45(0, x, blk); break;
    case QD_Q5_K: qd_kq_quantize_q45(1, x, blk); break;
    default: qd_kq_quantize_q6(x, blk); break;
    }
}

/* dequantize_row_<type> for one block. */
QD_HD void qd_kquant_dequantize_block(int type, const uint8_t *QD_RESTRICT blk, float *QD_RESTRICT y)
{
    if (type == QD_Q4_K || type == QD_Q5_K) {
        const int five = type == QD_Q5_K;
        const float d = qd_get_f16(blk), min = qd_get_f16(blk + 2);
        const uint8_t *sc = blk + 4, *qh = blk + 16, *q = blk + (five ? 48 : 16);
        for (int j = 0, is = 0; j < QD_QK_K; j += 64, is += 2) {
            uint8_t s, m;
            qd_kq_scale_min(is, sc, &s, &m);
            const float d1 = d * (float)s, m1 = min * (float)m;
            qd_kq_scale_min(is + 1, sc, &s, &m);
            const float d2 = d * (float)s, m2 = min * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((q[l] & 0xF) + (five && (qh[l] >> is & 1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((q[l] >> 4) + (five && (qh[l] >> (is + 1) & 1) ? 16 : 0)) - m2;
            q += 32;
        }
        return;
    }
    if (type == QD_Q6_K) {
        const float d = qd_get_f16(blk + 208);
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)blk + 192;
        for (int n = 0; n < QD_QK_K; n += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
        return;
    }
    if (type == QD_Q3_K) {
        const float d_all = qd_get_f16(blk + 108);
        const uint8_t *hm = blk, *q = blk + 32, *s = blk + 96;
        int8_t scales[16];
        for (int j = 0; j < 16; j++) { /* the 6-bit scales, as the unpacking of aux[] gives them */
            int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
            int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
            scales[j] = (int8_t)((lo | hi << 4) - 32);
        }
        uint8_t m = 1;
        int is = 0;
        for (int n = 0; n < QD_QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                float dl = d_all * (float)scales[is++];
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                dl = d_all * (float)scales[is++];
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
                shift += 2;
                m = (uint8_t)(m << 1);
            }
            q += 32;
        }
        return;
    }
    /* q2_K */
    const float d = qd_get_f16(blk + 80), min = qd_get_f16(blk + 82);
    const uint8_t *q = blk + 16;
    int is = 0;
    for (int n = 0; n < QD_QK_K; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; j++) {
            uint8_t sc = blk[is++];
            float dl = d * (float)(sc & 0xF), ml = min * (float)(sc >> 4);
            for (int l = 0; l < 16; l++)
                *y++ = dl * (float)((q[l] >> shift) & 3) - ml;
            sc = blk[is++];
            dl = d * (float)(sc & 0xF), ml = min * (float)(sc >> 4);
            for (int l = 0; l < 16; l++)
                *y++ = dl * (float)((q[l + 16] >> shift) & 3) - ml;
            shift += 2;
        }
        q += 32;
    }
}

#endif
