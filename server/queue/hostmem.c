/* The body pool: a small table of large buffers, each free or in use; a request takes the smallest
 * free one that fits, or a new one while the pool is under its byte cap, or falls back to
 * malloc (so the pool bounds pinned memory, not the service). */
#include "queue/hostmem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 64

static struct slot {
    void *p;
    size_t cap;
    int in_use;
    int filling; /* reserved: its buffer is being allocated, outside the lock */
} slots[SLOTS];
static size_t held, limit;
static void *(*pool_alloc)(size_t);
static void (*pool_release)(void *);
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

void qd_hostmem_init(void *(*alloc)(size_t), void (*release)(void *), size_t cap_bytes)
{
    pool_alloc = alloc;
    pool_release = release;
    limit = cap_bytes;
}

static struct slot *slot_of(void *p)
{
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].p == p)
            return &slots[i];
    return NULL;
}

void *qd_hostmem_get(size_t n)
{
    if (!pool_alloc || n < QD_HOSTMEM_MIN)
        return malloc(n ? n : 1);
    pthread_mutex_lock(&lock);
    struct slot *best = NULL, *empty = NULL;
    for (int i = 0; i < SLOTS; i++) {
        struct slot *s = &slots[i];
        if (!s->p && !s->filling && !empty)
            empty = s;
        else if (s->p && !s->in_use && s->cap >= n && (!best || s->cap < best->cap))
            best = s;
    }
    if (best) {
        best->in_use = 1;
        pthread_mutex_unlock(&lock);
        return best->p;
    }
    size_t cap = 0;
    if (empty && held + n <= limit) {
        /* round up to 8 MiB so that buffers of nearby sizes are shared */
        size_t step = (size_t)8 << 20;
        cap = (n + step - 1) / step * step;
        if (held + cap > limit)
            cap = n;
        empty->filling = 1;
        held += cap;
    }
    pthread_mutex_unlock(&lock);
    if (!cap)
        return malloc(n);
    /* pinning takes about half a second per GB: done outside the lock, so that the requests
     * already holding buffers give them back and take others meanwhile */
    void *p = pool_alloc(cap);
    pthread_mutex_lock(&lock);
    empty->filling = 0;
    if (p)
        *empty = (struct slot){.p = p, .cap = cap, .in_use = 1};
    else
        held -= cap;
    pthread_mutex_unlock(&lock);
    return p ? p : malloc(n);
}

void qd_hostmem_put(void *p)
{
    if (!pool_alloc) { /* no pool (CPU backend): everything is malloc'd */
        free(p);
        return;
    }
    if (!p)
        return;
    pthread_mutex_lock(&lock);
    struct slot *s = slot_of(p);
    if (s)
        s->in_use = 0;
    pthread_mutex_unlock(&lock);
    if (!s)
        free(p);
}

void *qd_hostmem_grow(void *p, size_t len, size_t new_cap)
{
    if (!pool_alloc || !p)
        return realloc(p, new_cap);
    pthread_mutex_lock(&lock);
    int pooled = slot_of(p) != NULL;
    pthread_mutex_unlock(&lock);
    if (!pooled)
        return realloc(p, new_cap);
    void *q = malloc(new_cap);
    if (!q)
        return NULL;
    memcpy(q, p, len);
    qd_hostmem_put(p);
    return q;
}

static _Atomic size_t inflight_bytes, inflight_limit = SIZE_MAX;

void qd_hostmem_inflight_init(size_t limit_bytes) { inflight_limit = limit_bytes; }

int qd_hostmem_reserve(size_t n)
{
    size_t have = atomic_load(&inflight_bytes);
    do {
        if (n > inflight_limit || have > inflight_limit - n)
            return -1;
    } while (!atomic_compare_exchange_weak(&inflight_bytes, &have, have + n));
    return 0;
}

void qd_hostmem_release(size_t n) { atomic_fetch_sub(&inflight_bytes, n); }

void qd_hostmem_inflight(struct qd_hostmem_inflight *s)
{
    s->bytes = atomic_load(&inflight_bytes);
    s->limit = inflight_limit;
}

void qd_hostmem_shutdown(void)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].p && !slots[i].in_use) {
            pool_release(slots[i].p);
            held -= slots[i].cap;
            slots[i] = (struct slot){0};
        }
    pthread_mutex_unlock(&lock);
}

/* Streaming stores write whole cache lines without reading them first and leave the cache to
 * the data still to be used: a request body is written once here and next read by the device's
 * copy engine, never by this core. */
#if defined(__AVX2__)
#include <immintrin.h>
void qd_hostmem_append(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    if (n < 256) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 128; d += 128, s += 128, n -= 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s), b = _mm256_loadu_si256((const __m256i *)(s + 32)),
                c = _mm256_loadu_si256((const __m256i *)(s + 64)), e = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
        _mm256_stream_si256((__m256i *)(d + 64), c);
        _mm256_stream_si256((__m256i *)(d + 96), e);
    }
    memcpy(d, s, n);
    _mm_sfence(); /* the streamed lines are visible before anything this thread does next */
}
#else
void qd_hostmem_append(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif
