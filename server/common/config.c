/* The option table of quantd serve (see config.h). */
#include "common/config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum kind { TEXT, INT, SIZE };

struct option {
    const char *flag, *env, *deflt, *help;
    enum kind kind;
    size_t offset, size;
    long long min, max;
};

#define F(field) offsetof(struct qd_serve_config, field), sizeof(((struct qd_serve_config *)0)->field)
static const struct option options[] = {
    {"--listen", "QUANTD_LISTEN", "0.0.0.0:8080", "ADDR:PORT to listen on", TEXT, F(listen), 0, 0},
    {"--backend", "QUANTD_BACKEND", "auto", "auto|cpu|cuda (auto: CUDA when a GPU is usable)", TEXT, F(backend), 0, 0},
    {"--workers", "QUANTD_WORKERS", "0", "worker threads, each with its own stream (0: backend default)", INT, F(workers), 0, 256},
    {"--queue-depth", "QUANTD_QUEUE_DEPTH", "64", "jobs waiting before new ones get 503", INT, F(queue_depth), 1, 1 << 20},
    {"--max-body-bytes", "QUANTD_MAX_BODY_BYTES", "1073741824", "largest request body (413 beyond)", SIZE, F(max_body_bytes), 1, 1LL << 40},
    {"--token", "QUANTD_TOKEN", "", "bearer token required on the API (not on health or metrics)", TEXT, F(token), 0, 0},
    {"--devices", "QUANTD_DEVICES", "", "GPU indices for the CUDA backend, e.g. 0,1 (default: all visible)", TEXT, F(devices), 0, 0},
    {"--http-threads", "QUANTD_HTTP_THREADS", "0", "libmicrohttpd threads (0: one per core, at least 4)", INT, F(http_threads), 0, 256},
    {"--result-ttl", "QUANTD_RESULT_TTL", "600", "seconds a finished async job's result is kept", INT, F(result_ttl_s), 1, 1 << 30},
    {"--result-max-bytes", "QUANTD_RESULT_MAX_BYTES", "2147483648", "bytes of async results kept in all", SIZE, F(result_max_bytes), 0, 1LL << 42},
    {"--max-jobs", "QUANTD_MAX_JOBS", "4096", "async jobs known at once", INT, F(max_jobs), 1, 1 << 24},
    {"--drain-timeout", "QUANTD_DRAIN_TIMEOUT", "300", "seconds SIGTERM waits for accepted jobs", INT, F(drain_timeout_s), 0, 1 << 24},
    {"--cpu-threads", "QUANTD_CPU_THREADS", "0", "threads of one CPU job (0: every core)", INT, F(cpu_threads), 0, 1024},
    {"--data-dir", "QUANTD_DATA_DIR", "", "the directory /jobs?op=convert reads and writes models in (unset: conversions off)", TEXT, F(data_dir), 0, 0},
    {"--max-convert-bytes", "QUANTD_MAX_CONVERT_BYTES", "1099511627776", "largest model body of POST /convert (413 beyond; spooled to --data-dir or TMPDIR, not held in memory)", SIZE, F(max_convert_bytes), 1, 1LL << 50},
    {"--conn-timeout", "QUANTD_CONN_TIMEOUT", "60", "seconds a connection may send or read nothing before it is closed (a slow or stuck client)", INT, F(conn_timeout_s), 1, 1 << 20},
    {"--max-header-bytes", "QUANTD_MAX_HEADER_BYTES", "16384", "request line and headers in all (431 beyond)", INT, F(max_header_bytes), 1024, 1 << 16},
    {"--max-connections", "QUANTD_MAX_CONNECTIONS", "4096", "connections open at once (beyond: 503 and closed at accept)", INT, F(max_connections), 1, 1 << 16},
    {"--linger-timeout", "QUANTD_LINGER_TIMEOUT", "30", "seconds the rest of a body refused before or during its sending (413, 401, 431) is read and dropped after the answer, so that a client that writes before it reads gets it (0: closed at once)", INT, F(linger_timeout_s), 0, 3600},
    {"--linger-bytes", "QUANTD_LINGER_BYTES", "67108864", "the most body bytes read and dropped after such an answer; past them the connection is reset (0: closed at once)", SIZE, F(linger_bytes), 0, 1LL << 40},
    {"--linger-connections", "QUANTD_LINGER_CONNECTIONS", "256", "connections lingering so at once, each counted in --max-connections (beyond: closed at once; 0: none)", INT, F(linger_connections), 0, 1 << 16},
    {"--max-json-bytes", "QUANTD_MAX_JSON_BYTES", "65536", "JSON of a request body apart from its base64 \"data\" strings, and a safetensors body's header (413 / 400 beyond)", SIZE, F(max_json_bytes), 1024, 1LL << 30},
    {"--max-safetensors-header-bytes", "QUANTD_MAX_SAFETENSORS_HEADER_BYTES", "16777216", "header of a safetensors model that is converted (400 beyond)", SIZE, F(max_safetensors_header_bytes), 1024, 100000000},
    {"--max-inflight-bytes", "QUANTD_MAX_INFLIGHT_BYTES", "0", "request bodies held in memory at once, received, queued or running (503 beyond; 0: a quarter of the memory)", SIZE, F(max_inflight_bytes), 0, 1LL << 50},
    {"--convert-workers", "QUANTD_CONVERT_WORKERS", "1", "threads that run conversions, apart from the workers of /quantize and /dequantize", INT, F(convert_workers), 1, 64},
    {"--pinned-bytes", "QUANTD_PINNED_BYTES", "2147483648", "page-locked host memory for bodies and results (CUDA backend)", SIZE, F(pinned_bytes), 0, 1LL << 42},
};
#define NOPTIONS (int)(sizeof options / sizeof options[0])

