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
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "service.h"

static struct server srv, plain;
static char dir[256];

static void assert_no_server_path(const char *body);

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
    if (strstr(r.body, dir)) /* (the engine names the paths it was given: the server's) */
        fail_msg("the result names a server path: %s", r.body);
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
    snprintf(cmd, sizeof cmd, "%s convert --in %s --out %s --recipe Q5_K_M --force > /dev/null", quantd_bin(), src,
             ref);
    assert_int_equal(system(cmd), 0);
    x = read_file(out, &a), y = read_file(ref, &b);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(a, b);
    assert_memory_equal(x, y, a);
    free(x), free(y);
    /* fmt from the query; a conversion that fails inside the job (the q8_0 output's tensors
     * would need requantizing) is reported in its result, and DELETE forgets the job */
    assert_int_equal(convert("/jobs?op=convert&fmt=q4_0", "{\"source\": \"sub/out.gguf\", \"destination\": \"q.gguf\"}",
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
    assert_non_null(strstr(r.body, "quantd_conversions_total{fmt=\"q4_0\",outcome=\"failed\"} 1"));
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
    expect_error(&srv, 400, "missing_format", p, "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\"}");
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

/* No answer names a path of the server's: the data directory, the spool directory. */
static void assert_no_server_path(const char *body)
{
    if (strstr(body, dir) || strstr(body, "/tmp/") || strstr(body, ".quantd-upload"))
        fail_msg("an answer names a server path: %s", body);
}

/* The error of a refused job request: its status and code, and no server path in it. */
static void expect_refusal(long status, const char *code, const char *body, const char *says)
{
    struct http r;
    http_do(&srv, "POST", "/jobs?op=convert", json_h, body, strlen(body), &r);
    if (r.status != status)
        fail_msg("%s: got %ld, want %ld: %s", body, r.status, status, r.body);
    cJSON *j = cJSON_ParseWithLength(r.body, r.len);
    const cJSON *e = cJSON_GetObjectItem(j, "error");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(e, "code")), code);
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(e, "message"));
    if (says && !strstr(msg, says))
        fail_msg("%s: the message does not say '%s': %s", body, says, msg);
    assert_no_server_path(r.body);
    cJSON_Delete(j);
    http_free(&r);
}

/* A minimal Hugging Face model in dir/name: config.json and a safetensors file with one 2 x 64
 * f32 Linear weight. */
static void write_hf(const char *name)
{
    char p[400], header[160];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/config.json", dir, name);
    assert_int_equal(write_file(p, "{\"model_type\": \"llama\"}", 23), 0);
    int hl = snprintf(header, sizeof header,
                      "{\"model.layers.0.mlp.up_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,64],\"data_offsets\":[0,512]}}");
    size_t n = 8 + (size_t)hl + 512;
    unsigned char *b = calloc(1, n);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, (size_t)hl);
    float *x = random_f32(128);
    memcpy(b + 8 + hl, x, 512);
    snprintf(p, sizeof p, "%s/%s/model.safetensors", dir, name);
    assert_int_equal(write_file(p, b, n), 0);
    free(x);
    free(b);
}

static int has_temporary(const char *d)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "find %s -name '*.quantd-*' | grep -q .", d);
    return system(cmd) == 0;
}

/* The 8-bit layouts as jobs: the format's params choose the layout (FP8_DYNAMIC by default,
 * FineGrainedFP8 with flow=transformers), and FP8's static input scale is refused before the job. */
static void convert_job_fp8_layouts(void **state)
{
    char id[64], p[400];
    write_hf("hf8");
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"hf8\", \"destination\": \"hf8-fp8\", "
                             "\"fmt\": \"fp8_e4m3\"}", id, sizeof id), 200);
    snprintf(p, sizeof p, "%s/hf8-fp8/config.json", dir);
    size_t n;
    char *cfg = read_file(p, &n);
    assert_non_null(cfg);
    assert_non_null(strstr(cfg, "\"float-quantized\""));
    free(cfg);
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"hf8\", \"destination\": \"hf8-fg\", "
                             "\"fmt\": \"fp8_e4m3\", \"params\": {\"flow\": \"transformers\"}}", id, sizeof id), 200);
    snprintf(p, sizeof p, "%s/hf8-fg/config.json", dir);
    cfg = read_file(p, &n);
    assert_non_null(cfg);
    assert_non_null(strstr(cfg, "\"weight_block_size\""));
    free(cfg);
    expect_refusal(400, "bad_request", "{\"source\": \"hf8\", \"destination\": \"hf8-static\", \"fmt\": "
                   "\"fp8_e4m3\", \"params\": {\"granularity\": \"tensor\"}}", "static per-tensor input scale");
}

