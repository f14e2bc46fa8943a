/* Element conversions through Hopper's fp8 cvt instructions (sm_89+), equal to the software
 * ones in fp.h on every f32 input (checked exhaustively on the device by test_gpu through
 * qd_cuda_conversion_mismatches):
 * - e4m3 / e5m2: cvt.rn.satfinite rounds to nearest even and saturates as torchao's clamp
 *   then cast does (a NaN is encoded by the software rule: 0x7f).
 * - e2m3 / e3m2 (MX fp6) have the same mantissa width as e4m3 / e5m2 and line up with them
 *   after an exact power-of-two scaling (2^-6, 2^-12 map min normal onto min normal and the
 *   subnormal step onto the subnormal step), once clamped to the fp6 maximum.
 * e2m1 has no counterpart before sm_100: qd_e2m1_finite rounds on each binade's grid with the
 * round-to-nearest-even of an add instead. */
#ifndef QD_CUDA_CONVERT_CUH
#define QD_CUDA_CONVERT_CUH

#include <cuda_fp16.h>

#include "../bnb4.h"
#include "../mx.h"
#include "../fp.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define QD_HW_FP8 1
#endif

/* The software pair encoders, called (not inlined) only for a NaN: inlined, the compiler
 * would compute them for every element and select. */
template <int ELEM> __device__ __noinline__ uint32_t qd_encode2_soft(float a, float b)
{
    switch (ELEM) {
    case 0: return qd_f32_to_floatx(a, 2, 1) | (uint32_t)qd_f32_to_floatx(b, 2, 1) << 8;
    case 1: return qd_f32_to_floatx(a, 2, 3) | (uint32_t)qd_f32_to_floatx(b, 2, 3) << 8;
    case 2: return qd_f32_to_floatx(a, 3, 2) | (uint32_t)qd_f32_to_floatx(b, 3, 2) << 8;
    case 3: return qd_f32_to_e4m3(a) | (uint32_t)qd_f32_to_e4m3(b) << 8;
    default: return qd_f32_to_e5m2(a) | (uint32_t)qd_f32_to_e5m2(b) << 8;
    }
}

/* Two fp8 codes (ELEM QD_E4M3 or QD_E5M2; a low byte, b high byte) of non-NaN values. */
template <int ELEM> __device__ __forceinline__ uint32_t qd_fp8x2_finite(float a, float b)
{
#ifdef QD_HW_FP8
    uint16_t r;
    if (ELEM == QD_E4M3)
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
    else
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
    return r;
#else
    return ELEM == QD_E4M3 ? qd_f32_to_e4m3(a) | (uint32_t)qd_f32_to_e4m3(b) << 8
                           : qd_f32_to_e5m2(a) | (uint32_t)qd_f32_to_e5m2(b) << 8;
#endif
}

/* fp6 codes of two non-NaN values through the fp8 conversion of the same mantissa width. */
template <int EBITS> __device__ __forceinline__ uint32_t qd_fp6x2_finite(float a, float b)
{
#ifdef QD_HW_FP8
    const float maxv = EBITS == 2 ? 7.5f : 28.0f;
    const float shift = EBITS == 2 ? 0.015625f : 0.000244140625f; /* 2^-6, 2^-12 */
    float sa = copysignf(fminf(fabsf(a), maxv), a) * shift;
    float sb = copysignf(fminf(fabsf(b), maxv), b) * shift;
    uint32_t c = qd_fp8x2_finite<EBITS == 2 ? QD_E4M3 : QD_E5M2>(sa, sb);
    /* sign bit 7 -> 5, exponent and mantissa already in the low 5 bits */
    return (c & 0x1f1fu) | ((c & 0x8080u) >> 2);
#else
    return qd_f32_to_floatx(a, EBITS, 5 - EBITS) | (uint32_t)qd_f32_to_floatx(b, EBITS, 5 - EBITS) << 8;
#endif
}

/* e2m1 code of a non-NaN x: |x| saturated at 6, then rounded to its binade's e2m1 step (0.5
 * below 2, 1 below 4, else 2) by adding c = 1.5 * 2^22 * step, whose ulp is that step (ties to
 * even: on each step's grid an even multiple is an even code, so ties go where round-to-
 * nearest-even on e2m1 sends them). The sum's low 22 bits hold that multiple k, its bits from
 * 22 up 0x12B plus twice the binade's index j, and the code is k + 2j. Integer and add units
 * only. */
