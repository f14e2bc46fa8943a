/* Memory and time the service spends on a request stay bounded whatever the request holds: a
 * JSON body of 40 MiB of structure and a safetensors model with a 40 MiB header leave the
 * daemon's resident memory (/proc/PID/status) where it was; request bodies held at once stay
 * under --max-inflight-bytes (503 + Retry-After beyond, then served again once room is back);
 * name filters whose repetitions multiply out are refused before they are compiled; a GGUF
 * listing more keys than quantd reads is refused at once; and a small /quantize is answered
 * while conversions fill their own workers. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../checkpoint/gguf_bytes.h"
#include "service.h"

static const char *const json_h[] = {"Content-Type: application/json", NULL};
static const char *const raw_h[] = {"Content-Type: application/octet-stream", NULL};

/* VmRSS or VmHWM of the daemon, in bytes. */
static long long status_bytes(const struct server *s, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)s->pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    long long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':')
            kb = atoll(line + n + 1);
    fclose(f);
    assert_true(kb >= 0);
    return kb * 1024;
}

/* Whether the daemon runs under ASan (make sanitize): its allocator keeps freed memory in a
 * quarantine of up to 256 MB, which the bounds below make room for. */
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

static void expect_error(const struct server *s, const char *path, const char *const *headers, const void *body,
                         size_t len, long status, const char *code, const char *words)
{
    struct http r;
    http_do(s, "POST", path, headers, body, len, &r);
    if (r.status != status || !strstr(r.body, code) || (words && !strstr(r.body, words)))
        fail_msg("POST %.80s: got %ld %s, want %ld %s (%s)", path, r.status, r.body, status, code, words ? words : "");
    http_free(&r);
}

/* ---- JSON and safetensors headers --------------------------------------------------------- */

/* A safetensors file of n one-element F32 tensors (header of about 56 bytes each). */
static char *many_tensor_safetensors(int n, size_t *len)
{
    size_t cap = (size_t)n * 80 + 64, hl = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    h[hl++] = '{';
    for (int i = 0; i < n; i++)
        hl += (size_t)snprintf(h + hl, cap - hl, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                               i ? "," : "", i, 4 * i, 4 * i + 4);
    h[hl++] = '}';
    while (hl % 8)
        h[hl++] = ' ';
    char *f = calloc(1, 8 + hl + 4 * (size_t)n);
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        f[i] = (char)((uint64_t)hl >> (8 * i));
    memcpy(f + 8, h, hl);
    free(h);
    *len = 8 + hl + 4 * (size_t)n;
    return f;
}

/* The base64 of a JSON body is decoded from where it lies in the body, its escapes included
 * ("\/", which some JSON writers send for "/"): the same answer either way. */
static void base64_with_json_escapes_is_read(void **state)
{
    struct server s;
    server_start(&s, NULL);
    const char *plain = "{\"fmt\":\"q8_0\",\"shape\":[1,32],\"tensors\":{\"data\":{\"dtype\":\"u8\",\"shape\":[1,34],"
                        "\"data\":\"KCyQmKCnr7e/xs7W3eXt9PwEDBMbIyoyOkFJUVlgaHB3fw==\"}}}",
               *escaped = "{\"fmt\":\"q8_0\",\"shape\":[1,32],\"tensors\":{\"data\":{\"dtype\":\"u8\",\"shape\":[1,34],"
                          "\"data\":\"KCyQmKCnr7e\\/xs7W3eXt9PwEDBMbIyoyOkFJUVlgaHB3fw==\"}}}";
    struct http a, b;
    http_do(&s, "POST", "/dequantize", json_h, plain, strlen(plain), &a);
    http_do(&s, "POST", "/dequantize", json_h, escaped, strlen(escaped), &b);
    assert_int_equal(a.status, 200);
    assert_int_equal(b.status, 200);
    cJSON *x = cJSON_Parse(a.body), *y = cJSON_Parse(b.body);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(x, "data")),
                        cJSON_GetStringValue(cJSON_GetObjectItem(y, "data")));
    cJSON_Delete(x), cJSON_Delete(y);
    http_free(&a), http_free(&b);
    assert_int_equal(server_stop(&s), 0);
}

