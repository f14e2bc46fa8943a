/* POST /jobs?op=convert: a model converted in --data-dir as a job, polled with its progress,
 * its output equal to `quantd convert`'s; paths confined to --data-dir; every refusal a JSON
 * error before the job is accepted; DELETE of a finished job; the conversion metrics. */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "service.h"

static struct server srv, plain;
static char dir[256];

static const char *const json_h[] = {"Content-Type: application/json", NULL};

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/quantd-convert-XXXXXX");
    assert_non_null(mkdtemp(dir));
    /* a small GGUF written by the gguf package (tests/checkpoint/fuzz_seeds): t.weight is a
     * quantizable 2 x 32 f32 matrix */
    size_t n;
    void *seed = read_file("tests/checkpoint/fuzz_seeds/small.gguf", &n);
    assert_non_null(seed);
    char p[320];
    snprintf(p, sizeof p, "%s/model.gguf", dir);
    assert_int_equal(write_file(p, seed, n), 0);
    free(seed);
    snprintf(p, sizeof p, "%s/sub", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/escape", dir);
    assert_int_equal(symlink("/etc", p), 0);
    const char *flags[] = {"--data-dir", dir, NULL}, *small[] = {"--max-convert-bytes", "500", NULL};
    server_start(&srv, flags);
    server_start(&plain, small);
    return 0;
}

static int teardown(void **state)
{
    assert_int_equal(server_stop(&srv), 0);
    assert_int_equal(server_stop(&plain), 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static const char *const raw_h[] = {"Content-Type: application/octet-stream", NULL};

static void expect_error(const struct server *s, long status, const char *code, const char *path, const char *body)
{
    struct http r; /* /jobs takes a JSON request, /convert a model file */
    http_do(s, "POST", path, strncmp(path, "/convert", 8) ? json_h : raw_h, body, strlen(body), &r);
    if (r.status != status)
        fail_msg("%s %s: got %ld, want %ld: %s", path, body, r.status, status, r.body);
    cJSON *j = cJSON_ParseWithLength(r.body, r.len);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")), code);
    cJSON_Delete(j);
    http_free(&r);
}

/* Submits a conversion, polls it to the end, returns the result's status. */
static long convert(const char *path0, const char *body, char *id, size_t idlen)
{
    struct http r;
    http_do(&srv, "POST", path0, json_h, body, strlen(body), &r);
    if (r.status != 202)
        fail_msg("POST /jobs?op=convert %s: %ld %s", body, r.status, r.body);
    cJSON *j = cJSON_ParseWithLength(r.body, r.len);
    snprintf(id, idlen, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "op")), "convert");
    cJSON_Delete(j);
    http_free(&r);
    char path[96];
    snprintf(path, sizeof path, "/jobs/%s", id);
    for (int tries = 0; tries < 500; tries++) {
        http_do(&srv, "GET", path, NULL, NULL, 0, &r);
        j = cJSON_ParseWithLength(r.body, r.len);
        const char *st = cJSON_GetStringValue(cJSON_GetObjectItem(j, "status"));
        int done = st && !strcmp(st, "done");
        if (done) {
            const cJSON *p = cJSON_GetObjectItem(j, "progress");
            assert_non_null(p);
            assert_int_equal(cJSON_GetObjectItem(p, "tensors_done")->valueint,
                             cJSON_GetObjectItem(p, "tensors_total")->valueint);
        }
        cJSON_Delete(j);
        http_free(&r);
        if (done)
            break;
        usleep(10000);
    }
    snprintf(path, sizeof path, "/jobs/%s/result", id);
    http_do(&srv, "GET", path, NULL, NULL, 0, &r);
    long status = r.status;
    http_free(&r);
    return status;
}

