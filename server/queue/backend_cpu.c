/* The CPU backend: each worker runs the multithreaded CPU kernels on host buffers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../kernels/cpu/cpu.h"
#include "queue/backend.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

enum qd_status qd_backend_report(struct qd_work *w, char *err, size_t errlen)
{
    struct qd_tensor back = w->in;
    back.dtype = QD_F32;
    back.data = malloc((size_t)qd_tensor_numel(&w->in) * sizeof(float));
    if (!back.data) {
        snprintf(err, errlen, "out of memory for the error report");
        return QD_ENOMEM;
    }
    enum qd_status s = qd_dequantize(QD_BACKEND_CPU, w->f, (const void *const *)w->comp, &w->p,
                                     &back, err, errlen);
    if (s == QD_OK) {
        qd_error_report(&w->in, back.data, &w->report);
        w->has_report = 1;
    }
    free(back.data);
    return s;
}

static void *cpu_worker_open(struct qd_backend *b, int index, char *name, size_t namelen, char *err,
                             size_t errlen)
{
    snprintf(name, namelen, "cpu");
    return b; /* no per-worker state */
}

static void cpu_worker_close(void *worker) { (void)worker; }

static enum qd_status cpu_run(void *worker, struct qd_work *w, char *err, size_t errlen)
{
    double t0 = now_us();
    enum qd_status s = w->req.op == QD_OP_QUANTIZE
        ? qd_quantize(QD_BACKEND_CPU, w->f, &w->in, &w->p, w->comp, err, errlen)
        : qd_dequantize(QD_BACKEND_CPU, w->f, (const void *const *)w->comp, &w->p, &w->out, err, errlen);
    w->t.kernel_us = now_us() - t0;
    if (s == QD_OK && w->req.op == QD_OP_QUANTIZE && w->req.report_error)
        s = qd_backend_report(w, err, errlen);
    return s;
}

static void cpu_stats(struct qd_backend *b, struct qd_backend_stats *s)
{
    s->healthy = 1;
    s->devices = 0;
    s->memory_used_bytes = 0;
}

static void cpu_close(struct qd_backend *b) { (void)b; }

int qd_backend_cpu_open(struct qd_backend *b, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    b->kind = "cpu";
    snprintf(b->info, sizeof b->info, "%d threads", qd_cpu_threads());
    /* the kernels already use every core; two workers let one decode while the other computes */
    b->default_workers = 2;
    b->worker_open = cpu_worker_open;
    b->worker_close = cpu_worker_close;
    b->run = cpu_run;
    b->stats = cpu_stats;
    b->close = cpu_close;
    return 0;
}

#ifndef QD_WITH_CUDA
int qd_backend_cuda_open(struct qd_backend *b, const char *devices, char *err, size_t errlen)
{
    snprintf(err, errlen, "this quantd was built without CUDA (no nvcc at build time)");
    return -1;
}
#endif
