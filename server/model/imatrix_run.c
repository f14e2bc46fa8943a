/* quantd imatrix's run (imatrix_run.h). */
#include "model/imatrix_run.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/files.h"
#include "model/imatrix_collect.h"
#include "model/model_input.h"
#include "model/ppl.h"

/* ---- the perplexity alongside (compute_imatrix's process_logits) ------------------------------ */

struct run {
    struct qd_imatrix_collector *c;
    const int32_t *tokens; /* the original tokens (targets are never a substituted BOS) */
    int n_ctx, first, ppl;
    int chunk_base; /* the first chunk of this engine run */
    struct qd_ppl ppl_sum;
    FILE *out;
    const struct qd_run_io *io;
    struct qd_run_progress progress;
    int cancelled; /* the caller's flag stopped it (the collector's stop is the engine's flag) */
};

/* The caller's cancel flag, passed on to the engine's (the collector's stop). */
static int stopping(struct run *r)
{
    if (r->io->cancel && *r->io->cancel && !r->c->stop)
        r->cancelled = 1, r->c->stop = 1;
    return r->c->stop;
}

static void tell(struct run *r, const char *stage)
{
    r->progress.stage = stage;
    if (r->io->progress)
        r->io->progress(r->io->ctx, &r->progress);
}

static int on_logits(void *ctx, int chunk, int from, int rows, const float *logits, int64_t n_vocab)
{
    struct run *r = ctx;
    chunk += r->chunk_base;
    if (r->ppl) {
        /* positions n_ctx/2 .. n_ctx-2 predict the next token (from is 0 with --process-output) */
        const int skip = r->first - from;
        const int32_t *targets = r->tokens + (int64_t)chunk * r->n_ctx + r->first + 1;
        qd_ppl_add(&r->ppl_sum, logits + (int64_t)skip * n_vocab, rows - skip - 1, n_vocab, targets);
        fprintf(r->out, "[%d]%.4lf,", chunk + 1, qd_ppl_running(&r->ppl_sum));
    }
    r->progress.chunks_done = chunk + 1;
    tell(r, "chunks");
    return stopping(r);
}

static void on_matmul_input(void *ctx, int layer, const char *weight, const float *x, int64_t T, int64_t K)
{
    struct run *r = ctx;
    if (!stopping(r))
        qd_imatrix_collect_matmul(r->c, layer, weight, x, T, K);
}

static void on_matmul_expert_input(void *ctx, int layer, const char *weight, int expert, int n_expert, const float *x,
                                   int64_t rows, int64_t K)
{
    struct run *r = ctx;
    if (!stopping(r))
        qd_imatrix_collect_expert_matmul(r->c, layer, weight, expert, n_expert, x, rows, K);
}

static void on_matmul_head_input(void *ctx, int layer, const char *weight, int head, int n_head, const float *x,
                                 int64_t T, int64_t K)
{
    struct run *r = ctx;
    if (!stopping(r))
        qd_imatrix_collect_head_matmul(r->c, layer, weight, head, n_head, x, T, K);
}

static void on_progress(void *ctx, int done, int total)
{
    struct run *r = ctx;
    stopping(r);
    r->progress.layers_total = total - 1; /* (the engine counts the head as a last step) */
    r->progress.layers_done = done < total ? done : total - 1;
    tell(r, done < total ? "layers" : "done");
}

