/* The conversion pipeline of pipeline.h. The k-th PROCESS item reads into input slot
 * k % in_slots (free once item k - in_slots is processed) and is processed into output slot
 * k % out_slots (free once item k - out_slots is written). Readers take PROCESS items round
 * robin; writers write each item at its offset: the next processed item first (that frees its
 * slot), else the next item that needs no processing (a header, a copied tensor: these overlap
 * the quantizing instead of trailing it). All the bookkeeping is under one lock: a conversion
 * has hundreds of items, not millions.
 *
 * Two ways around copies, each used where it works:
 * - mapped input (pools without pinned buffers, i.e. the CPU backend): the kernels read the
 *   source's page cache through a mapping, faulting the pages in on all their threads (a
 *   reader faulting them in ahead took a core from them: slower on 2 cores); no reader
 *   threads; the processed range is unmapped after, so RSS stays bounded.
 * - direct output (O_DIRECT): whole 4 KiB blocks go from the output slots to the device, with
 *   no copy into the page cache and nothing left to write back at the fsync. A PROCESS item is
 *   placed in its slot at its file offset modulo 4 KiB, so slot and file line up; the blocks an
 *   item shares with its neighbours (its first and last, when partial) are assembled in memory
 *   and written at the end; the padding between items is zeros there already. Where the file
 *   system refuses O_DIRECT (tmpfs), plain writes. */
#define _GNU_SOURCE
#include "checkpoint/pipeline.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


/* One reader or writer thread moves less than a fast disk or the page cache can: a big host gets
 * several of each; a small one (where the same cores run the CPU kernels) one of each.
 * docs/BENCHMARKS.md has the measured rates (QUANTD_CONVERT_READERS/WRITERS override). */
#define DEFAULT_READERS 4
#define DEFAULT_WRITERS 3
#define MAX_READERS 8
#define MAX_WRITERS 8
#define MAX_IN_SLOTS (MAX_READERS + 2 + QD_PIPE_MAX_LANES - 1)
#define OUT_SPARE 6
#define MAX_OUT_SLOTS (MAX_WRITERS + OUT_SPARE + QD_PIPE_MAX_LANES - 1)
#define DIO_ALIGN 4096u         /* O_DIRECT offsets, lengths and addresses */
#define DIO_CHUNK (8u << 20)    /* bytes staged at a time for in-memory and copied items */
/* a copied item is written in pieces of this size by whichever writers are idle, so that one
 * writer copying a large embedding or head is not the conversion's tail */
#define COPY_PIECE (64ull << 20)

/* The slots are allocated where first used, by the thread that uses them: pinning host memory
 * is slow (a fraction of a second per GB), and pinning a CUDA pool's slots all up front would
 * hold the first write back by that long (the output's writing is the conversion's longest
 * stage). */
struct qd_pipe_pool {
    int readers, writers, in_slots, out_slots, lanes;
    int mapped, direct; /* input through a mapping; output with O_DIRECT (when the file allows) */
    void *in[MAX_IN_SLOTS], *out[MAX_OUT_SLOTS];         /* DIO_ALIGN-aligned, or NULL until used */
    void *in_raw[MAX_IN_SLOTS], *out_raw[MAX_OUT_SLOTS]; /* as allocated */
    uint64_t in_cap, out_cap;
    void *(*alloc)(size_t);
    void (*release)(void *);
    void *(*in_alloc)(size_t); /* alloc, or plain memory where a mapped pool is made to read */
    void (*in_release)(void *);
    pthread_mutex_t lock; /* the allocations */
};

/* QUANTD_CONVERT_READERS / QUANTD_CONVERT_WRITERS: the thread counts, for tuning (1..the maximum). */
static int env_count(const char *name, int fallback, int max)
{
    const char *v = getenv(name);
    int n = v ? atoi(v) : 0;
    return n >= 1 && n <= max ? n : fallback;
}

static void *aligned_malloc(size_t n)
{
    void *p = NULL;
    return posix_memalign(&p, DIO_ALIGN, n) ? NULL : p;
}

