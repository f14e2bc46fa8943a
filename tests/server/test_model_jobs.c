/* POST /jobs?op=perplexity and ?op=imatrix: quantd perplexity and quantd imatrix as jobs over
 * files in --data-dir (tiny seeded models of tests/model/tiny_model.py, written by
 * tests/server/model_fixtures.py). What is proven:
 * - a job's summary is the command line's (the same figures) and its files are the command
 *   line's byte for byte (the base logits file, the importance matrix in both formats, combined);
 * - GET /jobs/{id} shows the progress (layers and chunks), whole once done;
 * - DELETE of a running job stops it and leaves nothing behind (no output, no temporary);
 * - every refusal is a JSON error naming the problem and no server path: paths outside
 *   --data-dir, missing files, an existing output without overwrite, unknown or ill-typed
 *   fields, an architecture the engine lacks, a model without a vocabulary (before the job is
 *   accepted), a text shorter than two chunks and a base logits file of another text (the job's
 *   result). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
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
    snprintf(dir, sizeof dir, "/tmp/quantd-model-jobs-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char cmd[512];
    snprintf(cmd, sizeof cmd, ".venv/bin/python tests/server/model_fixtures.py %s", dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/out", dir);
    assert_int_equal(mkdir(cmd, 0755), 0);
    snprintf(cmd, sizeof cmd, "%s/escape", dir);
    assert_int_equal(symlink("/etc", cmd), 0);
    const char *flags[] = {"--data-dir", dir, NULL}, *none[] = {NULL};
    server_start(&srv, flags);
    server_start(&plain, none);
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

static void assert_no_server_path(const char *body)
{
    if (strstr(body, dir) || strstr(body, "/tmp/"))
        fail_msg("an answer names a server path: %s", body);
}

/* Submits a job: its id (202), or fails. */
static void submit(const char *op, const char *body, char *id, size_t idlen)
{
    char path[64];
    snprintf(path, sizeof path, "/jobs?op=%s", op);
    struct http r;
    http_do(&srv, "POST", path, json_h, body, strlen(body), &r);
    if (r.status != 202)
        fail_msg("POST %s %s: %ld %s", path, body, r.status, r.body);
    cJSON *j = cJSON_ParseWithLength(r.body, r.len);
    snprintf(id, idlen, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "op")), op);
    cJSON_Delete(j);
    http_free(&r);
}

/* GET /jobs/{id}, parsed. */
static cJSON *job(const char *id)
{
    char path[96];
    snprintf(path, sizeof path, "/jobs/%s", id);
    struct http r;
    http_do(&srv, "GET", path, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    cJSON *j = cJSON_ParseWithLength(r.body, r.len);
    http_free(&r);
    return j;
}

static int progress(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "progress"), key);
    if (!cJSON_IsNumber(v))
        fail_msg("the job has no progress.%s", key);
    return v->valueint;
}

/* Polls a job to its end (its progress whole), then its result: the status; *out the body. */
static long finish(const char *id, cJSON **out)
{
    for (int tries = 0;; tries++) {
        cJSON *j = job(id);
        const char *st = cJSON_GetStringValue(cJSON_GetObjectItem(j, "status"));
        const int done = st && !strcmp(st, "done");
        if (done && cJSON_GetObjectItem(j, "http_status")->valueint == 200) {
            assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "progress"), "stage")),
                                "done");
            assert_int_equal(progress(j, "layers_done"), progress(j, "layers_total"));
            assert_int_equal(progress(j, "chunks_done"), progress(j, "chunks_total"));
        }
        cJSON_Delete(j);
        if (done)
            break;
        if (tries > 3000)
            fail_msg("job %s did not finish", id);
        usleep(10000);
    }
    char path[96];
    snprintf(path, sizeof path, "/jobs/%s/result", id);
    struct http r;
    http_do(&srv, "GET", path, NULL, NULL, 0, &r);
    assert_no_server_path(r.body);
    *out = cJSON_ParseWithLength(r.body, r.len);
    assert_non_null(*out);
    long status = r.status;
    http_free(&r);
    return status;
}

