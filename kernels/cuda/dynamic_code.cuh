/* The 8-bit dynamic map's code (qd_dynamic_code: bitsandbytes' binary search over 256 sorted
 * values) by one table load instead of seven dependent steps. The finite floats of magnitude in
 * [2^-24, 2) fall into 2 x 25 x 64 buckets (sign, binade, top six mantissa bits); over each the
 * code is lo below a threshold and hi from it on, found once per device by bisection on the
 * reference search itself (kernels/cuda/dynamic_code.cu). A bucket where the code changes more
 * than once, and every value outside the buckets (zero, tiny, |x| >= 2, NaN), takes the search.
 * test_gpu compares the two on all 2^32 f32 inputs. */
#ifndef QD_CUDA_DYNAMIC_CODE_CUH
#define QD_CUDA_DYNAMIC_CODE_CUH

#include "../bnb4.h"
#include "common.cuh"

#define QD_DQ_BINADES 25 /* [2^-24, 2^1) */
#define QD_DQ_BUCKETS (2 * QD_DQ_BINADES * 64)

/* Bucket entry: x = threshold (f32 bits), y = lo | hi << 8 | 0x10000 when the bucket is usable. */
__device__ __forceinline__ int qd_dq_bucket(float x)
{
    uint32_t u = qd_f32_bits(x), a = u & 0x7fffffffu;
    int e = (int)(a >> 23) - (127 - 24);
    return (unsigned)e < QD_DQ_BINADES ? ((int)(u >> 31) * QD_DQ_BINADES + e) * 64 + (int)((a >> 17) & 63) : -1;
}

/* map: the dynamic map (shared or constant memory); table: qd_cuda_dq_table's (NULL: the search only) */
__device__ __forceinline__ uint8_t qd_dq_code(float x, const float *map, const uint2 *table)
{
    int b = table ? qd_dq_bucket(x) : -1;
    if (b >= 0) {
        uint2 t = __ldg(&table[b]);
        if (t.y & 0x10000u)
            return (uint8_t)(x >= qd_bits_f32(t.x) ? t.y >> 8 : t.y);
    }
    return qd_dynamic_code(map, x);
}

/* The device's table, built on first use (a one-time kernel, synchronized); NULL on failure. */
const uint2 *qd_cuda_dq_table(void);

#endif
