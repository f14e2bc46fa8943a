/* What the HTTP front's parts share (http.c: the daemon and a request's life; routes.c: the
 * route table and its handlers): the server's state, a connection's request, and sending an
 * answer. */
#ifndef QD_CONN_H
#define QD_CONN_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "common/config.h"
#include "common/metrics.h"
#include "queue/backend.h"
#include "queue/jobs.h"

#ifndef QD_VERSION /* the Makefile sets it from the VERSION file */
#define QD_VERSION "unknown"
#endif

struct qd_http_server {
    struct MHD_Daemon *daemon;
    const struct qd_serve_config *config;
    struct qd_backend *backend;
    atomic_int ready, draining, inflight;
    atomic_long slow_bodies; /* connections closed for a body slower than QD_MIN_BODY_RATE */
    atomic_ulong inflight_refused; /* bodies refused under --max-inflight-bytes */
    char *formats_json;
    int port;
    int max_connections;     /* --max-connections, or lower to fit the descriptor limit */
};
extern struct qd_http_server qd_srv;

struct qd_http_route;

struct conn {
    pthread_mutex_t lock;     /* orders suspend (HTTP thread) before resume (worker) */
    double start_us;
    enum qd_route route;
    const struct qd_http_route *r; /* NULL: no route (404) */
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


/* Queues r as c's answer; take: the answer's body goes to libmicrohttpd (else it is copied, for
 * a stored job's result that may be read again). */
enum MHD_Result qd_conn_send(struct MHD_Connection *mc, struct conn *c, struct qd_reply *r, int take);
/* The 503 + Retry-After of a full queue or a draining service. */
void qd_conn_busy(struct qd_reply *r, const char *what);
/* Reserves n more bytes of --max-inflight-bytes for c's body: 0, or -1 with the answer set (413
 * for a body that could never fit, else 503 + Retry-After). */
int qd_conn_reserve(struct conn *c, size_t n);
/* Gives c's body back, with its reservation. */
void qd_conn_drop(struct conn *c);

#endif