static void convert_job_writes_what_the_cli_writes(void **state)
{
    char id[64];
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"model.gguf\", \"destination\": \"sub/out.gguf\", "
                             "\"fmt\": \"q8_0\"}", id, sizeof id),
                     200);
    char out[320], ref[320], src[320], cmd[1200];
    snprintf(out, sizeof out, "%s/sub/out.gguf", dir);
    snprintf(ref, sizeof ref, "%s/ref.gguf", dir);
    snprintf(src, sizeof src, "%s/model.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s convert --in %s --out %s --fmt q8_0 > /dev/null", quantd_bin(), src, ref);
    assert_int_equal(system(cmd), 0);
    size_t a, b;
    void *x = read_file(out, &a), *y = read_file(ref, &b);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(a, b);
    assert_memory_equal(x, y, a);
    free(x), free(y);
    /* a llama-quantize mix as a job: the CLI's file */
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"model.gguf\", \"destination\": \"sub/mix.gguf\", "
                             "\"recipe\": \"Q5_K_M\"}", id, sizeof id),
                     200);
    snprintf(out, sizeof out, "%s/sub/mix.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s convert --in %s --out %s --recipe Q5_K_M > /dev/null", quantd_bin(), src, ref);
    assert_int_equal(system(cmd), 0);
    x = read_file(out, &a), y = read_file(ref, &b);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(a, b);
    assert_memory_equal(x, y, a);
    free(x), free(y);
    /* fmt from the query; a conversion that fails inside the job (q8_1 has no llama.cpp file
     * type) is reported in its result, and DELETE forgets the job */
    assert_int_equal(convert("/jobs?op=convert&fmt=q8_1", "{\"source\": \"model.gguf\", \"destination\": \"q.gguf\"}",
                             id, sizeof id),
                     400);
    struct http r;
    char path[96];
    snprintf(path, sizeof path, "/jobs/%s", id);
    http_do(&srv, "DELETE", path, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 204);
    http_free(&r);
    http_do(&srv, "GET", path, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 404);
    http_free(&r);
    http_do(&srv, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_non_null(strstr(r.body, "quantd_conversions_total{fmt=\"q8_0\",outcome=\"ok\"} 1"));
    assert_non_null(strstr(r.body, "quantd_conversions_total{fmt=\"q8_1\",outcome=\"failed\"} 1"));
    assert_non_null(strstr(r.body, "quantd_convert_tensors_total"));
    http_free(&r);
}

static void convert_refusals_come_before_the_job(void **state)
{
    const char *p = "/jobs?op=convert";
    expect_error(&srv, 403, "forbidden", p, "{\"source\": \"/etc/passwd\", \"destination\": \"o.gguf\", \"fmt\": \"q8_0\"}");
    expect_error(&srv, 403, "forbidden", p, "{\"source\": \"../x.gguf\", \"destination\": \"o.gguf\", \"fmt\": \"q8_0\"}");
    expect_error(&srv, 403, "forbidden", p, "{\"source\": \"sub/../../x\", \"destination\": \"o.gguf\", \"fmt\": \"q8_0\"}");
    expect_error(&srv, 403, "forbidden", p, "{\"source\": \"escape/passwd\", \"destination\": \"o.gguf\", \"fmt\": \"q8_0\"}");
    expect_error(&srv, 403, "forbidden", p, "{\"source\": \"model.gguf\", \"destination\": \"escape/o\", \"fmt\": \"q8_0\"}");
    expect_error(&srv, 403, "forbidden", p, "{\"source\": \"model.gguf\", \"destination\": \"escape\", \"fmt\": \"q8_0\"}");
    expect_error(&srv, 404, "not_found", p, "{\"source\": \"none.gguf\", \"destination\": \"o.gguf\", \"fmt\": \"q8_0\"}");
    expect_error(&srv, 404, "not_found", p, "{\"source\": \"model.gguf\", \"destination\": \"no/o.gguf\", \"fmt\": \"q8_0\"}");
    expect_error(&srv, 400, "unknown_format", p, "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\", \"fmt\": \"x\"}");
    expect_error(&srv, 400, "unknown_format", p, "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\"}");
    expect_error(&srv, 400, "bad_param", p,
                 "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\", \"fmt\": \"nf4\", \"params\": {\"blocksize\": 3}}");
    expect_error(&srv, 400, "bad_request", p, "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\", \"fmt\": \"q8_0\", "
                                              "\"skip\": \"(\"}");
    expect_error(&srv, 400, "bad_request", p, "{\"src\": \"model.gguf\"}");
    expect_error(&srv, 400, "unknown_recipe", p, "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\", \"recipe\": \"Q9\"}");
    expect_error(&srv, 400, "bad_request", p,
                 "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\", \"recipe\": \"Q6_K\", \"fmt\": \"q6_K\"}");
    expect_error(&srv, 400, "bad_json", p, "[1, 2]");
    expect_error(&srv, 400, "bad_json", p, "");
    expect_error(&plain, 403, "forbidden", p, "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\", \"fmt\": \"q8_0\"}");
    struct http r;
    http_do(&srv, "POST", p, raw_h, "x", 1, &r);
    assert_int_equal(r.status, 415);
    http_free(&r);
    char o[320];
    snprintf(o, sizeof o, "%s/o.gguf", dir);
    assert_int_equal(access(o, F_OK), -1); /* nothing was written */
}

