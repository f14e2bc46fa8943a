/* bin/quantd imatrix: llama-imatrix (tools/imatrix/imatrix.cpp in the llama.cpp of
 * llama-cpp-python 0.3.36) from the layer-major engine (server/model/engine.h): the importance
 * matrix of a GGUF model over a text's tokens, cut into chunks of -c tokens (each chunk's first
 * token replaced by BOS when the vocabulary adds one), collected by server/model/imatrix_collect.c,
 * with the perplexity over each chunk's second half alongside; earlier files (--in-file) added
 * in first, or only combined when no tokens are given. The file is written once, whole, at the
 * end (imatrix_write.c): the layer-major order has no partial matrix to save before. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/imatrix_sums.h"
#include "cli/cli.h"
#include "cli/files.h"
#include "model/engine.h"
#include "model/engine_backend.h"
#include "model/imatrix_collect.h"
#include "model/model_input.h"
#include "model/ppl.h"

/* the forward engine's backend (--backend, --max-device-bytes) */
static const struct qd_nn_backend *engine_nn;

static void usage(FILE *to)
{
    fprintf(to,
            "usage: quantd imatrix -m MODEL (-f TEXT | --tokens FILE) [-o OUT] [-c N] [--chunks N] [--process-output]\n"
            "                      [--output-format gguf|dat] [--in-file FILE ...] [--no-ppl] [--chunk N] [-t N]\n"
            "                      [--backend auto|cpu|cuda] [--max-device-bytes N]\n"
            "       quantd imatrix --in-file A --in-file B ... [-o OUT] [-c N]   (combine only)\n"
            "  llama-imatrix's importance matrix of a GGUF model over a text's tokens: per weight of the\n"
            "  blocks, the sum of the squares of each input column over the tokens and their count, in\n"
            "  llama-imatrix's file (read by llama-quantize --imatrix and quantd convert --imatrix).\n"
            "  -m MODEL            a GGUF model (a split model: its first shard); architectures: %s\n"
            "  -f TEXT             the text, tokenized with the model's vocabulary as llama-imatrix\n"
            "                      does (its BOS added); recorded as the dataset\n"
            "  --tokens FILE       token ids instead (little-endian int32 or a JSON array); with -f\n"
            "                      too, the ids are run and -f names the dataset\n"
            "  -o OUT              the output (default imatrix.gguf), written whole or not at all\n"
            "  --output-format F   gguf (default) or dat (the legacy format)\n"
            "  -c N                tokens per chunk (--ctx-size; default 512); also the chunk size of\n"
            "                      a .dat file's calls when combining\n"
            "  --chunks N          at most N chunks (default: all that fit)\n"
            "  --chunk N           start from chunk N (--from-chunk; default 0)\n"
            "  --process-output    collect the output head's input too (output.weight)\n"
            "  --in-file FILE      an earlier imatrix (GGUF or .dat) added in; A,B,... or repeated (every\n"
            "                      one is added: llama-imatrix keeps only the last of repeated flags);\n"
            "                      without --tokens the files are only combined\n"
            "  --no-ppl            skip the perplexity\n"
            "  -b N                llama-imatrix's batch size (default 2048; only the count of chunks per\n"
            "                      pass it prints depends on it: whole chunks run at once here)\n"
            "  --output-frequency N, --save-frequency N\n"
            "                      accepted; the file is written once, at the end\n"
            "  -ctk, -ctv TYPE     the KV cache's types (f16, the default as in llama.cpp, bf16 or f32)\n"
            "  -t N                threads (default: every core)\n"
            "  --backend B         auto (default: CUDA where built and a device answers, else the CPU),\n"
            "                      cpu or cuda (bf16 matmul inputs with f32 sums there)\n"
            "  --max-device-bytes N  the most device memory the run may hold (4GiB, 512MiB, ...)\n",
            qd_model_arch_names());
}

