/* bin/quantd convert: a model file in, the file its runtime loads out (server/checkpoint).
 * On a terminal a progress line (tensor i/N, GB done, GB/s, ETA) on stderr; otherwise one
 * JSON line per tensor on stdout. A JSON summary line at the end either way. */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../../kernels/cpu/cpu.h"
#include "checkpoint/convert.h"
#include "checkpoint/convert_request.h"
#include "checkpoint/gguf_options.h"
#include "checkpoint/gguf_recipe.h"
#include "checkpoint/pipeline.h"
#include "cli/cli.h"
#include "common/files.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: quantd convert --in SRC --out DST (--fmt FMT | --recipe MIX) [--param k=v ...]\n"
            "                      [--skip RE] [--only RE] [--force] [--backend auto|cpu|cuda] [--devices LIST]\n"
            "                      [--report-error] [llama-quantize's options, GGUF out]\n"
            "  --fmt FMT: one format for every tensor the runtime would quantize, in the layout of its\n"
            "  runtime; the input decides which formats apply:\n%s"
            "  --recipe MIX: from a GGUF file, the GGUF llama-quantize writes for MIX, each tensor's type\n"
            "    chosen by its rules: %s\n"
            "  Names are case-insensitive. A directory in gives a directory out (DST is created, or an\n"
            "  existing empty directory receives the files); a file in gives a file out.\n"
            "  --force: replace an existing DST (without it, quantd refuses to overwrite anything).\n"
            "  --skip/--only: POSIX extended regexes narrowing which of the tensors the runtime would\n"
            "  quantize are quantized. --param: the format's parameters (quantd formats lists them).\n"
            "  --report-error adds each tensor's NMSE. docs/convert.md has the rules of each layout.\n"
            "  GGUF out takes llama-quantize's options under its names and with its meaning (types: ggml's\n"
            "  names in any case; a mix may be given as llama-quantize's number, 15 for Q4_K_M):\n"
            "    --pure: the mix's default type for every tensor (what --fmt does)\n"
            "    --output-tensor-type TYPE, --token-embedding-type TYPE, --leave-output-tensor\n"
            "    --tensor-type PATTERN=TYPE (repeatable; the first pattern found in a name wins),\n"
            "    --tensor-type-file FILE (PATTERN=TYPE entries separated by white space)\n"
            "    --override-kv KEY=int:N|float:X|bool:true|str:TEXT (repeatable), --prune-layers L0,L1,...\n"
            "    --dry-run: each tensor's type and the output's size, nothing written (--out optional)\n"
            "    --split-max-tensors N, --split-max-size N(M|G): the output cut as llama-gguf-split cuts it\n"
            "    --keep-split: a split input's shards, each its own file, as llama-quantize keeps them\n"
            "  A split GGUF (llama-gguf-split's NAME-00001-of-0000N.gguf ...) is given as its first shard.\n"
            "    --calibrate TEXT: the importance matrix made first from the text (quantd imatrix's,\n"
            "      chunks of --calibrate-ctx N tokens, default 512, at most --calibrate-chunks N) and\n"
            "      used as --imatrix is, recorded under the text's name; --calibrate-tokens FILE: from\n"
            "      token ids instead (with --calibrate TEXT too, recorded under the text's name)\n"
            "    --kld TEXT: then the output's KL divergence from the source over the text, as quantd\n"
            "      perplexity --kl-divergence-base (source) and --kl-divergence (output) compute it, in\n"
            "      chunks of --kld-ctx N tokens (default 512), at most --kld-chunks N; under \"kld\" in\n"
            "      the summary (mean, median, percentiles, same_top_p, ppl {q, base}, delta_p)\n"
            "    --calibrate and --kld run the model on --backend's device (auto: CUDA where built and\n"
            "      a device answers, else the CPU), holding at most --max-device-bytes N (4GiB, ...)\n"
            "  llama-quantize's own command line (IN [OUT] TYPE [nthreads]): quantd llama-quantize --help.\n"
            "  Exit status: 0, 1 (the input, the destination or the conversion failed), 2 (a bad request).\n",
            qd_convert_layouts_text(), qd_gguf_recipe_names());
}

struct progress {
    int tty;
    int each_uncovered; /* a line per tensor the importance matrix has no entry for (llama-quantize's) */
    struct timespec start;
};

