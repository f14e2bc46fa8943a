/* The CUDA backend as the job queue sees it: each worker owns a device, a stream with its
 * scratch (qd_cuda_ctx), CUDA events for timing, and buffers reused across jobs — pinned host
 * staging and device memory, grown on demand. A job is H2D -> kernel(s) -> D2H on the worker's
 * stream (straight from and to pinned request and result buffers, else through the staging);
 * several workers per GPU overlap one job's copies with another's kernels. */
#ifdef QD_WITH_CUDA
#include <cuda_runtime.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "../../kernels/cuda/cuda.h"
#include "queue/backend.h"

#define ALIGN(n) (((n) + 255) & ~(size_t)255)

struct cuda_state {
    int ndev, devices[QD_MAX_DEVICES]; /* slots: --devices may name a GPU twice */
    atomic_llong memory_used;
    atomic_int healthy[QD_MAX_DEVICES]; /* per slot: 0 once its device hit a sticky error */
    int poison; /* QUANTD_POISON=1: device outputs filled with 0xA5 before each job (tests) */
    int trace;  /* QUANTD_GPU_TRACE set: each job's stream times on stderr (trace_job) */
};

#ifdef QD_FAULTS
/* Fault injection, only in the test build (make bin/quantd-faults): QUANTD_FAULT=KIND:N makes
 * the N-th event of KIND fail, with the error the CUDA runtime really returns:
 *   device-alloc  the N-th device buffer allocation asks for 1 PiB (cudaErrorMemoryAllocation)
 *   pinned-alloc  the N-th pinned host allocation (staging or request bodies) asks for 1 PiB
 *   launch        the N-th job starts with a launch the runtime refuses (not sticky)
 *   sticky        the N-th job starts with a kernel that traps: the GPU is lost to the process
 *   sticky-slot   as sticky, but only that job's slot is marked lost and no kernel traps: with
 *                 --devices 0,0 one GPU stands in for two, to show the other slot serving on */
enum fault { F_NONE, F_DEVICE_ALLOC, F_PINNED_ALLOC, F_LAUNCH, F_STICKY, F_STICKY_SLOT };
static struct {
    enum fault kind;
    long at;
    atomic_long seen[F_STICKY_SLOT + 1];
} faults;

static void faults_init(void)
{
    static const char *names[] = {"", "device-alloc", "pinned-alloc", "launch", "sticky", "sticky-slot"};
    const char *v = getenv("QUANTD_FAULT");
    if (!v || !*v)
        return;
    for (int k = 1; k <= F_STICKY_SLOT; k++) {
        size_t n = strlen(names[k]);
        if (!strncmp(v, names[k], n) && v[n] == ':') {
            faults.kind = (enum fault)k;
            faults.at = atol(v + n + 1);
            fprintf(stderr, "quantd: fault injection: %s at event %ld\n", names[k], faults.at);
            return;
        }
    }
    fprintf(stderr, "quantd: QUANTD_FAULT=%s not understood (KIND:N)\n", v);
}

/* Whether this event of kind k is the one to fail. */
static int fault_now(enum fault k)
{
    if (faults.kind != k || atomic_fetch_add(&faults.seen[k], 1) + 1 != faults.at)
        return 0;
    fprintf(stderr, "quantd: injected fault fires: %s\n", getenv("QUANTD_FAULT"));
    return 1;
}
#define FAULT(k) fault_now(k)
#else
#define FAULT(k) 0
#endif

struct buffer {
    void *p;
    size_t cap;
};

struct cuda_worker {
    struct cuda_state *st;
    int slot, device;
    struct qd_cuda_ctx ctx;
    cudaEvent_t ev[4];
    struct buffer d_in, d_out, h_in, h_out;
};

static enum qd_status fail(cudaError_t e, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? QD_ENOMEM : QD_EDEVICE;
}