struct qd_pipe_pool *qd_pipe_pool_new(struct qd_backend *backend, uint64_t in_cap, uint64_t out_cap, int lanes)
{
    lanes = lanes < 1 ? 1 : lanes > QD_PIPE_MAX_LANES ? QD_PIPE_MAX_LANES : lanes;
    struct qd_pipe_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return NULL;
    /* pinned when the backend has them: the GPU reads and writes them directly */
    int pinned = backend && backend->host_alloc;
    pool->alloc = pool->in_alloc = pinned ? backend->host_alloc : aligned_malloc;
    pool->release = pool->in_release = pinned && backend->host_free ? backend->host_free : free;
    pool->mapped = !pinned;
    pool->in_cap = in_cap ? in_cap : 1;
    pool->out_cap = (out_cap ? out_cap : 1) + DIO_ALIGN; /* room to place an item at its offset mod 4 KiB */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    pool->readers = env_count("QUANTD_CONVERT_READERS", cores >= 8 ? DEFAULT_READERS : 1, MAX_READERS);
    pool->writers = env_count("QUANTD_CONVERT_WRITERS", cores >= 8 ? DEFAULT_WRITERS : 1, MAX_WRITERS);
    pool->in_slots = pool->readers + 2 + lanes - 1; /* (each lane holds one item's input and output) */
    pool->lanes = lanes;
    /* beyond one per writer, room for the processing to run ahead of a write that stalls (six
     * measured faster than two on a small GGUF conversion: docs/BENCHMARKS.md); the slots are
     * sized by the largest item but mostly hold small ones */
    pool->out_slots = pool->writers + OUT_SPARE + lanes - 1;
    pool->direct = 1;
    pthread_mutex_init(&pool->lock, NULL);
    return pool;
}

/* Slot s of the input (out = 0) or output buffers, allocated on first use; NULL without memory.
 * The allocation runs outside the lock: with it inside, the readers' first slots were pinned one
 * after another and a lane's first output slot after them all (an 8B GGUF on an H200: its first
 * tensor processed 0.22 s after it was read). */
static void *pool_slot(struct qd_pipe_pool *pool, int out, int s)
{
    void **slot = out ? &pool->out[s] : &pool->in[s], **raw = out ? &pool->out_raw[s] : &pool->in_raw[s];
    pthread_mutex_lock(&pool->lock);
    void *p = *slot;
    pthread_mutex_unlock(&pool->lock);
    if (p)
        return p;
    size_t n = (size_t)(out ? pool->out_cap : pool->in_cap) + DIO_ALIGN; /* aligned whatever alloc gives */
    void *got = (out ? pool->alloc : pool->in_alloc)(n);
    pthread_mutex_lock(&pool->lock);
    if (!*slot && got) {
        *raw = got;
        *slot = (void *)(((uintptr_t)got + DIO_ALIGN - 1) & ~(uintptr_t)(DIO_ALIGN - 1));
        got = NULL;
    }
    p = *slot;
    pthread_mutex_unlock(&pool->lock);
    if (got) /* another thread's came first */
        (out ? pool->release : pool->in_release)(got);
    return p;
}

int qd_pipe_pool_modes(struct qd_pipe_pool *pool, int mapped_input, int direct_output)
{
    if (!mapped_input && pool->mapped) { /* the input buffers a mapped pool goes without */
        pool->in_alloc = aligned_malloc;
        pool->in_release = free;
        pool->mapped = 0;
    }
    pool->direct &= direct_output != 0;
    return 0;
}

void qd_pipe_pool_free(struct qd_pipe_pool *pool)
{
    if (!pool)
        return;
    double t0 = qd_pipe_clock_s();
    for (int s = 0; s < MAX_IN_SLOTS; s++)
        if (pool->in_raw[s])
            pool->in_release(pool->in_raw[s]);
    for (int s = 0; s < MAX_OUT_SLOTS; s++)
        if (pool->out_raw[s])
            pool->release(pool->out_raw[s]);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
    qd_pipe_trace("free", -1, t0, qd_pipe_clock_s(), 0);
}

