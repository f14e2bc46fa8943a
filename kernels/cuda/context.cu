/* The per-thread CUDA context, error notes, the non-finite flag and whole-tensor ranges. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common.cuh"

static __thread struct qd_cuda_ctx *current;
static __thread char last_error[256];

extern "C" void qd_cuda_ctx_set(struct qd_cuda_ctx *c) { current = c; }
extern "C" struct qd_cuda_ctx *qd_cuda_ctx_get(void) { return current; }
extern "C" const char *qd_cuda_last_error(void) { return last_error; }

void qd_cuda_note_error(cudaError_t e, const char *file, int line)
{
    snprintf(last_error, sizeof last_error, "%s (%s:%d)", cudaGetErrorString(e), file, line);
}

extern "C" enum qd_status qd_cuda_ctx_init(struct qd_cuda_ctx *c)
{
    memset(c, 0, sizeof *c);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    c->stream = s;
    CUDA_CHECK(cudaMalloc(&c->scratch, QD_CUDA_SCRATCH_BYTES));
    c->bins_dirty = 1; /* (cleared by the first nf4/fp4 call's memset) */
    c->bad_dirty = 1;  /* (cleared by the first checked call's memset) */
    CUDA_CHECK(cudaMallocHost(&c->host_scratch, QD_CUDA_SCRATCH_BYTES));
    if (cudaHostGetDevicePointer(&c->host_scratch_dev, c->host_scratch, 0) != cudaSuccess) {
        c->host_scratch_dev = NULL; /* (kernels then leave their results to copies) */
        cudaGetLastError();
    }
    /* stream-ordered temporaries (bnb4's absmax) stay cached in the device's pool across
     * synchronizations instead of going back to the driver each time */
    int dev = 0;
    cudaMemPool_t pool;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep = 256ull << 20;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return QD_OK;
}

extern "C" void qd_cuda_ctx_free(struct qd_cuda_ctx *c)
{
    if (c->stream)
        cudaStreamDestroy((cudaStream_t)c->stream);
    cudaFree(c->scratch);
    cudaFree(c->iq3s_tables);
    cudaFree(c->iqgrid_tables[0]);
    cudaFree(c->iqgrid_tables[1]);
    cudaFreeHost(c->host_scratch);
    memset(c, 0, sizeof *c);
}

enum qd_status qd_cuda_bad_begin(int check, unsigned long long **flag)
{
    *flag = NULL;
    struct qd_cuda_ctx *c = qd_cuda_ctx_get();
    c->bad_index = -1;
    c->pending_bad = 0; /* a call that failed midway leaves nothing for the next one */
    c->pending_offset = 0;
    c->pending_scale = 0;
    if (!check)
        return QD_OK;
    struct qd_scratch *d = qd_scratch_dev();
    if (c->bad_dirty) /* else the last call's publish kernel left it ~0: one launch less */
        CUDA_CHECK(cudaMemsetAsync(&d->bad, 0xff, sizeof d->bad, qd_stream()));
    c->bad_dirty = 1; /* until a publish that resets it is queued */
    *flag = &d->bad;
    return QD_OK;
}

/* The flag and the offset beside it into the host's mapped pinned mirror, once the kernels
 * before are done: a one-thread kernel staged ahead (programmatic dependent launch) costs less
 * than a device-to-host copy after the last kernel. */
__global__ void publish_kernel(struct qd_scratch *d, struct qd_scratch *h)
{
    qd_grid_wait();
    h->bad = *(volatile const unsigned long long *)&d->bad;
    d->bad = ~0ull; /* clean for the next call, which then needs no memset */
    h->offset = *(volatile const float *)&d->offset;
    h->scale = *(volatile const float *)&d->scale;
    __threadfence_system();
}

enum qd_status qd_cuda_bad_end(unsigned long long *flag)
{
    struct qd_cuda_ctx *c = qd_cuda_ctx_get();
    if (!flag && !c->pending_offset && !c->pending_scale)
        return QD_OK;
    struct qd_scratch *h = qd_scratch_host(), *d = qd_scratch_dev();
    if (c->host_scratch_dev) { /* read by qd_cuda_finish once the stream has run */
        CUDA_CHECK(qd_launch_dependent(publish_kernel, 1, 1, d, (struct qd_scratch *)c->host_scratch_dev));
        c->bad_dirty = 0;
    }
    else /* the flag and the device-computed values beside it (struct qd_scratch) in one copy */
        CUDA_CHECK(cudaMemcpyAsync(&h->bad, &d->bad, offsetof(struct qd_scratch, range), cudaMemcpyDeviceToHost, qd_stream()));
    c->pending_bad = flag != NULL;
    return QD_OK;
}

