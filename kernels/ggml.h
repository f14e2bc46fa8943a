/* llama.cpp / ggml blocks, one 32-element block at a time, shared by the CPU and CUDA backends.
 * Each function mirrors ggml's src/ggml-quants.c quantize_row_<type>_ref (the bytes model files
 * hold; the SIMD quantize_row_q8_* round differently and are not the contract) and
 * dequantize_row_<type>. Scales are stored as f16, little-endian, at the start of the block. */
#ifndef QD_GGML_H
#define QD_GGML_H

#include "fp.h"
#include "ggml_blocks.h"

enum qd_ggml_type { QD_Q4_0, QD_Q4_1, QD_Q5_0, QD_Q5_1, QD_Q8_0, QD_Q8_1 };

/* A type's block bytes; 0 for a code that is not a ggml type (never another type's size). */
QD_HD int qd_ggml_block_bytes(int type)
{
    switch (type) {
    case QD_Q4_0: return (int)sizeof(struct qd_block_q4_0);
    case QD_Q4_1: return (int)sizeof(struct qd_block_q4_1);
    case QD_Q5_0: return (int)sizeof(struct qd_block_q5_0);
    case QD_Q5_1: return (int)sizeof(struct qd_block_q5_1);
    case QD_Q8_0: return (int)sizeof(struct qd_block_q8_0);
    case QD_Q8_1: return (int)sizeof(struct qd_block_q8_1);
    default: return 0;
    }
}

QD_HD void qd_put_f16(uint8_t *p, float v)
{
    uint16_t h = qd_f32_to_f16_scale(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

QD_HD float qd_get_f16(const uint8_t *p) { return qd_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

QD_HD void qd_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

QD_HD uint32_t qd_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A float cast to an 8-bit integer as ggml's x86 build computes it: cvttss2si to int32 (NaN and
 * out-of-range values give INT32_MIN), then the low byte. Only a block whose scale is so small
 * that 1/d overflows reaches the out-of-range case (x * inf); C leaves it undefined, so quantd
 * spells out the x86 answer and the GPU computes the same. */
QD_HD int8_t qd_ggml_i8(float v)
{
    int32_t i = (v > -2147483904.0f && v < 2147483648.0f) ? (int32_t)v : INT32_MIN;
    return (int8_t)(uint8_t)(uint32_t)i;
}

/* The 8-bit cast where the caller knows the value is in range (a block of finite values with
 * a finite d and 1/d: every x * id lies within the code range), else qd_ggml_i8. The same
 * result either way; the short form saves the GPU two compares and a select per element. */
QD_HD int8_t qd_ggml_cast(float v, int in_range) { return in_range ? (int8_t)(int32_t)v : qd_ggml_i8(v); }

/* The signed value of largest magnitude; the first one wins on ties (strict <). */
QD_HD float qd_ggml_signed_max(const float *x)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QD_GGML_QK; j++) {
        float a = qd_absf(x[j]);
        if (amax < a) {
            amax = a;
            max = x[j];
        }
    }
    return max;
}

/* q4_0 / q5_0: d = max / -(2^(bits-1)), codes (int8)(x*id + 2^(bits-1) + 0.5) capped. */
QD_HD void qd_ggml_quantize_sym(int type, const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk, int clean)
{
    const int five = type == QD_Q5_0;
    const float max = qd_ggml_signed_max(x);
    const float d = max / (five ? -16.0f : -8.0f);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int fast = clean && qd_isfinite(id);
    const float bias = five ? 16.5f : 8.5f;
    const int cap = five ? 31 : 15;
    uint8_t *qs = blk + (five ? 6 : 2);
    uint32_t qh = 0;
    qd_put_f16(blk, d);
    for (int j = 0; j < 16; j++) {
        int a = qd_ggml_cast(x[j] * id + bias, fast), b = qd_ggml_cast(x[j + 16] * id + bias, fast);
        a = a < cap ? a : cap;
        b = b < cap ? b : cap;
        qs[j] = (uint8_t)((a & 15) | (b & 15) << 4);
        qh |= (uint32_t)((a >> 4) & 1) << j | (uint32_t)((b >> 4) & 1) << (j + 16);
    }
    if (five)
        qd_put_u32(blk + 2, qh);
}

