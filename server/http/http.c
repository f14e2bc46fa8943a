/* HTTP front (see http.h). A request's life: the first callback routes it and checks what the
 * URL and headers alone can decide (auth, method, query, Content-Type, Content-Length), so a
 * bad or oversized request is answered before its body is read; upload callbacks append to one
 * buffer; the last callback either answers at once or hands a job to the queue and suspends the
 * connection, which the worker resumes when the answer is ready. No HTTP thread waits on work.
 *
 * Three answers do not fit that life, and quantd writes them to the socket itself, then the
 * connection closes (reply.h, qd_reply_wire): one decided in the middle of a body (over the
 * limit, no memory, a full disk; libmicrohttpd can only answer before the body or after its
 * end), one to a connection over --max-connections (listener.c), and the 431 for a request
 * line and headers over libmicrohttpd's connection buffer, which it would otherwise answer with
 * its own HTML page (log_mhd). */
#include "http/http.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "queue/backend.h"
#include "http/decode.h"
#include "http/encode.h"
#include "queue/hostmem.h"
#include "queue/jobs.h"
#include "http/convert_job.h"
#include "http/work_job.h"
#include "http/convert_route.h"
#include "http/listener.h"
#include "http/watchdog.h"
#include "common/metrics.h"

#ifndef QD_VERSION /* the Makefile sets it from the VERSION file */
#define QD_VERSION "unknown"
#endif

/* A request body must average at least this once --conn-timeout seconds have passed (a body
 * trickled a byte at a time is never idle long enough for the idle timeout). */
#define QD_MIN_BODY_RATE 8192.0 /* bytes per second */

/* libmicrohttpd's buffer per connection: the request line and headers must fit in it, and a body
 * is received into it, 256 KiB at a time (fewer calls per request than its default 32 KiB). */
#define QD_CONN_BUFFER_BYTES (256 * 1024)

/* Descriptors kept for what is not a connection: spool files, the answer files of /convert, the
 * worker's and libmicrohttpd's own (--max-connections is lowered to leave them). */
#define QD_FD_RESERVE 256

static struct {
    struct MHD_Daemon *daemon;
    const struct qd_serve_config *config;
    struct qd_backend *backend;
    atomic_int ready, draining, inflight;
    atomic_long slow_bodies; /* connections closed for a body slower than QD_MIN_BODY_RATE */
    atomic_ulong inflight_refused; /* bodies refused under --max-inflight-bytes */
    char *formats_json;
    int port;
    int max_connections;     /* --max-connections, or lower to fit the descriptor limit */
} S;

struct conn {
    pthread_mutex_t lock;     /* orders suspend (HTTP thread) before resume (worker) */
    double start_us;
    enum qd_route route;
    char method[8], path[96], job_id[40];
    int job_result;           /* /jobs/{id}/result rather than /jobs/{id} */
    int status;
    size_t bytes_in, bytes_out;
    char *body;
    size_t len, cap;
    size_t reserved;          /* the body's share of --max-inflight-bytes (its capacity) */
    struct qd_req req;
    struct qd_reply reply;    /* an answer decided before or instead of a job */
    struct qd_job *job;       /* the synchronous job this request waits on */
    struct qd_convert_upload *upload; /* POST /convert: the body, spooled to a file */
    const struct qd_format *label_f;  /* the format for metrics and logs when the body names it */
    int suspended, job_done;
};

/* text as the inside of a JSON string: quotes, backslashes and control bytes escaped; cut to fit */
static void json_text(char *out, size_t cap, const char *text)
{
    size_t k = 0;
    for (const char *p = text; *p && k + 7 < cap; p++)
        k += (unsigned char)*p < 0x20 || *p == '"' || *p == '\\'
             ? (size_t)snprintf(out + k, cap - k, "\\u%04x", (unsigned char)*p)
             : (out[k] = *p, 1);
    out[k] = 0;
}

/* ---- answers ----------------------------------------------------------------------------- */

/* The pieces of an answer sent from where they are (struct qd_reply's parts). */
struct sent_parts {
    int n;
    void *p[QD_REPLY_MAX_PARTS];
};

static void sent_parts_free(void *cls)
{
    struct sent_parts *h = cls;
    for (int i = 0; i < h->n; i++)
        qd_hostmem_put(h->p[i]);
    free(h);
}

/* An answer whose parts libmicrohttpd sends one after the other (sendmsg over the list), then
 * gives back; on success the reply no longer owns them. */
static struct MHD_Response *parts_response(struct qd_reply *r)
{
    struct sent_parts *h = malloc(sizeof *h);
    struct MHD_IoVec iov[QD_REPLY_MAX_PARTS];
    if (!h)
        return NULL;
    h->n = r->nparts;
    for (int i = 0; i < r->nparts; i++) {
        iov[i] = (struct MHD_IoVec){r->part[i], r->part_len[i]};
        h->p[i] = r->part[i];
    }
    struct MHD_Response *resp = MHD_create_response_from_iovec(iov, (unsigned)r->nparts, sent_parts_free, h);
    if (!resp)
        free(h);
    else
        r->nparts = 0;
    return resp;
}

