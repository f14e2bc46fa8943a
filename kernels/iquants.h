/* ggml's non-linear and ternary types and its MXFP4, one block at a time, for every backend:
 * iq4_nl (32 elements) and iq4_xs (256) with their 16-value non-linear grid, tq1_0 and tq2_0
 * (256, ternary codes), and ggml's MXFP4 (32, an E8M0 exponent and E2M1 codes in ggml's own
 * block). The contract is ggml_quantize_chunk (ggml/src/ggml-quants.c quantize_iq4_nl,
 * quantize_iq4_xs, quantize_tq*_0, quantize_mxfp4: what llama-quantize writes) and each type's
 * dequantize_row_*; the same float operations in the same order (built without FMA
 * contraction), integers narrowed as ggml's stores narrow them. docs/formats.md says what each
 * stores. */
#ifndef QD_IQUANTS_H
#define QD_IQUANTS_H

#include <math.h>

#include "kquants.h"

enum qd_iquant_type { QD_IQ4_NL, QD_IQ4_XS, QD_TQ1_0, QD_TQ2_0, QD_MXFP4_GGML };

QD_HD int qd_iquant_block_elems(int type) { return type == QD_IQ4_NL || type == QD_MXFP4_GGML ? QD_GGML_QK : QD_QK_K; }

/* A type's block bytes (kernels/ggml_blocks.h) */
QD_HD int qd_iquant_block_bytes(int type)
{
    switch (type) {
    case QD_IQ4_NL: return (int)sizeof(struct qd_block_iq4_nl);
    case QD_IQ4_XS: return (int)sizeof(struct qd_block_iq4_xs);
    case QD_TQ1_0: return (int)sizeof(struct qd_block_tq1_0);
    case QD_TQ2_0: return (int)sizeof(struct qd_block_tq2_0);
    default: return (int)sizeof(struct qd_block_mxfp4_ggml);
    }
}

/* kvalues_iq4nl: the non-linear grid, in ascending order (-127, -104, -83, -65, -49, -35, -22,
 * -10, 1, 13, 25, 38, 53, 69, 89, 113) */
QD_HD int qd_iq4_value(int i) { return qd_s8_table16(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u, i); }

/* The index of the grid value nearest x, ties to the upper (ggml's best_index_int8: a binary
 * search, the same compares; NaN gives 15). */
QD_HD int qd_iq4_best_index(float x)
{
    if (x <= (float)qd_iq4_value(0))
        return 0;
    if (x >= (float)qd_iq4_value(15))
        return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < (float)qd_iq4_value(mav))
            mu = mav;
        else
            ml = mav;
    }
    return x - (float)qd_iq4_value(mu - 1) < (float)qd_iq4_value(mu) - x ? mu - 1 : mu;
}

/* quantize_row_iq4_nl_impl with ntry 7 (what quantize_iq4_nl and quantize_iq4_xs pass, with or
 * without weights), in three pieces the GPU runs a thread per sub-block: sigma2 = 2 mean(x^2)
 * over the super-block; per 32-element sub-block the scale -max/-127 and fifteen trials
 * (itry - 127)/max, each code the grid value nearest x/scale, the sum weighted by qw * sqrt(sigma2
 * + x^2) or, without qw, by x^2; the super-block's largest scale (qd_kq_max_abs_first). iq4_nl
 * keeps its one f16 scale; iq4_xs stores the sub-block scales as 6-bit multiples of
 * -max_scale/32 and chooses the codes again from them. (ggml also keeps each trial's codes; the
 * codes are always chosen again from the final scale, so only the scale is kept here.) */
QD_HD float qd_iq4_sigma2(const float *QD_RESTRICT x, int n)
{
    float sigma2 = 0.0f;
    for (int j = 0; j < n; j++)
        sigma2 += x[j] * x[j];
    return sigma2 * (2.0f / (float)n);
}

