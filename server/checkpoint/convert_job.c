/* Conversion jobs (convert_job.h). */
#include "checkpoint/convert_job.h"
#include "checkpoint/gguf_recipe.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/convert.h"
#include "service/metrics.h"

/* rel resolved under root (a real path): no absolute path, no "..", and after following
 * symlinks still inside root. must_exist: the path itself (the source); else its directory
 * (the destination), and the last component must not be a symlink. */
static int confine(const char *root, const char *what, const char *rel, int must_exist, char **out,
                   struct qd_reply *err)
{
    if (!rel || !*rel) {
        qd_reply_error(err, 400, "bad_request", "%s is missing (a path relative to --data-dir)", what);
        return -1;
    }
    if (rel[0] == '/' || !strcmp(rel, "..") || !strncmp(rel, "../", 3) || strstr(rel, "/../") ||
        (strlen(rel) >= 3 && !strcmp(rel + strlen(rel) - 3, "/.."))) {
        qd_reply_error(err, 403, "forbidden", "%s '%.200s' must be relative to --data-dir, without '..'", what, rel);
        return -1;
    }
    char joined[PATH_MAX], real[PATH_MAX];
    if (snprintf(joined, sizeof joined, "%s/%s", root, rel) >= (int)sizeof joined) {
        qd_reply_error(err, 400, "bad_request", "%s is too long", what);
        return -1;
    }
    char *probe = must_exist ? strdup(joined) : strdup(joined), *dir = must_exist ? probe : dirname(probe);
    if (!probe || !realpath(dir, real)) {
        int e = errno;
        free(probe);
        qd_reply_error(err, e == ENOENT || e == ENOTDIR ? 404 : 400, e == ENOENT ? "not_found" : "bad_request",
                       "%s '%.200s'%s: %s", what, rel, must_exist ? "" : " (its directory)", strerror(e));
        return -1;
    }
    free(probe);
    size_t n = strlen(root);
    if (strncmp(real, root, n) || (real[n] && real[n] != '/')) {
        qd_reply_error(err, 403, "forbidden", "%s '%.200s' leads outside --data-dir", what, rel);
        return -1;
    }
    if (must_exist) {
        *out = strdup(real);
    } else {
        char *b = strdup(joined), *base = b ? basename(b) : NULL;
        struct stat st;
        char final[PATH_MAX];
        int ok = base && strcmp(base, ".") && strcmp(base, "..") &&
                 snprintf(final, sizeof final, "%s/%s", real, base) < (int)sizeof final;
        if (ok && lstat(final, &st) == 0 && S_ISLNK(st.st_mode)) {
            free(b);
            qd_reply_error(err, 403, "forbidden", "%s '%.200s' is a symlink: quantd does not write through one", what,
                           rel);
            return -1;
        }
        *out = ok ? strdup(final) : NULL;
        free(b);
        if (!ok) {
            qd_reply_error(err, 400, "bad_request", "%s '%.200s' names no file", what, rel);
            return -1;
        }
    }
    if (!*out) {
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        return -1;
    }
    return 0;
}

static int set_param(struct qd_convert_request *r, const char *k, const char *v, struct qd_reply *err)
{
    char msg[256];
    if (qd_params_set(r->f, &r->params, k, v, msg, sizeof msg) != QD_OK) {
        qd_reply_error(err, 400, "bad_param", "%s", msg);
        return -1;
    }
    return 0;
}

struct qd_convert_request *qd_convert_request_parse(const char *data_dir, const struct qd_req *q, const char *body,
                                                    size_t len, struct qd_reply *err)
{
    char root[PATH_MAX];
    if (!data_dir || !*data_dir || !realpath(data_dir, root)) {
        qd_reply_error(err, 403, "forbidden", "conversions are off: start quantd serve with --data-dir");
        return NULL;
    }
    cJSON *o = cJSON_ParseWithLength(body ? body : "", len);
    struct qd_convert_request *r = calloc(1, sizeof *r);
    if (!r) {
        cJSON_Delete(o);
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        return NULL;
    }
    if (!cJSON_IsObject(o)) {
        qd_reply_error(err, 400, "bad_json", "the body must be a JSON object {\"source\", \"destination\", \"fmt\", ...}");
        goto bad;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        static const char *const keys[] = {"source", "destination", "fmt", "recipe", "params", "skip", "only", NULL};
        int known = 0;
        for (const char *const *k = keys; *k; k++)
            known |= !strcmp(it->string, *k);
        if (!known) {
            qd_reply_error(err, 400, "bad_request", "unknown field '%.64s' in the convert request", it->string);
            goto bad;
        }
    }
    const char *fmt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "fmt"));
    const cJSON *recipe = cJSON_GetObjectItemCaseSensitive(o, "recipe");
    if (recipe) { /* a llama-quantize mix: its default type is the format */
        const struct qd_gguf_recipe *mix = qd_gguf_recipe_find(cJSON_GetStringValue(recipe));
        if (!mix) {
            qd_reply_error(err, 400, "unknown_recipe", "unknown recipe (quantd writes %s)", qd_gguf_recipe_names());
            goto bad;
        }
        if (fmt || q->f) {
            qd_reply_error(err, 400, "bad_request", "give fmt or recipe, not both (a recipe chooses each tensor's format)");
            goto bad;
        }
        r->recipe = strdup(mix->name);
        fmt = mix->fmt;
    }
    r->f = qd_convert_format(q->f ? q->f : fmt ? qd_format_find(fmt) : NULL);
    if (!r->f) {
        qd_reply_error(err, 400, "unknown_format", "fmt %s%.64s%s (GET /formats lists them)", fmt ? "'" : "is missing",
                       fmt ? fmt : "", fmt ? "' is unknown" : "");
        goto bad;
    }
    qd_params_default(r->f, &r->params);
    char msg[512];
    if (qd_params_from_json(r->f, &r->params, cJSON_GetObjectItemCaseSensitive(o, "params"), msg, sizeof msg) != QD_OK) {
        qd_reply_error(err, 400, "bad_param", "%s", msg);
        goto bad;
    }
    for (int i = 0; i < q->nparams; i++) /* the query wins, as on the other routes */
        if (set_param(r, q->param_key[i], q->param_value[i], err))
            goto bad;
    const cJSON *skip = cJSON_GetObjectItemCaseSensitive(o, "skip"), *only = cJSON_GetObjectItemCaseSensitive(o, "only");
    if ((skip && !cJSON_IsString(skip)) || (only && !cJSON_IsString(only))) {
        qd_reply_error(err, 400, "bad_request", "skip and only must be strings (POSIX extended regexes)");
        goto bad;
    }
    r->skip = skip ? strdup(skip->valuestring) : NULL;
    r->only = only ? strdup(only->valuestring) : NULL;
    struct qd_name_filter *nf = qd_name_filter_new(r->skip, r->only, msg, sizeof msg);
    if (!nf) {
        qd_reply_error(err, 400, "bad_request", "%s", msg);
        goto bad;
    }
    qd_name_filter_free(nf);
    if (confine(root, "source", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "source")), 1, &r->src, err) ||
        confine(root, "destination", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "destination")), 0,
                &r->dst, err))
        goto bad;
    cJSON_Delete(o);
    return r;
