/* GPU fault injection (make test-faults, on a GPU machine): bin/quantd-faults is the daemon built
 * with QD_FAULTS, where QUANTD_FAULT=KIND:N makes the N-th event of KIND fail with the error the
 * CUDA runtime really returns (server/queue/backend_cuda.c). Each case runs a daemon with one
 * fault and checks what its clients see: the failed request gets a JSON 503 with Retry-After,
 * the daemon stays up, the requests after it get the CPU backend's bytes, a sticky error takes
 * the device out (/readyz 503 when none is left, quantd_device_healthy 0), a lost slot leaves
 * the others serving, and an accepted job is answered, never dropped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "../server/service.h"
#include "http/decode.h"

enum { ROWS = 256, COLS = 512 };
static const char *QUERY = "/quantize?fmt=nvfp4&dtype=bf16&shape=256,512";
static const char *BIN_H[] = {"Content-Type: application/octet-stream", "Accept: application/octet-stream", NULL};

static struct server cpu_srv;
static uint16_t *input;
static struct http want; /* the CPU backend's answer */

static void start(struct server *s, const char *backend, const char *fault, const char *const *flags)
{
    setenv("QUANTD_TEST_BACKEND", backend, 1);
    if (fault)
        setenv("QUANTD_FAULT", fault, 1);
    else
        unsetenv("QUANTD_FAULT");
    server_start(s, flags);
}

static int setup(void **state)
{
    float *x = random_f32((size_t)ROWS * COLS);
    input = malloc((size_t)ROWS * COLS * 2);
    f32_to_bf16(x, input, (size_t)ROWS * COLS);
    free(x);
    start(&cpu_srv, "cpu", NULL, NULL);
    http_do(&cpu_srv, "POST", QUERY, BIN_H, input, (size_t)ROWS * COLS * 2, &want);
    return want.status == 200 ? 0 : -1;
}

static int teardown(void **state)
{
    http_free(&want);
    free(input);
    return server_stop(&cpu_srv);
}

/* 1 when r carries the CPU backend's components byte for byte */
static int same_as_cpu(const struct http *r)
{
    struct qd_st_tensor a[QD_ST_MAX_TENSORS], b[QD_ST_MAX_TENSORS];
    cJSON *ma = NULL, *mb = NULL;
    char err[256];
    int na = qd_safetensors_parse((const unsigned char *)want.body, want.len, 0, a, QD_ST_MAX_TENSORS, &ma, err, sizeof err);
    int nb = qd_safetensors_parse((const unsigned char *)r->body, r->len, 0, b, QD_ST_MAX_TENSORS, &mb, err, sizeof err);
    int same = na > 0 && na == nb;
    for (int i = 0; same && i < na; i++)
        same = !strcmp(a[i].name, b[i].name) && a[i].bytes == b[i].bytes && !memcmp(a[i].data, b[i].data, a[i].bytes);
    cJSON_Delete(ma);
    cJSON_Delete(mb);
    return same;
}

/* The answer is a JSON error with this status and code (and Retry-After on a 503). */
static void assert_error(const struct http *r, long status, const char *code)
{
    if (r->status != status)
        fail_msg("expected %ld %s, got %ld: %.300s", status, code, r->status, r->body ? r->body : "");
    cJSON *o = cJSON_ParseWithLength(r->body, r->len);
    assert_non_null(o);
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "code"));
    assert_non_null(c);
    assert_string_equal(c, code);
    printf("#   %ld %s: %s\n", status, c,
           cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")));
    cJSON_Delete(o);
    if (status == 503)
        assert_string_equal(r->retry_after, "1");
}

static long quantize(const struct server *s, struct http *r)
{
    http_do(s, "POST", QUERY, BIN_H, input, (size_t)ROWS * COLS * 2, r);
    return r->status;
}

/* n requests that must all be served with the CPU's bytes */
static void serves(const struct server *s, int n)
{
    for (int i = 0; i < n; i++) {
        struct http r;
        assert_int_equal(quantize(s, &r), 200);
        assert_true(same_as_cpu(&r));
        http_free(&r);
    }
}

