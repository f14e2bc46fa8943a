/* A backend as the job queue sees it: something that opens workers and runs decoded work on
 * them. The CPU backend (backend_cpu.c) and the CUDA one (backend_cuda.c) implement it; serve
 * picks one from --backend. */
#ifndef QD_BACKEND_H
#define QD_BACKEND_H

#include <stddef.h>

#include "queue/work.h"

#define QD_MAX_DEVICES 16

struct qd_backend_stats {
    int healthy;             /* 0 once no device is left (every one hit a sticky error) */
    int devices;             /* GPU slots in use (0 for CPU) */
    int device_healthy[QD_MAX_DEVICES]; /* per slot */
    char device_name[QD_MAX_DEVICES][16]; /* "cuda:N" per slot */
    double memory_used_bytes; /* device memory quantd holds (buffer pools), 0 for CPU */
};

struct qd_backend {
    const char *kind;   /* "cpu", "cuda" */
    char info[128];     /* e.g. "NVIDIA H100 80GB HBM3 (sm_90)", "x86-64, 2 threads" */
    int default_workers;
    /* Per-worker state (a stream, staging buffers); index spreads workers over devices. name
     * gets "cpu" or "cuda:N". NULL with err on failure. */
    void *(*worker_open)(struct qd_backend *b, int index, char *name, size_t namelen, char *err,
                         size_t errlen);
    void (*worker_close)(void *worker);
    /* Runs decoded work: quantize (and the error report when asked) or dequantize. Fills the
     * h2d/kernel/d2h fields of w->t. */
    enum qd_status (*run)(void *worker, struct qd_work *w, char *err, size_t errlen);
    /* 0 once the worker's device is lost (a sticky error): the queue stops giving it jobs while
     * another worker can take them. NULL: always usable. */
    int (*worker_usable)(void *worker);
    /* The device slot a worker runs on (its index among --devices); NULL: one device. */
    int (*worker_slot)(void *worker);
    void (*stats)(struct qd_backend *b, struct qd_backend_stats *s);
    void (*close)(struct qd_backend *b);
    /* Host memory the backend copies from fastest (pinned, for CUDA), for request bodies; NULL
     * when plain malloc is as good (CPU). */
    void *(*host_alloc)(size_t n);
    void (*host_free)(void *p);
    void *state;
};

/* 0 on success; -1 with err (no usable device for cuda, or not built with CUDA). devices is
 * a comma list of GPU indices or NULL for all visible. */
int qd_backend_cpu_open(struct qd_backend *b, char *err, size_t errlen);
int qd_backend_cuda_open(struct qd_backend *b, const char *devices, char *err, size_t errlen);

/* The error report of a quantize, computed on the CPU from the components (shared by backends). */
enum qd_status qd_backend_report(struct qd_work *w, char *err, size_t errlen);

#endif
