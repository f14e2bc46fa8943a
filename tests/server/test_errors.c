/* Every error status the service documents, each produced by a request that earns it, each
 * with the JSON error body {"error": {"code", "message"}}. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "service.h"

static struct server srv;

static int setup(void **state)
{
    server_start(&srv, NULL);
    return 0;
}

static int teardown(void **state)
{
    assert_int_equal(server_stop(&srv), 0);
    return 0;
}

/* Sends a request; checks the status and the error code in the JSON body. */
static void expect_on(const struct server *s, long status, const char *code, const char *method,
                      const char *path, const char *const *headers, const void *body, size_t len)
{
    struct http r;
    http_do(s, method, path, headers, body, len, &r);
    if (r.status != status)
        fail_msg("%s %s: got %ld, want %ld: %s", method, path, r.status, status, r.body);
    cJSON *j = cJSON_ParseWithLength(r.body, r.len), *e = cJSON_GetObjectItem(j, "error");
    if (!e)
        fail_msg("%s %s: no error object in %s", method, path, r.body);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(e, "code")), code);
    assert_non_null(cJSON_GetStringValue(cJSON_GetObjectItem(e, "message")));
    assert_true(!strncmp(r.content_type, "application/json", 16));
    cJSON_Delete(j);
    http_free(&r);
}

#define expect(...) expect_on(&srv, __VA_ARGS__)

static const char *const json_h[] = {"Content-Type: application/json", NULL};

