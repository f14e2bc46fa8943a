/* bin/quantd perplexity: llama-perplexity's perplexity (tools/perplexity/perplexity.cpp,
 * perplexity()) from the layer-major engine (server/model/engine.h). The tokens are cut into
 * chunks of -c tokens, each chunk's first token replaced by BOS when the vocabulary adds one;
 * each chunk is scored over its second half (positions n_ctx/2 .. n_ctx-2 predicting the next
 * token), the statistics summed in double as llama-perplexity sums them. Its lines come out as it
 * prints them ("[1]x.xxxx,[2]..." on stdout, "Final estimate: PPL = X +/- Y" on stderr), then one
 * JSON summary line on stdout. --kl-divergence-base FILE also writes llama-perplexity's base
 * logits file; with --kl-divergence it reads one instead and prints its KL divergence table and
 * statistics (server/model/kld.h). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/files.h"
#include "model/engine.h"
#include "model/engine_backend.h"
#include "model/kld.h"
#include "model/model_input.h"
#include "model/ppl.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: quantd perplexity -m MODEL (-f TEXT | --tokens FILE) [-c N] [--chunks N] [-b N] [-t N]\n"
            "                         [--kl-divergence-base FILE [--kl-divergence]] [--backend B]\n"
            "                         [--max-device-bytes N]\n"
            "  llama-perplexity's perplexity of a GGUF model over a text's tokens, scored as it scores them:\n"
            "  chunks of -c tokens (default 512), each chunk's first token replaced by BOS when the\n"
            "  vocabulary adds one, each chunk scored over its second half.\n"
            "  -m MODEL         a GGUF model (a split model: its first shard); architectures: %s\n"
            "  --tokens FILE    the token ids: little-endian int32, or a JSON array of integers\n"
            "                   (llama-tokenize --ids --no-escape prints the one llama-perplexity\n"
            "                   scores: without --no-escape it reads \\n, \\x41 ... as escapes)\n"
            "  -f TEXT          a text file, tokenized with the model's vocabulary as llama-perplexity\n"
            "                   does (its BOS added); --tokens FILE gives the ids instead\n"
            "  -c N             tokens per chunk (--ctx-size; default 512)\n"
            "  --chunks N       at most N chunks (default: all that fit)\n"
            "  -b N             llama-perplexity's batch size (accepted; whole chunks run at once here)\n"
            "  -t N             threads (default: every core)\n"
            "  --backend B      auto (default: CUDA where built and a device answers, else the CPU), cpu\n"
            "                   or cuda: on CUDA the matmuls take bf16 inputs with f32 sums, so the\n"
            "                   figures differ from the CPU's f32 ones in their last digits\n"
            "  --max-device-bytes N  the most device memory the run may hold (4GiB, 512MiB, ...; default:\n"
            "                   the device's): the blocks stream through it one at a time, the chunks'\n"
            "                   hidden states stay in host memory when they do not fit\n"
            "  -ctk, -ctv TYPE  the KV cache's types (--cache-type-k/-v: f16, the default as in llama.cpp,\n"
            "                   bf16 or f32): keys and values rounded to them, as llama.cpp stores them\n"
            "  --dump-logits FILE  write each chunk's logits from position n_ctx/2 on, raw f32\n"
            "                   [chunks][n_ctx - n_ctx/2][n_vocab] (for comparisons)\n"
            "  --kl-divergence-base FILE  alone: also write the base model's log-probabilities to FILE in\n"
            "                   llama-perplexity's format (its --kl-divergence reads quantd's and the other\n"
            "                   way round); an existing FILE is replaced, as llama-perplexity replaces it,\n"
            "                   but only once the new one is whole (it is written beside it, then renamed)\n"
            "  --kl-divergence  read FILE instead and report this model's KL divergence from the base, its\n"
            "                   perplexity against the base's, delta-p and the share of the same top token,\n"
            "                   as llama-perplexity does; the tokens, -c and the chunks are the file's\n"
            "                   (--tokens, when given, must be the file's; -c below the file's is refused;\n"
            "                   --chunks N scores the first N of them)\n",
            qd_model_arch_names());
}

/* ---- the statistics ------------------------------------------------------------------------- */

