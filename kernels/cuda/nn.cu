/* The transformer ops on one CUDA device (kernels/nn.h's second backend): cuBLAS GEMMs with bf16
 * inputs and f32 accumulation for every matmul, f32 everywhere else, following the CPU
 * reference's arithmetic (kernels/cpu/nn.c) where its order of roundings is cheap to keep: norms
 * and softmax sums in double, rope's angles by repeated f32 products, GELU through f16 as ggml's
 * table gives it. What differs from the CPU is the summation order of the GEMMs and the bf16
 * rounding of their inputs; tests/gpu/test_nn_engine.c states the bound.
 *
 * Memory: activations are managed memory (the engine's rare host-side steps read them after
 * sync); weights are bound: copied from their host f32 to device memory (matrices in bf16), the
 * host address then standing for the copy. Everything this file allocates counts against the
 * limit qd_nn_cuda_open sets (--max-device-bytes). The ops run in order on one stream; a CUDA
 * failure is kept and reported by qd_nn_cuda.error (the ops themselves return nothing).
 *
 * cuBLAS is opened when the backend is (dlopen), not linked: loading it costs every quantd
 * process some 70 MB of resident pages, which a conversion or the daemon never needs. */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn.h"
#include "common.cuh"

#define NN_PIECE_BYTES ((size_t)64 << 20) /* staging, bf16 activations, attention scores: each */
#define NN_SUMS_BYTES ((size_t)4 << 20)   /* an importance row: up to 1 M columns */
#define NN_PIN_BYTES ((size_t)32 << 20)   /* each of the two pinned buffers weights go through */
#define NN_COPY_THREADS 8                 /* the host threads that fill one */

struct binding {
    const float *host;
    int64_t n;
    enum qd_nn_weight_kind kind;
    void *dev; /* bf16 (matrix) or f32 (vector) */
};

struct owned {
    void *p;
    size_t bytes;
};

static struct {
    int open;
    cudaStream_t stream;
    cudaStream_t upload;      /* weights' copies, from the engine's loading thread while the ops run */
    cublasHandle_t blas;
    size_t limit, used, peak;
    struct binding *bind;
    int n_bind, cap_bind;
    struct owned *own;
    int n_own, cap_own;
    float *staging;           /* f32 pieces of a matrix on their way to bf16 (the upload stream's) */
    void *pinned[2];          /* host pieces of a weight on their way to the device */
    cudaEvent_t pinned_free[2]; /* each pinned buffer's last copy done */
    float *sums;              /* the importance sums' row (add_squares) */
    __nv_bfloat16 *xbuf;      /* a matmul's activations in bf16, a piece of rows at a time */
    float *scores;            /* attention scores of some heads x some query rows */
    unsigned long long *flag; /* first non-finite index */
    char error[256];
} nn;

/* the cuBLAS calls this file makes, from the library opened by qd_nn_cuda_open */
static struct {
    void *lib;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasSetStream_v2) set_stream;
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    cublasStatus_t (*sgemm_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                    const float *, const float *, int, long long, const float *, int, long long,
                                    const float *, float *, int, long long, int);
} blas;

static int blas_open(char *err, size_t errlen)
{
    /* the toolkit's library beside the runtime quantd was built with (the binary's run path),
     * then the loader's usual places */
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                                        "/usr/local/cuda/lib64/libcublas.so"};
    for (size_t i = 0; i < sizeof names / sizeof *names && !blas.lib; i++)
        blas.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!blas.lib) {
        snprintf(err, errlen, "cuBLAS (libcublas.so, part of the CUDA Toolkit) could not be loaded: %s", dlerror());
        return -1;
    }
    blas.create = (decltype(blas.create))dlsym(blas.lib, "cublasCreate_v2");
    blas.set_stream = (decltype(blas.set_stream))dlsym(blas.lib, "cublasSetStream_v2");
    blas.gemm_ex = (decltype(blas.gemm_ex))dlsym(blas.lib, "cublasGemmEx");
    blas.sgemm_batched = (decltype(blas.sgemm_batched))dlsym(blas.lib, "cublasSgemmStridedBatched");
    if (!blas.create || !blas.set_stream || !blas.gemm_ex || !blas.sgemm_batched) {
        snprintf(err, errlen, "the cuBLAS library found lacks a function the engine calls");
        return -1;
    }
    return 0;
}

static pthread_mutex_t nn_lock = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *what, cudaError_t e)
{
    if (!nn.error[0])
        snprintf(nn.error, sizeof nn.error, "%s: %s", what, cudaGetErrorString(e));
}

#define NN_CHECK(call, what)                    \
    do {                                        \
        cudaError_t e_ = (call);                \
        if (e_ != cudaSuccess)                  \
            fail(what, e_);                     \
    } while (0)
#define NN_LAUNCHED(what) NN_CHECK(cudaGetLastError(), what)

