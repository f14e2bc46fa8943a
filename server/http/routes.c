/* The HTTP routes (routes.h): each route of the table carries its methods, whether it needs the
 * token, what a POST's query and headers decide before its body (precheck), and the handler
 * that answers it once the body is in (now, or by queueing a job and suspending the connection,
 * which the worker resumes when the answer is ready). */
#include "http/routes.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"
#include "http/convert_job.h"
#include "http/convert_route.h"
#include "http/decode.h"
#include "http/encode.h"
#include "http/linger.h"
#include "http/model_job.h"
#include "http/reply.h"
#include "http/watchdog.h"
#include "http/work_job.h"
#include "queue/hostmem.h"

struct query {
    struct qd_kv kv[64];
    int n, overflow;
};

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct query *q = cls;
    if (q->n == 64)
        q->overflow = 1;
    else
        q->kv[q->n++] = (struct qd_kv){key, value};
    return MHD_YES;
}

/* The query of a POST, or NULL with the 400 set. */
static int query_of(struct MHD_Connection *mc, struct conn *c, struct query *q)
{
    MHD_get_connection_values(mc, MHD_GET_ARGUMENT_KIND, collect_arg, q);
    if (q->overflow)
        qd_reply_error(&c->reply, 400, "bad_request", "more than 64 query arguments");
    return !q->overflow;
}

/* POST /convert: a model file, checked now and spooled as it comes. */
static void precheck_convert(struct MHD_Connection *mc, struct conn *c)
{
    struct query q = {.n = 0};
    if (!query_of(mc, c, &q))
        return;
    {
        const char *ct = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        c->req.op = QD_OP_CONVERT;
        c->upload = qd_convert_upload_begin(q.kv, q.n, ct, cl ? strtoll(cl, NULL, 10) : -1,
                                            qd_convert_spool_dir(qd_srv.config->data_dir),
                                            qd_srv.config->max_convert_bytes, &c->reply);
        c->req.f = c->upload ? qd_convert_upload_format(c->upload) : NULL;
    }
}

/* POST /quantize, /dequantize, /jobs: what the query and headers decide before the body. */
static void precheck_work(struct MHD_Connection *mc, struct conn *c)
{
    struct query q = {.n = 0};
    if (!query_of(mc, c, &q))
        return;
    c->req.op = c->r->op;
    c->req.json_limit = qd_srv.config->max_json_bytes;
    if (qd_req_from_query(&c->req, q.kv, q.n, c->r->async, &c->reply))
        return;
    const char *accept = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
    c->req.binary_out = accept && strstr(accept, "application/octet-stream") != NULL;
    const char *ct = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (qd_body_kind(&c->req, ct, NULL, 0) < 0) {
        qd_reply_error(&c->reply, 415, "unsupported_media_type",
                       "Content-Type %.64s is not taken: send application/octet-stream or application/json", ct);
        return;
    }
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    long long length = cl ? strtoll(cl, NULL, 10) : -1; /* (over the limit: refused in first_call) */
    /* a raw tensor's length and the format's shape rules are known before the body */
    struct qd_req *r = &c->req;
    if (r->op == QD_OP_QUANTIZE && r->f && r->has_dtype && r->has_shape &&
        qd_body_kind(r, ct, NULL, 0) == QD_BODY_RAW) {
        struct qd_tensor t = {.dtype = r->dtype};
        qd_tensor_set_shape(&t, r->ndim, r->shape);
        long long want = (long long)((size_t)qd_tensor_numel(&t) * qd_dtype_size(r->dtype));
        if (length >= 0 && length != want) {
            qd_reply_error(&c->reply, 400, "length_mismatch", "the body has %lld bytes but shape x dtype needs %lld",
                           length, want);
            return;
        }
        struct qd_params p;
        struct qd_component comps[QD_MAX_COMPONENTS];
        char err[512];
        qd_params_default(r->f, &p);
        for (int i = 0; i < r->nparams; i++)
            qd_params_set(r->f, &p, r->param_key[i], r->param_value[i], err, sizeof err);
        if (qd_format_layout(r->f, &p, &t, comps, err, sizeof err) < 0)
            qd_reply_error(&c->reply, 422, "unsupported_shape", "%s", err);
    }
    /* overload: refused before the body is held (it is read and dropped), so that clients
     * beyond the queue cost no memory */
    if (!c->reply.status && qd_jobs_full())
        qd_conn_busy(&c->reply, "the job queue is full");
    if (length > 0 && !c->reply.status)
        qd_conn_reserve(c, (size_t)length);
    if (length > 0 && !c->reply.status && !(c->body = qd_hostmem_get((size_t)length)))
        qd_reply_error(&c->reply, 503, "out_of_memory", "no memory for a %lld-byte body", length);
    else if (length > 0)
        c->cap = (size_t)length;
}