struct ppl {
    const int32_t *tokens; /* the original tokens (targets are never a substituted BOS) */
    int n_ctx, first, n_chunks;
    struct qd_ppl sum;
    FILE *dump;
    struct qd_kld_writer *writer; /* --kl-divergence-base alone */
    struct qd_kld_base *base;     /* --kl-divergence: the base's rows, read chunk by chunk */
    struct qd_kld_stats *kld;
    uint16_t *base_rows;
    char hook_err[512];
};

/* --kl-divergence: the chunk's rows against the base's, and llama-perplexity's running line */
static int kld_chunk(struct ppl *p, int chunk, int rows, const float *logits, int64_t n_vocab, const int32_t *targets)
{
    if (qd_kld_base_read_chunk(p->base, p->base_rows, p->hook_err, sizeof p->hook_err))
        return 1;
    qd_kld_stats_add_rows(p->kld, logits, rows - 1, n_vocab, p->base_rows, targets);
    if (chunk == 0)
        qd_kld_print_header(stdout);
    qd_kld_print_chunk(p->kld, chunk + 1, stdout);
    return 0;
}

static int on_logits(void *ctx, int chunk, int from, int rows, const float *logits, int64_t n_vocab)
{
    struct ppl *p = ctx;
    const int32_t *targets = p->tokens + (int64_t)chunk * p->n_ctx + from + 1;
    if (p->kld)
        return kld_chunk(p, chunk, rows, logits, n_vocab, targets);
    if (p->writer) { /* llama-perplexity sums its float figure when it writes a base */
        if (qd_kld_writer_chunk(p->writer, logits, rows - 1, targets, &p->sum.nll, &p->sum.nll2, p->hook_err,
                                sizeof p->hook_err))
            return 1;
        p->sum.count += rows - 1;
    } else /* the last position predicts past the chunk */
        qd_ppl_add(&p->sum, logits, rows - 1, n_vocab, targets);
    printf("[%d]%.4lf,", chunk + 1, qd_ppl_running(&p->sum));
    fflush(stdout);
    const size_t n_logits = (size_t)rows * (size_t)n_vocab;
    if (p->dump && fwrite(logits, sizeof *logits, n_logits, p->dump) != n_logits) {
        snprintf(p->hook_err, sizeof p->hook_err, "%s", strerror(errno));
        return 1;
    }
    return 0;
}

static void on_progress(void *ctx, int done, int total)
{
    (void)ctx;
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\rperplexity: block %d/%d", done, total);
    if (done == total && isatty(STDERR_FILENO))
        fputc('\n', stderr);
}

/* whether two paths name one existing file (an output must not replace an input) */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && !stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* the forward engine's backend (--backend, --max-device-bytes) */
static const struct qd_nn_backend *engine_nn;

