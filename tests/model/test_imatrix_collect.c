/* server/model/imatrix_collect.c and server/checkpoint/imatrix_sums.c, imatrix_write.c: what
 * the collector takes (blk.* weights of 16 tokens or more; the output head on request; q and k
 * each their own entry of the same input), experts counted per expert (given the routing, or
 * through the engine's expert hook), per-head weights' slices with one count, the two files
 * read back through llama-quantize's reader (imatrix.c) and through the combining loader, sizes
 * that disagree refused, overflow stopped, and a file written whole or not at all. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint/imatrix.h"
#include "checkpoint/imatrix_sums.h"
#include "common/files.h"
#include "model/imatrix_collect.h"

static void fill(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * (float)((i * 7919) % 23 - 11) / 11.0f;
}

static const struct qd_imatrix_stat *stat_of(const struct qd_imatrix_sums *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->e[i].name, name))
            return &s->e[i];
    return NULL;
}

static void collector_takes_block_weights_of_16_tokens_or_more(void **state)
{
    (void)state;
    struct qd_imatrix_sums s = {.chunk_size = 20};
    struct qd_imatrix_collector c = {.sums = &s};
    float x[20 * 4];
    fill(x, 80, 1.5f);
    qd_imatrix_collect_matmul(&c, 0, "blk.0.attn_q.weight", x, 20, 4);
    qd_imatrix_collect_matmul(&c, 0, "blk.0.attn_k.weight", x, 20, 4);
    qd_imatrix_collect_matmul(&c, 0, "blk.0.attn_q.weight", x, 20, 4);
    qd_imatrix_collect_matmul(&c, 0, "blk.0.ffn_up.weight", x, 15, 4); /* under 16 tokens */
    qd_imatrix_collect_matmul(&c, 2, "output.weight", x, 20, 4);       /* not asked for */
    qd_imatrix_collect_matmul(&c, 2, "token_embd.weight", x, 20, 4);   /* a tied head */
    assert_int_equal(c.status, QD_OK);
    assert_int_equal(s.n, 2);
    const struct qd_imatrix_stat *q = stat_of(&s, "blk.0.attn_q.weight"), *k = stat_of(&s, "blk.0.attn_k.weight");
    assert_non_null(q);
    assert_non_null(k);
    assert_int_equal(q->counts[0], 40);
    assert_int_equal(k->counts[0], 20);
    for (int j = 0; j < 4; j++) {
        float want = 0.0f;
        for (int t = 0; t < 20; t++)
            want += x[t * 4 + j] * x[t * 4 + j];
        assert_true(k->sums[j] == want);
        assert_true(fabsf(q->sums[j] - 2 * want) <= 1e-6f * want);
    }
    c.process_output = 1;
    qd_imatrix_collect_matmul(&c, 2, "output.weight", x, 20, 4);
    assert_non_null(stat_of(&s, "output.weight"));
    assert_int_equal(qd_imatrix_sums_chunks(&s), 2); /* 40 tokens of q over chunks of 20 */
    qd_imatrix_sums_free(&s);
}