static void job_json_reply(struct qd_reply *r, int status, struct qd_job *j)
{
    int st = atomic_load(&j->state);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "op", qd_op_name(j->req.op));
    const struct qd_convert_request *conv = qd_convert_job_request(j);
    if (j->req.f || conv)
        cJSON_AddStringToObject(o, "fmt", conv ? qd_convert_request_fmt(conv) : j->req.f->name);
    if (conv) { /* tensors and bytes done, the rate so far and what it leaves */
        cJSON *p = cJSON_AddObjectToObject(o, "progress");
        double done = (double)atomic_load(&j->bytes_done), total = (double)atomic_load(&j->bytes_total);
        double secs = j->started_us > 0 ? ((st == QD_JOB_DONE ? j->done_us : qd_now_us()) - j->started_us) / 1e6 : 0;
        cJSON_AddNumberToObject(p, "tensors_done", atomic_load(&j->tensors_done));
        cJSON_AddNumberToObject(p, "tensors_total", atomic_load(&j->tensors_total));
        cJSON_AddNumberToObject(p, "bytes_done", done);
        cJSON_AddNumberToObject(p, "bytes_total", total);
        cJSON_AddNumberToObject(p, "bytes_per_s", secs > 0 ? done / secs : 0);
        cJSON_AddNumberToObject(p, "eta_s", secs > 0 && done > 0 && st != QD_JOB_DONE ? (total - done) / (done / secs) : 0);
    }
    qd_model_job_progress_json(j, o); /* (layers and chunks, for perplexity and imatrix jobs) */
    cJSON_AddStringToObject(o, "status", qd_job_state_name(st));
    cJSON_AddNumberToObject(o, "created", j->created_unix);
    char loc[96];
    snprintf(loc, sizeof loc, "/jobs/%s", j->id);
    cJSON_AddStringToObject(o, "location", loc);
    if (st == QD_JOB_DONE) {
        cJSON_AddNumberToObject(o, "http_status", j->reply.status);
        cJSON_AddItemToObject(o, "timing", qd_timing_json(&j->timing));
        cJSON_AddStringToObject(o, "backend", j->backend);
    }
    qd_reply_json(r, status, o);
}

/* Runs on the worker thread: wake the suspended connection (or tell the HTTP thread, which
 * has not suspended yet, to answer at once). */
static void sync_job_done(struct qd_job *j)
{
    struct conn *c = j->conn;
    pthread_mutex_lock(&c->lock);
    c->job_done = 1;
    int resume = c->suspended;
    c->suspended = 0;
    pthread_mutex_unlock(&c->lock);
    /* after the unlock: once resumed, the HTTP thread may answer and free c at any moment */
    if (resume)
        MHD_resume_connection((struct MHD_Connection *)j->conn_handle);
}

static enum MHD_Result answer_job(struct MHD_Connection *mc, struct conn *c)
{
    return qd_conn_send(mc, c, &c->job->reply, 1);
}

