/* llama-perplexity's perplexity (ppl.h). */
#include "model/ppl.h"

#include <math.h>

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

void qd_ppl_add(struct qd_ppl *p, const float *logits, int rows, int64_t n_vocab, const int32_t *targets)
{
    for (int i = 0; i < rows; i++) {
        const double v = qd_ppl_token_nll(logits + (int64_t)i * n_vocab, n_vocab, targets[i]);
        p->nll += v;
        p->nll2 += v * v;
    }
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
