/* compressed-tensors integer weight quantization (llm-compressor's W4A16, W4A16_ASYM and W8A16
 * schemes, format pack-quantized), one group at a time, for every backend. The contract is
 * llm-compressor 0.14 on a CUDA device: its observer and compressed-tensors' calculate_qparams
 * run torch ops on the weight in its own dtype (an op on a bf16 or f16 tensor computes in f32 and
 * rounds to bf16 or f16, so quantd rounds after each op the same way: qd_ct_round), and the
 * compressor's quantize runs compressed-tensors' Triton kernel, which computes the code in f32
 * (qd_ct_int_code). f32 weights round nowhere. docs/formats.md has the whole flow. */
#ifndef QD_CTINT_H
#define QD_CTINT_H

#include "fp.h"

/* v rounded to the weight's dtype (0 f32, 1 f16, 2 bf16), as a torch op's result is. */
QD_HD float qd_ct_round(float v, int dt)
{
    return dt == 2 ? qd_bf16_to_f32(qd_f32_to_bf16(v)) : dt == 1 ? qd_f16_to_f32(qd_f32_to_f16(v)) : v;
}

/* torch.finfo(dtype).eps: the scale that replaces 0 */
QD_HD float qd_ct_eps(int dt) { return dt == 2 ? 0.0078125f : dt == 1 ? 0.0009765625f : 1.1920928955078125e-07f; }

/* torch.round: to nearest, ties to even (values here are small) */
QD_HD float qd_ct_rint(float v)
{
    float t = __builtin_truncf(v), d = v - t; /* exact */
    float a = d < 0.0f ? -d : d;
    float step = v < 0.0f ? -1.0f : 1.0f;
    if (a > 0.5f || (a == 0.5f && ((int64_t)t & 1)))
        return t + step;
    return t;
}

/* The codes of a bits-wide integer (4: W4A16, 8: W8A16): [qmin, qmax] = [-2^(bits-1),
 * 2^(bits-1) - 1]; calculate_qparams divides by the bit range 2^bits - 1 (asymmetric) or by
 * half of it (symmetric: 7.5, 127.5; exact in f32). */
QD_HD int qd_ct_qmin(int bits) { return -(1 << (bits - 1)); }
QD_HD int qd_ct_qmax(int bits) { return (1 << (bits - 1)) - 1; }

/* A group's scale (in the dtype) and, when asymmetric, its zero point (qmin..qmax) from its
 * minimum and maximum (finite: non-finite input is refused); *zp is 0 when symmetric. */
QD_HD float qd_ct_int_qparams_mm(float mn, float mx, int bits, int sym, int dt, int *zp)
{
    const float range = (float)((1 << bits) - 1), lo = (float)qd_ct_qmin(bits), hi = (float)qd_ct_qmax(bits);
    mn = mn < 0.0f ? mn : 0.0f; /* 0 must be representable */
    mx = mx > 0.0f ? mx : 0.0f;
    float scale;
    *zp = 0;
    if (sym) {
        float amax = -mn > mx ? -mn : mx;
        scale = qd_ct_round(amax / (range / 2.0f), dt);
    } else
        scale = qd_ct_round(qd_ct_round(mx - mn, dt) / range, dt);
    if (!sym) { /* before the zero scale is replaced: 0 / 0 is NaN there, and NaN becomes 0 */
        float z = qd_ct_round(lo - qd_ct_round(mn / scale, dt), dt);
        if (z != z) /* torch.clamp keeps NaN; its cast to int8 gives 0 */
            *zp = 0;
        else {
            z = z < lo ? lo : (z > hi ? hi : z);
            *zp = (int)qd_ct_rint(z);
        }
    }
    if (scale == 0.0f) /* calculate_qparams' guard against division by zero */
        scale = qd_ct_eps(dt);
    return scale;
}

/* The same for one group of n values (a row's group_size columns). */
QD_HD float qd_ct_int_qparams(const float *x, int n, int bits, int sym, int dt, int *zp)
{
    float mn = x[0], mx = x[0];
    for (int i = 1; i < n; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    return qd_ct_int_qparams_mm(mn, mx, bits, sym, dt, zp);
}

/* The code (qmin..qmax) of x, as compressed-tensors' Triton _quantize_kernel computes it: the
 * quotient x / scale in f32 (div_rn; not rounded to the weight's dtype, which the eager torch
 * fallback that llm-compressor takes on a CPU-only machine does), plus the zero point in f32,
 * clamped to [qmin, qmax], rint (ties to even). The scale is already in the weight's dtype. */
QD_HD int qd_ct_int_code(float x, float scale, int zp, int bits)
{
    const float lo = (float)qd_ct_qmin(bits), hi = (float)qd_ct_qmax(bits);
    float q = x / scale + (float)zp; /* +0 leaves every code as it is */
    q = q < lo ? lo : (q > hi ? hi : q);
    return (int)qd_ct_rint(q);
}

/* _dequantize: (code - zero point) * scale, in the dtype. */
QD_HD float qd_ct_int_value(int code, int zp, float scale, int dt) { return qd_ct_round((float)(code - zp) * scale, dt); }

#endif
