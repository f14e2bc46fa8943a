/* The HTTP front's shared state and answers (conn.h). */
#include "http/conn.h"

#include <stdio.h>
#include <stdlib.h>

#include "http/reply.h"
#include "queue/hostmem.h"

struct qd_http_server qd_srv;

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

enum MHD_Result qd_conn_send(struct MHD_Connection *mc, struct conn *c, struct qd_reply *r, int take)
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
    if (atomic_load(&qd_srv.draining))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    c->status = r->status;
    c->bytes_out = r->len ? r->len : (size_t)r->file_len;
    enum MHD_Result ok = MHD_queue_response(mc, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

void qd_conn_busy(struct qd_reply *r, const char *what)
{
    qd_reply_error(r, 503, "queue_full", "%s; retry later", what);
    r->retry_after_s = 1;
}

int qd_conn_reserve(struct conn *c, size_t n)
{
    if (!qd_hostmem_reserve(n)) {
        c->reserved += n;
        return 0;
    }
    struct qd_hostmem_inflight s;
    qd_hostmem_inflight(&s);
    atomic_fetch_add(&qd_srv.inflight_refused, 1);
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

void qd_conn_drop(struct conn *c)
{
    qd_hostmem_put(c->body);
    c->body = NULL;
    qd_hostmem_release(c->reserved);
    c->reserved = 0;
}
