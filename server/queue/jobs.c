/* Job queue, workers and the async store (see jobs.h). One mutex guards the FIFO and another
 * the store; workers hold neither while they run a job. */
#include "queue/jobs.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint/convert_job.h"
#include "http/encode.h"
#include "queue/hostmem.h"
#include "service/metrics.h"

double qd_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

struct qd_job *qd_job_new(void)
{
    struct qd_job *j = calloc(1, sizeof *j);
    if (j)
        atomic_init(&j->refs, 1);
    return j;
}

void qd_job_ref(struct qd_job *j) { atomic_fetch_add(&j->refs, 1); }

void qd_job_unref(struct qd_job *j)
{
    if (j && atomic_fetch_sub(&j->refs, 1) == 1) {
        qd_hostmem_put(j->body);
        qd_reply_free(&j->reply);
        qd_convert_request_free(j->convert);
        free(j);
    }
}

struct worker {
    pthread_t thread;
    void *ctx;
    char name[32];
    int started;
    struct qd_job *current; /* the job it runs (under q.lock), for qd_jobs_cancel_all */
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t nonempty; /* a job was queued, or stop: wakes a worker */
    pthread_cond_t idle;     /* a job finished: wakes qd_jobs_drain (not the idle workers) */
    struct qd_job **ring;
    int head, count, capacity, running, draining, stopping;
    struct worker *workers;
    int nworkers, usable; /* usable: workers not retired for a lost device */
    struct qd_backend *backend;
    struct qd_jobs_config config;
    /* async store */
    pthread_mutex_t store_lock;
    struct qd_job *stored;
    int nstored;
    size_t stored_bytes;
} q = {.lock = PTHREAD_MUTEX_INITIALIZER, .nonempty = PTHREAD_COND_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER,
       .store_lock = PTHREAD_MUTEX_INITIALIZER};

/* Decode, run and encode one job on worker wk; the answer (or error) lands in j->reply. */
static void job_execute(struct worker *wk, struct qd_job *j)
{
    double start = qd_now_us();
    if (j->req.op == QD_OP_CONVERT) { /* a whole model, files in and out (checkpoint/) */
        snprintf(j->backend, sizeof j->backend, "%s", wk->name);
        qd_convert_job_run(j, q.backend, wk->ctx);
        j->timing.queue_us = start - j->enqueued_us;
        j->timing.total_us = qd_now_us() - j->received_us;
        qd_metrics_device_job(wk->name, (qd_now_us() - start) / 1e6);
        return;
    }
    struct qd_work w;
    memset(&w, 0, sizeof w);
    snprintf(w.backend, sizeof w.backend, "%s", wk->name);
    snprintf(j->backend, sizeof j->backend, "%s", wk->name);
    if (qd_work_decode(&w, &j->req, j->kind, j->body, j->body_len, &j->reply) == 0) {
        char err[1024] = "";
        j->fmt = w.f;
        enum qd_status s = q.backend->run(wk->ctx, &w, err, sizeof err);
        if (s != QD_OK)
            qd_reply_error(&j->reply, qd_status_http(s), qd_status_code(s), "%s", err);
        else {
            w.t.queue_us = start - j->enqueued_us;
            w.t.total_us = qd_now_us() - j->received_us;
            qd_metrics_kernel(w.f, w.t.kernel_us / 1e6);
            qd_encode_result(&w, &j->reply);
        }
    }
    j->timing = w.t;
    qd_work_free(&w);
    qd_hostmem_put(j->body);
    j->body = NULL;
    qd_metrics_device_job(wk->name, (qd_now_us() - start) / 1e6);
}

static void store_finished(struct qd_job *j);