static long get_status(const struct server *s, const char *path, char *body, size_t cap)
{
    struct http r;
    http_do(s, "GET", path, NULL, NULL, 0, &r);
    long st = r.status;
    if (body)
        snprintf(body, cap, "%s", r.body ? r.body : "");
    http_free(&r);
    return st;
}

/* the value of quantd_device_healthy for a slot, -1 when absent */
static int slot_healthy(const struct server *s, int slot)
{
    static char text[1 << 16];
    assert_int_equal(get_status(s, "/metrics", text, sizeof text), 200);
    char key[64];
    snprintf(key, sizeof key, "slot=\"%d\"} ", slot);
    const char *p = strstr(text, "quantd_device_healthy{");
    for (; p; p = strstr(p + 1, "quantd_device_healthy{")) {
        const char *k = strstr(p, key), *nl = strchr(p, '\n');
        if (k && (!nl || k < nl))
            return atoi(k + strlen(key));
    }
    return -1;
}

static int log_has(const struct server *s, const char *needle)
{
    size_t n;
    char *text = read_file(s->log, &n);
    int found = text && strstr(text, needle);
    free(text);
    return found;
}

/* POST /jobs and poll it to its end: returns the job's http_status (answered, never lost). */
static int async_job(const struct server *s, char *code, size_t codelen)
{
    struct http post;
    http_do(s, "POST", "/jobs?op=quantize&fmt=nvfp4&dtype=bf16&shape=256,512", BIN_H, input,
            (size_t)ROWS * COLS * 2, &post);
    assert_int_equal(post.status, 202);
    char path[160];
    snprintf(path, sizeof path, "%s", post.location);
    http_free(&post);
    for (int i = 0; i < 2000; i++) {
        char body[4096];
        assert_int_equal(get_status(s, path, body, sizeof body), 200);
        cJSON *o = cJSON_Parse(body);
        const char *st = cJSON_GetStringValue(cJSON_GetObjectItem(o, "status"));
        if (st && strcmp(st, "queued") && strcmp(st, "running")) {
            int http_status = cJSON_GetObjectItem(o, "http_status")->valueint;
            cJSON_Delete(o);
            char result[192];
            snprintf(result, sizeof result, "%s/result", path);
            struct http r;
            http_do(s, "GET", result, NULL, NULL, 0, &r);
            assert_int_equal(r.status, http_status);
            cJSON *e = cJSON_ParseWithLength(r.body, r.len);
            const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "code"));
            snprintf(code, codelen, "%s", c ? c : "");
            if (http_status == 200)
                assert_true(same_as_cpu(&r));
            cJSON_Delete(e);
            http_free(&r);
            return http_status;
        }
        cJSON_Delete(o);
        usleep(5000);
    }
    fail_msg("job %s never ended", path);
    return 0;
}

static void device_allocation_failure_is_a_clean_503(void **state)
{
    struct server s;
    start(&s, "cuda", "device-alloc:1", NULL);
    struct http r;
    quantize(&s, &r);
    assert_error(&r, 503, "out_of_memory");
    http_free(&r);
    assert_true(log_has(&s, "injected fault fires"));
    serves(&s, 4);
    assert_int_equal(get_status(&s, "/readyz", NULL, 0), 200);
    assert_int_equal(slot_healthy(&s, 0), 1);
    assert_int_equal(server_stop(&s), 0);
}

/* Pinned memory holds bodies of 1 MiB and more (a failure there falls back to pageable memory)
 * and each worker's staging for the rest (a failure there fails the job: this test's 256 KiB
 * requests): the first few pinned allocations fail in turn; every answer is the CPU's bytes or
 * a clean 503, at least one is the 503, and the requests after it are served. */