enum qd_status qd_imatrix_compute(const struct qd_imatrix_opts *o, struct qd_imatrix_sums *s, const int32_t *tokens,
                                  int64_t n_tokens, struct qd_imatrix_result *res, char *err, size_t errlen)
{
    const int n_ctx = o->n_ctx ? o->n_ctx : 512, n_batch = o->n_batch ? o->n_batch : 2048;
    char msg[1024];
    struct qd_model m;
    enum qd_status status;
    memset(res, 0, sizeof *res);
    FILE *out = qd_run_io_open(&o->io, QD_RUN_OUT), *log = qd_run_io_open(&o->io, QD_RUN_LOG);
    int32_t *chunks = NULL;
    memset(&m, 0, sizeof m);
    if (!out || !log) {
        snprintf(err, errlen, "no memory");
        status = QD_ENOMEM;
        goto done;
    }
    if (qd_model_open(o->model, &m, &status, msg, sizeof msg)) {
        snprintf(err, errlen, "%s: %s", o->model, msg);
        goto done;
    }
    status = QD_EINVAL;
    if (o->from_chunk > 0) {
        if ((int64_t)(o->from_chunk + 2) * n_ctx >= n_tokens) {
            snprintf(err, errlen, "there will be not enough tokens left after removing %d chunks", o->from_chunk);
            goto done;
        }
        tokens += (int64_t)o->from_chunk * n_ctx, n_tokens -= (int64_t)o->from_chunk * n_ctx;
    }
    if (n_tokens < 2 * (int64_t)n_ctx) {
        snprintf(err, errlen, "you need at least %d tokens for a context of %d tokens; the token file holds only %"
                 PRId64 " (give a longer text or a smaller -c)", 2 * n_ctx, n_ctx, n_tokens);
        goto done;
    }
    const int64_t max_fit = n_tokens / n_ctx;
    const int n_chunks = o->max_chunks < 0 || o->max_chunks > max_fit ? (int)max_fit : o->max_chunks;
    if (n_chunks < 1) {
        snprintf(err, errlen, "--chunks 0 collects nothing");
        goto done;
    }
    if (n_ctx > m.hp.n_ctx_train)
        fprintf(log, "imatrix: model was trained on only %" PRId64 " context tokens (%d specified)\n",
                m.hp.n_ctx_train, n_ctx);
    for (int64_t i = 0; i < (int64_t)n_chunks * n_ctx; i++)
        if (tokens[i] >= m.hp.n_vocab) {
            snprintf(err, errlen, "token %" PRId64 " of the file is %" PRId32 ", outside the model's vocabulary of %"
                     PRId64 ": the tokens were made for another model", i, tokens[i], m.hp.n_vocab);
            goto done;
        }
    if (!(chunks = malloc((size_t)n_chunks * (size_t)n_ctx * sizeof *chunks))) {
        snprintf(err, errlen, "no memory");
        status = QD_ENOMEM;
        goto done;
    }
    memcpy(chunks, tokens, (size_t)n_chunks * (size_t)n_ctx * sizeof *chunks);
    for (int c = 0; m.add_bos && c < n_chunks; c++)
        chunks[(int64_t)c * n_ctx] = m.bos;
    const int n_seq = n_batch / n_ctx > 1 ? n_batch / n_ctx : 1;
    fprintf(log, "imatrix: computing over %d chunks, n_ctx=%d, batch_size=%d, n_seq=%d\n", n_chunks, n_ctx,
            n_batch < n_seq * n_ctx ? n_batch : n_seq * n_ctx, n_seq);

    /* llama-imatrix runs n_seq chunks to a batch, and its 16-token rule counts the batch's
     * tokens: chunks under 16 tokens are collected, except those of a last batch of fewer than
     * 16 tokens (its perplexity still counts; they run again without the collector) */
    int collected = n_chunks;
    struct qd_imatrix_collector c = {.sums = s, .process_output = o->process_output, .nn = o->nn};
    if (n_ctx < 16) {
        const int last = n_chunks - (n_chunks - 1) / n_seq * n_seq;
        collected = (int64_t)last * n_ctx < 16 ? n_chunks - last : n_chunks;
        c.min_tokens = 1;
    }
    const int ppl = !o->no_ppl;
    struct run r = {.c = &c, .tokens = tokens, .n_ctx = n_ctx, .first = n_ctx / 2, .ppl = ppl, .out = out,
                    .io = &o->io, .progress = {.chunks_total = n_chunks}};
    /* the head's rows: every position when its input is collected (llama-imatrix asks for
     * every logit), else the scored half */
    struct qd_engine_opts eo = {.nn = o->nn, .n_ctx = n_ctx, .logits_from = o->process_output ? 0 : n_ctx / 2,
                                .threads = o->threads, .cache_k = o->cache_k, .cache_v = o->cache_v};
    struct qd_engine_hooks h = {.ctx = &r, .on_logits = on_logits, .on_matmul_input = on_matmul_input,
                                .on_matmul_expert_input = on_matmul_expert_input,
                                .on_matmul_head_input = on_matmul_head_input, .on_progress = on_progress,
                                .cancel = &c.stop};
    status = collected ? qd_engine_run(&m, chunks, collected, &eo, &h, &res->stats, msg, sizeof msg) : QD_OK;
    if (status == QD_OK && c.status == QD_OK && collected < n_chunks && ppl) {
        h.on_matmul_input = NULL;
        h.on_matmul_expert_input = NULL;
        h.on_matmul_head_input = NULL;
        r.chunk_base = collected;
        status = qd_engine_run(&m, chunks + (int64_t)collected * n_ctx, n_chunks - collected, &eo, &h, &res->stats,
                               msg, sizeof msg);
    }
    if (ppl)
        fprintf(out, "\n");
    if (r.cancelled) {
        snprintf(err, errlen, "cancelled");
        status = QD_ECANCELED;
        goto done;
    }
    if (status != QD_OK || c.status != QD_OK) {
        snprintf(err, errlen, "%s", c.status != QD_OK ? c.err : msg);
        status = c.status != QD_OK ? c.status : status;
        goto done;
    }
    res->chunks = n_chunks;
    if (ppl) {
        double mean, err_nll;
        if (qd_ppl_final(&r.ppl_sum, &mean, &err_nll) == 0) {
            fprintf(out, "Final estimate: PPL = %.4lf +/- %.5lf\n", exp(mean), err_nll * exp(mean));
            res->ppl_ok = 1, res->ln_ppl = mean, res->ln_ppl_error = err_nll;
        } else
            fprintf(out, "Unexpected negative standard deviation of log(prob)\n");
    }
    fprintf(log, "imatrix: %.2f s (%.2f s reading weights), %.1f MiB at most", res->stats.seconds,
            res->stats.read_seconds, (double)res->stats.peak_bytes / 1048576.0);
    if (res->stats.device_peak_bytes)
        fprintf(log, ", %.1f MiB of %s memory at most", (double)res->stats.device_peak_bytes / 1048576.0,
                o->nn ? o->nn->name : "device");
    fprintf(log, "\n");
    status = QD_OK;
done:
    if (out)
        fclose(out);
    if (log)
        fclose(log);
    free(chunks);
    qd_model_close(&m);
    return status;
}