static void blas_check(cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS && !nn.error[0])
        snprintf(nn.error, sizeof nn.error, "%s: cuBLAS status %d", what, (int)s);
}

/* ---- memory under the limit ------------------------------------------------------------------ */

static int take(size_t bytes)
{
    if (nn.limit && nn.used + bytes > nn.limit)
        return 0;
    nn.used += bytes;
    if (nn.used > nn.peak)
        nn.peak = nn.used;
    return 1;
}

static int grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 1;
    int c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *p = realloc(*arr, (size_t)c * elem);
    if (!p)
        return 0;
    *arr = p, *cap = c;
    return 1;
}

/* Device memory (managed: the host may touch it after sync), counted. */
static void *own(size_t bytes, int managed)
{
    bytes = (bytes + 255) / 256 * 256;
    if (!take(bytes))
        return NULL;
    void *p = NULL;
    cudaError_t e = managed ? cudaMallocManaged(&p, bytes, cudaMemAttachGlobal) : cudaMalloc(&p, bytes);
    if (e != cudaSuccess || !grow((void **)&nn.own, &nn.cap_own, nn.n_own + 1, sizeof *nn.own)) {
        if (e == cudaSuccess)
            cudaFree(p);
        else
            cudaGetLastError(); /* out of memory is an answer, not a failure */
        nn.used -= bytes;
        return NULL;
    }
    if (managed) { /* kept on the device; the host's reads migrate what they touch */
        int dev = 0;
        cudaGetDevice(&dev);
        cudaMemLocation loc = {cudaMemLocationTypeDevice, dev};
        cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, loc);
        cudaGetLastError();
    }
    nn.own[nn.n_own++] = (struct owned){p, bytes};
    return p;
}

static void disown_locked(void *p)
{
    for (int i = 0; i < nn.n_own; i++)
        if (nn.own[i].p == p) {
            NN_CHECK(cudaStreamSynchronize(nn.stream), "sync before free");
            NN_CHECK(cudaFree(p), "cudaFree");
            nn.used -= nn.own[i].bytes;
            nn.own[i] = nn.own[--nn.n_own];
            return;
        }
}

static void *nn_alloc(size_t bytes)
{
    pthread_mutex_lock(&nn_lock);
    void *p = own(bytes, 1);
    pthread_mutex_unlock(&nn_lock);
    return p;
}

static void nn_free(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&nn_lock);
    disown_locked(p);
    pthread_mutex_unlock(&nn_lock);
}



static void nn_sync(void) { NN_CHECK(cudaStreamSynchronize(nn.stream), "cudaStreamSynchronize"); }

static size_t nn_peak(void) { return nn.peak; }

static void nn_to_host(void *dst, const void *src, size_t bytes)
{
    NN_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, nn.stream), "copy to the host");
    nn_sync();
}

static const char *nn_error(void) { return nn.error[0] ? nn.error : NULL; }

/* ---- weights --------------------------------------------------------------------------------- */

