/* bitsandbytes 4-bit codecs (NF4, FP4) and the 8-bit dynamic map used by double quantization,
 * shared by the CPU and CUDA backends. Each mirrors a device function of bitsandbytes 0.50
 * csrc/kernels.cu, named beside it; the thresholds are that file's f32 literals. */
#ifndef QD_BNB4_H
#define QD_BNB4_H

#include <math.h>

#include "fp.h"

/* bitsandbytes is built with --use_fast_math, so its f32 arithmetic flushes subnormals to zero
 * and its `1.0f / absmax` is the GPU's approximate reciprocal (MUFU.RCP). quantd reproduces
 * both: the bytes users load are those of bitsandbytes' CUDA kernels. */
QD_HD float qd_ftz(float x)
{
    uint32_t u = qd_f32_bits(x);
    return (u & 0x7f800000u) ? x : qd_bits_f32(u & 0x80000000u);
}

#ifndef __CUDA_ARCH__
/* Per 23-bit mantissa m, 2 bits: the approximate reciprocal of 1.m minus the correctly rounded
 * one, in ulps, plus 1. Measured exhaustively on an H100 (tests/fixtures/probe_rcp.cu). */
extern const uint8_t qd_rcp_approx_delta[1 << 21];
#endif

/* rcp.approx.ftz.f32: the result's mantissa depends on x's mantissa only; its exponent is
 * x's negated; subnormal inputs count as zero and subnormal results flush to zero. */
QD_HD float qd_rcp_approx(float x)
{
#ifdef __CUDA_ARCH__
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    uint32_t u = qd_f32_bits(x), sign = u & 0x80000000u, e = (u >> 23) & 0xff, m = u & 0x7fffffu;
    if (e == 0)
        return qd_bits_f32(sign | 0x7f800000u);
    if (e == 0xff)
        return m ? x : qd_bits_f32(sign);
    float r0 = 1.0f / qd_bits_f32(0x3f800000u | m); /* in (0.5, 1] */
    int d = (int)((qd_rcp_approx_delta[m >> 2] >> ((m & 3) * 2)) & 3) - 1;
    uint32_t a = qd_f32_bits(r0) + (uint32_t)d;
    int field = (int)((a >> 23) & 0xff) - ((int)e - 127);
    if (field < 1)
        return qd_bits_f32(sign);
    return qd_bits_f32(sign | (uint32_t)field << 23 | (a & 0x7fffffu));
#endif
}

/* ---- the double-quant offset: an exact, order-free mean ---------------------------------------
 * offset = mean(absmax). Summed in a fixed order in double it would depend on that order (and
 * the GPU sums in parallel), so quantd sums exactly: each absmax m * 2^(e-150) adds its 24-bit
 * mantissa into a 64-bit bin per exponent (no overflow below 2^40 blocks); the bins are then
 * totalled into a wide integer and rounded once to double (nearest even); offset =
 * (float)(total / nblocks). Bin 255 holds flags: 1 = an infinite absmax, 2 = a NaN one. */
#define QD_SUM_BINS 256

QD_HD void qd_sum_bin(float v, uint32_t *bin, uint64_t *add)
{
    uint32_t u = qd_f32_bits(v) & 0x7fffffffu, e = u >> 23, m = u & 0x7fffffu;
    if (e == 255) {
        *bin = 255;
        *add = m ? 2 : 1;
        return;
    }
    *bin = e ? e : 1; /* subnormals: field 1 without the hidden bit */
    *add = e ? (m | 0x800000u) : m;
}

/* The total is a wide integer in units of 2^-149 held in QD_SUM_LIMBS 32-bit limbs; bin e
 * (mantissas of weight 2^(e-1)) adds to limbs (e-1)/32 .. +2. Its share of limb k: */
#define QD_SUM_LIMBS 12
QD_HD uint32_t qd_sum_piece(uint64_t v, int e, int k)
{
    int sh = e - 1, bo = sh % 32, d = k - sh / 32;
    if (d == 0)
        return (uint32_t)(v << bo);
    if (d == 1)
        return (uint32_t)(bo ? v >> (32 - bo) : v >> 32);
    if (d == 2)
        return (uint32_t)(bo ? v >> (64 - bo) : 0);
    return 0;
}

QD_HD int qd_clz32(uint32_t x)
{
#ifdef __CUDA_ARCH__
    return __clz(x);
#else
    return __builtin_clz(x);
#endif
}