struct run {
    const struct qd_pipe *p;
    pthread_mutex_t lock;
    pthread_cond_t moved;
    int processed;                    /* PROCESS items processed: all ordinals below it */
    char *done;                       /* per PROCESS ordinal: processed (lanes finish out of order) */
    int next_claim;                   /* the next PROCESS ordinal a lane takes */
    int next_pw, next_free;           /* the next PROCESS ordinal to write; the next other item */
    uint64_t free_done;               /* bytes of item next_free already taken by a writer */
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
    const uint8_t **maps;             /* each source, mapped (pool->mapped), or NULL */
    size_t *map_sizes;
    int n_src;
    int dfd;                          /* the output opened with O_DIRECT, or -1 */
    uint64_t *edge_block;             /* blocks shared between items (or partial), ascending */
    uint8_t *edge_buf;                /* their bytes, DIO_ALIGN each, zeros where no item is */
    int nedge;
};

double qd_pipe_clock_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* QUANTD_PIPE_TRACE set: each stage's span per item on stderr ("pipe STAGE ITEM T0 T1 BYTES",
 * seconds from the first span traced), for finding where a conversion's wall time goes. */
void qd_pipe_trace(const char *stage, int item, double t0, double t1, uint64_t bytes)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* (the first spans may race) */
    static int on = -1;
    static double origin;
    pthread_mutex_lock(&lock);
    if (on < 0) {
        on = getenv("QUANTD_PIPE_TRACE") != NULL;
        origin = t0;
        if (on) /* the origin on CLOCK_MONOTONIC: a caller's own clock places the process around it */
            fprintf(stderr, "pipe-origin %.6f\n", origin);
    }
    pthread_mutex_unlock(&lock);
    if (on)
        fprintf(stderr, "pipe %s %d %.4f %.4f %llu\n", stage, item, t0 - origin, t1 - origin, (unsigned long long)bytes);
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

static int src_fd(const struct qd_pipe *p, const struct qd_pipe_item *it)
{
    return p->src_fds ? p->src_fds[it->src] : p->src_fd;
}

/* The item's source bytes from off, mapped. */
static const uint8_t *mapped(const struct run *r, const struct qd_pipe_item *it, uint64_t off)
{
    return r->maps[r->p->src_fds ? it->src : 0] + it->src_offset + off;
}