static void hostile_json_and_headers_leave_memory_where_it_was(void **state)
{
    struct server s;
    server_start(&s, NULL);
    int asan = sanitized(&s);
    struct http r;
    http_do(&s, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=32", raw_h, (float[32]){0}, 128, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    long long before = status_bytes(&s, "VmRSS");
    /* 40 MiB of JSON structure beside a valid tensor: each array element a cJSON node of ~64
     * bytes, 1.6 GB as one tree (kept afterwards); refused at --max-json-bytes */
    size_t n = (size_t)40 << 20;
    char *body = malloc(n), *zeros = b64_encode((float[32]){0}, 128);
    assert_non_null(body);
    size_t k = (size_t)sprintf(body, "{\"dtype\":\"f32\",\"shape\":[32],\"data\":\"%s\",\"x\":[", zeros);
    while (k + 4 < n)
        body[k++] = '1', body[k++] = ',';
    body[k++] = '1', body[k++] = ']', body[k++] = '}';
    expect_error(&s, "/quantize?fmt=q8_0", json_h, body, k, 413, "json_too_large", "--max-json-bytes");
    /* the same tensor with its structure small: answered */
    k = (size_t)sprintf(body, "{\"dtype\":\"f32\",\"shape\":[32],\"data\":\"%s\",\"params\":{}}", zeros);
    http_do(&s, "POST", "/quantize?fmt=q8_0", json_h, body, k, &r);
    if (r.status != 200)
        fail_msg("%s", r.body);
    http_free(&r);
    free(body);
    free(zeros);
    /* a safetensors model whose header is 40 MiB (700,000 tiny tensors) */
    size_t len;
    char *model = many_tensor_safetensors(700000, &len);
    expect_error(&s, "/convert?fmt=nf4", raw_h, model, len, 400, "bad_request", "over the limit of 16777216");
    free(model);
    long long after = status_bytes(&s, "VmRSS"), peak = status_bytes(&s, "VmHWM");
    printf("# RSS %lld MB before, %lld MB after, peak %lld MB%s\n", before >> 20, after >> 20, peak >> 20,
           asan ? " (ASan)" : "");
    /* the body itself is held once (40 MiB); a tree of it would be 1.6 GB */
    long long slack = asan ? (long long)160 << 20 : (long long)64 << 20;
    assert_true(after - before < slack);
    assert_true(peak - before < slack + ((long long)64 << 20));
    assert_int_equal(server_stop(&s), 0);
}

/* ---- bodies in flight --------------------------------------------------------------------- */

/* A connection that sent its headers (Content-Length: length) and a little of its body. */
/* A connection that sent a POST's headers declaring `length` bytes and none of the body. */
static int stalled_upload_head(const struct server *s, const char *path, size_t length)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[512];
    int n = snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                     "Content-Length: %zu\r\n\r\n", path, length);
    assert_int_equal(write(fd, req, (size_t)n), n);
    return fd;
}

static int stalled_upload(const struct server *s, const char *path, size_t length)
{
    int fd = stalled_upload_head(s, path, length);
    char some[4096] = {0};
    assert_int_equal(write(fd, some, sizeof some), (ssize_t)sizeof some);
    return fd;
}

/* Polls /metrics until `line` appears (the service acts asynchronously on a closed socket). */
static void wait_for_metric(const struct server *s, const char *line)
{
    for (int i = 0; i < 1000; i++) {
        struct http r;
        http_do(s, "GET", "/metrics", NULL, NULL, 0, &r);
        int found = strstr(r.body, line) != NULL;
        http_free(&r);
        if (found)
            return;
        usleep(10000);
    }
    fail_msg("/metrics never showed '%s'", line);
}

