/* Pinned host memory two ways, as the CUDA backend could make its buffers (server/queue/
 * backend_cuda.c: cuda_host_alloc): cudaHostAlloc, against memory of our own on 2 MiB boundaries
 * registered with cudaHostRegister, with and without transparent huge pages (madvise). Times
 * making and releasing 8 buffers of 32 MiB (a conversion pipeline's input slots), twice, then
 * pinned H2D copy speed from each kind. Needs a GPU: make bench-pinned. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define BUFS 8
#define BUF_BYTES ((size_t)32 << 20)
#define ALIGN ((size_t)2 << 20)
#define COPIES 20

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_pinned: %s: %s\n", #call, cudaGetErrorString(e_));              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *own(size_t n, int huge)
{
    void *p = NULL;
    if (posix_memalign(&p, ALIGN, n)) {
        fprintf(stderr, "bench_pinned: no memory\n");
        exit(1);
    }
    if (huge)
        madvise(p, n, MADV_HUGEPAGE);
    return p;
}

/* 0: cudaHostAlloc; 1: registered; 2: registered, huge pages advised. Milliseconds to make and
 * to release BUFS buffers. */
static void pin_round(int kind, double *make_ms, double *release_ms)
{
    void *p[BUFS];
    double t = now();
    for (int i = 0; i < BUFS; i++) {
        if (kind == 0)
            CHECK(cudaHostAlloc(&p[i], BUF_BYTES, cudaHostAllocPortable));
        else {
            p[i] = own(BUF_BYTES, kind == 2);
            CHECK(cudaHostRegister(p[i], BUF_BYTES, cudaHostRegisterPortable));
        }
    }
    *make_ms = (now() - t) * 1e3;
    t = now();
    for (int i = 0; i < BUFS; i++) {
        if (kind == 0)
            CHECK(cudaFreeHost(p[i]));
        else {
            CHECK(cudaHostUnregister(p[i]));
            free(p[i]);
        }
    }
    *release_ms = (now() - t) * 1e3;
}

static double h2d_gbs(void *dev, void *host)
{
    CHECK(cudaMemcpy(dev, host, BUF_BYTES, cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
    double t = now();
    for (int i = 0; i < COPIES; i++)
        CHECK(cudaMemcpy(dev, host, BUF_BYTES, cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
    return (double)COPIES * BUF_BYTES / (now() - t) / 1e9;
}

int main(void)
{
    static const char *names[] = {"cudaHostAlloc", "registered", "registered, THP"};
    double t = now();
    CHECK(cudaFree(0));
    printf("context: %.1f ms\n| buffers | round | make ms | release ms |\n|---|---|---|---|\n", (now() - t) * 1e3);
    for (int round = 0; round < 2; round++)
        for (int kind = 0; kind < 3; kind++) {
            double make, release;
            pin_round(kind, &make, &release);
            printf("| %d x %zu MiB %s | %d | %.1f | %.1f |\n", BUFS, BUF_BYTES >> 20, names[kind], round, make, release);
        }
    void *dev, *a, *b = own(BUF_BYTES, 1);
    CHECK(cudaMalloc(&dev, BUF_BYTES));
    CHECK(cudaHostAlloc(&a, BUF_BYTES, cudaHostAllocPortable));
    CHECK(cudaHostRegister(b, BUF_BYTES, cudaHostRegisterPortable));
    printf("H2D from cudaHostAlloc: %.1f GB/s; from registered THP memory: %.1f GB/s\n", h2d_gbs(dev, a), h2d_gbs(dev, b));
    CHECK(cudaHostUnregister(b));
    free(b);
    CHECK(cudaFreeHost(a));
    CHECK(cudaFree(dev));
    return 0;
}