__global__ void k_to_bf16(__nv_bfloat16 *y, const float *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

static unsigned grid_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

/* The device address standing for host address p of a bound weight of this kind, or p itself. */
static const void *dev_of_locked(const void *p, enum qd_nn_weight_kind kind)
{
    for (int i = 0; i < nn.n_bind; i++) {
        const struct binding *b = &nn.bind[i];
        if (b->kind == kind && (const float *)p >= b->host && (const float *)p < b->host + b->n) {
            const int64_t off = (const float *)p - b->host;
            return kind == QD_NN_MATRIX ? (const void *)((const __nv_bfloat16 *)b->dev + off)
                                        : (const void *)((const float *)b->dev + off);
        }
    }
    return p;
}

static const void *dev_of(const void *p, enum qd_nn_weight_kind kind)
{
    pthread_mutex_lock(&nn_lock);
    const void *d = dev_of_locked(p, kind);
    pthread_mutex_unlock(&nn_lock);
    return d;
}

static const float *vec(const float *p) { return p ? (const float *)dev_of(p, QD_NN_VECTOR) : NULL; }

static void nn_unbind_locked(const float *host)
{
    for (int i = 0; i < nn.n_bind; i++)
        if (nn.bind[i].host == host) {
            disown_locked(nn.bind[i].dev);
            nn.bind[i] = nn.bind[--nn.n_bind];
            return;
        }
}

static void nn_unbind(const float *host)
{
    pthread_mutex_lock(&nn_lock);
    nn_unbind_locked(host);
    pthread_mutex_unlock(&nn_lock);
}

__global__ void k_f16_to_bf16(__nv_bfloat16 *y, const uint16_t *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(qd_f16_to_f32(x[i]));
}

/* A piece of the file's bytes into pinned memory, by NN_COPY_THREADS threads: a memcpy from the
 * mapped file (page faults included) runs at a few GB/s a thread, the copy to the device at
 * some 50 GB/s from pinned memory; a copy from pageable memory would be one thread's speed. */
struct copy_part {
    char *dst;
    const char *src;
    size_t bytes;
};

static void *copy_part_main(void *arg)
{
    const struct copy_part *c = (const struct copy_part *)arg;
    memcpy(c->dst, c->src, c->bytes);
    return NULL;
}

static void copy_parallel(void *dst, const void *src, size_t bytes)
{
    struct copy_part part[NN_COPY_THREADS];
    pthread_t th[NN_COPY_THREADS];
    int started[NN_COPY_THREADS] = {0};
    const size_t each = (bytes / NN_COPY_THREADS + 4095) / 4096 * 4096;
    for (int i = 0; i < NN_COPY_THREADS; i++) {
        const size_t at = (size_t)i * each < bytes ? (size_t)i * each : bytes;
        part[i] = (struct copy_part){(char *)dst + at, (const char *)src + at, bytes - at < each ? bytes - at : each};
        if (i > 0 && part[i].bytes)
            started[i] = pthread_create(&th[i], NULL, copy_part_main, &part[i]) == 0;
    }
    copy_part_main(&part[0]);
    for (int i = 1; i < NN_COPY_THREADS; i++)
        if (started[i])
            pthread_join(th[i], NULL);
        else if (part[i].bytes) /* no thread: here */
            copy_part_main(&part[i]);
}

/* A weight's n values of dtype at host address src into dev (a vector: f32 as it is; a matrix:
 * bf16, rounded on the device from f16 or f32 through the staging buffer), on the upload stream,
 * through the two pinned buffers in turn; done when this returns. */
static cudaError_t upload(void *dev, const void *src, int64_t n, enum qd_nn_weight_kind kind, enum qd_dtype dtype)
{
    const size_t elem = dtype == QD_F32 ? 4 : 2;
    const int direct = kind == QD_NN_VECTOR || dtype == QD_BF16; /* the bytes are the device's form */
    const int64_t piece = (int64_t)((direct ? NN_PIN_BYTES : (NN_PIN_BYTES < NN_PIECE_BYTES ? NN_PIN_BYTES
                                                                                            : NN_PIECE_BYTES)) / elem);
    cudaError_t e = cudaSuccess;
    for (int64_t at = 0, k = 0; e == cudaSuccess && at < n; at += piece, k++) {
        const int64_t m = n - at < piece ? n - at : piece;
        const size_t bytes = (size_t)m * elem;
        void *pin = nn.pinned[k % 2];
        if ((e = cudaEventSynchronize(nn.pinned_free[k % 2])) != cudaSuccess)
            break;
        copy_parallel(pin, (const char *)src + at * elem, bytes);
        if ((e = cudaMemcpyAsync(direct ? (char *)dev + at * elem : (char *)nn.staging, pin, bytes,
                                 cudaMemcpyHostToDevice, nn.upload)) != cudaSuccess ||
            (e = cudaEventRecord(nn.pinned_free[k % 2], nn.upload)) != cudaSuccess)
            break;
        if (direct)
            continue;
        if (dtype == QD_F16)
            k_f16_to_bf16<<<grid_for(m, 256), 256, 0, nn.upload>>>((__nv_bfloat16 *)dev + at,
                                                                   (const uint16_t *)nn.staging, m);
        else
            k_to_bf16<<<grid_for(m, 256), 256, 0, nn.upload>>>((__nv_bfloat16 *)dev + at, nn.staging, m);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(nn.upload);
    return e;
}

/* Called from the engine's loading thread while the ops of the block before run: the copy
 * (upload) goes on the upload stream and is finished when this returns; the table is locked only
 * to change it. One bind at a time: the pinned and staging buffers are the upload's. */
static enum qd_status nn_bind(const float *host, int64_t n, enum qd_nn_weight_kind kind, const void *src,
                              enum qd_dtype dtype)
{
    const size_t bytes = (size_t)n * (kind == QD_NN_MATRIX ? 2 : 4);
    if (kind == QD_NN_VECTOR && dtype != QD_F32) {
        if (!nn.error[0])
            snprintf(nn.error, sizeof nn.error, "a vector weight handed over in 16 bits (an engine bug)");
        return QD_EINVAL;
    }
    pthread_mutex_lock(&nn_lock);
    nn_unbind_locked(host);
    void *dev = own(bytes, 0);
    int room = dev && grow((void **)&nn.bind, &nn.cap_bind, nn.n_bind + 1, sizeof *nn.bind);
    pthread_mutex_unlock(&nn_lock);
    if (!room) {
        if (dev)
            nn_free(dev);
        return QD_ENOMEM;
    }
    const cudaError_t e = upload(dev, src, n, kind, dtype);
    pthread_mutex_lock(&nn_lock);
    if (e != cudaSuccess) {
        fail("weight upload", e);
        disown_locked(dev);
    } else
        nn.bind[nn.n_bind++] = (struct binding){host, n, kind, dev};
    pthread_mutex_unlock(&nn_lock);
    return e == cudaSuccess ? QD_OK : e == cudaErrorMemoryAllocation ? QD_ENOMEM : QD_EDEVICE;
}

/* ---- matmul ---------------------------------------------------------------------------------- */

/* y[T][N] = x[T][K] . w[N][K]^T: x rounded to bf16 a piece of rows at a time, w's bf16 copy,
 * f32 accumulation and output (cuBLAS is column-major: y^T = w . x^T). */
static void nn_matmul(float *y, const float *x, const float *w, int64_t T, int64_t K, int64_t N)
{
    const __nv_bfloat16 *wb = (const __nv_bfloat16 *)dev_of(w, QD_NN_MATRIX);
    if ((const void *)wb == (const void *)w) {
        if (!nn.error[0])
            snprintf(nn.error, sizeof nn.error, "a matmul's weight was not handed to the device (an engine bug)");
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    int64_t rows = (int64_t)(NN_PIECE_BYTES / 2) / K;
    rows = rows < 1 ? 1 : rows;
    for (int64_t t0 = 0; t0 < T; t0 += rows) {
        const int64_t m = T - t0 < rows ? T - t0 : rows;
        k_to_bf16<<<grid_for(m * K, 256), 256, 0, nn.stream>>>(nn.xbuf, x + t0 * K, m * K);
        NN_LAUNCHED("bf16 activations");
        blas_check(blas.gemm_ex(nn.blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)m, (int)K, &one, wb, CUDA_R_16BF,
                                (int)K, nn.xbuf, CUDA_R_16BF, (int)K, &zero, y + t0 * N, CUDA_R_32F, (int)N,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    }
}

/* ---- elementwise ----------------------------------------------------------------------------- */

#define GRID_STRIDE(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__global__ void k_add_row(float *y, const float *b, int64_t T, int64_t n) { GRID_STRIDE(i, T * n) y[i] += b[i % n]; }
__global__ void k_add(float *y, const float *a, int64_t n) { GRID_STRIDE(i, n) y[i] += a[i]; }
__global__ void k_scale(float *x, int64_t n, float s) { GRID_STRIDE(i, n) x[i] *= s; }
__global__ void k_softcap(float *x, int64_t n, float cap, float inv) { GRID_STRIDE(i, n) x[i] = tanhf(x[i] * inv) * cap; }

__global__ void k_round(float *x, int64_t n, int dtype)
{
    GRID_STRIDE(i, n)
    x[i] = dtype == QD_F16 ? qd_f16_to_f32(qd_f32_to_f16(x[i])) : qd_bf16_to_f32(qd_f32_to_bf16(x[i]));
}

/* ggml's GELU as the CPU reads it: its f16 table's entry at the input's f16 value (the entry
 * computed in f32 with the fused multiply-add the CPU build has), exact outside +-10 */
__device__ float gelu_f16(float x)
{
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    const float h = qd_f16_to_f32(qd_f32_to_f16(x));
    const float g = 0.5f * h * (1.0f + tanhf(0.79788456080286535587989211986876f * h * fmaf(0.044715f * h, h, 1.0f)));
    return qd_f16_to_f32(qd_f32_to_f16(g));
}

__global__ void k_glu(float *out, const float *gate, const float *up, int64_t n, int gelu)
{
    GRID_STRIDE(i, n)
    {
        const float g = gate[i];
        out[i] = gelu ? gelu_f16(g) * up[i] : g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void k_sigmoid_gate(float *y, const float *g, int64_t T, int64_t n)
{
    GRID_STRIDE(i, T * n)
    {
        const float x = g[i / n], silu = x / (1.0f + expf(-x));
        y[i] *= silu / x;
    }
}

#define LAUNCH(kernel, n, ...)                                                      \
    do {                                                                            \
        kernel<<<grid_for((n), 256), 256, 0, nn.stream>>>(__VA_ARGS__);             \
        NN_LAUNCHED(#kernel);                                                       \
    } while (0)

static void nn_add_row(float *y, const float *b, int64_t T, int64_t n) { LAUNCH(k_add_row, T * n, y, vec(b), T, n); }
static void nn_add(float *y, const float *a, int64_t n) { LAUNCH(k_add, n, y, a, n); }
static void nn_scale(float *x, int64_t n, float s) { LAUNCH(k_scale, n, x, n, s); }
static void nn_softcap(float *x, int64_t n, float cap) { LAUNCH(k_softcap, n, x, n, cap, 1.0f / cap); }
static void nn_round(float *x, int64_t n, enum qd_dtype dtype)
{
    if (dtype == QD_F16 || dtype == QD_BF16)
        LAUNCH(k_round, n, x, n, (int)dtype);
}
static void nn_glu(float *out, const float *gate, const float *up, int64_t n, enum qd_glu_kind kind)
{
    LAUNCH(k_glu, n, out, gate, up, n, kind == QD_GLU_GELU);
}
static void nn_sigmoid_gate(float *y, const float *g, int64_t T, int64_t n) { LAUNCH(k_sigmoid_gate, T * n, y, g, T, n); }

/* ---- norms: a block per row, the sums in double ---------------------------------------------- */

__device__ double block_sum(double v, double *shared)
{
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = 0.0;
    for (int i = 0; i < (int)blockDim.x / 32; i++)
        v += shared[i];
    return v;
}

__global__ void k_norm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps, int layer)
{
    __shared__ double shared[32];
    const float *xr = x + blockIdx.x * n;
    float *yr = y + blockIdx.x * n;
    float mean = 0.0f;
    if (layer) {
        double s = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            s += (double)xr[i];
        mean = (float)(block_sum(s, shared) / (double)n);
    }
    double s2 = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i] - mean;
        s2 += (double)(v * v);
    }
    const float var = (float)(block_sum(s2, shared) / (double)n);
    const float scale = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = (xr[i] - mean) * scale;
        if (w)
            v *= w[i];
        if (b)
            v += b[i];
        yr[i] = v;
    }
}

static void nn_rms_norm(float *y, const float *x, const float *w, int64_t rows, int64_t n, float eps)
{
    k_norm<<<(unsigned)rows, 256, 0, nn.stream>>>(y, x, vec(w), NULL, n, eps, 0);
    NN_LAUNCHED("rms_norm");
}

static void nn_layer_norm(float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t n, float eps)
{
    k_norm<<<(unsigned)rows, 256, 0, nn.stream>>>(y, x, vec(w), vec(b), n, eps, 1);
    NN_LAUNCHED("layer_norm");
}

/* ---- rope: a block per token, its angles built once in shared memory ------------------------- */

struct rope_args {
    int kind, n_rot, n_head, head_dim;
    int64_t stride;
    float freq_scale, ext_factor, attn_factor, theta_scale, corr0, corr1;
};

__global__ void k_rope(float *x, const int32_t *pos, const float *freq_factors, struct rope_args a)
{
    extern __shared__ float cache[]; /* [n_rot]: cos, sin of each pair */
    const int64_t t = blockIdx.x;
    if (threadIdx.x == 0) { /* the CPU's order: theta *= theta_scale pair after pair */
        float theta = (float)pos[t];
        for (int i0 = 0; i0 < a.n_rot; i0 += 2) {
            const float ff = freq_factors ? freq_factors[i0 / 2] : 1.0f;
            const float extrap = theta / ff, interp = a.freq_scale * extrap;
            float th = interp, mscale = a.attn_factor;
            if (a.ext_factor != 0.0f) {
                const float y = ((float)(i0 / 2) - a.corr0) / fmaxf(0.001f, a.corr1 - a.corr0);
                const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * a.ext_factor;
                th = interp * (1 - mix) + extrap * mix;
                mscale *= 1.0f + 0.1f * logf(1.0f / a.freq_scale);
            }
            cache[i0] = cosf(th) * mscale;
            cache[i0 + 1] = sinf(th) * mscale;
            theta *= a.theta_scale;
        }
    }
    __syncthreads();
    const int half = a.n_rot / 2, pairs = a.n_head * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int h = p / half, i0 = 2 * (p % half);
        float *xh = x + t * a.stride + (int64_t)h * a.head_dim;
        float *pa = a.kind == QD_ROPE_NEOX ? xh + i0 / 2 : xh + i0;
        float *pb = a.kind == QD_ROPE_NEOX ? pa + half : pa + 1;
        const float c = cache[i0], s = cache[i0 + 1], x0 = *pa, x1 = *pb;
        *pa = x0 * c - x1 * s;
        *pb = x0 * s + x1 * c;
    }
}

static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

static enum qd_status nn_rope(float *x, int64_t T, int64_t stride, int n_head, int head_dim, const int32_t *pos,
                              const struct qd_nn_rope *r)
{
    if (r->kind == QD_ROPE_NONE || r->n_rot <= 0)
        return QD_OK;
    struct rope_args a = {r->kind, r->n_rot, n_head, head_dim, stride, r->freq_scale, r->ext_factor, r->attn_factor};
    a.theta_scale = powf(r->freq_base, -2.0f / (float)r->n_rot);
    a.corr0 = fmaxf(0.0f, floorf(yarn_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_fast, r->freq_base)));
    a.corr1 = fminf((float)(r->n_rot - 1), ceilf(yarn_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_slow, r->freq_base)));
    const int32_t *dpos = (const int32_t *)dev_of(pos, QD_NN_VECTOR);
    const float *ff = r->freq_factors ? vec(r->freq_factors) : NULL;
    if ((const void *)dpos == (const void *)pos || (r->freq_factors && ff == r->freq_factors)) {
        if (!nn.error[0])
            snprintf(nn.error, sizeof nn.error, "rope's positions or factors were not handed to the device");
        return QD_EDEVICE;
    }
    k_rope<<<(unsigned)T, 128, (size_t)r->n_rot * sizeof(float), nn.stream>>>(x, dpos, ff, a);
    NN_LAUNCHED("rope");
    return nn.error[0] ? QD_EDEVICE : QD_OK;
}