/* The data directory's confinement has no gaps: every refusal comes before the job (no 202
 * then a 500), and no answer names a server path. */
static void convert_job_confinement_has_no_gaps(void **state)
{
    char p[400], outside[300], q[400];
    write_hf("hf");
    /* a file of the source directory that is a symlink out of the data directory */
    snprintf(outside, sizeof outside, "%s-outside", dir);
    mkdir(outside, 0755);
    snprintf(p, sizeof p, "%s/secret", outside);
    assert_int_equal(write_file(p, "secret", 6), 0);
    snprintf(q, sizeof q, "%s/hf/x.json", dir);
    assert_int_equal(symlink(p, q), 0);
    expect_refusal(403, "forbidden", "{\"source\": \"hf\", \"destination\": \"hf-nf4\", \"fmt\": \"nf4\"}",
                   "hf/x.json");
    unlink(q);
    /* one leading inside is followed */
    snprintf(p, sizeof p, "%s/shared.json", dir);
    assert_int_equal(write_file(p, "{}", 2), 0);
    assert_int_equal(symlink("../shared.json", q), 0);
    char id[64];
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"hf\", \"destination\": \"hf-nf4\", \"fmt\": \"nf4\"}",
                             id, sizeof id), 200);
    snprintf(p, sizeof p, "%s/hf-nf4/x.json", dir);
    size_t n;
    char *copied = read_file(p, &n);
    assert_non_null(copied);
    assert_memory_equal(copied, "{}", 2);
    free(copied);
    /* a NUL in a path is refused, not cut short */
    expect_refusal(400, "bad_request", "{\"source\": \"model.gguf\\u0000.txt\", \"destination\": \"n.gguf\", "
                   "\"fmt\": \"q8_0\"}", "NUL");
    expect_refusal(400, "bad_request", "{\"source\": \"model.gguf\", \"destination\": \"n.gguf\\u0000x\", "
                   "\"fmt\": \"q8_0\"}", "NUL");
    snprintf(p, sizeof p, "%s/n.gguf", dir);
    assert_int_equal(access(p, F_OK), -1);
    /* an existing destination: 409 unless "overwrite" */
    snprintf(p, sizeof p, "%s/taken.gguf", dir);
    assert_int_equal(write_file(p, "mine", 4), 0);
    expect_refusal(409, "exists", "{\"source\": \"model.gguf\", \"destination\": \"taken.gguf\", \"fmt\": \"q8_0\"}",
                   "overwrite");
    char *kept = read_file(p, &n);
    assert_int_equal(n, 4);
    free(kept);
    expect_refusal(409, "exists", "{\"source\": \"hf\", \"destination\": \"hf-nf4\", \"fmt\": \"nf4\"}", "overwrite");
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"model.gguf\", \"destination\": \"taken.gguf\", "
                             "\"fmt\": \"q8_0\", \"overwrite\": true}", id, sizeof id), 200);
    kept = read_file(p, &n);
    assert_true(n > 4);
    free(kept);
    expect_refusal(400, "bad_request", "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\", \"fmt\": \"q8_0\", "
                   "\"overwrite\": 1}", "overwrite");
    /* a name of the other kind, or in another case: which field takes it */
    expect_refusal(400, "unknown_format", "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\", \"fmt\": \"q4_k_m\"}",
                   "recipe Q4_K_M");
    expect_refusal(400, "unknown_recipe", "{\"source\": \"model.gguf\", \"destination\": \"o.gguf\", \"recipe\": \"nf4\"}",
                   "fmt nf4");
    struct http h;
    http_do(&srv, "POST", "/convert?fmt=Q4_K_M", raw_h, "GGUF", 4, &h);
    assert_int_equal(h.status, 400);
    assert_non_null(strstr(h.body, "recipe Q4_K_M"));
    http_free(&h);
    /* a destination under a file, a name too long, the source itself: 400 before the job */
    expect_refusal(400, "bad_request", "{\"source\": \"model.gguf\", \"destination\": \"model.gguf/x.gguf\", "
                   "\"fmt\": \"q8_0\"}", NULL);
    char body[700], name[301];
    memset(name, 'a', 300);
    name[300] = 0;
    snprintf(body, sizeof body, "{\"source\": \"model.gguf\", \"destination\": \"%s\", \"fmt\": \"q8_0\"}", name);
    expect_refusal(400, "bad_request", body, "long");
    memset(name + 246, 0, 1);
    snprintf(body, sizeof body, "{\"source\": \"model.gguf\", \"destination\": \"%s\", \"fmt\": \"q8_0\"}", name);
    expect_refusal(400, "bad_request", body, "temporary");
    expect_refusal(400, "bad_request", "{\"source\": \"model.gguf\", \"destination\": \"model.gguf\", \"fmt\": \"q8_0\", "
                   "\"overwrite\": true}", "is the input");
    /* the source's kind against the format, said before the job */
    expect_refusal(400, "bad_request", "{\"source\": \"hf\", \"destination\": \"hf.gguf\", \"fmt\": \"q4_0\"}",
                   "convert_hf_to_gguf.py");
    expect_refusal(400, "bad_request", "{\"source\": \"model.gguf\", \"destination\": \"m-nf4\", \"fmt\": \"nf4\"}",
                   "is a GGUF file");
    /* a FIFO, as the source or inside a source directory, is refused (never waited on) */
    snprintf(p, sizeof p, "%s/fifo", dir);
    assert_int_equal(mkfifo(p, 0644), 0);
    expect_refusal(400, "bad_request", "{\"source\": \"fifo\", \"destination\": \"f.gguf\", \"fmt\": \"q8_0\"}",
                   "not a regular file");
    write_hf("hf2");
    snprintf(p, sizeof p, "%s/hf2/tokenizer.json", dir);
    assert_int_equal(mkfifo(p, 0644), 0);
    expect_refusal(400, "bad_request", "{\"source\": \"hf2\", \"destination\": \"hf2-nf4\", \"fmt\": \"nf4\"}",
                   "not a regular file");
    /* a failure inside the job names the data directory's paths relative to it */
    write_hf("hf3");
    snprintf(p, sizeof p, "%s/hf3/config.json", dir);
    unlink(p);
    expect_refusal(400, "bad_request", "{\"source\": \"hf3\", \"destination\": \"hf3-nf4\", \"fmt\": \"nf4\"}",
                   "config.json");
    assert_int_equal(write_file(p, "{}", 2), 0);
    snprintf(p, sizeof p, "%s/hf3/model.safetensors", dir);
    assert_int_equal(write_file(p, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10), 0);
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"hf3\", \"destination\": \"hf3-nf4\", \"fmt\": \"nf4\"}",
                             id, sizeof id), 400);
    struct http r;
    snprintf(p, sizeof p, "/jobs/%s/result", id);
    http_do(&srv, "GET", p, NULL, NULL, 0, &r);
    if (!strstr(r.body, "hf3/model.safetensors"))
        fail_msg("the bad file is not named: %s", r.body);
    http_free(&r);
    assert_false(has_temporary(dir));
    snprintf(p, sizeof p, "rm -rf %s", outside);
    assert_int_equal(system(p), 0);
}

