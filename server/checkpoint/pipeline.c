/* The three-stage conversion pipeline of pipeline.h. All progress is counters under one lock:
 * processed item k (the k-th PROCESS item) reads into input slot k % IN_SLOTS and writes into
 * output slot k % OUT_SLOTS, so a stage waits only for the slot it needs. */
#define _GNU_SOURCE
#include "checkpoint/pipeline.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define IN_SLOTS 3
#define OUT_SLOTS 3

struct run {
    const struct qd_pipe *p;
    pthread_mutex_t lock;
    pthread_cond_t moved;
    int read_k, processed_k, written_k; /* PROCESS items read, processed, written */
    int handed;                         /* items handed to the writer */
    int failed;
    enum qd_status status;
    char *err;
    size_t errlen;
    void *in[IN_SLOTS], *out[OUT_SLOTS];
    int *ordinal;                       /* item -> its k among PROCESS items, or -1 */
    double read_s, process_s, write_s;  /* busy time per stage (each written by its own thread) */
};

static double seconds(void)
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

/* Waits until *counter > want (or a failure); 0 when it is. */
static int wait_for(struct run *r, const int *counter, int want)
{
    pthread_mutex_lock(&r->lock);
    while (!r->failed && *counter <= want)
        pthread_cond_wait(&r->moved, &r->lock);
    int ok = !r->failed;
    pthread_mutex_unlock(&r->lock);
    return ok ? 0 : -1;
}

static void bump(struct run *r, int *counter)
{
    pthread_mutex_lock(&r->lock);
    (*counter)++;
    pthread_cond_broadcast(&r->moved);
    pthread_mutex_unlock(&r->lock);
}

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

static void *reader(void *arg)
{
    struct run *r = arg;
    const struct qd_pipe *p = r->p;
    for (int i = 0, k = 0; i < p->n; i++) {
        if (p->items[i].kind != QD_PIPE_PROCESS)
            continue;
        if (wait_for(r, &r->processed_k, k - IN_SLOTS)) /* its slot is free */
            return NULL;
        double t0 = seconds();
        int bad = read_fully(p->src_fd, r->in[k % IN_SLOTS], p->items[i].src_bytes, p->items[i].src_offset);
        r->read_s += seconds() - t0;
        if (bad) {
            char msg[128];
            snprintf(msg, sizeof msg, "reading the input at byte %llu: %s",
                     (unsigned long long)p->items[i].src_offset, errno ? strerror(errno) : "it ended early");
            fail(r, QD_EIO, msg);
            return NULL;
        }
        bump(r, &r->read_k);
        k++;
    }
    return NULL;
}

/* Copies a range of the input to the output in the kernel, or through a buffer where the two
 * file systems cannot (copy_file_range's EXDEV and kin). */
static int copy_range(struct run *r, uint64_t off, uint64_t n)
{
    const struct qd_pipe *p = r->p;
    char *buf = NULL;
    while (n) {
        loff_t in_off = (loff_t)off;
        ssize_t c = buf ? -1 : copy_file_range(p->src_fd, &in_off, p->out->fd, NULL, n, 0);
        if (c > 0) {
            off += (uint64_t)c, n -= (uint64_t)c;
            p->out->written += (uint64_t)c;
            continue;
        }
        if (c < 0 && errno == EINTR)
            continue;
        if (!buf && !(buf = malloc(8u << 20)))
            return -1;
        uint64_t step = n < (8u << 20) ? n : (8u << 20);
        if (read_fully(p->src_fd, buf, step, off) || qd_outfile_write(p->out, buf, step, r->err, r->errlen)) {
            free(buf);
            return -1;
        }
        off += step, n -= step;
    }
    free(buf);
    return 0;
}

