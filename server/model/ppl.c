/* llama-perplexity's perplexity (ppl.h). */
#include "model/ppl.h"

#include <math.h>
#include <stdlib.h>

#include "../../kernels/cpu/cpu.h"

double qd_ppl_token_nll(const float *logits, int64_t n_vocab, int32_t tok)
{
    float max = logits[0];
    for (int64_t i = 1; i < n_vocab; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    for (int64_t i = 0; i < n_vocab; i++)
        sum += expf(logits[i] - max);
    return -((double)(logits[tok] - max) - log(sum));
}

struct nll_job {
    const float *logits;
    int64_t n_vocab;
    const int32_t *targets;
    int rows;
    double *out;
};

static void nll_rows(void *ctx, int tid, int n)
{
    const struct nll_job *j = ctx;
    for (int i = tid; i < j->rows; i += n)
        j->out[i] = qd_ppl_token_nll(j->logits + (int64_t)i * j->n_vocab, j->n_vocab, j->targets[i]);
}

void qd_ppl_add(struct qd_ppl *p, const float *logits, int rows, int64_t n_vocab, const int32_t *targets)
{
    /* the rows' figures on every core, their sums in row order (the same sums as one thread's) */
    double *v = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *v);
    if (v) {
        struct nll_job j = {logits, n_vocab, targets, rows, v};
        qd_cpu_parallel(qd_cpu_threads() < rows ? qd_cpu_threads() : rows, nll_rows, &j);
    }
    for (int i = 0; i < rows; i++) {
        const double x = v ? v[i] : qd_ppl_token_nll(logits + (int64_t)i * n_vocab, n_vocab, targets[i]);
        p->nll += x;
        p->nll2 += x * x;
    }
    free(v);
    p->count += rows;
}

double qd_ppl_running(const struct qd_ppl *p) { return exp(p->nll / (double)p->count); }

int qd_ppl_final(const struct qd_ppl *p, double *ln_ppl, double *err)
{
    const double count = (double)p->count, mean = p->nll / count, var = p->nll2 / count - mean * mean;
    *ln_ppl = mean;
    *err = var > 0 ? sqrt(var / (count - 1)) : 0.0;
    return var > 0 ? 0 : -1;
}