__device__ __forceinline__ uint32_t qd_e2m1_finite(float x)
{
    float a = fminf(fabsf(x), 6.0f);
    uint32_t e = max(qd_f32_bits(a) & 0x7f800000u, 0x3f800000u); /* the binade, at least [1, 2) */
    uint32_t sum = qd_f32_bits(a + qd_bits_f32(e + 0x0B400000u)); /* a + 1.5 * 2^(22 + j) */
    return ((sum & 0x3fffffu) + (sum >> 22) - 0x12Bu) | ((qd_f32_bits(x) >> 28) & 8);
}

/* Code pair of element type ELEM (enum qd_mx_elem order: e2m1 e2m3 e3m2 e4m3 e5m2) for
 * non-NaN values (what a block without NaN/Inf scales to). */
template <int ELEM> __device__ __forceinline__ uint32_t qd_mx_encode2_finite(float a, float b)
{
    if (ELEM == 0)
        return qd_e2m1_finite(a) | qd_e2m1_finite(b) << 8;
    if (ELEM == 1)
        return qd_fp6x2_finite<2>(a, b);
    if (ELEM == 2)
        return qd_fp6x2_finite<3>(a, b);
    return qd_fp8x2_finite<ELEM>(a, b);
}

/* The same for any values: a NaN takes the software rule (torchao's bit arithmetic for e2m1
 * and fp6 on the canonical NaN, 0x7f for fp8), as on the CPU. */
template <int ELEM> __device__ __forceinline__ uint32_t qd_mx_encode2(float a, float b)
{
    if (a != a || b != b)
        return qd_encode2_soft<ELEM>(a, b);
    return qd_mx_encode2_finite<ELEM>(a, b);
}

/* f32 values of two fp8 codes (low byte a, high byte b): cvt.rn.f16x2.e4m3x2 (e5m2 is the top
 * byte of an f16 already), exact since every fp8 value is an f16 value, then f16 -> f32; a NaN
 * code keeps the software value (qd_e4m3_to_f32 / qd_e5m2_to_f32 give a quiet NaN with the
 * sign). Checked on every pair (elem 9, 10). */
template <int ELEM> __device__ __noinline__ float qd_fp8_decode_soft(uint32_t c)
{
    return ELEM == QD_E4M3 ? qd_e4m3_to_f32((uint8_t)c) : qd_e5m2_to_f32((uint8_t)c);
}

/* For codes that are not NaN. */
template <int ELEM> __device__ __forceinline__ void qd_fp8x2_decode_finite(uint32_t pair, float *a, float *b)
{
#ifdef QD_HW_FP8
    uint32_t h;
    if (ELEM == QD_E4M3)
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)pair));
    else
        h = (pair & 0xffu) << 8 | (pair & 0xff00u) << 16;
    *a = __half2float(__ushort_as_half((unsigned short)(h & 0xffffu)));
    *b = __half2float(__ushort_as_half((unsigned short)(h >> 16)));
#else
    *a = qd_fp8_decode_soft<ELEM>(pair & 0xffu);
    *b = qd_fp8_decode_soft<ELEM>(pair >> 8 & 0xffu);
#endif
}

/* Whether any of the four fp8 codes in w is a NaN code (e4m3: low 7 bits 0x7f; e5m2: above
 * 0x7c), without a branch: adding to the low 7 bits carries into bit 7 exactly then. */
template <int ELEM> __device__ __forceinline__ bool qd_fp8x4_has_nan(uint32_t w)
{
    return (((w & 0x7f7f7f7fu) + (ELEM == QD_E4M3 ? 0x01010101u : 0x03030303u)) & 0x80808080u) != 0;
}

template <int ELEM> __device__ __forceinline__ void qd_fp8x2_decode(uint32_t pair, float *a, float *b)
{
    qd_fp8x2_decode_finite<ELEM>(pair, a, b);
    if (*a != *a)
        *a = qd_fp8_decode_soft<ELEM>(pair & 0xffu);
    if (*b != *b)
        *b = qd_fp8_decode_soft<ELEM>(pair >> 8 & 0xffu);
}

