/* The bucket table of dynamic_code.cuh, one per device, and its exhaustive check. */
#include <pthread.h>

#include "dynamic_code.cuh"

__constant__ float dq_map[256] = QD_DYNAMIC_MAP;

/* Buckets in value order: key k >= 0 is the float with bits k, k < 0 the float -bits(-k). */
__device__ __forceinline__ float from_key(int k) { return k >= 0 ? qd_bits_f32((uint32_t)k) : -qd_bits_f32((uint32_t)-k); }

__global__ void dq_build_kernel(uint2 *table)
{
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= QD_DQ_BUCKETS)
        return;
    int neg = b / (QD_DQ_BINADES * 64), e = b / 64 % QD_DQ_BINADES, m = b % 64;
    int a0 = (e + 127 - 24) << 23 | m << 17, a1 = a0 + (1 << 17) - 1; /* magnitudes' bits */
    int lo_key = neg ? -a1 : a0, hi_key = neg ? -a0 : a1;
    int lo = qd_dynamic_code(dq_map, from_key(lo_key)), hi = qd_dynamic_code(dq_map, from_key(hi_key));
    if (lo == hi) { /* no change: the threshold never reached */
        table[b] = make_uint2(0x7f800000u, (uint32_t)lo | (uint32_t)hi << 8 | 0x10000u);
        return;
    }
    /* the first key whose code is hi; usable when the key before it still gives lo (one change) */
    int l = lo_key, h = hi_key;
    while (h - l > 1) {
        int mid = l + (h - l) / 2;
        if (qd_dynamic_code(dq_map, from_key(mid)) >= hi)
            h = mid;
        else
            l = mid;
    }
    int one_change = qd_dynamic_code(dq_map, from_key(l)) == lo;
    table[b] = make_uint2(qd_f32_bits(from_key(h)), (uint32_t)lo | (uint32_t)hi << 8 | (one_change ? 0x10000u : 0u));
}

#define QD_DQ_MAX_DEVICES 64
__device__ uint2 dq_table[QD_DQ_BUCKETS]; /* a module global: one per device, nothing to free */
static uint2 *tables[QD_DQ_MAX_DEVICES];   /* its address on each device, once built */
static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;

const uint2 *qd_cuda_dq_table(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= QD_DQ_MAX_DEVICES)
        return NULL;
    pthread_mutex_lock(&tables_lock);
    uint2 *t = tables[dev];
    cudaStream_t s;
    if (!t && cudaGetSymbolAddress((void **)&t, dq_table) == cudaSuccess &&
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
        /* once per device, on its own stream, finished before anyone reads it */
        dq_build_kernel<<<(QD_DQ_BUCKETS + 127) / 128, 128, 0, s>>>(t);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
        if (e != cudaSuccess)
            qd_cuda_note_error(e, __FILE__, __LINE__);
        tables[dev] = e == cudaSuccess ? t : NULL;
    }
    t = tables[dev];
    pthread_mutex_unlock(&tables_lock);
    return t;
}

/* Self-check: every f32 pattern through the table path against the search (elem 12 of
 * qd_cuda_conversion_mismatches). */
__global__ void dq_sweep_kernel(const uint2 *table, unsigned long long *mismatches, unsigned long long *first)
{
    __shared__ float map[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
        map[i] = dq_map[i];
    __syncthreads();
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < (1ull << 32);
         u += (uint64_t)gridDim.x * blockDim.x) {
        float x = qd_bits_f32((uint32_t)u);
        if (qd_dq_code(x, map, table) != qd_dynamic_code(map, x)) {
            atomicAdd(mismatches, 1ull);
            atomicMin(first, (unsigned long long)u);
        }
    }
}

extern "C" int qd_cuda_dq_sweep(unsigned long long *d)
{
    const uint2 *t = qd_cuda_dq_table();
    if (!t)
        return -1;
    dq_sweep_kernel<<<4096, 256>>>(t, d, d + 1);
    return 0;
}