/* Grows a buffer to need bytes (device or pinned host); contents are not kept. */
static enum qd_status ensure(struct cuda_worker *wk, struct buffer *b, size_t need, int device,
                             char *err, size_t errlen)
{
    if (b->cap >= need)
        return QD_OK;
    size_t cap = need < (1 << 20) ? (1 << 20) : need;
    if (b->p) {
        if (device)
            cudaFree(b->p);
        else
            cudaFreeHost(b->p);
        atomic_fetch_sub(&wk->st->memory_used, device ? (long long)b->cap : 0);
        b->p = NULL;
        b->cap = 0;
    }
    size_t ask = (device ? FAULT(F_DEVICE_ALLOC) : FAULT(F_PINNED_ALLOC)) ? (size_t)1 << 50 : cap;
    cudaError_t e = device ? cudaMalloc(&b->p, ask) : cudaMallocHost(&b->p, ask);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* allocation failures are not sticky */
        b->p = NULL;
        snprintf(err, errlen, "cannot allocate %zu bytes of %s memory for this job; retry later",
                 cap, device ? "device" : "pinned host");
        return QD_ENOMEM;
    }
    b->cap = cap;
    if (device)
        atomic_fetch_add(&wk->st->memory_used, (long long)cap);
    return QD_OK;
}

static double elapsed_us(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms * 1e3;
}

/* Marks every slot on this worker's GPU lost: the process's context there is gone. */
static void mark_lost(struct cuda_worker *wk)
{
    for (int i = 0; i < wk->st->ndev; i++)
        if (wk->st->devices[i] == wk->device && atomic_exchange(&wk->st->healthy[i], 0))
            fprintf(stderr, "quantd: cuda:%d (slot %d) hit a sticky error; it takes no more jobs\n", wk->device, i);
}

/* After a device failure: an error that survives a synchronize and a reset of the last error
 * is sticky (the context is lost), and the device is taken out of service. */
static void check_sticky(struct cuda_worker *wk)
{
    if (cudaStreamSynchronize((cudaStream_t)wk->ctx.stream) != cudaSuccess &&
        cudaGetLastError() != cudaSuccess && cudaDeviceSynchronize() != cudaSuccess)
        mark_lost(wk);
}

/* Whether host memory p is page-locked (cudaHostAlloc'd or registered): copies from and to it run at full
 * PCIe speed without staging. */
static int is_pinned(const void *p)
{
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* not an error worth keeping */
        return 0;
    }
    return a.type == cudaMemoryTypeHost;
}

/* A host buffer and its place in the worker's device buffer. */
struct piece {
    void *host;
    size_t off, bytes;
};

/* The job's host side: the input pieces (the tensor, or the components at their offsets) or
 * the output pieces. Returns their count. */
static int pieces(struct qd_work *w, int input, const size_t *off, struct piece *p)
{
    int quant = w->req.op == QD_OP_QUANTIZE;
    struct qd_tensor *t = quant ? &w->in : &w->out;
    if (input == quant) { /* the tensor side */
        p[0] = (struct piece){t->data, 0, (size_t)qd_tensor_numel(t) * qd_dtype_size(t->dtype)};
        return 1;
    }
    for (int i = 0; i < w->nc; i++)
        p[i] = (struct piece){w->comp[i], off[i], (size_t)w->comps[i].bytes};
    return w->nc;
}

/* Marks each piece pinned or not; returns how many are not (0: every one is copied straight). */
static int mark_pinned(const struct piece *p, int n, int pinned[])
{
    int unpinned = 0;
    for (int i = 0; i < n; i++)
        unpinned += !(pinned[i] = is_pinned(p[i].host));
    return unpinned;
}

/* QUANTD_GPU_TRACE set: each job's stream times on stderr ("gpu DEVICE FORMAT OP H2D_MS
 * KERNEL_MS D2H_MS IN_BYTES"), for finding where a conversion's GPU time goes where no profiler
 * is installed. */