static void *worker_main(void *arg)
{
    struct worker *wk = arg;
    /* below the HTTP threads: when the cores are saturated, receiving requests, answering them
     * and the probes go first, the kernels take what is left (Linux: per thread; the kernels'
     * own threads inherit it). Failing leaves the default. */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 5);
    for (;;) {
        pthread_mutex_lock(&q.lock);
        while (!q.count && !q.stopping)
            pthread_cond_wait(&q.nonempty, &q.lock);
        if (!q.count) { /* stopping and nothing left */
            pthread_mutex_unlock(&q.lock);
            return NULL;
        }
        /* a worker whose device is lost leaves the jobs to the others; the last one stays and
         * answers each job with the device's error, so that none waits forever */
        if (q.backend->worker_usable && !q.backend->worker_usable(wk->ctx) && q.usable > 1) {
            q.usable--;
            fprintf(stderr, "quantd: worker %s retires (its device is lost); %d left\n", wk->name, q.usable);
            pthread_cond_signal(&q.nonempty); /* the job it was woken for goes to another */
            pthread_mutex_unlock(&q.lock);
            return NULL;
        }
        struct qd_job *j = q.ring[q.head];
        q.head = (q.head + 1) % q.capacity;
        q.count--;
        q.running++;
        wk->current = j;
        pthread_mutex_unlock(&q.lock);

        int expected = QD_JOB_QUEUED;
        if (atomic_compare_exchange_strong(&j->state, &expected, QD_JOB_RUNNING)) {
            job_execute(wk, j);
            j->done_us = qd_now_us();
            if (j->async) /* before DONE: readers take reply as final once DONE */
                store_finished(j);
            atomic_store(&j->state, QD_JOB_DONE);
        }
        /* no longer running before the answer goes out, so that a job is never counted both
         * as running and as answered */
        pthread_mutex_lock(&q.lock);
        q.running--;
        wk->current = NULL;
        pthread_cond_broadcast(&q.idle);
        pthread_mutex_unlock(&q.lock);
        if (atomic_load(&j->state) == QD_JOB_DONE && j->on_done)
            j->on_done(j);
        qd_job_unref(j);
    }
}

int qd_jobs_start(const struct qd_jobs_config *c, struct qd_backend *b, char *err, size_t errlen)
{
    q.config = *c;
    q.backend = b;
    q.capacity = c->depth;
    q.ring = calloc((size_t)c->depth, sizeof *q.ring);
    q.workers = calloc((size_t)c->workers, sizeof *q.workers);
    if (!q.ring || !q.workers) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < c->workers; i++) {
        struct worker *wk = &q.workers[i];
        if (!(wk->ctx = b->worker_open(b, i, wk->name, sizeof wk->name, err, errlen)))
            break;
        if (pthread_create(&wk->thread, NULL, worker_main, wk)) {
            b->worker_close(wk->ctx);
            snprintf(err, errlen, "cannot start worker thread %d", i);
            break;
        }
        wk->started = 1;
        pthread_mutex_lock(&q.lock); /* the workers read usable under the lock */
        q.nworkers++;
        q.usable++;
        pthread_mutex_unlock(&q.lock);
    }
    return q.nworkers ? 0 : -1;
}

/* Bodies up to this run on the HTTP thread when a worker is idle: at most a millisecond or two
 * of kernel time, so the other connections that thread serves (probes included) barely wait. */
#define QD_RUN_HERE_MAX_BYTES (512u << 10)

int qd_jobs_run_here(struct qd_job *j)
{
    if (!q.nworkers || strcmp(q.backend->kind, "cpu") || j->body_len > QD_RUN_HERE_MAX_BYTES ||
        (j->req.op != QD_OP_QUANTIZE && j->req.op != QD_OP_DEQUANTIZE))
        return 0;
    pthread_mutex_lock(&q.lock);
    int idle = !q.draining && !q.count && q.running < q.nworkers;
    if (idle)
        q.running++;
    pthread_mutex_unlock(&q.lock);
    if (!idle)
        return 0;
    j->enqueued_us = qd_now_us();
    atomic_store(&j->state, QD_JOB_RUNNING);
    job_execute(&q.workers[0], j); /* the CPU backend's workers share one stateless context */
    j->done_us = qd_now_us();
    atomic_store(&j->state, QD_JOB_DONE);
    pthread_mutex_lock(&q.lock);
    q.running--;
    pthread_cond_broadcast(&q.idle);
    pthread_mutex_unlock(&q.lock);
    return 1;
}

