/* quantd convert --kld TEXT: the converted model's KL divergence from its source over a text, as
 * `quantd perplexity --kl-divergence-base` on the source and then `--kl-divergence` on the output
 * compute it (llama-perplexity's statistics, server/model/kld.h), without their printed lines.
 *
 * The source's log-probabilities go through the base logits file itself, written to a temporary:
 * a row is n_vocab uint16 (llama-perplexity's encoding), so a 150k vocabulary over 100 chunks of
 * 512 tokens is 7.7 GB, more than memory should hold, and one chunk of rows at a time is read
 * back while the output runs. The figures are then those of the two commands by hand, bit for bit. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "model/engine.h"
#include "model/kld.h"
#include "model/model_input.h"
#include "model/ppl.h"

int qd_cli_kld_prepare(const char *prog, struct qd_cli_kld *k)
{
    char err[1024];
    struct stat st;
    if (!stat(k->source, &st) && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: --kld runs the model, and the engine runs GGUF files: %s is a directory (a Hugging Face "
                "model); convert a GGUF (or leave --kld out)\n", prog, k->source);
        return 2;
    }
    struct qd_model m;
    enum qd_status status;
    memset(&m, 0, sizeof m);
    if (qd_model_open(k->source, &m, &status, err, sizeof err)) {
        fprintf(stderr, "%s: --kld: the engine cannot run %s: %s\n", prog, k->source, err);
        qd_model_close(&m);
        return 1;
    }
    qd_model_close(&m);
    int64_t n = 0;
    if (!(k->tokens = qd_model_input_tokens(k->source, k->text, NULL, &n, err, sizeof err))) {
        fprintf(stderr, "%s: --kld: %s\n", prog, err);
        return 1;
    }
    /* quantd perplexity's (and llama-perplexity's) rule: two chunks' worth of tokens */
    if (n < 2 * (int64_t)k->n_ctx) {
        fprintf(stderr, "%s: --kld %s: the text gives %" PRId64 " tokens, and a KL divergence over chunks of %d "
                "tokens needs at least %d (as quantd perplexity does): give a longer text or a smaller --kld-ctx\n",
                prog, k->text, n, k->n_ctx, 2 * k->n_ctx);
        return 1;
    }
    const int64_t fit = n / k->n_ctx;
    k->n_chunks = k->max_chunks < 0 || k->max_chunks > fit ? (int)fit : k->max_chunks;
    return 0;
}

void qd_cli_kld_free(struct qd_cli_kld *k)
{
    free(k->tokens);
    k->tokens = NULL;
}

struct pass {
    const int32_t *tokens; /* the text's own (a target is never the substituted BOS) */
    int n_ctx;
    struct qd_kld_writer *writer; /* the source's pass */
    struct qd_ppl sum;
    struct qd_kld_base *base;     /* the output's pass */
    struct qd_kld_stats *kld;
    uint16_t *rows;
    char err[512];
};

static int on_logits(void *ctx, int chunk, int from, int rows, const float *logits, int64_t n_vocab)
{
    struct pass *p = ctx;
    const int32_t *targets = p->tokens + (int64_t)chunk * p->n_ctx + from + 1;
    if (p->writer) { /* the last position predicts past the chunk */
        if (qd_kld_writer_chunk(p->writer, logits, rows - 1, targets, &p->sum.nll, &p->sum.nll2, p->err, sizeof p->err))
            return 1;
        p->sum.count += rows - 1;
        return 0;
    }
    if (qd_kld_base_read_chunk(p->base, p->rows, p->err, sizeof p->err))
        return 1;
    qd_kld_stats_add_rows(p->kld, logits, rows - 1, n_vocab, p->rows, targets);
    return 0;
}

/* One model over the chunks (each chunk's first token BOS where its vocabulary adds one). */
static int pass_run(const char *prog, const char *what, const char *path, const struct qd_cli_kld *k, struct pass *p,
                    int64_t *n_vocab, double *seconds)
{
    char err[1024];
    struct qd_model m;
    enum qd_status status;
    int rc = 1;
    int32_t *chunks = NULL;
    memset(&m, 0, sizeof m);
    if (qd_model_open(path, &m, &status, err, sizeof err)) {
        fprintf(stderr, "%s: --kld: the engine cannot run the %s %s: %s\n", prog, what, path, err);
        goto done;
    }
    if (*n_vocab && m.hp.n_vocab != *n_vocab) {
        fprintf(stderr, "%s: --kld: the %s %s has a vocabulary of %" PRId64 " tokens, the source %" PRId64 "\n", prog,
                what, path, m.hp.n_vocab, *n_vocab);
        goto done;
    }
    *n_vocab = m.hp.n_vocab;
    const size_t n = (size_t)k->n_chunks * (size_t)k->n_ctx;
    if (!(chunks = malloc(n * sizeof *chunks))) {
        fprintf(stderr, "%s: --kld: no memory for %zu tokens\n", prog, n);
        goto done;
    }
    memcpy(chunks, k->tokens, n * sizeof *chunks);
    for (int c = 0; m.add_bos && c < k->n_chunks; c++)
        chunks[(int64_t)c * k->n_ctx] = m.bos;
    struct qd_engine_opts o = {.n_ctx = k->n_ctx, .logits_from = k->n_ctx / 2, .threads = k->threads,
                               .cache_k = QD_F16, .cache_v = QD_F16}; /* quantd perplexity's defaults */
    struct qd_engine_hooks h = {.ctx = p, .on_logits = on_logits, .cancel = k->cancel};
    struct qd_engine_stats stats;
    if (qd_engine_run(&m, chunks, k->n_chunks, &o, &h, &stats, err, sizeof err) != QD_OK) {
        fprintf(stderr, "%s: --kld: the %s %s: %s\n", prog, what, path, p->err[0] ? p->err : err);
        goto done;
    }
    *seconds += stats.seconds;
    rc = 0;
done:
    free(chunks);
    qd_model_close(&m);
    return rc;
}