/* A copy of the answer (a stored job's result, which may be read again). */
static struct MHD_Response *copied_response(const struct qd_reply *r)
{
    char *copy = qd_reply_joined(r);
    struct MHD_Response *resp = copy ? MHD_create_response_from_buffer_with_free_callback(r->len, copy, qd_hostmem_put)
                                     : NULL;
    if (!resp)
        qd_hostmem_put(copy);
    return resp;
}

static enum MHD_Result send_reply(struct MHD_Connection *mc, struct conn *c, struct qd_reply *r,
                                  int take)
{
    /* a taken body may be a pooled (pinned) buffer: libmicrohttpd gives it back through the pool;
     * a file answer (a converted model) is sent from its descriptor, never read into memory */
    struct MHD_Response *resp = r->has_file ? MHD_create_response_from_fd64(r->file_len, r->file_fd)
                                : !take     ? copied_response(r)
                                : r->nparts ? parts_response(r)
                                            : MHD_create_response_from_buffer_with_free_callback(r->len, r->body, qd_hostmem_put);
    if (!resp)
        return MHD_NO;
    if (r->has_file)
        r->has_file = 0; /* libmicrohttpd closes it */
    else if (take)
        r->body = NULL; /* libmicrohttpd frees it (or its parts) */
    if (r->summary_header)
        MHD_add_response_header(resp, "X-Quantd-Summary", r->summary_header);
    if (r->config_header)
        MHD_add_response_header(resp, "X-Quantd-Quantization-Config", r->config_header);
    if (r->content_type)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    if (r->location[0])
        MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, r->location);
    if (r->retry_after_s) {
        char s[16];
        snprintf(s, sizeof s, "%d", r->retry_after_s);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, s);
    }
    if (r->allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (r->status == 401) /* the one challenge: the token (RFC 6750) */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (r->shape_header[0])
        MHD_add_response_header(resp, "X-Quantd-Shape", r->shape_header);
    if (r->dtype_header[0])
        MHD_add_response_header(resp, "X-Quantd-Dtype", r->dtype_header);
    if (atomic_load(&S.draining))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    c->status = r->status;
    c->bytes_out = r->len ? r->len : (size_t)r->file_len;
    enum MHD_Result ok = MHD_queue_response(mc, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static void busy_reply(struct qd_reply *r, const char *what)
{
    qd_reply_error(r, 503, "queue_full", "%s; retry later", what);
    r->retry_after_s = 1;
}

/* Reserves n more bytes of --max-inflight-bytes for c's body: 0, or -1 with the answer set (413
 * for a body that could never fit, else 503 + Retry-After). */
static int body_reserve(struct conn *c, size_t n)
{
    if (!qd_hostmem_reserve(n)) {
        c->reserved += n;
        return 0;
    }
    struct qd_hostmem_inflight s;
    qd_hostmem_inflight(&s);
    atomic_fetch_add(&S.inflight_refused, 1);
    if (c->reserved + n > s.limit)
        qd_reply_error(&c->reply, 413, "body_too_large", "a body of %zu bytes is over --max-inflight-bytes (%zu), the "
                       "most the service holds at once", c->reserved + n, s.limit);
    else {
        qd_reply_error(&c->reply, 503, "inflight_limit", "the request bodies held now (%zu bytes) leave no room "
                       "for %zu more under --max-inflight-bytes (%zu); retry later", s.bytes, n, s.limit);
        c->reply.retry_after_s = 1;
    }
    return -1;
}

/* Gives c's body back, with its reservation. */
static void body_drop(struct conn *c)
{
    qd_hostmem_put(c->body);
    c->body = NULL;
    qd_hostmem_release(c->reserved);
    c->reserved = 0;
}

/* ---- routing ----------------------------------------------------------------------------- */

struct route {
    const char *path;
    enum qd_route id;
    const char *methods; /* space-separated, for matching and Allow */
    int open;            /* served without the bearer token (probes, scrapes) */
};

static const struct route routes[] = {
    {"/quantize", QD_ROUTE_QUANTIZE, "POST", 0},
    {"/dequantize", QD_ROUTE_DEQUANTIZE, "POST", 0},
    {"/jobs", QD_ROUTE_JOBS, "POST", 0},
    {"/convert", QD_ROUTE_CONVERT, "POST", 0},
    {"/formats", QD_ROUTE_FORMATS, "GET HEAD", 0},
    {"/healthz", QD_ROUTE_HEALTHZ, "GET HEAD", 1},
    {"/readyz", QD_ROUTE_READYZ, "GET HEAD", 1},
    {"/metrics", QD_ROUTE_METRICS, "GET HEAD", 1},
    {"/version", QD_ROUTE_VERSION, "GET HEAD", 1},
};

static int method_in(const char *method, const char *list)
{
    size_t n = strlen(method);
    for (const char *p = list; (p = strstr(p, method)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ' '))
            return 1;
    return 0;
}

/* Finds the route of path (with or without /v1); job paths fill id and *sub (0: /jobs/{id},
 * 1: /jobs/{id}/result). Returns the route or NULL for 404. */
static const struct route *route_find(const char *path, char *id, size_t idlen, int *sub)
{
    static const struct route job_route = {"/jobs/{id}", QD_ROUTE_JOBS, "GET HEAD DELETE", 0},
                              result_route = {"/jobs/{id}/result", QD_ROUTE_JOBS, "GET HEAD", 0};
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

static int token_ok(struct MHD_Connection *mc)
{
    const char *want = S.config->token;
    if (!*want)
        return 1;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    /* the scheme's name is case-insensitive (RFC 9110, 11.1), one or more spaces after it */
    if (!h || strncasecmp(h, "Bearer", 6) || (h[6] != ' ' && h[6] != '\t'))
        return 0;
    for (h += 6; *h == ' ' || *h == '\t'; h++)
        ;
    size_t n = strlen(want), m = strlen(h);
    unsigned diff = n != m;
    for (size_t i = 0; i < n; i++) /* the same time whatever the first wrong byte */
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < m ? h[i] : 0);
    return diff == 0;
}

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

/* ---- the first callback: what the URL and headers decide -------------------------------- */

static void precheck_post(struct MHD_Connection *mc, struct conn *c)
{
    struct query q = {.n = 0};
    MHD_get_connection_values(mc, MHD_GET_ARGUMENT_KIND, collect_arg, &q);
    if (q.overflow) {
        qd_reply_error(&c->reply, 400, "bad_request", "more than 64 query arguments");
        return;
    }
    if (c->route == QD_ROUTE_CONVERT) { /* a model file: checked now, spooled as it comes */
        const char *ct = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        c->req.op = QD_OP_CONVERT;
        c->upload = qd_convert_upload_begin(q.kv, q.n, ct, cl ? strtoll(cl, NULL, 10) : -1,
                                            qd_convert_spool_dir(S.config->data_dir),
                                            S.config->max_convert_bytes, &c->reply);
        c->req.f = c->upload ? qd_convert_upload_format(c->upload) : NULL;
        return;
    }
    c->req.op = c->route == QD_ROUTE_DEQUANTIZE ? QD_OP_DEQUANTIZE : QD_OP_QUANTIZE;
    c->req.json_limit = S.config->max_json_bytes;
    if (qd_req_from_query(&c->req, q.kv, q.n, c->route == QD_ROUTE_JOBS, &c->reply))
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
        busy_reply(&c->reply, "the job queue is full");
    if (length > 0 && !c->reply.status)
        body_reserve(c, (size_t)length);
    if (length > 0 && !c->reply.status && !(c->body = qd_hostmem_get((size_t)length)))
        qd_reply_error(&c->reply, 503, "out_of_memory", "no memory for a %lld-byte body", length);
    else if (length > 0)
        c->cap = (size_t)length;
}

/* --http-threads, 0 = one per core and at least 4: receiving large bodies is CPU work
 * (docs/BENCHMARKS.md: 16 threads on a 16-core GPU node carry 30 % more than 4). */
static unsigned http_threads(const struct qd_serve_config *cfg)
{
    if (cfg->http_threads > 0)
        return (unsigned)cfg->http_threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 4 ? (unsigned)n : 4u;
}

static enum MHD_Result add_header_bytes(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4; /* ": " and CRLF */
    return MHD_YES;
}

/* The largest body a request may send: a model to /convert, a tensor or a job elsewhere. */
static unsigned long long body_limit(const struct conn *c)
{
    return (unsigned long long)(c->route == QD_ROUTE_CONVERT ? S.config->max_convert_bytes : S.config->max_body_bytes);
}

static void first_call(struct MHD_Connection *mc, struct conn *c, const char *url, const char *method)
{
    size_t header_bytes = strlen(url) + strlen(method) + 12;
    MHD_get_connection_values(mc, MHD_HEADER_KIND, add_header_bytes, &header_bytes);
    if (header_bytes > (size_t)S.config->max_header_bytes) { /* before routing: any path */
        c->route = QD_ROUTE_OTHER;
        qd_reply_error(&c->reply, 431, "headers_too_large", "the request line and headers take %zu bytes, over the "
                       "limit of %d (--max-header-bytes)", header_bytes, S.config->max_header_bytes);
        return;
    }
    int sub = 0;
    const struct route *r = route_find(url, c->job_id, sizeof c->job_id, &sub);
    c->job_result = sub;
    c->route = r ? r->id : QD_ROUTE_OTHER;
    if (!r) {
        qd_reply_error(&c->reply, 404, "not_found", "no such path: %.64s", url);
        return;
    }
    if (!method_in(method, r->methods)) {
        qd_reply_error(&c->reply, 405, "method_not_allowed", "%s is not allowed on %s (allowed: %s)",
                       method, r->path, r->methods);
        c->reply.allow = !strcmp(r->methods, "GET HEAD") ? "GET, HEAD"
                       : !strcmp(r->methods, "POST") ? "POST" : "GET, HEAD, DELETE";
        return;
    }
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long length = cl ? strtoull(cl, NULL, 10) : 0; /* (libmicrohttpd refused a malformed one) */
    if (length > body_limit(c)) {
        qd_reply_error(&c->reply, 413, "body_too_large", "the body (%llu bytes) is over the limit of %llu bytes (%s)",
                       length, body_limit(c), c->route == QD_ROUTE_CONVERT ? "--max-convert-bytes" : "--max-body-bytes");
        return;
    }
    if (!r->open && !token_ok(mc)) {
        qd_reply_error(&c->reply, 401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required");
        return;
    }
    if (atomic_load(&S.draining) && !r->open) {
        busy_reply(&c->reply, "the service is shutting down");
        return;
    }
    if (!strcmp(method, "POST"))
        precheck_post(mc, c);
}

/* ---- the last callback: answer now or queue ---------------------------------------------- */

static void job_json_reply(struct qd_reply *r, int status, struct qd_job *j)
{
    static const char *const states[] = {"queued", "running", "done", "cancelled"};
    static const char *const ops[] = {"quantize", "dequantize", "convert"};
    int st = atomic_load(&j->state);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "op", ops[j->req.op]);
    const struct qd_convert_request *conv = qd_convert_job_request(j);
    if (j->req.f || conv)
        cJSON_AddStringToObject(o, "fmt", conv ? conv->f->name : j->req.f->name);
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
    cJSON_AddStringToObject(o, "status", states[st]);
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
    return send_reply(mc, c, &c->job->reply, 1);
}

static enum MHD_Result start_work(struct MHD_Connection *mc, struct conn *c)
{
    const char *ct = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    int kind = qd_body_kind(&c->req, ct, c->body, c->len);
    struct qd_convert_request *conv = NULL;
    if (c->route == QD_ROUTE_CONVERT) { /* the spooled model; the answer is the converted file */
        conv = qd_convert_upload_finish(c->upload, &c->reply);
        c->upload = NULL;
        if (!conv)
            return send_reply(mc, c, &c->reply, 1);
    } else if (c->req.op == QD_OP_CONVERT && c->len > (size_t)S.config->max_json_bytes) {
        qd_reply_error(&c->reply, 413, "json_too_large", "the convert request takes %zu bytes of JSON, over "
                       "--max-json-bytes (%lld)", c->len, S.config->max_json_bytes);
        return send_reply(mc, c, &c->reply, 1);
    } else if (c->req.op == QD_OP_CONVERT && /* checked whole before it is accepted */
               !(conv = qd_convert_request_parse(S.config->data_dir, &c->req, c->body, c->len, &c->reply)))
        return send_reply(mc, c, &c->reply, 1);
    if (conv)
        conv->max_header_bytes = (uint64_t)S.config->max_safetensors_header_bytes;
    if (c->route == QD_ROUTE_JOBS && !conv && /* checked before it is accepted, as sync calls are */
        qd_work_precheck(&c->req, (enum qd_body_kind)kind, c->body, c->len, &c->label_f, &c->reply))
        return send_reply(mc, c, &c->reply, 1);
    struct qd_job *j = qd_job_new();
    if (!j) {
        qd_convert_request_free(conv);
        qd_reply_error(&c->reply, 503, "out_of_memory", "no memory for a job");
        return send_reply(mc, c, &c->reply, 1);
    }
    j->type = conv ? &qd_convert_job_type : &qd_work_job_type;
    j->payload = conv;
    j->req = c->req;
    j->kind = (enum qd_body_kind)kind;
    if (!conv) { /* (a conversion's JSON is read: it stays with the connection) */
        j->body = c->body;
        j->body_len = c->len;
        j->body_reserved = c->reserved;
        c->body = NULL;
        c->reserved = 0;
    }
    j->received_us = qd_now_us();
    if (c->route == QD_ROUTE_JOBS) {
        enum qd_status s = qd_jobs_store(j);
        if (s == QD_OK && (s = qd_jobs_submit(j)) != QD_OK)
            qd_jobs_remove(j->id);
        if (s == QD_OK) {
            job_json_reply(&c->reply, 202, j);
            snprintf(c->reply.location, sizeof c->reply.location, "/jobs/%s", j->id);
        } else
            busy_reply(&c->reply, "the job queue or store is full");
        qd_job_unref(j);
        return send_reply(mc, c, &c->reply, 1);
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
        busy_reply(&c->reply, "the job queue is full");
        return send_reply(mc, c, &c->reply, 1);
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

static enum MHD_Result jobs_get(struct MHD_Connection *mc, struct conn *c, const char *method, int sub)
{
    struct qd_job *j = qd_jobs_find(c->job_id);
    if (!j) {
        qd_reply_error(&c->reply, 404, "not_found", "no job %s (finished results expire)", c->job_id);
        return send_reply(mc, c, &c->reply, 1);
    }
    enum MHD_Result rc;
    if (!strcmp(method, "DELETE")) {
        qd_jobs_remove(c->job_id);
        qd_reply_take(&c->reply, 204, NULL, NULL, 0);
        rc = send_reply(mc, c, &c->reply, 1);
    } else if (!sub)
        job_json_reply(&c->reply, 200, j), rc = send_reply(mc, c, &c->reply, 1);
    else if (atomic_load(&j->state) != QD_JOB_DONE) {
        qd_reply_error(&c->reply, 409, "not_ready", "job %s has not finished; poll GET /jobs/%s", j->id, j->id);
        rc = send_reply(mc, c, &c->reply, 1);
    } else
        rc = send_reply(mc, c, &j->reply, 0); /* the stored answer, copied: it may be read again */
    qd_job_unref(j);
    return rc;
}

static int ready_now(const char **why)
{
    struct qd_jobs_stats js;
    struct qd_backend_stats bs = {0};
    qd_jobs_stats(&js);
    S.backend->stats(S.backend, &bs);
    *why = !atomic_load(&S.ready) ? "starting" : atomic_load(&S.draining) ? "draining"
         : !bs.healthy ? "device_unhealthy" : js.depth >= js.capacity ? "queue_full" : NULL;
    return *why == NULL;
}

static enum MHD_Result metrics_get(struct MHD_Connection *mc, struct conn *c)
{
    struct qd_jobs_stats js;
    struct qd_backend_stats bs = {0};
    const char *why;
    qd_jobs_stats(&js);
    S.backend->stats(S.backend, &bs);
    struct qd_hostmem_inflight in;
    qd_hostmem_inflight(&in);
    struct qd_metrics_gauges g = {
        .inflight_body_bytes = (double)in.bytes, .inflight_body_limit_bytes = (double)in.limit,
        .inflight_body_refused = atomic_load(&S.inflight_refused), .convert_queue_depth = js.convert_depth,
        .convert_jobs_running = js.convert_running, .convert_workers = js.convert_workers,
        .queue_depth = js.depth, .queue_capacity = js.capacity, .jobs_running = js.running,
        .workers = js.workers, .jobs_stored = js.stored, .jobs_stored_bytes = (double)js.stored_bytes,
        .inflight_requests = atomic_load(&S.inflight), .slow_clients_cut = qd_watch_cut_total() + atomic_load(&S.slow_bodies),
        .backend = qd_jobs_backend_name(),
        .backend_info = S.backend->info, .version = QD_VERSION, .devices = bs.devices,
        .healthy = bs.healthy, .ready = ready_now(&why), .draining = atomic_load(&S.draining),
        .device_healthy = bs.device_healthy, .device_name = bs.device_name,
        .device_memory_used_bytes = bs.memory_used_bytes};
    size_t len;
    char *text = qd_metrics_render(&g, &len);
    if (!text)
        qd_reply_error(&c->reply, 503, "out_of_memory", "out of memory");
    else
        qd_reply_take(&c->reply, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    return send_reply(mc, c, &c->reply, 1);
}

static enum MHD_Result last_call(struct MHD_Connection *mc, struct conn *c, const char *method)
{
    if (c->reply.status)
        return send_reply(mc, c, &c->reply, 1);
    cJSON *o;
    const char *why;
    switch (c->route) {
    case QD_ROUTE_QUANTIZE:
    case QD_ROUTE_DEQUANTIZE:
    case QD_ROUTE_CONVERT:
        return start_work(mc, c);
    case QD_ROUTE_JOBS:
        if (c->job_id[0])
            return jobs_get(mc, c, method, c->job_result);
        return start_work(mc, c);
    case QD_ROUTE_FORMATS:
        qd_reply_take(&c->reply, 200, "application/json", strdup(S.formats_json), strlen(S.formats_json));
        break;
    case QD_ROUTE_HEALTHZ:
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        cJSON_AddStringToObject(o, "version", QD_VERSION);
        qd_reply_json(&c->reply, 200, o);
        break;
    case QD_ROUTE_VERSION:
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "version", QD_VERSION);
        qd_reply_json(&c->reply, 200, o);
        break;
    case QD_ROUTE_READYZ:
        o = cJSON_CreateObject();
        int ready = ready_now(&why);
        cJSON_AddStringToObject(o, "status", ready ? "ready" : "not_ready");
        if (!ready)
            cJSON_AddStringToObject(o, "reason", why);
        cJSON_AddStringToObject(o, "backend", qd_jobs_backend_name());
        qd_reply_json(&c->reply, ready ? 200 : 503, o);
        break;
    case QD_ROUTE_METRICS:
        return metrics_get(mc, c);
    default:
        qd_reply_error(&c->reply, 404, "not_found", "no such path");
    }
    return send_reply(mc, c, &c->reply, 1);
}

/* An answer decided in the middle of a body, which libmicrohttpd can only send after the body's
 * end (that may never come): quantd writes it to the socket, and returning MHD_NO makes
 * libmicrohttpd close the connection without reading the rest. */
static enum MHD_Result cut_with_reply(struct MHD_Connection *mc, struct conn *c)
{
    char wire[2048];
    size_t n = qd_reply_wire(&c->reply, wire, sizeof wire);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci && n)
        qd_reply_send_now(ci->connect_fd, wire, n);
    c->status = c->reply.status;
    c->bytes_out = c->reply.len;
    return MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    struct conn *c = *con_cls;
    if (!c) {
        if (!(c = calloc(1, sizeof *c)))
            return MHD_NO;
        pthread_mutex_init(&c->lock, NULL);
        c->start_us = qd_now_us();
        snprintf(c->method, sizeof c->method, "%s", method);
        snprintf(c->path, sizeof c->path, "%s", url);
        *con_cls = c;
        atomic_fetch_add(&S.inflight, 1);
        qd_watch_request(mc, 1);
        first_call(mc, c, url, method);
        /* a body over the limit by its Content-Length is refused before it, at once: the client
         * may be about to send 10^14 bytes, or waiting on a 100 Continue it must not get.
         * libmicrohttpd then reads none of it and closes the connection after the answer. Other
         * errors wait for the end of the body (read and dropped, the connection kept): a client
         * that writes its whole body before it reads would meet a reset instead of the answer */
        if (c->reply.status == 413)
            return send_reply(mc, c, &c->reply, 1);
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        c->bytes_in += n;
        /* a body trickled in (a stalled one meets the idle timeout instead) */
        double elapsed = (qd_now_us() - c->start_us) / 1e6;
        if (elapsed > S.config->conn_timeout_s && (double)c->bytes_in < QD_MIN_BODY_RATE * elapsed) {
            atomic_fetch_add(&S.slow_bodies, 1);
            fprintf(stderr, "{\"msg\":\"a connection trickling its body was cut\",\"bytes\":%zu,\"after_s\":%.1f}\n",
                    c->bytes_in, elapsed);
            return MHD_NO;
        }
        *upload_size = 0;
        if (c->reply.status) /* answered after the body, which is dropped up to the limit */
            return c->bytes_in > body_limit(c) ? cut_with_reply(mc, c) : MHD_YES;
        if (c->upload) { /* POST /convert: to the spool file, not memory */
            if (qd_convert_upload_write(c->upload, upload, n, &c->reply)) {
                qd_convert_upload_abort(c->upload);
                c->upload = NULL;
                return cut_with_reply(mc, c);
            }
            return MHD_YES;
        }
        if (c->len + n > (size_t)S.config->max_body_bytes) { /* a chunked body (a declared one is checked first) */
            body_drop(c);
            qd_reply_error(&c->reply, 413, "body_too_large", "the body is over the limit of %lld bytes "
                           "(--max-body-bytes)", S.config->max_body_bytes);
            return cut_with_reply(mc, c);
        }
        if (c->len + n > c->cap) { /* no or a short Content-Length: grow */
            size_t cap = c->cap ? c->cap : 65536;
            while (cap < c->len + n)
                cap *= 2;
            if (cap > (size_t)S.config->max_body_bytes)
                cap = (size_t)S.config->max_body_bytes;
            if (!qd_hostmem_reserve(cap - c->reserved))
                c->reserved = cap;
            else { /* doubled, it would pass --max-inflight-bytes: what is left, if the body fits */
                struct qd_hostmem_inflight held;
                qd_hostmem_inflight(&held);
                size_t left = held.limit > held.bytes ? held.limit - held.bytes : 0;
                cap = c->reserved + left < cap ? c->reserved + left : cap;
                cap = cap < c->len + n ? c->len + n : cap;
                if (body_reserve(c, cap - c->reserved)) { /* grown past what may be held */
                    body_drop(c); /* answered (503) after the body, dropped up to the limit */
                    return MHD_YES;
                }
            }
            char *b = qd_hostmem_grow(c->body, c->len, cap);
            if (!b) {
                qd_reply_error(&c->reply, 503, "out_of_memory", "no memory for the body");
                return cut_with_reply(mc, c);
            }
            c->body = b;
            c->cap = cap;
        }
        qd_hostmem_append(c->body + c->len, upload, n);
        c->len += n;
        return MHD_YES;
    }
    if (c->job)
        return answer_job(mc, c); /* resumed: the worker left the answer */
    return last_call(mc, c, method);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    struct conn *c = *con_cls;
    qd_watch_request(mc, 0);
    /* cut for its timeout (an answer nobody reads, a stalled body): close with a reset, so that
     * the kernel drops an unsent answer now rather than probing a zero window for minutes */
    if (why == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct linger now = {.l_onoff = 1, .l_linger = 0};
        if (ci)
            setsockopt(ci->connect_fd, SOL_SOCKET, SO_LINGER, &now, sizeof now);
    }
    if (!c)
        return;
    double seconds = (qd_now_us() - c->start_us) / 1e6;
    const struct qd_format *f = c->req.f ? c->req.f : c->label_f ? c->label_f : c->job ? c->job->fmt : NULL;
    int status = c->status ? c->status : 499; /* 499: client went away before an answer */
    if (c->route != QD_ROUTE_OTHER || c->status)
        qd_metrics_request(c->route, f, status, seconds, c->bytes_in, c->bytes_out);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    /* one JSON line per request; the path is quantd's own route table or a 404 (escaped) */
    char path[200];
    json_text(path, sizeof path, c->path);
    /* a synchronous job's phases: receiving the body, waiting in the queue, running (decode,
     * kernel, encode), and sending the answer (resuming the connection included) */
    char phases[300] = "";
    const struct qd_job *j = c->job;
    if (j && j->done_us > 0) /* (and of running, the device's copies and kernel where it has them) */
        snprintf(phases, sizeof phases,
                 ",\"backend\":\"%s\",\"phases_ms\":{\"recv\":%.3f,\"queue\":%.3f,\"run\":%.3f,\"send\":%.3f,"
                 "\"h2d\":%.3f,\"kernel\":%.3f,\"d2h\":%.3f}",
                 j->backend, (j->received_us - c->start_us) / 1e3, j->timing.queue_us / 1e3,
                 (j->done_us - j->received_us - j->timing.queue_us) / 1e3, (qd_now_us() - j->done_us) / 1e3,
                 j->timing.h2d_us / 1e3, j->timing.kernel_us / 1e3, j->timing.d2h_us / 1e3);
    else if (j)
        snprintf(phases, sizeof phases, ",\"backend\":\"%s\"", j->backend);
    fprintf(stderr,
            "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"method\":\"%s\",\"path\":\"%s\","
            "\"status\":%d,\"fmt\":\"%s\",\"bytes_in\":%zu,\"bytes_out\":%zu,\"ms\":%.3f%s}\n",
            tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, c->method, path, status, f ? f->name : "", c->bytes_in,
            c->bytes_out, seconds * 1e3, phases);
    body_drop(c);
    qd_reply_free(&c->reply);
    qd_convert_upload_abort(c->upload); /* a /convert that ended before its job */
    if (c->job)
        qd_job_unref(c->job);
    pthread_mutex_destroy(&c->lock);
    free(c);
    *con_cls = NULL;
    atomic_fetch_sub(&S.inflight, 1);
}

/* ---- libmicrohttpd's side ---------------------------------------------------------------- */

/* The connection whose request line and headers filled libmicrohttpd's buffer gets quantd's JSON
 * 431 first, and the end of its sending side: libmicrohttpd's own page then finds the connection
 * closed for sending and is never seen. */
static int answer_oversized_head(void)
{
    int fd = qd_watch_oversized_head((unsigned long long)S.config->max_header_bytes);
    if (fd < 0)
        return 0; /* (not found: libmicrohttpd's page goes out) */
    struct qd_reply r = {0};
    qd_reply_error(&r, 431, "headers_too_large", "the request line and headers are over the limit of %d bytes "
                   "(--max-header-bytes)", S.config->max_header_bytes);
    char wire[1024];
    size_t n = qd_reply_wire(&r, wire, sizeof wire);
    qd_reply_free(&r);
    if (n)
        qd_reply_send_now(fd, wire, n);
    return n != 0;
}

/* MHD_OPTION_EXTERNAL_LOGGER: libmicrohttpd's messages as JSON lines, like quantd's own. One of
 * them comes on the thread serving the connection just before libmicrohttpd answers a request
 * line and headers too large for its buffer (431; 414 for the line alone) with its HTML page:
 * the moment to answer with quantd's JSON instead (answer_oversized_head). */
static void log_mhd(void *cls, const char *fmt, va_list ap)
{
    static const char refusing[] = "Error processing request (HTTP response code is %u";
    char text[512], escaped[1024];
    va_list copy;
    va_copy(copy, ap);
    vsnprintf(text, sizeof text, fmt, copy);
    va_end(copy);
    if (!strncmp(fmt, refusing, sizeof refusing - 1)) {
        unsigned status = va_arg(ap, unsigned);
        if ((status == MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE || status == MHD_HTTP_URI_TOO_LONG) &&
            answer_oversized_head())
            snprintf(text, sizeof text, "the request line and headers of a request filled the connection's "
                     "buffer (%d bytes): answered 431 and closed", QD_CONN_BUFFER_BYTES);
    }
    size_t n = strlen(text);
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' '))
        text[--n] = 0;
    json_text(escaped, sizeof escaped, text);
    fprintf(stderr, "{\"msg\":\"%s\",\"from\":\"libmicrohttpd\"}\n", escaped);
}

/* MHD_OPTION_NOTIFY_CONNECTION: the watchdog follows each connection; the acceptor counts them. */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    qd_watch_notify(cls, mc, socket_context, code);
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci)
            qd_listener_closed(ci->connect_fd);
    }
}