const char *qd_jobs_backend_name(void) { return q.nworkers ? q.workers[0].name : "none"; }

enum qd_status qd_jobs_submit(struct qd_job *j)
{
    pthread_mutex_lock(&q.lock);
    if (q.draining || q.count == q.capacity) {
        pthread_mutex_unlock(&q.lock);
        return QD_EBUSY;
    }
    qd_job_ref(j);
    j->enqueued_us = qd_now_us();
    atomic_store(&j->state, QD_JOB_QUEUED);
    q.ring[(q.head + q.count) % q.capacity] = j;
    q.count++;
    pthread_cond_signal(&q.nonempty);
    pthread_mutex_unlock(&q.lock);
    return QD_OK;
}

int qd_jobs_full(void)
{
    pthread_mutex_lock(&q.lock);
    int full = q.draining || q.count >= q.capacity;
    pthread_mutex_unlock(&q.lock);
    return full;
}

void qd_jobs_drain(void)
{
    pthread_mutex_lock(&q.lock);
    q.draining = 1;
    while (q.count || q.running)
        pthread_cond_wait(&q.idle, &q.lock);
    pthread_mutex_unlock(&q.lock);
}

int qd_jobs_cancel_all(int timeout_ms)
{
    pthread_mutex_lock(&q.lock);
    q.draining = 1;
    for (int i = 0; i < q.count; i++) /* (still run: each answers its client, cancelled) */
        q.ring[(q.head + i) % q.capacity]->cancel = 1;
    for (int i = 0; i < q.nworkers; i++)
        if (q.workers[i].current)
            q.workers[i].current->cancel = 1;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    int rc = 0;
    while ((q.count || q.running) && rc == 0)
        rc = pthread_cond_timedwait(&q.idle, &q.lock, &until);
    int busy = q.count || q.running;
    pthread_mutex_unlock(&q.lock);
    return busy ? -1 : 0;
}

void qd_jobs_stop(void)
{
    pthread_mutex_lock(&q.lock);
    q.draining = q.stopping = 1;
    pthread_cond_broadcast(&q.nonempty);
    pthread_mutex_unlock(&q.lock);
    for (int i = 0; i < q.nworkers; i++)
        if (q.workers[i].started) {
            pthread_join(q.workers[i].thread, NULL);
            q.backend->worker_close(q.workers[i].ctx);
        }
    pthread_mutex_lock(&q.store_lock);
    while (q.stored) {
        struct qd_job *j = q.stored;
        q.stored = j->store_next;
        qd_job_unref(j);
    }
    pthread_mutex_unlock(&q.store_lock);
    free(q.ring);
    free(q.workers);
    q.ring = NULL;
    q.workers = NULL;
    q.nworkers = 0;
}

void qd_jobs_stats(struct qd_jobs_stats *s)
{
    pthread_mutex_lock(&q.lock);
    s->depth = q.count;
    s->capacity = q.capacity;
    s->running = q.running;
    s->workers = q.nworkers;
    pthread_mutex_unlock(&q.lock);
    pthread_mutex_lock(&q.store_lock);
    s->stored = q.nstored;
    s->stored_bytes = q.stored_bytes;
    pthread_mutex_unlock(&q.store_lock);
}

/* ---- async store ------------------------------------------------------------------------- */

/* Unlinks j (store lock held) and drops the store's reference. */
static void store_unlink(struct qd_job **link)
{
    struct qd_job *j = *link;
    *link = j->store_next;
    q.nstored--;
    q.stored_bytes -= j->store_bytes;
    qd_job_unref(j);
}

