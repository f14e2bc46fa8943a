/* The HTTP front: libmicrohttpd, routing, the request life cycle (receive, queue, suspend,
 * answer) and the per-request log line. */
#ifndef QD_HTTP_H
#define QD_HTTP_H

#include "common/config.h"

struct qd_backend;

/* Starts listening; -1 with err. */
int qd_http_start(const struct qd_serve_config *c, struct qd_backend *b, char *err, size_t errlen);
/* The port actually bound (for --listen ...:0). */
int qd_http_port(void);
/* The connection limit in force (--max-connections, or lower to fit the descriptor limit). */
int qd_http_max_connections(void);
/* Marks the service ready (backend and workers up). */
void qd_http_set_ready(int ready);
/* SIGTERM path: stop accepting, answer new requests on open connections with 503, and wait up
 * to timeout_s for every accepted request and job to be answered. Returns 0 when all were. */
int qd_http_drain(int timeout_s);
void qd_http_stop(void);

#endif
