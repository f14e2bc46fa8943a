/* Scalar number conversions shared by the CPU and CUDA backends.
 *
 * Every function here is exact integer/bit arithmetic or a single correctly rounded f32 operation,
 * so the CPU and the GPU compute the same bits from the same source (ggml-common.h does the same
 * for ggml's backends). Nothing here may be compiled with fast-math or FMA contraction. */
#ifndef QD_FP_H
#define QD_FP_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define QD_HD __host__ __device__ __forceinline__
#define QD_RESTRICT __restrict__
#else
#define QD_HD static inline
#define QD_RESTRICT restrict /* packed bytes never alias the input: lets loops vectorize */
#endif

/* Before a loop that a kernel runs a few times a block: on the GPU it stays a loop (one copy of
 * its body, not one per pass), so the code each warp walks through once a block is smaller and
 * its warps wait less on fetching instructions (no_instruction was iq2_xxs's largest stall
 * reason in Nsight Compute; the git history of docs/BENCHMARKS.md). An array the loop indexes
 * then lives on the stack: a caller that keeps its own in registers passes a copy
 * (kernels/cuda/iq2.cu). */
#if defined(__CUDA_ARCH__) /* (the device pass alone: the host compiler knows no such pragma) */
#define QD_ROLLED _Pragma("unroll 1")
#else
#define QD_ROLLED
#endif

/* A size checked where a block is declared (ggml-common.h's way), in C and CUDA alike. */
#ifdef __cplusplus
#define QD_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define QD_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* Entry i (0..15) of a table of 16 int8 held as four little-endian words (entry 0 the low byte
 * of w0), sign-extended. On the GPU two byte permutes and a select: nvcc keeps a small local
 * table indexed at run time in local memory and stored all of it before every lookup. */
QD_HD int qd_s8_table16(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int i)
{
#ifdef __CUDA_ARCH__
    const uint32_t lo = __byte_perm(w0, w1, (unsigned)i & 7u), hi = __byte_perm(w2, w3, (unsigned)i & 7u);
    return (int)(int8_t)(i & 8 ? hi : lo);
#else
    const uint32_t w = i < 4 ? w0 : i < 8 ? w1 : i < 12 ? w2 : w3;
    return (int)(int8_t)(uint8_t)(w >> 8 * (i & 3));
#endif
}

QD_HD uint32_t qd_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

QD_HD float qd_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

QD_HD int qd_isfinite(float f) { return (qd_f32_bits(f) & 0x7f800000u) != 0x7f800000u; }
QD_HD int qd_isnan(float f) { return (qd_f32_bits(f) & 0x7fffffffu) > 0x7f800000u; }

/* fmaxf/fminf without the libm call; NaN handling is irrelevant where callers use them
 * (non-finite inputs are rejected or documented per format). */
QD_HD float qd_absf(float f) { return qd_bits_f32(qd_f32_bits(f) & 0x7fffffffu); }

/* Round half to even (torch.round, nearbyint in the default mode). On the host, adding and
 * subtracting 1.5 * 2^23 rounds any |x| < 2^22 to an integer in one vectorizable step; larger
 * magnitudes are already integers. (The sign of a zero result is not kept: callers only
 * compare or convert it.) */
QD_HD float qd_rint(float x)
{
#if defined(__CUDA_ARCH__)
    return rintf(x);
#elif defined(__SSE4_1__)
    return __builtin_rintf(x); /* roundss/vroundps: vectorizes */
#else
    return qd_absf(x) < 4194304.0f ? (x + 12582912.0f) - 12582912.0f : x;
#endif
}

/* ---- IEEE half ---------------------------------------------------------------------------- */

QD_HD float qd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f)
        return qd_bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0)
            return qd_bits_f32(sign);
        /* subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return qd_bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* f32 -> f16, round to nearest even; overflow to inf; NaN stays NaN (quiet). */
