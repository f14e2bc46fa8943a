/* quantd perplexity's run (perplexity_run.h). */
#include "model/perplexity_run.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/files.h"
#include "model/engine.h"
#include "model/kld.h"
#include "model/model_input.h"
#include "model/ppl.h"

struct ppl {
    const int32_t *tokens; /* the original tokens (targets are never a substituted BOS) */
    int n_ctx, first, n_chunks;
    struct qd_ppl sum;
    FILE *out, *log;
    FILE *dump;
    struct qd_kld_writer *writer; /* --kl-divergence-base alone */
    struct qd_kld_base *base;     /* --kl-divergence: the base's rows, read chunk by chunk */
    struct qd_kld_stats *kld;
    uint16_t *base_rows;
    const struct qd_run_io *io;
    struct qd_run_progress progress;
    char hook_err[512];
    enum qd_status hook_status; /* what stopped the run from a hook: a damaged base, a failed write */
};

static void tell(struct ppl *p, const char *stage)
{
    p->progress.stage = stage;
    if (p->io->progress)
        p->io->progress(p->io->ctx, &p->progress);
}

/* --kl-divergence: the chunk's rows against the base's, and llama-perplexity's running line */
static int kld_chunk(struct ppl *p, int chunk, int rows, const float *logits, int64_t n_vocab, const int32_t *targets)
{
    if ((p->hook_status = qd_kld_base_read_chunk(p->base, p->base_rows, p->hook_err, sizeof p->hook_err)) != QD_OK)
        return 1;
    qd_kld_stats_add_rows(p->kld, logits, rows - 1, n_vocab, p->base_rows, targets);
    if (chunk == 0)
        qd_kld_print_header(p->out);
    qd_kld_print_chunk(p->kld, chunk + 1, p->out);
    return 0;
}

static int score_chunk(struct ppl *p, int chunk, int rows, const float *logits, int64_t n_vocab)
{
    const int32_t *targets = p->tokens + (int64_t)chunk * p->n_ctx + p->first + 1;
    if (p->kld)
        return kld_chunk(p, chunk, rows, logits, n_vocab, targets);
    if (p->writer) { /* llama-perplexity sums its float figure when it writes a base */
        if ((p->hook_status = qd_kld_writer_chunk(p->writer, logits, rows - 1, targets, &p->sum.nll, &p->sum.nll2,
                                                  p->hook_err, sizeof p->hook_err)) != QD_OK)
            return 1;
        p->sum.count += rows - 1;
    } else /* the last position predicts past the chunk */
        qd_ppl_add(&p->sum, logits, rows - 1, n_vocab, targets);
    fprintf(p->out, "[%d]%.4lf,", chunk + 1, qd_ppl_running(&p->sum));
    const size_t n_logits = (size_t)rows * (size_t)n_vocab;
    if (p->dump && fwrite(logits, sizeof *logits, n_logits, p->dump) != n_logits) {
        snprintf(p->hook_err, sizeof p->hook_err, "%s", strerror(errno));
        p->hook_status = QD_EIO;
        return 1;
    }
    return 0;
}

static int on_logits(void *ctx, int chunk, int from, int rows, const float *logits, int64_t n_vocab)
{
    struct ppl *p = ctx;
    if (score_chunk(p, chunk, rows, logits, n_vocab))
        return 1;
    p->progress.chunks_done = chunk + 1;
    tell(p, "chunks");
    return 0;
}

static void on_progress(void *ctx, int done, int total)
{
    struct ppl *p = ctx;
    p->progress.layers_total = total - 1; /* (the engine counts the head as a last step) */
    p->progress.layers_done = done < total ? done : total - 1;
    tell(p, done < total ? "layers" : "done");
}