static int parse_int(const char *flag, const char *v, int min, int *out)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || errno || x < min || x > INT32_MAX) {
        fprintf(stderr, "quantd imatrix: %s takes an integer >= %d, not '%s'\n", flag, min, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_cache_type(const char *flag, const char *v, enum qd_dtype *out)
{
    if (!strcmp(v, "f32") || !strcmp(v, "f16") || !strcmp(v, "bf16"))
        return qd_dtype_parse(v, out) ? -1 : 0;
    fprintf(stderr, "quantd imatrix: %s takes f16, bf16 or f32 (quantized KV caches are not emulated), not '%s'\n", flag,
            v);
    return -1;
}

/* ---- the perplexity alongside (compute_imatrix's process_logits) ------------------------------ */

struct run {
    struct qd_imatrix_collector *c;
    const int32_t *tokens; /* the original tokens (targets are never a substituted BOS) */
    int n_ctx, first, ppl;
    int chunk_base; /* the first chunk of this engine run */
    struct qd_ppl ppl_sum;
};

static int on_logits(void *ctx, int chunk, int from, int rows, const float *logits, int64_t n_vocab)
{
    struct run *r = ctx;
    if (!r->ppl)
        return r->c->stop;
    /* positions n_ctx/2 .. n_ctx-2 predict the next token (from is 0 with --process-output) */
    const int skip = r->first - from;
    chunk += r->chunk_base;
    const int32_t *targets = r->tokens + (int64_t)chunk * r->n_ctx + r->first + 1;
    qd_ppl_add(&r->ppl_sum, logits + (int64_t)skip * n_vocab, rows - skip - 1, n_vocab, targets);
    printf("[%d]%.4lf,", chunk + 1, qd_ppl_running(&r->ppl_sum));
    fflush(stdout);
    return r->c->stop;
}

static void on_matmul_input(void *ctx, int layer, const char *weight, const float *x, int64_t T, int64_t K)
{
    qd_imatrix_collect_matmul(((struct run *)ctx)->c, layer, weight, x, T, K);
}

static void on_matmul_expert_input(void *ctx, int layer, const char *weight, int expert, int n_expert, const float *x,
                                   int64_t rows, int64_t K)
{
    qd_imatrix_collect_expert_matmul(((struct run *)ctx)->c, layer, weight, expert, n_expert, x, rows, K);
}

static void on_matmul_head_input(void *ctx, int layer, const char *weight, int head, int n_head, const float *x,
                                 int64_t T, int64_t K)
{
    qd_imatrix_collect_head_matmul(((struct run *)ctx)->c, layer, weight, head, n_head, x, T, K);
}

static void on_progress(void *ctx, int done, int total)
{
    (void)ctx;
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\rimatrix: block %d/%d", done, total);
    if (done == total && isatty(STDERR_FILENO))
        fputc('\n', stderr);
}

/* Adds the --in-file files (a value may list several, comma separated). */
static int load_files(struct qd_imatrix_sums *s, char **files, int n)
{
    for (int i = 0; i < n; i++)
        for (char *save = NULL, *path = strtok_r(files[i], ",", &save); path; path = strtok_r(NULL, ",", &save)) {
            size_t len;
            char err[600];
            fprintf(stderr, "imatrix: loading imatrix from '%s'\n", path);
            uint8_t *buf = qd_file_read(path, &len);
            if (!buf) {
                fprintf(stderr, "quantd imatrix: --in-file %s: %s\n", path, strerror(errno));
                return -1;
            }
            int rc = qd_imatrix_sums_load(s, buf, len, err, sizeof err);
            free(buf);
            if (rc) {
                fprintf(stderr, "quantd imatrix: --in-file %s: %s\n", path, err);
                return -1;
            }
        }
    return 0;
}

/* Runs the model over the chunks into s (and the perplexity). 0, or 1 with a message. */
static int compute(const char *prog, struct qd_imatrix_sums *s, const char *model_path, int32_t *tokens, int64_t n_tokens, int n_ctx,
                   int max_chunks, int from_chunk, int n_batch, int threads, int process_output, int ppl,
                   const enum qd_dtype cache[2])
{
    char err[1024];
    struct qd_model m;
    enum qd_status status;
    if (qd_model_open(model_path, &m, &status, err, sizeof err)) {
        fprintf(stderr, "%s: %s: %s\n", prog, model_path, err);
        qd_model_close(&m);
        return 1;
    }
    int rc = 1;
    int32_t *chunks = NULL;
    if (from_chunk > 0) {
        if ((int64_t)(from_chunk + 2) * n_ctx >= n_tokens) {
            fprintf(stderr, "%s: there will be not enough tokens left after removing %d chunks\n",
                    prog, from_chunk);
            goto done;
        }
        tokens += (int64_t)from_chunk * n_ctx, n_tokens -= (int64_t)from_chunk * n_ctx;
    }
    if (n_tokens < 2 * (int64_t)n_ctx) {
        fprintf(stderr, "%s: you need at least %d tokens for a context of %d tokens; the token file "
                "holds only %" PRId64 " (give a longer text or a smaller -c)\n", prog, 2 * n_ctx, n_ctx, n_tokens);
        goto done;
    }
    const int64_t max_fit = n_tokens / n_ctx;
    const int n_chunks = max_chunks < 0 || max_chunks > max_fit ? (int)max_fit : max_chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "%s: --chunks 0 collects nothing\n", prog);
        goto done;
    }
    if (n_ctx > m.hp.n_ctx_train)
        fprintf(stderr, "imatrix: model was trained on only %" PRId64 " context tokens (%d specified)\n",
                m.hp.n_ctx_train, n_ctx);
    for (int64_t i = 0; i < (int64_t)n_chunks * n_ctx; i++)
        if (tokens[i] >= m.hp.n_vocab) {
            fprintf(stderr, "%s: token %" PRId64 " of the file is %" PRId32 ", outside the model's "
                    "vocabulary of %" PRId64 ": the tokens were made for another model\n", prog, i, tokens[i], m.hp.n_vocab);
            goto done;
        }
    if (!(chunks = malloc((size_t)n_chunks * (size_t)n_ctx * sizeof *chunks))) {
        fprintf(stderr, "%s: no memory\n", prog);
        goto done;
    }
    memcpy(chunks, tokens, (size_t)n_chunks * (size_t)n_ctx * sizeof *chunks);
    for (int c = 0; m.add_bos && c < n_chunks; c++)
        chunks[(int64_t)c * n_ctx] = m.bos;
    const int n_seq = n_batch / n_ctx > 1 ? n_batch / n_ctx : 1;
    fprintf(stderr, "imatrix: computing over %d chunks, n_ctx=%d, batch_size=%d, n_seq=%d\n", n_chunks, n_ctx,
            n_batch < n_seq * n_ctx ? n_batch : n_seq * n_ctx, n_seq);

    /* llama-imatrix runs n_seq chunks to a batch, and its 16-token rule counts the batch's
     * tokens: chunks under 16 tokens are collected, except those of a last batch of fewer than
     * 16 tokens (its perplexity still counts; they run again without the collector) */
    int collected = n_chunks;
    struct qd_imatrix_collector c = {.sums = s, .process_output = process_output, .nn = engine_nn};
    if (n_ctx < 16) {
        const int last = n_chunks - (n_chunks - 1) / n_seq * n_seq;
        collected = (int64_t)last * n_ctx < 16 ? n_chunks - last : n_chunks;
        c.min_tokens = 1;
    }
    struct run r = {.c = &c, .tokens = tokens, .n_ctx = n_ctx, .first = n_ctx / 2, .ppl = ppl};
    /* the head's rows: every position when its input is collected (llama-imatrix asks for
     * every logit), else the scored half */
    struct qd_engine_opts o = {.nn = engine_nn, .n_ctx = n_ctx, .logits_from = process_output ? 0 : n_ctx / 2, .threads = threads,
                               .cache_k = cache[0], .cache_v = cache[1]};
    struct qd_engine_hooks h = {.ctx = &r, .on_logits = on_logits, .on_matmul_input = on_matmul_input,
                                .on_matmul_expert_input = on_matmul_expert_input,
                                .on_matmul_head_input = on_matmul_head_input, .on_progress = on_progress,
                                .cancel = &c.stop};
    struct qd_engine_stats stats = {0};
    status = collected ? qd_engine_run(&m, chunks, collected, &o, &h, &stats, err, sizeof err) : QD_OK;
    if (status == QD_OK && c.status == QD_OK && collected < n_chunks && ppl) {
        h.on_matmul_input = NULL;
        h.on_matmul_expert_input = NULL;
        h.on_matmul_head_input = NULL;
        r.chunk_base = collected;
        status = qd_engine_run(&m, chunks + (int64_t)collected * n_ctx, n_chunks - collected, &o, &h, &stats, err,
                               sizeof err);
    }
    if (ppl)
        printf("\n");
    if (status != QD_OK || c.status != QD_OK) {
        fprintf(stderr, "%s: %s\n", prog, c.status != QD_OK ? c.err : err);
        goto done;
    }
    if (ppl) {
        double mean, err_nll;
        if (qd_ppl_final(&r.ppl_sum, &mean, &err_nll) == 0)
            printf("Final estimate: PPL = %.4lf +/- %.5lf\n", exp(mean), err_nll * exp(mean));
        else
            printf("Unexpected negative standard deviation of log(prob)\n");
    }
    fprintf(stderr, "imatrix: %.2f s (%.2f s reading weights), %.1f MiB at most", stats.seconds, stats.read_seconds,
            (double)stats.peak_bytes / 1048576.0);
    if (stats.device_peak_bytes)
        fprintf(stderr, ", %.1f MiB of %s memory at most", (double)stats.device_peak_bytes / 1048576.0,
                engine_nn->name);
    fprintf(stderr, "\n");
    rc = 0;
done:
    free(chunks);
    qd_model_close(&m);
    return rc;
}