/* Lets the mapped range [off, off + n) of the item's source go (the page cache keeps it). */
static void map_release(const struct run *r, const struct qd_pipe_item *it, uint64_t off, uint64_t n)
{
    qd_release_pages(mapped(r, it, off), n);
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
        void *slot = pool_slot(p->pool, 0, k % p->pool->in_slots);
        if (!slot) {
            fail(r, QD_ENOMEM, "no memory for the pipeline's input buffers");
            return NULL;
        }
        int bad = read_fully(src_fd(p, it), slot, it->src_bytes, it->src_offset);
        double t1 = qd_pipe_clock_s();
        if (bad) {
            char msg[160];
            snprintf(msg, sizeof msg, "reading the input at byte %llu: %s", (unsigned long long)it->src_offset,
                     errno ? strerror(errno) : "it ended early");
            fail(r, QD_EIO, msg);
            return NULL;
        }
        qd_pipe_trace("read", r->item_of[k], t0, t1, it->src_bytes);
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
static int copy_range(const struct qd_pipe *p, int fd, uint64_t off, uint64_t n, uint64_t to)
{
    char *buf = NULL;
    while (n) {
        loff_t in_off = (loff_t)off, out_off = (loff_t)to;
        ssize_t c = buf ? -1 : copy_file_range(fd, &in_off, p->out->fd, &out_off, n, 0);
        if (c > 0) {
            off += (uint64_t)c, to += (uint64_t)c, n -= (uint64_t)c;
            continue;
        }
        if (c < 0 && errno == EINTR)
            continue;
        if (!buf && !(buf = malloc(8u << 20)))
            return -1;
        uint64_t step = n < (8u << 20) ? n : (8u << 20);
        if (read_fully(fd, buf, step, off) || write_fully(p->out->fd, buf, step, to)) {
            free(buf);
            return -1;
        }
        off += step, to += step, n -= step;
    }
    free(buf);
    return 0;
}

/* ---- direct output ---------------------------------------------------------------------------- */

static uint8_t *edge(const struct run *r, uint64_t block)
{
    int lo = 0, hi = r->nedge;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (r->edge_block[mid] < block)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < r->nedge && r->edge_block[lo] == block ? r->edge_buf + (size_t)lo * DIO_ALIGN : NULL;
}

/* Output bytes [lo, hi) of one item, where base holds file offset lo rounded down to a block:
 * its whole blocks go to the device, its partial ones into their edge blocks. */
static int emit(const struct run *r, const uint8_t *base, uint64_t lo, uint64_t hi)
{
    const uint64_t A = DIO_ALIGN, f = lo - lo % A;
    if (lo % A) {
        uint64_t b = lo / A, end = hi < (b + 1) * A ? hi : (b + 1) * A;
        uint8_t *e = edge(r, b);
        if (!e)
            return errno = EFAULT, -1;
        memcpy(e + lo % A, base + (lo - f), end - lo);
        lo = end;
    }
    if (lo < hi && hi % A) { /* lo is a block boundary here */
        uint64_t b = (hi - 1) / A;
        uint8_t *e = edge(r, b);
        if (!e)
            return errno = EFAULT, -1;
        memcpy(e, base + (b * A - f), hi - b * A);
        hi = b * A;
    }
    return lo < hi ? write_fully(r->dfd, base + (lo - f), hi - lo, lo) : 0;
}

/* Bytes [lo, hi) of a BYTES or COPY item, staged through scratch in chunks that start on block
 * boundaries (lo is one, or the item's start). */
static int emit_staged(const struct run *r, uint8_t *scratch, const struct qd_pipe_item *it, uint64_t at, uint64_t lo,
                       uint64_t hi)
{
    const struct qd_pipe *p = r->p;
    for (uint64_t c0 = at + lo, c1; c0 < at + hi; c0 = c1) {
        uint64_t f = c0 - c0 % DIO_ALIGN, in = c0 - at;
        c1 = f + DIO_CHUNK < at + hi ? f + DIO_CHUNK : at + hi;
        uint8_t *dst = scratch + (c0 - f);
        if (it->kind == QD_PIPE_BYTES)
            memcpy(dst, (const uint8_t *)it->bytes + in, c1 - c0);
        else if (r->maps) {
            memcpy(dst, mapped(r, it, in), c1 - c0);
            map_release(r, it, in, c1 - c0);
        } else if (read_fully(src_fd(p, it), dst, c1 - c0, it->src_offset + in))
            return -1;
        if (emit(r, scratch, c0, c1))
            return -1;
    }
    return 0;
}

/* Opens the output for O_DIRECT and lists the partial blocks; -1 leaves plain writes. */
static int direct_open(struct run *r, uint64_t total)
{
    const struct qd_pipe *p = r->p;
    if (!p->pool->direct || !p->out->tmp || !total)
        return -1;
    for (int i = 0; i < p->n; i++)
        if (p->items[i].pad_to > DIO_ALIGN) /* a gap could hold a whole block of zeros */
            return -1;
    r->edge_block = malloc((size_t)(2 * p->n) * sizeof *r->edge_block);
    if (!r->edge_block)
        return -1;
    for (int i = 0; i < p->n; i++) {
        uint64_t s = r->offset[i], e = s + p->items[i].out_bytes, b[2] = {s / DIO_ALIGN, (e - 1) / DIO_ALIGN};
        int partial[2] = {s % DIO_ALIGN != 0, e % DIO_ALIGN != 0};
        for (int k = 0; k < 2 && e > s; k++) /* ascending: items are in file order */
            if (partial[k] && (!r->nedge || r->edge_block[r->nedge - 1] != b[k]))
                r->edge_block[r->nedge++] = b[k];
    }
    r->edge_buf = aligned_malloc((size_t)(r->nedge ? r->nedge : 1) * DIO_ALIGN);
    if (!r->edge_buf)
        return -1;
    memset(r->edge_buf, 0, (size_t)r->nedge * DIO_ALIGN);
    r->dfd = open(p->out->tmp, O_WRONLY | O_DIRECT | O_CLOEXEC);
    /* some file systems take the flag and refuse the writes: one block tells */
    if (r->dfd >= 0 && pwrite(r->dfd, r->edge_buf, DIO_ALIGN, 0) != (ssize_t)DIO_ALIGN) {
        close(r->dfd);
        r->dfd = -1;
    }
    return r->dfd >= 0 ? 0 : -1;
}

/* The assembled blocks, then the exact size. */
static int direct_finish(struct run *r, uint64_t total)
{
    for (int k = 0; k < r->nedge; k++)
        if (write_fully(r->dfd, r->edge_buf + (size_t)k * DIO_ALIGN, DIO_ALIGN, r->edge_block[k] * DIO_ALIGN))
            return -1;
    return ftruncate(r->dfd, (off_t)total);
}

/* ---- the stages ------------------------------------------------------------------------------- */

static void *writer(void *arg)
{
    struct run *r = arg;
    const struct qd_pipe *p = r->p;
    static const uint8_t zeros[4096];
    uint8_t *scratch = NULL;
    for (;;) {
        int i = -1;
        uint64_t lo = 0, hi = 0; /* the part of item i this writer takes */
        pthread_mutex_lock(&r->lock);
        while (!r->failed) {
            if (r->next_pw < r->processed) {
                i = r->item_of[r->next_pw++];
                hi = p->items[i].out_bytes;
                break;
            }
            while (r->next_free < p->n && p->items[r->next_free].kind == QD_PIPE_PROCESS)
                r->next_free++;
            if (r->next_free < p->n) { /* a big copy goes in pieces, to as many writers as are idle */
                const struct qd_pipe_item *f = &p->items[r->next_free];
                uint64_t at = r->offset[r->next_free], end = r->free_done + COPY_PIECE;
                end = f->kind != QD_PIPE_COPY ? f->out_bytes : end - (at + end) % DIO_ALIGN; /* a block boundary */
                lo = r->free_done;
                hi = end < f->out_bytes ? end : f->out_bytes;
                i = r->next_free;
                if (hi == f->out_bytes)
                    r->next_free++, r->free_done = 0;
                else
                    r->free_done = hi;
                break;
            }
            if (r->next_pw >= r->nproc) /* all written or being written */
                break;
            pthread_cond_wait(&r->moved, &r->lock);
        }
        pthread_mutex_unlock(&r->lock);
        if (i < 0)
            break;
        const struct qd_pipe_item *it = &p->items[i];
        int k = r->ordinal[i], bad;
        uint64_t at = r->offset[i];
        const uint8_t *slot = k >= 0 ? (const uint8_t *)p->pool->out[k % p->pool->out_slots] : NULL;
        double t0 = qd_pipe_clock_s();
        if (r->dfd >= 0 && it->kind == QD_PIPE_PROCESS)
            bad = emit(r, slot, at, at + it->out_bytes);
        else if (r->dfd >= 0) /* padding: zeros already in the edge blocks */
            bad = (!scratch && !(scratch = aligned_malloc(DIO_CHUNK))) || emit_staged(r, scratch, it, at, lo, hi);
        else {
            if (it->kind == QD_PIPE_BYTES)
                bad = write_fully(p->out->fd, (const uint8_t *)it->bytes + lo, hi - lo, at + lo);
            else if (it->kind == QD_PIPE_COPY)
                bad = copy_range(p, src_fd(p, it), it->src_offset + lo, hi - lo, at + lo);
            else
                bad = write_fully(p->out->fd, slot + at % DIO_ALIGN, it->out_bytes, at);
            uint64_t end = at + it->out_bytes;
            uint64_t pad = hi < it->out_bytes || !it->pad_to ? 0 : (it->pad_to - end % it->pad_to) % it->pad_to;
            while (!bad && pad) {
                uint64_t step = pad < sizeof zeros ? pad : sizeof zeros;
                bad = write_fully(p->out->fd, zeros, step, end);
                end += step, pad -= step;
            }
        }
        double t1 = qd_pipe_clock_s();
        if (bad) {
            char msg[300];
            int e = errno;
            snprintf(msg, sizeof msg, "writing %s at byte %llu: %s", p->out->path, (unsigned long long)(at + lo),
                     strerror(e));
            fail(r, qd_status_of_write(e), msg);
            break;
        }
        qd_pipe_trace("write", i, t0, t1, hi - lo);
        pthread_mutex_lock(&r->lock);
        r->write_s += t1 - t0;
        if (k >= 0)
            r->written[k] = 1;
        pthread_cond_broadcast(&r->moved);
        pthread_mutex_unlock(&r->lock);
    }
    free(scratch);
    return NULL;
}

/* PROCESS ordinal k on a lane: waits for its input and a free output slot, processes it and
 * counts it; 0, or -1 once the run has failed (this item's failure included). */
static int process_one(struct run *r, int lane, int k)
{
    const struct qd_pipe *p = r->p;
    int i = r->item_of[k];
    pthread_mutex_lock(&r->lock);
    int stop = wait_until(r, was_read, k) || wait_until(r, out_slot_free, k);
    pthread_mutex_unlock(&r->lock);
    if (stop)
        return -1;
    const struct qd_pipe_item *it = &p->items[i];
    const void *in = r->maps ? mapped(r, it, 0) : p->pool->in[k % p->pool->in_slots];
    uint8_t *slot = pool_slot(p->pool, 1, k % p->pool->out_slots);
    if (!slot) {
        fail(r, QD_ENOMEM, "no memory for the pipeline's output buffers");
        return -1;
    }
    /* placed at its file offset modulo a block: slot and file line up for O_DIRECT */
    void *out = slot + r->offset[i] % DIO_ALIGN;
    char msg[1024];
    double t0 = qd_pipe_clock_s();
    enum qd_status s = p->process(p->ctx, lane, i, in, out, msg, sizeof msg);
    double t1 = qd_pipe_clock_s();
    qd_pipe_trace("process", i, t0, t1, it->src_bytes);
    if (r->maps)
        map_release(r, it, 0, it->src_bytes);
    if (s != QD_OK) {
        fail(r, s, msg);
        return -1;
    }
    pthread_mutex_lock(&r->lock);
    r->process_s += t1 - t0;
    r->done[k] = 1;
    while (r->processed < r->nproc && r->done[r->processed]) /* the writers take them in order */
        r->processed++;
    pthread_cond_broadcast(&r->moved);
    pthread_mutex_unlock(&r->lock);
    return 0;
}

struct lane_arg {
    struct run *r;
    int lane;
};

/* A lane: takes the next PROCESS ordinal until none is left or the run fails. */
static void *lane_main(void *arg)
{
    struct run *r = ((struct lane_arg *)arg)->r;
    pool_slot(r->p->pool, 1, ((struct lane_arg *)arg)->lane); /* its first output slot while the first reads run */
    for (;;) {
        pthread_mutex_lock(&r->lock);
        int k = r->failed || r->next_claim >= r->nproc ? -1 : r->next_claim++;
        pthread_mutex_unlock(&r->lock);
        if (k < 0 || process_one(r, ((struct lane_arg *)arg)->lane, k))
            return NULL;
    }
}

static int was_processed(struct run *r, int k) { return r->done[k]; }

/* Maps every source (an empty one stays NULL: no item reads from it). */
static int map_source(struct run *r, char *err, size_t errlen)
{
    const struct qd_pipe *p = r->p;
    r->n_src = p->src_fds ? p->n_src : 1;
    r->maps = calloc((size_t)r->n_src, sizeof *r->maps);
    r->map_sizes = calloc((size_t)r->n_src, sizeof *r->map_sizes);
    if (!r->maps || !r->map_sizes) {
        snprintf(err, errlen, "no memory");
        return -1;
    }
    for (int i = 0; i < r->n_src; i++) {
        const int fd = p->src_fds ? p->src_fds[i] : p->src_fd;
        struct stat st;
        if (fstat(fd, &st) < 0) {
            snprintf(err, errlen, "the input: %s", strerror(errno));
            return -1;
        }
        if (!st.st_size)
            continue;
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            snprintf(err, errlen, "the input: mmap: %s", strerror(errno));
            return -1;
        }
        r->maps[i] = m;
        r->map_sizes[i] = (size_t)st.st_size;
    }
    return 0;
}

