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

#include "checkpoint/convert.h"
#include "checkpoint/gguf_options.h"
#include "checkpoint/gguf_recipe.h"
#include "checkpoint/pipeline.h"
#include "cli/cli.h"

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
            "  A split GGUF (llama-gguf-split's NAME-00001-of-0000N.gguf ...) is given as its first shard.\n",
            qd_convert_layouts_text(), qd_gguf_recipe_names());
}

struct progress {
    int tty;
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
    fprintf(stderr, "\nquantd convert: stopped by %s; %d temporar%s removed\n", signal_name(sig), n,
            n == 1 ? "y" : "ies");
    _exit(128 + sig);
}

/* This process's peak resident set (VmHWM: per address space, so a forked parent's pages do
 * not count, unlike getrusage's ru_maxrss); 0 where /proc is missing. */
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

int qd_cli_convert(int argc, char **argv)
{
    struct qd_convert_opts o;
    memset(&o, 0, sizeof o);
    const char *fmt = NULL, *recipe = NULL, *backend_name = "auto", *devices = NULL, *params[64];
    int nparams = 0;
    static struct qd_gguf_options gguf; /* (large: not on the stack) */
    qd_gguf_options_init(&gguf);
    o.gguf = &gguf;
    char err[1024];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int takes_value;
        if (!strncmp(a, "--", 2) && qd_gguf_option_known(a + 2, &takes_value) && !strchr(a, '_')) {
            const char *v = takes_value ? (i + 1 < argc ? argv[++i] : "") : NULL;
            if (qd_gguf_option_set(&gguf, a + 2, v, err, sizeof err)) {
                fprintf(stderr, "quantd convert: %s\n", err);
                qd_gguf_options_free(&gguf);
                return 2;
            }
            continue;
        }
        if (!strcmp(a, "--report-error")) {
            o.report_error = 1;
            continue;
        }
        if (!strcmp(a, "--force")) {
            o.overwrite = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v || strncmp(a, "--", 2)) {
            fprintf(stderr, "quantd convert: bad or incomplete argument '%s' (quantd convert --help)\n", a);
            return 2;
        }
        if (!strcmp(a, "--in")) o.src = v;
        else if (!strcmp(a, "--out")) o.dst = v;
        else if (!strcmp(a, "--fmt")) fmt = v;
        else if (!strcmp(a, "--recipe")) recipe = v;
        else if (!strcmp(a, "--skip")) o.skip = v;
        else if (!strcmp(a, "--only")) o.only = v;
        else if (!strcmp(a, "--backend")) backend_name = v;
        else if (!strcmp(a, "--devices")) devices = v;
        else if (!strcmp(a, "--param") && nparams < 64) params[nparams++] = v;
        else {
            fprintf(stderr, "quantd convert: unknown option '%s' (quantd convert --help)\n", a);
            return 2;
        }
    }
    if (fmt && recipe) {
        fprintf(stderr, "quantd convert: give --fmt or --recipe, not both (a recipe chooses each tensor's format)\n");
        return 2;
    }
    /* llama-quantize's numeric ids name mixes: --fmt 2 is --pure Q4_0 */
    if (fmt && strspn(fmt, "0123456789") == strlen(fmt) && qd_convert_recipe_named(fmt)) {
        recipe = fmt, fmt = NULL;
        gguf.pure = 1;
    }
    if (!o.src || (!o.dst && !gguf.dry_run) || (!fmt && !recipe)) {
        fprintf(stderr, "quantd convert: %s is required (quantd convert --help)\n",
                !o.src ? "--in SRC" : !o.dst ? "--out DST" : "--fmt FMT or --recipe MIX");
        return 2;
    }
    if (recipe) {
        const struct qd_gguf_recipe *r = qd_convert_recipe_named(recipe);
        const struct qd_format *f = r ? NULL : qd_convert_format_named(recipe);
        if (f) {
            fprintf(stderr, "quantd convert: '%s' is a format, not a llama-quantize mix: use --fmt %s\n", recipe,
                    f->name);
            return 2;
        }
        if (!r) {
            fprintf(stderr, "quantd convert: unknown recipe '%s' (quantd writes %s)\n", recipe, qd_gguf_recipe_names());
            return 2;
        }
        o.recipe = r->name;
        fmt = r->fmt;
        if (!fmt && nparams) { /* F16, BF16, F32, COPY: no quantizer to take parameters */
            fprintf(stderr, "quantd convert: --param does not apply to the %s mix (it quantizes nothing)\n", r->name);
            return 2;
        }
    }
    const int named = fmt || !recipe; /* a format (or back to float), not a mix */
    if (named && !(o.f = qd_convert_format_named(fmt)) && (o.to_float = qd_convert_to_float_named(fmt)) && nparams) {
        fprintf(stderr, "quantd convert: --fmt %s (back to float) takes no --param\n", o.to_float);
        return 2;
    }
    if (named && !o.f && !o.to_float) {
        const struct qd_gguf_recipe *r = qd_convert_recipe_named(fmt);
        if (r && !r->fmt)
            fprintf(stderr, "quantd convert: '%s' is a llama-quantize mix, not a format: use --recipe %s\n", fmt,
                    r->name);
        else if (r)
            fprintf(stderr, "quantd convert: '%s' is a llama-quantize mix, not one format: use --recipe %s (--fmt "
                    "gives every quantized tensor one type, such as %s)\n", fmt, r->name, r->fmt);
        else
            fprintf(stderr, "quantd convert: unknown format '%s'; quantd convert writes:\n%s", fmt,
                    qd_convert_layouts_text());
        return 2;
    }
    if (o.f)
        qd_params_default(o.f, &o.params);
    for (int i = 0; o.f && i < nparams; i++) {
        char key[64];
        const char *eq = strchr(params[i], '=');
        if (!eq || (size_t)(eq - params[i]) >= sizeof key) {
            fprintf(stderr, "quantd convert: --param needs k=v (got '%s')\n", params[i]);
            return 2;
        }
        memcpy(key, params[i], (size_t)(eq - params[i]));
        key[eq - params[i]] = 0;
        if (qd_params_set(o.f, &o.params, key, eq + 1, err, sizeof err) != QD_OK) {
            fprintf(stderr, "quantd convert: %s\n", err);
            return 2;
        }
    }
    if (strcmp(backend_name, "auto") && strcmp(backend_name, "cpu") && strcmp(backend_name, "cuda")) {
        fprintf(stderr, "quantd convert: --backend must be auto, cpu or cuda\n");
        return 2;
    }
    /* whether the input and the destination can do, before any device or tensor is touched */
    struct qd_convert_dest dest;
    enum qd_status st;
    if (qd_convert_check(&o, &dest, &st, err, sizeof err)) {
        fprintf(stderr, "quantd convert: %s\n", err);
        return 1;
    }
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
    struct qd_backend b;
    double t_init = qd_pipe_clock_s();
    int gpu = strcmp(backend_name, "cpu") && qd_backend_cuda_open(&b, devices, err, sizeof err) == 0;
    qd_pipe_trace("driver", -1, t_init, qd_pipe_clock_s(), 0);
    if (gpu) {
        /* the GPU */
    } else if (!strcmp(backend_name, "cuda")) {
        fprintf(stderr, "quantd convert: --backend cuda: %s\n", err);
        return 1;
    } else
        qd_backend_cpu_open(&b, err, sizeof err);
    char name[32];
    o.backend = &b;
    double t_worker = qd_pipe_clock_s();
    o.worker = b.worker_open(&b, 0, name, sizeof name, err, sizeof err);
    qd_pipe_trace("worker", -1, t_worker, qd_pipe_clock_s(), 0);
    if (!o.worker) {
        fprintf(stderr, "quantd convert: %s\n", err);
        b.close(&b);
        return 1;
    }
    if (qd_convert_spread(&o, err, sizeof err)) /* one worker per device slot */
        fprintf(stderr, "quantd convert: a device is left out: %s\n", err);
    qd_pipe_trace("init", -1, t_init, qd_pipe_clock_s(), 0);
    struct progress pr = {.tty = isatty(STDOUT_FILENO)}; /* a terminal: the bar; else JSON lines */
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
            fprintf(stderr, "quantd convert: stopped by %s; nothing was written (the partial output is removed)\n",
                    signal_name(stop_signal));
            return 128 + stop_signal;
        }
        fprintf(stderr, "quantd convert: %s\n", err);
        return 1;
    }
    double bpw = s.params_total ? s.bytes_out * 8.0 / (double)s.params_total : 0;
    char arch[512] = ""; /* Hugging Face layouts: the model type and which rule chose the weights */
    if (s.rule) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "arch", s.arch);
        cJSON_AddStringToObject(a, "rule", s.rule);
        if (s.rule_why[0])
            cJSON_AddStringToObject(a, "rule_why", s.rule_why);
        char *text = cJSON_PrintUnformatted(a);
        if (text && strlen(text) > 2)
            snprintf(arch, sizeof arch, "%.*s,", (int)strlen(text) - 2, text + 1);
        free(text);
        cJSON_Delete(a);
    }
    if (o.recipe) /* the mix asked for, before the rest */
        printf("{\"summary\":{\"recipe\":\"%s\",%s", o.recipe, gguf.pure ? "\"pure\":true," : "");
    else
        printf("{\"summary\":{");
    if (s.dry_run) /* nothing written: bytes_out is the size the file would have */
        printf("\"dry_run\":true,");
    printf("%s\"in\":\"%s\",\"out\":\"%s\",\"fmt\":\"%s\",\"backend\":\"%s\",\"quantized\":%d,"
           "\"copied\":%d,\"cast_f16\":%d,\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64 ",\"bits_per_weight\":%.3f,"
           "\"seconds\":%.3f,\"gb_per_s\":%.3f,\"read_s\":%.3f,\"quantize_s\":%.3f,\"write_s\":%.3f,"
           "\"peak_rss_bytes\":%" PRIu64 "}}\n",
           arch, o.src, o.dst ? o.dst : "", o.f ? o.f->name : o.to_float ? o.to_float : o.recipe, name, s.quantized, s.copied, s.cast, s.bytes_in, s.bytes_out, bpw, s.seconds,
           s.seconds > 0 ? s.bytes_in / s.seconds / 1e9 : 0.0, s.stages.read_s, s.stages.process_s, s.stages.write_s,
           peak_rss_bytes());
    return 0;
}
