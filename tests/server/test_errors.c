/* Every error status the service documents, each produced by a request that earns it, each
 * with the JSON error body {"error": {"code", "message"}}. */
#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    struct http r;
    http_do(&s, "POST", "/quantize?fmt=q8_0&dtype=f32&shape=32",
            (const char *const[]){"Authorization: Bearer s3cret", NULL}, x, sizeof x, &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_400_bad_requests),
        cmocka_unit_test(status_404_405_415),
        cmocka_unit_test(status_422_nonfinite_and_shape),
        cmocka_unit_test(status_401_with_a_token),
        cmocka_unit_test(status_413_body_limit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