/* The command line in the data directory; its last stdout line parsed (NULL when none). */
static cJSON *cli(const char *args)
{
    char cmd[1024], out[320];
    snprintf(out, sizeof out, "%s/cli.out", dir);
    snprintf(cmd, sizeof cmd, "cd %s && %s %s --progress none > cli.out 2> /dev/null", dir, quantd_bin(), args);
    assert_int_equal(system(cmd), 0);
    size_t n;
    char *text = read_file(out, &n), *last = NULL;
    assert_non_null(text);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        last = line;
    cJSON *j = last && last[0] == '{' ? cJSON_Parse(last) : NULL;
    free(text);
    return j;
}

static double number(const cJSON *j, const char *a, const char *b)
{
    const cJSON *v = cJSON_GetObjectItem(j, a);
    if (b)
        v = cJSON_GetObjectItem(v, b);
    if (!cJSON_IsNumber(v))
        fail_msg("no figure %s%s%s", a, b ? "." : "", b ? b : "");
    return v->valuedouble;
}

static void assert_same_file(const char *a, const char *b)
{
    char pa[320], pb[320];
    snprintf(pa, sizeof pa, "%s/%s", dir, a);
    snprintf(pb, sizeof pb, "%s/%s", dir, b);
    size_t na, nb;
    void *x = read_file(pa, &na), *y = read_file(pb, &nb);
    if (!x || !y)
        fail_msg("%s or %s is missing", a, b);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x), free(y);
}

static void perplexity_job_is_the_cli(void **state)
{
    char id[64];
    cJSON *res, *ref;
    submit("perplexity", "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\", \"ctx_size\": 64, \"chunks\": 4, "
           "\"threads\": 2, \"kl_divergence_base\": \"out/base.kld\", \"backend\": \"cpu\", \"max_device_bytes\": \"4GiB\"}",
           id, sizeof id);
    assert_int_equal(finish(id, &res), 200);
    ref = cli("perplexity -m m.gguf --tokens tokens.bin -c 64 --chunks 4 -t 2 --kl-divergence-base cli.kld "
              "--backend cpu");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(res, "backend")), "cpu");
    assert_non_null(ref);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(res, "model")), "m.gguf");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(res, "kl_divergence_base")), "out/base.kld");
    static const char *const figures[] = {"ln_ppl", "ln_ppl_error", "ppl", "ppl_error", "tokens_scored", "chunks",
                                          "n_ctx"};
    for (size_t i = 0; i < sizeof figures / sizeof *figures; i++)
        if (number(res, figures[i], NULL) != number(ref, figures[i], NULL))
            fail_msg("%s: the job's %.17g, the CLI's %.17g", figures[i], number(res, figures[i], NULL),
                     number(ref, figures[i], NULL));
    assert_int_equal((int)number(res, "chunks", NULL), 4);
    assert_true(number(res, "memory", "peak_bytes") > 0);
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "memory"), "peak_rss_bytes")); /* (the daemon's) */
    assert_same_file("out/base.kld", "cli.kld");
    cJSON_Delete(res), cJSON_Delete(ref);

    /* the KL divergence of the model to that base: the CLI's statistics */
    submit("perplexity", "{\"model\": \"m.gguf\", \"kl_divergence_base\": \"out/base.kld\", \"kl_divergence\": true, "
           "\"threads\": 2}", id, sizeof id);
    assert_int_equal(finish(id, &res), 200);
    ref = cli("perplexity -m m.gguf --kl-divergence-base cli.kld --kl-divergence -t 2");
    assert_non_null(ref);
    assert_true(number(res, "kld", "mean") == number(ref, "kld", "mean"));
    assert_true(number(res, "kld", "max") == number(ref, "kld", "max"));
    assert_true(number(res, "same_top_p", NULL) == number(ref, "same_top_p", NULL));
    assert_true(number(res, "tokens_scored", NULL) == 4 * 31);
    cJSON_Delete(res), cJSON_Delete(ref);

    /* an existing base is replaced only with overwrite */
    const char *again = "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\", \"ctx_size\": 64, \"chunks\": 2, "
                        "\"kl_divergence_base\": \"out/base.kld\"%s}";
    char body[256];
    snprintf(body, sizeof body, again, "");
    struct http r;
    http_do(&srv, "POST", "/jobs?op=perplexity", json_h, body, strlen(body), &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.body, "overwrite"));
    http_free(&r);
    snprintf(body, sizeof body, again, ", \"overwrite\": true");
    submit("perplexity", body, id, sizeof id);
    assert_int_equal(finish(id, &res), 200);
    assert_int_equal((int)number(res, "chunks", NULL), 2);
    cJSON_Delete(res);
}

