/* Building GGUF files byte by byte in tests (include after cmocka.h): a growing buffer, the
 * little-endian writes GGUF is made of, and the header. */
#ifndef QD_TEST_GGUF_BYTES_H
#define QD_TEST_GGUF_BYTES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct buf {
    uint8_t *p;
    size_t n, cap;
};

static inline void put(struct buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        assert_non_null(b->p = realloc(b->p, b->cap));
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static inline void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static inline void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static inline void put_str(struct buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

/* The magic, version 3, and the tensor and key-value counts. */
static inline void gguf_header(struct buf *b, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

#endif