enum qd_status qd_cuda_finish(struct qd_params *p)
{
    struct qd_cuda_ctx *c = qd_cuda_ctx_get();
    if (!c->pending_bad && !c->pending_offset && !c->pending_scale)
        return QD_OK;
    CUDA_CHECK(cudaStreamSynchronize(qd_stream()));
    struct qd_scratch *h = qd_scratch_host();
    int bad = c->pending_bad && h->bad != ~0ull;
    if (c->pending_offset) {
        p->offset = h->offset;
        p->has_offset = 1;
    }
    if (c->pending_scale == 1) { /* torchao: the decode scale and its encode reciprocal */
        p->per_tensor_scale = h->scale;
        p->global_scale = 1.0f / h->scale;
        p->has_per_tensor_scale = p->has_global_scale = 1;
    } else if (c->pending_scale == 2) {
        p->global_scale = h->scale;
        p->has_global_scale = 1;
    }
    c->pending_bad = 0;
    c->pending_offset = 0;
    c->pending_scale = 0;
    if (bad) {
        c->bad_index = (int64_t)h->bad;
        return QD_ENONFINITE;
    }
    return QD_OK;
}

/* The range over the CTA, in thread 0 (sh: one slot per warp). */
__device__ __forceinline__ struct qd_range cta_range(struct qd_range r, struct qd_range *sh)
{
    r = qd_range_warp(r);
    if (threadIdx.x % 32 == 0)
        sh[threadIdx.x / 32] = r;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)blockDim.x / 32; w++)
            qd_range_merge(&r, sh[w]);
    return r;
}

/* Each CTA reduces a grid-stride share of the tensor to (amax, min, max); the last CTA to
 * finish folds the partials. The order of min/max folds does not matter for finite values. */
template <int DT>
__global__ void range_kernel(const void *x, int64_t n, struct qd_scratch *s, unsigned long long *bad)
{
    struct qd_range r = qd_range_empty();
    /* 8 elements per 16-byte-or-two load (unrolled: two in flight per thread); the tail one by one */
    const int64_t groups = n / 8, stride = (int64_t)gridDim.x * blockDim.x;
#pragma unroll 2
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < groups; g += stride) {
        float v[8];
        qd_load_block<DT, 8>(x, 8 * g, v);
        if (bad)
            qd_check_block<8>(bad, v, 8 * g);
        for (int j = 0; j < 8; j++)
            qd_range_add(&r, v[j]);
    }
    for (int64_t i = 8 * groups + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = qd_load<DT>(x, i);
        qd_note_nonfinite(bad, v, i);
        qd_range_add(&r, v);
    }
    __shared__ struct qd_range sh[32];
    __shared__ bool last;
    r = cta_range(r, sh);
    if (threadIdx.x == 0) {
        s->partial[3 * blockIdx.x] = r.amax;
        s->partial[3 * blockIdx.x + 1] = r.lo;
        s->partial[3 * blockIdx.x + 2] = r.hi;
        __threadfence();
        last = atomicAdd(&s->blocks_done, 1) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last)
        return;
    /* the last CTA folds the partials with all its threads (one thread alone would wait out
     * an L2 round trip per CTA) */
    __threadfence();
    r = qd_range_empty();
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
        volatile float *p = s->partial + 3 * b;
        qd_range_merge(&r, {p[0], p[1], p[2]});
    }
    __syncthreads(); /* sh is reused */
    r = cta_range(r, sh);
    if (threadIdx.x == 0) {
        s->range[0] = r.amax, s->range[1] = r.lo, s->range[2] = r.hi;
    }
}

int qd_cuda_sm_count(void)
{
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 1;
    return sms > 0 ? sms : 1;
}

enum qd_status qd_cuda_range_async(const struct qd_tensor *in, unsigned long long *flag)
{
    int64_t n = qd_tensor_numel(in);
    struct qd_scratch *d = qd_scratch_dev();
    CUDA_CHECK(cudaMemsetAsync(&d->blocks_done, 0, sizeof d->blocks_done, qd_stream())); /* the ticket */
    int sms = qd_cuda_sm_count();
    unsigned grid = qd_grid(n, 256);
    unsigned cap = (unsigned)sms * 7 < 1024 ? (unsigned)sms * 7 : 1024; /* 7 CTAs of 256 per SM: a full SM */
    grid = grid < cap ? grid : cap;
    QD_DTYPE_SWITCH(in->dtype, DT, range_kernel<DT><<<grid, 256, 0, qd_stream()>>>(in->data, n, d, flag));
    CUDA_LAUNCHED();
    return QD_OK;
}