/* NF4 / FP4 codes by table, for the scaled values p = x / absmax of a block with a normal,
 * finite absmax and finite elements: then |p| <= 1 + 2^-22 (rcp.approx is within 1 ulp), so
 * p lies in [-1.0625, 1.0625), the table's domain. Bucket i = floor(16 p + 17) (0..33) is
 * 1/16 wide and holds at most one code change (the codes' thresholds are further apart);
 * entry i is {the largest p of the bucket with the lower code (+inf when none changes), the
 * lower code (NF4: the upper one is the next) or lower | upper << 8 (FP4)}. The bucket index
 * is one fused multiply-add rounding down. Equal to qd_nf4_code / qd_fp4_code on every flushed
 * f32 of the domain (elem 7 and 8 of qd_cuda_conversion_mismatches); other values (NaN, Inf,
 * blocks of zeros) take the reference functions. */
#define QD_BNB_LUT 34
#define QD_BNB_LUT_LO (-1.0625f)
#define QD_BNB_LUT_HI 1.0625f

__device__ __forceinline__ uint32_t qd_bnb_ref(int nf4, float p) { return nf4 ? qd_nf4_code(p) : qd_fp4_code(p); }

/* f32 <-> an integer key in value order (-0 and +0 share key 0) */
__device__ __forceinline__ int qd_order_key(float f)
{
    int b = __float_as_int(f);
    return b >= 0 ? b : -(b & 0x7fffffff);
}
__device__ __forceinline__ float qd_order_float(int k) { return __int_as_float(k >= 0 ? k : (int)(0x80000000u | (uint32_t)-k)); }

/* Run by every thread of a CTA (entry threadIdx.x); a __syncthreads must follow. The code
 * change inside a bucket is found by bisection on the reference function itself. */
__device__ __forceinline__ void qd_bnb_lut_init(int nf4, float2 *lut)
{
    int i = threadIdx.x;
    if (i >= QD_BNB_LUT)
        return;
    int a = qd_order_key((float)(i - 17) * 0.0625f), b = qd_order_key((float)(i - 16) * 0.0625f) - 1;
    uint32_t lo = qd_bnb_ref(nf4, qd_order_float(a)), hi = qd_bnb_ref(nf4, qd_order_float(b));
    float thr = __int_as_float(0x7f800000);
    if (lo != hi) { /* invariant: code(a) == lo, code(b) == hi */
        while (b - a > 1) {
            int m = a + (b - a) / 2;
            if (qd_bnb_ref(nf4, qd_order_float(m)) == lo)
                a = m;
            else
                b = m;
        }
        thr = qd_order_float(a);
    }
    lut[i] = make_float2(thr, __int_as_float((int)(nf4 ? lo : lo | hi << 8)));
}

/* The table's shared-memory address. */
__device__ __forceinline__ uint32_t qd_bnb_lut_base(const float2 *lut) { return (uint32_t)__cvta_generic_to_shared(lut); }

/* Adds the code of p (in the table's domain) to word at bit `shift` (a constant; the bits
 * there are zero). NF4's upper code is always the lower plus one. */
template <int NF4> __device__ __forceinline__ void qd_bnb_code_add(uint32_t *word, int shift, float p, uint32_t base)
{
    float k, thr, codes;
    /* k = 2 + floor(16 p + 17) * 2^-22 (rounding down onto the grid of [2, 4)): its bits are
     * 0x40000000 + bucket, and shifted left by 3 (an 8-byte entry) the 0x40000000 drops out */
    asm("fma.rm.f32 %0, %1, 0f36800000, 0f40000011;" : "=f"(k) : "f"(p));
    asm("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(thr), "=f"(codes) : "r"(base + ((uint32_t)__float_as_int(k) << 3)));
    uint32_t c = (uint32_t)__float_as_int(codes);
    if (NF4) {
        *word += c << shift;
        if (p > thr)
            *word += 1u << shift;
    } else { /* byte 0 or byte 1 of c */
        *word += __byte_perm(c, 0, p > thr ? 0x4441 : 0x4440) << shift;
    }
}

/* The code of p alone (the self-check's form). */
template <int NF4> __device__ __forceinline__ uint32_t qd_bnb_code_lut(float p, const float2 *lut)
{
    uint32_t w = 0;
    qd_bnb_code_add<NF4>(&w, 0, p, qd_bnb_lut_base(lut));
    return w;
}

#endif