/* ---- attention: scores by a batched GEMM per kv head, softmax, then the values -------------- */

/* rows [r0, r0 + rows) of `heads` heads' scores [heads][rows][keys]: soft-capping, the scale,
 * the causal (and sliding-window) mask, softmax with the sum in double */
__global__ void k_softmax(float *s, int64_t rows, int64_t keys, int64_t r0, float scale, float softcap,
                          int64_t window)
{
    __shared__ double shared[32];
    __shared__ float smax[32];
    float *p = s + blockIdx.x * keys; /* blockIdx.x = head * rows + i */
    const int64_t last = r0 + blockIdx.x % rows;
    const int64_t first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    float max = -INFINITY;
    for (int64_t t = first + threadIdx.x; t <= last; t += blockDim.x) {
        float v = p[t];
        if (softcap > 0.0f)
            v = tanhf(v * (1.0f / softcap)) * softcap;
        v *= scale;
        p[t] = v;
        max = fmaxf(max, v);
    }
    for (int o = 16; o > 0; o /= 2)
        max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, o));
    if (threadIdx.x % 32 == 0)
        smax[threadIdx.x / 32] = max;
    __syncthreads();
    max = -INFINITY;
    for (int i = 0; i < (int)blockDim.x / 32; i++)
        max = fmaxf(max, smax[i]);
    double sum = 0.0;
    for (int64_t t = first + threadIdx.x; t <= last; t += blockDim.x) {
        const float e = expf(p[t] - max);
        p[t] = e;
        sum += (double)e;
    }
    const float inv = (float)(1.0 / block_sum(sum, shared));
    for (int64_t t = threadIdx.x; t < keys; t += blockDim.x)
        p[t] = t >= first && t <= last ? p[t] * inv : 0.0f;
}

