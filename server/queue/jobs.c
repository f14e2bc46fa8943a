/* Job queue, workers and the async store (see jobs.h). Two pools, each a FIFO and its workers:
 * one for /quantize and /dequantize, one for conversions, so that a model being read and
 * converted (seconds to hours) never holds a worker a small request waits for. One mutex
 * guards both FIFOs and another the store; workers hold neither while they run a job. */
#include "queue/jobs.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "queue/hostmem.h"

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

/* The body's buffer and its share of --max-inflight-bytes go back together. */
static void body_free(struct qd_job *j)
{
    qd_hostmem_put(j->body);
    j->body = NULL;
    qd_hostmem_release(j->body_reserved);
    j->body_reserved = 0;
}

void qd_job_unref(struct qd_job *j)
{
    if (j && atomic_fetch_sub(&j->refs, 1) == 1) {
        body_free(j);
        j->type->free(j);
        free(j);
    }
}

struct pool;

struct worker {
    pthread_t thread;
    void *ctx;
    char name[32];
    int started;
    struct qd_job *current; /* the job it runs (under q.lock), for qd_jobs_cancel_all */
    struct pool *pool;
};

/* A FIFO and the workers that take from it. */
struct pool {
    pthread_cond_t nonempty; /* a job was queued, or stop: wakes a worker */
    struct qd_job **ring;
    int head, count, capacity, running;
    struct worker *workers;
    int nworkers, usable; /* usable: workers not retired for a lost device */
    int nice;             /* the workers' priority below the HTTP threads */
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t idle;     /* a job finished: wakes qd_jobs_drain (not the idle workers) */
    struct pool main, convert;
    int draining, stopping;
    struct qd_backend *backend;
    struct qd_jobs_config config;
    /* async store */
    pthread_mutex_t store_lock;
    struct qd_job *stored;
    int nstored;
    size_t stored_bytes;
} q = {.lock = PTHREAD_MUTEX_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER,
       .main = {.nonempty = PTHREAD_COND_INITIALIZER, .nice = 5},
       .convert = {.nonempty = PTHREAD_COND_INITIALIZER, .nice = 10},
       .store_lock = PTHREAD_MUTEX_INITIALIZER};

/* Runs one job on worker wk (as its type says); the answer (or error) lands in j->reply. */
static void job_execute(struct worker *wk, struct qd_job *j)
{
    j->started_us = qd_now_us();
    snprintf(j->backend, sizeof j->backend, "%s", wk->name);
    j->type->run(j, q.backend, wk->ctx);
    body_free(j);
    if (q.config.ran)
        q.config.ran(wk->name, (qd_now_us() - j->started_us) / 1e6);
}

static void store_finished(struct qd_job *j);

static void *worker_main(void *arg)
{
    struct worker *wk = arg;
    struct pool *p = wk->pool;
    /* below the HTTP threads (and conversions below the small requests' workers): when the
     * cores are saturated, receiving requests, answering them and the probes go first, the
     * kernels take what is left (Linux: per thread; the kernels' own threads inherit it).
     * Failing leaves the default. */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), p->nice);
    for (;;) {
        pthread_mutex_lock(&q.lock);
        while (!p->count && !q.stopping)
            pthread_cond_wait(&p->nonempty, &q.lock);
        if (!p->count) { /* stopping and nothing left */
            pthread_mutex_unlock(&q.lock);
            return NULL;
        }
        /* a worker whose device is lost leaves the jobs to the others; the last one stays and
         * answers each job with the device's error, so that none waits forever */
        if (q.backend->worker_usable && !q.backend->worker_usable(wk->ctx) && p->usable > 1) {
            p->usable--;
            fprintf(stderr, "quantd: worker %s retires (its device is lost); %d left\n", wk->name, p->usable);
            pthread_cond_signal(&p->nonempty); /* the job it was woken for goes to another */
            pthread_mutex_unlock(&q.lock);
            return NULL;
        }
        struct qd_job *j = p->ring[p->head];
        p->head = (p->head + 1) % p->capacity;
        p->count--;
        p->running++;
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
        p->running--;
        wk->current = NULL;
        pthread_cond_broadcast(&q.idle);
        pthread_mutex_unlock(&q.lock);
        if (atomic_load(&j->state) == QD_JOB_DONE && j->on_done)
            j->on_done(j);
        qd_job_unref(j);
    }
}

/* Opens n workers of p (backend worker index i for the i-th) with a FIFO of depth jobs; 0 when
 * at least one started. */
static int pool_start(struct pool *p, int n, int depth, char *err, size_t errlen)
{
    p->capacity = depth;
    p->ring = calloc((size_t)depth, sizeof *p->ring);
    p->workers = calloc((size_t)n, sizeof *p->workers);
    if (!p->ring || !p->workers) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        struct worker *wk = &p->workers[i];
        wk->pool = p;
        if (!(wk->ctx = q.backend->worker_open(q.backend, i, wk->name, sizeof wk->name, err, errlen)))
            break;
        if (pthread_create(&wk->thread, NULL, worker_main, wk)) {
            q.backend->worker_close(wk->ctx);
            snprintf(err, errlen, "cannot start worker thread %d", i);
            break;
        }
        wk->started = 1;
        pthread_mutex_lock(&q.lock); /* the workers read usable under the lock */
        p->nworkers++;
        p->usable++;
        pthread_mutex_unlock(&q.lock);
    }
    return p->nworkers ? 0 : -1;
}

