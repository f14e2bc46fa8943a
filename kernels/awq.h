/* AutoAWQ int4 (WQLinear_GEMM layout), shared by the CPU and CUDA backends. The weight is
 * W [K, N] (nn.Linear.weight transposed); groups of group_size rows along K share one scale
 * and zero per column.
 *
 * Arithmetic: AutoAWQ's real call path (commit 88e4c76). AwqQuantizer._apply_quant halves the
 * layer (`linear_layer.half()`) before pseudo_quantize_tensor, so the weight is rounded to f16
 * first and every op there is a torch fp16 op: computed in f32, rounded to f16 after each op
 * (qd_f16_round). Callers pass weights already rounded to f16 (as f32 values). */
#ifndef QD_AWQ_H
#define QD_AWQ_H

#include "fp.h"

/* Bit position 4*i of each 32-bit word holds column 8c + qd_awq_order[i]: the interleave the
 * GEMM kernels' lop3 unpacking expects. */
#define QD_AWQ_ORDER {0, 2, 4, 6, 1, 3, 5, 7}
/* Its inverse: the bit position of column 8c + j within word c. */
#define QD_AWQ_SHIFT_OF_COL {0, 16, 4, 20, 8, 24, 12, 28}

/* A non-finite report (the bad index of kernels/quantize.h) with this bit set names the first
 * element of a group column whose f16 arithmetic overflows (qd_awq_column_defined). Plain
 * non-finite indices are smaller, so they win the "first" race. */
#define QD_BAD_AWQ_F16_RANGE ((int64_t)1 << 62)

/* scales = (max - min).clamp(min=1e-5) / 15, three fp16 ops on f16 min and max. No f16 lies
 * between 1e-5 and its f16 rounding (168 * 2^-24), so clamping in f32 or in f16 agree. torch
 * on CUDA divides by the Python scalar 15 as a multiply by f32(1/15); on every f16 range that
 * rounds to the same f16 as the division (tests/kernels/test_awq.c checks all of them). */
QD_HD float qd_awq_scale(float min16, float max16)
{
    float range = qd_f16_round(max16 - min16);
    range = range < 1e-5f ? qd_f16_round(1e-5f) : range;
    return qd_f16_round(range / 15.0f);
}

/* zeros = (-round(min / scales)).clamp(0, 15): the quotient rounded to f16, then half to
 * even. A NaN zero (only from NaN/Inf under allow_nonfinite) is 0: C leaves the float-to-int
 * cast of NaN undefined and x86 and the GPU answer differently. */
QD_HD float qd_awq_zero(float min16, float scale16)
{
    float z = -qd_rint(qd_f16_round(min16 / scale16));
    z = z < 0.0f ? 0.0f : (z > 15.0f ? 15.0f : z);
    return z == z ? z : 0.0f;
}

/* q = clamp(round(w / scales) + zeros, 0, 15) on an f16 weight: the quotient rounded to f16 is
 * what round (half to even) sees, so a quotient within half an f16 ulp of k + 1/2 is a tie.
 * The f16 add of zeros is exact wherever the clamp does not decide. from_linear then
 * recomputes round((wq + zeros * scales) / scales) in f16 from the fake-quantized weight;
 * that gives q back wherever qd_awq_column_defined holds (checked exhaustively in
 * tests/kernels/test_awq.c), so it is not repeated here. NaN gives 0 (see above). */
QD_HD uint32_t qd_awq_code(float w16, float scale16, float zero)
{
    float q = qd_rint(qd_f16_round(w16 / scale16)) + zero;
    q = q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q);
    return q == q ? (uint32_t)q : 0u;
}

/* WQLinear_GEMM.from_linear's code: round(f16(f16(wq + f16(zero * scale)) / scale)) from the
 * fake-quantized weight wq = f16((code - zero) * scale) of pseudo_quantize_tensor. */
QD_HD float qd_awq_recomputed(float code, float scale16, float zero)
{
    float wq = qd_f16_round((code - zero) * scale16), zs = qd_f16_round(zero * scale16);
    return qd_rint(qd_f16_round(qd_f16_round(wq + zs) / scale16));
}

/* Whether AutoAWQ's f16 flow is defined for a group column: a scale that is not finite makes
 * its asserts fail. Below the largest finite scale, 4368 (an f16 range of 65504), from_linear
 * gives every code back (tests/kernels/test_awq.c checks every scale, zero and code); at
 * 4368, 15 * scale overflows f16, so a zero of 15 or a code of 15 (the column's largest code
 * is its max's) can make it inf, which it casts to int (x86 and CUDA give different ints). */
QD_HD int qd_awq_column_defined(float max16, float scale16, float zero)
{
    if (scale16 < 4368.0f)
        return 1;
    float code = (float)qd_awq_code(max16, scale16, zero);
    return scale16 == 4368.0f && qd_awq_recomputed(code, scale16, zero) == code;
}

#endif
