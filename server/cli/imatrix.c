/* bin/quantd imatrix: llama-imatrix's command line (tools/imatrix/imatrix.cpp in the llama.cpp of
 * llama-cpp-python 0.3.36) over server/model/imatrix_run.h (the run and its lines, shared with
 * imatrix jobs and quantd convert --calibrate): the importance matrix of a GGUF model over a
 * text's tokens, earlier files (--in-file) added in first, or only combined when no tokens are
 * given; the progress on stderr (--progress). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "model/engine_backend.h"
#include "model/imatrix_run.h"
#include "model/model.h"
#include "model/model_input.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: quantd imatrix -m MODEL (-f TEXT | --tokens FILE) [-o OUT] [-c N] [--chunks N] [--process-output]\n"
            "                      [--output-format gguf|dat] [--in-file FILE ...] [--no-ppl] [--chunk N] [-t N]\n"
            "                      [--backend auto|cpu|cuda] [--max-device-bytes N] [--progress auto|bar|json|none]\n"
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
            "  --max-device-bytes N  the most device memory the run may hold (4GiB, 512MiB, ...)\n"
            "  --progress MODE     on stderr: bar (one line rewritten: layers and chunks), json (a line\n"
            "                      a step), none; auto (default): the bar on a terminal, else JSON lines\n",
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

int qd_cli_imatrix(int argc, char **argv)
{
    const char *model_path = NULL, *tokens_path = NULL, *text_path = NULL, *out = "imatrix.gguf";
    int n_ctx = 512, max_chunks = -1, from_chunk = 0, n_batch = 2048, threads = 0, process_output = 0, ppl = 1;
    int format = 0, ignored; /* format: 0 unsaid, 1 gguf, 2 dat */
    enum qd_dtype cache[2] = {QD_F16, QD_F16}; /* llama.cpp's default KV cache */
    enum qd_cli_progress progress = QD_CLI_PROGRESS_AUTO;
    const char *backend = "auto";
    size_t max_device_bytes = 0;
    const struct qd_nn_backend *nn = NULL;
    const char **in_files = calloc((size_t)(argc ? argc : 1), sizeof *in_files);
    int n_in = 0, rc = 2;
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
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--max-device-bytes")) {
            if (qd_parse_bytes(v, &max_device_bytes)) {
                fprintf(stderr, "quantd imatrix: --max-device-bytes takes a byte count such as 4GiB, not '%s'\n", v);
                goto done;
            }
        } else if (!strcmp(a, "--progress")) {
            if (qd_cli_progress_parse(v, &progress)) {
                fprintf(stderr, "quantd imatrix: --progress takes auto, bar, json or none, not '%s'\n", v);
                goto done;
            }
        }
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
        if (qd_engine_backend(backend, max_device_bytes, &nn, why, sizeof why)) {
            fprintf(stderr, "quantd imatrix: %s\n", why);
            goto done;
        }
    }
    rc = 1;
    struct qd_run_progress_sink sink;
    struct qd_imatrix_opts o = {.model = model_path, .text = text_path, .tokens = tokens_path, .output = out,
                                .format = format, .in_files = in_files, .n_in_files = n_in, .n_ctx = n_ctx,
                                .max_chunks = max_chunks, .from_chunk = from_chunk, .n_batch = n_batch,
                                .threads = threads, .process_output = process_output, .no_ppl = !ppl,
                                .cache_k = cache[0], .cache_v = cache[1], .nn = nn};
    qd_cli_run_io(&o.io, &sink, "imatrix", progress);
    char err[1024];
    cJSON *summary = NULL;
    if (qd_imatrix_run(&o, &summary, err, sizeof err) != QD_OK) {
        fprintf(stderr, "quantd imatrix: %s\n", err);
        goto done;
    }
    cJSON_Delete(summary);
    rc = 0;
done:
    free(in_files);
    return rc;
}

int qd_cli_imatrix_make(const char *prog, const char *model, const char *text_path, const char *tokens_path,
                        const char *dataset, int n_ctx, int max_chunks, int threads,
                        const struct qd_nn_backend *nn, const char *out)
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
    struct qd_run_progress_sink sink;
    struct qd_imatrix_opts o = {.model = model, .n_ctx = n_ctx, .max_chunks = max_chunks, .threads = threads,
                                .no_ppl = 1, .cache_k = QD_F16, .cache_v = QD_F16, .nn = nn};
    qd_cli_run_io(&o.io, &sink, "imatrix", QD_CLI_PROGRESS_AUTO);
    struct qd_imatrix_result res;
    int rc = 0;
    if (qd_imatrix_compute(&o, &s, tokens, n_tokens, &res, err, sizeof err) != QD_OK) {
        fprintf(stderr, "%s: %s\n", prog, err);
        rc = 1;
    }
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