/* POST /convert with the wrong kind of model: what it is and what the format reads, and no
 * spool file's name. */
static void convert_route_names_no_server_path(void **state)
{
    size_t n;
    void *model = read_file("tests/checkpoint/fuzz_seeds/small.gguf", &n);
    assert_non_null(model);
    struct http r;
    http_do(&srv, "POST", "/convert?fmt=nf4", raw_h, model, n, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "is a GGUF file"));
    assert_no_server_path(r.body);
    http_free(&r);
    http_do(&srv, "POST", "/convert?fmt=q4_0", raw_h, "not a model", 11, &r);
    assert_int_equal(r.status, 400);
    assert_no_server_path(r.body);
    http_free(&r);
    free(model);
}

/* The MLX layout as a job: a directory without a tokenizer is refused before the job (mlx-lm
 * could not open the output), one with a tokenizer gives the CLI's files; POST /convert (one
 * uploaded file) is refused, naming no server path. */
static void convert_job_writes_mlx_as_the_cli(void **state)
{
    char p[400], ref[400], cmd[1400], id[64];
    write_hf("hfm");
    expect_refusal(400, "bad_request", "{\"source\": \"hfm\", \"destination\": \"hfm-mlx\", \"fmt\": \"mlx_affine\"}",
                   "no tokenizer");
    snprintf(p, sizeof p, "%s/hfm/tokenizer.json", dir);
    assert_int_equal(write_file(p, "{}", 2), 0);
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"hfm\", \"destination\": \"hfm-mlx\", "
                             "\"fmt\": \"mlx_affine\", \"params\": {\"bits\": 3, \"group_size\": 32}}", id, sizeof id),
                     200);
    snprintf(ref, sizeof ref, "%s-mlx-ref", dir);
    snprintf(cmd, sizeof cmd, "%s convert --in %s/hfm --out %s --fmt mlx_affine --param bits=3 --param group_size=32 "
             "> /dev/null", quantd_bin(), dir, ref);
    assert_int_equal(system(cmd), 0);
    static const char *const files[] = {"model.safetensors", "model.safetensors.index.json", "config.json",
                                        "README.md", "tokenizer.json"};
    for (size_t k = 0; k < sizeof files / sizeof *files; k++) {
        size_t a, b;
        char x_path[500], y_path[500];
        snprintf(x_path, sizeof x_path, "%s/hfm-mlx/%s", dir, files[k]);
        snprintf(y_path, sizeof y_path, "%s/%s", ref, files[k]);
        void *x = read_file(x_path, &a), *y = read_file(y_path, &b);
        assert_non_null(x);
        assert_non_null(y);
        assert_int_equal(a, b);
        assert_memory_equal(x, y, a);
        free(x), free(y);
    }
    snprintf(p, sizeof p, "%s/hfm-mlx/config.json", dir);
    size_t n;
    char *config = read_file(p, &n);
    assert_non_null(config);
    assert_non_null(strstr(config, "\"bits\": 3"));
    free(config);
    snprintf(p, sizeof p, "%s/hfm/model.safetensors", dir);
    void *model = read_file(p, &n);
    struct http r;
    http_do(&srv, "POST", "/convert?fmt=mlx_affine", raw_h, model, n, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "not a directory"));
    assert_no_server_path(r.body);
    http_free(&r);
    free(model);
    snprintf(cmd, sizeof cmd, "rm -rf %s", ref);
    assert_int_equal(system(cmd), 0);
}

