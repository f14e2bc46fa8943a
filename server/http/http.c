/* HTTP front (see http.h): the daemon's life cycle and a request's. The first callback routes it
 * (routes.c) and checks what the URL and headers alone can decide (auth, method, the route's
 * precheck of query, Content-Type, Content-Length), so a bad or oversized request is answered
 * before its body is read; upload callbacks append to one buffer; the last callback hands the
 * request to its route's handler, which answers at once or hands a job to the queue and
 * suspends the connection, which the worker resumes when the answer is ready. No HTTP thread
 * waits on work.
 *
 * Some answers do not fit that life, and quantd writes them to the socket itself, then the
 * connection closes (reply.h, qd_reply_wire): a refusal decided from the headers of a request
 * with a body (413 by its Content-Length, 401, 431), which must go out before the body and
 * without a 100 Continue; one decided in the middle of a body (over the limit, no memory, a full
 * disk; libmicrohttpd can only answer before the body or after its end); one to a connection
 * over --max-connections (listener.c); and the 431 for a request line and headers over
 * libmicrohttpd's connection buffer, which it would otherwise answer with its own HTML page
 * (log_mhd). Where the client may still be sending, the close lingers (linger.h): the rest of
 * the body is read and dropped for a bounded time and size, so that a client that writes its
 * whole body before it reads gets the answer rather than a reset. */
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

#include "common/metrics.h"
#include "http/conn.h"
#include "http/convert_route.h"
#include "http/decode.h"
#include "http/linger.h"
#include "http/listener.h"
#include "http/reply.h"
#include "http/routes.h"
#include "http/watchdog.h"
#include "queue/hostmem.h"

/* A request body must average at least this once --conn-timeout seconds have passed (a body
 * trickled a byte at a time is never idle long enough for the idle timeout). */
#define QD_MIN_BODY_RATE 8192.0 /* bytes per second */

/* libmicrohttpd's buffer per connection: the request line and headers must fit in it, and a body
 * is received into it, 256 KiB at a time (fewer calls per request than its default 32 KiB). */
#define QD_CONN_BUFFER_BYTES (256 * 1024)

/* Descriptors kept for what is not a connection: spool files, the answer files of /convert, the
 * worker's and libmicrohttpd's own (--max-connections is lowered to leave them). */
#define QD_FD_RESERVE 256

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

static int token_ok(struct MHD_Connection *mc)
{
    const char *want = qd_srv.config->token;
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

/* ---- the first callback: what the URL and headers decide -------------------------------- */

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
    const long long limit = c->r && c->r->model_body ? qd_srv.config->max_convert_bytes : qd_srv.config->max_body_bytes;
    return (unsigned long long)limit;
}

static void first_call(struct MHD_Connection *mc, struct conn *c, const char *url, const char *method)
{
    size_t header_bytes = strlen(url) + strlen(method) + 12;
    MHD_get_connection_values(mc, MHD_HEADER_KIND, add_header_bytes, &header_bytes);
    if (header_bytes > (size_t)qd_srv.config->max_header_bytes) { /* before routing: any path */
        c->route = QD_ROUTE_OTHER;
        qd_reply_error(&c->reply, 431, "headers_too_large", "the request line and headers take %zu bytes, over the "
                       "limit of %d (--max-header-bytes)", header_bytes, qd_srv.config->max_header_bytes);
        return;
    }
    int sub = 0;
    const struct qd_http_route *r = qd_http_route_find(url, c->job_id, sizeof c->job_id, &sub);
    c->job_result = sub;
    c->r = r;
    c->route = r ? r->id : QD_ROUTE_OTHER;
    if (!r) {
        qd_reply_error(&c->reply, 404, "not_found", "no such path: %.64s", url);
        return;
    }
    if (!qd_http_method_in(method, r->methods)) {
        qd_reply_error(&c->reply, 405, "method_not_allowed", "%s is not allowed on %s (allowed: %s)",
                       method, r->path, r->methods);
        c->reply.allow = r->allow;
        return;
    }
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long length = cl ? strtoull(cl, NULL, 10) : 0; /* (libmicrohttpd refused a malformed one) */
    if (length > body_limit(c)) {
        qd_reply_error(&c->reply, 413, "body_too_large", "the body (%llu bytes) is over the limit of %llu bytes (%s)",
                       length, body_limit(c), r->model_body ? "--max-convert-bytes" : "--max-body-bytes");
        return;
    }
    if (!r->open && !token_ok(mc)) {
        qd_reply_error(&c->reply, 401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required");
        return;
    }
    if (atomic_load(&qd_srv.draining) && !r->open) {
        qd_conn_busy(&c->reply, "the service is shutting down");
        return;
    }
    if (!strcmp(method, "POST") && r->precheck)
        r->precheck(mc, c);
}

/* ---- the last callback: the route's handler answers ----------------------------------------- */

static enum MHD_Result last_call(struct MHD_Connection *mc, struct conn *c, const char *method)
{
    if (c->reply.status)
        return qd_conn_send(mc, c, &c->reply, 1);
    if (!c->r) {
        qd_reply_error(&c->reply, 404, "not_found", "no such path");
        return qd_conn_send(mc, c, &c->reply, 1);
    }
    return c->r->answer(mc, c, method);
}

/* Set on a thread that let go of a connection on purpose (cut_with_reply), until libmicrohttpd
 * has closed it: its "Application reported internal error" line is then not an error. */
static _Thread_local int cut_on_purpose;

/* An answer decided before a body the client is sending, or in the middle of it, which
 * libmicrohttpd can only send after the body's end (that may never come): quantd writes it to
 * the socket and lingers on it (linger.h), and returning MHD_NO makes libmicrohttpd let go of
 * the connection without reading the rest. */
static enum MHD_Result cut_with_reply(struct MHD_Connection *mc, struct conn *c)
{
    char wire[2048];
    size_t n = qd_reply_wire(&c->reply, wire, sizeof wire);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci || !n) /* (not an error's small answer: never so) */
        return qd_conn_send(mc, c, &c->reply, 1);
    qd_linger_answer(ci->connect_fd, wire, n);
    c->status = c->reply.status;
    c->bytes_out = c->reply.len;
    cut_on_purpose = 1;
    return MHD_NO;
}