int qd_pipe_run(const struct qd_pipe *p, enum qd_status *status, char *err, size_t errlen)
{
    struct run r = {.p = p, .err = err, .errlen = errlen, .status = QD_OK, .dfd = -1};
    size_t n1 = (size_t)(p->n ? p->n : 1);
    r.ordinal = malloc(n1 * sizeof *r.ordinal);
    r.item_of = malloc(n1 * sizeof *r.item_of);
    r.offset = malloc(n1 * sizeof *r.offset);
    r.read_done = calloc(n1, 1);
    r.written = calloc(n1, 1);
    r.done = calloc(n1, 1);
    pthread_t rt[MAX_READERS], wt[MAX_WRITERS], lt[QD_PIPE_MAX_LANES];
    struct reader_arg ra[MAX_READERS];
    struct lane_arg la[QD_PIPE_MAX_LANES];
    int nr = 0, nw = 0, nl = 0;
    /* lanes beyond one need the slots a pool made for them */
    const int lanes = p->lanes > 1 ? (p->lanes < p->pool->lanes ? p->lanes : p->pool->lanes) : 1;
    if (!r.ordinal || !r.item_of || !r.offset || !r.read_done || !r.written || !r.done) {
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
            if ((!p->pool->mapped && it->src_bytes > p->pool->in_cap) || it->out_bytes > p->pool->out_cap - DIO_ALIGN) {
                snprintf(err, errlen, "internal: item %d outgrows the pipeline's buffers", i);
                r.failed = 1, r.status = QD_EINVAL;
                goto done;
            }
            r.item_of[r.nproc] = i;
            r.ordinal[i] = r.nproc++;
        }
    }
    if (p->pool->mapped && map_source(&r, err, errlen)) {
        r.failed = 1, r.status = QD_EIO;
        goto done;
    }
    direct_open(&r, at);
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.moved, NULL);
    if (r.maps) /* nothing to read ahead: the input is there */
        memset(r.read_done, 1, n1);
    int readers = r.maps ? 0 : p->pool->readers;
    for (; nr < readers; nr++) {
        ra[nr] = (struct reader_arg){&r, nr};
        if (pthread_create(&rt[nr], NULL, reader, &ra[nr]))
            break;
    }
    for (; nr == readers && nw < p->pool->writers; nw++)
        if (pthread_create(&wt[nw], NULL, writer, &r))
            break;
    for (; nr == readers && nw == p->pool->writers && lanes > 1 && nl < lanes; nl++) {
        la[nl] = (struct lane_arg){&r, nl};
        if (pthread_create(&lt[nl], NULL, lane_main, &la[nl]))
            break;
    }
    if (nr < readers || nw < p->pool->writers || (lanes > 1 && nl < lanes)) {
        fail(&r, QD_ENOMEM, "cannot start the pipeline's threads");
        goto join;
    }
    if (lanes == 1) /* the first output slot while the first reads run */
        pool_slot(p->pool, 1, 0);
    /* items in order: processed here (one lane) or by the lanes, then handed on (progress) */
    for (int i = 0; i < p->n; i++) {
        if (p->cancel && *p->cancel) {
            char msg[64];
            snprintf(msg, sizeof msg, "convert: cancelled at item %d of %d", i + 1, p->n);
            fail(&r, QD_ECANCELED, msg);
            break;
        }
        int k = r.ordinal[i];
        if (k >= 0 && lanes == 1 && process_one(&r, 0, k))
            break;
        if (k >= 0 && lanes > 1) {
            pthread_mutex_lock(&r.lock);
            int stop = wait_until(&r, was_processed, k);
            pthread_mutex_unlock(&r.lock);
            if (stop)
                break;
        }
        if (p->handed)
            p->handed(p->ctx, i);
    }
