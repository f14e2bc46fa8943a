/* server/model/kld.c and kld_file.c: llama-perplexity's base row encoding and its statistics,
 * the base file's writer and reader (their agreement with llama-perplexity's own files and
 * figures is tests/peers/test_model_kld.py's). What is proven:
 * - a row is laid out as llama-perplexity lays it out: f32 scale and min_log_prob, then one code
 *   per token (the top logit 65535, 16 nats and more below it 0), a zero pad word for an odd
 *   vocabulary; the returned NLL is the token's;
 * - a model against its own base has no divergence beyond the codes' step, the same top token
 *   and no Δp;
 * - a written base file reads back (header, tokens, rows); a writer aborted part way leaves
 *   neither the temporary nor a changed destination;
 * - the reader refuses a truncated or overlong file and a damaged row, naming them;
 * - the percentiles interpolate between sorted values as llama-perplexity's do. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/kld.h"

static void row_layout_matches_llama_perplexity(void **state)
{
    const float logits[5] = {0.f, -1.f, -20.f, 2.f, 1.5f};
    uint16_t row[10];
    memset(row, 0xff, sizeof row);
    assert_int_equal(qd_kld_row_words(5), 10);
    const double nll = qd_kld_encode_row(logits, 5, 1, row);
    float scale, min_log_prob;
    memcpy(&scale, row, 4);
    memcpy(&min_log_prob, row + 2, 4);
    double sum = 0;
    for (int i = 0; i < 5; i++)
        sum += exp(logits[i] - 2.0);
    assert_float_equal(scale, 16.0 / 65535, 1e-9);
    assert_float_equal(min_log_prob, -14.0 - 2.0 - log(sum), 1e-5);
    assert_int_equal(row[4 + 3], 65535); /* the top logit */
    assert_int_equal(row[4 + 2], 0);     /* 22 nats below it: past the codes' reach */
    assert_int_equal(row[4 + 0], (int)lround(14.0 / scale));
    assert_int_equal(row[9], 0); /* the pad word */
    assert_float_equal(nll, 3.0 + log(sum), 1e-5);
    /* decoded, the token's log-probability is its own within one code */
    assert_float_equal(scale * row[4 + 1] + min_log_prob, -nll, scale);
}

static void model_against_its_own_base_diverges_by_nothing(void **state)
{
    enum { V = 33, N = 120 };
    float logits[V];
    uint16_t row[2 * ((V + 1) / 2) + 4];
    struct qd_kld_stats s;
    assert_int_equal(qd_kld_stats_init(&s, N), QD_OK);
    srand(7);
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < V; i++)
            logits[i] = (float)(rand() % 1000) / 100.f;
        qd_kld_encode_row(logits, V, n % V, row);
        qd_kld_stats_add(&s, logits, V, row, n % V);
    }
    assert_int_equal(s.count, N);
    assert_int_equal(s.n_same_top, N);
    /* the codes are 10/65535 apart here: a decoded row sums to 1 within about that, which is
     * the size of the divergence left (first order in the step) */
    assert_true(fabs(s.sum_kld / N) < 10.0 / 65535);
    assert_true(fabs(s.sum_p_diff / N) < 1e-4 && s.max_p_diff < 1e-3);
    FILE *null = fopen("/dev/null", "w");
    cJSON *j = cJSON_CreateObject();
    qd_kld_report(&s, null, j);
    fclose(null);
    assert_float_equal(cJSON_GetObjectItem(j, "same_top_p")->valuedouble, 1.0, 0);
    const cJSON *k = cJSON_GetObjectItem(j, "kld");
    assert_true(cJSON_GetObjectItem(k, "min")->valuedouble <= cJSON_GetObjectItem(k, "median")->valuedouble);
    assert_true(cJSON_GetObjectItem(k, "median")->valuedouble <= cJSON_GetObjectItem(k, "max")->valuedouble);
    cJSON_Delete(j);
    qd_kld_stats_free(&s);
}

static void percentiles_interpolate_as_llama_perplexity(void **state)
{
    struct qd_kld_stats s;
    assert_int_equal(qd_kld_stats_init(&s, 5), QD_OK);
    const float v[5] = {4, 0, 3, 1, 2}; /* KLD values fed straight in: sorted 0..4 */
    for (int i = 0; i < 5; i++)
        s.kld_values[i] = s.p_diff_values[i] = v[i];
    s.count = 5;
    cJSON *j = cJSON_CreateObject();
    qd_kld_report(&s, NULL, j); /* fewer than 100 values: nothing printed, the figures kept */
    const cJSON *k = cJSON_GetObjectItem(j, "kld");
    assert_float_equal(cJSON_GetObjectItem(k, "p90")->valuedouble, 0.9f * 4, 1e-6); /* (n-1) * fraction */
    assert_float_equal(cJSON_GetObjectItem(k, "median")->valuedouble, 2, 0);
    assert_float_equal(cJSON_GetObjectItem(k, "max")->valuedouble, 4, 0);
    assert_float_equal(cJSON_GetObjectItem(k, "min")->valuedouble, 0, 0);
    cJSON_Delete(j);
    qd_kld_stats_free(&s);
}