static void pinned_allocation_failure_is_a_clean_503_or_a_fallback(void **state)
{
    int errors = 0;
    for (int n = 1; n <= 4; n++) {
        struct server s;
        char fault[32];
        snprintf(fault, sizeof fault, "pinned-alloc:%d", n);
        start(&s, "cuda", fault, (const char *const[]){"--workers", "1", NULL});
        int ok = 0, failed = 0;
        for (int i = 0; i < 4; i++) {
            struct http r;
            if (quantize(&s, &r) == 200) {
                assert_true(same_as_cpu(&r));
                ok++;
            } else {
                assert_error(&r, 503, "out_of_memory");
                failed++;
            }
            http_free(&r);
        }
        int fired = log_has(&s, "injected fault fires");
        printf("# %s: fired %d, %d served, %d refused with 503\n", fault, fired, ok, failed);
        errors += failed;
        serves(&s, 2);
        assert_int_equal(server_stop(&s), 0);
    }
    assert_true(errors >= 1);
}

static void launch_error_fails_one_request_and_the_device_serves_on(void **state)
{
    struct server s;
    start(&s, "cuda", "launch:1", NULL);
    struct http r;
    quantize(&s, &r);
    assert_error(&r, 503, "device_error");
    assert_non_null(strstr(r.body, "launch"));
    http_free(&r);
    serves(&s, 4);
    char code[64];
    assert_int_equal(async_job(&s, code, sizeof code), 200);
    assert_int_equal(get_status(&s, "/readyz", NULL, 0), 200);
    assert_int_equal(slot_healthy(&s, 0), 1);
    assert_int_equal(server_stop(&s), 0);
}

/* A kernel that traps: the context on that GPU is lost for good. With one GPU nothing is left:
 * /readyz says so, /healthz stays up (a restart is the orchestrator's call), every later request
 * and job is answered 503 at once. */
static void sticky_error_takes_the_only_device_out(void **state)
{
    struct server s;
    start(&s, "cuda", "sticky:2", NULL);
    serves(&s, 1);
    struct http r;
    quantize(&s, &r);
    assert_error(&r, 503, "device_error");
    http_free(&r);
    char body[1024];
    assert_int_equal(get_status(&s, "/readyz", body, sizeof body), 503);
    assert_non_null(strstr(body, "device_unhealthy"));
    assert_int_equal(get_status(&s, "/healthz", NULL, 0), 200);
    assert_int_equal(slot_healthy(&s, 0), 0);
    for (int i = 0; i < 3; i++) {
        quantize(&s, &r);
        assert_error(&r, 503, "device_error");
        http_free(&r);
    }
    char code[64];
    assert_int_equal(async_job(&s, code, sizeof code), 503);
    assert_string_equal(code, "device_error");
    assert_int_equal(server_stop(&s), 0);
}

/* One GPU named twice (--devices 0,0) stands in for two; the injected loss of one slot leaves
 * the other serving every request and job, and /readyz stays 200. */
static void lost_slot_leaves_the_other_serving(void **state)
{
    struct server s;
    start(&s, "cuda", "sticky-slot:1", (const char *const[]){"--devices", "0,0", "--workers", "4", NULL});
    struct http r;
    quantize(&s, &r);
    assert_error(&r, 503, "device_error");
    http_free(&r);
    serves(&s, 12);
    char code[64];
    for (int i = 0; i < 4; i++)
        assert_int_equal(async_job(&s, code, sizeof code), 200);
    assert_int_equal(get_status(&s, "/readyz", NULL, 0), 200);
    int a = slot_healthy(&s, 0), b = slot_healthy(&s, 1);
    printf("# slots healthy: %d %d\n", a, b);
    assert_int_equal(a + b, 1);
    assert_int_equal(server_stop(&s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_allocation_failure_is_a_clean_503),
        cmocka_unit_test(pinned_allocation_failure_is_a_clean_503_or_a_fallback),
        cmocka_unit_test(launch_error_fails_one_request_and_the_device_serves_on),
        cmocka_unit_test(sticky_error_takes_the_only_device_out),
        cmocka_unit_test(lost_slot_leaves_the_other_serving),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
