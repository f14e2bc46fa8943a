/* The conversion pipeline of pipeline.h. The k-th PROCESS item reads into input slot
 * k % in_slots (free once item k - in_slots is processed) and is processed into output slot
 * k % out_slots (free once item k - out_slots is written). Readers take PROCESS items round
 * robin; writers take the next handed item, whatever its kind, and write it at its offset. All
 * the bookkeeping is under one lock: a conversion has hundreds of items, not millions. */
#define _GNU_SOURCE
#include "checkpoint/pipeline.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One thread reads the page cache at ~6 GB/s and writes at ~3: a big host gets several of each;
 * a small one (2 cores, also running the CPU kernels) one of each. */
#define MAX_READERS 4
#define MAX_WRITERS 3
#define MAX_IN_SLOTS (MAX_READERS + 2)
#define MAX_OUT_SLOTS (MAX_WRITERS + 1)

struct qd_pipe_pool {
    int readers, writers, in_slots, out_slots;
    void *in[MAX_IN_SLOTS], *out[MAX_OUT_SLOTS];
    uint64_t in_cap, out_cap;
    void (*release)(void *);
};

struct qd_pipe_pool *qd_pipe_pool_new(struct qd_backend *backend, uint64_t in_cap, uint64_t out_cap)
{
    struct qd_pipe_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return NULL;
    /* pinned when the backend has them: the GPU reads and writes them directly */
    void *(*alloc)(size_t) = backend && backend->host_alloc ? backend->host_alloc : malloc;
    pool->release = backend && backend->host_free ? backend->host_free : free;
    pool->in_cap = in_cap ? in_cap : 1;
    pool->out_cap = out_cap ? out_cap : 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    pool->readers = cores >= 8 ? MAX_READERS : 1;
    pool->writers = cores >= 8 ? MAX_WRITERS : 1;
    pool->in_slots = pool->readers + 2;
    pool->out_slots = pool->writers + 1;
    int ok = 1;
    for (int s = 0; s < pool->in_slots; s++)
        ok &= (pool->in[s] = alloc(pool->in_cap)) != NULL;
    for (int s = 0; s < pool->out_slots; s++)
        ok &= (pool->out[s] = alloc(pool->out_cap)) != NULL;
    if (!ok) {
        qd_pipe_pool_free(pool);
        return NULL;
    }
    return pool;
}

void qd_pipe_pool_free(struct qd_pipe_pool *pool)
{
    if (!pool)
        return;
    for (int s = 0; s < MAX_IN_SLOTS; s++)
        if (pool->in[s])
            pool->release(pool->in[s]);
    for (int s = 0; s < MAX_OUT_SLOTS; s++)
        if (pool->out[s])
            pool->release(pool->out[s]);
    free(pool);
}

struct run {
    const struct qd_pipe *p;
    pthread_mutex_t lock;
    pthread_cond_t moved;
    int processed, handed, next_write; /* PROCESS items processed; items handed; next to take */
    char *read_done, *written;        /* per PROCESS ordinal */
    int *ordinal;                     /* item -> its ordinal among PROCESS items, or -1 */
    int *item_of;                     /* ordinal -> item */
    uint64_t *offset;                 /* item -> where its output starts */
    int nproc;
    int failed;
    enum qd_status status;
    char *err;
    size_t errlen;
    double read_s, process_s, write_s; /* busy time per stage, summed over its threads */
};

double qd_pipe_clock_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void fail(struct run *r, enum qd_status s, const char *msg)
{
    pthread_mutex_lock(&r->lock);
    if (!r->failed) {
        r->failed = 1;
        r->status = s;
        snprintf(r->err, r->errlen, "%s", msg);
    }
    pthread_cond_broadcast(&r->moved);
    pthread_mutex_unlock(&r->lock);
}

/* Waits (holding the lock) until ready(r, arg) or a failure; 0 when ready. */
static int wait_until(struct run *r, int (*ready)(struct run *, int), int arg)
{
    while (!r->failed && !ready(r, arg))
        pthread_cond_wait(&r->moved, &r->lock);
    return r->failed ? -1 : 0;
}

static int in_slot_free(struct run *r, int k) { return r->processed > k - r->p->pool->in_slots; }
static int was_read(struct run *r, int k) { return r->read_done[k]; }
static int out_slot_free(struct run *r, int k)
{
    return k < r->p->pool->out_slots || r->written[k - r->p->pool->out_slots];
}
static int was_handed(struct run *r, int i) { return r->handed > i; }