static char dir[64];

static void path_in(char *out, size_t len, const char *name) { snprintf(out, len, "%s/%s", dir, name); }

static size_t entries(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
    FILE *p = popen(cmd, "r");
    size_t n = 0;
    assert_int_equal(fscanf(p, "%zu", &n), 1);
    pclose(p);
    return n;
}

static void write_then_read_back_and_abort_leaves_nothing(void **state)
{
    enum { CTX = 6, V = 5, CHUNKS = 2, ROWS = CTX - 1 - CTX / 2 };
    char path[128], err[512];
    path_in(path, sizeof path, "base.kld");
    FILE *old = fopen(path, "wb");
    fputs("old", old);
    fclose(old);
    int32_t tokens[CHUNKS * CTX];
    for (int i = 0; i < CHUNKS * CTX; i++)
        tokens[i] = i % V;
    float logits[ROWS * V];
    for (int i = 0; i < ROWS * V; i++)
        logits[i] = (float)(i % 7) * 0.5f;
    /* aborted part way: the old file stays, no temporary is left */
    struct qd_kld_writer w;
    double nll = 0, nll2 = 0;
    assert_int_equal(qd_kld_writer_open(path, CTX, V, CHUNKS, tokens, &w, err, sizeof err), QD_OK);
    assert_int_equal(qd_kld_writer_chunk(&w, logits, ROWS, tokens + CTX / 2 + 1, &nll, &nll2, err, sizeof err), QD_OK);
    assert_int_equal(entries(), 2);
    qd_kld_writer_abort(&w);
    assert_int_equal(entries(), 1);
    struct qd_kld_base b;
    assert_int_equal(qd_kld_base_open(path, &b, err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "does not look like"));
    qd_kld_base_close(&b);
    /* whole: replaces the old file */
    assert_int_equal(qd_kld_writer_open(path, CTX, V, CHUNKS, tokens, &w, err, sizeof err), QD_OK);
    for (int c = 0; c < CHUNKS; c++)
        assert_int_equal(qd_kld_writer_chunk(&w, logits, ROWS, tokens + c * CTX + CTX / 2 + 1, &nll, &nll2, err,
                                             sizeof err), QD_OK);
    assert_int_equal(qd_kld_writer_commit(&w, err, sizeof err), QD_OK);
    assert_int_equal(entries(), 1);
    assert_int_equal(qd_kld_base_open(path, &b, err, sizeof err), QD_OK);
    assert_int_equal(b.n_ctx, CTX);
    assert_int_equal(b.n_vocab, V);
    assert_int_equal(b.n_chunk, CHUNKS);
    assert_memory_equal(b.tokens, tokens, sizeof tokens);
    uint16_t rows[ROWS * 10], want[10];
    assert_int_equal(qd_kld_base_read_chunk(&b, rows, err, sizeof err), QD_OK);
    qd_kld_encode_row(logits, V, tokens[CTX / 2 + 1], want);
    assert_memory_equal(rows, want, sizeof want);
    assert_int_equal(qd_kld_base_read_chunk(&b, rows, err, sizeof err), QD_OK);
    assert_int_equal(qd_kld_base_read_chunk(&b, rows, err, sizeof err), QD_EINVAL); /* only 2 chunks */
    qd_kld_base_close(&b);

    /* truncated, overlong, a damaged row */
    FILE *f = fopen(path, "rb");
    char buf[4096];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    const struct {
        size_t len;
        const char *says;
    } cut[] = {{n - 1, "is truncated"}, {30, "is truncated"}, {n + 2, "longer than its header says"}};
    for (size_t i = 0; i < sizeof cut / sizeof *cut; i++) {
        f = fopen(path, "wb");
        fwrite(buf, 1, cut[i].len, f); /* past n: the zeros of buf */
        fclose(f);
        assert_int_equal(qd_kld_base_open(path, &b, err, sizeof err), QD_EINVAL);
        assert_non_null(strstr(err, cut[i].says));
        qd_kld_base_close(&b);
    }
    const float bad = -1.f; /* a negative scale in chunk 2's first row */
    memcpy(buf + 20 + 4 * CHUNKS * CTX + ROWS * 20, &bad, 4);
    f = fopen(path, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
    assert_int_equal(qd_kld_base_open(path, &b, err, sizeof err), QD_OK);
    assert_int_equal(qd_kld_base_read_chunk(&b, rows, err, sizeof err), QD_OK);
    assert_int_equal(qd_kld_base_read_chunk(&b, rows, err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "chunk 2, row 0"));
    qd_kld_base_close(&b);
    unlink(path);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/qd-test-kld-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(row_layout_matches_llama_perplexity),
        cmocka_unit_test(model_against_its_own_base_diverges_by_nothing),
        cmocka_unit_test(percentiles_interpolate_as_llama_perplexity),
        cmocka_unit_test(write_then_read_back_and_abort_leaves_nothing),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(dir);
    return rc;
}