static void trace_job(const struct cuda_worker *wk, const struct qd_work *w, size_t in_bytes)
{
    if (wk->st->trace)
        fprintf(stderr, "gpu %d %s %s %.3f %.3f %.3f %zu\n", wk->device, w->f->name,
                w->req.op == QD_OP_QUANTIZE ? "quantize" : "dequantize", w->t.h2d_us / 1e3, w->t.kernel_us / 1e3,
                w->t.d2h_us / 1e3, in_bytes);
}

static enum qd_status run_job(struct cuda_worker *wk, struct qd_work *w, char *err, size_t errlen)
{
    cudaStream_t s = (cudaStream_t)wk->ctx.stream;
    int quant = w->req.op == QD_OP_QUANTIZE;
    struct qd_tensor *t = quant ? &w->in : &w->out;
    size_t tensor_bytes = (size_t)qd_tensor_numel(t) * qd_dtype_size(t->dtype), comps = 0;
    size_t off[QD_MAX_COMPONENTS];
    for (int i = 0; i < w->nc; i++) {
        off[i] = comps;
        comps += ALIGN((size_t)w->comps[i].bytes);
    }
    size_t in_bytes = quant ? tensor_bytes : comps, out_bytes = quant ? comps : tensor_bytes;
    struct piece in[QD_MAX_COMPONENTS], out[QD_MAX_COMPONENTS];
    int nin = pieces(w, 1, off, in), nout = pieces(w, 0, off, out), in_pinned[QD_MAX_COMPONENTS],
        out_pinned[QD_MAX_COMPONENTS];
    /* copies run at full PCIe speed only from and to pinned memory: pieces in the body pool
     * (server/hostmem.c) are copied directly, each other one (a small component, a body that
     * the pool could not hold) through the worker's pinned staging, at its place there */
    int in_staged = mark_pinned(in, nin, in_pinned), out_staged = mark_pinned(out, nout, out_pinned);
    enum qd_status st;
    if ((st = ensure(wk, &wk->d_in, in_bytes, 1, err, errlen)) || (st = ensure(wk, &wk->d_out, out_bytes, 1, err, errlen)) ||
        (in_staged && (st = ensure(wk, &wk->h_in, in_bytes, 0, err, errlen))) ||
        (out_staged && (st = ensure(wk, &wk->h_out, out_bytes, 0, err, errlen))))
        return st;
    for (int i = 0; i < nin; i++)
        if (!in_pinned[i])
            memcpy((char *)wk->h_in.p + in[i].off, in[i].host, in[i].bytes);
    cudaError_t e = cudaEventRecord(wk->ev[0], s);
    for (int i = 0; i < nin && !e; i++)
        e = cudaMemcpyAsync((char *)wk->d_in.p + in[i].off, in_pinned[i] ? in[i].host : (char *)wk->h_in.p + in[i].off,
                            in[i].bytes, cudaMemcpyHostToDevice, s);
    if (e || (e = cudaEventRecord(wk->ev[1], s)))
        return fail(e, "copy to the device", err, errlen);
    if (wk->st->poison && (e = cudaMemsetAsync(wk->d_out.p, 0xa5, out_bytes, s)))
        return fail(e, "poison", err, errlen);
    /* the kernels see the device buffers: the tensor in one, the components at their offsets */
    void *dcomp[QD_MAX_COMPONENTS];
    struct qd_tensor dt = *t;
    dt.data = quant ? wk->d_in.p : wk->d_out.p;
    for (int i = 0; i < w->nc; i++)
        dcomp[i] = (char *)(quant ? wk->d_out.p : wk->d_in.p) + off[i];
    st = quant ? qd_quantize(QD_BACKEND_CUDA, w->f, &dt, &w->p, dcomp, err, errlen)
               : qd_dequantize(QD_BACKEND_CUDA, w->f, (const void *const *)dcomp, &w->p, &dt, err, errlen);
    if (st != QD_OK) {
        if (st == QD_EDEVICE)
            check_sticky(wk);
        return st;
    }
    e = cudaEventRecord(wk->ev[2], s);
    for (int i = 0; i < nout && !e; i++)
        e = cudaMemcpyAsync(out_pinned[i] ? out[i].host : (char *)wk->h_out.p + out[i].off,
                            (char *)wk->d_out.p + out[i].off, out[i].bytes, cudaMemcpyDeviceToHost, s);
    if (e || (e = cudaEventRecord(wk->ev[3], s)) || (e = cudaStreamSynchronize(s))) {
        check_sticky(wk);
        return fail(e, "copy from the device", err, errlen);
    }
    /* the stream has run: the quantize's non-finite check and device-computed params */
    if (quant && (st = qd_quantize_finish(QD_BACKEND_CUDA, &w->p, err, errlen)) != QD_OK) {
        if (st == QD_EDEVICE)
            check_sticky(wk);
        return st;
    }
    for (int i = 0; i < nout; i++)
        if (!out_pinned[i])
            memcpy(out[i].host, (char *)wk->h_out.p + out[i].off, out[i].bytes);
    w->t.h2d_us = elapsed_us(wk->ev[0], wk->ev[1]);
    w->t.kernel_us = elapsed_us(wk->ev[1], wk->ev[2]);
    w->t.d2h_us = elapsed_us(wk->ev[2], wk->ev[3]);
    trace_job(wk, w, in_bytes);
    return QD_OK;
}

