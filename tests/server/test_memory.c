/* The daemon's heap: bounded arenas, and the free memory of a burst given back once idle
 * (server/service/serve.c); the heap figures of /metrics. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "service.h"

static const char *const raw_h[] = {"Content-Type: application/octet-stream", NULL};

static long long rss_bytes(const struct server *s)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)s->pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = atoll(line + 6);
    fclose(f);
    assert_true(kb >= 0);
    return kb * 1024;
}

/* Whether the daemon runs under ASan: its allocator, not glibc's, holds the memory then. */
static int sanitized(const struct server *s)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)s->pid);
    FILE *f = fopen(path, "r");
    int asan = 0;
    while (f && !asan && fgets(line, sizeof line, f))
        asan = strstr(line, "libasan") != NULL;
    if (f)
        fclose(f);
    return asan;
}

/* A gauge of /metrics (the whole line's value), or -1 when it is not there. */
static double gauge(const struct server *s, const char *name)
{
    struct http r;
    http_do(s, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    double v = -1;
    size_t n = strlen(name);
    for (const char *p = r.body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ')
            v = atof(p + n + 1);
    http_free(&r);
    return v;
}

#define BURST_THREADS 12
#define BURST_REQUESTS 6
#define BURST_ROWS 768 /* 768 x 1024 f32: 3 MiB, under the mmap threshold (4 MiB): from the arenas */

struct burst {
    const struct server *s;
    const float *x;
    int ok;
};

static void *burst_main(void *arg)
{
    struct burst *b = arg;
    for (int i = 0; i < BURST_REQUESTS; i++) {
        struct http r;
        http_do(b->s, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=768,1024", raw_h, b->x,
                (size_t)BURST_ROWS * 1024 * sizeof(float), &r);
        b->ok += r.status == 200 || r.status == 503;
        http_free(&r);
    }
    return NULL;
}

static void heap_of_a_burst_is_given_back_once_idle(void **state)
{
    struct server s;
    /* the CPU backend, whatever the suite runs on: the arenas are what this checks, and the CUDA
     * backend keeps its page-locked body pool (--pinned-bytes, test_hostmem) resident by design */
    server_start(&s, (const char *const[]){"--queue-depth", "64", "--backend", "cpu", NULL});
    float *x = random_f32((size_t)BURST_ROWS * 1024);
    assert_non_null(x);
    long long before = rss_bytes(&s);
    pthread_t th[BURST_THREADS];
    struct burst b[BURST_THREADS];
    for (int i = 0; i < BURST_THREADS; i++) {
        b[i] = (struct burst){.s = &s, .x = x};
        assert_int_equal(pthread_create(&th[i], NULL, burst_main, &b[i]), 0);
    }
    long long peak = 0;
    for (int i = 0; i < BURST_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(b[i].ok, BURST_REQUESTS);
        long long now = rss_bytes(&s);
        peak = now > peak ? now : peak;
    }
    free(x);
    /* every thread of the daemon took its share of the burst; they share two arenas */
    double arenas = gauge(&s, "quantd_heap_arenas"), live = gauge(&s, "quantd_heap_in_use_bytes");
    if (sanitized(&s)) { /* ASan's allocator keeps freed memory in quarantine, glibc's arenas unused */
        printf("# ASan: the heap figures are glibc's (%.0f bytes live), unused; RSS not checked\n", live);
        assert_true(live >= 0);
        assert_int_equal(server_stop(&s), 0);
        return;
    }
    assert_true(live > 0);
    assert_true(arenas >= 1 && arenas <= 2);
    /* idle: the trim comes within a tick of the daemon's main loop (1 s) */
    long long after = rss_bytes(&s);
    for (int i = 0; i < 100 && after - before >= (16 << 20); i++) {
        usleep(100000);
        after = rss_bytes(&s);
    }
    printf("# RSS %lld MB before the burst, %lld MB at its end, %lld MB idle; %.0f arenas, %.1f MB live\n",
           before >> 20, peak >> 20, after >> 20, arenas, live / (1 << 20));
    assert_true(after - before < (16 << 20));
    assert_int_equal(server_stop(&s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(heap_of_a_burst_is_given_back_once_idle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