static enum MHD_Result start_work(struct MHD_Connection *mc, struct conn *c, const char *method)
{
    const char *ct = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    int kind = qd_body_kind(&c->req, ct, c->body, c->len);
    struct qd_convert_request *conv = NULL;
    struct qd_model_job_request *run = NULL; /* a perplexity or imatrix job */
    if (c->r->model_body) { /* the spooled model; the answer is the converted file */
        conv = qd_convert_upload_finish(c->upload, &c->reply);
        c->upload = NULL;
        if (!conv)
            return qd_conn_send(mc, c, &c->reply, 1);
    } else if (qd_op_names_files(c->req.op) && c->len > (size_t)qd_srv.config->max_json_bytes) {
        qd_reply_error(&c->reply, 413, "json_too_large", "the %s request takes %zu bytes of JSON, over "
                       "--max-json-bytes (%lld)", qd_op_name(c->req.op), c->len, qd_srv.config->max_json_bytes);
        return qd_conn_send(mc, c, &c->reply, 1);
    } else if (c->req.op == QD_OP_PERPLEXITY || c->req.op == QD_OP_IMATRIX) { /* checked whole, as conversions are */
        struct query q = {.n = 0};
        if (!query_of(mc, c, &q) || !(run = qd_model_job_parse(c->req.op, qd_srv.config->data_dir, q.kv, q.n, c->body,
                                                                c->len, &c->reply)))
            return qd_conn_send(mc, c, &c->reply, 1);
    } else if (c->req.op == QD_OP_CONVERT) { /* the query and the body, checked whole before it is accepted */
        struct query q = {.n = 0};
        if (!query_of(mc, c, &q) ||
            !(conv = qd_convert_request_parse(qd_srv.config->data_dir, q.kv, q.n, c->body, c->len, &c->reply)))
            return qd_conn_send(mc, c, &c->reply, 1);
    }
    if (conv)
        conv->max_header_bytes = (uint64_t)qd_srv.config->max_safetensors_header_bytes;
    if (c->r->async && !conv && !run && /* checked before it is accepted, as sync calls are */
        qd_work_precheck(&c->req, (enum qd_body_kind)kind, c->body, c->len, &c->label_f, &c->reply))
        return qd_conn_send(mc, c, &c->reply, 1);
    struct qd_job *j = qd_job_new();
    if (!j) {
        qd_convert_request_free(conv);
        qd_model_job_free(run);
        qd_reply_error(&c->reply, 503, "out_of_memory", "no memory for a job");
        return qd_conn_send(mc, c, &c->reply, 1);
    }
    j->type = conv ? &qd_convert_job_type : run ? &qd_model_job_type : &qd_work_job_type;
    j->payload = conv ? (void *)conv : (void *)run;
    j->req = c->req;
    j->kind = (enum qd_body_kind)kind;
    if (!conv && !run) { /* (a whole-model job's JSON is read: it stays with the connection) */
        j->body = c->body;
        j->body_len = c->len;
        j->body_reserved = c->reserved;
        c->body = NULL;
        c->reserved = 0;
    }
    j->received_us = qd_now_us();
    if (c->r->async) {
        enum qd_status s = qd_jobs_store(j);
        if (s == QD_OK && (s = qd_jobs_submit(j)) != QD_OK)
            qd_jobs_remove(j->id);
        if (s == QD_OK) {
            job_json_reply(&c->reply, 202, j);
            snprintf(c->reply.location, sizeof c->reply.location, "/jobs/%s", j->id);
        } else
            qd_conn_busy(&c->reply, "the job queue or store is full");
        qd_job_unref(j);
        return qd_conn_send(mc, c, &c->reply, 1);
    }
    j->on_done = sync_job_done;
    j->conn = c;
    j->conn_handle = mc;
    c->job = j;
    if (qd_jobs_run_here(j))
        return answer_job(mc, c);
    pthread_mutex_lock(&c->lock);
    if (qd_jobs_submit(j) != QD_OK) {
        pthread_mutex_unlock(&c->lock);
        qd_conn_busy(&c->reply, "the job queue is full");
        return qd_conn_send(mc, c, &c->reply, 1);
    }
    if (!c->job_done) {
        MHD_suspend_connection(mc);
        c->suspended = 1;
        pthread_mutex_unlock(&c->lock);
        return MHD_YES;
    }
    pthread_mutex_unlock(&c->lock);
    return answer_job(mc, c);
}

