/* Self-check of convert.cuh and of common.cuh's f16/bf16 packers: every f32 bit pattern (or
 * fp8 code pair) through the device conversions against the software ones of fp.h (run by
 * tests/gpu/test_gpu.c). Each check is a functor: differs(u, lut) says whether input u gives
 * different bits; one sweep kernel counts them and keeps the lowest. */
#include "common.cuh"
#include "convert.cuh"
#include "../mx.h"

/* a: the pattern itself; b: a scrambled partner for the pair conversions */
__device__ __forceinline__ float pattern(uint64_t u) { return qd_bits_f32((uint32_t)u); }
__device__ __forceinline__ float partner(uint64_t u) { return qd_bits_f32((uint32_t)(u * 2654435761u)); }

template <int ELEM> struct encode_check { /* elem 0-4: MX element encoders */
    __device__ bool operator()(uint64_t u, const float2 *) const
    {
        float a = pattern(u), b = partner(u);
        return qd_mx_encode2<ELEM>(a, b) != (qd_mx_encode(ELEM, a) | (uint32_t)qd_mx_encode(ELEM, b) << 8);
    }
};

template <int DT> struct pack_check { /* elem 5, 6: bf16 / f16 output pairs */
    __device__ bool operator()(uint64_t u, const float2 *) const
    {
        float a = pattern(u), b = partner(u);
        uint32_t want = DT == QD_F16 ? (qd_f32_to_f16(a) | (uint32_t)qd_f32_to_f16(b) << 16)
                                     : (qd_f32_to_bf16(a) | (uint32_t)qd_f32_to_bf16(b) << 16);
        return qd_pack2<DT>(a, b) != want;
    }
};

template <int NF4> struct bnb_check { /* elem 7, 8: NF4 / FP4 codes by table, on its domain */
    __device__ bool operator()(uint64_t u, const float2 *lut) const
    {
        float p = qd_ftz(pattern(u)); /* the kernels' scaled values are flushed */
        if (!(p >= QD_BNB_LUT_LO && p < QD_BNB_LUT_HI))
            return false;
        return qd_bnb_code_lut<NF4>(p, lut) != qd_bnb_ref(NF4, p);
    }
};

template <int ELEM> struct decode_check { /* elem 9, 10: fp8 pair decoding (2^16 pairs, repeated) */
    __device__ bool operator()(uint64_t u, const float2 *) const
    {
        float a, b;
        qd_fp8x2_decode<ELEM>((uint32_t)u & 0xffffu, &a, &b);
        return qd_f32_bits(a) != qd_f32_bits(qd_mx_decode(ELEM, (uint8_t)u)) ||
               qd_f32_bits(b) != qd_f32_bits(qd_mx_decode(ELEM, (uint8_t)(u >> 8)));
    }
};

struct quotient_check { /* elem 11: qd_quotient against the division, every f32 w x a scrambled s */
    __device__ bool operator()(uint64_t u, const float2 *) const
    {
        float w = pattern(u);
        uint32_t h = (uint32_t)u * 2654435761u ^ (uint32_t)u >> 13;
        float s = qd_bits_f32((uint32_t)(107 + h % 41) << 23 | (h >> 5 & 0x7fffffu)); /* 2^-20 .. 2^20 */
        float want = w / s, a = qd_absf(want);
        if (!(a >= 0x1p-100f && a <= 0x1p100f && qd_absf(w) >= 0x1p-90f))
            return false;
        return qd_f32_bits(qd_quotient(w, s, __frcp_rn(s))) != qd_f32_bits(want);
    }
};

/* elem 12, 13: qd_quotient_short against the division, every pair of bf16 / f16 values w, s
 * with s in 2^-20 .. 2^20 (the fp8 kernels' fast scales) and |w / s| within the kernels' range
 * (at most 2^100; at least 2^-140 unless w is a zero: fp8_all_plain): equal bits for |w| >=
 * 2^-90 and a normal quotient, +0 for a zero w; below that (an f32 residual that underflows)
 * the sign and a magnitude below 2^-10, which code +-0 as the quotient does */
template <int DT> struct short_quotient_check {
    __device__ bool operator()(uint64_t u, const float2 *) const
    {
        const float w = qd_half_f32<DT>((uint32_t)u, 0), s = qd_half_f32<DT>((uint32_t)u, 1);
        if (!(s >= 0x1p-20f && s <= 0x1p20f) || !qd_isfinite(w))
            return false;
        const double a = fabs((double)w / (double)s);
        if (a > 0x1p100 || (w != 0.0f && a < 0x1p-140))
            return false;
        const float q = qd_quotient_short(w, s, __frcp_rn(s)), want = w / s + 0.0f;
        if ((qd_absf(w) >= 0x1p-90f && qd_absf(want) >= 0x1p-126f) || w == 0.0f)
            return qd_f32_bits(q) != qd_f32_bits(want);
        return (qd_f32_bits(q) ^ qd_f32_bits(want)) >> 31 || !(qd_absf(q) < 0x1p-10f);
    }
};

template <class Check>
__global__ void sweep_kernel(int nf4_lut, Check differs, unsigned long long *mismatches, unsigned long long *first)
{
    __shared__ float2 lut[QD_BNB_LUT];
    qd_bnb_lut_init(nf4_lut, lut);
    __syncthreads();
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < (1ull << 32);
         u += (uint64_t)gridDim.x * blockDim.x)
        if (differs(u, lut)) {
            atomicAdd(mismatches, 1ull);
            atomicMin(first, (unsigned long long)u);
        }
}

template <class Check> static void sweep(int nf4_lut, unsigned long long *d)
{
    sweep_kernel<<<4096, 256>>>(nf4_lut, Check(), d, d + 1);
}

extern "C" int qd_cuda_dq_sweep(unsigned long long *d); /* dynamic_code.cu */

extern "C" long long qd_cuda_conversion_mismatches(int elem, uint32_t *first_bad)
{
    unsigned long long *d, h[2] = {0, ~0ull};
    if (cudaMalloc(&d, sizeof h) != cudaSuccess)
        return -1;
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    switch (elem) {
    case QD_E2M1: sweep<encode_check<QD_E2M1>>(0, d); break;
    case QD_E2M3: sweep<encode_check<QD_E2M3>>(0, d); break;
    case QD_E3M2: sweep<encode_check<QD_E3M2>>(0, d); break;
    case QD_E4M3: sweep<encode_check<QD_E4M3>>(0, d); break;
    case QD_E5M2: sweep<encode_check<QD_E5M2>>(0, d); break;
    case 5: sweep<pack_check<QD_BF16>>(0, d); break;
    case 6: sweep<pack_check<QD_F16>>(0, d); break;
    case 7: sweep<bnb_check<1>>(1, d); break;
    case 8: sweep<bnb_check<0>>(0, d); break;
    case 9: sweep<decode_check<QD_E4M3>>(0, d); break;
    case 10: sweep<decode_check<QD_E5M2>>(0, d); break;
    case 11: sweep<quotient_check>(0, d); break;
    case 12: sweep<short_quotient_check<QD_BF16>>(0, d); break;
    case 13: sweep<short_quotient_check<QD_F16>>(0, d); break;
    default:
        if (qd_cuda_dq_sweep(d) != 0) {
            cudaFree(d);
            return -1;
        }
        break;
    }
    cudaError_t e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess)
        return -1;
    *first_bad = (uint32_t)h[1];
    return (long long)h[0];
}