static double since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void on_tensor(void *ctx, const struct qd_convert_event *ev)
{
    struct progress *pr = ctx;
    if (pr->each_uncovered && ev->no_importance)
        fprintf(stderr, "%sdid not find weights for %s: quantized without an importance\n", pr->tty ? "\n" : "",
                ev->name);
    if (pr->tty) {
        double s = since(&pr->start), rate = s > 0 ? ev->in_done / s : 0;
        double eta = rate > 0 ? (double)(ev->in_total - ev->in_done) / rate : 0;
        const char *what = ev->action == QD_CONVERT_QUANTIZE ? ev->fmt : ev->action == QD_CONVERT_CAST ? ev->fmt : "copied";
        fprintf(stderr, "\r[%d/%d] %.2f/%.2f GB  %.2f GB/s  ETA %.0f s  %-40.40s %-7s", ev->index, ev->count,
                ev->in_done / 1e9, ev->in_total / 1e9, rate / 1e9, eta, ev->name, what);
        if (ev->index == ev->count)
            fputc('\n', stderr);
        return;
    }
    char shape[96] = "";
    for (int d = 0, at = 0; d < ev->ndim && at < (int)sizeof shape - 24; d++)
        at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%" PRId64, d ? "," : "", ev->shape[d]);
    const char *what = ev->action == QD_CONVERT_QUANTIZE ? ev->fmt : ev->action == QD_CONVERT_CAST ? ev->fmt : "copied";
    printf("{\"tensor\":%d,\"of\":%d,\"name\":\"%s\",\"fmt\":\"%s\",\"shape\":[%s],\"ms\":%.3f", ev->index, ev->count,
           ev->name, what, shape, ev->ms);
    if (ev->has_nmse)
        printf(",\"nmse\":%.6g", ev->nmse);
    if (ev->rule) /* Hugging Face layouts: which rule chose this tensor's treatment */
        printf(",\"rule\":\"%s\"", ev->rule);
    printf("}\n");
    fflush(stdout); /* each line as it happens, for whoever follows the progress through a pipe */
}

