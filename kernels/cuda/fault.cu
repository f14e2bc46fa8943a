/* Real CUDA errors on demand, for the fault-injection build (server/queue/backend_cuda.c with
 * QD_FAULTS): the daemon's error paths are tested against what the runtime really returns, not
 * against a mock. Nothing in a release build calls these. */
#include <cuda_runtime.h>

#include "cuda.h"

static __global__ void qd_fault_nothing(void) {}

static __global__ void qd_fault_trap(void) { __trap(); }

/* A launch the runtime refuses (more threads per block than any device has): the error a bad
 * launch configuration gives, reported at launch and not sticky. */
extern "C" int qd_cuda_fault_launch(void)
{
    qd_fault_nothing<<<1, 4096, 0, (cudaStream_t)qd_cuda_ctx_get()->stream>>>();
    return (int)cudaGetLastError();
}

/* A kernel that traps: the context is lost (cudaErrorLaunchFailure or similar, sticky) and every
 * later call on this device in this process fails, as after a real device fault. */
extern "C" int qd_cuda_fault_trap(void)
{
    cudaStream_t s = (cudaStream_t)qd_cuda_ctx_get()->stream;
    qd_fault_trap<<<1, 1, 0, s>>>();
    cudaError_t e = cudaGetLastError();
    return (int)(e != cudaSuccess ? e : cudaStreamSynchronize(s));
}