static void imatrix_job_is_the_cli(void **state)
{
    char id[64];
    cJSON *res;
    submit("imatrix", "{\"model\": \"m.gguf\", \"text\": \"text.txt\", \"ctx_size\": 64, \"chunks\": 4, \"threads\": 2, "
           "\"output\": \"out/i.gguf\"}", id, sizeof id);
    assert_int_equal(finish(id, &res), 200);
    cJSON_Delete(cli("imatrix -m m.gguf -f text.txt -c 64 --chunks 4 -t 2 -o cli.gguf"));
    assert_same_file("out/i.gguf", "cli.gguf");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(res, "output")), "out/i.gguf");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(res, "dataset")), "text.txt");
    assert_int_equal((int)number(res, "chunks", NULL), 4);
    assert_true(number(res, "entries", NULL) > 0);
    assert_true(number(res, "ppl", NULL) > 1);
    cJSON_Delete(res);

    /* the legacy format, with the output's input collected and no perplexity */
    submit("imatrix", "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\", \"ctx_size\": 64, \"chunks\": 3, "
           "\"process_output\": true, \"no_ppl\": true, \"output\": \"out/i.dat\", \"output_format\": \"dat\"}", id,
           sizeof id);
    assert_int_equal(finish(id, &res), 200);
    assert_null(cJSON_GetObjectItem(res, "ppl"));
    cJSON_Delete(res);
    cJSON_Delete(cli("imatrix -m m.gguf --tokens tokens.bin -c 64 --chunks 3 --process-output --no-ppl -o cli.dat "
                     "--output-format dat"));
    assert_same_file("out/i.dat", "cli.dat");

    /* combining earlier matrices only */
    submit("imatrix", "{\"in_file\": [\"out/i.gguf\", \"out/i.dat\"], \"ctx_size\": 64, \"output\": \"out/c.gguf\"}",
           id, sizeof id);
    assert_int_equal(finish(id, &res), 200);
    cJSON_Delete(res);
    cJSON_Delete(cli("imatrix --in-file out/i.gguf --in-file out/i.dat -c 64 -o cli-c.gguf"));
    assert_same_file("out/c.gguf", "cli-c.gguf");
}

/* The jobs running now, from /metrics (both pools). */
static int running(void)
{
    struct http r;
    http_do(&srv, "GET", "/metrics", NULL, NULL, 0, &r);
    int n = 0, v;
    for (const char *p = r.body; (p = strstr(p, "jobs_running ")); p++)
        if (sscanf(p, "jobs_running %d", &v) == 1)
            n += v;
    http_free(&r);
    return n;
}

/* Whether dir/out holds a file whose name begins with prefix. */
static int left(const char *prefix)
{
    char path[320];
    snprintf(path, sizeof path, "%s/out", dir);
    DIR *d = opendir(path);
    struct dirent *e;
    int found = 0;
    while (d && (e = readdir(d)))
        found |= !strncmp(e->d_name, prefix, strlen(prefix));
    if (d)
        closedir(d);
    return found;
}

