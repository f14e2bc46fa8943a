/* Prometheus metrics: counters and histograms updated with atomics on the request path,
 * rendered as text on GET /metrics. Names follow quantd_<noun>_<unit>. */
#ifndef QD_METRICS_H
#define QD_METRICS_H

#include <stddef.h>

#include "../../kernels/registry.h"

enum qd_route {
    QD_ROUTE_QUANTIZE, QD_ROUTE_DEQUANTIZE, QD_ROUTE_JOBS, QD_ROUTE_FORMATS, QD_ROUTE_HEALTHZ,
    QD_ROUTE_READYZ, QD_ROUTE_METRICS, QD_ROUTE_CONVERT, QD_ROUTE_VERSION, QD_ROUTE_OTHER, QD_ROUTE_COUNT
};

const char *qd_route_name(enum qd_route r);

/* One finished HTTP request; f may be NULL. */
void qd_metrics_request(enum qd_route r, const struct qd_format *f, int status, double seconds,
                        size_t bytes_in, size_t bytes_out);
/* The request bodies' bytes received so far (quantd_received_bytes_total). */
unsigned long long qd_metrics_bytes_received(void);
/* Backend time of one job. */
void qd_metrics_kernel(const struct qd_format *f, double seconds);
/* One job run by a worker of `device` (its name: "cpu", "cuda:N") for `seconds`. */
void qd_metrics_device_job(const char *device, double seconds);
/* A finished conversion: what it wrote (its summary's fmt: a format's name, or bf16|f16|f32 back
 * to float, or a llama-quantize mix that quantizes nothing), its outcome ("ok", "failed",
 * "cancelled"), input bytes and tensors. */
void qd_metrics_convert(const char *fmt, const char *outcome, unsigned long long bytes, int tensors);

/* The gauges that /metrics reads at render time. */
struct qd_metrics_gauges {
    int queue_depth, queue_capacity, jobs_running, workers, jobs_stored;
    double jobs_stored_bytes;
    int inflight_requests;
    long slow_clients_cut;
    int lingering_connections;           /* linger.h: read and dropped after an early answer */
    unsigned long lingered_connections, linger_full;
    unsigned long long lingered_bytes;
    const char *backend, *backend_info, *version;
    int devices, healthy, ready, draining;
    const int *device_healthy;          /* per GPU slot (devices of them) */
    const char (*device_name)[16];
    double device_memory_used_bytes;
    double inflight_body_bytes, inflight_body_limit_bytes; /* --max-inflight-bytes */
    unsigned long inflight_body_refused;
    int convert_queue_depth, convert_jobs_running, convert_workers;
};

/* The exposition text (malloc'd). */
char *qd_metrics_render(const struct qd_metrics_gauges *g, size_t *len);

#endif