static enum qd_status cuda_run(void *worker, struct qd_work *w, char *err, size_t errlen)
{
    struct cuda_worker *wk = worker;
    if (!atomic_load(&wk->st->healthy[wk->slot])) {
        snprintf(err, errlen, "cuda:%d was lost to a sticky error earlier; retry (healthy devices, if any, "
                 "serve on) or restart this replica", wk->device);
        return QD_EDEVICE;
    }
    cudaSetDevice(wk->device);
    qd_cuda_ctx_set(&wk->ctx);
#ifdef QD_FAULTS
    if (FAULT(F_LAUNCH)) {
        int e = qd_cuda_fault_launch();
        snprintf(err, errlen, "cuda:%d: kernel launch: %s (injected)", wk->device, cudaGetErrorString((cudaError_t)e));
        check_sticky(wk);
        return QD_EDEVICE;
    }
    if (FAULT(F_STICKY)) {
        int e = qd_cuda_fault_trap();
        snprintf(err, errlen, "cuda:%d: %s (injected)", wk->device, cudaGetErrorString((cudaError_t)e));
        check_sticky(wk);
        return QD_EDEVICE;
    }
    if (FAULT(F_STICKY_SLOT)) {
        atomic_store(&wk->st->healthy[wk->slot], 0);
        fprintf(stderr, "quantd: slot %d marked lost (injected)\n", wk->slot);
        snprintf(err, errlen, "cuda:%d (slot %d): device lost (injected)", wk->device, wk->slot);
        return QD_EDEVICE;
    }
#endif
    enum qd_status st;
    int quant = w->req.op == QD_OP_QUANTIZE;
    const struct qd_backend_fns *gpu = &w->f->backend[QD_BACKEND_CUDA];
    if (quant ? !gpu->quantize || (w->p.importance && !(w->f->importance & QD_IMPORTANCE_ON(QD_BACKEND_CUDA)))
              : !gpu->dequantize) {
        /* a format registered without GPU kernels, or whose GPU kernels do not read an importance
         * given, runs the CPU code: the same bytes */
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        st = quant ? qd_quantize(QD_BACKEND_CPU, w->f, &w->in, &w->p, w->comp, err, errlen)
                   : qd_dequantize(QD_BACKEND_CPU, w->f, (const void *const *)w->comp, &w->p, &w->out, err, errlen);
        clock_gettime(CLOCK_MONOTONIC, &b);
        w->t.kernel_us = (double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) / 1e3;
        snprintf(w->backend, sizeof w->backend, "cpu");
    } else
        st = run_job(wk, w, err, errlen);
    if (st == QD_OK && quant && w->req.report_error)
        st = qd_backend_report(w, err, errlen);
    return st;
}

