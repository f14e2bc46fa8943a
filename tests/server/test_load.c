/* The service under load: 64 concurrent clients, a deliberately tiny queue answering 503, and
 * SIGTERM with jobs in flight answering every one of them. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "service.h"

struct client {
    const struct server *s;
    const char *path;
    const void *body;
    size_t len;
    int repeat;
    const cJSON *want; /* tensors the answer must hold, or NULL */
    long statuses[8];
    int ok, busy, other, wrong_bytes;
    char retry_after[16];
};

static void *client_main(void *arg)
{
    struct client *c = arg;
    for (int i = 0; i < c->repeat; i++) {
        struct http r;
        http_do(c->s, "POST", c->path, NULL, c->body, c->len, &r);
        if (i < 8)
            c->statuses[i] = r.status;
        if (r.status == 200) {
            c->ok++;
            if (c->want) {
                cJSON *j = cJSON_ParseWithLength(r.body, r.len);
                if (!cJSON_Compare(cJSON_GetObjectItem(j, "tensors"), c->want, 1))
                    c->wrong_bytes++;
                cJSON_Delete(j);
            }
        } else if (r.status == 503) {
            c->busy++;
            snprintf(c->retry_after, sizeof c->retry_after, "%s", r.retry_after);
        } else
            c->other++;
        http_free(&r);
    }
    return NULL;
}

/* One thread per client. */
static void start_clients(struct client *c, pthread_t *th, int n)
{
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, client_main, &c[i]);
}

/* Waits for every client; returns the requests answered 200. */
static int join_clients(struct client *c, pthread_t *th, int n)
{
    int ok = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        ok += c[i].ok;
    }
    return ok;
}

/* Reference answers computed one at a time before the load. */
static cJSON *reference(const struct server *s, const char *path, const void *body, size_t len)
{
    struct http r;
    http_do(s, "POST", path, NULL, body, len, &r);
    assert_int_equal(r.status, 200);
    cJSON *j = cJSON_ParseWithLength(r.body, r.len);
    cJSON *t = cJSON_DetachItemFromObject(j, "tensors");
    cJSON_Delete(j);
    http_free(&r);
    return t;
}

static void sixty_four_concurrent_clients_without_error(void **state)
{
    struct server s;
    server_start(&s, NULL);
    enum { NC = 64, NIN = 4 };
    const char *paths[NIN] = {"/quantize?fmt=q4_0&dtype=f32&shape=32,256",
                              "/quantize?fmt=nvfp4&dtype=f32&shape=32,256",
                              "/quantize?fmt=nf4&dtype=f32&shape=32,256",
                              "/quantize?fmt=mxfp8_e4m3&dtype=f32&shape=32,256"};
    float *in[NIN];
    cJSON *want[NIN];
    for (int i = 0; i < NIN; i++) {
        in[i] = random_f32(32 * 256);
        want[i] = reference(&s, paths[i], in[i], 32 * 256 * 4);
    }
    struct client c[NC];
    pthread_t th[NC];
    for (int i = 0; i < NC; i++)
        c[i] = (struct client){.s = &s, .path = paths[i % NIN], .body = in[i % NIN],
                               .len = 32 * 256 * 4, .repeat = 4, .want = want[i % NIN]};
    start_clients(c, th, NC);
    int ok = join_clients(c, th, NC);
    for (int i = 0; i < NC; i++)
        assert_int_equal(c[i].busy + c[i].other + c[i].wrong_bytes, 0);
    assert_int_equal(ok, NC * 4);
    for (int i = 0; i < NIN; i++) {
        cJSON_Delete(want[i]);
        free(in[i]);
    }
    assert_int_equal(server_stop(&s), 0);
}

static void tiny_queue_answers_503_with_retry_after(void **state)
{
    struct server s;
    const char *flags[] = {"--workers", "1", "--queue-depth", "1", NULL};
    server_start(&s, flags);
    enum { NC = 16 };
    size_t n = 1 << 20;
    float *x = random_f32(n);
    struct client c[NC];
    pthread_t th[NC];
    for (int i = 0; i < NC; i++)
        c[i] = (struct client){.s = &s, .path = "/quantize?fmt=nf4&dtype=f32&shape=1024,1024",
                               .body = x, .len = n * 4, .repeat = 2};
    start_clients(c, th, NC);
    /* while the queue is full, liveness and metrics still answer */
    struct http h;
    http_do(&s, "GET", "/healthz", NULL, NULL, 0, &h);
    assert_int_equal(h.status, 200);
    http_free(&h);
    http_do(&s, "GET", "/metrics", NULL, NULL, 0, &h);
    assert_int_equal(h.status, 200);
    http_free(&h);
    int ok = join_clients(c, th, NC), busy = 0;
    for (int i = 0; i < NC; i++) {
        busy += c[i].busy;
        assert_int_equal(c[i].other, 0);
        if (c[i].busy)
            assert_string_equal(c[i].retry_after, "1");
    }
    printf("# tiny queue: %d answered, %d refused with 503\n", ok, busy);
    assert_true(ok >= 1);
    assert_true(busy >= 1);
    http_do(&s, "GET", "/metrics", NULL, NULL, 0, &h);
    assert_non_null(strstr(h.body, "code=\"503\""));
    http_free(&h);
    free(x);
    assert_int_equal(server_stop(&s), 0);
}

/* The value of a metric line "name value" in a /metrics body. */
static double metric(const char *body, const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(body, key);
    return p ? atof(p + strlen(key)) : -1;
}

static void sigterm_answers_every_accepted_job(void **state)
{
    struct server s;
    const char *flags[] = {"--workers", "1", "--queue-depth", "64", NULL};
    server_start(&s, flags);
    enum { NC = 12 };
    size_t n = 1 << 20;
    float *x = random_f32(n);
    const char *path = "/quantize?fmt=nf4&dtype=f32&shape=1024,1024";
    cJSON *want = reference(&s, path, x, n * 4);
    struct client c[NC];
    pthread_t th[NC];
    for (int i = 0; i < NC; i++)
        c[i] = (struct client){.s = &s, .path = path, .body = x, .len = n * 4, .repeat = 1, .want = want};
    start_clients(c, th, NC);
    /* wait until every job is accepted (queued, running or answered), then stop the server; a
     * job between its worker and its answer is briefly in none of the counts, never in two */
    int accepted = 0;
    for (int i = 0; i < 5000 && accepted < NC; i++) {
        struct http m;
        http_do(&s, "GET", "/metrics", NULL, NULL, 0, &m);
        double done = metric(m.body, "quantd_requests_total{op=\"quantize\",fmt=\"nf4\",code=\"200\"}") - 1;
        accepted = (int)(metric(m.body, "quantd_queue_depth") + metric(m.body, "quantd_jobs_running") + done);
        http_free(&m);
        usleep(1000);
    }
    assert_true(accepted >= NC);
    kill(s.pid, SIGTERM);
    int ok = join_clients(c, th, NC);
    for (int i = 0; i < NC; i++)
        assert_int_equal(c[i].wrong_bytes, 0);
    printf("# SIGTERM with %d jobs accepted: %d answered 200\n", NC, ok);
    assert_int_equal(ok, NC); /* nothing accepted is lost */
    int status;
    assert_int_equal(waitpid(s.pid, &status, 0), s.pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* and nothing listens any more */
    struct http r;
    http_do(&s, "GET", "/healthz", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 0);
    http_free(&r);
    cJSON_Delete(want);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sixty_four_concurrent_clients_without_error),
        cmocka_unit_test(tiny_queue_answers_503_with_retry_after),
        cmocka_unit_test(sigterm_answers_every_accepted_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
