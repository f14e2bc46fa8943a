/* Parallel span drivers: split a tensor into aligned chunks that threads take in order from a
 * shared counter, and hand each chunk to a format's kernel as f32 (converting f16/bf16
 * through a small per-thread buffer that stays in L1/L2). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../fp.h"
#include "cpu.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

static int cpu_threads;

void qd_cpu_set_threads(int n) { cpu_threads = n < 1 ? 1 : n > QD_CPU_MAX_THREADS ? QD_CPU_MAX_THREADS : n; }

int qd_cpu_threads(void)
{
    if (cpu_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        qd_cpu_set_threads(n > 0 ? (int)n : 1);
    }
    return cpu_threads;
}

/* Below this many elements a second thread costs more than it saves. */
#define QD_MIN_PER_THREAD (1 << 17)
/* Elements converted per step: 64 KiB of f32, comfortably in L2. */
#define QD_CHUNK_ELEMS (1 << 11)

int qd_cpu_threads_for(int64_t n)
{
    int64_t t = n / QD_MIN_PER_THREAD;
    int max = qd_cpu_threads();
    if (t < 1)
        t = 1;
    return t > max ? max : (int)t;
}

static void to_f32(float *dst, const void *src, enum qd_dtype dt, int64_t n)
{
    if (dt == QD_F16) {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = qd_f16_to_f32(s[i]);
    } else {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = qd_bf16_to_f32(s[i]);
    }
}

static void from_f32(void *dst, const float *src, enum qd_dtype dt, int64_t n)
{
    uint16_t *d = dst;
    if (dt == QD_F16)
        for (int64_t i = 0; i < n; i++)
            d[i] = qd_f32_to_f16(src[i]);
    else
        for (int64_t i = 0; i < n; i++)
            d[i] = qd_f32_to_bf16(src[i]);
}

struct span_job {
    struct qd_tensor *t;
    int64_t align, n;
    qd_span_fn in_fn;
    qd_out_span_fn out_fn;
    void *ctx;
    int nthreads;
    struct {                             /* thread t's own stretch of chunks, in align units */
        int64_t next, end;
        char pad[48];                    /* one cache line each: the cursors move independently */
    } range[QD_CPU_MAX_THREADS];
    int failed;
    int check;                           /* scan each input chunk for NaN/Inf while it is hot */
    int self_check;                      /* the kernel notes NaN/Inf itself (qd_cpu_note_nonfinite) */
    int64_t first_bad[QD_CPU_MAX_THREADS];
};

static int64_t first_nonfinite_raw(const void *data, enum qd_dtype dt, int64_t first, int64_t n);

/* The calling thread's pending non-finite check (qd_cpu_scan_begin): taken by the next input
 * pass that thread drives, so a format's first pass over its input also validates it. */
static __thread int64_t *scan_slot;

void qd_cpu_scan_begin(int64_t *first_bad)
{
    *first_bad = -1;
    scan_slot = first_bad;
}

int qd_cpu_scan_end(void)
{
    int taken = scan_slot == NULL;
    scan_slot = NULL;
    return taken;
}

/* Where qd_cpu_note_nonfinite records, on a thread running a span job with a check armed. */
static __thread int64_t *self_bad;

void qd_cpu_note_nonfinite(int64_t index)
{
    if (self_bad && (*self_bad < 0 || index < *self_bad)) /* a thread may steal out of order */
        *self_bad = index;
}

struct span_worker {
    struct span_job *job;
    int tid;
};