/* The scale of sub-block xb (importance qwb or NULL): 0 when its largest |x| is below eps. */
QD_HD float qd_iq4_sub_scale(const float *QD_RESTRICT xb, const float *QD_RESTRICT qwb, float sigma2)
{
    float weight[32];
    for (int j = 0; j < 32; j++)
        weight[j] = qwb ? qwb[j] * sqrtf(sigma2 + xb[j] * xb[j]) : xb[j] * xb[j];
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        float ax = qd_absf(xb[j]);
        if (ax > amax) {
            amax = ax;
            max = xb[j];
        }
    }
    if (amax < QD_KQ_EPS)
        return 0.0f;
    const float v0 = (float)qd_iq4_value(0);
    float d = -max / v0;
    float id = 1.0f / d;
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; j++) {
        float q = (float)qd_iq4_value(qd_iq4_best_index(id * xb[j]));
        float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
    }
    d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int itry = -7; itry <= 7; itry++) {
        id = (float)(itry + qd_iq4_value(0)) / max;
        sumqx = sumq2 = 0.0f;
        for (int j = 0; j < 32; j++) {
            float q = (float)qd_iq4_value(qd_iq4_best_index(id * xb[j]));
            float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* iq4_xs: sub-block xb's 6-bit scale code (l + 32) against d = -max_scale / 32 (id its inverse
 * or 0), and its codes L at that scale. */
QD_HD int qd_iq4_xs_sub_codes(float d, float id, float scale, const float *QD_RESTRICT xb, uint8_t *QD_RESTRICT L)
{
    int l = qd_kq_clampi(qd_kq_round(id * scale), -32, 31);
    float dl = d * (float)l;
    float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
    for (int j = 0; j < 32; j++)
        L[j] = (uint8_t)qd_iq4_best_index(idl * xb[j]);
    return l + 32;
}

/* 32 codes as 16 bytes: element j in the low nibble of byte j, j + 16 in the high one. */
QD_HD void qd_iq4_pack(const uint8_t *QD_RESTRICT L, uint8_t *QD_RESTRICT q4)
{
    for (int j = 0; j < 16; j++)
        q4[j] = (uint8_t)(L[j] | (L[16 + j] << 4));
}

/* iq4_xs's d and 6-bit scale codes ls[8] into the block's first 8 bytes (d, scales_h, scales_l). */
QD_HD void qd_iq4_xs_put_scales(float d, const int *ls, uint8_t *QD_RESTRICT blk)
{
    qd_put_f16(blk, d);
    uint16_t sh = 0;
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t l_l = (uint8_t)(ls[ib] & 0xf), l_h = (uint8_t)(ls[ib] >> 4);
        if (ib % 2 == 0)
            blk[4 + ib / 2] = l_l;
        else
            blk[4 + ib / 2] |= (uint8_t)(l_l << 4);
        sh |= (uint16_t)(l_h << 2 * ib);
    }
    blk[2] = (uint8_t)sh;
    blk[3] = (uint8_t)(sh >> 8);
}

QD_HD void qd_iq4_quantize(int xs, const float *QD_RESTRICT x, const float *QD_RESTRICT qw, uint8_t *QD_RESTRICT blk)
{
    const int sbs = xs ? QD_QK_K : 32, nsub = sbs / 32;
    const float sigma2 = qd_iq4_sigma2(x, sbs);
    float scales[8];
    for (int ib = 0; ib < nsub; ib++)
        scales[ib] = qd_iq4_sub_scale(x + 32 * ib, qw ? qw + 32 * ib : NULL, sigma2);
    const float max_scale = qd_kq_max_abs_first(scales, nsub);
    uint8_t L[32];
    if (xs) {
        float d = -max_scale / 32.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int ls[8];
        for (int ib = 0; ib < nsub; ib++) {
            ls[ib] = qd_iq4_xs_sub_codes(d, id, scales[ib], x + 32 * ib, L);
            qd_iq4_pack(L, blk + 8 + 16 * ib);
        }
        qd_iq4_xs_put_scales(d, ls, blk);
    } else {
        qd_put_f16(blk, scales[0]);
        float id = scales[0] != 0.0f ? 1.0f / scales[0] : 0.0f;
        for (int j = 0; j < 32; j++)
            L[j] = (uint8_t)qd_iq4_best_index(id * x[j]);
        qd_iq4_pack(L, blk + 2);
    }
}

/* lroundf(v) + 1 as ggml's x86 build computes it (a ternary code 0, 1 or 2): half away from
 * zero; a NaN or Inf (x * 1/amax where amax is so small that its inverse overflows) makes
 * lroundf return LONG_MIN, and LONG_MIN + 1 narrowed to int is 1. */
QD_HD int qd_tq_code(float v)
{
    if (!(qd_absf(v) <= 2.0f))
        return 1;
    float t = truncf(v);
    float r = qd_absf(v - t) >= 0.5f ? t + (v > 0.0f ? 1.0f : -1.0f) : t;
    return (int)r + 1;
}

