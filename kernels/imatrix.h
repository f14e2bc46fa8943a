/* ggml's importance-weighted searches (quantize_<type> with quant_weights, what llama-quantize
 * runs with --imatrix): one block at a time, for every backend. qw is the block's slice of the
 * importance vector (struct qd_params); the legacy types also take sigma2, the mean of x^2 over
 * the whole row, which the caller computes first (qd_imx_row_sigma2: a sequential f32 sum, as
 * ggml's). The same float operations in the same order as ggml-quants.c's
 * quantize_row_<type>_impl, make_qx_quants, make_qkx3_quants and make_qp_quants (built without
 * FMA contraction); integers narrowed as its stores narrow them. docs/formats.md says what
 * changes against the unweighted searches of kernels/ggml.h and kernels/kquants.h. */
#ifndef QD_IMATRIX_H
#define QD_IMATRIX_H

#include "kquants.h"

/* sum(x^2) / n over a row, summed in order (ggml's quantize_row_q*_impl for the legacy types). */
QD_HD float qd_imx_row_sigma2(const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t j = 0; j < n; j++)
        s += x[j] * x[j];
    return s / (float)n;
}

/* make_qp_quants' last steps, from the inverse scale its trials chose: codes in [0, nmax], then
 * up to five passes moving single codes while the qw-weighted fit improves; returns the
 * scale. Codes are stored as ggml's uint8_t L stores them (a negative value, which only a
 * negative input could give, wraps). */
