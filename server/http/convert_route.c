/* POST /convert's upload (convert_route.h). */
#include "http/convert_route.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "checkpoint/convert.h"
#include "checkpoint/gguf_recipe.h"

struct qd_convert_upload {
    int fd;
    char *path, *dir;
    unsigned long long bytes, limit;
    struct qd_convert_request *req;
};

static int media_is(const char *ct, const char *type)
{
    size_t n = strlen(type);
    return ct && !strncasecmp(ct, type, n) && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

/* A new empty file name in dir (mkstemp), kept for the engine to open by name. */
static char *spool_name(const char *dir, const char *what, int *fd)
{
    size_t n = strlen(dir) + 48;
    char *p = malloc(n);
    if (!p)
        return NULL;
    snprintf(p, n, "%s/.quantd-%s-XXXXXX", dir, what);
    if ((*fd = mkstemp(p)) < 0) {
        free(p);
        return NULL;
    }
    return p;
}

struct qd_convert_upload *qd_convert_upload_begin(const struct qd_kv *kv, int n, const char *content_type,
                                                  long long length, const char *spool_dir, long long limit,
                                                  struct qd_reply *err)
{
    if (content_type && *content_type && !media_is(content_type, "application/octet-stream") &&
        !media_is(content_type, "application/x-www-form-urlencoded")) {
        qd_reply_error(err, 415, "unsupported_media_type",
                       "Content-Type %.64s: send the model file as application/octet-stream", content_type);
        return NULL;
    }
    if (length > limit) {
        qd_reply_error(err, 413, "body_too_large", "the model (%lld bytes) is over --max-convert-bytes (%lld)", length,
                       limit);
        return NULL;
    }
    struct qd_convert_upload *u = calloc(1, sizeof *u);
    struct qd_convert_request *r = u ? calloc(1, sizeof *r) : NULL;
    if (!r) {
        free(u);
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        return NULL;
    }
    u->fd = -1;
    u->req = r;
    u->limit = (unsigned long long)limit;
    r->spooled = 1;
    for (int i = 0; i < n; i++) {
        const char *v = kv[i].value ? kv[i].value : "";
        if (!strcmp(kv[i].key, "fmt") && !(r->f = qd_convert_format(qd_format_find(v)))) {
            qd_reply_error(err, 400, "unknown_format", "unknown format '%.64s' (GET /formats lists them)", v);
            goto bad;
        }
        if (!strcmp(kv[i].key, "recipe")) {
            const struct qd_gguf_recipe *mix = qd_gguf_recipe_find(v);
            if (!mix) {
                qd_reply_error(err, 400, "unknown_recipe", "unknown recipe '%.40s' (quantd writes %s)", v,
                               qd_gguf_recipe_names());
                goto bad;
            }
            free(r->recipe);
            r->recipe = strdup(mix->name);
        }
    }
    if (r->recipe && r->f) {
        qd_reply_error(err, 400, "bad_request", "give fmt or recipe, not both (a recipe chooses each tensor's format)");
        goto bad;
    }
    if (r->recipe)
        r->f = qd_format_find(qd_gguf_recipe_find(r->recipe)->fmt);
    if (!r->f) {
        qd_reply_error(err, 400, "missing_format", "fmt (or recipe) is required (GET /formats lists them)");
        goto bad;
    }
    qd_params_default(r->f, &r->params);
    char msg[512];
    for (int i = 0; i < n; i++) {
        const char *k = kv[i].key, *v = kv[i].value ? kv[i].value : "";
        if (!strcmp(k, "fmt") || !strcmp(k, "recipe"))
            continue;
        if (!strcmp(k, "skip") || !strcmp(k, "only")) {
            char **slot = !strcmp(k, "skip") ? &r->skip : &r->only;
            free(*slot);
            *slot = strdup(v);
            continue;
        }
        if (!qd_param_find(k) || !qd_format_accepts(r->f, k)) {
            qd_reply_error(err, 400, "unknown_param", "unknown parameter '%.32s' for format %s", k, r->f->name);
            goto bad;
        }
        if (qd_params_set(r->f, &r->params, k, v, msg, sizeof msg) != QD_OK) {
            qd_reply_error(err, 400, "bad_param", "%s", msg);
            goto bad;
        }
    }
    if (!(r->filter = qd_name_filter_new(r->skip, r->only, msg, sizeof msg))) {
        qd_reply_error(err, 400, "bad_request", "%s", msg);
        goto bad;
    }
    if (!(u->dir = strdup(spool_dir)) || !(u->path = spool_name(spool_dir, "upload", &u->fd))) {
        qd_reply_error(err, 503, "out_of_memory", "cannot spool the upload in %s: %s", spool_dir, strerror(errno));
        goto bad;
    }
    return u;
bad:
    qd_convert_upload_abort(u);
    return NULL;
}

const struct qd_format *qd_convert_upload_format(const struct qd_convert_upload *u) { return u->req->f; }

int qd_convert_upload_write(struct qd_convert_upload *u, const char *data, size_t n, struct qd_reply *err)
{
    if (u->bytes + n > u->limit) {
        qd_reply_error(err, 413, "body_too_large", "the model is over --max-convert-bytes (%llu)", u->limit);
        return -1;
    }
    while (n) {
        ssize_t w = write(u->fd, data, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            qd_reply_error(err, 507, "insufficient_storage", "spooling the upload: %s", strerror(errno));
            return -1;
        }
        data += w, n -= (size_t)w;
        u->bytes += (unsigned long long)w;
    }
    return 0;
}

struct qd_convert_request *qd_convert_upload_finish(struct qd_convert_upload *u, struct qd_reply *err)
{
    struct qd_convert_request *r = u->req;
    int fd;
    close(u->fd);
    u->fd = -1;
    r->src = u->path;
    u->path = NULL;
    if (!(r->dst = spool_name(u->dir, "converted", &fd))) {
        qd_reply_error(err, 507, "insufficient_storage", "no spool file for the answer: %s", strerror(errno));
        u->req = r; /* (src set: the abort removes it) */
        qd_convert_upload_abort(u);
        return NULL;
    }
    close(fd);
    u->req = NULL;
    free(u->dir);
    free(u);
    return r;
}

void qd_convert_upload_abort(struct qd_convert_upload *u)
{
    if (!u)
        return;
    if (u->fd >= 0)
        close(u->fd);
    if (u->path)
        unlink(u->path);
    free(u->path);
    free(u->dir);
    qd_convert_request_free(u->req); /* (removes its spool files) */
    free(u);
}
