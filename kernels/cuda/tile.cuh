/* CTA tiles: a CTA of threads owns a contiguous run of quantization blocks, one per thread.
 * What each thread produces (packed bytes, or dequantized elements) is staged in shared memory
 * and moved to global memory by the whole CTA with 16-byte coalesced accesses, instead of each
 * thread storing its 8-64 bytes at a stride. Packed inputs come in the same way. */
#ifndef QD_CUDA_TILE_CUH
#define QD_CUDA_TILE_CUH

#include "common.cuh"

/* Copies n bytes with the whole CTA: 16-byte accesses when both ends are 16-byte aligned,
 * 4-byte ones when 4-byte aligned, bytes otherwise (GGML's 18-36 byte blocks). */
__device__ __forceinline__ void cta_copy(uint8_t *dst, const uint8_t *src, int n)
{
    uintptr_t a = (uintptr_t)dst | (uintptr_t)src;
    int done = 0;
    if ((a & 15) == 0) {
        for (int i = threadIdx.x; i < n / 16; i += blockDim.x)
            ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
        done = n / 16 * 16;
    } else if ((a & 3) == 0) {
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x)
            ((uint32_t *)dst)[i] = ((const uint32_t *)src)[i];
        done = n / 4 * 4;
    }
    for (int i = done + threadIdx.x; i < n; i += blockDim.x)
        dst[i] = src[i];
}

/* Element tiles of T threads x N elements of dtype DT, in 16-byte chunks. Thread t's chunk c
 * sits at chunk t*CH + (c ^ ((t / (8/CH)) % CH)): the XOR keeps the 8 threads of a shared-memory
 * wavefront on distinct banks when each writes its own row, and the CTA's linear copy reads
 * the same places back. */
template <int DT, int N> struct qd_tile {
    static constexpr int esize = DT == QD_F32 ? 4 : 2;
    static constexpr int CH = N * esize / 16; /* chunks per thread, 2..16 */
    static constexpr int per8 = CH >= 8 ? 1 : 8 / CH;
    static __device__ __forceinline__ int slot(int t, int c) { return t * CH + (c ^ ((t / per8) % CH)); }
};

/* Converts the thread's N values to DT and writes them as its row of the tile. */
template <int DT, int N> __device__ __forceinline__ void tile_put(uint4 *tile, const float *v)
{
    using T = qd_tile<DT, N>;
#pragma unroll
    for (int c = 0; c < T::CH; c++)
        tile[T::slot(threadIdx.x, c)] = qd_pack_chunk<DT>(v, c);
}

/* After a __syncthreads: writes the first `rows` threads' rows to y (16-byte aligned), coalesced. */
template <int DT, int N> __device__ __forceinline__ void tile_store(const uint4 *tile, void *y, int rows)
{
    using T = qd_tile<DT, N>;
    uint4 *dst = (uint4 *)y;
    for (int k = threadIdx.x; k < rows * T::CH; k += blockDim.x)
        dst[k] = tile[T::slot(k / T::CH, k % T::CH)];
}

#endif
