/* A do-nothing HTTP/1.1 server for bench_service: it reads each request's body straight into a
 * buffer (one copy, the least any server can do) and answers a fixed number of bytes from
 * memory. The same clients against it show what they and the loopback reach with an ideal
 * server, so that a shortfall of quantd can be told apart from one of the clients. */
#ifndef QD_NULL_HTTP_H
#define QD_NULL_HTTP_H

#include <stddef.h>

struct null_http;

/* Listens on 127.0.0.1 (a free port); each connection gets a thread. NULL on failure. */
struct null_http *null_http_start(size_t answer_bytes);
/* http://127.0.0.1:PORT */
const char *null_http_base(const struct null_http *s);
/* Closes the listener and every connection, joins the threads; returns the requests answered. */
long null_http_stop(struct null_http *s);

#endif