static enum qd_status attention_seq(float *out, const float *q, const float *k, const float *v,
                                    const struct qd_nn_attn *a, int64_t T)
{
    const int group = a->n_head / a->n_head_kv;
    const int64_t dk = a->head_dim_k, dv = a->head_dim_v, out_stride = (int64_t)a->n_head * dv;
    const float one = 1.0f, zero = 0.0f;
    /* query rows per pass: the group's scores within the piece */
    int64_t rows = (int64_t)(NN_PIECE_BYTES / sizeof(float)) / ((int64_t)group * T);
    rows = rows > T ? T : rows;
    if (rows < 1) {
        if (!nn.error[0])
            snprintf(nn.error, sizeof nn.error, "a context of %lld tokens is too long for the attention's scratch",
                     (long long)T);
        return QD_EINVAL;
    }
    for (int hk = 0; hk < a->n_head_kv; hk++)
        for (int64_t r0 = 0; r0 < T; r0 += rows) {
            const int64_t m = T - r0 < rows ? T - r0 : rows, keys = r0 + m; /* causal: keys up to the last row */
            /* scores[h][i][j] = q_h[r0 + i] . k[j], column-major C (keys x m) per head, ld keys */
            blas_check(blas.sgemm_batched(nn.blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)keys, (int)m, (int)dk, &one,
                                                 k + hk * dk, (int)a->k_stride, 0,
                                                 q + r0 * a->q_stride + (int64_t)hk * group * dk, (int)a->q_stride, dk,
                                                 &zero, nn.scores, (int)keys, m * keys, group),
                       "attention scores");
            k_softmax<<<(unsigned)(group * m), 256, 0, nn.stream>>>(nn.scores, m, keys, r0, a->scale, a->softcap,
                                                                     a->window);
            NN_LAUNCHED("softmax");
            /* out_h[r0 + i] = sum_j p[h][i][j] v[j] */
            blas_check(blas.sgemm_batched(nn.blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)dv, (int)m, (int)keys, &one,
                                                 v + hk * dv, (int)a->v_stride, 0, nn.scores, (int)keys, m * keys,
                                                 &zero, out + r0 * out_stride + (int64_t)hk * group * dv,
                                                 (int)out_stride, dv, group),
                       "attention values");
        }
    return nn.error[0] ? QD_EDEVICE : QD_OK;
}