static void assert_files_equal(const char *x_path, const char *y_path)
{
    size_t a, b;
    void *x = read_file(x_path, &a), *y = read_file(y_path, &b);
    if (!x || !y)
        fail_msg("missing: %s or %s", x_path, y_path);
    assert_int_equal(a, b);
    assert_memory_equal(x, y, a);
    free(x), free(y);
}

/* The string member key of GET path's JSON ("" when absent). */
static void get_string(const char *path, const char *key, char *out, size_t len)
{
    struct http r;
    http_do(&srv, "GET", path, NULL, NULL, 0, &r);
    cJSON *j = cJSON_ParseWithLength(r.body, r.len);
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItem(j, key));
    snprintf(out, len, "%s", v ? v : "");
    cJSON_Delete(j);
    http_free(&r);
}

static void expect_job_fmt(const char *id, const char *fmt)
{
    char path[96], got[64];
    snprintf(path, sizeof path, "/jobs/%s", id);
    get_string(path, "fmt", got, sizeof got);
    assert_string_equal(got, fmt);
    snprintf(path, sizeof path, "/jobs/%s/result", id);
    get_string(path, "fmt", got, sizeof got);
    assert_string_equal(got, fmt);
}

/* Conversions that quantize nothing, as jobs and over POST /convert, write what the CLI writes:
 * a quantized Hugging Face model back to float (fmt bf16|f16|f32, in the body or the query) and
 * llama-quantize's float mixes (F16, BF16, F32, COPY); the job, its summary and the metrics name
 * what they wrote; params, skip and only are refused before the job. */
