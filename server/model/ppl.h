/* llama-perplexity's perplexity over scored positions (tools/perplexity/perplexity.cpp): each
 * position's negative log-likelihood of the token that follows, their sum and sum of squares,
 * and from them ln PPL and its standard error. quantd perplexity and quantd imatrix (which
 * prints the perplexity alongside, as llama-imatrix does) keep their figures here. */
#ifndef QD_MODEL_PPL_H
#define QD_MODEL_PPL_H

#include <stdint.h>

struct qd_ppl {
    double nll, nll2; /* the sum of the NLLs and of their squares */
    int64_t count;    /* positions scored */
};

/* log_softmax as llama-perplexity computes it: the maximum in f32, the exponentials summed in
 * double, the NLL -(logit[tok] - max - log(sum)). */
double qd_ppl_token_nll(const float *logits, int64_t n_vocab, int32_t tok);
/* Adds rows positions (logits rows x n_vocab), position i scored against targets[i]. */
void qd_ppl_add(struct qd_ppl *p, const float *logits, int rows, int64_t n_vocab, const int32_t *targets);
/* The running figure llama-perplexity prints after each chunk: exp(mean NLL). */
double qd_ppl_running(const struct qd_ppl *p);
/* The mean NLL (ln PPL) into *ln_ppl and its standard error into *err: 0, or -1 when the
 * variance is not positive (llama-perplexity's "Unexpected negative standard deviation"; *err
 * is 0 then). */
int qd_ppl_final(const struct qd_ppl *p, double *ln_ppl, double *err);

#endif