QD_HD uint16_t qd_f32_to_f16(float f)
{
    uint32_t u = qd_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* result is subnormal or zero: value / 2^-24 rounded to nearest even */
        if (a < 0x33000000u) /* < 2^-25: rounds to 0 (2^-25 exactly ties to even 0) */
            return (uint16_t)sign;
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (113 - e) - 1 ... chosen so that result = m >> (shift) */
        /* value = m * 2^(e-150); in units of 2^-24: m * 2^(e-126) => shift right by (126 - e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0x0fffu + ((a >> 13) & 1u); /* round mantissa to 10 bits, ties to even */
    return (uint16_t)(sign | (((r >> 13) - (112u << 10)) & 0x7fffu));
}

/* x rounded to f16 and widened back: the result of one torch fp16 tensor op, which computes in
 * f32 and rounds to f16 after each op (round to nearest even, inf beyond 65504, NaN kept). */
QD_HD float qd_f16_round(float x)
{
#if defined(__CUDA_ARCH__)
    return __half2float(__float2half_rn(x));
#elif defined(__FLT16_MAX__) && defined(__F16C__)
    return (float)(_Float16)x; /* vcvtps2ph / vcvtph2ps: vectorizes */
#else
    return qd_f16_to_f32(qd_f32_to_f16(x));
#endif
}

/* f16 for a stored scale: any NaN becomes the one quiet NaN 0x7e00. A NaN scale only comes
 * from NaN/Inf input (allow_nonfinite), and which NaN an invalid operation yields differs
 * between x86 (negative "indefinite") and the GPU (positive canonical): one spelling keeps the
 * backends' bytes equal. */
QD_HD uint16_t qd_f32_to_f16_scale(float f) { return qd_isnan(f) ? (uint16_t)0x7e00 : qd_f32_to_f16(f); }

/* ---- bfloat16 ----------------------------------------------------------------------------- */

QD_HD float qd_bf16_to_f32(uint16_t h) { return qd_bits_f32((uint32_t)h << 16); }