/* q4_1 / q5_1: d = (max - min) / (2^bits - 1), m = min, codes of (x - min)*id + 0.5. */
QD_HD void qd_ggml_quantize_affine(int type, const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk, int clean)
{
    const int five = type == QD_Q5_1;
    float min = 3.40282347e38f, max = -3.40282347e38f;
    for (int j = 0; j < QD_GGML_QK; j++) {
        min = x[j] < min ? x[j] : min;
        max = x[j] > max ? x[j] : max;
    }
    const float d = (max - min) / (five ? 31.0f : 15.0f);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int fast = clean && qd_isfinite(d) && qd_isfinite(id); /* d finite: x - min cannot overflow */
    uint8_t *qs = blk + (five ? 8 : 4);
    uint32_t qh = 0;
    qd_put_f16(blk, d);
    qd_put_f16(blk + 2, min);
    for (int j = 0; j < 16; j++) {
        float x0 = (x[j] - min) * id, x1 = (x[j + 16] - min) * id;
        int a, b;
        if (five) { /* q5_1 casts to uint8_t and does not cap */
            a = (uint8_t)qd_ggml_cast(x0 + 0.5f, fast);
            b = (uint8_t)qd_ggml_cast(x1 + 0.5f, fast);
        } else {
            a = qd_ggml_cast(x0 + 0.5f, fast);
            b = qd_ggml_cast(x1 + 0.5f, fast);
            a = a < 15 ? a : 15;
            b = b < 15 ? b : 15;
        }
        qs[j] = (uint8_t)((a & 15) | (b & 15) << 4);
        qh |= (uint32_t)((a >> 4) & 1) << j | (uint32_t)((b >> 4) & 1) << (j + 16);
    }
    if (five)
        qd_put_u32(blk + 4, qh);
}

/* q8_0 / q8_1: d = amax / 127, codes roundf(x*id) (half away from zero); q8_1 adds
 * s = f16(sum(codes) * d). */
QD_HD void qd_ggml_quantize_q8(int type, const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk, int clean)
{
    float amax = 0.0f;
    for (int j = 0; j < QD_GGML_QK; j++) {
        float a = qd_absf(x[j]);
        amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int fast = clean && qd_isfinite(id);
    int8_t *qs = (int8_t *)blk + (type == QD_Q8_1 ? 4 : 2);
    int sum = 0;
    for (int j = 0; j < QD_GGML_QK; j++) {
        float v = x[j] * id;
        /* roundf (half away from zero), exactly: trunc, then one step away from zero when the
         * dropped fraction is >= 0.5 (v - trunc(v) is exact); trunc(v + 0.5) would be wrong
         * at 0.49999997 */
        float t = __builtin_truncf(v);
        float r = qd_absf(v - t) >= 0.5f ? t + (v > 0.0f ? 1.0f : -1.0f) : t;
        qs[j] = qd_ggml_cast(r, fast);
        sum += qs[j];
    }
    qd_put_f16(blk, d);
    if (type == QD_Q8_1)
        qd_put_f16(blk + 2, (float)sum * d);
}

/* clean: the caller checked that the block holds no NaN/Inf (the GPU does, per block). */
QD_HD void qd_ggml_quantize_block_checked(int type, const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk, int clean)
{
    if (type == QD_Q4_0 || type == QD_Q5_0)
        qd_ggml_quantize_sym(type, x, blk, clean);
    else if (type == QD_Q4_1 || type == QD_Q5_1)
        qd_ggml_quantize_affine(type, x, blk, clean);
    else
        qd_ggml_quantize_q8(type, x, blk, clean);
}

QD_HD void qd_ggml_quantize_block(int type, const float *QD_RESTRICT x, uint8_t *QD_RESTRICT blk)
{
    qd_ggml_quantize_block_checked(type, x, blk, 0);
}

/* dequantize_row_<type> for one block; q8_1 has no ggml dequantizer: q*d. */
QD_HD void qd_ggml_dequantize_block(int type, const uint8_t *QD_RESTRICT blk, float *QD_RESTRICT y)
{
    const float d = qd_get_f16(blk);
    if (type == QD_Q8_0 || type == QD_Q8_1) {
        const int8_t *qs = (const int8_t *)blk + (type == QD_Q8_1 ? 4 : 2);
        for (int j = 0; j < QD_GGML_QK; j++)
            y[j] = (float)qs[j] * d;
        return;
    }
    const int affine = type == QD_Q4_1 || type == QD_Q5_1;
    const int five = type == QD_Q5_0 || type == QD_Q5_1;
    const float m = affine ? qd_get_f16(blk + 2) : 0.0f;
    const uint8_t *qs = blk + 2 + (affine ? 2 : 0) + (five ? 4 : 0);
    const uint32_t qh = five ? qd_get_u32(blk + 2 + (affine ? 2 : 0)) : 0;
    const int offset = affine ? 0 : (five ? 16 : 8);
    for (int j = 0; j < 16; j++) {
        int a = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        int b = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        if (affine) {
            y[j] = (float)a * d + m; /* two rounded operations: build with -ffp-contract=off */
            y[j + 16] = (float)b * d + m;
        } else {
            y[j] = (float)(a - offset) * d;
            y[j + 16] = (float)(b - offset) * d;
        }
    }
}

#endif
