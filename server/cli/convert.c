/* bin/quantd convert: a model file in, the file its runtime loads out (server/checkpoint).
 * On a terminal a progress line (tensor i/N, GB done, GB/s, ETA) on stderr; otherwise one
 * JSON line per tensor on stdout. A JSON summary line at the end either way. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint/convert.h"
#include "checkpoint/gguf_recipe.h"
#include "checkpoint/pipeline.h"
#include "cli/cli.h"

static const char *const usage_text =
    "usage: quantd convert --in SRC --out DST (--fmt FMT | --recipe MIX) [--param k=v ...]\n"
    "                      [--skip RE] [--only RE] [--backend auto|cpu|cuda] [--devices LIST]\n"
    "                      [--report-error]\n"
    "  GGUF in (F32/F16/BF16 weights), --fmt q4_0|q4_1|q5_0|q5_1|q8_0|q2_K..q6_K: the GGUF\n"
    "  llama-quantize --pure writes; --recipe Q4_K_M (or another of llama-quantize's mixes): the\n"
    "  GGUF llama-quantize writes for that type, each tensor's type chosen by its rules.\n"
    "  Hugging Face model in, --fmt nf4|fp4: transformers + bitsandbytes. --skip/--only: POSIX\n"
    "  extended regexes narrowing which of the tensors the runtime would quantize are quantized.\n"
    "  --report-error adds each tensor's NMSE.\n";

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
        fprintf(stderr, "\r[%d/%d] %.2f/%.2f GB  %.2f GB/s  ETA %.0f s  %-40.40s", ev->index, ev->count,
                ev->in_done / 1e9, ev->in_total / 1e9, rate / 1e9, eta, ev->name);
        if (ev->index == ev->count)
            fputc('\n', stderr);
        return;
    }
    char shape[96] = "";
    for (int d = 0, at = 0; d < ev->ndim && at < (int)sizeof shape - 24; d++)
        at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%" PRId64, d ? "," : "", ev->shape[d]);
    const char *what = ev->action == QD_CONVERT_QUANTIZE ? ev->fmt : ev->action == QD_CONVERT_CAST_F16 ? "f16" : "copied";
    printf("{\"tensor\":%d,\"of\":%d,\"name\":\"%s\",\"fmt\":\"%s\",\"shape\":[%s],\"ms\":%.3f", ev->index, ev->count,
           ev->name, what, shape, ev->ms);
    if (ev->has_nmse)
        printf(",\"nmse\":%.6g", ev->nmse);
    if (ev->rule) /* Hugging Face layouts: which rule chose this tensor's treatment */
        printf(",\"rule\":\"%s\"", ev->rule);
    printf("}\n");
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
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--report-error")) {
            o.report_error = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v || strncmp(a, "--", 2)) {
            fprintf(stderr, "quantd convert: bad or incomplete argument '%s'\n%s", a, usage_text);
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
            fprintf(stderr, "quantd convert: unknown option '%s'\n%s", a, usage_text);
            return 2;
        }
    }
    if (!o.src || !o.dst || !fmt == !recipe) {
        fprintf(stderr, "quantd convert: --in, --out and one of --fmt or --recipe are required\n%s", usage_text);
        return 2;
    }
    char err[1024];
    if (recipe) {
        const struct qd_gguf_recipe *r = qd_gguf_recipe_find(recipe);
        if (!r) {
            fprintf(stderr, "quantd convert: unknown recipe '%s' (quantd writes %s)\n", recipe, qd_gguf_recipe_names());
            return 2;
        }
        o.recipe = recipe;
        fmt = r->fmt;
    }
    if (!(o.f = qd_convert_format(qd_format_find(fmt)))) {
        fprintf(stderr, "quantd convert: unknown format '%s' (quantd formats lists them)\n", fmt);
        return 2;
    }
    qd_params_default(o.f, &o.params);
    for (int i = 0; i < nparams; i++) {
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
    struct qd_backend b;
    double t_init = qd_pipe_clock_s();
    if (strcmp(backend_name, "cpu") && qd_backend_cuda_open(&b, devices, err, sizeof err) == 0) {
        /* the GPU */
    } else if (!strcmp(backend_name, "cuda")) {
        fprintf(stderr, "quantd convert: --backend cuda: %s\n", err);
        return 1;
    } else
        qd_backend_cpu_open(&b, err, sizeof err);
    char name[32];
    o.backend = &b;
    o.worker = b.worker_open(&b, 0, name, sizeof name, err, sizeof err);
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
    enum qd_status st;
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
    printf("{\"summary\":{%s\"in\":\"%s\",\"out\":\"%s\",\"fmt\":\"%s\",\"backend\":\"%s\",\"quantized\":%d,"
           "\"copied\":%d,\"cast_f16\":%d,\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64 ",\"bits_per_weight\":%.3f,"
           "\"seconds\":%.3f,\"gb_per_s\":%.3f,\"read_s\":%.3f,\"quantize_s\":%.3f,\"write_s\":%.3f,"
           "\"peak_rss_bytes\":%" PRIu64 "}}\n",
           arch, o.src, o.dst, o.f->name, name, s.quantized, s.copied, s.cast, s.bytes_in, s.bytes_out, bpw, s.seconds,
           s.seconds > 0 ? s.bytes_in / s.seconds / 1e9 : 0.0, s.stages.read_s, s.stages.process_s, s.stages.write_s,
           peak_rss_bytes());
    return 0;
}