static void convert_back_to_float_and_float_mixes(void **state)
{
    char id[64], x[500], y[500], ref[400], cmd[1400];
    write_hf("hfb");
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"hfb\", \"destination\": \"hfb-w8\", "
                             "\"fmt\": \"w8a8\"}", id, sizeof id), 200);
    assert_int_equal(convert("/jobs?op=convert", "{\"source\": \"hfb-w8\", \"destination\": \"hfb-bf16\", "
                             "\"fmt\": \"bf16\"}", id, sizeof id), 200);
    expect_job_fmt(id, "bf16");
    assert_int_equal(convert("/jobs?op=convert&fmt=f32", "{\"source\": \"hfb-w8\", \"destination\": "
                             "\"hfb-f32\"}", id, sizeof id), 200);
    expect_job_fmt(id, "f32");
    static const char *const to[] = {"bf16", "f32"}, *const files[] = {"model.safetensors", "config.json"};
    for (int t = 0; t < 2; t++) {
        snprintf(ref, sizeof ref, "%s-%s-ref", dir, to[t]);
        snprintf(cmd, sizeof cmd, "%s convert --in %s/hfb-w8 --out %s --fmt %s > /dev/null", quantd_bin(), dir, ref,
                 to[t]);
        assert_int_equal(system(cmd), 0);
        for (int k = 0; k < 2; k++) {
            snprintf(x, sizeof x, "%s/hfb-%s/%s", dir, to[t], files[k]);
            snprintf(y, sizeof y, "%s/%s", ref, files[k]);
            assert_files_equal(x, y);
        }
        snprintf(cmd, sizeof cmd, "rm -rf %s", ref);
        assert_int_equal(system(cmd), 0);
    }
    expect_refusal(400, "bad_param", "{\"source\": \"hfb-w8\", \"destination\": \"b2\", \"fmt\": \"bf16\", "
                   "\"params\": {\"blocksize\": 64}}", "quantizes nothing");
    expect_refusal(400, "bad_request", "{\"source\": \"hfb-w8\", \"destination\": \"b2\", \"fmt\": \"bf16\", "
                   "\"skip\": \"up_proj\"}", "every quantized weight back");
    expect_refusal(400, "bad_request", "{\"source\": \"hfb\", \"destination\": \"b2\", \"fmt\": \"f16\"}",
                   "not quantized");
    expect_refusal(400, "bad_request", "{\"source\": \"model.gguf\", \"destination\": \"b2\", \"fmt\": \"bf16\"}",
                   "GGUF");
    expect_refusal(400, "bad_param", "{\"source\": \"model.gguf\", \"destination\": \"b2.gguf\", \"recipe\": "
                   "\"F16\", \"params\": {\"blocksize\": 64}}", "quantizes nothing");
    expect_error(&srv, 400, "unknown_format", "/jobs?op=quantize&fmt=bf16", "{}");
    expect_error(&srv, 400, "unknown_format", "/jobs?fmt=", "{}"); /* empty: before any job exists */
    /* llama-quantize's float mixes as jobs: the CLI's file */
    static const char *const mixes[] = {"F16", "BF16", "F32", "COPY"};
    for (int m = 0; m < 4; m++) {
        char body[200];
        snprintf(body, sizeof body, "{\"source\": \"model.gguf\", \"destination\": \"sub/%s.gguf\", "
                 "\"recipe\": \"%s\"}", mixes[m], mixes[m]);
        assert_int_equal(convert("/jobs?op=convert", body, id, sizeof id), 200);
        expect_job_fmt(id, mixes[m]);
        snprintf(ref, sizeof ref, "%s/mix-ref.gguf", dir);
        snprintf(cmd, sizeof cmd, "%s convert --in %s/model.gguf --out %s --recipe %s --force > /dev/null",
                 quantd_bin(), dir, ref, mixes[m]);
        assert_int_equal(system(cmd), 0);
        snprintf(x, sizeof x, "%s/sub/%s.gguf", dir, mixes[m]);
        assert_files_equal(x, ref);
    }
    /* POST /convert: a float mix of the uploaded GGUF; back to float needs a directory */
    size_t n, m;
    void *model = read_file("tests/checkpoint/fuzz_seeds/small.gguf", &n);
    struct http r;
    http_do(&srv, "POST", "/convert?recipe=BF16", raw_h, model, n, &r);
    if (r.status != 200)
        fail_msg("POST /convert?recipe=BF16: %ld %s", r.status, r.body);
    snprintf(cmd, sizeof cmd, "%s convert --in %s/model.gguf --out %s --recipe BF16 --force > /dev/null", quantd_bin(),
             dir, ref);
    assert_int_equal(system(cmd), 0);
    void *want = read_file(ref, &m);
    assert_int_equal(r.len, m);
    assert_memory_equal(r.body, want, m);
    free(want);
    unlink(ref);
    http_free(&r);
    free(model);
    expect_error(&srv, 400, "bad_param", "/convert?recipe=F16&blocksize=64", "GGUF");
    expect_error(&srv, 400, "bad_param", "/convert?fmt=bf16&blocksize=64", "GGUF");
    snprintf(x, sizeof x, "%s/hfb-w8/model.safetensors", dir);
    model = read_file(x, &n);
    http_do(&srv, "POST", "/convert?fmt=bf16", raw_h, model, n, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "model directory"));
    assert_no_server_path(r.body);
    http_free(&r);
    free(model);
    http_do(&srv, "GET", "/metrics", NULL, NULL, 0, &r);
    assert_non_null(strstr(r.body, "quantd_conversions_total{fmt=\"bf16\",outcome=\"ok\"} 1"));
    assert_non_null(strstr(r.body, "quantd_conversions_total{fmt=\"F16\",outcome=\"ok\"} 1"));
    assert_non_null(strstr(r.body, "quantd_conversions_total{fmt=\"BF16\",outcome=\"ok\"} 2"));
    assert_non_null(strstr(r.body, "quantd_conversions_total{fmt=\"bf16\",outcome=\"failed\"} 1"));
    http_free(&r);
}

