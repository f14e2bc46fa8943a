/* The job queue: a bounded FIFO feeding worker threads, each owning one backend worker (a CUDA
 * stream and its buffers, or a CPU worker), plus the store of asynchronous jobs (/jobs) whose
 * results are kept for a bounded time and size. */
#ifndef QD_JOBS_H
#define QD_JOBS_H

#include <stdatomic.h>
#include <stddef.h>

#include "queue/answer.h"
#include "queue/backend.h"
#include "queue/work.h"

struct qd_job;

/* What a job is and how a worker runs it, set by the layer that made the job, so the queue knows
 * nothing of the work: http/work_job.c (/quantize, /dequantize), http/convert_job.c (a model). */
struct qd_job_type {
    int own_pool; /* runs on the conversions' pool (--convert-workers) when there is one */
    /* Runs j on a worker of b (worker: its backend context, j->started_us: when it began); the
     * answer lands in j->reply. */
    void (*run)(struct qd_job *j, struct qd_backend *b, void *worker);
    /* Frees j->reply and what the job's maker left in j->payload. */
    void (*free)(struct qd_job *j);
    /* Replaces j's answer, longer than the store keeps (limit bytes), by an error saying so. */
    void (*too_large)(struct qd_job *j, size_t limit);
};

enum qd_job_state { QD_JOB_QUEUED, QD_JOB_RUNNING, QD_JOB_DONE, QD_JOB_CANCELLED };

/* A state's name in a job's "status" (api/openapi.yaml's JobStatus is made from these), NULL
 * past the last. */
static inline const char *qd_job_state_name(int state)
{
    static const char *const names[] = {[QD_JOB_QUEUED] = "queued", [QD_JOB_RUNNING] = "running",
                                        [QD_JOB_DONE] = "done", [QD_JOB_CANCELLED] = "cancelled"};
    return state >= 0 && state < (int)(sizeof names / sizeof *names) ? names[state] : NULL;
}

struct qd_job {
    atomic_int refs;
    atomic_int state;          /* enum qd_job_state */
    struct qd_req req;
    const struct qd_format *fmt; /* the format run (dequantize names it in the body) */
    enum qd_body_kind kind;
    char *body;                /* malloc'd request body, freed once the job ran */
    size_t body_len;
    size_t body_reserved;      /* its share of --max-inflight-bytes, given back with it */
    double received_us;        /* monotonic, when the body was complete */
    double enqueued_us;
    struct qd_reply reply;     /* the answer, set by the worker */
    struct qd_timing timing;
    char backend[32];
    /* called by the worker thread after reply is set (sync requests resume their connection) */
    void (*on_done)(struct qd_job *j);
    void *conn, *conn_handle;  /* the HTTP request context and its libmicrohttpd connection */
    /* asynchronous jobs */
    int async;
    char id[33];
    double created_unix, done_us;
    size_t store_bytes;        /* bytes of reply counted in the store's total */
    struct qd_job *store_next;
    const struct qd_job_type *type;
    void *payload;                         /* the type's own data (a conversion's request) */
    /* conversions */
    volatile int cancel;                   /* DELETE of a running conversion */
    atomic_int tensors_done, tensors_total;
    atomic_ullong bytes_done, bytes_total;
    double started_us;
};

struct qd_job *qd_job_new(void);
void qd_job_ref(struct qd_job *j);
void qd_job_unref(struct qd_job *j);

struct qd_jobs_config {
    int workers, depth;
    int convert_workers;     /* a pool of their own for conversions (0: with the others) */
    size_t result_max_bytes; /* async results kept, all together */
    int result_ttl_s;
    int max_stored;          /* async jobs known at once */
    /* called after each job a worker ran (device: the worker's name), for the metrics */
    void (*ran)(const char *device, double seconds);
};

/* Starts the workers on backend b; -1 with err when no worker could open. */
int qd_jobs_start(const struct qd_jobs_config *c, struct qd_backend *b, char *err, size_t errlen);
/* Enqueues j (takes a reference) on its pool (conversions on theirs): QD_EBUSY when that queue
 * is full or draining. */
enum qd_status qd_jobs_submit(struct qd_job *j);
/* Runs a small synchronous job on the calling (HTTP) thread when a worker would take it at
 * once anyway: CPU backend, nothing queued, a worker idle. It counts as a running job (the
 * workers' limit, drain and stats see it). 1 when run (j->reply holds the answer), else 0:
 * submit it. Saves the handoff to a worker and back, most of a small request's latency. */
int qd_jobs_run_here(struct qd_job *j);
/* Whether the queue of /quantize and /dequantize is full now (a new job would get QD_EBUSY). */
int qd_jobs_full(void);
/* Stops taking jobs, lets the workers finish every queued one, joins them. */
void qd_jobs_drain(void);
void qd_jobs_stop(void);
/* The drain's deadline: stops taking jobs and asks every queued and running one to stop (a
 * conversion stops at its next tensor, or before it starts, and removes its partial output;
 * small jobs finish), then waits at most timeout_ms for the workers to be idle: 0 when they
 * are, -1 when one still runs (a read that does not return). */
int qd_jobs_cancel_all(int timeout_ms);

struct qd_jobs_stats {
    int depth, capacity, running, workers, stored; /* the queue of /quantize and /dequantize */
    size_t stored_bytes;
    int convert_depth, convert_running, convert_workers; /* the conversions' pool */
};
void qd_jobs_stats(struct qd_jobs_stats *s);
const char *qd_jobs_backend_name(void); /* first worker's name, "cpu" or "cuda:0" */

/* The async store. store gives j an id (and a reference); find returns a reference or NULL;
 * remove cancels a queued job and forgets it: 0, or -1 when unknown. */
enum qd_status qd_jobs_store(struct qd_job *j);
struct qd_job *qd_jobs_find(const char *id);
int qd_jobs_remove(const char *id);

double qd_now_us(void);

#endif