QD_HD uint16_t qd_f32_to_bf16(float f)
{
    uint32_t u = qd_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN, sign kept (as torch) */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ---- small floats (OCP MX elements, e4m3fn scales) ---------------------------------------- */

/* torchao custom_fp_utils._f32_to_floatx_unpacked, for ebits + mbits <= 7 with no specials
 * (e2m1, e2m3, e3m2): round to nearest even, saturate to the largest normal, sign kept
 * (so -0.0 encodes with its sign bit). NaN goes down the "normal" path of that function and
 * gets whatever its bit arithmetic gives; we reproduce it rather than invent a value. */
QD_HD uint8_t qd_f32_to_floatx(float x, int ebits, int mbits)
{
    const int exp_bias = (1 << (ebits - 1)) - 1;
    const uint32_t max_int = (1u << (ebits + mbits)) - 1;
    const uint32_t sign_mask = 1u << (ebits + mbits);
    const uint32_t magic = (1u << (23 - mbits - 1)) - 1;
    /* max_normal = 2^(2^ebits - 1 - bias) * (2^(mbits+1) - 1) / 2^mbits */
    const float max_normal = (float)(1 << ((1 << ebits) - 1 - exp_bias)) *
                             ((float)((1 << (mbits + 1)) - 1) / (float)(1 << mbits));
    const float min_normal = qd_bits_f32((uint32_t)(127 + 1 - exp_bias) << 23);
    const uint32_t denorm_exp = (uint32_t)((127 - exp_bias) + (23 - mbits) + 1);
    const uint32_t denorm_mask_int = denorm_exp << 23;

    /* a NaN is read as the GPU's canonical 0x7fffffff, the NaN every CUDA operation returns and
     * so the one torchao's arithmetic hands this function on the GPU (x86 would hand over other
     * payloads and signs) */
    uint32_t u = qd_isnan(x) ? 0x7fffffffu : qd_f32_bits(x);
    uint32_t sign = u & 0x80000000u;
    float a = qd_bits_f32(u ^ sign);
    /* all three candidates, then a select: branch-free so loops over it vectorize */
    float d = a + qd_bits_f32(denorm_mask_int); /* subnormal: the add rounds (RNE) */
    uint32_t denormal = (qd_f32_bits(d) - denorm_mask_int) & 0xffu;
    uint32_t n = qd_f32_bits(a);
    uint32_t odd = (n >> (23 - mbits)) & 1u;
    uint32_t normal = ((n + ((uint32_t)(exp_bias - 127) << 23) + magic + odd) >> (23 - mbits)) & 0xffu;
    uint32_t code = a >= max_normal ? max_int : (a < min_normal ? denormal : normal);
    return (uint8_t)(code | ((sign >> (31 - ebits - mbits)) & sign_mask));
}

/* torchao custom_fp_utils._floatx_unpacked_to_f32 (exact). */
QD_HD float qd_floatx_to_f32(uint8_t code, int ebits, int mbits)
{
    const int exp_bias = (1 << (ebits - 1)) - 1;
    uint32_t sign = (code >> (ebits + mbits)) & 1u;
    uint32_t e = (code >> mbits) & ((1u << ebits) - 1);
    uint32_t m = code & ((1u << mbits) - 1);
    float v;
    if (e == 0) /* subnormal: m * 2^(1 - bias - mbits), exact */
        v = (float)m * qd_bits_f32((uint32_t)(127 + 1 - exp_bias - mbits) << 23);
    else
        v = qd_bits_f32(((e - exp_bias + 127) << 23) | (m << (23 - mbits)));
    return sign ? -v : v;
}

/* f32 -> fp8 e4m3fn, round to nearest even, saturating at +-448 (torchao clamps to the max
 * before converting); any NaN -> 0x7f (the canonical NaN's code: see qd_f32_to_floatx). */
QD_HD uint8_t qd_f32_to_e4m3(float x)
{
    uint32_t u = qd_f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7f;
    if (a >= 0x43e00000u) /* >= 448 */
        return (uint8_t)(sign | 0x7e);
    if (a < 0x3c800000u) { /* < 2^-6: subnormal steps of 2^-9 */
        /* adding 2^14, whose ulp is 2^-9, rounds to the subnormal step (RNE) */
        float t = qd_bits_f32(a) + 16384.0f;
        return (uint8_t)(sign | (uint8_t)(qd_f32_bits(t) - qd_f32_bits(16384.0f)));
    }
    uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    uint32_t code = (r >> 20) - (120u << 3);
    if (code > 0x7e)
        code = 0x7e;
    return (uint8_t)(sign | code);
}

QD_HD float qd_e4m3_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80) << 24;
    uint32_t e = (c >> 3) & 0xf, m = c & 7;
    if (e == 0xf && m == 7)
        return qd_bits_f32(sign | 0x7fc00000u);
    float v = e == 0 ? (float)m * 0.001953125f /* 2^-9 */
                     : qd_bits_f32(((e + 120) << 23) | (m << 20));
    return sign ? -v : v;
}

/* f32 -> fp8 e5m2, round to nearest even, saturating at +-57344 (torchao clamps first);
 * any NaN -> 0x7f. */
QD_HD uint8_t qd_f32_to_e5m2(float x)
{
    uint32_t u = qd_f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7f;
    if (a >= 0x47600000u) /* >= 57344 */
        return (uint8_t)(sign | 0x7b);
    if (a < 0x38800000u) { /* < 2^-14: steps of 2^-16, ulp of [2^7, 2^8) */
        float t = qd_bits_f32(a) + 128.0f;
        return (uint8_t)(sign | (uint8_t)(qd_f32_bits(t) - qd_f32_bits(128.0f)));
    }
    uint32_t r = a + 0xfffffu + ((a >> 21) & 1u);
    uint32_t code = (r >> 21) - (112u << 2);
    if (code > 0x7b)
        code = 0x7b;
    return (uint8_t)(sign | code);
}