/* Spool files a killed quantd left are removed when the next one starts: quantd's own names
 * only, and not one a live quantd holds (locked). */
static void stale_spool_files_are_swept_at_start(void **state)
{
    char spool[] = "/tmp/quantd-spool-XXXXXX", p[400];
    assert_non_null(mkdtemp(spool));
    const char *stale[] = {".quantd-upload-AbC123", ".quantd-converted-xyz789"};
    const char *kept[] = {".quantd-upload-Held01", ".quantd-upload-toolong1", "notes.quantd-upload-abcdef",
                          ".quantd-upload-Dir123", "model.gguf"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", spool, stale[i]);
        assert_int_equal(write_file(p, "x", 1), 0);
    }
    int held = -1;
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", spool, kept[i]);
        if (i == 3)
            assert_int_equal(mkdir(p, 0755), 0);
        else
            assert_int_equal(write_file(p, "x", 1), 0);
        if (i == 0) { /* a live quantd's: open and locked */
            held = open(p, O_RDONLY);
            assert_int_equal(flock(held, LOCK_EX), 0);
        }
    }
    struct server s;
    const char *flags[] = {"--data-dir", spool, NULL};
    server_start(&s, flags);
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", spool, stale[i]);
        if (access(p, F_OK) == 0)
            fail_msg("%s was not swept", stale[i]);
    }
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", spool, kept[i]);
        if (access(p, F_OK) != 0)
            fail_msg("%s was removed", kept[i]);
    }
    assert_int_equal(server_stop(&s), 0);
    close(held);
    snprintf(p, sizeof p, "rm -rf %s", spool);
    assert_int_equal(system(p), 0);
}

/* A GGUF of 16 f32 1024 x 1024 weights (64 MiB): its q4_K conversion takes a while on one
 * CPU thread. */
static void write_big_gguf(const char *path)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    const int nt = 16;
    uint32_t u32;
    uint64_t u64;