bad:
    cJSON_Delete(o);
    qd_convert_request_free(r);
    return NULL;
}

void qd_convert_request_free(struct qd_convert_request *r)
{
    if (!r)
        return;
    if (r->spooled) { /* POST /convert's temporary files (the answer holds dst open) */
        if (r->src)
            unlink(r->src);
        if (r->dst)
            unlink(r->dst);
    }
    free(r->src);
    free(r->dst);
    free(r->skip);
    free(r->only);
    free(r->recipe);
    free(r);
}

static void on_tensor(void *ctx, const struct qd_convert_event *ev)
{
    struct qd_job *j = ctx;
    atomic_store(&j->tensors_total, ev->count);
    atomic_store(&j->tensors_done, ev->index);
    atomic_store(&j->bytes_total, ev->in_total);
    atomic_store(&j->bytes_done, ev->in_done);
}

void qd_convert_job_run(struct qd_job *j, struct qd_backend *b, void *worker)
{
    const struct qd_convert_request *r = j->convert;
    struct qd_convert_opts o = {.src = r->src, .dst = r->dst, .f = r->f, .params = r->params, .skip = r->skip,
                                .only = r->only, .recipe = r->recipe, .backend = b, .worker = worker,
                                .progress = on_tensor,
                                .progress_ctx = j, .cancel = &j->cancel};
    char why[256];
    qd_convert_spread(&o, why, sizeof why); /* its tensors go to every device, as the CLI's do */
    struct qd_convert_summary s;
    enum qd_status st;
    char err[1024];
    j->started_us = qd_now_us();
    int failed = qd_convert(&o, &s, &st, err, sizeof err);
    qd_convert_unspread(&o);
    if (failed) {
        qd_metrics_convert(r->f, st == QD_ECANCELED ? "cancelled" : "failed", s.bytes_in,
                           s.quantized + s.copied + s.cast);
        qd_reply_error(&j->reply, qd_status_http(st), qd_status_code(st), "%s", err);
        free(s.layout_config);
        return;
    }
    qd_metrics_convert(r->f, "ok", s.bytes_in, s.quantized + s.copied + s.cast);
    char *config = s.layout_config;
    cJSON *sum = cJSON_CreateObject();
    cJSON_AddStringToObject(sum, "fmt", r->f->name);
    cJSON_AddNumberToObject(sum, "quantized", s.quantized);
    cJSON_AddNumberToObject(sum, "copied", s.copied);
    cJSON_AddNumberToObject(sum, "cast_f16", s.cast);
    cJSON_AddNumberToObject(sum, "bytes_in", (double)s.bytes_in);
    cJSON_AddNumberToObject(sum, "bytes_out", (double)s.bytes_out);
    cJSON_AddNumberToObject(sum, "seconds", s.seconds);
    cJSON_AddStringToObject(sum, "backend", j->backend);
    if (s.rule) { /* Hugging Face layouts: the model type and which rule chose the weights */
        cJSON_AddStringToObject(sum, "arch", s.arch);
        cJSON_AddStringToObject(sum, "rule", s.rule);
        if (s.rule_why[0])
            cJSON_AddStringToObject(sum, "rule_why", s.rule_why);
    }
    if (!r->spooled) {
        free(config);
        qd_reply_json(&j->reply, 200, sum);
        return;
    }
    /* POST /convert: the converted file is the answer, sent from its descriptor */
    int fd = open(r->dst, O_RDONLY | O_CLOEXEC);
    struct stat st_out;
    if (fd < 0 || fstat(fd, &st_out) < 0) {
        if (fd >= 0)
            close(fd);
        free(config);
        cJSON_Delete(sum);
        qd_reply_error(&j->reply, 500, "internal", "the converted file cannot be opened: %s", strerror(errno));
        return;
    }
    j->reply.status = 200;
    j->reply.content_type = "application/octet-stream";
    j->reply.has_file = 1;
    j->reply.file_fd = fd;
    j->reply.file_len = (unsigned long long)st_out.st_size;
    j->reply.summary_header = cJSON_PrintUnformatted(sum);
    j->reply.config_header = config;
    cJSON_Delete(sum);
}