/* From the per-limb sums of pieces (each below 2^40, carries not yet taken) and the flags of
 * bin 255 to the total rounded once to double (nearest even). */
QD_HD double qd_sum_finish(uint64_t flags, const uint64_t *column)
{
    if (flags & 2)
        return (double)qd_bits_f32(0x7fc00000u);
    if (flags & 1)
        return (double)qd_bits_f32(0x7f800000u);
    uint32_t limb[QD_SUM_LIMBS];
    uint64_t carry = 0;
    for (int k = 0; k < QD_SUM_LIMBS; k++) { /* the total stays below 2^320: no carry out */
        uint64_t t = column[k] + carry;
        limb[k] = (uint32_t)t;
        carry = t >> 32;
    }
    int top = -1; /* highest set bit */
    for (int k = QD_SUM_LIMBS - 1; k >= 0 && top < 0; k--)
        if (limb[k])
            top = 32 * k + 31 - qd_clz32(limb[k]);
    if (top < 0)
        return 0.0;
    int low = top - 52 > 0 ? top - 52 : 0; /* the 53 bits kept: [low, top] */
    /* bits [low, low + 64) as one word, from the three limbs that hold them */
    int w = low / 32, b = low % 32;
    uint64_t mant = (uint64_t)limb[w] | (w + 1 < QD_SUM_LIMBS ? (uint64_t)limb[w + 1] << 32 : 0);
    mant >>= b;
    if (b && w + 2 < QD_SUM_LIMBS)
        mant |= (uint64_t)limb[w + 2] << (64 - b);
    mant &= (top - low == 63) ? ~0ull : ((1ull << (top - low + 1)) - 1);
    if (low > 0) { /* round to nearest even on bit low - 1 and the sticky bits below it */
        int rb = low - 1;
        uint32_t round = (limb[rb / 32] >> (rb % 32)) & 1u, sticky = limb[rb / 32] & ((1u << (rb % 32)) - 1u);
        for (int k = 0; k < rb / 32; k++)
            sticky |= limb[k];
        if (round && (sticky || (mant & 1)))
            mant++;
    }
    return ldexp((double)mant, low - 149); /* exact: mant <= 2^53, the result a normal double */
}

static inline double qd_sum_bins_total(const uint64_t *bins)
{
    uint64_t column[QD_SUM_LIMBS] = {0};
    for (int e = 1; e < 255; e++)
        if (bins[e])
            for (int d = 0; d < 3 && (e - 1) / 32 + d < QD_SUM_LIMBS; d++)
                column[(e - 1) / 32 + d] += qd_sum_piece(bins[e], e, (e - 1) / 32 + d);
    return qd_sum_finish(bins[255], column);
}

/* dQuantizeNF4 is a decision tree over the 15 midpoints between neighbouring NF4 values (its
 * f32 literals, below in ascending order) with `x > threshold` at every node; for sorted
 * thresholds that tree returns the number of thresholds x exceeds, which is what this computes
 * without branches. NaN exceeds none: code 0, as in the tree. */
#define QD_NF4_THRESHOLDS                                                                        \
    {-0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,  \
     -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f,                     \
     0.03979014977812767f, 0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f,       \
     0.3893125355243683f, 0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f}

QD_HD uint8_t qd_nf4_code(float x)
{
    const float t[15] = QD_NF4_THRESHOLDS;
    int c = 0;
    for (int i = 0; i < 15; i++)
        c += x > t[i];
    return (uint8_t)c;
}

/* dQuantizeFP4: sign bit 0b1000 only for x < 0 (so -0.0 and NaN get 0); the magnitude tree's
 * pivots (FP4 midpoints / 12) in ascending order select codes 0,1,6,7,4,5,2,3 (the FP4 value
 * order 0, 0.0625, 2, 3, 4, 6, 8, 12 in bitsandbytes' encoding). */
#define QD_FP4_THRESHOLDS                                                                        \
    {0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f, 0.4166667f, 0.583333f, 0.8333333f}

QD_HD uint8_t qd_fp4_code(float x)
{
    const float t[7] = QD_FP4_THRESHOLDS;
    float a = qd_absf(x);
    int c = 0;
    for (int i = 0; i < 7; i++)
        c += a > t[i];
    /* code_of_rank {0, 1, 6, 7, 4, 5, 2, 3} as nibbles (no array: registers on the GPU) */
    return (uint8_t)(((0x32547610u >> (4 * c)) & 15) | (x < 0 ? 8 : 0));
}