static void experts_are_counted_per_expert(void **state)
{
    (void)state;
    struct qd_imatrix_sums s = {.chunk_size = 4};
    struct qd_imatrix_collector c = {.sums = &s};
    /* 4 tokens, 2 of 3 experts each; expert 2 never routed */
    const int32_t ids[4 * 2] = {0, 1, 1, 0, 0, 1, 1, 0};
    float x[4 * 2 * 3];
    fill(x, 24, 2.0f);
    /* a row per routed expert (down's input) */
    assert_int_equal(qd_imatrix_collect_experts(&c, "blk.0.ffn_down_exps.weight", 3, ids, 2, x, 2, 4, 3), QD_OK);
    /* one row shared by the routed experts (gate's and up's input) */
    assert_int_equal(qd_imatrix_collect_experts(&c, "blk.0.ffn_up_exps.weight", 3, ids, 2, x, 1, 4, 3), QD_OK);
    const struct qd_imatrix_stat *down = stat_of(&s, "blk.0.ffn_down_exps.weight");
    const struct qd_imatrix_stat *up = stat_of(&s, "blk.0.ffn_up_exps.weight");
    assert_int_equal(down->n_counts, 3);
    assert_int_equal(down->counts[0], 4);
    assert_int_equal(down->counts[1], 4);
    assert_int_equal(down->counts[2], 0);
    for (int j = 0; j < 3; j++) {
        float want0 = 0.0f, want_up0 = 0.0f;
        for (int t = 0; t < 4; t++)
            for (int slot = 0; slot < 2; slot++)
                if (ids[t * 2 + slot] == 0) {
                    const float v = x[(t * 2 + slot) * 3 + j], u = x[t * 3 + j];
                    want0 += v * v;
                    want_up0 += u * u;
                }
        assert_true(fabsf(down->sums[j] - want0) <= 1e-6f * want0);
        assert_true(fabsf(up->sums[j] - want_up0) <= 1e-6f * want_up0);
        assert_true(down->sums[2 * 3 + j] == 0.0f);
    }
    const int32_t bad[2] = {0, 5};
    assert_int_equal(qd_imatrix_collect_experts(&c, "blk.1.ffn_up_exps.weight", 3, bad, 2, x, 1, 1, 3), QD_EINVAL);
    assert_non_null(strstr(c.err, "expert 5 of 3"));
    assert_true(c.stop);
    qd_imatrix_sums_free(&s);
}

/* The engine's expert hook: each expert's routed rows (any number, under 16 too) into that
 * expert's slice and count, the same sums as the routing's own path; an expert out of range
 * refused. */
static void expert_hook_counts_each_experts_rows(void **state)
{
    (void)state;
    struct qd_imatrix_sums s = {.chunk_size = 4}, ref = {.chunk_size = 4};
    struct qd_imatrix_collector c = {.sums = &s}, cr = {.sums = &ref};
    const int32_t ids[4 * 2] = {0, 1, 1, 0, 0, 1, 1, 0};
    float x[4 * 2 * 3], rows[4 * 3];
    fill(x, 24, 2.0f);
    assert_int_equal(qd_imatrix_collect_experts(&cr, "blk.0.ffn_down_exps.weight", 3, ids, 2, x, 2, 4, 3), QD_OK);
    for (int e = 0; e < 3; e++) { /* the rows routed to e, slot-major as MUL_MAT_ID visits them */
        int64_t n = 0;
        for (int slot = 0; slot < 2; slot++)
            for (int t = 0; t < 4; t++)
                if (ids[t * 2 + slot] == e)
                    memcpy(rows + 3 * n++, x + (t * 2 + slot) * 3, 3 * sizeof *rows);
        qd_imatrix_collect_expert_matmul(&c, 0, "blk.0.ffn_down_exps.weight", e, 3, rows, n, 3);
    }
    assert_int_equal(c.status, QD_OK);
    const struct qd_imatrix_stat *a = stat_of(&s, "blk.0.ffn_down_exps.weight");
    const struct qd_imatrix_stat *b = stat_of(&ref, "blk.0.ffn_down_exps.weight");
    assert_non_null(a);
    assert_int_equal(a->n_counts, 3);
    assert_int_equal(a->n_vals, 9);
    for (int e = 0; e < 3; e++)
        assert_int_equal(a->counts[e], b->counts[e]);
    assert_int_equal(a->counts[0], 4);
    assert_int_equal(a->counts[2], 0);
    for (int j = 0; j < 9; j++)
        assert_true(a->sums[j] == b->sums[j]);
    qd_imatrix_collect_expert_matmul(&c, 0, "blk.0.ffn_down_exps.weight", 3, 3, rows, 1, 3);
    assert_int_equal(c.status, QD_EINVAL);
    assert_non_null(strstr(c.err, "expert 3 of 3"));
    assert_true(c.stop);
    qd_imatrix_sums_free(&s);
    qd_imatrix_sums_free(&ref);
}