#define PUT(v) fwrite(&(v), sizeof(v), 1, f)
    fwrite("GGUF", 1, 4, f);
    u32 = 3, PUT(u32);
    u64 = (uint64_t)nt, PUT(u64);
    u64 = 1, PUT(u64);
    const char *key = "general.architecture", *arch = "llama";
    u64 = strlen(key), PUT(u64);
    fwrite(key, 1, strlen(key), f);
    u32 = 8, PUT(u32);
    u64 = strlen(arch), PUT(u64);
    fwrite(arch, 1, strlen(arch), f);
    long info = 0;
    for (int t = 0; t < nt; t++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", t);
        u64 = strlen(name), PUT(u64);
        fwrite(name, 1, strlen(name), f);
        u32 = 2, PUT(u32);
        u64 = 1024, PUT(u64);
        PUT(u64);
        u32 = 0, PUT(u32); /* F32 */
        u64 = (uint64_t)t << 22, PUT(u64);
    }
    info = ftell(f);
    static const char zeros[32];
    fwrite(zeros, 1, (size_t)((32 - info % 32) % 32), f);
#undef PUT
    float *x = random_f32(1u << 20);
    for (int t = 0; t < nt; t++)
        assert_int_equal(fwrite(x, 4, 1u << 20, f), 1u << 20);
    free(x);
    assert_int_equal(fclose(f), 0);
}

/* --drain-timeout is a hard bound: at the deadline the running conversion is cancelled and
 * the queued ones do not run; the daemon exits (not drained) leaving no temporary, with every
 * conversion either whole or absent. */
static void drain_deadline_cancels_conversions(void **state)
{
    char d[] = "/tmp/quantd-drain-XXXXXX", p[400];
    assert_non_null(mkdtemp(d));
    snprintf(p, sizeof p, "%s/big.gguf", d);
    write_big_gguf(p);
    struct server s;
    const char *flags[] = {"--data-dir", d, "--drain-timeout", "1", "--workers", "1", "--cpu-threads", "1",
                           "--backend", "cpu", NULL};
    server_start(&s, flags);
    const int jobs = 24;
    char first[64] = "";
    for (int i = 0; i < jobs; i++) {
        char body[160];
        snprintf(body, sizeof body, "{\"source\": \"big.gguf\", \"destination\": \"out%d.gguf\", \"fmt\": \"q4_K\"}", i);
        struct http r;
        http_do(&s, "POST", "/jobs?op=convert", json_h, body, strlen(body), &r);
        assert_int_equal(r.status, 202);
        if (!i) {
            cJSON *j = cJSON_ParseWithLength(r.body, r.len);
            snprintf(first, sizeof first, "/jobs/%s", cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")));
            cJSON_Delete(j);
        }
        http_free(&r);
    }
    for (int tries = 0; tries < 1000; tries++) { /* the first is running */
        struct http r;
        http_do(&s, "GET", first, NULL, NULL, 0, &r);
        int running = r.body && strstr(r.body, "\"running\"");
        http_free(&r);
        if (running)
            break;
        usleep(5000);
    }
    int rc = server_stop(&s);
    assert_int_equal(rc, 1); /* not drained */
    int whole = 0;
    for (int i = 0; i < jobs; i++) {
        snprintf(p, sizeof p, "%s/out%d.gguf", d, i);
        whole += access(p, F_OK) == 0;
    }
    if (whole == jobs)
        fail_msg("all %d conversions ran to their end past a 1 s drain deadline", jobs);
    assert_false(has_temporary(d));
    snprintf(p, sizeof p, "rm -rf %s", d);
    assert_int_equal(system(p), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(convert_job_writes_what_the_cli_writes),
        cmocka_unit_test(convert_refusals_come_before_the_job),
        cmocka_unit_test(convert_route_answers_the_converted_file),
        cmocka_unit_test(convert_job_confinement_has_no_gaps),
        cmocka_unit_test(convert_job_fp8_layouts),
        cmocka_unit_test(convert_route_names_no_server_path),
        cmocka_unit_test(convert_job_writes_mlx_as_the_cli),
        cmocka_unit_test(convert_back_to_float_and_float_mixes),
        cmocka_unit_test(stale_spool_files_are_swept_at_start),
        cmocka_unit_test(drain_deadline_cancels_conversions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
