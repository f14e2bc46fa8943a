/* The body pool (server/hostmem.c) with a counting allocator standing in for cudaHostAlloc:
 * large buffers are pooled and reused, the byte cap holds, small and over-cap requests fall
 * back to malloc, growing a pooled buffer moves it to malloc, shutdown releases idle buffers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../server/queue/hostmem.h"

static int allocs, releases;
static size_t live;
static void *owned[64];
static size_t owned_size[64];

static void *counting_alloc(size_t n)
{
    void *p = malloc(n);
    for (int i = 0; p && i < 64; i++)
        if (!owned[i]) {
            owned[i] = p, owned_size[i] = n;
            break;
        }
    allocs++;
    live += n;
    return p;
}

static void counting_release(void *p)
{
    for (int i = 0; i < 64; i++)
        if (owned[i] == p) {
            live -= owned_size[i];
            owned[i] = NULL;
        }
    releases++;
    free(p);
}

static int is_owned(void *p)
{
    for (int i = 0; i < 64; i++)
        if (owned[i] == p)
            return 1;
    return 0;
}

static void pool_reuses_caps_and_falls_back(void **state)
{
    (void)state;
    const size_t mib = (size_t)1 << 20;
    qd_hostmem_init(counting_alloc, counting_release, 16 * mib);

    void *small = qd_hostmem_get(1000); /* below the pool's minimum: malloc */
    assert_non_null(small);
    assert_false(is_owned(small));
    qd_hostmem_put(small);

    void *a = qd_hostmem_get(3 * mib); /* pooled, rounded up to 4 MiB */
    assert_true(is_owned(a));
    memset(a, 1, 3 * mib);
    qd_hostmem_put(a);
    void *b = qd_hostmem_get(2 * mib); /* the same buffer again, no new allocation */
    assert_ptr_equal(a, b);
    assert_int_equal(allocs, 1);

    void *c = qd_hostmem_get(8 * mib); /* a second pooled buffer: 12 MiB held */
    assert_true(is_owned(c));
    void *d = qd_hostmem_get(8 * mib); /* over the 16 MiB cap: malloc */
    assert_non_null(d);
    assert_false(is_owned(d));
    assert_int_equal(allocs, 2);
    assert_true(live <= 16 * mib);

    memset(b, 7, 2 * mib);
    void *g = qd_hostmem_grow(b, 2 * mib, 5 * mib); /* pooled buffers are not realloc'd */
    assert_non_null(g);
    assert_false(is_owned(g));
    assert_int_equal(((unsigned char *)g)[2 * mib - 1], 7);
    void *again = qd_hostmem_get(4 * mib); /* b went back to the pool */
    assert_ptr_equal(again, b);

    qd_hostmem_put(again);
    qd_hostmem_put(g);
    qd_hostmem_put(d);
    qd_hostmem_put(c);
    qd_hostmem_put(NULL);
    qd_hostmem_shutdown();
    assert_int_equal(releases, 2);
    assert_int_equal(live, 0);
}

/* While a new buffer is being allocated (pinning is slow), the pool serves others: this
 * allocator gives a buffer back and takes it again from inside the allocation, which would
 * deadlock were the pool's lock held across it (alarm: a failure, not a hang). */
static void *given_back, *taken_again;

static void *busy_alloc(size_t n)
{
    if (given_back) {
        qd_hostmem_put(given_back);
        taken_again = qd_hostmem_get(1 << 20);
    }
    return counting_alloc(n);
}

static void pool_serves_others_while_allocating(void **state)
{
    (void)state;
    const size_t mib = (size_t)1 << 20;
    qd_hostmem_init(busy_alloc, counting_release, 64 * mib);
    alarm(10);
    void *first = qd_hostmem_get(mib);
    assert_true(is_owned(first));
    given_back = first;
    void *second = qd_hostmem_get(16 * mib); /* a new buffer: busy_alloc runs */
    given_back = NULL;
    alarm(0);
    assert_true(is_owned(second));
    assert_ptr_equal(taken_again, first); /* given back and reused during the allocation */
    qd_hostmem_put(taken_again);
    qd_hostmem_put(second);
    qd_hostmem_shutdown();
    assert_int_equal(live, 0);
}

/* A body appended in pieces of every length and alignment (the streaming-store path takes
 * 256 bytes and up, with a head to align and a tail) equals the bytes sent. */
static void append_equals_memcpy(void **state)
{
    size_t n = 1 << 20;
    unsigned char *src = malloc(n), *dst = malloc(n + 64), *want = malloc(n + 64);
    srand(7);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)rand();
    const size_t lens[] = {0, 1, 31, 255, 256, 257, 300, 4095, 4096, 65536 + 77, 131072};
    for (size_t d = 0; d < 64; d += 7)
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            memset(dst, 0x5a, n + 64);
            memset(want, 0x5a, n + 64);
            size_t at = d, from = 0;
            for (int piece = 0; piece < 5 && at + lens[k] <= n; piece++) { /* consecutive pieces */
                qd_hostmem_append(dst + at, src + from + piece, lens[k]);
                memcpy(want + at, src + from + piece, lens[k]);
                at += lens[k];
                from += lens[k];
            }
            assert_memory_equal(dst, want, n + 64); /* nothing before or after is touched */
        }
    free(src);
    free(dst);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(pool_reuses_caps_and_falls_back),
                                       cmocka_unit_test(pool_serves_others_while_allocating),
                                       cmocka_unit_test(append_equals_memcpy)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
