/* AutoAWQ int4 (WQLinear_GEMM layout), shared by the CPU and CUDA backends. The weight is
 * W [K, N] (nn.Linear.weight transposed); groups of group_size rows along K share one scale
 * and zero per column. Arithmetic: AutoAWQ quantizer.pseudo_quantize_tensor in f32. */
#ifndef QD_AWQ_H
#define QD_AWQ_H

#include "fp.h"

/* Bit position 4*i of each 32-bit word holds column 8c + qd_awq_order[i]: the interleave the
 * GEMM kernels' lop3 unpacking expects. */
#define QD_AWQ_ORDER {0, 2, 4, 6, 1, 3, 5, 7}
/* Its inverse: the bit position of column 8c + j within word c. */
#define QD_AWQ_SHIFT_OF_COL {0, 16, 4, 20, 8, 24, 12, 28}

/* scale = clamp(max - min, min=1e-5) / 15; zero = clamp(-round(min / scale), 0, 15). */
QD_HD float qd_awq_scale(float min, float max)
{
    float range = max - min;
    range = range < 1e-5f ? 1e-5f : range;
    return range / 15.0f;
}

/* A NaN zero or code (only from NaN/Inf input under allow_nonfinite) is 0: C leaves the
 * float-to-integer cast of NaN undefined and x86 and the GPU answer differently. */
QD_HD float qd_awq_zero(float min, float scale)
{
    float z = -qd_rint(min / scale);
    z = z < 0.0f ? 0.0f : (z > 15.0f ? 15.0f : z);
    return z == z ? z : 0.0f;
}

/* q = clamp(round(w / scale) + zero, 0, 15), round half to even as torch.round. The f32 scale
 * is used, not its f16 rounding: see docs/formats.md. */
QD_HD uint32_t qd_awq_code(float w, float scale, float zero)
{
    float q = qd_rint(w / scale) + zero;
    q = q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q);
    return q == q ? (uint32_t)q : 0u;
}

#endif