join:
    for (int t = 0; t < nl; t++)
        pthread_join(lt[t], NULL);
    for (int t = 0; t < nr; t++)
        pthread_join(rt[t], NULL);
    for (int t = 0; t < nw; t++)
        pthread_join(wt[t], NULL);
    pthread_cond_destroy(&r.moved);
    pthread_mutex_destroy(&r.lock);
    if (!r.failed && r.dfd >= 0 && direct_finish(&r, at)) {
        int e = errno;
        snprintf(err, errlen, "writing %s: %s", p->out->path, strerror(e));
        r.failed = 1, r.status = qd_status_of_write(e);
    }
    if (!r.failed)
        p->out->written = at;
    if (p->stats) {
        p->stats->read_s += r.read_s;
        p->stats->process_s += r.process_s;
        p->stats->write_s += r.write_s;
    }
done:
    if (r.dfd >= 0)
        close(r.dfd);
    for (int i = 0; r.maps && i < r.n_src; i++)
        if (r.maps[i])
            munmap((void *)r.maps[i], r.map_sizes[i]);
    free(r.maps);
    free(r.map_sizes);
    free(r.edge_block);
    free(r.edge_buf);
    free(r.ordinal);
    free(r.item_of);
    free(r.offset);
    free(r.read_done);
    free(r.written);
    free(r.done);
    *status = r.failed ? r.status : QD_OK;
    return r.failed ? -1 : 0;
}

