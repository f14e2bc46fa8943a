/* Self-check of convert.cuh and of common.cuh's f16/bf16 packers: every f32 bit pattern through
 * the device conversions against the software ones of fp.h (run by tests/gpu/test_gpu.c). */
#include "common.cuh"
#include "convert.cuh"
#include "../mx.h"

template <int ELEM>
__global__ void conversion_check_kernel(unsigned long long *mismatches, unsigned long long *first)
{
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < (1ull << 32);
         u += (uint64_t)gridDim.x * blockDim.x) {
        float a = qd_bits_f32((uint32_t)u), b = qd_bits_f32((uint32_t)(u * 2654435761u));
        uint32_t got = qd_mx_encode2<ELEM>(a, b);
        uint32_t want = qd_mx_encode(ELEM, a) | (uint32_t)qd_mx_encode(ELEM, b) << 8;
        if (got != want) {
            atomicAdd(mismatches, 1ull);
            atomicMin(first, (unsigned long long)u);
        }
    }
}

/* elem 5 / 6: the bf16 / f16 pair packers of common.cuh */
template <int DT>
__global__ void pack_check_kernel(unsigned long long *mismatches, unsigned long long *first)
{
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < (1ull << 32);
         u += (uint64_t)gridDim.x * blockDim.x) {
        float a = qd_bits_f32((uint32_t)u), b = qd_bits_f32((uint32_t)(u * 2654435761u));
        uint32_t got = qd_pack2<DT>(a, b);
        uint32_t want = DT == QD_F16 ? (qd_f32_to_f16(a) | (uint32_t)qd_f32_to_f16(b) << 16)
                                     : (qd_f32_to_bf16(a) | (uint32_t)qd_f32_to_bf16(b) << 16);
        if (got != want) {
            atomicAdd(mismatches, 1ull);
            atomicMin(first, (unsigned long long)u);
        }
    }
}

/* elem 7 / 8: the NF4 / FP4 code searches */
__global__ void bnb_code_check_kernel(int nf4, unsigned long long *mismatches, unsigned long long *first)
{
    __shared__ float2 lut[QD_BNB_LUT];
    qd_bnb_lut_init(nf4, lut);
    __syncthreads();
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < (1ull << 32);
         u += (uint64_t)gridDim.x * blockDim.x) {
        float a = qd_bits_f32((uint32_t)u);
        uint32_t got = nf4 ? qd_nf4_code_lut(a, lut) : qd_fp4_code_lut(a, a < 0.0f, lut);
        uint32_t want = nf4 ? qd_nf4_code(a) : qd_fp4_code(a);
        if (got != want) {
            atomicAdd(mismatches, 1ull);
            atomicMin(first, (unsigned long long)u);
        }
    }
}

/* elem 9 / 10: fp8 pair decoding (every 16-bit pair; the sweep repeats them) */
template <int ELEM>
__global__ void fp8_decode_check_kernel(unsigned long long *mismatches, unsigned long long *first)
{
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < (1ull << 16);
         u += (uint64_t)gridDim.x * blockDim.x) {
        float a, b;
        qd_fp8x2_decode<ELEM>((uint32_t)u, &a, &b);
        float wa = qd_mx_decode(ELEM, (uint8_t)u), wb = qd_mx_decode(ELEM, (uint8_t)(u >> 8));
        if (qd_f32_bits(a) != qd_f32_bits(wa) || qd_f32_bits(b) != qd_f32_bits(wb)) {
            atomicAdd(mismatches, 1ull);
            atomicMin(first, (unsigned long long)u);
        }
    }
}

extern "C" long long qd_cuda_conversion_mismatches(int elem, uint32_t *first_bad)
{
    unsigned long long *d, h[2] = {0, ~0ull};
    if (cudaMalloc(&d, sizeof h) != cudaSuccess)
        return -1;
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    switch (elem) {
    case QD_E2M1: conversion_check_kernel<QD_E2M1><<<4096, 256>>>(d, d + 1); break;
    case QD_E2M3: conversion_check_kernel<QD_E2M3><<<4096, 256>>>(d, d + 1); break;
    case QD_E3M2: conversion_check_kernel<QD_E3M2><<<4096, 256>>>(d, d + 1); break;
    case QD_E4M3: conversion_check_kernel<QD_E4M3><<<4096, 256>>>(d, d + 1); break;
    case 5: pack_check_kernel<QD_BF16><<<4096, 256>>>(d, d + 1); break;
    case 6: pack_check_kernel<QD_F16><<<4096, 256>>>(d, d + 1); break;
    case 7: bnb_code_check_kernel<<<4096, 256>>>(1, d, d + 1); break;
    case 8: bnb_code_check_kernel<<<4096, 256>>>(0, d, d + 1); break;
    case 9: fp8_decode_check_kernel<QD_E4M3><<<256, 256>>>(d, d + 1); break;
    case 10: fp8_decode_check_kernel<QD_E5M2><<<256, 256>>>(d, d + 1); break;
    default: conversion_check_kernel<QD_E5M2><<<4096, 256>>>(d, d + 1); break;
    }
    cudaError_t e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess)
        return -1;
    *first_bad = (uint32_t)h[1];
    return (long long)h[0];
}
