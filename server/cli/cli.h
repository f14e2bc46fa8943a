/* The offline subcommands of bin/quantd: formats, quantize, dequantize, convert, llama-quantize,
 * perplexity, imatrix. */
#ifndef QD_CLI_H
#define QD_CLI_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "checkpoint/convert_request.h"
#include "model/engine_backend.h"
#include "model/run_io.h"

int qd_cli_formats(int argc, char **argv);
int qd_cli_quantize(int argc, char **argv);
int qd_cli_dequantize(int argc, char **argv);
int qd_cli_convert(int argc, char **argv);
/* quantd llama-quantize [options] IN [OUT] TYPE [nthreads]: llama-quantize's command line
 * (llama_quantize.c). */
int qd_cli_llama_quantize(int argc, char **argv);

/* A conversion from a command line: what quantd convert and quantd llama-quantize parse from
 * theirs, run the one way (convert.c). */
struct qd_cli_conversion {
    const char *prog;              /* "quantd convert": what messages begin with */
    const char *in_name, *out_name; /* how the command line names the input and the output */
    const char *src, *dst;
    const struct qd_convert_arg *args; /* the request (convert_request.h) */
    int nargs;
    const char *backend, *devices; /* --backend auto|cpu|cuda, --devices LIST */
    int overwrite, report_error;
    int imatrix_uncovered_ok;      /* an importance matrix that covers nothing: a line per tensor,
                                      a warning, and on (llama-quantize's way) */
    int cpu_threads;               /* > 0: the CPU backend's threads */
    /* --calibrate TEXT or --calibrate-tokens FILE: the importance matrix made first from the text
     * (tokenized with the model's vocabulary) or these token ids (into calibrate_out, a temporary
     * the request's --imatrix names), recorded under calibrate_name */
    const char *calibrate_text, *calibrate_tokens, *calibrate_name, *calibrate_out;
    int calibrate_ctx, calibrate_chunks;
    /* --kld TEXT: the output's KL divergence from the source over the text (kld_measure.c), in
     * chunks of --kld-ctx N tokens (512), at most --kld-chunks N; kld_base: its temporary */
    const char *kld_text, *kld_base;
    int kld_ctx, kld_chunks;
    size_t max_device_bytes;       /* --max-device-bytes: the engine's (--calibrate, --kld) device
                                      memory; 0: what the device has */
};
/* 0, 1 (failed), 2 (a bad request), or 128 + the signal that stopped it. */
int qd_cli_convert_run(const struct qd_cli_conversion *c);
int qd_cli_perplexity(int argc, char **argv);
int qd_cli_tokenize(int argc, char **argv);
int qd_cli_imatrix(int argc, char **argv);
/* quantd imatrix's computation without its command line: the GGUF importance matrix of model
 * over text_path's text or tokens_path's ids (model_input.h; chunks of n_ctx, at most
 * max_chunks, -1 all) on the engine's backend nn (NULL: the CPU), its dataset named dataset,
 * written whole to out. 0, or 1 with a message
 * on stderr that begins with prog. */
int qd_cli_imatrix_make(const char *prog, const char *model, const char *text_path, const char *tokens_path,
                        const char *dataset, int n_ctx, int max_chunks, int threads,
                        const struct qd_nn_backend *nn, const char *out);

/* How perplexity and imatrix show a run of the model (model_run.c): its lines on stdout and
 * stderr as llama.cpp prints them, and its progress on stderr by --progress: bar (one line
 * rewritten with \r: layers and chunks), json (a JSON line a step: {"progress":{"done":N,
 * "total":M,"stage":"layers"|"chunks"|"done"}}), none; auto, the default: the bar on a terminal,
 * else JSON lines. */
enum qd_cli_progress { QD_CLI_PROGRESS_AUTO, QD_CLI_PROGRESS_BAR, QD_CLI_PROGRESS_JSON, QD_CLI_PROGRESS_NONE };
/* auto, bar, json or none: 0, else -1 */
int qd_cli_progress_parse(const char *v, enum qd_cli_progress *out);
/* io's callbacks (io->ctx: sink, which the caller keeps while the run lasts); what names the run
 * on the bar ("perplexity"). */
void qd_cli_run_io(struct qd_run_io *io, struct qd_run_progress_sink *sink, const char *what,
                   enum qd_cli_progress mode);
/* quantd convert --kld (kld_measure.c): the text tokenized with the source's vocabulary and
 * checked before the conversion, measured after it. */
struct qd_cli_kld {
    const char *source, *text;
    int n_ctx, max_chunks;  /* max_chunks -1: every chunk the text fills */
    int threads;            /* 0: every core */
    const struct qd_nn_backend *nn; /* the engine's backend (NULL: the CPU) */
    const volatile int *cancel;
    int32_t *tokens;        /* set by qd_cli_kld_prepare */
    int n_chunks;
};
/* The source must be a GGUF the engine runs and the text at least two chunks long (quantd
 * perplexity's rule). 0, or 1 / 2 (a bad request) with a message on stderr. */
int qd_cli_kld_prepare(const char *prog, struct qd_cli_kld *k);
/* The source's log-probabilities into base_path (a temporary, removed before returning), the
 * output against them; the statistics of quantd perplexity --kl-divergence's summary into
 * `into`: mean, mean_error, median and the percentiles of the divergence at its top level, with
 * same_top_p, ppl {q, base, ...} and delta_p {...}. 0, or 1 with a message on stderr. */
int qd_cli_kld_measure(const char *prog, const struct qd_cli_kld *k, const char *output, const char *base_path,
                       cJSON *into);
void qd_cli_kld_free(struct qd_cli_kld *k);

#endif