/* A run long enough to be seen (8 blocks of slow.gguf over 258 chunks, one thread): its
 * progress moves, DELETE stops it, and nothing of its output is left. */
static void cancel_leaves_nothing(const char *op, const char *body, const char *prefix)
{
    char id[64], path[96];
    submit(op, body, id, sizeof id);
    int layers = 0, total = 0;
    for (int tries = 0; tries < 3000 && layers < 1; tries++) {
        cJSON *j = job(id);
        const char *st = cJSON_GetStringValue(cJSON_GetObjectItem(j, "status"));
        if (st && !strcmp(st, "done"))
            fail_msg("the %s job ended before it could be cancelled", op);
        layers = progress(j, "layers_done"), total = progress(j, "layers_total");
        cJSON_Delete(j);
        usleep(5000);
    }
    assert_int_equal(total, 8);
    assert_true(layers >= 1 && layers < total);
    snprintf(path, sizeof path, "/jobs/%s", id);
    struct http r;
    http_do(&srv, "DELETE", path, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 204);
    http_free(&r);
    for (int tries = 0; running() && tries < 1000; tries++)
        usleep(10000);
    assert_int_equal(running(), 0);
    if (left(prefix))
        fail_msg("a cancelled %s job left out/%s*", op, prefix);
}

static void delete_cancels_a_running_job(void **state)
{
    cancel_leaves_nothing("perplexity", "{\"model\": \"slow.gguf\", \"tokens\": \"long.bin\", \"ctx_size\": 64, "
                          "\"threads\": 1, \"kl_divergence_base\": \"out/cancel.kld\"}", "cancel.kld");
    cancel_leaves_nothing("imatrix", "{\"model\": \"slow.gguf\", \"tokens\": \"long.bin\", \"ctx_size\": 64, "
                          "\"threads\": 1, \"output\": \"out/cancel.gguf\"}", "cancel.gguf");
}