/* from's members into `into`, under their names, in order */
static void move_items(cJSON *from, cJSON *into)
{
    cJSON *item;
    while ((item = from->child)) {
        cJSON_DetachItemViaPointer(from, item);
        char *name = item->string; /* the item's own key: added under a copy, then freed */
        item->string = NULL;
        cJSON_AddItemToObject(into, name, item);
        cJSON_free(name);
    }
}

int qd_cli_kld_measure(const char *prog, const struct qd_cli_kld *k, const char *output, const char *base_path,
                       cJSON *into)
{
    char err[1024];
    int64_t n_vocab = 0;
    double seconds = 0;
    int rc = 1;
    struct qd_kld_writer writer = {0};
    struct qd_kld_base base;
    struct qd_kld_stats kld = {0};
    struct pass p = {.tokens = k->tokens, .n_ctx = k->n_ctx};
    memset(&base, 0, sizeof base);
    /* the source: its log-probabilities written as --kl-divergence-base writes them (the header
     * wants the vocabulary's size first) */
    struct qd_model m;
    enum qd_status status;
    memset(&m, 0, sizeof m);
    if (qd_model_open(k->source, &m, &status, err, sizeof err)) {
        fprintf(stderr, "%s: --kld: %s: %s\n", prog, k->source, err);
        qd_model_close(&m);
        return 1;
    }
    const int32_t vocab = (int32_t)m.hp.n_vocab;
    qd_model_close(&m);
    if (qd_kld_writer_open(base_path, k->n_ctx, vocab, k->n_chunks, k->tokens, &writer, err, sizeof err)) {
        fprintf(stderr, "%s: --kld: %s\n", prog, err);
        return 1;
    }
    p.writer = &writer;
    if (pass_run(prog, "source", k->source, k, &p, &n_vocab, &seconds))
        goto done;
    if (qd_kld_writer_commit(&writer, err, sizeof err)) {
        fprintf(stderr, "%s: --kld: %s\n", prog, err);
        goto done;
    }
    /* the output against it, as --kl-divergence reads it */
    const int rows = qd_kld_rows(k->n_ctx);
    if (qd_kld_base_open(base_path, &base, err, sizeof err) ||
        (qd_kld_stats_init(&kld, (int64_t)k->n_chunks * rows) != QD_OK && snprintf(err, sizeof err, "no memory")) ||
        (!(p.rows = malloc((size_t)rows * 2 * (size_t)qd_kld_row_words(vocab))) && snprintf(err, sizeof err,
                                                                                             "no memory"))) {
        fprintf(stderr, "%s: --kld: %s\n", prog, err);
        goto done;
    }
    p.writer = NULL, p.base = &base, p.kld = &kld;
    if (pass_run(prog, "output", output, k, &p, &n_vocab, &seconds))
        goto done;
    cJSON *r = cJSON_CreateObject(), *figures;
    qd_kld_report(&kld, NULL, r);
    cJSON_AddStringToObject(into, "text", k->text);
    cJSON_AddNumberToObject(into, "n_ctx", k->n_ctx);
    cJSON_AddNumberToObject(into, "chunks", k->n_chunks);
    cJSON_AddNumberToObject(into, "tokens_scored", (double)kld.count);
    /* kld.h's figures flat under "kld": the divergence's own (mean, mean_error, median, the
     * percentiles), then same_top_p and the perplexities and delta-p as objects */
    if ((figures = cJSON_DetachItemFromObject(r, "kld")))
        move_items(figures, into);
    cJSON_Delete(figures);
    move_items(r, into);
    cJSON_Delete(r);
    cJSON_AddNumberToObject(into, "seconds", seconds);
    rc = 0;
done:
    free(p.rows);
    qd_kld_stats_free(&kld);
    qd_kld_base_close(&base);
    qd_kld_writer_abort(&writer); /* an unfinished temporary; nothing after a commit */
    unlink(base_path);
    return rc;
}