/* the run's time and memory, in each summary */
static void add_run(cJSON *j, const struct qd_engine_stats *stats)
{
    cJSON_AddStringToObject(j, "backend", engine_nn ? engine_nn->name : "cpu");
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

/* --kl-divergence: the model over the base file's tokens, against its log-probabilities, as
 * llama-perplexity's kl_divergence() (the chunks and n_ctx are the file's). ctx_given: -c when
 * the user gave it, else 0. Returns the exit code. */
static int kld_run(const char *model_path, const char *base_path, const char *text_path,
                   const char *tokens_path, int ctx_given, int max_chunks, int threads, enum qd_dtype cache_k,
                   enum qd_dtype cache_v, int n_batch)
{
    char err[1024];
    struct qd_kld_base base;
    struct qd_model m;
    struct qd_kld_stats kld = {0};
    enum qd_status status;
    int32_t *given = NULL, *chunks = NULL;
    int rc = 1;
    memset(&m, 0, sizeof m);
    if (qd_kld_base_open(base_path, &base, err, sizeof err)) {
        fprintf(stderr, "quantd perplexity: %s\n", err);
        goto done;
    }
    const int n_ctx = base.n_ctx;
    if (ctx_given && ctx_given < n_ctx) {
        fprintf(stderr, "quantd perplexity: %s has been computed with n_ctx %d, while -c is %d: give -c %d (or leave "
                "-c out: the base's is used)\n", base_path, n_ctx, ctx_given, n_ctx);
        goto done;
    }
    if (tokens_path || text_path) { /* optional: then it must be the text the base was computed over */
        int64_t n_given = 0;
        if (!(given = qd_model_input_tokens(model_path, tokens_path ? NULL : text_path, tokens_path, &n_given, err,
                                            sizeof err))) {
            fprintf(stderr, "quantd perplexity: %s\n", err);
            goto done;
        }
        const int64_t n_base = (int64_t)base.n_chunk * n_ctx;
        int64_t at = 0;
        while (at < n_base && at < n_given && given[at] == base.tokens[at])
            at++;
        if (at < n_base) {
            fprintf(stderr, "quantd perplexity: %s holds the log-probabilities of %d chunks of %d tokens, but the "
                    "tokens of %s %s (token %" PRId64 "): the base was computed over another text; leave -f/--tokens "
                    "out to use the base's\n", base_path, base.n_chunk, n_ctx, tokens_path ? tokens_path : text_path,
                    at == n_given ? "end first" : "differ", at);
            goto done;
        }
    }
    if (qd_model_open(model_path, &m, &status, err, sizeof err)) {
        fprintf(stderr, "quantd perplexity: %s: %s\n", model_path, err);
        goto done;
    }
    if (m.hp.n_vocab != base.n_vocab) {
        fprintf(stderr, "quantd perplexity: inconsistent vocabulary: %s holds log-probabilities over %d tokens, %s "
                "has %" PRId64 ": the base must come from a model with the same vocabulary\n", base_path,
                base.n_vocab, model_path, m.hp.n_vocab);
        goto done;
    }
    const int n_chunks = max_chunks >= 0 && max_chunks < base.n_chunk ? max_chunks : base.n_chunk;
    if (n_chunks < 1) {
        fprintf(stderr, "quantd perplexity: --chunks 0 scores nothing\n");
        goto done;
    }
    const int rows = qd_kld_rows(n_ctx);
    struct ppl p = {.tokens = base.tokens, .n_ctx = n_ctx, .first = n_ctx / 2, .n_chunks = n_chunks, .base = &base,
                    .kld = &kld};
    if (qd_kld_stats_init(&kld, (int64_t)n_chunks * rows) ||
        !(p.base_rows = malloc((size_t)rows * 2 * (size_t)qd_kld_row_words(base.n_vocab))) ||
        !(chunks = malloc((size_t)n_chunks * (size_t)n_ctx * sizeof *chunks))) {
        fprintf(stderr, "quantd perplexity: no memory for %d chunks of %d positions over %d tokens\n", n_chunks, rows,
                base.n_vocab);
        free(p.base_rows);
        goto done;
    }
    memcpy(chunks, base.tokens, (size_t)n_chunks * (size_t)n_ctx * sizeof *chunks);
    for (int c = 0; m.add_bos && c < n_chunks; c++)
        chunks[(int64_t)c * n_ctx] = m.bos;
    const int n_seq = n_batch / n_ctx > 1 ? n_batch / n_ctx : 1;
    fprintf(stderr, "kl_divergence: computing over %d chunks, n_ctx=%d, batch_size=%d, n_seq=%d\n", n_chunks, n_ctx,
            n_batch, n_seq);
    struct qd_engine_opts o = {.nn = engine_nn, .n_ctx = n_ctx, .logits_from = n_ctx / 2, .threads = threads, .cache_k = cache_k,
                               .cache_v = cache_v};
    struct qd_engine_hooks h = {.ctx = &p, .on_logits = on_logits, .on_progress = on_progress};
    struct qd_engine_stats stats;
    status = qd_engine_run(&m, chunks, n_chunks, &o, &h, &stats, err, sizeof err);
    free(p.base_rows);
    if (status != QD_OK) {
        fprintf(stderr, "quantd perplexity: %s\n", p.hook_err[0] ? p.hook_err : err);
        goto done;
    }
    printf("\n");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", model_path);
    cJSON_AddStringToObject(j, "kl_divergence_base", base_path);
    cJSON_AddStringToObject(j, "architecture", m.arch_name);
    cJSON_AddNumberToObject(j, "tokens_scored", (double)kld.count);
    cJSON_AddNumberToObject(j, "chunks", n_chunks);
    cJSON_AddNumberToObject(j, "n_ctx", n_ctx);
    qd_kld_report(&kld, stdout, j);
    cJSON_AddStringToObject(j, "cache_type_k", qd_dtype_name(cache_k));
    cJSON_AddStringToObject(j, "cache_type_v", qd_dtype_name(cache_v));
    add_run(j, &stats);
    char *line = cJSON_PrintUnformatted(j);
    printf("\n%s\n", line ? line : "{}");
    free(line);
    cJSON_Delete(j);
    rc = 0;
done:
    qd_kld_stats_free(&kld);
    free(chunks);
    free(given);
    qd_kld_base_close(&base);
    qd_model_close(&m);
    return rc;
}

static int parse_cache_type(const char *flag, const char *v, enum qd_dtype *out)
{
    if (!strcmp(v, "f32") || !strcmp(v, "f16") || !strcmp(v, "bf16"))
        return qd_dtype_parse(v, out) ? -1 : 0;
    fprintf(stderr, "quantd perplexity: %s takes f16, bf16 or f32 (quantized KV caches are not emulated), not '%s'\n",
            flag, v);
    return -1;
}

static int parse_int(const char *flag, const char *v, int min, int *out)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || errno || x < min || x > INT32_MAX) {
        fprintf(stderr, "quantd perplexity: %s takes an integer >= %d, not '%s'\n", flag, min, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

int qd_cli_perplexity(int argc, char **argv)
{
    const char *model_path = NULL, *tokens_path = NULL, *text_path = NULL, *dump_path = NULL, *base_path = NULL;
    int n_ctx = 512, max_chunks = -1, n_batch = 2048, threads = 0, kl_divergence = 0, ctx_given = 0;
    enum qd_dtype cache_k = QD_F16, cache_v = QD_F16; /* llama.cpp's default KV cache */
    const char *backend = "auto";
    size_t max_device_bytes = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--kl-divergence")) {
            kl_divergence = 1;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "quantd perplexity: %s needs a value (quantd perplexity --help)\n", a);
            return 2;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--tokens")) tokens_path = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) text_path = v;
        else if (!strcmp(a, "--dump-logits")) dump_path = v;
        else if (!strcmp(a, "--kl-divergence-base")) base_path = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--max-device-bytes")) {
            if (qd_parse_bytes(v, &max_device_bytes)) {
                fprintf(stderr, "quantd perplexity: --max-device-bytes takes a byte count such as 4GiB, not '%s'\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (parse_int(a, v, 2, &n_ctx))
                return 2;
            ctx_given = 1;
        } else if (!strcmp(a, "--chunks")) {
            if (parse_int(a, v, -1, &max_chunks))
                return 2;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (parse_int(a, v, 1, &n_batch))
                return 2;
        } else if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k")) {
            if (parse_cache_type(a, v, &cache_k))
                return 2;
        } else if (!strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) {
            if (parse_cache_type(a, v, &cache_v))
                return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (parse_int(a, v, 1, &threads))
                return 2;
        } else {
            fprintf(stderr, "quantd perplexity: unknown option '%s' (quantd perplexity --help)\n", a);
            return 2;
        }
    }
    char why[320];
    if (qd_engine_backend(backend, max_device_bytes, &engine_nn, why, sizeof why)) {
        fprintf(stderr, "quantd perplexity: %s\n", why);
        return 2;
    }
    if (kl_divergence && !base_path) {
        fprintf(stderr, "quantd perplexity: --kl-divergence needs --kl-divergence-base FILE, the base model's "
                "log-probabilities (written by a run of the base model with --kl-divergence-base FILE alone)\n");
        return 2;
    }
    if (kl_divergence && dump_path) {
        fprintf(stderr, "quantd perplexity: --dump-logits is not taken with --kl-divergence (run the model without "
                "--kl-divergence to dump its logits)\n");
        return 2;
    }
    if (!model_path) {
        fprintf(stderr, "quantd perplexity: -m MODEL is required (quantd perplexity --help)\n");
        return 2;
    }
    if (kl_divergence)
        return kld_run(model_path, base_path, text_path, tokens_path, ctx_given ? n_ctx : 0, max_chunks, threads,
                       cache_k, cache_v, n_batch);
    if (!model_path || (!tokens_path && !text_path)) {
        fprintf(stderr, "quantd perplexity: %s is required (quantd perplexity --help)\n",
                !model_path ? "-m MODEL" : "-f TEXT or --tokens FILE");
        return 2;
    }

    char err[1024];
    int64_t n_tokens = 0;
    int32_t *tokens = qd_model_input_tokens(model_path, tokens_path ? NULL : text_path, tokens_path, &n_tokens, err,
                                            sizeof err);
    if (!tokens) {
        fprintf(stderr, "quantd perplexity: %s\n", err);
        return 1;
    }
    struct qd_model m;
    enum qd_status status;
    if (qd_model_open(model_path, &m, &status, err, sizeof err)) {
        fprintf(stderr, "quantd perplexity: %s: %s\n", model_path, err);
        qd_model_close(&m);
        free(tokens);
        return 1;
    }
    int rc = 1;
    int32_t *chunks = NULL;
    struct ppl p = {.tokens = tokens, .n_ctx = n_ctx, .first = n_ctx / 2};
    struct qd_kld_writer writer = {0};
    if (n_tokens < 2 * (int64_t)n_ctx) {
        fprintf(stderr, "quantd perplexity: you need at least %d tokens to evaluate perplexity with a context of %d; "
                "the token file holds only %" PRId64 " tokens (give a longer text or a smaller -c)\n", 2 * n_ctx, n_ctx,
                n_tokens);
        goto done;
    }
    const int64_t max_fit = n_tokens / n_ctx;
    p.n_chunks = max_chunks < 0 || max_chunks > max_fit ? (int)max_fit : max_chunks;
    if (p.n_chunks < 1) {
        fprintf(stderr, "quantd perplexity: --chunks 0 scores nothing\n");
        goto done;
    }
    if (n_ctx > m.hp.n_ctx_train)
        fprintf(stderr, "perplexity: model was trained on only %" PRId64 " context tokens (%d specified)\n",
                m.hp.n_ctx_train, n_ctx);
    for (int64_t i = 0; i < (int64_t)p.n_chunks * n_ctx; i++)
        if (tokens[i] >= m.hp.n_vocab) {
            fprintf(stderr, "quantd perplexity: token %" PRId64 " of the file is %" PRId32 ", outside the model's "
                    "vocabulary of %" PRId64 ": the tokens were made for another model\n", i, tokens[i], m.hp.n_vocab);
            goto done;
        }
    /* the chunks as the model sees them: the first token of each replaced by BOS */
    if (!(chunks = malloc((size_t)p.n_chunks * (size_t)n_ctx * sizeof *chunks))) {
        fprintf(stderr, "quantd perplexity: no memory\n");
        goto done;
    }
    memcpy(chunks, tokens, (size_t)p.n_chunks * (size_t)n_ctx * sizeof *chunks);
    for (int c = 0; m.add_bos && c < p.n_chunks; c++)
        chunks[(int64_t)c * n_ctx] = m.bos;
    if (base_path && (same_file(base_path, model_path) || same_file(base_path, tokens_path))) {
        fprintf(stderr, "quantd perplexity: --kl-divergence-base %s names the %s: give the base logits a file of "
                "their own\n", base_path, same_file(base_path, model_path) ? "model" : "token file");
        goto done;
    }
    if (base_path) {
        if (qd_kld_writer_open(base_path, n_ctx, (int32_t)m.hp.n_vocab, p.n_chunks, tokens, &writer, err, sizeof err)) {
            fprintf(stderr, "quantd perplexity: %s\n", err);
            goto done;
        }
        p.writer = &writer;
        fprintf(stderr, "perplexity: saving all logits to %s\n", base_path);
    }
    if (dump_path && !(p.dump = fopen(dump_path, "wb"))) {
        fprintf(stderr, "quantd perplexity: %s: %s\n", dump_path, strerror(errno));
        goto done;
    }
    const int n_seq = n_batch / n_ctx > 1 ? n_batch / n_ctx : 1;
    fprintf(stderr, "perplexity: calculating perplexity over %d chunks, n_ctx=%d, batch_size=%d, n_seq=%d\n",
            p.n_chunks, n_ctx, n_batch < n_seq * n_ctx ? n_batch : n_seq * n_ctx, n_seq);

    struct qd_engine_opts o = {.nn = engine_nn, .n_ctx = n_ctx, .logits_from = p.first, .threads = threads, .cache_k = cache_k,
                               .cache_v = cache_v};
    struct qd_engine_hooks h = {.ctx = &p, .on_logits = on_logits, .on_progress = on_progress};
    struct qd_engine_stats stats;
    status = qd_engine_run(&m, chunks, p.n_chunks, &o, &h, &stats, err, sizeof err);
    printf("\n");
    if (status != QD_OK) {
        fprintf(stderr, "quantd perplexity: %s\n", p.hook_err[0] ? p.hook_err : err);
        goto done;
    }
    if (p.dump && fclose(p.dump)) {
        p.dump = NULL;
        fprintf(stderr, "quantd perplexity: %s: %s\n", dump_path, strerror(errno));
        goto done;
    }
    p.dump = NULL;
    if (p.writer && qd_kld_writer_commit(p.writer, err, sizeof err)) {
        fprintf(stderr, "quantd perplexity: %s\n", err);
        goto done;
    }
    /* llama-perplexity's final estimate and its error: the standard error of the mean NLL,
     * carried to the perplexity by its derivative */
    double mean, err_nll;
    const int var_ok = qd_ppl_final(&p.sum, &mean, &err_nll) == 0;
    const double ppl = exp(mean), count = (double)p.sum.count;
    if (var_ok)
        fprintf(stderr, "Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, err_nll * ppl);
    else
        fprintf(stderr, "Unexpected negative standard deviation of log(prob)\n");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", model_path);
    cJSON_AddStringToObject(j, "architecture", m.arch_name);
    if (base_path)
        cJSON_AddStringToObject(j, "kl_divergence_base", base_path);
    cJSON_AddNumberToObject(j, "ln_ppl", mean);
    cJSON_AddNumberToObject(j, "ln_ppl_error", err_nll);
    cJSON_AddNumberToObject(j, "ppl", ppl);
    cJSON_AddNumberToObject(j, "ppl_error", err_nll * ppl);
    cJSON_AddNumberToObject(j, "tokens_scored", count);
    cJSON_AddNumberToObject(j, "chunks", p.n_chunks);
    cJSON_AddNumberToObject(j, "n_ctx", n_ctx);
    cJSON_AddStringToObject(j, "cache_type_k", qd_dtype_name(cache_k));
    cJSON_AddStringToObject(j, "cache_type_v", qd_dtype_name(cache_v));
    add_run(j, &stats);
    char *line = cJSON_PrintUnformatted(j);
    printf("%s\n", line ? line : "{}");
    free(line);
    cJSON_Delete(j);
    rc = 0;
done:
    if (p.writer)
        qd_kld_writer_abort(p.writer); /* removes an unfinished file; nothing after a commit */
    if (p.dump) {
        fclose(p.dump);
        if (rc)
            unlink(dump_path);
    }
    free(chunks);
    free(tokens);
    qd_model_close(&m);
    return rc;
}