static void *cuda_worker_open(struct qd_backend *b, int index, char *name, size_t namelen, char *err,
                              size_t errlen)
{
    struct cuda_state *st = b->state;
    struct cuda_worker *wk = calloc(1, sizeof *wk);
    if (!wk)
        return NULL;
    wk->st = st;
    wk->slot = index % st->ndev;
    wk->device = st->devices[wk->slot];
    snprintf(name, namelen, "cuda:%d", wk->device);
    cudaError_t e = cudaSetDevice(wk->device);
    if (e == cudaSuccess && qd_cuda_ctx_init(&wk->ctx) != QD_OK)
        e = cudaErrorMemoryAllocation;
    for (int i = 0; e == cudaSuccess && i < 4; i++)
        e = cudaEventCreate(&wk->ev[i]);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda:%d: %s", wk->device, cudaGetErrorString(e));
        free(wk);
        return NULL;
    }
    atomic_fetch_add(&st->memory_used, QD_CUDA_SCRATCH_BYTES);
    return wk;
}

static void cuda_worker_close(void *worker)
{
    struct cuda_worker *wk = worker;
    cudaSetDevice(wk->device);
    cudaFree(wk->d_in.p);
    cudaFree(wk->d_out.p);
    cudaFreeHost(wk->h_in.p);
    cudaFreeHost(wk->h_out.p);
    for (int i = 0; i < 4; i++)
        cudaEventDestroy(wk->ev[i]);
    qd_cuda_ctx_free(&wk->ctx);
    free(wk);
}

static int cuda_worker_slot(void *worker) { return ((struct cuda_worker *)worker)->slot; }

static int cuda_worker_usable(void *worker)
{
    struct cuda_worker *wk = worker;
    return atomic_load(&wk->st->healthy[wk->slot]);
}

static void cuda_stats(struct qd_backend *b, struct qd_backend_stats *s)
{
    struct cuda_state *st = b->state;
    s->healthy = 0;
    for (int i = 0; i < st->ndev; i++) {
        s->device_healthy[i] = atomic_load(&st->healthy[i]);
        snprintf(s->device_name[i], sizeof s->device_name[i], "cuda:%d", st->devices[i]);
        s->healthy |= s->device_healthy[i];
    }
    s->devices = st->ndev;
    s->memory_used_bytes = (double)atomic_load(&st->memory_used);
}

static void cuda_close(struct qd_backend *b)
{
    free(b->state);
    b->state = NULL;
}

/* Pinned host memory for request bodies and a conversion's buffers (portable: any of the devices
 * copies from it): memory of our own on 2 MiB boundaries, offered to transparent huge pages, then
 * registered. Pinning 8 x 32 MiB so took 39-51 ms against cudaHostAlloc's 83-116 ms, and its
 * release 5 ms against 22-31 ms, with the same 54.6 GB/s of copies (an H200 machine, THP on
 * madvise): an 8B conversion's buffers were pinned one after another behind a driver lock while
 * its first tensors waited (docs/BENCHMARKS.md). cudaHostAlloc where registering fails. */
#define HOST_ALIGN ((size_t)2 << 20)
#define HOST_PAGE ((size_t)4096)

struct host_block {
    int registered; /* else cudaHostAlloc'd */
};