/* whether two paths name one existing file (an output must not replace an input) */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && !stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* the run's backend, time and memory, in each summary */
static void add_run(cJSON *j, const struct qd_perplexity_opts *o, const struct qd_engine_stats *stats)
{
    cJSON_AddStringToObject(j, "backend", o->nn ? o->nn->name : "cpu");
    cJSON_AddNumberToObject(j, "chunks_together", stats->chunks_together);
    cJSON_AddNumberToObject(j, "seconds", stats->seconds);
    cJSON_AddNumberToObject(j, "read_seconds", stats->read_seconds);
    cJSON_AddNumberToObject(j, "load_wait_seconds", stats->load_wait_seconds);
    cJSON *mem = cJSON_AddObjectToObject(j, "memory");
    cJSON_AddNumberToObject(mem, "peak_bytes", (double)stats->peak_bytes);
    cJSON_AddNumberToObject(mem, "hidden_bytes", (double)stats->hidden_bytes);
    cJSON_AddNumberToObject(mem, "block_bytes", (double)stats->block_bytes);
    cJSON_AddNumberToObject(mem, "scratch_bytes", (double)stats->scratch_bytes);
    cJSON_AddNumberToObject(mem, "head_bytes", (double)stats->head_bytes);
    cJSON_AddNumberToObject(mem, "peak_rss_bytes", (double)qd_peak_rss_bytes());
    cJSON_AddNumberToObject(mem, "device_peak_bytes", (double)stats->device_peak_bytes);
}

/* The engine's failure: a hook's message first, a stop asked by the caller as QD_ECANCELED. */
static enum qd_status run_failed(const struct ppl *p, enum qd_status st, const char *engine_err, char *err,
                                 size_t errlen)
{
    snprintf(err, errlen, "%s", p->hook_err[0] ? p->hook_err : engine_err);
    return p->hook_err[0] && st == QD_ECANCELED ? p->hook_status : st;
}

/* --kl-divergence: the model over the base file's tokens, against its log-probabilities, as
 * llama-perplexity's kl_divergence() (the chunks and n_ctx are the file's). */