static enum MHD_Result jobs_get(struct MHD_Connection *mc, struct conn *c, const char *method)
{
    const int sub = c->job_result;
    struct qd_job *j = qd_jobs_find(c->job_id);
    if (!j) {
        qd_reply_error(&c->reply, 404, "not_found", "no job %s (finished results expire)", c->job_id);
        return qd_conn_send(mc, c, &c->reply, 1);
    }
    enum MHD_Result rc;
    if (!strcmp(method, "DELETE")) {
        qd_jobs_remove(c->job_id);
        qd_reply_take(&c->reply, 204, NULL, NULL, 0);
        rc = qd_conn_send(mc, c, &c->reply, 1);
    } else if (!sub)
        job_json_reply(&c->reply, 200, j), rc = qd_conn_send(mc, c, &c->reply, 1);
    else if (atomic_load(&j->state) != QD_JOB_DONE) {
        qd_reply_error(&c->reply, 409, "not_ready", "job %s has not finished; poll GET /jobs/%s", j->id, j->id);
        rc = qd_conn_send(mc, c, &c->reply, 1);
    } else
        rc = qd_conn_send(mc, c, &j->reply, 0); /* the stored answer, copied: it may be read again */
    qd_job_unref(j);
    return rc;
}

static int ready_now(const char **why)
{
    struct qd_jobs_stats js;
    struct qd_backend_stats bs = {0};
    qd_jobs_stats(&js);
    qd_srv.backend->stats(qd_srv.backend, &bs);
    *why = !atomic_load(&qd_srv.ready) ? "starting" : atomic_load(&qd_srv.draining) ? "draining"
         : !bs.healthy ? "device_unhealthy" : js.depth >= js.capacity ? "queue_full" : NULL;
    return *why == NULL;
}

static enum MHD_Result metrics_get(struct MHD_Connection *mc, struct conn *c, const char *method)
{
    struct qd_jobs_stats js;
    struct qd_backend_stats bs = {0};
    const char *why;
    qd_jobs_stats(&js);
    qd_srv.backend->stats(qd_srv.backend, &bs);
    struct qd_hostmem_inflight in;
    qd_hostmem_inflight(&in);
    struct qd_linger_stats ls;
    qd_linger_stats(&ls);
    struct qd_metrics_gauges g = {
        .lingering_connections = ls.lingering, .lingered_connections = ls.lingered, .lingered_bytes = ls.bytes,
        .linger_full = ls.full,
        .inflight_body_bytes = (double)in.bytes, .inflight_body_limit_bytes = (double)in.limit,
        .inflight_body_refused = atomic_load(&qd_srv.inflight_refused), .convert_queue_depth = js.convert_depth,
        .convert_jobs_running = js.convert_running, .convert_workers = js.convert_workers,
        .queue_depth = js.depth, .queue_capacity = js.capacity, .jobs_running = js.running,
        .workers = js.workers, .jobs_stored = js.stored, .jobs_stored_bytes = (double)js.stored_bytes,
        .inflight_requests = atomic_load(&qd_srv.inflight), .slow_clients_cut = qd_watch_cut_total() + atomic_load(&qd_srv.slow_bodies),
        .backend = qd_jobs_backend_name(),
        .backend_info = qd_srv.backend->info, .version = QD_VERSION, .devices = bs.devices,
        .healthy = bs.healthy, .ready = ready_now(&why), .draining = atomic_load(&qd_srv.draining),
        .device_healthy = bs.device_healthy, .device_name = bs.device_name,
        .device_memory_used_bytes = bs.memory_used_bytes};
    size_t len;
    char *text = qd_metrics_render(&g, &len);
    if (!text)
        qd_reply_error(&c->reply, 503, "out_of_memory", "out of memory");
    else
        qd_reply_take(&c->reply, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    return qd_conn_send(mc, c, &c->reply, 1);
}

static enum MHD_Result formats_get(struct MHD_Connection *mc, struct conn *c, const char *method)
{
    qd_reply_take(&c->reply, 200, "application/json", strdup(qd_srv.formats_json), strlen(qd_srv.formats_json));
    return qd_conn_send(mc, c, &c->reply, 1);
}

static enum MHD_Result healthz_get(struct MHD_Connection *mc, struct conn *c, const char *method)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddStringToObject(o, "version", QD_VERSION);
    qd_reply_json(&c->reply, 200, o);
    return qd_conn_send(mc, c, &c->reply, 1);
}

