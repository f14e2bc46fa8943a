/* The importance-matrix collector (imatrix_collect.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/imatrix_collect.h"

/* llama-imatrix asks for no batch under 16 tokens ("why are small batches ignored?", it asks
 * itself): the same rule keeps the two files equal */
#define QD_IMATRIX_MIN_TOKENS 16

static void fail(struct qd_imatrix_collector *c, enum qd_status st)
{
    if (c->status == QD_OK)
        c->status = st;
    c->stop = 1;
}

/* The entry of weight (n_vals values over n_counts matrices), the one after the last used
 * tried first: the engine calls the weights in the same order chunk after chunk. */
static struct qd_imatrix_stat *entry(struct qd_imatrix_collector *c, const char *weight, int64_t n_vals, int64_t n_counts)
{
    struct qd_imatrix_sums *s = c->sums;
    for (int k = 0; k < 2; k++) {
        int i = c->last + k;
        if (i < s->n && !strcmp(s->e[i].name, weight) && s->e[i].n_vals == n_vals && s->e[i].n_counts == n_counts) {
            c->last = i;
            return &s->e[i];
        }
    }
    struct qd_imatrix_stat *e = qd_imatrix_sums_entry(s, weight, n_vals, n_counts, c->err, sizeof c->err);
    if (!e)
        fail(c, QD_ESHAPE);
    else
        c->last = (int)(e - s->e);
    return e;
}

static int all_finite(const float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return 0;
    return 1;
}

/* acc += x * x over T rows of K, row by row in f32: llama-imatrix's order (on the backend
 * that holds the rows) */
static void add_squares(const struct qd_imatrix_collector *c, float *acc, const float *x, int64_t T, int64_t K)
{
    if (c->nn && c->nn->add_squares)
        c->nn->add_squares(acc, x, T, K);
    else
        qd_nn_add_squares(acc, x, T, K);
}

void qd_imatrix_collect_matmul(void *ctx, int layer, const char *weight, const float *x, int64_t T, int64_t K)
{
    struct qd_imatrix_collector *c = ctx;
    (void)layer;
    if (c->stop || T < (c->min_tokens > 0 ? c->min_tokens : QD_IMATRIX_MIN_TOKENS))
        return;
    if (strncmp(weight, "blk.", 4) && !(c->process_output && !strcmp(weight, "output.weight")))
        return;
    struct qd_imatrix_stat *e = entry(c, weight, K, 1);
    if (!e)
        return;
    add_squares(c, e->sums, x, T, K);
    if (!all_finite(e->sums, K)) {
        snprintf(c->err, sizeof c->err, "non-finite values detected in %s (the sums of x^2 overflow f32)", weight);
        fail(c, QD_ENONFINITE);
        return;
    }
    e->counts[0] += T;
}

enum qd_status qd_imatrix_collect_experts(struct qd_imatrix_collector *c, const char *weight, int64_t n_expert,
                                          const int32_t *ids, int64_t n_used, const float *x, int64_t x_rows,
                                          int64_t T, int64_t K)
{
    if (c->stop)
        return c->status;
    if (x_rows != 1 && x_rows != n_used) {
        snprintf(c->err, sizeof c->err, "%s: %lld input rows per token for %lld routed experts", weight,
                 (long long)x_rows, (long long)n_used);
        fail(c, QD_ESHAPE);
        return c->status;
    }
    /* every expert matmul is collected, whatever its number of tokens (llama-imatrix's
     * MUL_MAT_ID) */
    struct qd_imatrix_stat *e = entry(c, weight, K * n_expert, n_expert);
    if (!e)
        return c->status;
    for (int64_t slot = 0; slot < n_used; slot++)
        for (int64_t t = 0; t < T; t++) {
            const int32_t ex = ids[t * n_used + slot];
            if (ex < 0 || ex >= n_expert) {
                snprintf(c->err, sizeof c->err, "%s: token %lld routed to expert %d of %lld", weight, (long long)t, ex,
                         (long long)n_expert);
                fail(c, QD_EINVAL);
                return c->status;
            }
            qd_nn_add_squares(e->sums + ex * K, x + (t * x_rows + slot % x_rows) * K, 1, K);
            e->counts[ex]++;
        }
    if (!all_finite(e->sums, K * n_expert)) {
        snprintf(c->err, sizeof c->err, "non-finite values detected in %s (the sums of x^2 overflow f32)", weight);
        fail(c, QD_ENONFINITE);
    }
    return c->status;
}

void qd_imatrix_collect_expert_matmul(void *ctx, int layer, const char *weight, int expert, int n_expert,
                                      const float *x, int64_t rows, int64_t K)
{
    struct qd_imatrix_collector *c = ctx;
    (void)layer;
    if (c->stop)
        return;
    if (expert < 0 || expert >= n_expert) {
        snprintf(c->err, sizeof c->err, "%s: rows for expert %d of %d", weight, expert, n_expert);
        fail(c, QD_EINVAL);
        return;
    }
    struct qd_imatrix_stat *e = entry(c, weight, K * n_expert, n_expert);
    if (!e)
        return;
    float *acc = e->sums + (int64_t)expert * K;
    add_squares(c, acc, x, rows, K);
    if (!all_finite(acc, K)) {
        snprintf(c->err, sizeof c->err, "non-finite values detected in %s (the sums of x^2 overflow f32)", weight);
        fail(c, QD_ENONFINITE);
        return;
    }
    e->counts[expert] += rows;
}

void qd_imatrix_collect_head_matmul(void *ctx, int layer, const char *weight, int head, int n_head, const float *x,
                                    int64_t T, int64_t K)
{
    struct qd_imatrix_collector *c = ctx;
    (void)layer;
    if (c->stop || T < (c->min_tokens > 0 ? c->min_tokens : QD_IMATRIX_MIN_TOKENS) || strncmp(weight, "blk.", 4))
        return;
    if (head < 0 || head >= n_head) {
        snprintf(c->err, sizeof c->err, "%s: rows for head %d of %d", weight, head, n_head);
        fail(c, QD_EINVAL);
        return;
    }
    struct qd_imatrix_stat *e = entry(c, weight, K * n_head, 1);
    if (!e)
        return;
    float *acc = e->sums + (int64_t)head * K;
    add_squares(c, acc, x, T, K);
    if (!all_finite(acc, K)) {
        snprintf(c->err, sizeof c->err, "non-finite values detected in %s (the sums of x^2 overflow f32)", weight);
        fail(c, QD_ENONFINITE);
        return;
    }
    if (head == 0)
        e->counts[0] += T;
}