QD_HD float qd_imx_make_qp_refine(int n, int nmax, const float *x, uint8_t *L, const float *qw, float iscale)
{
    float sumlx = 0.0f, suml2 = 0.0f;
    QD_ROLLED
    for (int i = 0; i < n; i++) {
        int l = qd_kq_round(iscale * x[i]);
        l = nmax < l ? nmax : l;
        L[i] = (uint8_t)l;
        float w = qw[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        QD_ROLLED
        for (int i = 0; i < n; i++) {
            float w = qw[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            if (slx > 0.0f && sl2 > 0.0f) {
                int nl = qd_kq_round(x[i] * sl2 / slx);
                nl = nmax < nl ? nmax : nl;
                if (nl != (int)L[i]) {
                    slx += w * x[i] * (float)nl;
                    sl2 += w * (float)nl * (float)nl;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)nl;
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
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* make_qp_quants: codes in [0, nmax] for non-negative values (the sub-block scales or minimums
 * of a super-block). Of the inverse scales nmax / max and (nmax + 0.1 is) / max, is = -4..4
 * but 0, the one of least qw-weighted squared error (the earliest on ties), then
 * qd_imx_make_qp_refine. */
/* make_qp_quants' start, shared with the CPU's AVX2 form: the largest x, with L zeroed where it
 * is below QD_KQ_EPS (the search then returns 0). */
QD_HD float qd_imx_make_qp_max(int n, const float *x, uint8_t *L)
{
    float max = 0.0f;
    for (int i = 0; i < n; i++)
        max = max > x[i] ? max : x[i];
    if (max < QD_KQ_EPS)
        for (int i = 0; i < n; i++)
            L[i] = 0;
    return max;
}

/* The qw-weighted squared error of the first inverse scale (its codes not clamped to nmax, as
 * make_qp_quants stores them in uint8_t). */
QD_HD float qd_imx_make_qp_first_error(int n, const float *x, const float *qw, float iscale)
{
    float scale = 1.0f / iscale;
    float best_mse = 0.0f;
    for (int i = 0; i < n; i++) {
        float diff = x[i] - scale * (float)(uint8_t)qd_kq_round(iscale * x[i]);
        best_mse += qw[i] * diff * diff;
    }
    return best_mse;
}

QD_HD float qd_imx_make_qp(int n, int nmax, const float *x, uint8_t *L, const float *qw)
{
    const float max = qd_imx_make_qp_max(n, x, L);
    if (max < QD_KQ_EPS)
        return 0.0f;
    float iscale = (float)nmax / max;
    float best_mse = qd_imx_make_qp_first_error(n, x, qw, iscale);
    for (int is = -4; is <= 4; is++) {
        if (is == 0)
            continue;
        float iscale_is = (0.1f * (float)is + (float)nmax) / max;
        float scale_is = 1.0f / iscale_is;
        float mse = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = qd_kq_round(iscale_is * x[i]);
            l = nmax < l ? nmax : l;
            float diff = x[i] - scale_is * (float)l;
            mse += qw[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    return qd_imx_make_qp_refine(n, nmax, x, L, qw, iscale);
}

/* ---- legacy 32-element blocks ---------------------------------------------------------------- */

/* One q4_0 / q4_1 / q5_0 / q5_1 block weighted by qw[j] * sqrt(sigma2 + x[j]^2): q*_0 a
 * symmetric fit (make_qx_quants, nmax 8 or 16), q*_1 an affine one (make_qkx3_quants, which
 * with weights is qd_kq_make_qkx2: 37 trial scales from -0.9 by 0.05). q8_0 has no weighted
 * form (ggml ignores the weights): the caller runs qd_ggml_quantize_block. */
QD_HD void qd_imx_quantize_legacy(int type, const float *QD_RESTRICT x, const float *QD_RESTRICT qw, float sigma2,
                                  uint8_t *QD_RESTRICT blk)
{
    float weight[QD_GGML_QK];
    for (int j = 0; j < QD_GGML_QK; j++)
        weight[j] = qw[j] * sqrtf(sigma2 + x[j] * x[j]);
    const int affine = type == QD_Q4_1 || type == QD_Q5_1, five = type == QD_Q5_0 || type == QD_Q5_1;
    uint8_t L[QD_GGML_QK];
    if (affine) {
        uint8_t Laux[QD_GGML_QK];
        float min;
        float d = qd_kq_make_qkx2(QD_GGML_QK, five ? 31 : 15, x, weight, L, &min, Laux, -0.9f, 0.05f, 36, 0);
        qd_put_f16(blk, d);
        qd_put_f16(blk + 2, -min);
    } else {
        float d = qd_kq_make_qx(QD_GGML_QK, five ? 16 : 8, x, (int8_t *)L, weight);
        qd_put_f16(blk, d);
    }
    uint8_t *qs = blk + 2 + (affine ? 2 : 0) + (five ? 4 : 0);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((L[j] & 0xF) | (L[j + 16] & 0xF) << 4);
        qh |= (uint32_t)((L[j] & 0x10u) >> 4) << j | (uint32_t)((L[j + 16] & 0x10u) >> 4) << (j + 16);
    }
    if (five)
        qd_put_u32(blk + 2 + (affine ? 2 : 0), qh);
}

/* ---- K super-blocks ---------------------------------------------------------------------------- */

/* sigma2 of a super-block: sum(x^2) over its 256 values, in order, times `twice` (q3_K, q4_K,
 * q5_K: 2, q2_K: 1), over 256. */
QD_HD float qd_imx_block_sigma2(const float *x, float twice)
{
    float s = 0.0f;
    for (int j = 0; j < QD_QK_K; j++)
        s += x[j] * x[j];
    return twice * s / (float)QD_QK_K;
}

/* The weights of sub-block j of n values and their sum, in order. */
QD_HD float qd_imx_weights(const float *x, const float *qw, float sigma2, int n, float *w)
{
    float sum = 0.0f;
    for (int l = 0; l < n; l++)
        w[l] = qw[l] * sqrtf(sigma2 + x[l] * x[l]);
    for (int l = 0; l < n; l++)
        sum += w[l];
    return sum;
}

/* q2_K's header: the 4-bit scale and minimum codes Ls, Lm and their scales dm, mm, which
 * make_qp_quants fits to the sixteen sub-block scales and minimums weighted by each
 * sub-block's weight sum. */
QD_HD void qd_imx_header_q2(const uint8_t *Ls, const uint8_t *Lm, float dm, float mm, uint8_t *QD_RESTRICT blk)
{
    qd_put_f16(blk + 80, dm);
    qd_put_f16(blk + 82, mm);
    for (int j = 0; j < 16; j++)
        blk[j] = (uint8_t)(Ls[j] | Lm[j] << 4);
}

/* q2_K: sixteen affine sub-block fits (37 trials, squared error), their scales and minimums
 * fitted by make_qp_quants (the header), codes again from the stored header. */
QD_HD void qd_imx_quantize_q2(const float *QD_RESTRICT x, const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    uint8_t L[QD_QK_K], Laux[16], Ls[16], Lm[16];
    float weight[16], sw[16], scales[16], mins[16];
    const float sigma2 = qd_imx_block_sigma2(x, 1.0f);
    for (int j = 0; j < 16; j++) {
        sw[j] = qd_imx_weights(x + 16 * j, qw + 16 * j, sigma2, 16, weight);
        scales[j] = qd_kq_make_qkx2(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
    }
    float dm = qd_imx_make_qp(16, 15, scales, Ls, sw);
    float mm = qd_imx_make_qp(16, 15, mins, Lm, sw);
    qd_imx_header_q2(Ls, Lm, dm, mm, blk);
    for (int j = 0; j < 16; j++)
        qd_kq_codes_q2(j, x, blk, L);
    qd_kq_pack_q2(L, blk);
}

/* q3_K's header from its sixteen sub-block scales and weight sums sw: the scales fitted in
 * turn (make_qx_quants, nmax 32, weighted by sw) and stored as 6-bit codes, f16 d. */
QD_HD void qd_imx_header_q3(const float *scales, const float *sw, uint8_t *QD_RESTRICT blk)
{
    int8_t Ls[16];
    uint8_t *sc = blk + 96;
    for (int i = 0; i < 12; i++)
        sc[i] = 0;
    float d_block = qd_kq_make_qx(16, 32, scales, Ls, sw);
    for (int j = 0; j < 16; j++) {
        int l = Ls[j];
        if (j < 8)
            sc[j] = (uint8_t)(l & 0xF);
        else
            sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
        l >>= 4;
        sc[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
    }
    qd_put_f16(blk + 108, d_block);
}

/* q3_K: sixteen symmetric sub-block fits (make_qx_quants, nmax 4), the header
 * (qd_imx_header_q3), codes again from the stored header. */
QD_HD void qd_imx_quantize_q3(const float *QD_RESTRICT x, const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    int8_t L[QD_QK_K];
    float weight[16], sw[16], scales[16];
    const float sigma2 = qd_imx_block_sigma2(x, 2.0f);
    for (int j = 0; j < 16; j++) {
        sw[j] = qd_imx_weights(x + 16 * j, qw + 16 * j, sigma2, 16, weight);
        scales[j] = qd_kq_make_qx(16, 4, x + 16 * j, L + 16 * j, weight);
    }
    qd_imx_header_q3(scales, sw, blk);
    for (int j = 0; j < 16; j++)
        qd_kq_codes_q3(j, x, blk, L);
    qd_kq_pack_q3(L, blk);
}

/* q4_K / q5_K's header: the 6-bit scale and minimum codes Ls, Lm (q5_K caps them at 63, q4_K
 * stores them as they come) and their scales d_block, m_block, which make_qp_quants fits to
 * the eight sub-block scales and minimums weighted by each sub-block's weight sum. */
QD_HD void qd_imx_header_q45(int five, const uint8_t *Ls, const uint8_t *Lm, float d_block, float m_block,
                             uint8_t *QD_RESTRICT blk)
{
    uint8_t *sc = blk + 4;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = Ls[j], lm = Lm[j];
        if (five) {
            ls = ls < 63 ? ls : 63;
            lm = lm < 63 ? lm : 63;
        }
        if (j < 4) {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    qd_put_f16(blk, d_block);
    qd_put_f16(blk + 2, m_block);
}

/* q4_K / q5_K: eight affine sub-block fits (37 trials from -0.9 by 0.05), their scales and
 * minimums fitted by make_qp_quants (the header), codes again from the stored header. */
QD_HD void qd_imx_quantize_q45(int five, const float *QD_RESTRICT x, const float *QD_RESTRICT qw,
                               uint8_t *QD_RESTRICT blk)
{
    uint8_t L[QD_QK_K], Laux[32], Ls[8], Lm[8];
    float weight[32], sw[8], scales[8], mins[8];
    const float sigma2 = qd_imx_block_sigma2(x, 2.0f);
    for (int j = 0; j < 8; j++) {
        sw[j] = qd_imx_weights(x + 32 * j, qw + 32 * j, sigma2, 32, weight);
        scales[j] = qd_kq_make_qkx2(32, five ? 31 : 15, x + 32 * j, weight, L + 32 * j, &mins[j], Laux, -0.9f,
                                    0.05f, 36, 0);
    }
    float d_block = qd_imx_make_qp(8, 63, scales, Ls, sw);
    float m_block = qd_imx_make_qp(8, 63, mins, Lm, sw);
    qd_imx_header_q45(five, Ls, Lm, d_block, m_block, blk);
    for (int j = 0; j < 8; j++)
        qd_kq_codes_q45(five, j, x, blk, L);
    qd_kq_pack_q45(five, L, blk);
}

/* q6_K: the sixteen symmetric fits weighted by the importance itself (ggml passes qw straight
 * to make_qx_quants here), then the unweighted header and codes. */
QD_HD void qd_imx_quantize_q6(const float *QD_RESTRICT x, const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    int8_t L[QD_QK_K];
    float scales[16];
    for (int ib = 0; ib < 16; ib++)
        scales[ib] = qd_kq_make_qx(16, 32, x + 16 * ib, L + 16 * ib, qw + 16 * ib);
    qd_kq_finish_q6(x, scales, L, blk);
}

QD_HD void qd_imx_quantize_kquant(int type, const float *QD_RESTRICT x, const float *QD_RESTRICT qw,
                                  uint8_t *QD_RESTRICT blk)
{
    switch (type) {
    case QD_Q2_K: qd_imx_quantize_q2(x, qw, blk); break;
    case QD_Q3_K: qd_imx_quantize_q3(x, qw, blk); break;
    case QD_Q4_K: qd_imx_quantize_q45(0, x, qw, blk); break;
    case QD_Q5_K: qd_imx_quantize_q45(1, x, qw, blk); break;
    default: qd_imx_quantize_q6(x, qw, blk); break;
    }
}

#endif