static enum qd_status kld_run(const struct qd_perplexity_opts *o, struct ppl *p, cJSON **summary, char *err,
                              size_t errlen)
{
    struct qd_kld_base base;
    struct qd_model m;
    struct qd_kld_stats kld = {0};
    enum qd_status status = QD_EINVAL;
    int32_t *given = NULL, *chunks = NULL;
    memset(&m, 0, sizeof m);
    if ((status = qd_kld_base_open(o->kld_base, &base, err, errlen)) != QD_OK)
        goto done;
    status = QD_EINVAL;
    const int n_ctx = base.n_ctx;
    if (o->n_ctx && o->n_ctx < n_ctx) {
        snprintf(err, errlen, "%s has been computed with n_ctx %d, while -c is %d: give -c %d (or leave -c out: the "
                 "base's is used)", o->kld_base, n_ctx, o->n_ctx, n_ctx);
        goto done;
    }
    if (o->tokens || o->text) { /* optional: then it must be the text the base was computed over */
        int64_t n_given = 0;
        if (!(given = qd_model_input_tokens(o->model, o->tokens ? NULL : o->text, o->tokens, &n_given, err, errlen)))
            goto done;
        const int64_t n_base = (int64_t)base.n_chunk * n_ctx;
        int64_t at = 0;
        while (at < n_base && at < n_given && given[at] == base.tokens[at])
            at++;
        if (at < n_base) {
            snprintf(err, errlen, "%s holds the log-probabilities of %d chunks of %d tokens, but the tokens of %s %s "
                     "(token %" PRId64 "): the base was computed over another text; leave -f/--tokens out to use the "
                     "base's", o->kld_base, base.n_chunk, n_ctx, o->tokens ? o->tokens : o->text,
                     at == n_given ? "end first" : "differ", at);
            goto done;
        }
    }
    char msg[1024];
    if (qd_model_open(o->model, &m, &status, msg, sizeof msg)) {
        snprintf(err, errlen, "%s: %s", o->model, msg);
        goto done;
    }
    status = QD_EINVAL;
    if (m.hp.n_vocab != base.n_vocab) {
        snprintf(err, errlen, "inconsistent vocabulary: %s holds log-probabilities over %d tokens, %s has %" PRId64
                 ": the base must come from a model with the same vocabulary", o->kld_base, base.n_vocab, o->model,
                 m.hp.n_vocab);
        goto done;
    }
    const int n_chunks = o->max_chunks >= 0 && o->max_chunks < base.n_chunk ? o->max_chunks : base.n_chunk;
    if (n_chunks < 1) {
        snprintf(err, errlen, "--chunks 0 scores nothing");
        goto done;
    }
    const int rows = qd_kld_rows(n_ctx);
    p->tokens = base.tokens, p->n_ctx = n_ctx, p->first = n_ctx / 2, p->n_chunks = n_chunks, p->base = &base;
    p->kld = &kld;
    p->progress.chunks_total = n_chunks;
    if (qd_kld_stats_init(&kld, (int64_t)n_chunks * rows) ||
        !(p->base_rows = malloc((size_t)rows * 2 * (size_t)qd_kld_row_words(base.n_vocab))) ||
        !(chunks = malloc((size_t)n_chunks * (size_t)n_ctx * sizeof *chunks))) {
        snprintf(err, errlen, "no memory for %d chunks of %d positions over %d tokens", n_chunks, rows, base.n_vocab);
        status = QD_ENOMEM;
        goto done;
    }
    memcpy(chunks, base.tokens, (size_t)n_chunks * (size_t)n_ctx * sizeof *chunks);
    for (int c = 0; m.add_bos && c < n_chunks; c++)
        chunks[(int64_t)c * n_ctx] = m.bos;
    const int n_seq = o->n_batch / n_ctx > 1 ? o->n_batch / n_ctx : 1;
    fprintf(p->log, "kl_divergence: computing over %d chunks, n_ctx=%d, batch_size=%d, n_seq=%d\n", n_chunks, n_ctx,
            o->n_batch, n_seq);
    struct qd_engine_opts eo = {.nn = o->nn, .n_ctx = n_ctx, .logits_from = n_ctx / 2, .threads = o->threads,
                                .cache_k = o->cache_k, .cache_v = o->cache_v};
    struct qd_engine_hooks h = {.ctx = p, .on_logits = on_logits, .on_progress = on_progress, .cancel = o->io.cancel};
    struct qd_engine_stats stats;
    status = qd_engine_run(&m, chunks, n_chunks, &eo, &h, &stats, msg, sizeof msg);
    if (status != QD_OK) {
        status = run_failed(p, status, msg, err, errlen);
        goto done;
    }
    fprintf(p->out, "\n");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", o->model);
    cJSON_AddStringToObject(j, "kl_divergence_base", o->kld_base);
    cJSON_AddStringToObject(j, "architecture", m.arch_name);
    cJSON_AddNumberToObject(j, "tokens_scored", (double)kld.count);
    cJSON_AddNumberToObject(j, "chunks", n_chunks);
    cJSON_AddNumberToObject(j, "n_ctx", n_ctx);
    qd_kld_report(&kld, p->out, j);
    cJSON_AddStringToObject(j, "cache_type_k", qd_dtype_name(o->cache_k));
    cJSON_AddStringToObject(j, "cache_type_v", qd_dtype_name(o->cache_v));
    add_run(j, o, &stats);
    fprintf(p->out, "\n");
    *summary = j;
done:
    free(p->base_rows);
    qd_kld_stats_free(&kld);
    free(chunks);
    free(given);
    qd_kld_base_close(&base);
    qd_model_close(&m);
    return status;
}

/* The logits dump, beside its name until it is whole. */
static FILE *dump_open(const char *path, char **tmp, char *err, size_t errlen)
{
    size_t n = strlen(path) + 16;
    int fd = -1;
    FILE *f = NULL;
    if ((*tmp = malloc(n))) {
        snprintf(*tmp, n, "%s.tmp-XXXXXX", path);
        if ((fd = mkstemp(*tmp)) >= 0 && !(f = fdopen(fd, "wb")))
            close(fd), unlink(*tmp);
    }
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        free(*tmp);
        *tmp = NULL;
    }
    return f;
}