QD_HD float qd_e5m2_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80) << 24;
    uint32_t e = (c >> 2) & 0x1f, m = c & 3;
    if (e == 0x1f)
        return qd_bits_f32(sign | (m ? 0x7fc00000u : 0x7f800000u));
    float v = e == 0 ? (float)m * 1.52587890625e-5f /* 2^-16 */
                     : qd_bits_f32(((e + 112) << 23) | (m << 21));
    return sign ? -v : v;
}

/* ---- E8M0 scales -------------------------------------------------------------------------- */

/* 2^(127 - s) as f32, exact: torchao _e8m0_scale_to_reciprocal_fp32 (254 -> subnormal 2^-127,
 * 255 -> NaN). */
QD_HD float qd_e8m0_reciprocal(uint8_t s)
{
    uint32_t r = (uint8_t)(254 - s);
    if (s == 255)
        return qd_bits_f32(0x7f800001u);
    if (r == 0)
        return qd_bits_f32(0x00400000u);
    return qd_bits_f32(r << 23);
}

/* 2^(s - 127) as f32 (s = 0 gives the subnormal 2^-127); 255 -> NaN. */
QD_HD float qd_e8m0_to_f32(uint8_t s)
{
    if (s == 255)
        return qd_bits_f32(0x7fc00000u);
    if (s == 0)
        return qd_bits_f32(0x00400000u);
    return qd_bits_f32((uint32_t)s << 23);
}

/* OCP floor rule (torchao FLOOR): exponent of amax minus the element's emax, clamped to
 * [-127, 128], biased; non-finite amax -> 0xff. */
QD_HD uint8_t qd_e8m0_floor(float amax, int emax_elem)
{
    uint32_t u = qd_f32_bits(amax);
    if ((u & 0x7f800000u) == 0x7f800000u)
        return 0xff;
    int e = (int)((u >> 23) & 0xff) - 127 - emax_elem;
    if (e < -127)
        e = -127;
    if (e > 128)
        e = 128;
    return (uint8_t)(e + 127);
}

/* torchao _f32_to_e8m0_rceil: the smallest power of two >= v (v >= 0), NaN/Inf -> 0xff. */
QD_HD uint8_t qd_e8m0_rceil(float v)
{
    uint32_t u = qd_f32_bits(v);
    if ((u & 0x7f800000u) == 0x7f800000u)
        return 0xff;
    uint32_t e = (u >> 23) & 0xff, m = u & 0x7fffffu;
    uint32_t up = e == 0 ? (m > 0x400000u) : (m != 0);
    return (uint8_t)(e + up);
}

/* ---- tensor-core scale layout (cuBLAS block scaling factors; torchao to_blocked) ----------- */

/* Byte offset of scale (r, c) in the swizzled layout of a [rows, cols] scale matrix:
 * 128x4 tiles in row-major tile order, each tile 512 bytes with (r%32)*16 + (r/32)*4 + c. */
QD_HD int64_t qd_swizzle_offset(int64_t r, int64_t c, int64_t cols)
{
    int64_t col_tiles = (cols + 3) / 4;
    int64_t tile = (r / 128) * col_tiles + c / 4;
    int64_t rr = r % 128, cc = c % 4;
    return tile * 512 + (rr % 32) * 16 + (rr / 32) * 4 + cc;
}

/* Whether the 128 x 4 tiles of a swizzled scale matrix hold padding (zeros by the layout). */
QD_HD int qd_swizzle_padded(int64_t rows, int64_t scale_cols) { return rows % 128 || scale_cols % 4; }

QD_HD int64_t qd_swizzle_bytes(int64_t rows, int64_t cols)
{
    return ((rows + 127) / 128) * 128 * ((cols + 3) / 4) * 4;
}

#endif