/* Chunk [u, last_u) (align units) on thread tid: check it, convert it, run the kernel. */
static void run_chunk(struct span_job *j, int tid, float *buf, int64_t u, int64_t last_u)
{
    size_t esize = qd_dtype_size(j->t->dtype);
    int64_t first = u * j->align;
    int64_t last = last_u * j->align;
    if (last > j->n)
        last = j->n;
    int64_t cnt = last - first;
    char *p = (char *)j->t->data + first * (int64_t)esize;
    if (j->check && (j->first_bad[tid] < 0 || first < j->first_bad[tid])) {
        int64_t bad = first_nonfinite_raw(j->t->data, j->t->dtype, first, cnt);
        if (bad >= 0)
            j->first_bad[tid] = bad;
    }
    if (j->in_fn) {
        const float *x = (const float *)p;
        if (buf) {
            to_f32(buf, p, j->t->dtype, cnt);
            x = buf;
        }
        j->in_fn(j->ctx, tid, x, first, cnt);
    } else {
        float *y = buf ? buf : (float *)p;
        j->out_fn(j->ctx, tid, y, first, cnt);
        if (buf)
            from_f32(p, buf, j->t->dtype, cnt);
    }
}

static void *span_run(void *arg)
{
    struct span_worker *w = arg;
    struct span_job *j = w->job;
    int64_t chunk_units = QD_CHUNK_ELEMS / j->align;
    if (chunk_units < 1)
        chunk_units = 1;
    float *buf = NULL;
    if (j->t->dtype != QD_F32) {
        buf = malloc((size_t)(chunk_units * j->align) * sizeof(float));
        if (!buf) {
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
            return NULL;
        }
    }
    self_bad = j->self_check || j->check ? &j->first_bad[w->tid] : NULL;
    /* each thread streams through its own contiguous stretch, as a static split would, then
     * takes what is left of the others' stretches, so a thread on a busy core holds nobody
     * up (threads taking turns at one shared counter ran slower on 2 cores) */
    for (int v = 0; v < j->nthreads; v++) {
        int r = (w->tid + v) % j->nthreads;
        int64_t end = j->range[r].end;
        for (int64_t u; (u = __atomic_fetch_add(&j->range[r].next, chunk_units, __ATOMIC_RELAXED)) < end;)
            run_chunk(j, w->tid, buf, u, u + chunk_units < end ? u + chunk_units : end);
    }
    self_bad = NULL;
    free(buf);
    return NULL;
}

/* Runs fn(arg + i * size) for i in [0, n) on n threads. With more than one, every share gets
 * a new thread and the caller only waits: a thread created while its creator keeps its core
 * busy started ~2 ms late on average on a 2-core host (the scheduler queues it behind the
 * creator), while one created before the creator sleeps starts within ~0.1 ms. */
static void run_threads(int n, void *(*fn)(void *), void *arg, size_t size)
{
    pthread_t th[QD_CPU_MAX_THREADS];
    int started[QD_CPU_MAX_THREADS] = {0};
    for (int i = 0; n > 1 && i < n; i++)
        started[i] = pthread_create(&th[i], NULL, fn, (char *)arg + i * size) == 0;
    for (int i = 0; i < n; i++) /* no thread to be had (or only one share): run it here */
        if (!started[i])
            fn((char *)arg + i * size);
    for (int i = 0; i < n; i++)
        if (started[i])
            pthread_join(th[i], NULL);
}

struct parallel_share {
    qd_parallel_fn fn;
    void *ctx;
    int tid, n;
};

static void *parallel_run(void *arg)
{
    struct parallel_share *s = arg;
    s->fn(s->ctx, s->tid, s->n);
    return NULL;
}

void qd_cpu_parallel(int n, qd_parallel_fn fn, void *ctx)
{
    if (n < 1)
        n = 1;
    if (n > QD_CPU_MAX_THREADS)
        n = QD_CPU_MAX_THREADS;
    struct parallel_share s[QD_CPU_MAX_THREADS];
    for (int i = 0; i < n; i++)
        s[i] = (struct parallel_share){.fn = fn, .ctx = ctx, .tid = i, .n = n};
    run_threads(n, parallel_run, s, sizeof s[0]);
}

static int span_drive(struct span_job *j)
{
    j->n = qd_tensor_numel(j->t);
    j->nthreads = qd_cpu_threads_for(j->n);
    int64_t units = (j->n + j->align - 1) / j->align;
    if (units < j->nthreads)
        j->nthreads = units < 1 ? 1 : (int)units;
    struct span_worker w[QD_CPU_MAX_THREADS];
    for (int i = 0; i < j->nthreads; i++) {
        w[i] = (struct span_worker){.job = j, .tid = i};
        j->range[i].next = units * i / j->nthreads;
        j->range[i].end = units * (i + 1) / j->nthreads;
    }
    run_threads(j->nthreads, span_run, w, sizeof w[0]);
    return j->failed ? -1 : j->nthreads;
}

