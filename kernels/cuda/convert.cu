/* Self-check of convert.cuh: every f32 bit pattern through the device encoders against the
 * software ones of fp.h (run by tests/gpu/test_gpu.c on the device). */
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
    default: conversion_check_kernel<QD_E5M2><<<4096, 256>>>(d, d + 1); break;
    }
    cudaError_t e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess)
        return -1;
    *first_bad = (uint32_t)h[1];
    return (long long)h[0];
}