/* Adds the in_files (a value may list several, comma separated). */
static enum qd_status load_files(const struct qd_imatrix_opts *o, struct qd_imatrix_sums *s, FILE *log, char *err,
                                 size_t errlen)
{
    for (int i = 0; i < o->n_in_files; i++) {
        char *list = strdup(o->in_files[i]);
        if (!list) {
            snprintf(err, errlen, "no memory");
            return QD_ENOMEM;
        }
        for (char *save = NULL, *path = strtok_r(list, ",", &save); path; path = strtok_r(NULL, ",", &save)) {
            size_t len;
            char msg[600];
            fprintf(log, "imatrix: loading imatrix from '%s'\n", path);
            uint8_t *buf = qd_file_read(path, &len);
            int rc = buf ? qd_imatrix_sums_load(s, buf, len, msg, sizeof msg) : -1;
            if (rc)
                snprintf(err, errlen, "--in-file %s: %s", path, buf ? msg : strerror(errno));
            free(buf);
            if (rc) {
                free(list);
                return buf ? QD_EINVAL : QD_EIO;
            }
        }
        free(list);
    }
    return QD_OK;
}

enum qd_status qd_imatrix_run(const struct qd_imatrix_opts *o, cJSON **summary, char *err, size_t errlen)
{
    const char *out = o->output ? o->output : "imatrix.gguf";
    struct qd_imatrix_sums s = {.chunk_size = o->n_ctx ? o->n_ctx : 512};
    struct qd_imatrix_result res = {0};
    int32_t *tokens = NULL;
    enum qd_status st = QD_EINVAL;
    *summary = NULL;
    err[0] = 0;
    FILE *log = qd_run_io_open(&o->io, QD_RUN_LOG);
    if (!log) {
        snprintf(err, errlen, "no memory");
        return QD_ENOMEM;
    }
    /* the output's folder is checked before the run, not after it */
    const char *slash = strrchr(out, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out) + 1 : 1, slash ? out : ".");
    if (access(dir, W_OK)) {
        snprintf(err, errlen, "-o %s: the folder %s: %s", out, dir, strerror(errno));
        st = errno == ENOENT ? QD_ENOTFOUND : QD_EIO;
        goto done;
    }
    if (o->format == 0 && (strlen(out) < 5 || strcmp(out + strlen(out) - 5, ".gguf")))
        fprintf(log, "imatrix: saving imatrix using GGUF format with a different suffix than .gguf\n"
                "imatrix: if you want the previous imatrix format, use --output-format dat\n");
    if ((st = load_files(o, &s, log, err, errlen)) != QD_OK)
        goto done;
    if (o->tokens || o->text) {
        int64_t n_tokens = 0;
        if (!(tokens = qd_model_input_tokens(o->model, o->tokens ? NULL : o->text, o->tokens, &n_tokens, err,
                                             errlen))) {
            st = QD_EINVAL;
            goto done;
        }
        if ((st = qd_imatrix_compute(o, &s, tokens, n_tokens, &res, err, errlen)) != QD_OK)
            goto done;
    } else
        fprintf(log, "imatrix: no tokens given; combining precomputed matrices only\n");
    /* the dataset recorded: the text's name when it is given, else the token file's */
    const char *dataset = o->dataset ? o->dataset : o->text ? o->text : o->tokens; /* NULL: only combined */
    if (o->io.cancel && *o->io.cancel) {
        snprintf(err, errlen, "cancelled");
        st = QD_ECANCELED;
        goto done;
    }
    if (qd_imatrix_sums_write(&s, out, o->format == 2, dataset, err, errlen)) {
        st = QD_EIO;
        goto done;
    }
    fprintf(log, "imatrix: stored %d entries after %d chunks in %s\n", s.n, qd_imatrix_sums_chunks(&s), out);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "output", out);
    cJSON_AddStringToObject(j, "output_format", o->format == 2 ? "dat" : "gguf");
    if (o->model && dataset)
        cJSON_AddStringToObject(j, "model", o->model);
    if (dataset)
        cJSON_AddStringToObject(j, "dataset", dataset);
    cJSON_AddNumberToObject(j, "entries", s.n);
    cJSON_AddNumberToObject(j, "chunks", qd_imatrix_sums_chunks(&s));
    cJSON_AddNumberToObject(j, "chunks_computed", res.chunks);
    cJSON_AddNumberToObject(j, "n_ctx", s.chunk_size);
    cJSON_AddNumberToObject(j, "in_files", o->n_in_files);
    if (res.ppl_ok) {
        cJSON_AddNumberToObject(j, "ln_ppl", res.ln_ppl);
        cJSON_AddNumberToObject(j, "ln_ppl_error", res.ln_ppl_error);
        cJSON_AddNumberToObject(j, "ppl", exp(res.ln_ppl));
        cJSON_AddNumberToObject(j, "ppl_error", res.ln_ppl_error * exp(res.ln_ppl));
    }
    if (res.chunks) {
        cJSON_AddStringToObject(j, "backend", o->nn ? o->nn->name : "cpu");
        cJSON_AddNumberToObject(j, "seconds", res.stats.seconds);
        cJSON_AddNumberToObject(j, "read_seconds", res.stats.read_seconds);
        cJSON *mem = cJSON_AddObjectToObject(j, "memory");
        cJSON_AddNumberToObject(mem, "peak_bytes", (double)res.stats.peak_bytes);
        cJSON_AddNumberToObject(mem, "peak_rss_bytes", (double)qd_peak_rss_bytes());
        cJSON_AddNumberToObject(mem, "device_peak_bytes", (double)res.stats.device_peak_bytes);
    }
    *summary = j;
    st = QD_OK;
done:
    fclose(log);
    free(tokens);
    qd_imatrix_sums_free(&s);
    return st;
}