static int spans(const struct qd_tensor *in, int64_t align, qd_span_fn fn, void *ctx, int self_check)
{
    struct span_job j = {.t = (struct qd_tensor *)in, .align = align, .in_fn = fn, .ctx = ctx};
    int64_t *slot = scan_slot;
    if (slot) {
        scan_slot = NULL;
        j.check = !self_check;
        j.self_check = self_check;
        for (int i = 0; i < QD_CPU_MAX_THREADS; i++)
            j.first_bad[i] = -1;
    }
    int rc = span_drive(&j);
    /* each thread's chunks ascend, so its note is its lowest: the first index is their least */
    for (int i = 0; slot && rc > 0 && i < rc; i++)
        if (j.first_bad[i] >= 0 && (*slot < 0 || j.first_bad[i] < *slot))
            *slot = j.first_bad[i];
    return rc;
}

int qd_cpu_spans(const struct qd_tensor *in, int64_t align, qd_span_fn fn, void *ctx)
{
    return spans(in, align, fn, ctx, 0);
}

int qd_cpu_spans_self_checked(const struct qd_tensor *in, int64_t align, qd_span_fn fn, void *ctx)
{
    return spans(in, align, fn, ctx, 1);
}

int qd_cpu_out_spans(struct qd_tensor *out, int64_t align, qd_out_span_fn fn, void *ctx)
{
    struct span_job j = {.t = out, .align = align, .out_fn = fn, .ctx = ctx};
    return span_drive(&j);
}

/* ---- whole-tensor scans ------------------------------------------------------------------- */

struct scan_ctx {
    float amax[QD_CPU_MAX_THREADS], min[QD_CPU_MAX_THREADS], max[QD_CPU_MAX_THREADS];
};

/* Index of the first element of [0, n) whose exponent field is all ones, or -1. Works on the
 * raw bits (no conversion): f32 exponent mask 0x7f800000, f16 0x7c00, bf16 0x7f80. */
static int64_t first_nonfinite_raw(const void *data, enum qd_dtype dt, int64_t first, int64_t n)
{
    int bad = 0;
    if (dt == QD_F32) {
        const uint32_t *u = (const uint32_t *)data + first;
        for (int64_t i = 0; i < n; i++) /* branch-free so it vectorizes */
            bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
        if (bad)
            for (int64_t i = 0; i < n; i++)
                if ((u[i] & 0x7f800000u) == 0x7f800000u)
                    return first + i;
    } else {
        const uint16_t *h = (const uint16_t *)data + first;
        const uint16_t mask = dt == QD_F16 ? 0x7c00 : 0x7f80;
        for (int64_t i = 0; i < n; i++)
            bad |= (h[i] & mask) == mask;
        if (bad)
            for (int64_t i = 0; i < n; i++)
                if ((h[i] & mask) == mask)
                    return first + i;
    }
    return -1;
}

struct raw_scan {
    const struct qd_tensor *t;
    int64_t n;
    int nthreads;
    int64_t first_bad[QD_CPU_MAX_THREADS];
};

static void *raw_scan_run(void *arg)
{
    struct raw_scan *s = ((void **)arg)[0];
    int tid = (int)(intptr_t)((void **)arg)[1];
    int64_t a = s->n * tid / s->nthreads, b = s->n * (tid + 1) / s->nthreads;
    s->first_bad[tid] = first_nonfinite_raw(s->t->data, s->t->dtype, a, b - a);
    return NULL;
}