static void status_400_bad_requests(void **state)
{
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)i / 7 - 9;
    expect(400, "unknown_format", "POST", "/quantize?fmt=q3_k&dtype=f32&shape=256", NULL, x, sizeof x);
    expect(400, "unknown_param", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=256&blocksize=64", NULL, x, sizeof x);
    expect(400, "unknown_param", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=256&colour=red", NULL, x, sizeof x);
    expect(400, "bad_param", "POST", "/quantize?fmt=nf4&dtype=f32&shape=256&blocksize=48", NULL, x, sizeof x);
    expect(400, "unknown_dtype", "POST", "/quantize?fmt=q8_0&dtype=f64&shape=256", NULL, x, sizeof x);
    expect(400, "bad_shape", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=16,-16", NULL, x, sizeof x);
    expect(400, "bad_shape", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=abc", NULL, x, sizeof x);
    expect(400, "length_mismatch", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=512", NULL, x, sizeof x);
    expect(400, "bad_request", "POST", "/quantize?fmt=q8_0", (const char *const[]){"Content-Type: application/octet-stream", NULL}, x, sizeof x);
    expect(400, "bad_json", "POST", "/quantize?fmt=q8_0", json_h, "{\"dtype\":", 9);
    const char *bad64 = "{\"dtype\":\"f32\",\"shape\":[4],\"data\":\"AAAA!AAAAAAAAAAAAAAAAAA=\"}";
    expect(400, "bad_base64", "POST", "/quantize?fmt=q8_0", json_h, bad64, strlen(bad64));
    const char *short64 = "{\"dtype\":\"f32\",\"shape\":[8],\"data\":\"AAAAAAAAAAAAAAAAAAAAAA==\"}";
    expect(400, "length_mismatch", "POST", "/quantize?fmt=q8_0", json_h, short64, strlen(short64));
    const char *nofmt = "{\"dtype\":\"f32\",\"shape\":[4],\"data\":\"AAAAAAAAAAAAAAAAAAAAAA==\"}";
    expect(400, "missing_format", "POST", "/quantize", json_h, nofmt, strlen(nofmt));
    expect(400, "bad_json", "POST", "/dequantize", json_h, "[1,2]", 5);
    expect(400, "bad_safetensors", "POST", "/dequantize", (const char *const[]){"Content-Type: application/octet-stream", NULL},
           "\xff\xff\xff\xff\x00\x00\x00\x00{}", 10);
    expect(400, "bad_op", "POST", "/jobs?op=transmute&fmt=q8_0&dtype=f32&shape=256", NULL, x, sizeof x);
}

/* A raw body (curl --data-binary's form type) whose query lacks shape= is told so, not that it is
 * not JSON; shapes are integers separated by commas, and the message says so. */
static void raw_body_errors_name_what_is_missing(void **state)
{
    float x[64] = {1, 2, 3};
    struct http r;
    http_do(&srv, "POST", "/quantize?fmt=q8_0&dtype=f32", NULL, x, sizeof x, &r);
    if (r.status != 400 || !strstr(r.body, "shape=") || strstr(r.body, "not a JSON object"))
        fail_msg("raw body without shape=: %ld %s", r.status, r.body);
    http_free(&r);
    http_do(&srv, "POST", "/quantize?fmt=q8_0&dtype=f32", (const char *const[]){"Content-Type: application/octet-stream", NULL},
            x, sizeof x, &r);
    if (r.status != 400 || !strstr(r.body, "needs shape="))
        fail_msg("octet-stream body without shape=: %ld %s", r.status, r.body);
    http_free(&r);
    http_do(&srv, "POST", "/quantize?fmt=q8_0&shape=2,32", (const char *const[]){"Content-Type: application/octet-stream", NULL},
            x, sizeof x, &r);
    if (r.status != 400 || !strstr(r.body, "needs dtype="))
        fail_msg("octet-stream body without dtype=: %ld %s", r.status, r.body);
    http_free(&r);
    /* a JSON object with dtype in the query is still JSON, and names the field it lacks */
    const char *j = "{\"data\":\"AAAAAA==\"}";
    http_do(&srv, "POST", "/quantize?fmt=q8_0&dtype=f32", NULL, j, strlen(j), &r);
    if (r.status != 400 || !strstr(r.body, "missing: shape"))
        fail_msg("JSON body without shape: %ld %s", r.status, r.body);
    http_free(&r);
    expect(400, "bad_shape", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=2x32", NULL, x, sizeof x);
    http_do(&srv, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=2x32", NULL, x, sizeof x, &r);
    assert_non_null(strstr(r.body, "separated by commas"));
    http_free(&r);
}

static void status_404_405_415(void **state)
{
    expect(404, "not_found", "GET", "/nope", NULL, NULL, 0);
    expect(404, "not_found", "GET", "/jobs/0123456789abcdef", NULL, NULL, 0);
    expect(404, "not_found", "GET", "/jobs/0123456789abcdef/result", NULL, NULL, 0);
    expect(404, "not_found", "DELETE", "/jobs/0123456789abcdef", NULL, NULL, 0);
    expect(405, "method_not_allowed", "GET", "/quantize", NULL, NULL, 0);
    expect(405, "method_not_allowed", "DELETE", "/formats", NULL, NULL, 0);
    expect(405, "method_not_allowed", "PUT", "/jobs", NULL, "x", 1);
    float x[64] = {1};
    expect(415, "unsupported_media_type", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=64",
           (const char *const[]){"Content-Type: text/plain", NULL}, x, sizeof x);
    expect(415, "unsupported_media_type", "POST", "/dequantize",
           (const char *const[]){"Content-Type: multipart/form-data; boundary=x", NULL}, x, sizeof x);
}

static void status_422_nonfinite_and_shape(void **state)
{
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)i / 3 - 40;
    x[77] = NAN;
    expect(422, "non_finite_input", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=256", NULL, x, sizeof x);
    x[77] = INFINITY;
    expect(422, "non_finite_input", "POST", "/quantize?fmt=nvfp4&dtype=f32&shape=4,64", NULL, x, sizeof x);
    x[77] = 1;
    /* nvfp4 blocks are 16 along the last dim; AWQ groups of 128 */
    expect(422, "unsupported_shape", "POST", "/quantize?fmt=nvfp4&dtype=f32&shape=32,8", NULL, x, sizeof x);
    expect(422, "unsupported_shape", "POST", "/quantize?fmt=awq&dtype=f32&shape=4,64", NULL, x, sizeof x);
    /* and the same found in a JSON body, after the queue */
    const char *j = "{\"dtype\":\"f32\",\"shape\":[2,2],\"data\":\"AACAPwAAgD8AAIA/AACAPw==\"}";
    expect(422, "unsupported_shape", "POST", "/quantize?fmt=mxfp4", json_h, j, strlen(j));
}

static void status_401_with_a_token(void **state)
{
    struct server s;
    const char *flags[] = {"--token", "s3cret", NULL};
    server_start(&s, flags);
    float x[32] = {1, 2, 3};
    expect_on(&s, 401, "unauthorized", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=32", NULL, x, sizeof x);
    expect_on(&s, 401, "unauthorized", "GET", "/formats", (const char *const[]){"Authorization: Bearer wrong", NULL}, NULL, 0);
    expect_on(&s, 401, "unauthorized", "GET", "/formats", (const char *const[]){"Authorization: Bearer s3cre", NULL}, NULL, 0);
    expect_on(&s, 401, "unauthorized", "GET", "/formats", (const char *const[]){"Authorization: Basic s3cret", NULL}, NULL, 0);
    expect_on(&s, 401, "unauthorized", "GET", "/formats", (const char *const[]){"Authorization: Bearers3cret", NULL}, NULL, 0);
    struct http r;
    /* a 401 names the scheme it wants (RFC 9110, 11.6.1) */
    http_do(&s, "GET", "/formats", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 401);
    assert_string_equal(r.www_authenticate, "Bearer");
    http_free(&r);
    http_do(&s, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=32",
            (const char *const[]){"Authorization: Bearer s3cret", NULL}, x, sizeof x, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    /* the scheme's name in any case, one or more spaces after it */
    const char *schemes[] = {"Authorization: bearer s3cret", "Authorization: BEARER  s3cret", NULL};
    for (int i = 0; schemes[i]; i++) {
        http_do(&s, "GET", "/formats", (const char *const[]){schemes[i], NULL}, NULL, 0, &r);
        if (r.status != 200)
            fail_msg("%s: got %ld: %s", schemes[i], r.status, r.body);
        http_free(&r);
    }
    /* probes and scrapes stay open */
    http_do(&s, "GET", "/healthz", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    http_do(&s, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "code=\"401\""));
    http_free(&r);
    assert_int_equal(server_stop(&s), 0);
}

static void status_413_body_limit(void **state)
{
    struct server s;
    const char *flags[] = {"--max-body-bytes", "4096", NULL};
    server_start(&s, flags);
    size_t n = 8192;
    float *x = calloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i % 13) - 6;
    expect_on(&s, 413, "body_too_large", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=8192", NULL, x, n * 4);
    /* chunked: no Content-Length, found while reading */
    expect_on(&s, 413, "body_too_large", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=8192",
              (const char *const[]){"Transfer-Encoding: chunked", NULL}, x, n * 4);
    struct http r;
    http_do(&s, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=1024", NULL, x, 4096, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    free(x);
    assert_int_equal(server_stop(&s), 0);
}

/* A JSON body that is not a JSON object (one NUL byte) is refused before an async job is
 * accepted, as the synchronous routes refuse it. */
static void status_400_before_an_async_job_is_accepted(void **state)
{
    expect(400, "bad_json", "POST", "/jobs?op=quantize&fmt=q8_0", json_h, "\0", 1);
    expect(400, "bad_json", "POST", "/jobs?op=dequantize", json_h, "[1]", 3);
    expect(400, "bad_safetensors", "POST", "/jobs?op=dequantize",
           (const char *const[]){"Content-Type: application/octet-stream", NULL}, "\x10\0\0\0\0\0\0\0{}", 10);
}

/* The request limits docs/security.md lists, each refused with its JSON error. */
static void request_limits_are_enforced(void **state)
{
    char path[2048] = "/quantize?fmt=q8_0&dtype=f32&shape=32";
    for (int i = 0; i < 70; i++) /* 73 query arguments: over 64 */
        snprintf(path + strlen(path), sizeof path - strlen(path), "&x%d=1", i);
    expect(400, "bad_request", "POST", path, NULL, "", 0);
    expect(400, "bad_shape", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=1,1,1,1,1,1,1,1,32", NULL, "", 0);
    expect(400, "bad_shape", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=4294967296,4294967296,4294967296", NULL,
           "", 0);
    strcpy(path, "/jobs?op=quantize&fmt=nvfp4&dtype=f32&shape=32"); /* 17 format parameters: over 16 */
    for (int i = 0; i < 17; i++)
        snprintf(path + strlen(path), sizeof path - strlen(path), "&scale_layout=linear");
    expect(400, "bad_param", "POST", path, NULL, "", 0);
    static char deep[6000]; /* JSON nested 2,000 deep: over cJSON's limit of 1,000 */
    size_t n = 0;
    n += (size_t)sprintf(deep, "{\"dtype\":\"f32\",\"shape\":[32],\"data\":");
    for (int i = 0; i < 2000; i++)
        deep[n++] = '[';
    expect(400, "bad_json", "POST", "/quantize?fmt=q8_0", json_h, deep, n);
}

/* Error messages quote what the client sent; the answer stays valid UTF-8 JSON even when that
 * was not (schemathesis' ST110 found a query key of broken UTF-8 echoed byte for byte). */
static void error_messages_stay_valid_utf8(void **state)
{
    struct http r;
    http_do(&srv, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=32&%F2%9C%B7%C3=1", NULL, "", 0, &r);
    assert_int_equal(r.status, 400);
    for (size_t i = 0; i < r.len; i++)
        assert_true((unsigned char)r.body[i] < 0x80); /* the broken bytes became '?' */
    assert_non_null(strstr(r.body, "unknown_param"));
    http_free(&r);
}

static void status_431_oversized_headers(void **state)
{
    static char big[20000];
    memset(big, 'a', sizeof big - 1);
    memcpy(big, "X-Filler: ", 10);
    expect(431, "headers_too_large", "GET", "/healthz", (const char *const[]){big, NULL}, NULL, 0);
    expect(431, "headers_too_large", "POST", "/quantize?fmt=q8_0&dtype=f32&shape=32",
           (const char *const[]){big, NULL}, "", 0);
}

/* A client that sends its headers and 3 of its 128 body bytes, then nothing: the connection is
 * closed after --conn-timeout, with no answer. */
static void slow_client_is_cut_off_after_the_connection_timeout(void **state)
{
    struct server s;
    const char *flags[] = {"--conn-timeout", "2", NULL};
    server_start(&s, flags);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *req = "POST /quantize?fmt=q8_0&dtype=f32&shape=32 HTTP/1.1\r\nHost: x\r\n"
                      "Content-Type: application/octet-stream\r\nContent-Length: 128\r\n\r\nabc";
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf); /* EOF (or a reset) when the server lets go */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    close(fd);
    assert_true(n <= 0);
    assert_true(waited >= 1.5 && waited < 10);
    /* the service goes on serving */
    struct http r;
    http_do(&s, "GET", "/healthz", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    assert_int_equal(server_stop(&s), 0);
}

/* A client that asks for a large answer and never reads it: the server lets go after the
 * connection timeout with a reset, so the answer left in the kernel's buffers is dropped at
 * once (a plain close would leave it probing the client's zero window for minutes). */
static void unread_answer_is_dropped_with_a_reset(void **state)
{
    struct server s;
    const char *flags[] = {"--conn-timeout", "2", NULL};
    server_start(&s, flags);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    size_t n = 2048 * 2048; /* 16 MiB of f32 in, 5.9 MB of JSON out: more than the socket buffers hold */
    float *x = random_f32(n);
    char head[256];
    int hl = snprintf(head, sizeof head, "POST /quantize?fmt=q8_0&dtype=f32&shape=2048,2048 HTTP/1.1\r\nHost: x\r\n"
                      "Content-Type: application/octet-stream\r\nContent-Length: %zu\r\n\r\n", n * 4);
    assert_int_equal(write(fd, head, (size_t)hl), hl);
    for (size_t off = 0; off < n * 4;) {
        ssize_t w = write(fd, (char *)x + off, n * 4 - off);
        assert_true(w > 0);
        off += (size_t)w;
    }
    free(x);
    sleep(6); /* the answer stalls in the buffers; the server times out after 2 s */
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char buf[65536];
    ssize_t r;
    size_t got = 0;
    while ((r = read(fd, buf, sizeof buf)) > 0)
        got += (size_t)r;
    int e = errno;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    close(fd);
    printf("# unread answer: %zu bytes read after the timeout, then %s after %.2f s\n", got,
           r == 0 ? "EOF" : strerror(e), waited);
    assert_true(r < 0 && e == ECONNRESET);
    assert_true(waited < 2);
    assert_int_equal(server_stop(&s), 0);
}

/* Sends text a byte every 200 ms until the server closes the connection; the seconds that took
 * (or 60 when it never did). */
static double trickle_until_cut(const struct server *s, const char *text)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double waited = 60;
    for (size_t i = 0;; i = (i + 1) % strlen(text)) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double now = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
        char buf[256];
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
            send(fd, text + i, 1, MSG_NOSIGNAL) < 0) { /* closed: EOF, a reset or EPIPE */
            waited = now;
            break;
        }
        if (now > 30)
            break;
        usleep(200 * 1000);
    }
    close(fd);
    return waited;
}

/* A client trickling its headers (never idle for --conn-timeout) is cut once the headers are
 * --conn-timeout + 1 s late; one trickling its body once it averages under 8 KiB/s past
 * --conn-timeout; both are counted in /metrics, and the service goes on serving. */
static void trickling_clients_are_cut_off(void **state)
{
    struct server s;
    const char *flags[] = {"--conn-timeout", "1", NULL};
    server_start(&s, flags);
    double headers = trickle_until_cut(&s, "POST /quantize?fmt=q8_0&dtype=f32&shape=32 HTTP/1.1\r\nX-Slow: "
                                           "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    if (!(headers >= 1.5 && headers < 6))
        fail_msg("trickled headers: cut after %.1f s (expected 2-3 s)", headers);
    char body_req[512];
    snprintf(body_req, sizeof body_req, "POST /quantize?fmt=q8_0&dtype=f32&shape=32 HTTP/1.1\r\nHost: x\r\n"
             "Content-Type: application/octet-stream\r\nContent-Length: 128\r\n\r\n");
    int fd = socket(AF_INET, SOCK_STREAM, 0); /* the headers at once, then the body a byte at a time */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, body_req, strlen(body_req), 0), (ssize_t)strlen(body_req));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double body = 60;
    for (int i = 0; i < 150; i++) {
        char buf[256];
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) || send(fd, "x", 1, MSG_NOSIGNAL) < 0) {
            body = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
            break;
        }
        usleep(200 * 1000);
    }
    close(fd);
    if (!(body >= 1.0 && body < 5))
        fail_msg("trickled body: cut after %.1f s (expected 1-2 s)", body);
    struct http r;
    http_do(&s, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "quantd_slow_clients_cut_total 2\n"));
    http_free(&r);
    /* ordinary requests, a moment apart, still go through */
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)i / 7 - 2;
    for (int i = 0; i < 3; i++) {
        http_do(&s, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=32", NULL, x, sizeof x, &r);
        assert_int_equal(r.status, 200);
        http_free(&r);
        usleep(600 * 1000);
    }
    assert_int_equal(server_stop(&s), 0);
}

/* /metrics once it holds line (a request is counted when its connection completes, just after
 * the client has its answer), polled for up to 2 s; the last scrape into m either way. */
static int metrics_show(struct http *m, const char *line)
{
    for (int i = 0;; i++) {
        http_do(&srv, "GET", "/metrics", NULL, NULL, 0, m);
        const int shown = m->status == 200 && strstr(m->body, line) != NULL;
        if (shown || i == 100)
            return shown;
        http_free(m);
        usleep(20 * 1000);
    }
}

/* /metrics labels a dequantize with the format its body names. */
static void metrics_label_dequantize_with_the_body_format(void **state)
{
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = (float)i / 9 - 3;
    struct http q, d, m;
    http_do(&srv, "POST", "/quantize?fmt=q5_1&dtype=f32&shape=64", NULL, x, sizeof x, &q);
    assert_int_equal(q.status, 200);
    http_do(&srv, "POST", "/dequantize?dtype=f32", json_h, q.body, q.len, &d);
    assert_int_equal(d.status, 200);
    http_free(&d);
    http_do(&srv, "POST", "/jobs?op=dequantize", json_h, q.body, q.len, &d);
    assert_int_equal(d.status, 202);
    assert_true(metrics_show(&m, "quantd_requests_total{op=\"jobs\",fmt=\"q5_1\",code=\"202\"}"));
    assert_non_null(strstr(m.body, "quantd_requests_total{op=\"dequantize\",fmt=\"q5_1\",code=\"200\"}"));
    http_free(&q);
    http_free(&d);
    http_free(&m);
}

/* Polls an async job until its result is no longer 409 (still running); returns that answer. */
static void job_result(const struct server *s, const char *location, struct http *r)
{
    char path[256];
    snprintf(path, sizeof path, "%s/result", location);
    for (int i = 0; i < 2000; i++) {
        http_do(s, "GET", path, NULL, NULL, 0, r);
        if (r->status != 409)
            return;
        http_free(r);
        usleep(5000);
    }
    fail_msg("%s: still running after 10 s", path);
}

/* The job store's limits: a result over --result-max-bytes becomes 507 result_too_large (its
 * synchronous twin still answers), and --max-jobs jobs known at once refuse the next with 503
 * queue_full until one is deleted or outlives --result-ttl. */
static void async_store_limits(void **state)
{
    struct server s;
    const char *flags[] = {"--result-max-bytes", "4000", "--max-jobs", "2", "--result-ttl", "2", NULL};
    server_start(&s, flags);
    size_t n = 4096;
    float *x = random_f32(n);
    struct http big, small, r;
    http_do(&s, "POST", "/jobs?op=quantize&fmt=q8_0&dtype=f32&shape=4096", NULL, x, n * 4, &big);
    assert_int_equal(big.status, 202);
    job_result(&s, big.location, &r);
    if (r.status != 507 || !strstr(r.body, "\"result_too_large\""))
        fail_msg("4,096 q8_0 values over a 4,000-byte store: got %ld %s", r.status, r.body);
    http_free(&r);
    http_do(&s, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=4096", NULL, x, n * 4, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    http_do(&s, "POST", "/jobs?op=quantize&fmt=q8_0&dtype=f32&shape=32", NULL, x, 32 * 4, &small);
    assert_int_equal(small.status, 202);
    job_result(&s, small.location, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    /* two jobs known: the third is refused */
    expect_on(&s, 503, "queue_full", "POST", "/jobs?op=quantize&fmt=q8_0&dtype=f32&shape=32", NULL, x, 32 * 4);
    http_do(&s, "DELETE", big.location, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 204);
    http_free(&r);
    struct http third;
    http_do(&s, "POST", "/jobs?op=quantize&fmt=q8_0&dtype=f32&shape=32", NULL, x, 32 * 4, &third);
    assert_int_equal(third.status, 202);
    job_result(&s, third.location, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    /* past --result-ttl a finished job is forgotten */
    usleep(2300 * 1000);
    http_do(&s, "GET", small.location, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 404);
    http_free(&r);
    http_free(&third);
    http_free(&big);
    http_free(&small);
    free(x);
    assert_int_equal(server_stop(&s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_400_before_an_async_job_is_accepted),
        cmocka_unit_test(status_431_oversized_headers),
        cmocka_unit_test(error_messages_stay_valid_utf8),
        cmocka_unit_test(request_limits_are_enforced),
        cmocka_unit_test(slow_client_is_cut_off_after_the_connection_timeout),
        cmocka_unit_test(unread_answer_is_dropped_with_a_reset),
        cmocka_unit_test(trickling_clients_are_cut_off),
        cmocka_unit_test(metrics_label_dequantize_with_the_body_format),
        cmocka_unit_test(status_400_bad_requests),
        cmocka_unit_test(raw_body_errors_name_what_is_missing),
        cmocka_unit_test(status_404_405_415),
        cmocka_unit_test(status_422_nonfinite_and_shape),
        cmocka_unit_test(status_401_with_a_token),
        cmocka_unit_test(status_413_body_limit),
        cmocka_unit_test(async_store_limits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