int qd_jobs_start(const struct qd_jobs_config *c, struct qd_backend *b, char *err, size_t errlen)
{
    q.config = *c;
    q.backend = b;
    if (pool_start(&q.main, c->workers, c->depth, err, errlen))
        return -1;
    /* without conversion workers (none would open), conversions queue with the others */
    if (c->convert_workers > 0 && pool_start(&q.convert, c->convert_workers, c->depth, err, errlen))
        fprintf(stderr, "quantd: no conversion worker could start (%s); conversions share the workers\n", err);
    return 0;
}

/* The pool a job goes to. */
static struct pool *pool_of(const struct qd_job *j)
{
    return j->type->own_pool && q.convert.nworkers ? &q.convert : &q.main;
}

/* Bodies up to this run on the HTTP thread when a worker is idle: at most a millisecond or two
 * of kernel time, so the other connections that thread serves (probes included) barely wait. */
#define QD_RUN_HERE_MAX_BYTES (512u << 10)

int qd_jobs_run_here(struct qd_job *j)
{
    struct pool *p = &q.main;
    if (!p->nworkers || strcmp(q.backend->kind, "cpu") || j->body_len > QD_RUN_HERE_MAX_BYTES ||
        j->type->own_pool)
        return 0;
    pthread_mutex_lock(&q.lock);
    int idle = !q.draining && !p->count && p->running < p->nworkers;
    if (idle)
        p->running++;
    pthread_mutex_unlock(&q.lock);
    if (!idle)
        return 0;
    j->enqueued_us = qd_now_us();
    atomic_store(&j->state, QD_JOB_RUNNING);
    job_execute(&p->workers[0], j); /* the CPU backend's workers share one stateless context */
    j->done_us = qd_now_us();
    atomic_store(&j->state, QD_JOB_DONE);
    pthread_mutex_lock(&q.lock);
    p->running--;
    pthread_cond_broadcast(&q.idle);
    pthread_mutex_unlock(&q.lock);
    return 1;
}

const char *qd_jobs_backend_name(void) { return q.main.nworkers ? q.main.workers[0].name : "none"; }

enum qd_status qd_jobs_submit(struct qd_job *j)
{
    struct pool *p = pool_of(j);
    pthread_mutex_lock(&q.lock);
    if (q.draining || p->count == p->capacity) {
        pthread_mutex_unlock(&q.lock);
        return QD_EBUSY;
    }
    qd_job_ref(j);
    j->enqueued_us = qd_now_us();
    atomic_store(&j->state, QD_JOB_QUEUED);
    p->ring[(p->head + p->count) % p->capacity] = j;
    p->count++;
    pthread_cond_signal(&p->nonempty);
    pthread_mutex_unlock(&q.lock);
    return QD_OK;
}

int qd_jobs_full(void)
{
    pthread_mutex_lock(&q.lock);
    int full = q.draining || q.main.count >= q.main.capacity;
    pthread_mutex_unlock(&q.lock);
    return full;
}

/* (q.lock held) */
static int pools_busy(void) { return q.main.count || q.main.running || q.convert.count || q.convert.running; }

void qd_jobs_drain(void)
{
    pthread_mutex_lock(&q.lock);
    q.draining = 1;
    while (pools_busy())
        pthread_cond_wait(&q.idle, &q.lock);
    pthread_mutex_unlock(&q.lock);
}

/* Marks every queued and running job of p cancelled (q.lock held). */
static void pool_cancel(struct pool *p)
{
    for (int i = 0; i < p->count; i++) /* (still run: each answers its client, cancelled) */
        p->ring[(p->head + i) % p->capacity]->cancel = 1;
    for (int i = 0; i < p->nworkers; i++)
        if (p->workers[i].current)
            p->workers[i].current->cancel = 1;
}

int qd_jobs_cancel_all(int timeout_ms)
{
    pthread_mutex_lock(&q.lock);
    q.draining = 1;
    pool_cancel(&q.main);
    pool_cancel(&q.convert);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    int rc = 0;
    while (pools_busy() && rc == 0)
        rc = pthread_cond_timedwait(&q.idle, &q.lock, &until);
    int busy = pools_busy();
    pthread_mutex_unlock(&q.lock);
    return busy ? -1 : 0;
}

static void pool_stop(struct pool *p)
{
    for (int i = 0; i < p->nworkers; i++)
        if (p->workers[i].started) {
            pthread_join(p->workers[i].thread, NULL);
            q.backend->worker_close(p->workers[i].ctx);
        }
    free(p->ring);
    free(p->workers);
    p->ring = NULL;
    p->workers = NULL;
    p->nworkers = 0;
}

void qd_jobs_stop(void)
{
    pthread_mutex_lock(&q.lock);
    q.draining = q.stopping = 1;
    pthread_cond_broadcast(&q.main.nonempty);
    pthread_cond_broadcast(&q.convert.nonempty);
    pthread_mutex_unlock(&q.lock);
    pool_stop(&q.main);
    pool_stop(&q.convert);
    pthread_mutex_lock(&q.store_lock);
    while (q.stored) {
        struct qd_job *j = q.stored;
        q.stored = j->store_next;
        qd_job_unref(j);
    }
    pthread_mutex_unlock(&q.store_lock);
}

void qd_jobs_stats(struct qd_jobs_stats *s)
{
    pthread_mutex_lock(&q.lock);
    s->depth = q.main.count;
    s->capacity = q.main.capacity;
    s->running = q.main.running;
    s->workers = q.main.nworkers;
    s->convert_depth = q.convert.count;
    s->convert_running = q.convert.running;
    s->convert_workers = q.convert.nworkers;
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
            j->type->too_large(j, q.config.result_max_bytes);
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