static int read_fully(int fd, void *buf, uint64_t n, uint64_t off)
{
    char *c = buf;
    while (n) {
        ssize_t got = pread(fd, c, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        c += got, n -= (uint64_t)got, off += (uint64_t)got;
    }
    return 0;
}

static int write_fully(int fd, const void *buf, uint64_t n, uint64_t off)
{
    const char *c = buf;
    while (n) {
        ssize_t put = pwrite(fd, c, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0)
            return -1;
        c += put, n -= (uint64_t)put, off += (uint64_t)put;
    }
    return 0;
}

struct reader_arg {
    struct run *r;
    int index;
};

static void *reader(void *arg)
{
    struct run *r = ((struct reader_arg *)arg)->r;
    const struct qd_pipe *p = r->p;
    for (int k = ((struct reader_arg *)arg)->index; k < r->nproc; k += p->pool->readers) {
        pthread_mutex_lock(&r->lock);
        int stop = wait_until(r, in_slot_free, k);
        pthread_mutex_unlock(&r->lock);
        if (stop)
            return NULL;
        const struct qd_pipe_item *it = &p->items[r->item_of[k]];
        double t0 = qd_pipe_clock_s();
        int bad = read_fully(p->src_fd, p->pool->in[k % p->pool->in_slots], it->src_bytes, it->src_offset);
        double t1 = qd_pipe_clock_s();
        if (bad) {
            char msg[160];
            snprintf(msg, sizeof msg, "reading the input at byte %llu: %s", (unsigned long long)it->src_offset,
                     errno ? strerror(errno) : "it ended early");
            fail(r, QD_EIO, msg);
            return NULL;
        }
        pthread_mutex_lock(&r->lock);
        r->read_s += t1 - t0;
        r->read_done[k] = 1;
        pthread_cond_broadcast(&r->moved);
        pthread_mutex_unlock(&r->lock);
    }
    return NULL;
}

/* A range of the input to the output in the kernel, or through a buffer where the file
 * systems cannot (copy_file_range's EXDEV and kin). */
static int copy_range(const struct qd_pipe *p, uint64_t off, uint64_t n, uint64_t to)
{
    char *buf = NULL;
    while (n) {
        loff_t in_off = (loff_t)off, out_off = (loff_t)to;
        ssize_t c = buf ? -1 : copy_file_range(p->src_fd, &in_off, p->out->fd, &out_off, n, 0);
        if (c > 0) {
            off += (uint64_t)c, to += (uint64_t)c, n -= (uint64_t)c;
            continue;
        }
        if (c < 0 && errno == EINTR)
            continue;
        if (!buf && !(buf = malloc(8u << 20)))
            return -1;
        uint64_t step = n < (8u << 20) ? n : (8u << 20);
        if (read_fully(p->src_fd, buf, step, off) || write_fully(p->out->fd, buf, step, to)) {
            free(buf);
            return -1;
        }
        off += step, to += step, n -= step;
    }
    free(buf);
    return 0;
}

static void *writer(void *arg)
{
    struct run *r = arg;
    const struct qd_pipe *p = r->p;
    static const uint8_t zeros[4096];
    for (;;) {
        pthread_mutex_lock(&r->lock);
        int i = r->next_write < p->n ? r->next_write++ : -1;
        int stop = i < 0 || wait_until(r, was_handed, i);
        pthread_mutex_unlock(&r->lock);
        if (stop)
            return NULL;
        const struct qd_pipe_item *it = &p->items[i];
        int k = r->ordinal[i], bad;
        uint64_t at = r->offset[i];
        double t0 = qd_pipe_clock_s();
        if (it->kind == QD_PIPE_BYTES)
            bad = write_fully(p->out->fd, it->bytes, it->out_bytes, at);
        else if (it->kind == QD_PIPE_COPY)
            bad = copy_range(p, it->src_offset, it->src_bytes, at);
        else
            bad = write_fully(p->out->fd, p->pool->out[k % p->pool->out_slots], it->out_bytes, at);
        uint64_t end = at + it->out_bytes, pad = it->pad_to ? (it->pad_to - end % it->pad_to) % it->pad_to : 0;
        while (!bad && pad) {
            uint64_t step = pad < sizeof zeros ? pad : sizeof zeros;
            bad = write_fully(p->out->fd, zeros, step, end);
            end += step, pad -= step;
        }
        double t1 = qd_pipe_clock_s();
        if (bad) {
            char msg[300];
            snprintf(msg, sizeof msg, "writing %s at byte %llu: %s", p->out->path, (unsigned long long)at,
                     strerror(errno));
            fail(r, QD_EIO, msg);
            return NULL;
        }
        pthread_mutex_lock(&r->lock);
        r->write_s += t1 - t0;
        if (k >= 0)
            r->written[k] = 1;
        pthread_cond_broadcast(&r->moved);
        pthread_mutex_unlock(&r->lock);
    }
}

int qd_pipe_run(const struct qd_pipe *p, enum qd_status *status, char *err, size_t errlen)
{
    struct run r = {.p = p, .err = err, .errlen = errlen, .status = QD_OK};
    size_t n1 = (size_t)(p->n ? p->n : 1);
    r.ordinal = malloc(n1 * sizeof *r.ordinal);
    r.item_of = malloc(n1 * sizeof *r.item_of);
    r.offset = malloc(n1 * sizeof *r.offset);
    r.read_done = calloc(n1, 1);
    r.written = calloc(n1, 1);
    pthread_t rt[MAX_READERS], wt[MAX_WRITERS];
    struct reader_arg ra[MAX_READERS];
    int nr = 0, nw = 0;
    if (!r.ordinal || !r.item_of || !r.offset || !r.read_done || !r.written) {
        snprintf(err, errlen, "no memory for %d items", p->n);
        r.failed = 1, r.status = QD_ENOMEM;
        goto done;
    }
    uint64_t at = 0; /* every output's place: sizes and padding are known up front */
    for (int i = 0; i < p->n; i++) {
        const struct qd_pipe_item *it = &p->items[i];
        r.offset[i] = at;
        at += it->out_bytes;
        if (it->pad_to)
            at += (it->pad_to - at % it->pad_to) % it->pad_to;
        r.ordinal[i] = -1;
        if (it->kind == QD_PIPE_PROCESS) {
            if (it->src_bytes > p->pool->in_cap || it->out_bytes > p->pool->out_cap) {
                snprintf(err, errlen, "internal: item %d outgrows the pipeline's buffers", i);
                r.failed = 1, r.status = QD_EINVAL;
                goto done;
            }
            r.item_of[r.nproc] = i;
            r.ordinal[i] = r.nproc++;
        }
    }
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.moved, NULL);
    for (; nr < p->pool->readers; nr++) {
        ra[nr] = (struct reader_arg){&r, nr};
        if (pthread_create(&rt[nr], NULL, reader, &ra[nr]))
            break;
    }
    for (; nr == p->pool->readers && nw < p->pool->writers; nw++)
        if (pthread_create(&wt[nw], NULL, writer, &r))
            break;
    if (nr < p->pool->readers || nw < p->pool->writers) {
        fail(&r, QD_ENOMEM, "cannot start the pipeline's threads");
        goto join;
    }
    for (int i = 0; i < p->n; i++) {
        if (p->cancel && *p->cancel) {
            char msg[64];
            snprintf(msg, sizeof msg, "convert: cancelled at item %d of %d", i + 1, p->n);
            fail(&r, QD_ECANCELED, msg);
            break;
        }
        int k = r.ordinal[i];
        if (k >= 0) {
            pthread_mutex_lock(&r.lock);
            int stop = wait_until(&r, was_read, k) || wait_until(&r, out_slot_free, k);
            pthread_mutex_unlock(&r.lock);
            if (stop)
                break;
            char msg[1024];
            double t0 = qd_pipe_clock_s();
            enum qd_status s = p->process(p->ctx, i, p->pool->in[k % p->pool->in_slots], p->pool->out[k % p->pool->out_slots], msg,
                                          sizeof msg);
            r.process_s += qd_pipe_clock_s() - t0;
            if (s != QD_OK) {
                fail(&r, s, msg);
                break;
            }
        }
        pthread_mutex_lock(&r.lock);
        r.processed += k >= 0;
        r.handed = i + 1;
        pthread_cond_broadcast(&r.moved);
        pthread_mutex_unlock(&r.lock);
        if (p->handed)
            p->handed(p->ctx, i);
    }
join:
    for (int t = 0; t < nr; t++)
        pthread_join(rt[t], NULL);
    for (int t = 0; t < nw; t++)
        pthread_join(wt[t], NULL);
    pthread_cond_destroy(&r.moved);
    pthread_mutex_destroy(&r.lock);
    if (!r.failed)
        p->out->written = at;
    if (p->stats) {
        p->stats->read_s += r.read_s;
        p->stats->process_s += r.process_s;
        p->stats->write_s += r.write_s;
    }
done:
    free(r.ordinal);
    free(r.item_of);
    free(r.offset);
    free(r.read_done);
    free(r.written);
    *status = r.failed ? r.status : QD_OK;
    return r.failed ? -1 : 0;
}