/* Five ternary codes in a byte as a fraction of 243, rounded up (ggml's ceiling division). */
QD_HD uint8_t qd_tq_pack5(uint8_t q) { return (uint8_t)(((uint16_t)q * 256 + 242) / 243); }

/* quantize_row_tq1_0_ref: d = amax (f16), codes round(x / amax) + 1; 160 elements five to a byte
 * across 32 bytes, 80 across 16, 16 four to a byte (shifted up a trit). blk: qs[48], qh[4], d. */
QD_HD void qd_tq1_quantize(const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk)
{
    float amax = 0.0f;
    for (int j = 0; j < QD_QK_K; j++)
        amax = amax > qd_absf(x[j]) ? amax : qd_absf(x[j]);
    const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
    qd_put_f16(blk + 52, amax);
    for (int m = 0; m < 32; m++) {
        uint8_t q = 0;
        for (int n = 0; n < 5; n++)
            q = (uint8_t)((uint8_t)(q * 3) + qd_tq_code(x[m + n * 32] * id));
        blk[m] = qd_tq_pack5(q);
    }
    x += 160;
    for (int m = 0; m < 16; m++) {
        uint8_t q = 0;
        for (int n = 0; n < 5; n++)
            q = (uint8_t)((uint8_t)(q * 3) + qd_tq_code(x[m + n * 16] * id));
        blk[32 + m] = qd_tq_pack5(q);
    }
    x += 80;
    for (int j = 0; j < 4; j++) {
        uint8_t q = 0;
        for (int m = 0; m < 4; m++)
            q = (uint8_t)((uint8_t)(q * 3) + qd_tq_code(x[j + m * 4] * id));
        blk[48 + j] = qd_tq_pack5((uint8_t)(q * 3));
    }
}

/* quantize_row_tq2_0_ref: d = amax (f16), 2-bit codes round(x / amax) + 1, four to a byte
 * across 32 bytes. blk: qs[64], d. */
QD_HD void qd_tq2_quantize(const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk)
{
    float amax = 0.0f;
    for (int j = 0; j < QD_QK_K; j++)
        amax = amax > qd_absf(x[j]) ? amax : qd_absf(x[j]);
    const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
    qd_put_f16(blk + 64, amax);
    for (int j = 0; j < 64; j += 32, x += 128)
        for (int m = 0; m < 32; m++) {
            uint8_t q = 0;
            for (int n = 0; n < 4; n++)
                q = (uint8_t)(q + ((qd_tq_code(x[m + n * 32] * id) & 3) << (2 * n)));
            blk[j + m] = q;
        }
}

/* kvalues_mxfp4: E2M1 values doubled (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12) */
QD_HD int qd_mxg_value(int i) { return qd_s8_table16(0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu, i); }

/* GGML_E8M0_TO_FP32_HALF: 2^(e - 128), subnormal for e < 2 */
QD_HD float qd_mxg_half_scale(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return qd_bits_f32(bits);
}

/* floorf(log2f(a)) for a finite a > 0, as glibc's correctly rounded log2f gives it: the
 * exponent of a, or one more where log2(a) lies so close below the next integer that it rounds
 * up to it in f32. The log is taken in f64 and rounded once to f32 (equal to log2f's result on
 * every positive f32: checked exhaustively against glibc, docs/formats.md). */
QD_HD float qd_mxg_floor_log2(float a) { return floorf((float)log2((double)a)); }

/* quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127 narrowed to a byte as x86 narrows it
 * (through int32: below 2^-125 it wraps), d = 2^(e - 128), each code the doubled E2M1 value
 * whose multiple of d is nearest x (the first on ties). blk: e, qs[16] (element j low nibble,
 * j + 16 high). */
QD_HD void qd_mxg_quantize(const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        if (amax < qd_absf(x[j]))
            amax = qd_absf(x[j]);
    const uint8_t e = amax > 0.0f ? (uint8_t)(int32_t)(qd_mxg_floor_log2(amax) - 2.0f + 127.0f) : 0;
    const float d = qd_mxg_half_scale(e);
    blk[0] = e;
    for (int j = 0; j < 16; j++) {
        int q[2];
        for (int h = 0; h < 2; h++) {
            const float v = x[j + 16 * h];
            int best = 0;
            float best_err = qd_absf((float)qd_mxg_value(0) * d - v);
            for (int i = 1; i < 16; i++) {
                float err = qd_absf((float)qd_mxg_value(i) * d - v);
                if (err < best_err) {
                    best = i;
                    best_err = err;
                }
            }
            q[h] = best;
        }
        blk[1 + j] = (uint8_t)(q[0] | q[1] << 4);
    }
}