/* A per-head 3-D weight (DeepSeek's attn_k_b): each head's slice its own sums, one count of
 * the tokens for all heads, under 16 tokens skipped; a head out of range refused. */
static void head_hook_keeps_one_count(void **state)
{
    (void)state;
    struct qd_imatrix_sums s = {.chunk_size = 20};
    struct qd_imatrix_collector c = {.sums = &s};
    float x[2][20 * 4];
    fill(x[0], 80, 1.0f);
    fill(x[1], 80, 3.0f);
    for (int h = 0; h < 2; h++)
        qd_imatrix_collect_head_matmul(&c, 0, "blk.0.attn_k_b.weight", h, 2, x[h], 20, 4);
    qd_imatrix_collect_head_matmul(&c, 0, "blk.0.attn_v_b.weight", 0, 2, x[0], 15, 4); /* under 16 tokens */
    assert_int_equal(c.status, QD_OK);
    assert_int_equal(s.n, 1);
    const struct qd_imatrix_stat *k = stat_of(&s, "blk.0.attn_k_b.weight");
    assert_non_null(k);
    assert_int_equal(k->n_vals, 8);
    assert_int_equal(k->n_counts, 1);
    assert_int_equal(k->counts[0], 20);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++) {
            float want = 0.0f;
            for (int t = 0; t < 20; t++)
                want += x[h][t * 4 + j] * x[h][t * 4 + j];
            assert_true(k->sums[h * 4 + j] == want);
        }
    qd_imatrix_collect_head_matmul(&c, 0, "blk.0.attn_k_b.weight", 2, 2, x[0], 20, 4);
    assert_int_equal(c.status, QD_EINVAL);
    assert_non_null(strstr(c.err, "head 2 of 2"));
    qd_imatrix_sums_free(&s);
}

static void sizes_that_disagree_are_refused(void **state)
{
    (void)state;
    struct qd_imatrix_sums s = {.chunk_size = 8};
    char err[256];
    assert_non_null(qd_imatrix_sums_entry(&s, "blk.0.attn_q.weight", 8, 1, err, sizeof err));
    assert_null(qd_imatrix_sums_entry(&s, "blk.0.attn_q.weight", 16, 1, err, sizeof err));
    assert_non_null(strstr(err, "16 values here, 8 before"));
    /* one count (a .dat file's) spread over the experts; equal counts fold into one */
    struct qd_imatrix_stat *e = qd_imatrix_sums_entry(&s, "blk.0.ffn_up_exps.weight", 12, 1, err, sizeof err);
    e->counts[0] = 5;
    e = qd_imatrix_sums_entry(&s, "blk.0.ffn_up_exps.weight", 12, 3, err, sizeof err);
    assert_non_null(e);
    assert_int_equal(e->n_counts, 3);
    assert_int_equal(e->counts[2], 5);
    assert_non_null(qd_imatrix_sums_entry(&s, "blk.0.ffn_up_exps.weight", 12, 1, err, sizeof err));
    e = qd_imatrix_sums_entry(&s, "blk.0.ffn_up_exps.weight", 12, 3, err, sizeof err);
    e->counts[1] = 7;
    assert_null(qd_imatrix_sums_entry(&s, "blk.0.ffn_up_exps.weight", 12, 1, err, sizeof err));
    assert_null(qd_imatrix_sums_entry(&s, "blk.0.ffn_up_exps.weight", 12, 4, err, sizeof err));
    assert_null(qd_imatrix_sums_entry(&s, "x", 10, 3, err, sizeof err)); /* does not split */
    qd_imatrix_sums_free(&s);
}

static void overflow_stops_the_collector(void **state)
{
    (void)state;
    struct qd_imatrix_sums s = {.chunk_size = 16};
    struct qd_imatrix_collector c = {.sums = &s};
    float x[16 * 2];
    fill(x, 32, 1e30f);
    qd_imatrix_collect_matmul(&c, 0, "blk.0.attn_q.weight", x, 16, 2);
    assert_int_equal(c.status, QD_ENONFINITE);
    assert_true(c.stop);
    assert_non_null(strstr(c.err, "blk.0.attn_q.weight"));
    qd_imatrix_sums_free(&s);
}