/* nf4_dequantization_lut */
#define QD_NF4_VALUES                                                                            \
    {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,                   \
     -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,                 \
     0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,    \
     0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f}

/* fp4_dequantization_lut (low 3 bits); dDequantizeFP4Tree multiplies by -1 for the sign bit. */
#define QD_FP4_MAGNITUDES                                                                        \
    {0.0f, 0.005208333333f, 0.66666667f, 1.0f, 0.33333333f, 0.5f, 0.16666667f, 0.25f}

/* bitsandbytes functional.get_4bit_type("fp4") before its division by the max (12): the
 * quant_map component is these divided by 12 in f32, as torch does. */
#define QD_FP4_TYPE_VALUES                                                                       \
    {0.0f, 0.0625f, 8.0f, 12.0f, 4.0f, 6.0f, 2.0f, 3.0f, 0.0f, -0.0625f, -8.0f, -12.0f, -4.0f,   \
     -6.0f, -2.0f, -3.0f}

/* create_dynamic_map(signed=True): the 256 sorted f32 values bitsandbytes 0.50.2 builds with
 * torch.linspace; copied from its output (tests/fixtures/bnb, nested_quant_map.bin) rather than
 * recomputed, because torch's vectorized linspace rounds differently per CPU vector width. */
#define QD_DYNAMIC_MAP {                                                                         \
    -0x1.fc66660000000p-1f, -0x1.f533340000000p-1f, -0x1.ee00000000000p-1f, -0x1.e6cccc0000000p-1f, \
    -0x1.df999a0000000p-1f, -0x1.d866660000000p-1f, -0x1.d133340000000p-1f, -0x1.ca00000000000p-1f, \
    -0x1.c2cccc0000000p-1f, -0x1.bb999a0000000p-1f, -0x1.b466660000000p-1f, -0x1.ad33340000000p-1f, \
    -0x1.a600000000000p-1f, -0x1.9ecccc0000000p-1f, -0x1.97999a0000000p-1f, -0x1.9066660000000p-1f, \
    -0x1.8933340000000p-1f, -0x1.8200000000000p-1f, -0x1.7acccc0000000p-1f, -0x1.73999a0000000p-1f, \
    -0x1.6c66680000000p-1f, -0x1.6533340000000p-1f, -0x1.5e00000000000p-1f, -0x1.56cccc0000000p-1f, \
    -0x1.4f999a0000000p-1f, -0x1.4866680000000p-1f, -0x1.4133340000000p-1f, -0x1.3a00000000000p-1f, \
    -0x1.32cccc0000000p-1f, -0x1.2b999a0000000p-1f, -0x1.2466680000000p-1f, -0x1.1d33340000000p-1f, \
    -0x1.1600000000000p-1f, -0x1.0ecccc0000000p-1f, -0x1.0799980000000p-1f, -0x1.0066660000000p-1f, \
    -0x1.f266640000000p-2f, -0x1.e400000000000p-2f, -0x1.d599980000000p-2f, -0x1.c733340000000p-2f, \
    -0x1.b8cccc0000000p-2f, -0x1.aa66660000000p-2f, -0x1.9c00000000000p-2f, -0x1.8d99980000000p-2f, \
    -0x1.7f33340000000p-2f, -0x1.70cccc0000000p-2f, -0x1.6266660000000p-2f, -0x1.5400000000000p-2f, \
    -0x1.4599980000000p-2f, -0x1.3733340000000p-2f, -0x1.28cccc0000000p-2f, -0x1.1a66680000000p-2f, \
    -0x1.0c00000000000p-2f, -0x1.fb33320000000p-3f, -0x1.de66660000000p-3f, -0x1.c1999a0000000p-3f, \
    -0x1.a4cccc0000000p-3f, -0x1.8800000000000p-3f, -0x1.6b33340000000p-3f, -0x1.4e66660000000p-3f, \
    -0x1.31999a0000000p-3f, -0x1.14cccc0000000p-3f, -0x1.f000000000000p-4f, -0x1.b666680000000p-4f, \
    -0x1.93d70a0000000p-4f, -0x1.8851ee0000000p-4f, -0x1.7cccce0000000p-4f, -0x1.7147ae0000000p-4f, \
    -0x1.65c2900000000p-4f, -0x1.5a3d700000000p-4f, -0x1.4eb8540000000p-4f, -0x1.4333340000000p-4f, \
    -0x1.37ae140000000p-4f, -0x1.2c28f60000000p-4f, -0x1.20a3d60000000p-4f, -0x1.151eba0000000p-4f, \
    -0x1.09999a0000000p-4f, -0x1.fc28f60000000p-5f, -0x1.e51eba0000000p-5f, -0x1.ce147a0000000p-5f, \
    -0x1.b70a3e0000000p-5f, -0x1.a000000000000p-5f, -0x1.88f5c20000000p-5f, -0x1.71eb860000000p-5f, \
    -0x1.5ae1460000000p-5f, -0x1.43d70a0000000p-5f, -0x1.2cccce0000000p-5f, -0x1.15c2900000000p-5f, \
    -0x1.fd70a40000000p-6f, -0x1.cf5c2a0000000p-6f, -0x1.a147ae0000000p-6f, -0x1.7333340000000p-6f, \
    -0x1.451eba0000000p-6f, -0x1.170a3e0000000p-6f, -0x1.d1eb860000000p-7f, -0x1.75c2900000000p-7f, \
    -0x1.3e76c80000000p-7f, -0x1.2c08300000000p-7f, -0x1.19999a0000000p-7f, -0x1.072b020000000p-7f, \
    -0x1.e978d40000000p-8f, -0x1.c49ba60000000p-8f, -0x1.9fbe760000000p-8f, -0x1.7ae1480000000p-8f, \
    -0x1.56041a0000000p-8f, -0x1.3126e80000000p-8f, -0x1.0c49ba0000000p-8f, -0x1.ced9140000000p-9f, \
    -0x1.851eb80000000p-9f, -0x1.3b645a0000000p-9f, -0x1.e353f80000000p-10f, -0x1.4fdf3a0000000p-10f, \
    -0x1.eecbfe0000000p-11f, -0x1.b3d07c0000000p-11f, -0x1.78d5000000000p-11f, -0x1.3dd9820000000p-11f, \
    -0x1.02de020000000p-11f, -0x1.8fc5060000000p-12f, -0x1.19ce0a0000000p-12f, -0x1.47ae160000000p-13f, \
    -0x1.743e960000000p-14f, -0x1.15df660000000p-14f, -0x1.6f00680000000p-15f, -0x1.64840c0000000p-16f, \
    -0x1.040bfe0000000p-17f, -0x1.b435280000000p-19f, -0x1.27476e0000000p-21f, 0x0.0p+0f, \
    0x1.27476e0000000p-21f, 0x1.b435280000000p-19f, 0x1.040bfe0000000p-17f, 0x1.64840c0000000p-16f, \
    0x1.6f00680000000p-15f, 0x1.15df660000000p-14f, 0x1.743e960000000p-14f, 0x1.47ae160000000p-13f, \
    0x1.19ce0a0000000p-12f, 0x1.8fc5060000000p-12f, 0x1.02de020000000p-11f, 0x1.3dd9820000000p-11f, \
    0x1.78d5000000000p-11f, 0x1.b3d07c0000000p-11f, 0x1.eecbfe0000000p-11f, 0x1.4fdf3a0000000p-10f, \
    0x1.e353f80000000p-10f, 0x1.3b645a0000000p-9f, 0x1.851eb80000000p-9f, 0x1.ced9140000000p-9f, \
    0x1.0c49ba0000000p-8f, 0x1.3126e80000000p-8f, 0x1.56041a0000000p-8f, 0x1.7ae1480000000p-8f, \
    0x1.9fbe760000000p-8f, 0x1.c49ba60000000p-8f, 0x1.e978d40000000p-8f, 0x1.072b020000000p-7f, \
    0x1.19999a0000000p-7f, 0x1.2c08300000000p-7f, 0x1.3e76c80000000p-7f, 0x1.75c2900000000p-7f, \
    0x1.d1eb860000000p-7f, 0x1.170a3e0000000p-6f, 0x1.451eba0000000p-6f, 0x1.7333340000000p-6f, \
    0x1.a147ae0000000p-6f, 0x1.cf5c2a0000000p-6f, 0x1.fd70a40000000p-6f, 0x1.15c2900000000p-5f, \
    0x1.2cccce0000000p-5f, 0x1.43d70a0000000p-5f, 0x1.5ae1460000000p-5f, 0x1.71eb860000000p-5f, \
    0x1.88f5c20000000p-5f, 0x1.a000000000000p-5f, 0x1.b70a3e0000000p-5f, 0x1.ce147a0000000p-5f, \
    0x1.e51eba0000000p-5f, 0x1.fc28f60000000p-5f, 0x1.09999a0000000p-4f, 0x1.151eba0000000p-4f, \
    0x1.20a3d60000000p-4f, 0x1.2c28f60000000p-4f, 0x1.37ae140000000p-4f, 0x1.4333340000000p-4f, \
    0x1.4eb8540000000p-4f, 0x1.5a3d700000000p-4f, 0x1.65c2900000000p-4f, 0x1.7147ae0000000p-4f, \
    0x1.7cccce0000000p-4f, 0x1.8851ee0000000p-4f, 0x1.93d70a0000000p-4f, 0x1.b666680000000p-4f, \
    0x1.f000000000000p-4f, 0x1.14cccc0000000p-3f, 0x1.31999a0000000p-3f, 0x1.4e66660000000p-3f, \
    0x1.6b33340000000p-3f, 0x1.8800000000000p-3f, 0x1.a4cccc0000000p-3f, 0x1.c1999a0000000p-3f, \
    0x1.de66660000000p-3f, 0x1.fb33320000000p-3f, 0x1.0c00000000000p-2f, 0x1.1a66680000000p-2f, \
    0x1.28cccc0000000p-2f, 0x1.3733340000000p-2f, 0x1.4599980000000p-2f, 0x1.5400000000000p-2f, \
    0x1.6266660000000p-2f, 0x1.70cccc0000000p-2f, 0x1.7f33340000000p-2f, 0x1.8d99980000000p-2f, \
    0x1.9c00000000000p-2f, 0x1.aa66660000000p-2f, 0x1.b8cccc0000000p-2f, 0x1.c733340000000p-2f, \
    0x1.d599980000000p-2f, 0x1.e400000000000p-2f, 0x1.f266640000000p-2f, 0x1.0066660000000p-1f, \
    0x1.0799980000000p-1f, 0x1.0ecccc0000000p-1f, 0x1.1600000000000p-1f, 0x1.1d33340000000p-1f, \
    0x1.2466680000000p-1f, 0x1.2b999a0000000p-1f, 0x1.32cccc0000000p-1f, 0x1.3a00000000000p-1f, \
    0x1.4133340000000p-1f, 0x1.4866680000000p-1f, 0x1.4f999a0000000p-1f, 0x1.56cccc0000000p-1f, \
    0x1.5e00000000000p-1f, 0x1.6533340000000p-1f, 0x1.6c66680000000p-1f, 0x1.73999a0000000p-1f, \
    0x1.7acccc0000000p-1f, 0x1.8200000000000p-1f, 0x1.8933340000000p-1f, 0x1.9066660000000p-1f, \
    0x1.97999a0000000p-1f, 0x1.9ecccc0000000p-1f, 0x1.a600000000000p-1f, 0x1.ad33340000000p-1f, \
    0x1.b466660000000p-1f, 0x1.bb999a0000000p-1f, 0x1.c2cccc0000000p-1f, 0x1.ca00000000000p-1f, \
    0x1.d133340000000p-1f, 0x1.d866660000000p-1f, 0x1.df999a0000000p-1f, 0x1.e6cccc0000000p-1f, \
    0x1.ee00000000000p-1f, 0x1.f533340000000p-1f, 0x1.fc66660000000p-1f, 0x1.0000000000000p+0f, \
    }

/* dQuantize<0>: binary search of the sorted 256-entry map, then the nearer neighbour by
 * midpoint (ties go towards the pivot). Kept literally: its edge handling decides codes at the
 * ends of the map and for NaN (code 0). */
QD_HD uint8_t qd_dynamic_code(const float *map, float x)
{
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = -1.0f, upper = 1.0f;
    float val = map[pivot];
    for (int i = 64; i > 0; i >>= 1) {
        if (x > val) {
            lower_pivot = pivot;
            lower = val;
            pivot += i;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= i;
        }
        val = map[pivot];
    }
    if (upper_pivot == 255)
        upper = map[upper_pivot];
    if (lower_pivot == 0)
        lower = map[lower_pivot];
    if (x > val) {
        float mid = (upper + val) * 0.5f;
        return (uint8_t)(x > mid ? upper_pivot : pivot);
    }
    float mid = (lower + val) * 0.5f;
    return (uint8_t)(x < mid ? lower_pivot : pivot);
}

#endif
