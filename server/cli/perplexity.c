/* bin/quantd perplexity: llama-perplexity's command line over server/model/perplexity_run.h (the
 * run, its lines and its JSON summary, shared with perplexity jobs). Its lines come out as it
 * prints them ("[1]x.xxxx,[2]..." on stdout, "Final estimate: PPL = X +/- Y" on stderr), then one
 * JSON summary line on stdout; the progress on stderr (--progress). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "model/engine_backend.h"
#include "model/model.h"
#include "model/perplexity_run.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: quantd perplexity -m MODEL (-f TEXT | --tokens FILE) [-c N] [--chunks N] [-b N] [-t N]\n"
            "                         [--kl-divergence-base FILE [--kl-divergence]] [--backend B]\n"
            "                         [--max-device-bytes N] [--progress auto|bar|json|none]\n"
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
    enum qd_cli_progress progress = QD_CLI_PROGRESS_AUTO;
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
        } else if (!strcmp(a, "--progress")) {
            if (qd_cli_progress_parse(v, &progress)) {
                fprintf(stderr, "quantd perplexity: --progress takes auto, bar, json or none, not '%s'\n", v);
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
    const struct qd_nn_backend *nn;
    char why[320];
    if (qd_engine_backend(backend, max_device_bytes, &nn, why, sizeof why)) {
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
    if (!kl_divergence && !tokens_path && !text_path) {
        fprintf(stderr, "quantd perplexity: -f TEXT or --tokens FILE is required (quantd perplexity --help)\n");
        return 2;
    }
    struct qd_run_progress_sink sink;
    struct qd_perplexity_opts o = {.model = model_path, .text = text_path, .tokens = tokens_path,
                                   .kld_base = base_path, .kl_divergence = kl_divergence, .dump_logits = dump_path,
                                   .n_ctx = ctx_given ? n_ctx : 0, .max_chunks = max_chunks, .n_batch = n_batch,
                                   .threads = threads, .cache_k = cache_k, .cache_v = cache_v, .nn = nn};
    qd_cli_run_io(&o.io, &sink, "perplexity", progress);
    char err[1024];
    cJSON *summary = NULL;
    if (qd_perplexity_run(&o, &summary, err, sizeof err) != QD_OK) {
        fprintf(stderr, "quantd perplexity: %s\n", err);
        return 1;
    }
    char *line = cJSON_PrintUnformatted(summary);
    printf("%s\n", line ? line : "{}");
    free(line);
    cJSON_Delete(summary);
    return 0;
}