/* A matrix of a dense weight (16 tokens) and an expert weight whose third expert saw nothing. */
static void sample(struct qd_imatrix_sums *s)
{
    memset(s, 0, sizeof *s);
    s->chunk_size = 8;
    struct qd_imatrix_collector c = {.sums = s};
    float x[16 * 4];
    fill(x, 64, 0.75f);
    qd_imatrix_collect_matmul(&c, 0, "blk.0.attn_v.weight", x, 16, 4);
    const int32_t ids[4] = {0, 1, 1, 0};
    assert_int_equal(qd_imatrix_collect_experts(&c, "blk.0.ffn_gate_exps.weight", 3, ids, 1, x, 1, 4, 4), QD_OK);
}

static char dir[] = "/tmp/qd_imatrix_test_XXXXXX";

static int entries_in_dir(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void read_back(const char *path, struct qd_imatrix *m, struct qd_imatrix_sums *raw, int32_t chunk_size)
{
    size_t len;
    uint8_t *buf = qd_file_read(path, &len);
    char err[512];
    assert_non_null(buf);
    int rc = qd_imatrix_parse(buf, len, m, err, sizeof err);
    if (rc)
        fail_msg("%s", err);
    memset(raw, 0, sizeof *raw);
    raw->chunk_size = chunk_size;
    rc = qd_imatrix_sums_load(raw, buf, len, err, sizeof err);
    if (rc)
        fail_msg("%s", err);
    free(buf);
}

static void gguf_reads_back_through_both_readers(void **state)
{
    (void)state;
    struct qd_imatrix_sums s, raw;
    struct qd_imatrix m;
    char err[256], path[256];
    sample(&s);
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    assert_int_equal(qd_imatrix_sums_write(&s, path, 0, "text.txt", err, sizeof err), 0);
    assert_int_equal(entries_in_dir(), 1); /* no temporary left */
    read_back(path, &m, &raw, 8);
    assert_false(m.legacy);
    assert_int_equal(m.n, 2);
    assert_int_equal(m.chunk_count, 2); /* 16 tokens in chunks of 8 */
    assert_string_equal(m.dataset, "text.txt");
    const struct qd_imatrix_entry *v = qd_imatrix_find(&m, "blk.0.attn_v.weight");
    const struct qd_imatrix_entry *g = qd_imatrix_find(&m, "blk.0.ffn_gate_exps.weight");
    const struct qd_imatrix_stat *sv = stat_of(&s, "blk.0.attn_v.weight"), *sg = stat_of(&s, "blk.0.ffn_gate_exps.weight");
    for (int j = 0; j < 4; j++) {
        assert_true(v->values[j] == sv->sums[j] / 16.0f);
        assert_true(g->values[j] == sg->sums[j] / 2.0f);
        assert_true(g->values[8 + j] == 1.0f); /* the expert that saw nothing */
    }
    /* the combining loader takes the raw sums and counts back as they were */
    assert_int_equal(raw.n, 2);
    assert_int_equal(raw.n_datasets, 1);
    for (int i = 0; i < 2; i++) {
        const struct qd_imatrix_stat *a = &s.e[i], *b = stat_of(&raw, a->name);
        assert_int_equal(a->n_counts, b->n_counts);
        assert_memory_equal(a->sums, b->sums, (size_t)a->n_vals * sizeof(float));
        assert_memory_equal(a->counts, b->counts, (size_t)a->n_counts * sizeof(int64_t));
    }
    qd_imatrix_free(&m);
    qd_imatrix_sums_free(&raw);
    qd_imatrix_sums_free(&s);
    unlink(path);
}

static void dat_reads_back_through_both_readers(void **state)
{
    (void)state;
    struct qd_imatrix_sums s, raw;
    struct qd_imatrix m;
    char err[256], path[256];
    sample(&s);
    /* an entry without data is left out of a .dat */
    assert_non_null(qd_imatrix_sums_entry(&s, "blk.1.attn_v.weight", 4, 1, err, sizeof err));
    snprintf(path, sizeof path, "%s/m.dat", dir);
    assert_int_equal(qd_imatrix_sums_write(&s, path, 1, "text.txt", err, sizeof err), 0);
    read_back(path, &m, &raw, 8);
    assert_true(m.legacy);
    assert_int_equal(m.n, 2);
    assert_null(qd_imatrix_find(&m, "blk.1.attn_v.weight"));
    assert_int_equal(m.chunk_count, 2);
    assert_string_equal(m.dataset, "text.txt");
    const struct qd_imatrix_entry *v = qd_imatrix_find(&m, "blk.0.attn_v.weight");
    const struct qd_imatrix_entry *g = qd_imatrix_find(&m, "blk.0.ffn_gate_exps.weight");
    const struct qd_imatrix_stat *sv = stat_of(&s, "blk.0.attn_v.weight"), *sg = stat_of(&s, "blk.0.ffn_gate_exps.weight");
    for (int j = 0; j < 4; j++) {
        /* stored as mean x ncall (2 calls of 8 tokens), read as stored / ncall */
        assert_true(fabsf(v->values[j] - sv->sums[j] / 16.0f) <= 1e-6f * v->values[j]);
        assert_true(fabsf(g->values[j] - sg->sums[j] / 2.0f) <= 1e-6f * g->values[j]);
        assert_true(g->values[8 + j] == 1.0f);
        /* combined: the means times the calls' tokens, one count */
        const struct qd_imatrix_stat *rv = stat_of(&raw, "blk.0.attn_v.weight");
        assert_int_equal(rv->n_counts, 1);
        assert_int_equal(rv->counts[0], 16);
        assert_true(fabsf(rv->sums[j] - sv->sums[j]) <= 1e-6f * sv->sums[j]);
    }
    qd_imatrix_free(&m);
    qd_imatrix_sums_free(&raw);
    qd_imatrix_sums_free(&s);
    unlink(path);
}

static void a_failed_write_leaves_nothing(void **state)
{
    (void)state;
    struct qd_imatrix_sums s, empty = {.chunk_size = 8};
    char err[256], path[256];
    sample(&s);
    snprintf(path, sizeof path, "%s/missing/m.gguf", dir);
    assert_int_equal(qd_imatrix_sums_write(&s, path, 0, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "missing/m.gguf"));
    snprintf(path, sizeof path, "%s/e.gguf", dir);
    assert_int_equal(qd_imatrix_sums_write(&empty, path, 0, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "no entries"));
    assert_int_equal(entries_in_dir(), 0);
    /* a file that ends early adds what it holds and says where it stopped */
    snprintf(path, sizeof path, "%s/m.dat", dir);
    assert_int_equal(qd_imatrix_sums_write(&s, path, 1, NULL, err, sizeof err), 0);
    size_t len;
    uint8_t *buf = qd_file_read(path, &len);
    struct qd_imatrix_sums raw = {.chunk_size = 8};
    assert_int_equal(qd_imatrix_sums_load(&raw, buf, 30, err, sizeof err), -1);
    assert_non_null(strstr(err, "the file ends inside"));
    free(buf);
    unlink(path);
    qd_imatrix_sums_free(&raw);
    qd_imatrix_sums_free(&s);
}

int main(void)
{
    if (!mkdtemp(dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(collector_takes_block_weights_of_16_tokens_or_more),
        cmocka_unit_test(experts_are_counted_per_expert),
        cmocka_unit_test(expert_hook_counts_each_experts_rows),
        cmocka_unit_test(head_hook_keeps_one_count),
        cmocka_unit_test(sizes_that_disagree_are_refused),
        cmocka_unit_test(overflow_stops_the_collector),
        cmocka_unit_test(gguf_reads_back_through_both_readers),
        cmocka_unit_test(dat_reads_back_through_both_readers),
        cmocka_unit_test(a_failed_write_leaves_nothing),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(dir);
    return rc;
}
