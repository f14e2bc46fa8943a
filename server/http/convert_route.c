/* POST /convert's upload (convert_route.h). */
#include "http/convert_route.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/convert.h"
#include "checkpoint/convert_request.h"

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

/* A new empty file name in dir (mkstemp), kept for the engine to open by name; *fd holds it
 * open with an exclusive lock while it is in use, so that a sweep at another quantd's start
 * leaves it alone. A name a sweep took first (it holds the lock, and removes it) is left to it. */
static char *spool_name(const char *dir, const char *what, int *fd)
{
    size_t n = strlen(dir) + 48;
    char *p = malloc(n);
    for (int tries = 0; p && tries < 8; tries++) {
        snprintf(p, n, "%s/.quantd-%s-XXXXXX", dir, what);
        if ((*fd = mkstemp(p)) < 0)
            break;
        if (flock(*fd, LOCK_EX | LOCK_NB) == 0) {
            qd_temp_add(p, 0); /* (a forced stop removes it) */
            return p;
        }
        close(*fd);
    }
    free(p);
    *fd = -1;
    return NULL;
}

const char *qd_convert_spool_dir(const char *data_dir)
{
    const char *tmp = getenv("TMPDIR");
    return data_dir && *data_dir ? data_dir : tmp && *tmp ? tmp : "/tmp";
}

/* quantd's spool names: ".quantd-upload-" or ".quantd-converted-" and mkstemp's six characters */
static int spool_named(const char *name)
{
    static const char *const kinds[] = {".quantd-upload-", ".quantd-converted-", NULL};
    for (const char *const *k = kinds; *k; k++) {
        size_t n = strlen(*k);
        if (!strncmp(name, *k, n) && strlen(name + n) == 6 && strspn(name + n, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                              "abcdefghijklmnopqrstuvwxyz0123456789") == 6)
            return 1;
    }
    return 0;
}

int qd_convert_spool_sweep(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int removed = 0;
    while (d && (e = readdir(d))) {
        if (!spool_named(e->d_name))
            continue;
        /* a regular file of quantd's whose lock nobody holds: its quantd is gone */
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            unlinkat(dirfd(d), e->d_name, 0) == 0)
            removed++;
        if (fd >= 0)
            close(fd);
    }
    if (d)
        closedir(d);
    return removed;
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
    struct qd_convert_arg *args = r ? calloc((size_t)n + 1, sizeof *args) : NULL;
    if (!args || !(r->spec = qd_convert_spec_new())) {
        if (r)
            free(r->spec);
        free(args), free(r), free(u);
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        return NULL;
    }
    u->fd = -1;
    u->req = r;
    r->spool_fd[0] = r->spool_fd[1] = -1;
    u->limit = (unsigned long long)limit;
    r->spooled = 1;
    /* the query is the request (convert_request.h), but for what one uploaded file cannot do */
    int nargs = 0;
    for (int i = 0; i < n; i++) {
        const char *k = kv[i].key;
        if (!strcmp(k, "imatrix")) { /* a second file: a job reads it from --data-dir */
            qd_reply_error(err, 400, "bad_request", "imatrix names a file: POST /convert takes one, the model; give "
                           "the imatrix to a conversion job (POST /jobs?op=convert, paths in --data-dir)");
            goto bad;
        }
        if (!strcmp(k, "tensor_type_file") || !strcmp(k, "tensor-type-file")) {
            qd_reply_error(err, 400, "bad_request", "tensor_type_file reads a file of the server's: give the entries "
                           "as tensor_type (PATTERN=TYPE, repeated)");
            goto bad;
        }
        args[nargs++] = (struct qd_convert_arg){k, kv[i].value};
    }
    char msg[1024];
    enum qd_status rs = qd_convert_resolve(r->spec, args, nargs, msg, sizeof msg);
    if (rs != QD_OK) {
        qd_convert_resolve_error(r->spec, rs, msg, err);
        goto bad;
    }
    const struct qd_gguf_options *gguf = &r->spec->gguf;
    if (gguf->split_max_tensors || gguf->split_max_bytes) {
        qd_reply_error(err, 400, "bad_request", "a split output is several files and POST /convert answers one: give "
                       "split_max_tensors / split_max_size to a conversion job (POST /jobs?op=convert)");
        goto bad;
    }
    if (gguf->keep_split) {
        qd_reply_error(err, 400, "bad_request", "keep_split keeps a split model's shards, several files, and POST "
                       "/convert takes and answers one: give keep_split to a conversion job (POST /jobs?op=convert, "
                       "source the first shard in --data-dir)");
        goto bad;
    }
    if (!(u->dir = strdup(spool_dir)) || !(u->path = spool_name(spool_dir, "upload", &u->fd))) {
        qd_reply_error(err, 503, "out_of_memory", "cannot spool the upload: %s", strerror(errno));
        goto bad;
    }
    free(args);
    return u;
bad:
    free(args);
    qd_convert_upload_abort(u);
    return NULL;
}

const struct qd_format *qd_convert_upload_format(const struct qd_convert_upload *u) { return u->req->spec->f; }

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
    r->spool_fd[0] = u->fd; /* (held, with its lock, until the request is freed) */
    u->fd = -1;
    r->src = u->path;
    u->path = NULL;
    if (!(r->dst = spool_name(u->dir, "converted", &r->spool_fd[1]))) {
        qd_reply_error(err, 507, "insufficient_storage", "no spool file for the answer: %s", strerror(errno));
        u->req = r; /* (src set: the abort removes it) */
        qd_convert_upload_abort(u);
        return NULL;
    }
    u->req = NULL;
    free(u->dir);
    free(u);
    return r;
}

void qd_convert_upload_abort(struct qd_convert_upload *u)
{
    if (!u)
        return;
    if (u->path) {
        unlink(u->path);
        qd_temp_forget(u->path);
    }
    if (u->fd >= 0)
        close(u->fd);
    free(u->path);
    free(u->dir);
    qd_convert_request_free(u->req); /* (removes its spool files) */
    free(u);
}
