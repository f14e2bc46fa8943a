/* Replies and the status mapping (see reply.h). */
#include "http/reply.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <sys/socket.h>

#include "queue/hostmem.h"

/* Bodies may come from the pinned pool (a raw tensor answer is the result buffer itself):
 * qd_hostmem_put returns those to the pool and frees the others. */
static void free_body(struct qd_reply *r)
{
    qd_hostmem_put(r->body);
    r->body = NULL;
    for (int i = 0; i < r->nparts; i++)
        qd_hostmem_put(r->part[i]);
    r->nparts = 0;
    r->len = 0;
}

void qd_reply_free(struct qd_reply *r)
{
    free_body(r);
    if (r->has_file)
        close(r->file_fd);
    r->has_file = 0;
    free(r->summary_header);
    free(r->config_header);
    r->summary_header = r->config_header = NULL;
}

void qd_reply_take(struct qd_reply *r, int status, const char *content_type, char *body, size_t len)
{
    free_body(r);
    r->status = status;
    r->content_type = content_type;
    r->body = body;
    r->len = len;
}

void qd_reply_take_parts(struct qd_reply *r, int status, const char *content_type, int n, void *const *parts,
                         const size_t *lens)
{
    free_body(r);
    r->status = status;
    r->content_type = content_type;
    for (int i = 0; i < n; i++) {
        r->part[i] = parts[i];
        r->part_len[i] = lens[i];
        r->len += lens[i];
    }
    r->nparts = n;
}

char *qd_reply_joined(const struct qd_reply *r)
{
    char *out = qd_hostmem_get(r->len ? r->len : 1), *p = out;
    if (out && !r->nparts && r->len)
        memcpy(out, r->body, r->len);
    for (int i = 0; out && i < r->nparts; i++) {
        memcpy(p, r->part[i], r->part_len[i]);
        p += r->part_len[i];
    }
    return out;
}

void qd_reply_json(struct qd_reply *r, int status, cJSON *obj)
{
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!text) {
        /* cJSON only fails on allocation; answer with a fixed body rather than nothing */
        static const char oom[] = "{\"error\":{\"code\":\"out_of_memory\",\"message\":\"out of memory\"}}";
        text = strdup(oom);
        status = 503;
    }
    qd_reply_take(r, status, "application/json", text, text ? strlen(text) : 0);
}

/* Messages quote what the client sent (a query key, a file name) and the answer must stay valid
 * UTF-8 JSON: a byte that does not start a well-formed UTF-8 sequence becomes '?'. */
static void valid_utf8(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        int n = *p < 0x80 ? 1 : (*p & 0xe0) == 0xc0 && *p >= 0xc2 ? 2 : (*p & 0xf0) == 0xe0 ? 3
              : (*p & 0xf8) == 0xf0 && *p <= 0xf4 ? 4 : 0;
        for (int k = 1; k < n; k++)
            if ((p[k] & 0xc0) != 0x80)
                n = 0;
        if (n == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0)))
            n = 0; /* overlong, or a UTF-16 surrogate */
        if (n == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90)))
            n = 0;
        if (n == 0) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

void qd_reply_error(struct qd_reply *r, int status, const char *code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    valid_utf8(msg); /* (a cut at the buffer's end can split a sequence too) */
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    qd_reply_json(r, status, o);
    if (status == 503) /* every 503 is worth a retry: a full queue, memory, a lost device */
        r->retry_after_s = 1;
}

size_t qd_reply_wire(const struct qd_reply *r, char *buf, size_t cap)
{
    char extra[160] = ""; /* the headers qd_conn_send adds to an error */
    if (r->retry_after_s)
        snprintf(extra, sizeof extra, "Retry-After: %d\r\n", r->retry_after_s);
    else if (r->status == 401)
        snprintf(extra, sizeof extra, "WWW-Authenticate: Bearer\r\n");
    else if (r->allow)
        snprintf(extra, sizeof extra, "Allow: %.120s\r\n", r->allow);
    int n = snprintf(buf, cap, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                     "Connection: close\r\n\r\n", r->status, MHD_get_reason_phrase_for((unsigned)r->status),
                     r->content_type ? r->content_type : "application/json", r->len, extra);
    if (n < 0 || (size_t)n + r->len > cap || r->nparts)
        return 0;
    memcpy(buf + n, r->body, r->len);
    return (size_t)n + r->len;
}

void qd_reply_send_now(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t w = send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        buf += w, len -= (size_t)w;
    }
    shutdown(fd, SHUT_WR);
}

int qd_status_http(enum qd_status s)
{
    switch (s) {
    case QD_OK: return 200;
    case QD_EINVAL: return 400;
    case QD_ESHAPE: case QD_ENONFINITE: return 422;
    case QD_ENOMEM: case QD_EBUSY: case QD_EDEVICE: return 503;
    case QD_ENOTFOUND: return 404;
    case QD_ECANCELED: return 409;
    case QD_EFORBIDDEN: return 403;
    case QD_ENOSPC: return 507;
    case QD_EIO: return 500;
    }
    return 500;
}

const char *qd_status_code(enum qd_status s)
{
    switch (s) {
    case QD_OK: return "ok";
    case QD_EINVAL: return "bad_request";
    case QD_ESHAPE: return "unsupported_shape";
    case QD_ENONFINITE: return "non_finite_input";
    case QD_ENOMEM: return "out_of_memory";
    case QD_EBUSY: return "queue_full";
    case QD_EDEVICE: return "device_error";
    case QD_ENOTFOUND: return "not_found";
    case QD_ECANCELED: return "cancelled";
    case QD_EFORBIDDEN: return "forbidden";
    case QD_ENOSPC: return "insufficient_storage";
    case QD_EIO: return "internal";
    }
    return "internal";
}