static void *writer(void *arg)
{
    struct run *r = arg;
    const struct qd_pipe *p = r->p;
    char err[512];
    for (int i = 0; i < p->n; i++) {
        if (wait_for(r, &r->handed, i))
            return NULL;
        const struct qd_pipe_item *it = &p->items[i];
        int bad = 0;
        double t0 = seconds();
        if (it->kind == QD_PIPE_BYTES)
            bad = qd_outfile_write(p->out, it->bytes, it->out_bytes, err, sizeof err);
        else if (it->kind == QD_PIPE_COPY) {
            bad = copy_range(r, it->src_offset, it->src_bytes);
            if (bad)
                snprintf(err, sizeof err, "copying to %s: %s", p->out->path, strerror(errno));
        } else
            bad = qd_outfile_write(p->out, r->out[r->ordinal[i] % OUT_SLOTS], it->out_bytes, err, sizeof err);
        if (!bad && it->pad_to)
            bad = qd_outfile_pad(p->out, it->pad_to, err, sizeof err);
        r->write_s += seconds() - t0;
        if (bad) {
            fail(r, QD_EIO, err);
            return NULL;
        }
        if (it->kind == QD_PIPE_PROCESS)
            bump(r, &r->written_k);
    }
    return NULL;
}

int qd_pipe_run(const struct qd_pipe *p, enum qd_status *status, char *err, size_t errlen)
{
    struct run r = {.p = p, .err = err, .errlen = errlen, .status = QD_OK};
    uint64_t in_cap = 1, out_cap = 1;
    r.ordinal = malloc((size_t)(p->n ? p->n : 1) * sizeof *r.ordinal);
    for (int i = 0, k = 0; r.ordinal && i < p->n; i++) {
        r.ordinal[i] = p->items[i].kind == QD_PIPE_PROCESS ? k++ : -1;
        if (p->items[i].kind == QD_PIPE_PROCESS) {
            in_cap = p->items[i].src_bytes > in_cap ? p->items[i].src_bytes : in_cap;
            out_cap = p->items[i].out_bytes > out_cap ? p->items[i].out_bytes : out_cap;
        }
    }
    /* pinned buffers when the backend has them: the GPU reads and writes them directly */
    void *(*alloc)(size_t) = p->backend && p->backend->host_alloc ? p->backend->host_alloc : malloc;
    void (*release)(void *) = p->backend && p->backend->host_free ? p->backend->host_free : free;
    int ok = r.ordinal != NULL;
    for (int s = 0; s < IN_SLOTS; s++)
        ok &= (r.in[s] = alloc(in_cap)) != NULL;
    for (int s = 0; s < OUT_SLOTS; s++)
        ok &= (r.out[s] = alloc(out_cap)) != NULL;
    pthread_t rt, wt;
    int have_r = 0, have_w = 0;
    if (!ok) {
        snprintf(err, errlen, "no memory for the pipeline's buffers (%d x %llu + %d x %llu bytes)", IN_SLOTS,
                 (unsigned long long)in_cap, OUT_SLOTS, (unsigned long long)out_cap);
        r.failed = 1, r.status = QD_ENOMEM;
        goto done;
    }
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.moved, NULL);
    have_r = pthread_create(&rt, NULL, reader, &r) == 0;
    have_w = have_r && pthread_create(&wt, NULL, writer, &r) == 0;
    if (!have_w) {
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
            if (wait_for(&r, &r.read_k, k) || wait_for(&r, &r.written_k, k - OUT_SLOTS))
                break;
            char msg[1024];
            double t0 = seconds();
            enum qd_status s = p->process(p->ctx, i, r.in[k % IN_SLOTS], r.out[k % OUT_SLOTS], msg, sizeof msg);
            r.process_s += seconds() - t0;
            if (s != QD_OK) {
                fail(&r, s, msg);
                break;
            }
            bump(&r, &r.processed_k);
        }
        bump(&r, &r.handed);
        if (p->handed)
            p->handed(p->ctx, i);
    }
join:
    if (have_r)
        pthread_join(rt, NULL);
    if (have_w)
        pthread_join(wt, NULL);
    pthread_cond_destroy(&r.moved);
    pthread_mutex_destroy(&r.lock);
    if (p->stats) {
        p->stats->read_s += r.read_s;
        p->stats->process_s += r.process_s;
        p->stats->write_s += r.write_s;
    }
done:
    for (int s = 0; s < IN_SLOTS; s++)
        if (r.in[s])
            release(r.in[s]);
    for (int s = 0; s < OUT_SLOTS; s++)
        if (r.out[s])
            release(r.out[s]);
    free(r.ordinal);
    *status = r.failed ? r.status : QD_OK;
    return r.failed ? -1 : 0;
}
