/* An HTTP answer under construction: status, body and the few headers quantd sets. Every error
 * the service gives goes through qd_reply_error, so they all share one JSON shape:
 * {"error": {"code": "...", "message": "..."}}. */
#ifndef QD_REPLY_H
#define QD_REPLY_H

#include <stddef.h>

#include "../../kernels/registry.h"
#include "queue/answer.h"

struct cJSON;

/* Sets an error answer; code is a short machine-readable name ("unknown_format"). */
void qd_reply_error(struct qd_reply *r, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Sets a JSON answer from obj, which it deletes. */
void qd_reply_json(struct qd_reply *r, int status, struct cJSON *obj);
/* Takes ownership of a malloc'd body. */
void qd_reply_take(struct qd_reply *r, int status, const char *content_type, char *body, size_t len);
/* Takes ownership of n pieces (malloc'd or pooled) that make the body in this order. */
void qd_reply_take_parts(struct qd_reply *r, int status, const char *content_type, int n, void *const *parts,
                         const size_t *lens);
/* The body as one new buffer (the parts joined, or a copy of body; qd_hostmem_put frees it), r
 * untouched; NULL when there is no memory. */
char *qd_reply_joined(const struct qd_reply *r);
void qd_reply_free(struct qd_reply *r);

/* The answer as bytes on the wire: status line, Content-Type, Content-Length, Retry-After,
 * WWW-Authenticate (401) or Allow when set, "Connection: close", then the body (an error's JSON).
 * For the few answers quantd writes to a socket itself, where libmicrohttpd cannot send one: a
 * connection refused at accept, a request refused before or in the middle of a body it is still
 * sending (linger.h). The length, or 0 when it does not fit in cap. */
size_t qd_reply_wire(const struct qd_reply *r, char *buf, size_t cap);
/* Writes what the socket takes now (it never blocks: the answer is small and the socket's
 * buffer empty, or the peer is not reading and gets less), then ends the sending side. */
void qd_reply_send_now(int fd, const char *buf, size_t len);

/* The one mapping from a core status to an HTTP status and error code. */
int qd_status_http(enum qd_status s);
const char *qd_status_code(enum qd_status s);

#endif