int qd_convert_lanes(const struct qd_convert_opts *o)
{
    int n = o->nworkers > QD_PIPE_MAX_LANES ? QD_PIPE_MAX_LANES : o->nworkers;
    return n > 1 && !o->report_error ? n : 1;
}

void qd_convert_use_lane(struct qd_convert_opts *o, int lane)
{
    if (o->nworkers > 1 && lane < o->nworkers)
        o->worker = o->workers[lane];
}

#define QD_PIPE_ROW_THREADS 64

struct row_span {
    int (*fn)(void *ctx, int64_t r0, int64_t r1);
    void *ctx;
    int64_t r0, r1;
    int rc;
};

static void *row_span_main(void *arg)
{
    struct row_span *s = arg;
    s->rc = s->fn(s->ctx, s->r0, s->r1);
    return NULL;
}

int qd_pipe_rows(int64_t rows, int64_t min_rows, int (*fn)(void *ctx, int64_t r0, int64_t r1), void *ctx)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t n = min_rows > 0 ? rows / min_rows : rows;
    n = n < cores ? n : cores;
    n = n < QD_PIPE_ROW_THREADS ? n : QD_PIPE_ROW_THREADS;
    if (n <= 1)
        return fn(ctx, 0, rows);
    struct row_span spans[QD_PIPE_ROW_THREADS];
    pthread_t tid[QD_PIPE_ROW_THREADS];
    int started[QD_PIPE_ROW_THREADS] = {0};
    for (int64_t i = 0; i < n; i++) {
        spans[i] = (struct row_span){fn, ctx, rows * i / n, rows * (i + 1) / n, 0};
        /* span 0 runs here; a thread that cannot start runs its span here too */
        started[i] = i > 0 && !pthread_create(&tid[i], NULL, row_span_main, &spans[i]);
    }
    for (int64_t i = 0; i < n; i++)
        if (!started[i])
            row_span_main(&spans[i]);
    int rc = 0;
    for (int64_t i = 0; i < n; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        rc = rc ? rc : spans[i].rc;
    }
    return rc;
}