static enum qd_status nn_attention(float *out, const float *q, const float *k, const float *v,
                                   const struct qd_nn_attn *a)
{
    const int64_t seq = a->seq > 0 && a->seq < a->T ? a->seq : a->T;
    const int64_t out_stride = (int64_t)a->n_head * a->head_dim_v;
    for (int64_t t0 = 0; t0 < a->T; t0 += seq) {
        const int64_t T = a->T - t0 < seq ? a->T - t0 : seq;
        enum qd_status st = attention_seq(out + t0 * out_stride, q + t0 * a->q_stride, k + t0 * a->k_stride,
                                          v + t0 * a->v_stride, a, T);
        if (st != QD_OK)
            return st;
    }
    return QD_OK;
}

/* ---- the mixture of experts ------------------------------------------------------------------ */

/* The routing on the CPU, over managed memory: the router's logits are T x n_expert, small, and
 * the choice's order of comparisons is the CPU's own. */
static void nn_moe_route(int32_t *ids, float *weights, float *logits, int64_t T, int n_expert, int n_used,
                         const struct qd_nn_moe_gating *g)
{
    nn_sync();
    qd_nn_moe_route(ids, weights, logits, T, n_expert, n_used, g); /* (g->bias: the host's copy) */
}

/* the CPU's sum: each product rounded to f32, added in slot order (no contraction: --fmad=false) */
__global__ void k_moe_sum(float *out, const float *experts, const float *weights, int64_t T, int n_used, int64_t n)
{
    GRID_STRIDE(i, T * n)
    {
        const int64_t t = i / n, c = i % n;
        const float *e = experts + t * n_used * n + c, *w = weights + t * n_used;
        float y = e[0] * w[0];
        for (int j = 1; j < n_used; j++) {
            const float product = e[(int64_t)j * n] * w[j];
            y = y + product;
        }
        out[i] = y;
    }
}

