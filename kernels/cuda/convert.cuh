/* Element conversions through Hopper's fp8 cvt instructions (sm_89+), equal to the software
 * ones in fp.h on every f32 input (checked exhaustively on the device by test_gpu through
 * qd_cuda_conversion_mismatches):
 * - e4m3 / e5m2: cvt.rn.satfinite rounds to nearest even and saturates as torchao's clamp
 *   then cast does; NaN keeps the software answer (sign | 0x7f).
 * - e2m3 / e3m2 (MX fp6) have the same mantissa width as e4m3 / e5m2 and line up with them
 *   after an exact power-of-two scaling (2^-6, 2^-12 map min normal onto min normal and the
 *   subnormal step onto the subnormal step), once clamped to the fp6 maximum.
 * e2m1 has no counterpart before sm_100: qd_e2m1 counts the rounding thresholds instead
 *   (ties to even decide > or >=), equal to qd_f32_to_floatx(x, 2, 1) for every non-NaN f32
 *   (checked exhaustively on the host too, tests/kernels/test_convert.c). */
#ifndef QD_CUDA_CONVERT_CUH
#define QD_CUDA_CONVERT_CUH

#include "../fp.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define QD_HW_FP8 1
#endif

/* Two e4m3 codes (a low byte, b high byte). */
__device__ __forceinline__ uint32_t qd_e4m3x2(float a, float b)
{
#ifdef QD_HW_FP8
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
    uint32_t c = r;
    if (a != a || b != b) /* rare: NaN keeps its sign in the software rule */
        c = qd_f32_to_e4m3(a) | (uint32_t)qd_f32_to_e4m3(b) << 8;
    return c;
#else
    return qd_f32_to_e4m3(a) | (uint32_t)qd_f32_to_e4m3(b) << 8;
#endif
}

__device__ __forceinline__ uint32_t qd_e5m2x2(float a, float b)
{
#ifdef QD_HW_FP8
    uint16_t r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
    uint32_t c = r;
    if (a != a || b != b)
        c = qd_f32_to_e5m2(a) | (uint32_t)qd_f32_to_e5m2(b) << 8;
    return c;
#else
    return qd_f32_to_e5m2(a) | (uint32_t)qd_f32_to_e5m2(b) << 8;
#endif
}

/* fp6 codes of two values through the fp8 conversion of the same mantissa width. */
template <int EBITS> __device__ __forceinline__ uint32_t qd_fp6x2(float a, float b)
{
#ifdef QD_HW_FP8
    const float maxv = EBITS == 2 ? 7.5f : 28.0f;
    const float shift = EBITS == 2 ? 0.015625f : 0.000244140625f; /* 2^-6, 2^-12 */
    float sa = copysignf(fminf(fabsf(a), maxv), a) * shift;
    float sb = copysignf(fminf(fabsf(b), maxv), b) * shift;
    uint32_t c = EBITS == 2 ? qd_e4m3x2(sa, sb) : qd_e5m2x2(sa, sb);
    /* sign bit 7 -> 5, exponent and mantissa already in the low 5 bits */
    c = (c & 0x1f1fu) | ((c & 0x8080u) >> 2);
    if (a != a || b != b) /* NaN: whatever torchao's bit arithmetic gives, as on the CPU */
        c = qd_f32_to_floatx(a, EBITS, 5 - EBITS) | (uint32_t)qd_f32_to_floatx(b, EBITS, 5 - EBITS) << 8;
    return c;
#else
    return qd_f32_to_floatx(a, EBITS, 5 - EBITS) | (uint32_t)qd_f32_to_floatx(b, EBITS, 5 - EBITS) << 8;
#endif
}

/* e2m1 code of x: sign, and how many of the midpoints between neighbouring values
 * 0 0.5 1 1.5 2 3 4 6 |x| passes (a tie goes to the even code: > where the lower code is even,
 * >= where it is odd); 6 and beyond saturate to 7. */
QD_HD uint32_t qd_e2m1(float x)
{
    float a = qd_absf(x);
    uint32_t c = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) + (uint32_t)(a > 1.25f) + (uint32_t)(a >= 1.75f) +
                 (uint32_t)(a > 2.5f) + (uint32_t)(a >= 3.5f) + (uint32_t)(a > 5.0f);
    c |= (qd_f32_bits(x) >> 28) & 8;
    if (a != a) /* NaN: torchao's bit arithmetic, as on the CPU */
        c = qd_f32_to_floatx(x, 2, 1);
    return c;
}

/* Code pair of element type ELEM (enum qd_mx_elem order: e2m1 e2m3 e3m2 e4m3 e5m2). */
template <int ELEM> __device__ __forceinline__ uint32_t qd_mx_encode2(float a, float b)
{
    if (ELEM == 0)
        return qd_e2m1(a) | qd_e2m1(b) << 8;
    if (ELEM == 1)
        return qd_fp6x2<2>(a, b);
    if (ELEM == 2)
        return qd_fp6x2<3>(a, b);
    if (ELEM == 3)
        return qd_e4m3x2(a, b);
    return qd_e5m2x2(a, b);
}

#endif
