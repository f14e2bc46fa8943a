/* Request bodies: large ones come from a pool of reusable buffers, pinned (page-locked) when the
 * backend can provide them, so that a CUDA worker copies a raw tensor to the device straight
 * from the body (DESIGN.md step 2: no staging copy, no page faults on a fresh allocation). */
#ifndef QD_HOSTMEM_H
#define QD_HOSTMEM_H

#include <stddef.h>

/* Pooled allocation for buffers of at least this many bytes; smaller ones are plain malloc. */
#define QD_HOSTMEM_MIN ((size_t)1 << 20)

/* Sets the pool's allocator (e.g. cudaHostAlloc) and the most bytes it may hold; without it
 * large buffers are malloc'd like small ones. Call once, before serving. */
void qd_hostmem_init(void *(*alloc)(size_t), void (*release)(void *), size_t cap_bytes);
/* A buffer of n bytes (NULL when there is no memory). */
void *qd_hostmem_get(size_t n);
/* Gives a buffer from qd_hostmem_get (or malloc) back. */
void qd_hostmem_put(void *p);
/* A buffer of new_cap bytes holding the first len bytes of p (p is given back); NULL on failure,
 * with p untouched. */
void *qd_hostmem_grow(void *p, size_t len, size_t new_cap);
/* memcpy for a large body arriving in pieces, written with streaming stores where the CPU has
 * them. */
void qd_hostmem_append(void *dst, const void *src, size_t n);
/* Bodies in flight (--max-inflight-bytes): bytes reserved for request bodies from the moment a
 * body is announced (its Content-Length, or each growth of a chunked one) until its buffer is
 * given back, whether it is being received, queued or decoded. reserve: 0, or -1 when n more
 * would pass the limit (nothing reserved then). */
void qd_hostmem_inflight_init(size_t limit_bytes);
int qd_hostmem_reserve(size_t n);
void qd_hostmem_release(size_t n);
struct qd_hostmem_inflight {
    size_t bytes, limit;
};
void qd_hostmem_inflight(struct qd_hostmem_inflight *s);

/* Frees the pool's idle buffers (at exit). */
void qd_hostmem_shutdown(void);

#endif