int64_t qd_cpu_find_nonfinite(const struct qd_tensor *in)
{
    struct raw_scan s = {.t = in, .n = qd_tensor_numel(in)};
    s.nthreads = qd_cpu_threads_for(s.n);
    void *args[QD_CPU_MAX_THREADS][2];
    for (int i = 0; i < s.nthreads; i++) {
        args[i][0] = &s;
        args[i][1] = (void *)(intptr_t)i;
    }
    run_threads(s.nthreads, raw_scan_run, args, sizeof args[0]);
    /* threads own ascending ranges: the lowest thread with a hit has the first index */
    for (int i = 0; i < s.nthreads; i++)
        if (s.first_bad[i] >= 0)
            return s.first_bad[i];
    return -1;
}

/* The scalar reduction, the definition: a NaN never wins a comparison, so it is skipped. */
static void minmax_scalar(const float *x, int64_t n, float *a, float *lo, float *hi)
{
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], m = qd_absf(v);
        *a = m > *a ? m : *a;
        *lo = v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
    }
}

static void scan_minmax(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct scan_ctx *s = c;
    (void)first;
    float a = s->amax[tid], lo = s->min[tid], hi = s->max[tid];
#ifdef __AVX2__
    /* max_ps(v, acc) is "v > acc ? v : acc" lane by lane, the scalar comparison itself, so NaN
     * is skipped alike; max and min do not depend on the order, except for the sign of a zero
     * minimum or maximum (qd_cpu_minmax settles that) */
    __m256 va = _mm256_set1_ps(a), vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        va = _mm256_max_ps(_mm256_and_ps(v, abs_mask), va);
        vlo = _mm256_min_ps(v, vlo);
        vhi = _mm256_max_ps(v, vhi);
    }
    float la[8], ll[8], lh[8];
    _mm256_storeu_ps(la, va), _mm256_storeu_ps(ll, vlo), _mm256_storeu_ps(lh, vhi);
    float na = a, nlo = lo, nhi = hi;
    for (int k = 0; k < 8; k++) {
        na = la[k] > na ? la[k] : na;
        nlo = ll[k] < nlo ? ll[k] : nlo;
        nhi = lh[k] > nhi ? lh[k] : nhi;
    }
    minmax_scalar(x + i, n - i, &na, &nlo, &nhi);
    a = na, lo = nlo, hi = nhi;
#else
    minmax_scalar(x, n, &a, &lo, &hi);
#endif
    s->amax[tid] = a;
    s->min[tid] = lo;
    s->max[tid] = hi;
}

static float first_zero(const struct qd_tensor *in)
{
    int64_t n = qd_tensor_numel(in);
    for (int64_t i = 0; i < n; i++) {
        uint32_t sign, rest;
        if (in->dtype == QD_F32) {
            uint32_t u;
            memcpy(&u, (const char *)in->data + i * 4, 4);
            sign = u >> 31, rest = u & 0x7fffffffu;
        } else {
            uint16_t h;
            memcpy(&h, (const char *)in->data + i * 2, 2);
            sign = h >> 15, rest = h & 0x7fffu;
        }
        if (!rest)
            return sign ? -0.0f : 0.0f;
    }
    return 0.0f;
}

void qd_cpu_minmax(const struct qd_tensor *in, float *amax, float *min, float *max)
{
    struct scan_ctx s;
    for (int i = 0; i < QD_CPU_MAX_THREADS; i++) {
        s.amax[i] = 0.0f;
        s.min[i] = 3.40282347e38f;
        s.max[i] = -3.40282347e38f;
    }
    int nt = qd_cpu_spans(in, 1, scan_minmax, &s);
    float a = 0.0f, lo = 3.40282347e38f, hi = -3.40282347e38f;
    for (int i = 0; i < nt; i++) {
        a = s.amax[i] > a ? s.amax[i] : a;
        lo = s.min[i] < lo ? s.min[i] : lo;
        hi = s.max[i] > hi ? s.max[i] : hi;
    }
    /* a zero minimum (maximum) is the first zero of a tensor with nothing below (above) it:
     * the sequential loop keeps the first zero it meets, so its sign is that zero's, whatever
     * order the lanes and the threads took */
    if (lo == 0.0f)
        lo = first_zero(in);
    if (hi == 0.0f)
        hi = first_zero(in);
    *amax = a;
    *min = lo;
    *max = hi;
}