/* Forgets finished jobs past their time (store lock held). */
static void store_expire(void)
{
    double now = qd_now_us(), ttl_us = q.config.result_ttl_s * 1e6;
    for (struct qd_job **l = &q.stored; *l;) {
        if (atomic_load(&(*l)->state) == QD_JOB_DONE && now - (*l)->done_us > ttl_us)
            store_unlink(l);
        else
            l = &(*l)->store_next;
    }
}

enum qd_status qd_jobs_store(struct qd_job *j)
{
    static atomic_uint counter;
    unsigned char rnd[8] = {0};
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(rnd, 1, sizeof rnd, f) != sizeof rnd)
            memset(rnd, 0, sizeof rnd);
        fclose(f);
    }
    /* random part: ids are not guessable across clients; counter part: unique in-process */
    snprintf(j->id, sizeof j->id, "%02x%02x%02x%02x%02x%02x%02x%02x%08x", rnd[0], rnd[1], rnd[2],
             rnd[3], rnd[4], rnd[5], rnd[6], rnd[7], atomic_fetch_add(&counter, 1));
    j->async = 1;
    j->created_unix = (double)time(NULL);
    pthread_mutex_lock(&q.store_lock);
    store_expire();
    if (q.nstored >= q.config.max_stored) {
        pthread_mutex_unlock(&q.store_lock);
        return QD_EBUSY;
    }
    qd_job_ref(j);
    j->store_next = q.stored;
    q.stored = j;
    q.nstored++;
    pthread_mutex_unlock(&q.store_lock);
    return QD_OK;
}

/* Accounts a finished async result, evicting the oldest finished ones beyond the byte cap. */
static void store_finished(struct qd_job *j)
{
    pthread_mutex_lock(&q.store_lock);
    int present = 0;
    for (struct qd_job *it = q.stored; it; it = it->store_next)
        present |= it == j;
    if (present) {
        if (j->reply.len > q.config.result_max_bytes)
            qd_reply_error(&j->reply, 507, "result_too_large",
                           "the result (%zu bytes) is larger than the job store keeps (%zu); "
                           "use the synchronous endpoint", j->reply.len, q.config.result_max_bytes);
        j->store_bytes = j->reply.len;
        q.stored_bytes += j->store_bytes;
        while (q.stored_bytes > q.config.result_max_bytes) {
            /* the list is newest first: the last finished entry other than j is the oldest */
            struct qd_job **oldest = NULL;
            for (struct qd_job **l = &q.stored; *l; l = &(*l)->store_next)
                if (*l != j && atomic_load(&(*l)->state) == QD_JOB_DONE)
                    oldest = l;
            if (!oldest)
                break;
            store_unlink(oldest);
        }
    }
    pthread_mutex_unlock(&q.store_lock);
}

struct qd_job *qd_jobs_find(const char *id)
{
    struct qd_job *found = NULL;
    pthread_mutex_lock(&q.store_lock);
    store_expire();
    for (struct qd_job *it = q.stored; it && !found; it = it->store_next)
        if (!strcmp(it->id, id)) {
            found = it;
            qd_job_ref(it);
        }
    pthread_mutex_unlock(&q.store_lock);
    return found;
}

int qd_jobs_remove(const char *id)
{
    int rc = -1;
    pthread_mutex_lock(&q.store_lock);
    for (struct qd_job **l = &q.stored; *l; l = &(*l)->store_next)
        if (!strcmp((*l)->id, id)) {
            int expected = QD_JOB_QUEUED;
            /* a queued job is skipped by the worker; a running one finishes unseen, but a
             * running conversion stops at its next tensor and removes its partial output */
            (*l)->cancel = 1;
            atomic_compare_exchange_strong(&(*l)->state, &expected, QD_JOB_CANCELLED);
            store_unlink(l);
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&q.store_lock);
    return rc;
}
