/* llama-perplexity's KL divergence (tools/perplexity/perplexity.cpp, kl_divergence()): its base
 * logits file, read and written byte for byte as it does, and its statistics, computed in its
 * types and order (float where it uses float, sums in double) so that the figures agree with its
 * own to the last printed digit on the same logits.
 *
 * The base file (every integer little-endian, as llama-perplexity writes it on x86/ARM):
 *   "_logits_"  int32 n_ctx  int32 n_vocab  int32 n_chunk  int32 tokens[n_chunk][n_ctx]
 *   then per chunk, per scored position (n_ctx - 1 - n_ctx/2 of them, from position n_ctx/2):
 *   a row of nv = 2*((n_vocab+1)/2) + 4 uint16: f32 scale, f32 min_log_prob, n_vocab uint16
 *   codes (log p = scale * code + min_log_prob, codes cover at most 16 nats below the top
 *   logit, 0 below that), and one zero uint16 of padding when n_vocab is odd.
 * The tokens are the text's own (the BOS put at each chunk's start is not written). */
#ifndef QD_MODEL_KLD_H
#define QD_MODEL_KLD_H

#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "../../kernels/registry.h"

#define QD_KLD_MAGIC "_logits_"
#define QD_KLD_HEADER_BYTES 20 /* the magic and three int32 */

/* uint16 words in one scored position's row */
static inline int64_t qd_kld_row_words(int64_t n_vocab) { return 2 * ((n_vocab + 1) / 2) + 4; }
/* scored positions per chunk: n_ctx/2 .. n_ctx-2 (the last one predicts past the chunk) */
static inline int qd_kld_rows(int n_ctx) { return n_ctx - 1 - n_ctx / 2; }

/* ---- the base file, read ---- */

struct qd_kld_base {
    FILE *f;
    char *name;               /* for messages */
    int32_t n_ctx, n_vocab, n_chunk;
    int32_t *tokens;          /* [n_chunk][n_ctx] */
    int chunks_read;
};

/* Opens a base file and checks it whole before anything runs: the magic, n_ctx >= 4, n_vocab
 * and n_chunk >= 1, the size the header promises against the file's size (a truncated or
 * overlong file is named with both figures), every token inside [0, n_vocab). QD_OK, or QD_EIO /
 * QD_EINVAL / QD_ENOMEM with err. qd_kld_base_close frees it either way. */
enum qd_status qd_kld_base_open(const char *path, struct qd_kld_base *b, char *err, size_t errlen);
/* The same over an open stream of `size` bytes (the fuzzer's entry; the stream becomes b's). */
enum qd_status qd_kld_base_open_stream(FILE *f, const char *name, int64_t size, struct qd_kld_base *b, char *err,
                                       size_t errlen);
/* The next chunk's rows ([qd_kld_rows(n_ctx)][qd_kld_row_words(n_vocab)]), each row's scale and
 * min_log_prob checked (finite, scale >= 0, min_log_prob <= 0). */
enum qd_status qd_kld_base_read_chunk(struct qd_kld_base *b, uint16_t *rows, char *err, size_t errlen);
void qd_kld_base_close(struct qd_kld_base *b);

/* ---- the base file, written ---- */

struct qd_kld_writer {
    FILE *f;
    char *path, *tmp;         /* written under tmp beside path, renamed over it when complete */
    int64_t n_vocab;
    uint16_t *row;
};

/* Starts a base file: a temporary beside `path` holding the header and the tokens. An existing
 * file at path is replaced when qd_kld_writer_commit succeeds (llama-perplexity overwrites it
 * too), and left as it was on any failure. */
enum qd_status qd_kld_writer_open(const char *path, int32_t n_ctx, int32_t n_vocab, int32_t n_chunk,
                                  const int32_t *tokens, struct qd_kld_writer *w, char *err, size_t errlen);
/* One chunk: `rows` rows of logits and each row's next token; adds each row's negative
 * log-likelihood (llama-perplexity's float figure) to *nll and its square to *nll2. */
enum qd_status qd_kld_writer_chunk(struct qd_kld_writer *w, const float *logits, int rows, const int32_t *targets,
                                   double *nll, double *nll2, char *err, size_t errlen);
enum qd_status qd_kld_writer_commit(struct qd_kld_writer *w, char *err, size_t errlen);
void qd_kld_writer_abort(struct qd_kld_writer *w); /* removes the temporary; a no-op after commit */

/* One row encoded as llama-perplexity's log_softmax(n_vocab, logits, log_prob, tok) does
 * (row: qd_kld_row_words(n_vocab) words); returns the token's negative log-likelihood. */
double qd_kld_encode_row(const float *logits, int64_t n_vocab, int32_t tok, uint16_t *row);

/* ---- the statistics ---- */

struct qd_kld_stats {
    double sum_nll, sum_nll2, sum_nll_base, sum_nll_base2, sum_nll_nll_base;
    double sum_kld, sum_kld2, sum_p_diff, sum_p_diff2, sum_p_diff4;
    float max_p_diff;
    int64_t n_same_top, count, capacity;
    float *kld_values, *p_diff_values; /* one per scored position */
};

enum qd_status qd_kld_stats_init(struct qd_kld_stats *s, int64_t positions);
void qd_kld_stats_free(struct qd_kld_stats *s);
/* One scored position: the model's logits against the base row, tok the position's next token. */
void qd_kld_stats_add(struct qd_kld_stats *s, const float *logits, int64_t n_vocab, const uint16_t *base_row,
                      int32_t tok);
/* rows positions at once (on every core; the sums as qd_kld_stats_add row by row gives them):
 * logits [rows][n_vocab], base_rows [rows][qd_kld_row_words], targets [rows] */
void qd_kld_stats_add_rows(struct qd_kld_stats *s, const float *logits, int rows, int64_t n_vocab,
                           const uint16_t *base_rows, const int32_t *targets);
/* llama-perplexity's table: its header line, and the running line after chunk `chunk` (1-based). */
void qd_kld_print_header(FILE *out);
void qd_kld_print_chunk(const struct qd_kld_stats *s, int chunk, FILE *out);
/* The final statistics: llama-perplexity's three sections (printed to out, unless NULL, only
 * from 100 scored positions on, as it does) and every figure into `summary` (fractions, not
 * percent) whatever the count. Sorts the value arrays. */
void qd_kld_report(struct qd_kld_stats *s, FILE *out, cJSON *summary);

#endif