static void *cuda_host_alloc(size_t n)
{
    if (FAULT(F_PINNED_ALLOC))
        n = (size_t)1 << 50;
    /* a header page before the buffer says how it was made; the buffer stays 4 KiB aligned */
    const size_t len = (n + HOST_PAGE - 1) / HOST_PAGE * HOST_PAGE + HOST_PAGE;
    void *base = NULL;
    if (len < n)
        return NULL;
    if (posix_memalign(&base, HOST_ALIGN, len) == 0) {
        madvise(base, len, MADV_HUGEPAGE); /* advice only: without THP the pages stay small */
        if (cudaHostRegister(base, len, cudaHostRegisterPortable) == cudaSuccess) {
            ((struct host_block *)base)->registered = 1;
            return (char *)base + HOST_PAGE;
        }
        cudaGetLastError();
        free(base);
        base = NULL;
    }
    if (cudaHostAlloc(&base, len, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    ((struct host_block *)base)->registered = 0;
    return (char *)base + HOST_PAGE;
}

static void cuda_host_free(void *p)
{
    if (!p)
        return;
    void *base = (char *)p - HOST_PAGE;
    if (((struct host_block *)base)->registered) {
        cudaHostUnregister(base);
        free(base);
    } else
        cudaFreeHost(base);
}

/* Why no device can be used, in the words of what is missing: the runtime's own sentence for
 * "no driver at all" is "CUDA driver version is insufficient for CUDA runtime version". */
static void no_device(cudaError_t e, char *err, size_t errlen)
{
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (e == cudaErrorInsufficientDriver && driver == 0)
        snprintf(err, errlen, "no NVIDIA driver is installed, so no GPU can be used");
    else if (e == cudaErrorInsufficientDriver)
        snprintf(err, errlen, "the NVIDIA driver supports CUDA %d.%d, older than the %d.%d this quantd was built "
                 "with: update the driver", driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    else if (e == cudaErrorNoDevice || e == cudaSuccess)
        snprintf(err, errlen, "no NVIDIA GPU is visible (the driver found none, or CUDA_VISIBLE_DEVICES hides them)");
    else
        snprintf(err, errlen, "no usable CUDA device (%s)", cudaGetErrorString(e));
}

int qd_backend_cuda_open(struct qd_backend *b, const char *devices, char *err, size_t errlen)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        no_device(e, err, errlen);
        return -1;
    }
    struct cuda_state *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (devices && *devices) {
        for (const char *p = devices; *p && st->ndev < QD_MAX_DEVICES;) {
            char *end;
            long d = strtol(p, &end, 10);
            if (end == p || d < 0 || d >= count) {
                snprintf(err, errlen, "--devices %s: no device %.*s (%d visible)", devices, (int)(end - p + 1), p, count);
                free(st);
                return -1;
            }
            st->devices[st->ndev++] = (int)d;
            p = *end == ',' ? end + 1 : end;
        }
    } else
        for (int d = 0; d < count && d < QD_MAX_DEVICES; d++)
            st->devices[st->ndev++] = d;
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, st->devices[0])) != cudaSuccess || cudaSetDevice(st->devices[0]) != cudaSuccess ||
        cudaFree(0) != cudaSuccess) {
        snprintf(err, errlen, "cuda:%d is not usable (%s)", st->devices[0], cudaGetErrorString(e));
        free(st);
        return -1;
    }
    for (int i = 0; i < st->ndev; i++)
        atomic_init(&st->healthy[i], 1);
#ifdef QD_FAULTS
    faults_init();
#endif
    st->poison = getenv("QUANTD_POISON") && !strcmp(getenv("QUANTD_POISON"), "1");
    st->trace = getenv("QUANTD_GPU_TRACE") != NULL;
    memset(b, 0, sizeof *b);
    b->kind = "cuda";
    snprintf(b->info, sizeof b->info, "%.80s (sm_%d%d) x%d", prop.name, prop.major, prop.minor, st->ndev);
    for (char *p = b->info; *p; p++) /* the info goes into a metric label */
        if (*p == '"' || *p == '\\')
            *p = ' ';
    /* three workers per GPU: one job's H2D, another's kernel and a third's D2H overlap */
    b->default_workers = 3 * st->ndev;
    b->worker_open = cuda_worker_open;
    b->worker_close = cuda_worker_close;
    b->run = cuda_run;
    b->worker_usable = cuda_worker_usable;
    b->worker_slot = cuda_worker_slot;
    b->stats = cuda_stats;
    b->close = cuda_close;
    b->host_alloc = cuda_host_alloc;
    b->host_free = cuda_host_free;
    b->state = st;
    return 0;
}
#endif