/* One block; qw (the block's importance, or NULL) weights iq4_nl/iq4_xs only: ggml ignores it
 * for the ternary types and MXFP4. */
QD_HD void qd_iquant_quantize_block(int type, const float *QD_RESTRICT x, const float *QD_RESTRICT qw,
                                    uint8_t *QD_RESTRICT blk)
{
    switch (type) {
    case QD_IQ4_NL: qd_iq4_quantize(0, x, qw, blk); break;
    case QD_IQ4_XS: qd_iq4_quantize(1, x, qw, blk); break;
    case QD_TQ1_0: qd_tq1_quantize(x, blk); break;
    case QD_TQ2_0: qd_tq2_quantize(x, blk); break;
    default: qd_mxg_quantize(x, blk); break;
    }
}

/* dequantize_row_<type> for the block's group k of 8 values, for iq4_nl and MXFP4 (k 0..3 of
 * 32) and iq4_xs (0..31 of 256); a GPU thread takes one group. A 32-value run's first 16 values
 * are its 16 bytes' low nibbles, its last 16 their high ones. */
QD_HD void qd_iquant_dequantize_eight(int type, const uint8_t *QD_RESTRICT blk, int k, float *QD_RESTRICT y)
{
    const int half = k % 2, high = k % 4 >= 2;
    if (type == QD_IQ4_XS) {
        const float d = qd_get_f16(blk);
        const int sh = blk[2] | blk[3] << 8, ib = k / 4;
        const uint8_t *qs = blk + 8 + 16 * ib + 8 * half;
        const int ls = ((blk[4 + ib / 2] >> 4 * (ib % 2)) & 0xf) | (((sh >> 2 * ib) & 3) << 4);
        const float dl = d * (float)(ls - 32);
        for (int j = 0; j < 8; j++)
            y[j] = dl * (float)qd_iq4_value(high ? qs[j] >> 4 : qs[j] & 0xf);
        return;
    }
    const int nl = type == QD_IQ4_NL;
    const float d = nl ? qd_get_f16(blk) : qd_mxg_half_scale(blk[0]);
    const uint8_t *qs = blk + (nl ? 2 : 1) + 8 * half;
    for (int j = 0; j < 8; j++) {
        const int q = high ? qs[j] >> 4 : qs[j] & 0xf;
        y[j] = nl ? d * (float)qd_iq4_value(q) : (float)qd_mxg_value(q) * d;
    }
}

/* The groups of 8 values a block of type dequantizes by qd_iquant_dequantize_eight; 0 for tq1_0
 * and tq2_0, whose trits do not fall into such groups (their whole block at once). A macro, so
 * that a kernel's template can take it as a constant. */
#define QD_IQUANT_EIGHTS(type) ((type) == QD_IQ4_XS ? 32 : (type) == QD_IQ4_NL || (type) == QD_MXFP4_GGML ? 4 : 0)

/* dequantize_row_<type> for one block. */
QD_HD void qd_iquant_dequantize_block(int type, const uint8_t *QD_RESTRICT blk, float *QD_RESTRICT y)
{
    if (QD_IQUANT_EIGHTS(type) > 0) {
        for (int k = 0; k < QD_IQUANT_EIGHTS(type); k++)
            qd_iquant_dequantize_eight(type, blk, k, y + 8 * k);
        return;
    }
    if (type == QD_TQ2_0) {
        const float d = qd_get_f16(blk + 64);
        for (int j = 0; j < 64; j += 32)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++)
                    *y++ = (float)(((blk[j + m] >> (l * 2)) & 3) - 1) * d;
        return;
    }
    /* tq1_0: trit n of a byte is the integer part of (byte * 3^n mod 256) * 3 / 256 */
    const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const float d = qd_get_f16(blk + 52);
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 32; m++)
            *y++ = (float)((int)(((uint16_t)(uint8_t)(blk[m] * pow3[n]) * 3) >> 8) - 1) * d;
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 16; m++)
            *y++ = (float)((int)(((uint16_t)(uint8_t)(blk[32 + m] * pow3[n]) * 3) >> 8) - 1) * d;
    for (int n = 0; n < 4; n++)
        for (int j = 0; j < 4; j++)
            *y++ = (float)((int)(((uint16_t)(uint8_t)(blk[48 + j] * pow3[n]) * 3) >> 8) - 1) * d;
}

#endif