static void nn_moe_sum(float *out, const float *experts, const float *weights, int64_t T, int n_used, int64_t n)
{
    LAUNCH(k_moe_sum, T * n, out, experts, weights, T, n_used, n);
}

__global__ void k_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n, int64_t div)
{
    GRID_STRIDE(i, count * n) dst[i] = src[(int64_t)rows[i / n] / div * n + i % n];
}

__global__ void k_scatter_rows(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n)
{
    GRID_STRIDE(i, count * n) dst[(int64_t)rows[i / n] * n + i % n] = src[i];
}

static void nn_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n, int64_t div)
{
    LAUNCH(k_gather_rows, count * n, dst, src, rows, count, n, div);
}

static void nn_scatter_rows(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n)
{
    LAUNCH(k_scatter_rows, count * n, dst, src, rows, count, n);
}

/* ---- the non-finite check ------------------------------------------------------------------- */

__global__ void k_first_bad(const float *x, int64_t n, unsigned long long *flag)
{
    GRID_STRIDE(i, n)
    if (!isfinite(x[i]))
        atomicMin(flag, (unsigned long long)i);
}

static int64_t nn_first_nonfinite(const float *x, int64_t n)
{
    unsigned long long none = ~0ull, got = ~0ull;
    NN_CHECK(cudaMemcpyAsync(nn.flag, &none, sizeof none, cudaMemcpyHostToDevice, nn.stream), "flag");
    LAUNCH(k_first_bad, n, x, n, nn.flag);
    NN_CHECK(cudaMemcpyAsync(&got, nn.flag, sizeof got, cudaMemcpyDeviceToHost, nn.stream), "flag");
    nn_sync();
    return got == ~0ull ? -1 : (int64_t)got;
}

/* ---- the importance matrix's sums ------------------------------------------------------------ */

/* The rows in R parts summed side by side (part r: rows [r x per, (r + 1) x per), in order), then
 * the parts added to acc in order: deterministic, and thousands of threads instead of one per
 * column running down 8,192 rows. The CUDA matrix differs from the CPU's by the bf16 rounding
 * upstream anyway (tests/gpu/test_model_gpu.py's bound); this order adds less than that. */
__global__ void k_square_parts(float *part, const float *x, int64_t T, int64_t K, int64_t per)
{
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, r = blockIdx.y;
    if (j >= K)
        return;
    const int64_t t1 = (r + 1) * per < T ? (r + 1) * per : T;
    float a = 0.0f;
    for (int64_t t = r * per; t < t1; t++) {
        const float v = x[t * K + j];
        a += v * v;
    }
    part[r * K + j] = a;
}

__global__ void k_add_parts(float *acc, const float *part, int64_t R, int64_t K)
{
    GRID_STRIDE(j, K)
    {
        float a = acc[j];
        for (int64_t r = 0; r < R; r++)
            a += part[r * K + j];
        acc[j] = a;
    }
}