/* Whether the request announces a body (a Content-Length above 0, or a chunked one). */
static int has_body(struct MHD_Connection *mc)
{
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return (cl && strtoull(cl, NULL, 10) > 0) ||
           MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
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
        atomic_fetch_add(&qd_srv.inflight, 1);
        qd_watch_request(mc, 1);
        first_call(mc, c, url, method);
        /* a body over the limit by its Content-Length, or one that is not authorized or whose
         * headers are too large, is refused before it, at once: the client may be about to
         * send 10^14 bytes, or waiting on a 100 Continue it must not get. The close lingers
         * (the rest read and dropped, within --linger-bytes and --linger-timeout). Other errors
         * (400, 404 ...) wait for the end of the body (read and dropped up to the limit, the
         * connection kept), as does a refusal of a request without a body */
        int s = c->reply.status;
        if (s == 413 || ((s == 401 || s == 431) && has_body(mc)))
            return cut_with_reply(mc, c);
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        c->bytes_in += n;
        /* a body trickled in (a stalled one meets the idle timeout instead) */
        double elapsed = (qd_now_us() - c->start_us) / 1e6;
        if (elapsed > qd_srv.config->conn_timeout_s && (double)c->bytes_in < QD_MIN_BODY_RATE * elapsed) {
            atomic_fetch_add(&qd_srv.slow_bodies, 1);
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
        if (c->len + n > (size_t)qd_srv.config->max_body_bytes) { /* a chunked body (a declared one is checked first) */
            qd_conn_drop(c);
            qd_reply_error(&c->reply, 413, "body_too_large", "the body is over the limit of %lld bytes "
                           "(--max-body-bytes)", qd_srv.config->max_body_bytes);
            return cut_with_reply(mc, c);
        }
        if (c->len + n > c->cap) { /* no or a short Content-Length: grow */
            size_t cap = c->cap ? c->cap : 65536;
            while (cap < c->len + n)
                cap *= 2;
            if (cap > (size_t)qd_srv.config->max_body_bytes)
                cap = (size_t)qd_srv.config->max_body_bytes;
            if (!qd_hostmem_reserve(cap - c->reserved))
                c->reserved = cap;
            else { /* doubled, it would pass --max-inflight-bytes: what is left, if the body fits */
                struct qd_hostmem_inflight held;
                qd_hostmem_inflight(&held);
                size_t left = held.limit > held.bytes ? held.limit - held.bytes : 0;
                cap = c->reserved + left < cap ? c->reserved + left : cap;
                cap = cap < c->len + n ? c->len + n : cap;
                if (qd_conn_reserve(c, cap - c->reserved)) { /* grown past what may be held */
                    qd_conn_drop(c); /* answered (503) after the body, dropped up to the limit */
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
        return qd_conn_send(mc, c, &c->job->reply, 1); /* resumed: the worker left the answer */
    return last_call(mc, c, method);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    struct conn *c = *con_cls;
    qd_watch_request(mc, 0);
    cut_on_purpose = 0; /* (libmicrohttpd's line, if any, came before) */
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
    qd_conn_drop(c);
    qd_reply_free(&c->reply);
    qd_convert_upload_abort(c->upload); /* a /convert that ended before its job */
    if (c->job)
        qd_job_unref(c->job);
    pthread_mutex_destroy(&c->lock);
    free(c);
    *con_cls = NULL;
    atomic_fetch_sub(&qd_srv.inflight, 1);
}

/* ---- libmicrohttpd's side ---------------------------------------------------------------- */

/* The connection whose request line and headers filled libmicrohttpd's buffer gets quantd's JSON
 * 431 first, and the end of its sending side: libmicrohttpd's own page then finds the connection
 * closed for sending and is never seen. */
static int answer_oversized_head(void)
{
    int fd = qd_watch_oversized_head((unsigned long long)qd_srv.config->max_header_bytes);
    if (fd < 0)
        return 0; /* (not found: libmicrohttpd's page goes out) */
    struct qd_reply r = {0};
    qd_reply_error(&r, 431, "headers_too_large", "the request line and headers are over the limit of %d bytes "
                   "(--max-header-bytes)", qd_srv.config->max_header_bytes);
    char wire[1024];
    size_t n = qd_reply_wire(&r, wire, sizeof wire);
    qd_reply_free(&r);
    if (n) /* (the rest of the head, and any body, read and dropped while the close lingers) */
        qd_linger_answer(fd, wire, n);
    return n != 0;
}

/* MHD_OPTION_EXTERNAL_LOGGER: libmicrohttpd's messages as JSON lines, like quantd's own. One of
 * them comes on the thread serving the connection just before libmicrohttpd answers a request
 * line and headers too large for its buffer (431; 414 for the line alone) with its HTML page:
 * the moment to answer with quantd's JSON instead (answer_oversized_head). */
static void log_mhd(void *cls, const char *fmt, va_list ap)
{
    static const char refusing[] = "Error processing request (HTTP response code is %u";
    static const char let_go[] = "Application reported internal error";
    char text[512], escaped[1024];
    va_list copy;
    va_copy(copy, ap);
    vsnprintf(text, sizeof text, fmt, copy);
    va_end(copy);
    if (cut_on_purpose && !strncmp(text, let_go, sizeof let_go - 1))
        return; /* cut_with_reply: answered, and the request logged as usual ("%s\n", the text) */
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
    qd_srv.config = cfg;
    qd_srv.backend = b;
    qd_srv.formats_json = qd_registry_json();
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
    int bad = qd_listener_open(ai, cfg->listen, &qd_srv.port, err, errlen);
    freeaddrinfo(ai);
    if (bad)
        return -1;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET;
    unsigned threads = http_threads(cfg);
    qd_srv.max_connections = max_connections(cfg);
    qd_srv.daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL,
                                MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
                                MHD_OPTION_THREAD_POOL_SIZE, threads,
                                MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                                MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->conn_timeout_s,
                                /* each thread's share of this limit is above every connection
                                 * the acceptor lets in (all of them could land on one thread),
                                 * with room for the one a thread counts until its cleanup:
                                 * libmicrohttpd's own limit branch is never taken (listener.h) */
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)(qd_srv.max_connections + 16) * threads,
                                MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)QD_CONN_BUFFER_BYTES,
                                MHD_OPTION_END);
    if (!qd_srv.daemon || qd_listener_start(qd_srv.daemon, qd_srv.max_connections)) {
        snprintf(err, errlen, "cannot start the HTTP threads on %s", cfg->listen);
        if (qd_srv.daemon)
            MHD_stop_daemon(qd_srv.daemon);
        qd_srv.daemon = NULL;
        qd_listener_close();
        return -1;
    }
    if (qd_watch_start(cfg->conn_timeout_s) || qd_linger_start(cfg->linger_timeout_s, cfg->linger_bytes,
                                                               cfg->linger_connections)) {
        snprintf(err, errlen, "cannot start the slow-client watchdog or the lingering close");
        qd_watch_stop();
        qd_listener_stop();
        MHD_stop_daemon(qd_srv.daemon);
        qd_srv.daemon = NULL;
        qd_listener_close();
        return -1;
    }
    return 0;
}

int qd_http_port(void) { return qd_srv.port; }

int qd_http_max_connections(void) { return qd_srv.max_connections; }

void qd_http_set_ready(int ready) { atomic_store(&qd_srv.ready, ready); }

int qd_http_drain(int timeout_s)
{
    atomic_store(&qd_srv.draining, 1);
    qd_listener_stop(); /* no new connections; the socket closes in qd_http_stop */
    double deadline = qd_now_us() + timeout_s * 1e6;
    struct qd_jobs_stats js;
    for (;;) {
        qd_jobs_stats(&js);
        if (!atomic_load(&qd_srv.inflight) && !js.depth && !js.running && !js.convert_depth && !js.convert_running)
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
    qd_linger_stop(); /* (lingering connections hold places under the limit too) */
    for (int i = 0; i < 200 && qd_listener_connections() > 0; i++)
        usleep(10000);
    if (qd_srv.daemon)
        MHD_stop_daemon(qd_srv.daemon);
    qd_srv.daemon = NULL;
    qd_watch_stop();
    qd_listener_close();
    free(qd_srv.formats_json);
    qd_srv.formats_json = NULL;
}