/* --max-connections, lowered where the descriptor limit would not leave QD_FD_RESERVE beside. */
static int max_connections(const struct qd_serve_config *cfg)
{
    struct rlimit nofile;
    long long fds = getrlimit(RLIMIT_NOFILE, &nofile) || nofile.rlim_cur == RLIM_INFINITY ? 1 << 20
                    : (long long)nofile.rlim_cur;
    long long room = fds > 2 * QD_FD_RESERVE ? fds - QD_FD_RESERVE : fds / 2;
    if (room >= cfg->max_connections)
        return cfg->max_connections;
    fprintf(stderr, "{\"msg\":\"--max-connections lowered to fit the descriptor limit (ulimit -n)\","
            "\"max_connections\":%lld,\"nofile\":%lld}\n", room > 0 ? room : 1, fds);
    return room > 0 ? (int)room : 1;
}

/* ---- life cycle -------------------------------------------------------------------------- */

int qd_http_start(const struct qd_serve_config *cfg, struct qd_backend *b, char *err, size_t errlen)
{
    S.config = cfg;
    S.backend = b;
    S.formats_json = qd_registry_json();
    char host[128];
    snprintf(host, sizeof host, "%s", cfg->listen);
    char *colon = strrchr(host, ':');
    if (!colon) {
        snprintf(err, errlen, "--listen must be ADDR:PORT (got '%s')", cfg->listen);
        return -1;
    }
    *colon = 0;
    const char *port = colon + 1, *node = host;
    if (host[0] == '[') { /* [::1]:8080 */
        node = host + 1;
        char *close = strchr(host, ']');
        if (close)
            *close = 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    int gai = getaddrinfo(*node ? node : NULL, port, &hints, &ai);
    if (gai) {
        snprintf(err, errlen, "--listen %s: %s", cfg->listen, gai_strerror(gai));
        return -1;
    }
    /* the listening socket is quantd's own (listener.h: an even spread of connections over the
     * pool, and the connection limit); poll(), not epoll, in the pool: at most 4096 connections
     * by default, poll() costs nothing measurable */
    int bad = qd_listener_open(ai, cfg->listen, &S.port, err, errlen);
    freeaddrinfo(ai);
    if (bad)
        return -1;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET;
    unsigned threads = http_threads(cfg);
    S.max_connections = max_connections(cfg);
    S.daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL,
                                MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
                                MHD_OPTION_THREAD_POOL_SIZE, threads,
                                MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                                MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->conn_timeout_s,
                                /* each thread's share of this limit is above every connection
                                 * the acceptor lets in (all of them could land on one thread),
                                 * with room for the one a thread counts until its cleanup:
                                 * libmicrohttpd's own limit branch is never taken (listener.h) */
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)(S.max_connections + 16) * threads,
                                MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)QD_CONN_BUFFER_BYTES,
                                MHD_OPTION_END);
    if (!S.daemon || qd_listener_start(S.daemon, S.max_connections)) {
        snprintf(err, errlen, "cannot start the HTTP threads on %s", cfg->listen);
        if (S.daemon)
            MHD_stop_daemon(S.daemon);
        S.daemon = NULL;
        qd_listener_close();
        return -1;
    }
    if (qd_watch_start(cfg->conn_timeout_s)) {
        snprintf(err, errlen, "cannot start the slow-client watchdog");
        qd_listener_stop();
        MHD_stop_daemon(S.daemon);
        S.daemon = NULL;
        qd_listener_close();
        return -1;
    }
    return 0;
}