static void bodies_in_flight_are_bounded(void **state)
{
    struct server s;
    const char *flags[] = {"--max-inflight-bytes", "3000000", NULL};
    server_start(&s, flags);
    const char *path = "/quantize?fmt=int8&dtype=f32&shape=1000,500"; /* 2,000,000 bytes */
    size_t n = 2000000;
    char *x = calloc(1, n);
    assert_non_null(x);
    int fd = stalled_upload(&s, path, n);
    wait_for_metric(&s, "quantd_inflight_body_bytes 2000000\n");
    /* a second body of that size would pass the limit: 503 + Retry-After, before its body */
    struct http r;
    http_do(&s, "POST", path, raw_h, x, n, &r);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "inflight_limit"));
    assert_string_equal(r.retry_after, "1");
    http_free(&r);
    /* a chunked body is counted as it grows (its buffer doubling from 64 KiB): refused at 2 MiB */
    expect_error(&s, path, (const char *const[]){"Content-Type: application/octet-stream", "Transfer-Encoding: chunked",
                                                 NULL}, x, n, 503, "inflight_limit", "--max-inflight-bytes");
    /* one that could never fit: answered from its Content-Length, before any of the body (a
     * client that sent the body at once could meet the close before it reads the answer) */
    {
        int bfd = stalled_upload_head(&s, "/quantize?fmt=int8&dtype=f32&shape=750016", 3000064);
        char ans[2048];
        size_t got = 0;
        ssize_t k;
        while (got < sizeof ans - 1 && (k = read(bfd, ans + got, sizeof ans - 1 - got)) > 0)
            got += (size_t)k;
        ans[got] = 0;
        close(bfd);
        if (strncmp(ans, "HTTP/1.1 413", 12) || !strstr(ans, "body_too_large") || !strstr(ans, "--max-inflight-bytes"))
            fail_msg("a body that could never fit: got %.300s", ans);
    }
    /* small requests pass beside the stalled one */
    http_do(&s, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=32", raw_h, x, 128, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    close(fd);
    wait_for_metric(&s, "quantd_inflight_body_bytes 0\n");
    http_do(&s, "POST", path, raw_h, x, n, &r);
    if (r.status != 200)
        fail_msg("%s", r.body);
    http_free(&r);
    /* a chunked body whose doubled buffer (4 MiB) would pass the limit, itself under it */
    char *y = calloc(1, 2500000);
    assert_non_null(y);
    http_do(&s, "POST", "/quantize?fmt=int8&dtype=f32&shape=1250,500",
            (const char *const[]){"Content-Type: application/octet-stream", "Transfer-Encoding: chunked", NULL}, y,
            2500000, &r);
    if (r.status != 200)
        fail_msg("%s", r.body);
    http_free(&r);
    free(y);
    http_do(&s, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_non_null(strstr(r.body, "quantd_inflight_body_limit_bytes 3000000\n"));
    assert_non_null(strstr(r.body, "quantd_inflight_body_refused_total 3\n"));
    assert_non_null(strstr(r.body, "quantd_inflight_body_bytes 0\n"));
    http_free(&r);
    free(x);
    assert_int_equal(server_stop(&s), 0);
}

/* ---- conversions -------------------------------------------------------------------------- */

/* A GGUF of n_kv u32 keys and one f32 tensor "blk.0.ffn_up.weight" of rows x 4096. */
static struct buf gguf(int n_kv, uint64_t rows)
{
    struct buf b = {0};
    gguf_header(&b, 1, (uint64_t)n_kv);
    char key[32];
    for (int i = 0; i < n_kv; i++) {
        snprintf(key, sizeof key, "k.%d", i);
        put_str(&b, key);
        put_u32(&b, 4); /* u32 */
        put_u32(&b, (uint32_t)i);
    }
    put_str(&b, "blk.0.ffn_up.weight");
    put_u32(&b, 2);
    put_u64(&b, 4096);
    put_u64(&b, rows);
    put_u32(&b, 0); /* f32 */
    put_u64(&b, 0);
    static const char zeros[32];
    put(&b, zeros, (32 - b.n % 32) % 32);
    size_t data = (size_t)rows * 4096 * 4;
    if (b.n + data > b.cap) {
        b.cap = b.n + data;
        assert_non_null(b.p = realloc(b.p, b.cap));
    }
    for (size_t i = 0; i < data / 4; i++) {
        float v = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
        memcpy(b.p + b.n + 4 * i, &v, 4);
    }
    b.n += data;
    return b;
}

static void name_filters_and_key_counts_are_refused_at_once(void **state)
{
    struct server s;
    char dir[] = "/tmp/quantd-limits-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *flags[] = {"--data-dir", dir, NULL};
    server_start(&s, flags);
    struct buf small = gguf(1, 2);
    /* ((((a{1,50}){1,50}){1,50}){1,50}): 27 s and 8.9 GB to compile, twice */
    expect_error(&s, "/convert?fmt=q8_0&skip=((((a%7B1,50%7D)%7B1,50%7D)%7B1,50%7D)%7B1,50%7D)", raw_h, small.p,
                 small.n, 400, "bad_request", "the limit is 512");
    expect_error(&s, "/convert?fmt=q8_0&only=(a)%5C1", raw_h, small.p, small.n, 400, "bad_request", "back-references");
    const char *job = "{\"source\":\"m.gguf\",\"destination\":\"o.gguf\",\"fmt\":\"q8_0\",\"skip\":\"(a?){2000}\"}";
    expect_error(&s, "/jobs?op=convert", json_h, job, strlen(job), 400, "bad_request", "the limit is 512");
    /* a convert request is JSON and nothing else: over --max-json-bytes before it is read */
    char *pad = malloc(70000);
    assert_non_null(pad);
    int k = snprintf(pad, 70000, "{\"source\":\"m.gguf\",\"destination\":\"o.gguf\",\"fmt\":\"q8_0\",\"skip\":\"");
    memset(pad + k, 'a', 69990 - (size_t)k);
    memcpy(pad + 69990, "\"}", 3);
    expect_error(&s, "/jobs?op=convert", json_h, pad, strlen(pad), 413, "json_too_large", "--max-json-bytes");
    free(pad);
    /* 120,000 keys: 21 s of pairwise duplicate checks per upload; refused at the count */
    struct buf many = gguf(120000, 2);
    expect_error(&s, "/convert?fmt=q8_0", raw_h, many.p, many.n, 400, "bad_request",
                 "quantd reads at most 65536 key/values");
    /* the most keys taken: converted (the duplicate check sorts) */
    struct buf most = gguf(65536, 2);
    struct http r;
    http_do(&s, "POST", "/convert?fmt=q8_0", raw_h, most.p, most.n, &r);
    if (r.status != 200)
        fail_msg("%ld %s", r.status, r.body);
    http_free(&r);
    free(small.p), free(many.p), free(most.p);
    assert_int_equal(server_stop(&s), 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static const char *job_status(const struct server *s, const char *id, char *out, size_t outlen)
{
    char path[512];
    snprintf(path, sizeof path, "/jobs/%s", id);
    struct http r;
    http_do(s, "GET", path, NULL, NULL, 0, &r);
    cJSON *j = cJSON_ParseWithLength(r.body, r.len);
    snprintf(out, outlen, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(j, "status")));
    cJSON_Delete(j);
    http_free(&r);
    return out;
}

/* With one worker for /quantize: conversions queued before a small request do not delay it
 * (they have workers of their own). Shown by order, not time: the /quantize is answered while
 * the last conversion has not finished; sharing the worker, it would wait behind all of them. */
static void small_requests_pass_queued_conversions(void **state)
{
    struct server s;
    char dir[] = "/tmp/quantd-limits-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *flags[] = {"--data-dir", dir, "--workers", "1", NULL};
    server_start(&s, flags);
    struct buf model = gguf(1, 2048); /* a 32 MiB f32 tensor */
    char p[320];
    snprintf(p, sizeof p, "%s/m.gguf", dir);
    assert_int_equal(write_file(p, model.p, model.n), 0);
    free(model.p);
    enum { JOBS = 6 };
    char ids[JOBS][64], body[256], st[32];
    for (int i = 0; i < JOBS; i++) {
        snprintf(body, sizeof body, "{\"source\":\"m.gguf\",\"destination\":\"o%d.gguf\",\"fmt\":\"q4_K\"}", i);
        struct http r;
        http_do(&s, "POST", "/jobs?op=convert", json_h, body, strlen(body), &r);
        if (r.status != 202)
            fail_msg("%ld %s", r.status, r.body);
        cJSON *j = cJSON_ParseWithLength(r.body, r.len);
        snprintf(ids[i], sizeof ids[i], "%s", cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")));
        cJSON_Delete(j);
        http_free(&r);
    }
    float *x = random_f32(32 * 32);
    struct http r;
    http_do(&s, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=32,32", raw_h, x, 32 * 32 * 4, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    free(x);
    int finished = 0;
    for (int i = 0; i < JOBS; i++)
        finished += !strcmp(job_status(&s, ids[i], st, sizeof st), "done");
    printf("# the /quantize was answered when %d of %d conversions had finished\n", finished, JOBS);
    if (finished == JOBS)
        fail_msg("the /quantize was answered after every conversion had finished");
    http_do(&s, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_non_null(strstr(r.body, "quantd_convert_workers 1\n"));
    http_free(&r);
    for (int i = 0; i < JOBS; i++) { /* every conversion still ends */
        for (int t = 0; t < 6000 && strcmp(job_status(&s, ids[i], st, sizeof st), "done"); t++)
            usleep(10000);
        assert_string_equal(st, "done");
    }
    assert_int_equal(server_stop(&s), 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(base64_with_json_escapes_is_read),
        cmocka_unit_test(hostile_json_and_headers_leave_memory_where_it_was),
        cmocka_unit_test(bodies_in_flight_are_bounded),
        cmocka_unit_test(name_filters_and_key_counts_are_refused_at_once),
        cmocka_unit_test(small_requests_pass_queued_conversions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