/* A refused request: its status and code, its message saying what, no server path. */
static void expect_refusal(const struct server *s, const char *op, long status, const char *code, const char *body,
                           const char *says)
{
    char path[64];
    snprintf(path, sizeof path, "/jobs?op=%s", op);
    struct http r;
    http_do(s, "POST", path, json_h, body, strlen(body), &r);
    if (r.status != status)
        fail_msg("%s %s: got %ld, want %ld: %s", path, body, r.status, status, r.body);
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

static void bad_requests_are_refused_naming_the_problem(void **state)
{
    const char *P = "perplexity", *I = "imatrix";
    expect_refusal(&srv, P, 403, "forbidden", "{\"model\": \"../m.gguf\", \"tokens\": \"tokens.bin\"}", "without '..'");
    expect_refusal(&srv, P, 403, "forbidden", "{\"model\": \"/etc/passwd\", \"tokens\": \"tokens.bin\"}", "relative");
    expect_refusal(&srv, P, 403, "forbidden", "{\"model\": \"m.gguf\", \"text\": \"escape/passwd\"}", "outside");
    expect_refusal(&srv, I, 403, "forbidden", "{\"model\": \"m.gguf\", \"text\": \"text.txt\", \"output\": \"escape/x\"}",
                   "outside");
    expect_refusal(&srv, P, 404, "not_found", "{\"model\": \"none.gguf\", \"tokens\": \"tokens.bin\"}", "none.gguf");
    expect_refusal(&srv, I, 404, "not_found", "{\"model\": \"m.gguf\", \"text\": \"text.txt\", \"output\": \"no/x.gguf\"}",
                   "no/x.gguf");
    expect_refusal(&srv, P, 400, "bad_model", "{\"model\": \"phi2.gguf\", \"tokens\": \"tokens.bin\"}",
                   "does not run architecture 'phi2'");
    expect_refusal(&srv, P, 400, "bad_model", "{\"model\": \"bare.gguf\", \"text\": \"text.txt\"}", "no vocabulary");
    expect_refusal(&srv, P, 400, "bad_request", "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\", \"output\": \"x\"}",
                   "unknown field 'output'");
    expect_refusal(&srv, P, 400, "bad_request", "{\"model\": \"m.gguf\"}", "text or tokens");
    expect_refusal(&srv, P, 400, "bad_request", "{\"model\": \"m.gguf\", \"kl_divergence\": true}", "kl_divergence_base");
    expect_refusal(&srv, P, 400, "bad_param", "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\", \"ctx_size\": \"64\"}",
                   "ctx_size");
    expect_refusal(&srv, P, 400, "bad_param", "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\", \"cache_type_k\": "
                   "\"q8_0\"}", "f16, bf16 or f32");
    expect_refusal(&srv, P, 400, "bad_request", "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\", "
                   "\"kl_divergence_base\": \"m.gguf\", \"overwrite\": true}", "an input");
    expect_refusal(&srv, I, 400, "bad_request", "{\"model\": \"m.gguf\", \"text\": \"text.txt\"}", "output is missing");
    expect_refusal(&srv, I, 400, "bad_request", "{\"output\": \"out/x.gguf\"}", "in_file");
    expect_refusal(&srv, I, 400, "bad_param", "{\"in_file\": \"out/i.gguf\", \"output\": \"out/x.gguf\", "
                   "\"output_format\": \"bin\"}", "gguf or dat");
    expect_refusal(&srv, I, 400, "bad_json", "[1]", NULL);
    expect_refusal(&srv, P, 400, "bad_param", "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\", \"backend\": \"tpu\"}",
                   "auto, cpu or cuda");
    expect_refusal(&srv, P, 400, "bad_param", "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\", \"max_device_bytes\": "
                   "\"lots\"}", "byte count");
    expect_refusal(&srv, P, 400, "bad_request", "{\"model\": \"m.gguf\\u0000x\", \"tokens\": \"tokens.bin\"}", "NUL");
    expect_refusal(&srv, "nope", 400, "bad_op", "{}", "perplexity, imatrix");
    expect_refusal(&plain, P, 403, "forbidden", "{\"model\": \"m.gguf\", \"tokens\": \"tokens.bin\"}", "--data-dir");

    /* a text shorter than two chunks: the job's result, naming both counts */
    char id[64];
    cJSON *res;
    submit("perplexity", "{\"model\": \"m.gguf\", \"text\": \"short.txt\", \"ctx_size\": 64}", id, sizeof id);
    assert_int_equal(finish(id, &res), 400);
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "error"), "message"));
    if (!msg || !strstr(msg, "you need at least 128 tokens"))
        fail_msg("short text: %s", msg ? msg : "(no message)");
    cJSON_Delete(res);
    submit("imatrix", "{\"model\": \"m.gguf\", \"text\": \"short.txt\", \"ctx_size\": 64, \"output\": \"out/short.gguf\"}",
           id, sizeof id);
    assert_int_equal(finish(id, &res), 400);
    cJSON_Delete(res);
    assert_int_equal(left("short"), 0);

    /* a base logits file computed over another text (perplexity_job_is_the_cli wrote it) */
    submit("perplexity", "{\"model\": \"m.gguf\", \"kl_divergence_base\": \"out/base.kld\", \"kl_divergence\": true, "
           "\"text\": \"short.txt\"}", id, sizeof id);
    assert_int_equal(finish(id, &res), 400);
    msg = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "error"), "message"));
    if (!msg || !strstr(msg, "another text") || !strstr(msg, "out/base.kld"))
        fail_msg("base of another text: %s", msg ? msg : "(no message)");
    cJSON_Delete(res);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(perplexity_job_is_the_cli),
        cmocka_unit_test(imatrix_job_is_the_cli),
        cmocka_unit_test(delete_cancels_a_running_job),
        cmocka_unit_test(bad_requests_are_refused_naming_the_problem),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