/* POST /convert: the model in the body, the converted file as the answer (spooled, not held) */
static void convert_route_answers_the_converted_file(void **state)
{
    size_t n, m;
    void *model = read_file("tests/checkpoint/fuzz_seeds/small.gguf", &n);
    assert_non_null(model);
    struct http r;
    http_do(&srv, "POST", "/convert?fmt=q8_0", raw_h, model, n, &r);
    if (r.status != 200)
        fail_msg("POST /convert: %ld %s", r.status, r.body);
    assert_string_equal(r.content_type, "application/octet-stream");
    char ref[320], src[320], cmd[1000];
    snprintf(ref, sizeof ref, "%s/route-ref.gguf", dir);
    snprintf(src, sizeof src, "%s/model.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s convert --in %s --out %s --fmt q8_0 > /dev/null", quantd_bin(), src, ref);
    assert_int_equal(system(cmd), 0);
    void *want = read_file(ref, &m);
    assert_int_equal(r.len, m);
    assert_memory_equal(r.body, want, m);
    free(want);
    unlink(ref);
    http_free(&r);
    expect_error(&srv, 400, "missing_format", "/convert", "GGUF");
    /* a llama-quantize mix instead of one format: the CLI's file again */
    http_do(&srv, "POST", "/convert?recipe=Q4_K_M", raw_h, model, n, &r);
    if (r.status != 200)
        fail_msg("POST /convert?recipe: %ld %s", r.status, r.body);
    snprintf(cmd, sizeof cmd, "%s convert --in %s --out %s --recipe Q4_K_M > /dev/null", quantd_bin(), src, ref);
    assert_int_equal(system(cmd), 0);
    want = read_file(ref, &m);
    assert_int_equal(r.len, m);
    assert_memory_equal(r.body, want, m);
    free(want);
    unlink(ref);
    http_free(&r);
    expect_error(&srv, 400, "unknown_recipe", "/convert?recipe=Q9_K", "GGUF");
    expect_error(&srv, 400, "bad_request", "/convert?recipe=Q4_K_M&fmt=q4_0", "GGUF");
    expect_error(&srv, 400, "unknown_format", "/convert?fmt=nope", "GGUF");
    expect_error(&srv, 400, "unknown_param", "/convert?fmt=q8_0&blocksize=64", "GGUF");
    http_do(&srv, "POST", "/convert?fmt=q4_0", raw_h, "not a model", 11, &r);
    assert_int_equal(r.status, 400); /* the engine's error, named */
    assert_non_null(strstr(r.body, "gguf"));
    http_free(&r);
    http_do(&srv, "POST", "/convert?fmt=q4_0", json_h, "{}", 2, &r);
    assert_int_equal(r.status, 415);
    http_free(&r);
    http_do(&plain, "POST", "/convert?fmt=q8_0", raw_h, model, n, &r);
    assert_int_equal(r.status, 413); /* --max-convert-bytes */
    http_free(&r);
    free(model);
    /* nothing spooled is left: the data directory holds what the tests put there */
    char ls[400];
    snprintf(ls, sizeof ls, "ls -A %s | grep -q quantd", dir);
    assert_int_not_equal(system(ls), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(convert_job_writes_what_the_cli_writes),
        cmocka_unit_test(convert_refusals_come_before_the_job),
        cmocka_unit_test(convert_route_answers_the_converted_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
