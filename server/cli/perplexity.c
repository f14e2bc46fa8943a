/* bin/quantd perplexity: llama-perplexity's perplexity (tools/perplexity/perplexity.cpp,
 * perplexity()) from the layer-major engine (server/model/engine.h). The tokens are cut into
 * chunks of -c tokens, each chunk's first token replaced by BOS when the vocabulary adds one;
 * each chunk is scored over its second half (positions n_ctx/2 .. n_ctx-2 predicting the next
 * token), the statistics summed in double as llama-perplexity sums them. Its lines come out as it
 * prints them ("[1]x.xxxx,[2]..." on stdout, "Final estimate: PPL = X +/- Y" on stderr), then one
 * JSON summary line on stdout. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/files.h"
#include "model/engine.h"
#include "model/tokens_file.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: quantd perplexity -m MODEL --tokens FILE [-c N] [--chunks N] [-b N] [-t N]\n"
            "  llama-perplexity's perplexity of a GGUF model over a text's tokens, scored as it scores them:\n"
            "  chunks of -c tokens (default 512), each chunk's first token replaced by BOS when the\n"
            "  vocabulary adds one, each chunk scored over its second half.\n"
            "  -m MODEL         a GGUF model (a split model: its first shard); architectures: %s\n"
            "  --tokens FILE    the token ids: little-endian int32, or a JSON array of integers\n"
            "                   (llama-tokenize --ids --no-escape prints the one llama-perplexity\n"
            "                   scores: without --no-escape it reads \\n, \\x41 ... as escapes)\n"
            "  -f TEXT          a text file (needs quantd's tokenizer: give --tokens until then)\n"
            "  -c N             tokens per chunk (--ctx-size; default 512)\n"
            "  --chunks N       at most N chunks (default: all that fit)\n"
            "  -b N             llama-perplexity's batch size (accepted; whole chunks run at once here)\n"
            "  -t N             threads (default: every core)\n"
            "  -ctk, -ctv TYPE  the KV cache's types (--cache-type-k/-v: f16, the default as in llama.cpp,\n"
            "                   bf16 or f32): keys and values rounded to them, as llama.cpp stores them\n"
            "  --dump-logits FILE  write each chunk's logits from position n_ctx/2 on, raw f32\n"
            "                   [chunks][n_ctx - n_ctx/2][n_vocab] (for comparisons)\n",
            qd_model_arch_names());
}

/* ---- the statistics ------------------------------------------------------------------------- */

struct ppl {
    const int32_t *tokens; /* the original tokens (targets are never a substituted BOS) */
    int n_ctx, first, n_chunks;
    double nll, nll2;
    int64_t count;
    FILE *dump;
    char dump_err[256];
};

/* log_softmax as llama-perplexity computes it: the maximum in f32, the exponentials summed in
 * double, the token's log-probability logit - max - log(sum). */