static void nn_add_squares(float *acc, const float *x, int64_t T, int64_t K)
{
    float *dacc = nn.sums;
    if ((size_t)K * sizeof(float) > NN_SUMS_BYTES) {
        if (!nn.error[0])
            snprintf(nn.error, sizeof nn.error, "an importance row of %lld values is too wide", (long long)K);
        return;
    }
    if (T <= 0)
        return;
    /* the parts in the attention's score buffer (free between ops: one stream) */
    int64_t R = (int64_t)(NN_PIECE_BYTES / sizeof(float)) / K;
    R = R > 64 ? 64 : R < 1 ? 1 : R;
    R = R > T ? T : R;
    const int64_t per = (T + R - 1) / R;
    R = (T + per - 1) / per;
    NN_CHECK(cudaMemcpyAsync(dacc, acc, (size_t)K * sizeof(float), cudaMemcpyHostToDevice, nn.stream), "sums");
    k_square_parts<<<dim3((unsigned)((K + 127) / 128), (unsigned)R), 128, 0, nn.stream>>>(nn.scores, x, T, K, per);
    NN_LAUNCHED("square_parts");
    LAUNCH(k_add_parts, K, dacc, nn.scores, R, K);
    NN_CHECK(cudaMemcpyAsync(acc, dacc, (size_t)K * sizeof(float), cudaMemcpyDeviceToHost, nn.stream), "sums");
    nn_sync();
}

extern "C" const struct qd_nn_backend qd_nn_cuda = {
    /* .name */ "cuda",
    nn_alloc, nn_free, nn_sync, nn_bind, nn_unbind, nn_first_nonfinite, nn_peak, nn_to_host, nn_add_squares, nn_error,
    nn_matmul, nn_add_row, nn_add, nn_scale, nn_softcap, nn_rms_norm, nn_layer_norm, nn_rope, nn_attention, nn_glu,
    nn_round, nn_moe_route, nn_moe_sum, nn_sigmoid_gate, nn_gather_rows, nn_scatter_rows,
};

/* The limit asked for (0: none), kept below what the card has free besides what this file already
 * holds. Activations are managed memory, and asking for more of it than the card has free can
 * stall the device; the margin leaves room for cuBLAS's workspace and the context's growth. */
static size_t limit_within(size_t asked, size_t held, size_t free_b)
{
    const size_t margin = ((size_t)512 << 20) + free_b / 32;
    const size_t usable = held + (free_b > margin ? free_b - margin : 0);
    return asked && asked < usable ? asked : usable;
}

extern "C" enum qd_status qd_nn_cuda_open(int device, size_t limit, char *err, size_t errlen)
{
    if (nn.open) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
            cudaGetLastError();
        nn.limit = limit_within(limit, nn.used, free_b);
        return QD_OK;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= device) {
        snprintf(err, errlen, "no CUDA device %d (%s); use --backend cpu", device,
                 e != cudaSuccess ? cudaGetErrorString(e) : "fewer devices");
        cudaGetLastError();
        return QD_EDEVICE;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaStreamCreateWithFlags(&nn.stream, cudaStreamNonBlocking)) ||
        (e = cudaStreamCreateWithFlags(&nn.upload, cudaStreamNonBlocking))) {
        snprintf(err, errlen, "CUDA device %d: %s", device, cudaGetErrorString(e));
        return QD_EDEVICE;
    }
    if (blas_open(err, errlen))
        return QD_EDEVICE;
    for (int i = 0; i < 2; i++)
        if ((e = cudaHostAlloc(&nn.pinned[i], NN_PIN_BYTES, cudaHostAllocDefault)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&nn.pinned_free[i], cudaEventDisableTiming)) != cudaSuccess) {
            snprintf(err, errlen, "CUDA device %d: pinned host memory for the weights' copies: %s", device,
                     cudaGetErrorString(e));
            return QD_EDEVICE;
        }
    if (blas.create(&nn.blas) != CUBLAS_STATUS_SUCCESS || blas.set_stream(nn.blas, nn.stream) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cuBLAS could not start on CUDA device %d", device);
        return QD_EDEVICE;
    }
    size_t free_b = 0, total_b = 0;
    if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
        snprintf(err, errlen, "CUDA device %d: %s", device, cudaGetErrorString(e));
        return QD_EDEVICE;
    }
    nn.limit = limit_within(limit, 0, free_b);
    if (!(nn.staging = (float *)own(NN_PIECE_BYTES, 0)) || !(nn.xbuf = (__nv_bfloat16 *)own(NN_PIECE_BYTES, 0)) ||
        !(nn.scores = (float *)own(NN_PIECE_BYTES, 0)) || !(nn.sums = (float *)own(NN_SUMS_BYTES, 0)) ||
        !(nn.flag = (unsigned long long *)own(sizeof *nn.flag, 0))) {
        snprintf(err, errlen, "the device's scratch (%zu MiB) does not fit the memory allowed (--max-device-bytes)",
                 (3 * NN_PIECE_BYTES + NN_SUMS_BYTES) >> 20);
        return QD_ENOMEM;
    }
    nn.open = 1;
    return QD_OK;
}