/* The perplexity over the text's chunks (and the base file, when asked). */
static enum qd_status ppl_run(const struct qd_perplexity_opts *o, struct ppl *p, cJSON **summary, char *err,
                              size_t errlen)
{
    const int n_ctx = o->n_ctx ? o->n_ctx : 512;
    int64_t n_tokens = 0;
    int32_t *tokens = qd_model_input_tokens(o->model, o->tokens ? NULL : o->text, o->tokens, &n_tokens, err, errlen);
    if (!tokens)
        return QD_EINVAL;
    struct qd_model m;
    enum qd_status status;
    char msg[1024], *dump_tmp = NULL;
    if (qd_model_open(o->model, &m, &status, msg, sizeof msg)) {
        snprintf(err, errlen, "%s: %s", o->model, msg);
        qd_model_close(&m);
        free(tokens);
        return status;
    }
    status = QD_EINVAL;
    int32_t *chunks = NULL;
    p->tokens = tokens, p->n_ctx = n_ctx, p->first = n_ctx / 2;
    struct qd_kld_writer writer = {0};
    if (n_tokens < 2 * (int64_t)n_ctx) {
        snprintf(err, errlen, "you need at least %d tokens to evaluate perplexity with a context of %d; the token file "
                 "holds only %" PRId64 " tokens (give a longer text or a smaller -c)", 2 * n_ctx, n_ctx, n_tokens);
        goto done;
    }
    const int64_t max_fit = n_tokens / n_ctx;
    p->n_chunks = o->max_chunks < 0 || o->max_chunks > max_fit ? (int)max_fit : o->max_chunks;
    p->progress.chunks_total = p->n_chunks;
    if (p->n_chunks < 1) {
        snprintf(err, errlen, "--chunks 0 scores nothing");
        goto done;
    }
    if (n_ctx > m.hp.n_ctx_train)
        fprintf(p->log, "perplexity: model was trained on only %" PRId64 " context tokens (%d specified)\n",
                m.hp.n_ctx_train, n_ctx);
    for (int64_t i = 0; i < (int64_t)p->n_chunks * n_ctx; i++)
        if (tokens[i] >= m.hp.n_vocab) {
            snprintf(err, errlen, "token %" PRId64 " of the file is %" PRId32 ", outside the model's vocabulary of %"
                     PRId64 ": the tokens were made for another model", i, tokens[i], m.hp.n_vocab);
            goto done;
        }
    /* the chunks as the model sees them: the first token of each replaced by BOS */
    if (!(chunks = malloc((size_t)p->n_chunks * (size_t)n_ctx * sizeof *chunks))) {
        snprintf(err, errlen, "no memory");
        status = QD_ENOMEM;
        goto done;
    }
    memcpy(chunks, tokens, (size_t)p->n_chunks * (size_t)n_ctx * sizeof *chunks);
    for (int c = 0; m.add_bos && c < p->n_chunks; c++)
        chunks[(int64_t)c * n_ctx] = m.bos;
    if (o->kld_base && (same_file(o->kld_base, o->model) || same_file(o->kld_base, o->tokens))) {
        snprintf(err, errlen, "--kl-divergence-base %s names the %s: give the base logits a file of their own",
                 o->kld_base, same_file(o->kld_base, o->model) ? "model" : "token file");
        goto done;
    }
    if (o->kld_base) {
        if ((status = qd_kld_writer_open(o->kld_base, n_ctx, (int32_t)m.hp.n_vocab, p->n_chunks, tokens, &writer, err,
                                         errlen)) != QD_OK)
            goto done;
        status = QD_EINVAL;
        p->writer = &writer;
        fprintf(p->log, "perplexity: saving all logits to %s\n", o->kld_base);
    }
    if (o->dump_logits && !(p->dump = dump_open(o->dump_logits, &dump_tmp, err, errlen))) {
        status = QD_EIO;
        goto done;
    }
    const int n_seq = o->n_batch / n_ctx > 1 ? o->n_batch / n_ctx : 1;
    fprintf(p->log, "perplexity: calculating perplexity over %d chunks, n_ctx=%d, batch_size=%d, n_seq=%d\n",
            p->n_chunks, n_ctx, o->n_batch < n_seq * n_ctx ? o->n_batch : n_seq * n_ctx, n_seq);

    struct qd_engine_opts eo = {.nn = o->nn, .n_ctx = n_ctx, .logits_from = p->first, .threads = o->threads,
                                .cache_k = o->cache_k, .cache_v = o->cache_v};
    struct qd_engine_hooks h = {.ctx = p, .on_logits = on_logits, .on_progress = on_progress, .cancel = o->io.cancel};
    struct qd_engine_stats stats;
    status = qd_engine_run(&m, chunks, p->n_chunks, &eo, &h, &stats, msg, sizeof msg);
    fprintf(p->out, "\n");
    if (status != QD_OK) {
        status = run_failed(p, status, msg, err, errlen);
        goto done;
    }
    status = QD_EIO;
    FILE *dump = p->dump;
    p->dump = NULL;
    if (dump && (fclose(dump) || rename(dump_tmp, o->dump_logits))) {
        snprintf(err, errlen, "%s: %s", o->dump_logits, strerror(errno));
        goto done;
    }
    if (dump) {
        free(dump_tmp);
        dump_tmp = NULL;
    }
    if (p->writer && (status = qd_kld_writer_commit(p->writer, err, errlen)) != QD_OK)
        goto done;
    /* llama-perplexity's final estimate and its error: the standard error of the mean NLL,
     * carried to the perplexity by its derivative */
    double mean, err_nll;
    const int var_ok = qd_ppl_final(&p->sum, &mean, &err_nll) == 0;
    const double ppl = exp(mean), count = (double)p->sum.count;
    if (var_ok)
        fprintf(p->log, "Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, err_nll * ppl);
    else
        fprintf(p->log, "Unexpected negative standard deviation of log(prob)\n");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", o->model);
    cJSON_AddStringToObject(j, "architecture", m.arch_name);
    if (o->kld_base)
        cJSON_AddStringToObject(j, "kl_divergence_base", o->kld_base);
    cJSON_AddNumberToObject(j, "ln_ppl", mean);
    cJSON_AddNumberToObject(j, "ln_ppl_error", err_nll);
    cJSON_AddNumberToObject(j, "ppl", ppl);
    cJSON_AddNumberToObject(j, "ppl_error", err_nll * ppl);
    cJSON_AddNumberToObject(j, "tokens_scored", count);
    cJSON_AddNumberToObject(j, "chunks", p->n_chunks);
    cJSON_AddNumberToObject(j, "n_ctx", n_ctx);
    cJSON_AddStringToObject(j, "cache_type_k", qd_dtype_name(o->cache_k));
    cJSON_AddStringToObject(j, "cache_type_v", qd_dtype_name(o->cache_v));
    add_run(j, o, &stats);
    *summary = j;
    status = QD_OK;
done:
    if (p->writer)
        qd_kld_writer_abort(p->writer); /* removes an unfinished file; nothing after a commit */
    if (p->dump)
        fclose(p->dump);
    if (dump_tmp)
        unlink(dump_tmp);
    free(dump_tmp);
    free(chunks);
    free(tokens);
    qd_model_close(&m);
    return status;
}

enum qd_status qd_perplexity_run(const struct qd_perplexity_opts *o, cJSON **summary, char *err, size_t errlen)
{
    *summary = NULL;
    err[0] = 0;
    struct qd_perplexity_opts d = *o;
    if (!d.n_batch)
        d.n_batch = 2048;
    struct ppl p = {.io = &o->io, .out = qd_run_io_open(&o->io, QD_RUN_OUT), .log = qd_run_io_open(&o->io, QD_RUN_LOG)};
    enum qd_status st = QD_ENOMEM;
    if (!p.out || !p.log)
        snprintf(err, errlen, "no memory");
    else if (d.kl_divergence && !d.kld_base)
        snprintf(err, errlen, "--kl-divergence needs --kl-divergence-base FILE, the base model's log-probabilities "
                 "(written by a run of the base model with --kl-divergence-base FILE alone)"), st = QD_EINVAL;
    else if (!d.model || (!d.kl_divergence && !d.text && !d.tokens))
        snprintf(err, errlen, "%s is required", !d.model ? "-m MODEL" : "-f TEXT or --tokens FILE"), st = QD_EINVAL;
    else
        st = d.kl_divergence ? kld_run(&d, &p, summary, err, errlen) : ppl_run(&d, &p, summary, err, errlen);
    if (p.out)
        fclose(p.out);
    if (p.log)
        fclose(p.log);
    return st;
}
