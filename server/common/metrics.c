/* Metrics storage and the text exposition format (see metrics.h). */
#include "common/metrics.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const route_names[QD_ROUTE_COUNT] = {
    "quantize", "dequantize", "jobs", "formats", "healthz", "readyz", "metrics", "convert", "version", "other"};

const char *qd_route_name(enum qd_route r) { return route_names[r]; }

/* Status codes the service answers with; anything else counts as the last entry. */
static const int codes[] = {200, 202, 204, 400, 401, 403, 404, 405, 409, 413, 415, 422, 431, 500, 503, 507, 0};
#define NCODES (int)(sizeof codes / sizeof codes[0])
#define MAX_FMTS 32 /* > qd_format_count; slot MAX_FMTS is "no format" */

static const double request_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double kernel_buckets[] = {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                                        5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
#define NREQ_B (int)(sizeof request_buckets / sizeof request_buckets[0])
#define NKER_B (int)(sizeof kernel_buckets / sizeof kernel_buckets[0])

struct histogram {
    atomic_ulong bucket[NKER_B + 1]; /* sized for the longer list; last: +Inf */
    atomic_ulong sum_ns, count;
};

static atomic_ulong requests[QD_ROUTE_COUNT][MAX_FMTS + 1][NCODES];
static atomic_ulong bytes_in_total, bytes_out_total;
static struct histogram request_hist[QD_ROUTE_COUNT];
static struct histogram kernel_hist[MAX_FMTS + 1];

/* Jobs per device (the worker's name: "cpu", "cuda:N"), registered as first seen. */
#define MAX_DEVICE_NAMES 32
static struct {
    char name[24];
    atomic_ulong jobs, busy_ns;
} device_jobs[MAX_DEVICE_NAMES];
static atomic_int ndevice_names;
static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER; /* (and convert_names) */

static const char *const convert_outcomes[] = {"ok", "failed", "cancelled"};
static atomic_ulong conversions[MAX_FMTS + 1][3], convert_bytes, convert_tensors;
/* conversions whose fmt names no format (back to float, float mixes), by that name */
#define MAX_CONVERT_NAMES 16
static struct {
    char name[32];
    atomic_ulong n[3];
} convert_names[MAX_CONVERT_NAMES];
static atomic_int nconvert_names;

static int fmt_slot(const struct qd_format *f)
{
    int i = f ? (int)(f - qd_formats) : MAX_FMTS;
    return i >= 0 && i < MAX_FMTS ? i : MAX_FMTS;
}

static void observe(struct histogram *h, const double *bounds, int n, double seconds)
{
    int i = 0;
    while (i < n && seconds > bounds[i])
        i++;
    atomic_fetch_add(&h->bucket[i], 1);
    atomic_fetch_add(&h->sum_ns, (unsigned long)(seconds * 1e9));
    atomic_fetch_add(&h->count, 1);
}

void qd_metrics_request(enum qd_route r, const struct qd_format *f, int status, double seconds,
                        size_t bytes_in, size_t bytes_out)
{
    int c = 0;
    while (codes[c] && codes[c] != status)
        c++;
    atomic_fetch_add(&requests[r][fmt_slot(f)][c], 1);
    atomic_fetch_add(&bytes_in_total, bytes_in);
    atomic_fetch_add(&bytes_out_total, bytes_out);
    observe(&request_hist[r], request_buckets, NREQ_B, seconds);
}

unsigned long long qd_metrics_bytes_received(void) { return atomic_load(&bytes_in_total); }

void qd_metrics_kernel(const struct qd_format *f, double seconds)
{
    observe(&kernel_hist[fmt_slot(f)], kernel_buckets, NKER_B, seconds);
}

void qd_metrics_device_job(const char *device, double seconds)
{
    int n = atomic_load(&ndevice_names), k = 0;
    while (k < n && strcmp(device_jobs[k].name, device))
        k++;
    if (k == n) { /* a device not seen before: its slot, under the lock (once per device) */
        pthread_mutex_lock(&device_lock);
        n = atomic_load(&ndevice_names);
        for (k = 0; k < n && strcmp(device_jobs[k].name, device); k++)
            ;
        if (k == n && n < MAX_DEVICE_NAMES) {
            snprintf(device_jobs[k].name, sizeof device_jobs[k].name, "%s", device);
            atomic_store(&ndevice_names, n + 1);
        }
        pthread_mutex_unlock(&device_lock);
        if (k >= MAX_DEVICE_NAMES)
            return;
    }
    atomic_fetch_add(&device_jobs[k].jobs, 1);
    atomic_fetch_add(&device_jobs[k].busy_ns, (unsigned long)(seconds * 1e9));
}

static void render_hist(FILE *o, const char *name, const char *label, const char *value,
                        struct histogram *h, const double *bounds, int n)
{
    unsigned long cum = 0;
    for (int i = 0; i <= n; i++) {
        cum += atomic_load(&h->bucket[i]);
        if (i < n)
            fprintf(o, "%s_bucket{%s=\"%s\",le=\"%g\"} %lu\n", name, label, value, bounds[i], cum);
        else
            fprintf(o, "%s_bucket{%s=\"%s\",le=\"+Inf\"} %lu\n", name, label, value, cum);
    }
    fprintf(o, "%s_sum{%s=\"%s\"} %.9f\n", name, label, value, atomic_load(&h->sum_ns) / 1e9);
    fprintf(o, "%s_count{%s=\"%s\"} %lu\n", name, label, value, atomic_load(&h->count));
}

/* The slot of a conversion's fmt that names no format (bf16|f16|f32 back to float, a float
 * llama-quantize mix), added the first time it is seen; -1 when the table is full. */
static int convert_name_slot(const char *name)
{
    int n = atomic_load(&nconvert_names), k = 0;
    while (k < n && strcmp(convert_names[k].name, name))
        k++;
    if (k == n) {
        pthread_mutex_lock(&device_lock);
        n = atomic_load(&nconvert_names);
        for (k = 0; k < n && strcmp(convert_names[k].name, name); k++)
            ;
        if (k == n && n < MAX_CONVERT_NAMES) {
            snprintf(convert_names[k].name, sizeof convert_names[k].name, "%s", name);
            atomic_store(&nconvert_names, n + 1);
        }
        pthread_mutex_unlock(&device_lock);
    }
    return k < MAX_CONVERT_NAMES ? k : -1;
}

void qd_metrics_convert(const char *fmt, const char *outcome, unsigned long long bytes, int tensors)
{
    int o = 0;
    while (o < 2 && strcmp(convert_outcomes[o], outcome))
        o++;
    const struct qd_format *f = qd_format_find(fmt);
    const int named = f ? -1 : convert_name_slot(fmt);
    if (f || named < 0)
        atomic_fetch_add(&conversions[fmt_slot(f)][o], 1);
    else
        atomic_fetch_add(&convert_names[named].n[o], 1);
    atomic_fetch_add(&convert_bytes, bytes);
    atomic_fetch_add(&convert_tensors, (unsigned long)tensors);
}

/* glibc's heap as the allocator sees it: bytes in live allocations against bytes it holds free
 * (and the arenas holding them). Live bytes that climb under a steady load are a leak; free bytes
 * that climb while live bytes stay level are the allocator keeping memory (fragmentation, arenas
 * of more threads), which RSS alone cannot tell apart. */
static void render_heap(FILE *o)
{
    struct mallinfo2 mi = mallinfo2();
    int arenas = 0;
    char *xml = NULL;
    size_t xml_len = 0;
    FILE *x = open_memstream(&xml, &xml_len);
    if (x) { /* malloc_info lists each arena as a <heap nr="N"> */
        malloc_info(0, x);
        fclose(x);
        for (const char *p = xml; p && (p = strstr(p, "<heap nr=")); p++)
            arenas++;
        free(xml);
    }
    fprintf(o, "# HELP quantd_heap_in_use_bytes Bytes of live malloc allocations (mmapped ones included).\n"
               "# TYPE quantd_heap_in_use_bytes gauge\nquantd_heap_in_use_bytes %zu\n"
               "# HELP quantd_heap_free_bytes Bytes malloc holds free in its arenas (not given back to the system).\n"
               "# TYPE quantd_heap_free_bytes gauge\nquantd_heap_free_bytes %zu\n"
               "# HELP quantd_heap_arenas malloc arenas in use (threads share them; M_ARENA_MAX bounds them).\n"
               "# TYPE quantd_heap_arenas gauge\nquantd_heap_arenas %d\n",
            mi.uordblks + mi.hblkhd, mi.fordblks, arenas);
}

char *qd_metrics_render(const struct qd_metrics_gauges *g, size_t *len)
{
    char *buf = NULL;
    FILE *o = open_memstream(&buf, len);
    if (!o)
        return NULL;
    fputs("# HELP quantd_requests_total HTTP requests answered, by operation, format and status code.\n"
          "# TYPE quantd_requests_total counter\n", o);
    for (int r = 0; r < QD_ROUTE_COUNT; r++)
        for (int f = 0; f <= MAX_FMTS; f++)
            for (int c = 0; c < NCODES; c++) {
                unsigned long v = atomic_load(&requests[r][f][c]);
                if (!v)
                    continue;
                fprintf(o, "quantd_requests_total{op=\"%s\",fmt=\"%s\",code=\"", route_names[r],
                        f < MAX_FMTS && f < qd_format_count ? qd_formats[f].name : "");
                fprintf(o, codes[c] ? "%d" : "other", codes[c]);
                fprintf(o, "\"} %lu\n", v);
            }
    fputs("# HELP quantd_request_duration_seconds Time from request start to answer queued.\n"
          "# TYPE quantd_request_duration_seconds histogram\n", o);
    for (int r = 0; r < QD_ROUTE_COUNT; r++)
        if (atomic_load(&request_hist[r].count))
            render_hist(o, "quantd_request_duration_seconds", "op", route_names[r], &request_hist[r],
                        request_buckets, NREQ_B);
    fputs("# HELP quantd_kernel_duration_seconds Backend time of a job (copies and kernels).\n"
          "# TYPE quantd_kernel_duration_seconds histogram\n", o);
    for (int f = 0; f < MAX_FMTS && f < qd_format_count; f++)
        if (atomic_load(&kernel_hist[f].count))
            render_hist(o, "quantd_kernel_duration_seconds", "fmt", qd_formats[f].name, &kernel_hist[f],
                        kernel_buckets, NKER_B);
    fputs("# HELP quantd_device_jobs_total Jobs a device's workers ran (\"cpu\" or \"cuda:N\").\n"
          "# TYPE quantd_device_jobs_total counter\n", o);
    for (int k = 0; k < atomic_load(&ndevice_names); k++)
        fprintf(o, "quantd_device_jobs_total{device=\"%s\"} %lu\n", device_jobs[k].name,
                atomic_load(&device_jobs[k].jobs));
    fputs("# HELP quantd_device_busy_seconds_total Time a device's workers spent running jobs.\n"
          "# TYPE quantd_device_busy_seconds_total counter\n", o);
    for (int k = 0; k < atomic_load(&ndevice_names); k++)
        fprintf(o, "quantd_device_busy_seconds_total{device=\"%s\"} %.6f\n", device_jobs[k].name,
                (double)atomic_load(&device_jobs[k].busy_ns) / 1e9);
    fputs("# HELP quantd_conversions_total Model conversions (/jobs?op=convert) finished, by format and outcome.\n"
          "# TYPE quantd_conversions_total counter\n", o);
    for (int f = 0; f < MAX_FMTS && f < qd_format_count; f++)
        for (int k = 0; k < 3; k++)
            if (atomic_load(&conversions[f][k]))
                fprintf(o, "quantd_conversions_total{fmt=\"%s\",outcome=\"%s\"} %lu\n", qd_formats[f].name,
                        convert_outcomes[k], atomic_load(&conversions[f][k]));
    for (int f = 0; f < atomic_load(&nconvert_names); f++)
        for (int k = 0; k < 3; k++)
            if (atomic_load(&convert_names[f].n[k]))
                fprintf(o, "quantd_conversions_total{fmt=\"%s\",outcome=\"%s\"} %lu\n", convert_names[f].name,
                        convert_outcomes[k], atomic_load(&convert_names[f].n[k]));
    fprintf(o, "# HELP quantd_convert_bytes_total Model bytes read by conversions.\n"
               "# TYPE quantd_convert_bytes_total counter\nquantd_convert_bytes_total %lu\n"
               "# HELP quantd_convert_tensors_total Tensors written by conversions.\n"
               "# TYPE quantd_convert_tensors_total counter\nquantd_convert_tensors_total %lu\n",
            atomic_load(&convert_bytes), atomic_load(&convert_tensors));
    fprintf(o, "# HELP quantd_received_bytes_total Request body bytes received.\n"
               "# TYPE quantd_received_bytes_total counter\nquantd_received_bytes_total %lu\n"
               "# HELP quantd_sent_bytes_total Response body bytes sent.\n"
               "# TYPE quantd_sent_bytes_total counter\nquantd_sent_bytes_total %lu\n",
            atomic_load(&bytes_in_total), atomic_load(&bytes_out_total));
    fprintf(o, "# HELP quantd_queue_depth Jobs waiting for a worker.\n"
               "# TYPE quantd_queue_depth gauge\nquantd_queue_depth %d\n"
               "# HELP quantd_queue_capacity Jobs the queue holds before answering 503.\n"
               "# TYPE quantd_queue_capacity gauge\nquantd_queue_capacity %d\n"
               "# HELP quantd_jobs_running Jobs on a worker now.\n"
               "# TYPE quantd_jobs_running gauge\nquantd_jobs_running %d\n"
               "# HELP quantd_workers Worker threads (one backend stream each).\n"
               "# TYPE quantd_workers gauge\nquantd_workers %d\n"
               "# HELP quantd_jobs_stored Asynchronous jobs held (queued, running or finished).\n"
               "# TYPE quantd_jobs_stored gauge\nquantd_jobs_stored %d\n"
               "# HELP quantd_jobs_stored_bytes Bytes of finished asynchronous results held.\n"
               "# TYPE quantd_jobs_stored_bytes gauge\nquantd_jobs_stored_bytes %.0f\n"
               "# HELP quantd_inflight_requests HTTP requests being received, queued or answered.\n"
               "# TYPE quantd_inflight_requests gauge\nquantd_inflight_requests %d\n"
               "# HELP quantd_slow_clients_cut_total Connections closed for trickling their headers or body.\n"
               "# TYPE quantd_slow_clients_cut_total counter\nquantd_slow_clients_cut_total %ld\n",
            g->queue_depth, g->queue_capacity, g->jobs_running, g->workers, g->jobs_stored,
            g->jobs_stored_bytes, g->inflight_requests, g->slow_clients_cut);
    fprintf(o, "# HELP quantd_lingering_connections Connections whose body, refused before or while it was sent, is read and dropped now before the close (--linger-connections at most).\n"
               "# TYPE quantd_lingering_connections gauge\nquantd_lingering_connections %d\n"
               "# HELP quantd_lingered_connections_total Connections that lingered so after an early answer.\n"
               "# TYPE quantd_lingered_connections_total counter\nquantd_lingered_connections_total %lu\n"
               "# HELP quantd_lingered_bytes_total Body bytes read and dropped while lingering.\n"
               "# TYPE quantd_lingered_bytes_total counter\nquantd_lingered_bytes_total %llu\n"
               "# HELP quantd_linger_full_total Early answers closed at once, --linger-connections lingering already.\n"
               "# TYPE quantd_linger_full_total counter\nquantd_linger_full_total %lu\n",
            g->lingering_connections, g->lingered_connections, g->lingered_bytes, g->linger_full);
    fprintf(o, "# HELP quantd_inflight_body_bytes Request body bytes held now (received, queued or decoded).\n"
               "# TYPE quantd_inflight_body_bytes gauge\nquantd_inflight_body_bytes %.0f\n"
               "# HELP quantd_inflight_body_limit_bytes The most body bytes held at once (--max-inflight-bytes).\n"
               "# TYPE quantd_inflight_body_limit_bytes gauge\nquantd_inflight_body_limit_bytes %.0f\n"
               "# HELP quantd_inflight_body_refused_total Bodies refused (503, or 413 for one over the limit) to stay under it.\n"
               "# TYPE quantd_inflight_body_refused_total counter\nquantd_inflight_body_refused_total %lu\n"
               "# HELP quantd_convert_queue_depth Conversions waiting for a conversion worker.\n"
               "# TYPE quantd_convert_queue_depth gauge\nquantd_convert_queue_depth %d\n"
               "# HELP quantd_convert_jobs_running Conversions on a conversion worker now.\n"
               "# TYPE quantd_convert_jobs_running gauge\nquantd_convert_jobs_running %d\n"
               "# HELP quantd_convert_workers Conversion worker threads (--convert-workers).\n"
               "# TYPE quantd_convert_workers gauge\nquantd_convert_workers %d\n",
            g->inflight_body_bytes, g->inflight_body_limit_bytes, g->inflight_body_refused, g->convert_queue_depth,
            g->convert_jobs_running, g->convert_workers);
    fprintf(o, "# HELP quantd_backend_info The backend serving requests.\n"
               "# TYPE quantd_backend_info gauge\n"
               "quantd_backend_info{backend=\"%s\",device=\"%s\",version=\"%s\"} 1\n"
               "# HELP quantd_devices GPUs in use (0 on the CPU backend).\n"
               "# TYPE quantd_devices gauge\nquantd_devices %d\n"
               "# HELP quantd_device_memory_used_bytes Device memory held by quantd's buffer pools.\n"
               "# TYPE quantd_device_memory_used_bytes gauge\nquantd_device_memory_used_bytes %.0f\n"
               "# HELP quantd_ready 1 when /readyz answers 200.\n"
               "# TYPE quantd_ready gauge\nquantd_ready %d\n"
               "# HELP quantd_draining 1 after SIGTERM, while accepted jobs finish.\n"
               "# TYPE quantd_draining gauge\nquantd_draining %d\n",
            g->backend, g->backend_info, g->version, g->devices,
            g->device_memory_used_bytes, g->ready, g->draining);
    fprintf(o, "# HELP quantd_device_healthy 1 unless the device (a GPU slot, or the CPU) hit a sticky error.\n"
               "# TYPE quantd_device_healthy gauge\n");
    if (!g->devices)
        fprintf(o, "quantd_device_healthy{device=\"cpu\",slot=\"0\"} %d\n", g->healthy);
    for (int i = 0; i < g->devices; i++)
        fprintf(o, "quantd_device_healthy{device=\"%s\",slot=\"%d\"} %d\n", g->device_name[i], i,
                g->device_healthy[i]);
    render_heap(o);
    fclose(o);
    return buf;
}