static int set(struct qd_serve_config *c, const struct option *o, const char *v, const char *from,
               char *err, size_t errlen)
{
    char *field = (char *)c + o->offset;
    if (o->kind == TEXT) {
        if (strlen(v) >= o->size) {
            snprintf(err, errlen, "%s: value too long", from);
            return -1;
        }
        strcpy(field, v);
        return 0;
    }
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || n < o->min || n > o->max) {
        snprintf(err, errlen, "%s: expected an integer in [%lld, %lld], got '%s'", from, o->min,
                 o->max, v);
        return -1;
    }
    if (o->kind == INT)
        *(int *)field = (int)n;
    else
        *(long long *)field = n;
    return 0;
}

void qd_config_usage(FILE *to)
{
    fputs("usage: quantd serve [options]\n"
          "Each option can also be set by its environment variable; the flag wins.\n", to);
    for (int i = 0; i < NOPTIONS; i++)
        fprintf(to, "  %-20s %-26s %s (default: %s)\n", options[i].flag, options[i].env,
                options[i].help, *options[i].deflt ? options[i].deflt : "none");
}

int qd_config_load(struct qd_serve_config *c, int argc, char **argv, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < NOPTIONS; i++)
        if (set(c, &options[i], options[i].deflt, options[i].flag, err, errlen))
            return -1;
    for (int i = 0; i < NOPTIONS; i++) {
        const char *v = getenv(options[i].env);
        if (v && set(c, &options[i], v, options[i].env, err, errlen))
            return -1;
    }
    for (int a = 0; a < argc; a++) {
        if (!strcmp(argv[a], "-h") || !strcmp(argv[a], "--help")) {
            qd_config_usage(stdout);
            return 1;
        }
        const char *eq = strchr(argv[a], '=');
        size_t n = eq ? (size_t)(eq - argv[a]) : strlen(argv[a]);
        int k = 0;
        while (k < NOPTIONS && (strlen(options[k].flag) != n || strncmp(options[k].flag, argv[a], n)))
            k++;
        if (k == NOPTIONS) {
            snprintf(err, errlen, "unknown option '%s' (quantd serve --help)", argv[a]);
            return -1;
        }
        const char *v = eq ? eq + 1 : (a + 1 < argc ? argv[++a] : NULL);
        if (!v) {
            snprintf(err, errlen, "%s needs a value", options[k].flag);
            return -1;
        }
        if (set(c, &options[k], v, options[k].flag, err, errlen))
            return -1;
    }
    if (strcmp(c->backend, "auto") && strcmp(c->backend, "cpu") && strcmp(c->backend, "cuda")) {
        snprintf(err, errlen, "--backend must be auto, cpu or cuda (got '%s')", c->backend);
        return -1;
    }
    return 0;
}