int qd_cli_imatrix(int argc, char **argv)
{
    const char *backend = "auto";
    size_t max_device_bytes = 0;
    const char *model_path = NULL, *tokens_path = NULL, *text_path = NULL, *out = "imatrix.gguf";
    int n_ctx = 512, max_chunks = -1, from_chunk = 0, n_batch = 2048, threads = 0, process_output = 0, ppl = 1;
    int format = 0, ignored; /* format: 0 unsaid, 1 gguf, 2 dat */
    enum qd_dtype cache[2] = {QD_F16, QD_F16}; /* llama.cpp's default KV cache */
    char **in_files = calloc((size_t)(argc ? argc : 1), sizeof *in_files);
    int n_in = 0, rc = 2;
    struct qd_imatrix_sums s = {0};
    int32_t *tokens = NULL;
    if (!in_files) {
        fprintf(stderr, "quantd imatrix: no memory\n");
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        }
        if (!strcmp(a, "--process-output")) {
            process_output = 1;
            continue;
        }
        if (!strcmp(a, "--no-ppl")) {
            ppl = 0;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "quantd imatrix: %s needs a value (quantd imatrix --help)\n", a);
            goto done;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--tokens")) tokens_path = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) text_path = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--output-file")) out = v;
        else if (!strcmp(a, "--in-file")) in_files[n_in++] = argv[i];
        else if (!strcmp(a, "--output-format")) {
            if (strcmp(v, "gguf") && strcmp(v, "dat")) {
                fprintf(stderr, "quantd imatrix: --output-format takes gguf or dat, not '%s'\n", v);
                goto done;
            }
            format = strcmp(v, "gguf") ? 2 : 1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (parse_int(a, v, 1, &n_ctx))
                goto done;
        } else if (!strcmp(a, "--chunks")) {
            if (parse_int(a, v, -1, &max_chunks))
                goto done;
        } else if (!strcmp(a, "--chunk") || !strcmp(a, "--from-chunk")) {
            if (parse_int(a, v, 0, &from_chunk))
                goto done;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (parse_int(a, v, 1, &n_batch))
                goto done;
        } else if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k") || !strcmp(a, "-ctv") ||
                   !strcmp(a, "--cache-type-v")) {
            if (parse_cache_type(a, v, &cache[a[strlen(a) - 1] == 'v']))
                goto done;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (parse_int(a, v, 1, &threads))
                goto done;
        } else if (!strcmp(a, "--backend")) {
            backend = v;
        } else if (!strcmp(a, "--max-device-bytes")) {
            if (qd_parse_bytes(v, &max_device_bytes)) {
                fprintf(stderr, "quantd imatrix: --max-device-bytes takes a byte count such as 4GiB, not '%s'\n", v);
                goto done;
            }
        } else if (!strcmp(a, "-ofreq") || !strcmp(a, "--output-frequency") || !strcmp(a, "--save-frequency")) {
            if (parse_int(a, v, 0, &ignored))
                goto done;
            if (!strcmp(a, "--save-frequency") && ignored > 0)
                fprintf(stderr, "imatrix: --save-frequency: no copies at_N: the matrix is whole only after the last "
                        "block of a layer-major run, and is written once\n");
        } else {
            fprintf(stderr, "quantd imatrix: unknown option '%s' (quantd imatrix --help)\n", a);
            goto done;
        }
    }
    if (!tokens_path && !text_path && !n_in) {
        fprintf(stderr, "quantd imatrix: give -f TEXT or --tokens FILE (and -m MODEL) to compute an importance "
                "matrix, or --in-file FILE to combine earlier ones\n");
        goto done;
    }
    if ((tokens_path || text_path) && !model_path) {
        fprintf(stderr, "quantd imatrix: -m MODEL is required with %s (quantd imatrix --help)\n",
                tokens_path ? "--tokens" : "-f");
        goto done;
    }
    if (tokens_path || text_path) {
        char why[320];
        if (qd_engine_backend(backend, max_device_bytes, &engine_nn, why, sizeof why)) {
            fprintf(stderr, "quantd imatrix: %s\n", why);
            goto done;
        }
    }
    rc = 1;
    /* the output's folder is checked before the run, not after it */
    {
        const char *slash = strrchr(out, '/');
        char dir[4096];
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out) + 1 : 1, slash ? out : ".");
        if (access(dir, W_OK)) {
            fprintf(stderr, "quantd imatrix: -o %s: the folder %s: %s\n", out, dir, strerror(errno));
            goto done;
        }
    }
    if (format == 0 && (strlen(out) < 5 || strcmp(out + strlen(out) - 5, ".gguf")))
        fprintf(stderr, "imatrix: saving imatrix using GGUF format with a different suffix than .gguf\n"
                "imatrix: if you want the previous imatrix format, use --output-format dat\n");
    /* chunk_size: -c (llama-imatrix's n_ctx / n_parallel, both scaled by the sequences per pass) */
    s.chunk_size = n_ctx;
    if (load_files(&s, in_files, n_in))
        goto done;
    if (tokens_path || text_path) {
        char err[1024];
        int64_t n_tokens = 0;
        if (!(tokens = qd_model_input_tokens(model_path, tokens_path ? NULL : text_path, tokens_path, &n_tokens, err,
                                             sizeof err))) {
            fprintf(stderr, "quantd imatrix: %s\n", err);
            goto done;
        }
        if (compute("quantd imatrix", &s, model_path, tokens, n_tokens, n_ctx, max_chunks, from_chunk, n_batch, threads,
                    process_output,
                    ppl, cache))
            goto done;
    } else
        fprintf(stderr, "imatrix: no tokens given; combining precomputed matrices only\n");
    char err[1024];
    /* the dataset recorded: the text's name when it is given, else the token file's */
    const char *dataset = text_path ? text_path : tokens_path; /* NULL: only combined */
    if (qd_imatrix_sums_write(&s, out, format == 2, dataset, err, sizeof err)) {
        fprintf(stderr, "quantd imatrix: %s\n", err);
        goto done;
    }
    fprintf(stderr, "imatrix: stored %d entries after %d chunks in %s\n", s.n, qd_imatrix_sums_chunks(&s), out);
    rc = 0;
