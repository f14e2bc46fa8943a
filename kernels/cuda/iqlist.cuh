/* The GPU side of kernels/iqlist.h: a list's candidates' codes read four at a time. */
#ifndef QD_CUDA_IQLIST_CUH
#define QD_CUDA_IQLIST_CUH

#include "../iqlist.h"
#include "common.cuh"

static_assert(QD_IQ_LIST_ALIGN == 4, "a load takes a list's codes four at a time");

/* The 4 codes from p into c, one 8-byte load: p is a list's candidate j with j - 1 a multiple
 * of 4 (8-byte aligned where the codes are). Past the list's end it reads the table's next
 * slots, which iqlist.h keeps inside the table. */
__device__ __forceinline__ void qd_iq_code4(const uint16_t *p, unsigned *c)
{
    const uint2 v = __ldg((const uint2 *)p);
    c[0] = v.x & 0xffffu;
    c[1] = v.x >> 16;
    c[2] = v.y & 0xffffu;
    c[3] = v.y >> 16;
}

#endif