int qd_http_port(void) { return S.port; }

int qd_http_max_connections(void) { return S.max_connections; }

void qd_http_set_ready(int ready) { atomic_store(&S.ready, ready); }

int qd_http_drain(int timeout_s)
{
    atomic_store(&S.draining, 1);
    qd_listener_stop(); /* no new connections; the socket closes in qd_http_stop */
    double deadline = qd_now_us() + timeout_s * 1e6;
    struct qd_jobs_stats js;
    for (;;) {
        qd_jobs_stats(&js);
        if (!atomic_load(&S.inflight) && !js.depth && !js.running && !js.convert_depth && !js.convert_running)
            return 0;
        if (qd_now_us() > deadline)
            return -1;
        usleep(10000);
    }
}

void qd_http_stop(void)
{
    qd_listener_stop();
    /* the connections end before libmicrohttpd stops: 0.9.75 crashes when its stop overtakes a
     * thread that is answering an error of its own (its queueing of the answer refuses once
     * stopping, and the thread then builds the headers of no answer) */
    qd_watch_close_all();
    for (int i = 0; i < 200 && qd_listener_connections() > 0; i++)
        usleep(10000);
    if (S.daemon)
        MHD_stop_daemon(S.daemon);
    S.daemon = NULL;
    qd_watch_stop();
    qd_listener_close();
    free(S.formats_json);
    S.formats_json = NULL;
}