done:
    free(tokens);
    free(in_files);
    qd_imatrix_sums_free(&s);
    return rc;
}

int qd_cli_imatrix_make(const char *prog, const char *model, const char *text_path, const char *tokens_path,
                        const char *dataset, int n_ctx, int max_chunks, int threads, const char *out)
{
    char err[1024];
    int64_t n_tokens = 0;
    int32_t *tokens = qd_model_input_tokens(model, tokens_path ? NULL : text_path, tokens_path, &n_tokens, err,
                                            sizeof err);
    if (!tokens) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 1;
    }
    struct qd_imatrix_sums s = {.chunk_size = n_ctx};
    const enum qd_dtype cache[2] = {QD_F16, QD_F16};
    int rc = compute(prog, &s, model, tokens, n_tokens, n_ctx, max_chunks, 0, 2048, threads, 0, 0, cache);
    if (!rc && qd_imatrix_sums_write(&s, out, 0, dataset, err, sizeof err)) {
        fprintf(stderr, "%s: the importance matrix: %s\n", prog, err);
        rc = 1;
    }
    if (!rc)
        fprintf(stderr, "%s: importance matrix of %d entries from %d chunks of %d tokens\n", prog, s.n,
                qd_imatrix_sums_chunks(&s), n_ctx);
    free(tokens);
    qd_imatrix_sums_free(&s);
    return rc;
}