static enum MHD_Result version_get(struct MHD_Connection *mc, struct conn *c, const char *method)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", QD_VERSION);
    qd_reply_json(&c->reply, 200, o);
    return qd_conn_send(mc, c, &c->reply, 1);
}

static enum MHD_Result readyz_get(struct MHD_Connection *mc, struct conn *c, const char *method)
{
    const char *why;
    cJSON *o = cJSON_CreateObject();
    int ready = ready_now(&why);
    cJSON_AddStringToObject(o, "status", ready ? "ready" : "not_ready");
    if (!ready)
        cJSON_AddStringToObject(o, "reason", why);
    cJSON_AddStringToObject(o, "backend", qd_jobs_backend_name());
    qd_reply_json(&c->reply, ready ? 200 : 503, o);
    return qd_conn_send(mc, c, &c->reply, 1);
}

/* The table (paths also under /v1). Adding a route: its handler above and one row. */
#define ROUTE(p, i, m, a, o, pre, h) .path = p, .id = i, .methods = m, .allow = a, .open = o, .precheck = pre, .answer = h
static const struct qd_http_route routes[] = {
    {ROUTE("/quantize", QD_ROUTE_QUANTIZE, "POST", "POST", 0, precheck_work, start_work), .op = QD_OP_QUANTIZE},
    {ROUTE("/dequantize", QD_ROUTE_DEQUANTIZE, "POST", "POST", 0, precheck_work, start_work), .op = QD_OP_DEQUANTIZE},
    {ROUTE("/jobs", QD_ROUTE_JOBS, "POST", "POST", 0, precheck_work, start_work), .op = QD_OP_QUANTIZE, .async = 1},
    {ROUTE("/convert", QD_ROUTE_CONVERT, "POST", "POST", 0, precheck_convert, start_work), .op = QD_OP_CONVERT,
     .model_body = 1},
    {ROUTE("/formats", QD_ROUTE_FORMATS, "GET HEAD", "GET, HEAD", 0, NULL, formats_get)},
    {ROUTE("/healthz", QD_ROUTE_HEALTHZ, "GET HEAD", "GET, HEAD", 1, NULL, healthz_get)},
    {ROUTE("/readyz", QD_ROUTE_READYZ, "GET HEAD", "GET, HEAD", 1, NULL, readyz_get)},
    {ROUTE("/metrics", QD_ROUTE_METRICS, "GET HEAD", "GET, HEAD", 1, NULL, metrics_get)},
    {ROUTE("/version", QD_ROUTE_VERSION, "GET HEAD", "GET, HEAD", 1, NULL, version_get)},
};
static const struct qd_http_route job_route = {ROUTE("/jobs/{id}", QD_ROUTE_JOBS, "GET HEAD DELETE", "GET, HEAD, DELETE",
                                                     0, NULL, jobs_get)},
                                  result_route = {ROUTE("/jobs/{id}/result", QD_ROUTE_JOBS, "GET HEAD", "GET, HEAD", 0,
                                                        NULL, jobs_get)};

int qd_http_method_in(const char *method, const char *list)
{
    size_t n = strlen(method);
    for (const char *p = list; (p = strstr(p, method)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ' '))
            return 1;
    return 0;
}

/* Finds the route of path (with or without /v1); job paths fill id and *sub (0: /jobs/{id},
 * 1: /jobs/{id}/result). Returns the route or NULL for 404. */
const struct qd_http_route *qd_http_route_find(const char *path, char *id, size_t idlen, int *sub)
{
    if (!strncmp(path, "/v1/", 4))
        path += 3;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(path, routes[i].path))
            return &routes[i];
    if (strncmp(path, "/jobs/", 6))
        return NULL;
    const char *s = path + 6, *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    if (!n || n >= idlen || (slash && strcmp(slash, "/result")))
        return NULL;
    memcpy(id, s, n);
    id[n] = 0;
    *sub = slash != NULL;
    return slash ? &result_route : &job_route;
}