static const char *signal_name(int sig)
{
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

/* The signal that asked the conversion to stop (the pipeline polls it before each tensor). */
static volatile int stop_signal;
/* the importance matrix --calibrate made and the source's log-probabilities --kld writes,
 * removed with the other temporaries */
static const char *calibrate_file, *kld_file;

/* Waits for a stop signal and passes it on through stop_signal. A second one, or a conversion
 * that has not stopped within 10 s (a read that does not return), removes every temporary now
 * and exits. */
static void *watch_signals(void *arg)
{
    const sigset_t *set = arg;
    int sig;
    if (sigwait(set, &sig))
        return NULL;
    stop_signal = sig;
    struct timespec grace = {10, 0};
    sigtimedwait(set, NULL, &grace);
    int n = qd_convert_remove_temporaries();
    if (calibrate_file && !unlink(calibrate_file))
        n++;
    if (kld_file && !unlink(kld_file))
        n++;
    fprintf(stderr, "\nquantd convert: stopped by %s; %d temporar%s removed\n", signal_name(sig), n,
            n == 1 ? "y" : "ies");
    _exit(128 + sig);
}

static int run_converted(const struct qd_cli_conversion *c, struct qd_convert_spec *spec, struct qd_convert_opts *op,
                         const struct qd_cli_kld *kld);

/* Runs the resolved request: the input and destination checked before any device is opened, the
 * conversion, and its summary as the last line. 0, 1 (failed), or 128 + a stop signal. */
static int run(const struct qd_cli_conversion *c, struct qd_convert_spec *spec)
{
    const char *prog = c->prog;
    char err[1024];
    struct qd_convert_opts o;
    memset(&o, 0, sizeof o);
    qd_convert_spec_opts(spec, &o);
    o.src = c->src, o.dst = c->dst;
    o.overwrite = c->overwrite, o.report_error = c->report_error;
    if (!o.src || (!o.dst && !spec->gguf.dry_run)) {
        fprintf(stderr, "%s: %s is required (%s --help)\n", prog, !o.src ? c->in_name : c->out_name, prog);
        return 2;
    }
    const char *backend_name = c->backend;
    if (strcmp(backend_name, "auto") && strcmp(backend_name, "cpu") && strcmp(backend_name, "cuda")) {
        fprintf(stderr, "%s: --backend must be auto, cpu or cuda\n", prog);
        return 2;
    }
    /* whether the input and the destination can do, before any device or tensor is touched */
    struct qd_convert_dest dest;
    enum qd_status st;
    if (qd_convert_check(&o, &dest, &st, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 1;
    }
    /* --calibrate and --kld run the model: the engine's backend, as quantd imatrix and perplexity
     * choose it */
    const struct qd_nn_backend *nn = NULL;
    if ((c->calibrate_out || c->kld_text) && qd_engine_backend(backend_name, c->max_device_bytes, &nn, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 1;
    }
    /* --kld: the source runs on the engine and the text is long enough, before anything is made */
    struct qd_cli_kld kld = {.source = c->src, .text = c->kld_text, .n_ctx = c->kld_ctx, .max_chunks = c->kld_chunks,
                             .threads = c->cpu_threads, .nn = nn, .cancel = &stop_signal};
    int rc = c->kld_text ? qd_cli_kld_prepare(prog, &kld) : 0;
    if (!rc)
        rc = run_converted(c, spec, &o, &kld);
    qd_cli_kld_free(&kld);
    return rc;
}

/* run()'s rest, once --kld's text is tokenized */
static int run_converted(const struct qd_cli_conversion *c, struct qd_convert_spec *spec, struct qd_convert_opts *op,
                         const struct qd_cli_kld *kld)
{
    const char *prog = c->prog, *backend_name = c->backend;
    struct qd_convert_opts o = *op;
    enum qd_status st;
    char err[1024];
    /* the importance matrix, once the destination is known to take the output */
    if (c->calibrate_out &&
        qd_cli_imatrix_make(prog, c->src, c->calibrate_text, c->calibrate_tokens, c->calibrate_name, c->calibrate_ctx,
                            c->calibrate_chunks, c->cpu_threads, kld->nn, c->calibrate_out))
        return 1;
    /* SIGINT, SIGTERM, SIGHUP: the conversion stops at its next tensor and removes what it wrote
     * (watch_signals); blocked here, before any thread starts, so that every thread inherits it */
    static sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN); /* a reader of the JSON lines that goes away does not kill the conversion */
    pthread_t watcher;
    if (pthread_create(&watcher, NULL, watch_signals, &stop) == 0)
        pthread_detach(watcher);
    o.cancel = &stop_signal;
    if (c->cpu_threads > 0) /* (the CPU backend's; a GPU's kernels have their own) */
        qd_cpu_set_threads(c->cpu_threads);
    struct qd_backend b;
    double t_init = qd_pipe_clock_s();
    int gpu = strcmp(backend_name, "cpu") && qd_backend_cuda_open(&b, c->devices, err, sizeof err) == 0;
    qd_pipe_trace("driver", -1, t_init, qd_pipe_clock_s(), 0);
    if (gpu) {
        /* the GPU */
    } else if (!strcmp(backend_name, "cuda")) {
        fprintf(stderr, "%s: --backend cuda: %s\n", prog, err);
        return 1;
    } else
        qd_backend_cpu_open(&b, err, sizeof err);
    char name[32];
    o.backend = &b;
    double t_worker = qd_pipe_clock_s();
    o.worker = b.worker_open(&b, 0, name, sizeof name, err, sizeof err);
    qd_pipe_trace("worker", -1, t_worker, qd_pipe_clock_s(), 0);
    if (!o.worker) {
        fprintf(stderr, "%s: %s\n", prog, err);
        b.close(&b);
        return 1;
    }
    if (qd_convert_spread(&o, err, sizeof err)) /* one worker per device slot */
        fprintf(stderr, "%s: a device is left out: %s\n", prog, err);
    qd_pipe_trace("init", -1, t_init, qd_pipe_clock_s(), 0);
    /* a terminal: the bar; else JSON lines */
    struct progress pr = {.tty = isatty(STDOUT_FILENO), .each_uncovered = c->imatrix_uncovered_ok};
    clock_gettime(CLOCK_MONOTONIC, &pr.start);
    o.progress = on_tensor;
    o.progress_ctx = &pr;
    struct qd_convert_summary s;
    int rc = qd_convert(&o, &s, &st, err, sizeof err);
    double t_close = qd_pipe_clock_s();
    qd_convert_unspread(&o);
    b.worker_close(o.worker);
    b.close(&b);
    qd_pipe_trace("close", -1, t_close, qd_pipe_clock_s(), 0);
    free(s.layout_config);
    if (rc) {
        if (pr.tty)
            fputc('\n', stderr);
        if (st == QD_ECANCELED && stop_signal) {
            fprintf(stderr, "%s: stopped by %s; nothing was written (the partial output is removed)\n", prog,
                    signal_name(stop_signal));
            return 128 + stop_signal;
        }
        fprintf(stderr, "%s: %s\n", prog, err);
        return 1;
    }
    char note[512];
    qd_convert_imatrix_note(&s, note, sizeof note);
    if (note[0])
        fprintf(stderr, "%s: warning: %s\n", prog, note);
    cJSON *sum = qd_convert_summary_json(spec, &s, name), *line = cJSON_CreateObject();
    cJSON_AddStringToObject(sum, "in", o.src); /* what only the command line has */
    cJSON_AddStringToObject(sum, "out", o.dst ? o.dst : "");
    if (c->kld_text) {
        if (pr.tty)
            fprintf(stderr, "%s: the KL divergence over %s (%d chunks of %d tokens)\n", prog, c->kld_text,
                    kld->n_chunks, kld->n_ctx);
        cJSON *k = cJSON_AddObjectToObject(sum, "kld");
        if (qd_cli_kld_measure(prog, kld, o.dst, c->kld_base, k)) {
            fprintf(stderr, "%s: %s is written whole; its KL divergence was not measured\n", prog, o.dst);
            cJSON_Delete(sum);
            cJSON_Delete(line);
            return stop_signal ? 128 + stop_signal : 1;
        }
    }
    cJSON_AddNumberToObject(sum, "peak_rss_bytes", (double)qd_peak_rss_bytes());
    cJSON_AddItemToObject(line, "summary", sum);
    char *text = cJSON_PrintUnformatted(line);
    if (text)
        printf("%s\n", text);
    free(text);
    cJSON_Delete(line);
    return 0;
}

int qd_cli_convert_run(const struct qd_cli_conversion *c)
{
    const char *prog = c->prog;
    struct qd_convert_spec *spec = qd_convert_spec_new();
    char err[1024];
    if (!spec) {
        fprintf(stderr, "%s: no memory\n", prog);
        return 1;
    }
    /* the request's names and options, resolved as every entry point resolves them */
    if (qd_convert_resolve(spec, c->args, c->nargs, err, sizeof err) != QD_OK) {
        fprintf(stderr, "%s: %s\n", prog, err);
        qd_convert_spec_free(spec);
        return 2;
    }
    spec->gguf.imatrix_uncovered_ok = c->imatrix_uncovered_ok;
    if (c->calibrate_out) { /* recorded under the calibration's name, opened at the temporary */
        free(spec->gguf.imatrix);
        if (!(spec->gguf.imatrix = strdup(c->calibrate_name))) {
            fprintf(stderr, "%s: no memory\n", prog);
            qd_convert_spec_free(spec);
            return 1;
        }
    }
    int rc = run(c, spec);
    qd_convert_spec_free(spec);
    return rc;
}

int qd_cli_convert(int argc, char **argv)
{
    struct qd_cli_conversion c = {.prog = "quantd convert", .in_name = "--in SRC", .out_name = "--out DST", .backend = "auto",
                                  .calibrate_ctx = 512, .calibrate_chunks = -1, .kld_ctx = 512, .kld_chunks = -1};
    char calibrate_path[4096], kld_path[4096];
    struct qd_convert_arg *args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) {
        fprintf(stderr, "quantd convert: no memory\n");
        return 1;
    }
    c.args = args;
    int rc = -1;
    for (int i = 0; rc < 0 && i < argc; i++) {
        const char *a = argv[i];
        int takes_value;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
        } else if (strncmp(a, "--", 2)) {
            /* llama-quantize's form: IN OUT TYPE [nthreads] */
            fprintf(stderr, "quantd convert: unexpected argument '%s': quantd convert takes options only (--in SRC "
                    "--out DST --fmt FMT ...); for llama-quantize's command line (IN OUT TYPE [nthreads]) run quantd "
                    "llama-quantize [options] IN OUT TYPE [nthreads]\n", a);
            rc = 2;
        } else if (!strcmp(a, "--report-error"))
            c.report_error = 1;
        else if (!strcmp(a, "--force"))
            c.overwrite = 1;
        else if (qd_gguf_option_known(a + 2, &takes_value) && !strchr(a, '_')) /* llama-quantize's */
            args[c.nargs++] = (struct qd_convert_arg){a + 2, takes_value ? (i + 1 < argc ? argv[++i] : "") : NULL};
        else if (i + 1 >= argc) {
            fprintf(stderr, "quantd convert: %s needs a value (quantd convert --help)\n", a);
            rc = 2;
        } else {
            const char *v = argv[++i];
            if (!strcmp(a, "--in")) c.src = v;
            else if (!strcmp(a, "--out")) c.dst = v;
            else if (!strcmp(a, "--backend")) c.backend = v;
            else if (!strcmp(a, "--devices")) c.devices = v;
            else if (!strcmp(a, "--max-device-bytes")) {
                if (qd_parse_bytes(v, &c.max_device_bytes)) {
                    fprintf(stderr, "quantd convert: --max-device-bytes takes a byte count such as 4GiB, not '%s'\n", v);
                    rc = 2;
                }
            }
            else if (!strcmp(a, "--calibrate")) c.calibrate_text = v;
            else if (!strcmp(a, "--calibrate-tokens")) c.calibrate_tokens = v;
            else if (!strcmp(a, "--kld")) c.kld_text = v;
            else if (!strcmp(a, "--calibrate-ctx") || !strcmp(a, "--calibrate-chunks") || !strcmp(a, "--kld-ctx") ||
                     !strcmp(a, "--kld-chunks")) {
                /* a chunk of fewer than 16 tokens gives no matrix (llama-imatrix's rule); a KL
                 * divergence needs 4 (one scored position, quantd perplexity's least) */
                const int ctx = !!strstr(a, "-ctx"), kld = !strncmp(a, "--kld", 5), least = ctx ? (kld ? 4 : 16) : 1;
                char *end;
                long n = strtol(v, &end, 10);
                if (!*v || *end || n < least || n > 1 << 24) {
                    fprintf(stderr, "quantd convert: %s takes an integer >= %d, not '%s'\n", a, least, v);
                    rc = 2;
                } else
                    *(kld ? (ctx ? &c.kld_ctx : &c.kld_chunks) : ctx ? &c.calibrate_ctx : &c.calibrate_chunks) = (int)n;
            }
            else if (!strcmp(a, "--fmt") || !strcmp(a, "--recipe") || !strcmp(a, "--skip") || !strcmp(a, "--only") ||
                     !strcmp(a, "--param"))
                args[c.nargs++] = (struct qd_convert_arg){a + 2, v};
            else {
                fprintf(stderr, "quantd convert: unknown option '%s' (quantd convert --help)\n", a);
                rc = 2;
            }
        }
    }
    if (rc < 0 && (c.calibrate_text || c.calibrate_tokens)) {
        for (int i = 0; i < c.nargs; i++)
            if (!strcmp(args[i].key, "imatrix")) {
                fprintf(stderr, "quantd convert: give --imatrix FILE or --calibrate, not both\n");
                rc = 2;
            }
        /* a temporary the matrix is written to, named for this process */
        const char *tmp = getenv("TMPDIR");
        snprintf(calibrate_path, sizeof calibrate_path, "%s/quantd-calibrate-%ld.imatrix.gguf", tmp && *tmp ? tmp : "/tmp",
                 (long)getpid());
        c.calibrate_out = calibrate_file = calibrate_path;
        c.calibrate_name = c.calibrate_text ? c.calibrate_text : c.calibrate_tokens;
        args[c.nargs++] = (struct qd_convert_arg){"imatrix", calibrate_path};
    }
    if (rc < 0 && c.kld_text) {
        /* one GGUF out, written: what the engine reads */
        for (int i = 0; i < c.nargs; i++)
            if (!strcmp(args[i].key, "dry-run") || !strcmp(args[i].key, "keep-split") ||
                !strncmp(args[i].key, "split-max-", 10)) {
                fprintf(stderr, "quantd convert: --kld measures one output file: leave out --%s\n", args[i].key);
                rc = 2;
            }
        const char *tmp = getenv("TMPDIR");
        snprintf(kld_path, sizeof kld_path, "%s/quantd-kld-%ld.logits", tmp && *tmp ? tmp : "/tmp", (long)getpid());
        c.kld_base = kld_file = kld_path;
    }
    if (rc < 0)
        rc = qd_cli_convert_run(&c);
    if (c.calibrate_out)
        unlink(c.calibrate_out);
    free(args);
    return rc;
}