static double token_nll(const float *logits, int64_t n_vocab, int32_t tok)
{
    float max = logits[0];
    for (int64_t i = 1; i < n_vocab; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    for (int64_t i = 0; i < n_vocab; i++)
        sum += expf(logits[i] - max);
    return -((double)(logits[tok] - max) - log(sum));
}

static int on_logits(void *ctx, int chunk, int from, int rows, const float *logits, int64_t n_vocab)
{
    struct ppl *p = ctx;
    const int32_t *targets = p->tokens + (int64_t)chunk * p->n_ctx + from + 1;
    for (int i = 0; i < rows - 1; i++) { /* the last position predicts past the chunk */
        const double v = token_nll(logits + (int64_t)i * n_vocab, n_vocab, targets[i]);
        p->nll += v;
        p->nll2 += v * v;
    }
    p->count += rows - 1;
    printf("[%d]%.4lf,", chunk + 1, exp(p->nll / (double)p->count));
    fflush(stdout);
    if (p->dump && fwrite(logits, sizeof *logits, (size_t)rows * (size_t)n_vocab, p->dump) != (size_t)rows * (size_t)n_vocab) {
        snprintf(p->dump_err, sizeof p->dump_err, "%s", strerror(errno));
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

static uint64_t peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %" SCNu64 " kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
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
    const char *model_path = NULL, *tokens_path = NULL, *text_path = NULL, *dump_path = NULL;
    int n_ctx = 512, max_chunks = -1, n_batch = 2048, threads = 0;
    enum qd_dtype cache_k = QD_F16, cache_v = QD_F16; /* llama.cpp's default KV cache */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
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
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (parse_int(a, v, 2, &n_ctx))
                return 2;
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
    if (text_path && !tokens_path) {
        fprintf(stderr, "quantd perplexity: -f TEXT needs quantd's tokenizer, which this build lacks: give the "
                "text's token ids with --tokens FILE (llama-tokenize -m MODEL -f TEXT --ids --no-escape --log-disable)\n");
        return 2;
    }
    if (!model_path || !tokens_path) {
        fprintf(stderr, "quantd perplexity: %s is required (quantd perplexity --help)\n",
                !model_path ? "-m MODEL" : "--tokens FILE");
        return 2;
    }

    char err[1024];
    int64_t n_tokens = 0;
    int32_t *tokens = qd_tokens_file_read(tokens_path, &n_tokens, err, sizeof err);
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
    if (dump_path && !(p.dump = fopen(dump_path, "wb"))) {
        fprintf(stderr, "quantd perplexity: %s: %s\n", dump_path, strerror(errno));
        goto done;
    }
    const int n_seq = n_batch / n_ctx > 1 ? n_batch / n_ctx : 1;
    fprintf(stderr, "perplexity: calculating perplexity over %d chunks, n_ctx=%d, batch_size=%d, n_seq=%d\n",
            p.n_chunks, n_ctx, n_batch < n_seq * n_ctx ? n_batch : n_seq * n_ctx, n_seq);

    struct qd_engine_opts o = {.n_ctx = n_ctx, .logits_from = p.first, .threads = threads, .cache_k = cache_k,
                               .cache_v = cache_v};
    struct qd_engine_hooks h = {.ctx = &p, .on_logits = on_logits, .on_progress = on_progress};
    struct qd_engine_stats stats;
    status = qd_engine_run(&m, chunks, p.n_chunks, &o, &h, &stats, err, sizeof err);
    printf("\n");
    if (status != QD_OK) {
        fprintf(stderr, "quantd perplexity: %s\n", p.dump_err[0] ? p.dump_err : err);
        goto done;
    }
    if (p.dump && fclose(p.dump)) {
        p.dump = NULL;
        fprintf(stderr, "quantd perplexity: %s: %s\n", dump_path, strerror(errno));
        goto done;
    }
    p.dump = NULL;
    /* llama-perplexity's final estimate and its error: the standard error of the mean NLL,
     * carried to the perplexity by its derivative */
    const double count = (double)p.count, mean = p.nll / count, ppl = exp(mean);
    double var = p.nll2 / count - mean * mean, err_nll = 0.0;
    if (var > 0) {
        err_nll = sqrt(var / (count - 1));
        fprintf(stderr, "Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, err_nll * ppl);
    } else
        fprintf(stderr, "Unexpected negative standard deviation of log(prob)\n");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", model_path);
    cJSON_AddStringToObject(j, "architecture", m.arch_name);
    cJSON_AddNumberToObject(j, "ln_ppl", mean);
    cJSON_AddNumberToObject(j, "ln_ppl_error", err_nll);
    cJSON_AddNumberToObject(j, "ppl", ppl);
    cJSON_AddNumberToObject(j, "ppl_error", err_nll * ppl);
    cJSON_AddNumberToObject(j, "tokens_scored", count);
    cJSON_AddNumberToObject(j, "chunks", p.n_chunks);
    cJSON_AddNumberToObject(j, "n_ctx", n_ctx);
    cJSON_AddStringToObject(j, "cache_type_k", qd_dtype_name(cache_k));
    cJSON_AddStringToObject(j, "cache_type_v", qd_dtype_name(cache_v));
    cJSON_AddNumberToObject(j, "seconds", stats.seconds);
    cJSON_AddNumberToObject(j, "read_seconds", stats.read_seconds);
    cJSON *mem = cJSON_AddObjectToObject(j, "memory");
    cJSON_AddNumberToObject(mem, "peak_bytes", (double)stats.peak_bytes);
    cJSON_AddNumberToObject(mem, "hidden_bytes", (double)stats.hidden_bytes);
    cJSON_AddNumberToObject(mem, "block_bytes", (double)stats.block_bytes);
    cJSON_AddNumberToObject(mem, "scratch_bytes", (double)stats.scratch_bytes);
    cJSON_AddNumberToObject(mem, "head_bytes", (double)stats.head_bytes);
    cJSON_AddNumberToObject(mem, "peak_rss_bytes", (double)peak_rss_bytes());
    char *line = cJSON_PrintUnformatted(j);
    printf("%s\n", line ? line : "{}");
    free(line);
    cJSON_Delete(j);
    rc = 0;
done:
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
