/* Conversion jobs (convert_job.h). */
#include "http/convert_job.h"
#include "checkpoint/gguf_options.h"
#include "checkpoint/gguf_recipe.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/convert.h"
#include "http/work_job.h"
#include "common/metrics.h"

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
    struct stat rs;
    if (stat(real, &rs) < 0 || (must_exist ? !S_ISREG(rs.st_mode) && !S_ISDIR(rs.st_mode) : !S_ISDIR(rs.st_mode))) {
        qd_reply_error(err, 400, "bad_request", must_exist ? "%s '%.200s' is not a regular file or a directory (a FIFO, "
                       "device or socket): quantd reads model files" : "%s '%.200s': a part of the path is not a "
                       "directory", what, rel);
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

/* Replaces every from in s (a NUL-terminated message in a buffer of cap bytes) with to: the
 * engine names the paths it was given, which for a job are the server's. */
static void scrub(char *s, size_t cap, const char *from, const char *to)
{
    size_t nf = strlen(from), nt = strlen(to);
    for (char *p = nf ? strstr(s, from) : NULL; p; p = strstr(p + nt, from)) {
        size_t at = (size_t)(p - s), tail = strlen(p + nf);
        if (at + nt >= cap) { /* (no room for the replacement: the message ends here) */
            *p = 0;
            return;
        }
        if (at + nt + tail + 1 > cap)
            tail = cap - 1 - at - nt;
        memmove(p + nt, p + nf, tail);
        memcpy(p, to, nt);
        p[nt + tail] = 0;
    }
}

/* The server's paths out of an engine message: the data directory's become relative to it. */
static void scrub_request(const struct qd_convert_request *r, char *msg, size_t cap)
{
    if (r->spooled) {
        scrub(msg, cap, r->src, "the uploaded model");
        scrub(msg, cap, r->dst, "the converted file");
    }
    if (r->root) {
        char prefix[PATH_MAX + 2];
        snprintf(prefix, sizeof prefix, "%s/", r->root);
        scrub(msg, cap, prefix, "");
        scrub(msg, cap, r->root, "--data-dir");
    }
}

/* Whether a JSON text holds a NUL in a string (\u0000: cJSON's strings would end there, a path
 * silently cut short) or a raw one. */
static int json_has_nul(const char *body, size_t len)
{
    if (memchr(body, 0, len))
        return 1;
    for (size_t i = 0, in = 0; i < len; i++) {
        if (body[i] == '"')
            in = !in;
        else if (in && body[i] == '\\' && i + 1 < len) {
            if (body[i + 1] == 'u' && i + 5 < len && !strncmp(body + i + 2, "0000", 4))
                return 1;
            i++; /* (the escaped character) */
        }
    }
    return 0;
}

/* A source directory's files, whatever links they are, stay inside root and are files or
 * directories: the engine reads some of them by name (config.json, the shards, the tokenizer
 * it copies). */
static int check_source_dir(const char *root, const char *dir, const char *rel, struct qd_reply *err)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int rc = 0;
    while (d && !rc && (e = readdir(d))) {
        char path[PATH_MAX], real[PATH_MAX];
        struct stat st;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path || lstat(path, &st) < 0)
            continue;
        if (S_ISLNK(st.st_mode) && (!realpath(path, real) || strncmp(real, root, strlen(root)) ||
                                    (real[strlen(root)] && real[strlen(root)] != '/'))) {
            qd_reply_error(err, 403, "forbidden", "source '%.200s/%.200s' is a symlink leading outside --data-dir "
                           "(or to nothing): quantd reads only files inside it", rel, e->d_name);
            rc = -1;
        } else if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
            qd_reply_error(err, 400, "bad_request", "source '%.200s/%.200s' is not a regular file (a FIFO, device or "
                           "socket): quantd reads model files", rel, e->d_name);
            rc = -1;
        }
    }
    if (d)
        closedir(d);
    return rc;
}

void qd_convert_name_error(struct qd_reply *err, const char *name, int as_recipe)
{
    const struct qd_format *f = qd_convert_format_named(name);
    const struct qd_gguf_recipe *mix = qd_convert_recipe_named(name);
    if (as_recipe && f)
        qd_reply_error(err, 400, "unknown_recipe", "recipe '%.40s' is a format, not a llama-quantize mix: give fmt %s",
                       name, f->name);
    else if (as_recipe)
        qd_reply_error(err, 400, "unknown_recipe", "unknown recipe '%.40s'%s%s (quantd writes %s)", name,
                       mix ? ": spelled " : "", mix ? mix->name : "", qd_gguf_recipe_names());
    else if (mix && !f && !mix->fmt)
        qd_reply_error(err, 400, "unknown_format", "fmt '%.40s' is llama-quantize's %s mix, not a format (quantd "
                       "convert --recipe %s writes it)", name, mix->name, mix->name);
    else if (mix && !f)
        qd_reply_error(err, 400, "unknown_format", "fmt '%.40s' is a llama-quantize mix, not one format: give recipe "
                       "%s (fmt gives every quantized tensor one type, such as %s)", name, mix->name, mix->fmt);
    else
        qd_reply_error(err, 400, "unknown_format", "unknown format '%.64s'%s%s (GET /formats lists them)", name,
                       f ? ": spelled " : "", f ? f->name : "");
}

int qd_convert_gguf_option(struct qd_convert_request *r, const char *key, const char *value, struct qd_reply *err)
{
    if (!qd_gguf_option_known(key, NULL))
        return 1;
    if (!strcmp(key, "tensor_type_file") || !strcmp(key, "tensor-type-file")) {
        qd_reply_error(err, 400, "bad_request", "tensor_type_file reads a file of the server's: give the entries as "
                       "tensor_type (PATTERN=TYPE, repeated)");
        return -1;
    }
    if (!r->gguf) {
        if (!(r->gguf = malloc(sizeof *r->gguf))) {
            qd_reply_error(err, 503, "out_of_memory", "no memory");
            return -1;
        }
        qd_gguf_options_init(r->gguf);
    }
    char msg[512];
    if (qd_gguf_option_set(r->gguf, key, value, msg, sizeof msg)) {
        qd_reply_error(err, 400, "bad_param", "%s", msg);
        return -1;
    }
    return 0;
}

/* A job body's member that is one of llama-quantize's options: a flag as true/false, a value
 * as a string; the repeatable ones (tensor_type, override_kv, include_weights,
 * exclude_weights) also as a list of strings, prune_layers as a list of layer numbers,
 * split_max_tensors as a number. 1 when it is none, 0 when set, -1 with the 400. */
static int gguf_option_json(struct qd_convert_request *r, const cJSON *it, struct qd_reply *err)
{
    int takes_value;
    if (!qd_gguf_option_known(it->string, &takes_value))
        return 1;
    const int prune = !strcmp(it->string, "prune_layers");
    const int repeatable = !strcmp(it->string, "tensor_type") || !strcmp(it->string, "override_kv") ||
                           !strcmp(it->string, "include_weights") || !strcmp(it->string, "exclude_weights");
    if (!takes_value) {
        if (!cJSON_IsBool(it)) {
            qd_reply_error(err, 400, "bad_param", "%.40s takes true or false", it->string);
            return -1;
        }
        return qd_convert_gguf_option(r, it->string, cJSON_IsTrue(it) ? "true" : "false", err) < 0 ? -1 : 0;
    }
    if (cJSON_IsString(it) && strcmp(it->string, "split_max_tensors"))
        return qd_convert_gguf_option(r, it->string, it->valuestring, err) < 0 ? -1 : 0;
    if (!strcmp(it->string, "split_max_tensors")) { /* a count */
        char text[32];
        if (!cJSON_IsNumber(it) || it->valuedouble < 1 || it->valuedouble > 1e9 ||
            it->valuedouble != (double)(int)it->valuedouble) {
            qd_reply_error(err, 400, "bad_param", "split_max_tensors takes a positive integer");
            return -1;
        }
        snprintf(text, sizeof text, "%d", (int)it->valuedouble);
        return qd_convert_gguf_option(r, it->string, text, err) < 0 ? -1 : 0;
    }
    if (!cJSON_IsArray(it) || !(prune || repeatable)) {
        qd_reply_error(err, 400, "bad_param", "%.40s takes a string%s", it->string,
                       prune ? " (\"1,5\") or a list of layer numbers" : repeatable ? " or a list of strings" : "");
        return -1;
    }
    char layers[4096] = "";
    size_t at = 0;
    const cJSON *one;
    cJSON_ArrayForEach(one, it) {
        if (prune ? !cJSON_IsNumber(one) || one->valuedouble < 0 || one->valuedouble > 1e6 ||
                        one->valuedouble != (double)(int)one->valuedouble
                  : !cJSON_IsString(one)) {
            qd_reply_error(err, 400, "bad_param", "%.40s: every item is %s", it->string,
                           prune ? "a layer number (0, 1, ...)" : "a string");
            return -1;
        }
        if (!prune && qd_convert_gguf_option(r, it->string, one->valuestring, err) < 0)
            return -1;
        if (prune && at < sizeof layers - 16)
            at += (size_t)snprintf(layers + at, sizeof layers - at, "%s%d", at ? "," : "", (int)one->valuedouble);
    }
    if (prune && at && qd_convert_gguf_option(r, it->string, layers, err) < 0)
        return -1;
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
    if (!r || !(r->root = strdup(root))) {
        cJSON_Delete(o);
        free(r);
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        return NULL;
    }
    r->spool_fd[0] = r->spool_fd[1] = -1;
    if (body && json_has_nul(body, len)) {
        qd_reply_error(err, 400, "bad_request", "the request holds a NUL character (\\u0000): paths and names "
                       "cannot contain one");
        goto bad;
    }
    if (!cJSON_IsObject(o)) {
        qd_reply_error(err, 400, "bad_json", "the body must be a JSON object {\"source\", \"destination\", \"fmt\", ...}");
        goto bad;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        static const char *const keys[] = {"source", "destination", "fmt", "recipe", "params", "skip", "only",
                                           "overwrite", NULL};
        int known = 0;
        for (const char *const *k = keys; *k; k++)
            known |= !strcmp(it->string, *k);
        if (!known && strchr(it->string, '-') == NULL) { /* llama-quantize's options, spelled with '_' */
            int rc = gguf_option_json(r, it, err);
            if (rc < 0)
                goto bad;
            known = rc == 0;
        }
        if (!known) {
            qd_reply_error(err, 400, "bad_request", "unknown field '%.64s' in the convert request", it->string);
            goto bad;
        }
    }
    const char *fmt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "fmt"));
    const cJSON *recipe = cJSON_GetObjectItemCaseSensitive(o, "recipe");
    if (q->fmt_name[0]) /* the query's fmt, which names no format (the query wins) */
        fmt = q->fmt_name;
    if (recipe) { /* a llama-quantize mix: its default type is the format (none for F16, BF16, F32, COPY) */
        const struct qd_gguf_recipe *mix = qd_gguf_recipe_find(cJSON_GetStringValue(recipe));
        if (!mix) {
            if (cJSON_IsString(recipe))
                qd_convert_name_error(err, recipe->valuestring, 1);
            else
                qd_reply_error(err, 400, "unknown_recipe", "recipe must be a string (quantd writes %s)",
                               qd_gguf_recipe_names());
            goto bad;
        }
        if (fmt || q->f) {
            qd_reply_error(err, 400, "bad_request", "give fmt or recipe, not both (a recipe chooses each tensor's format)");
            goto bad;
        }
        r->recipe = strdup(mix->name);
        fmt = mix->fmt;
    }
    /* bf16|f16|f32: back to float, no format */
    if (!q->f && fmt && !qd_convert_format_named(fmt))
        r->to_float = qd_convert_to_float_named(fmt);
    r->f = r->to_float ? NULL : qd_convert_format(q->f ? q->f : fmt ? qd_format_find(fmt) : NULL);
    if (!r->f && !r->to_float && !r->recipe) {
        if (fmt)
            qd_convert_name_error(err, fmt, 0);
        else
            qd_reply_error(err, 400, "unknown_format", "fmt (or recipe) is missing (GET /formats lists them)");
        goto bad;
    }
    char msg[512];
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "params");
    if (!r->f) { /* nothing is quantized: no quantizer to take parameters */
        if (q->nparams || (params && !(cJSON_IsObject(params) && !params->child))) {
            qd_reply_error(err, 400, "bad_param", "%s%s takes no params (it quantizes nothing)",
                           r->to_float ? "fmt " : "the recipe ", r->to_float ? r->to_float : r->recipe);
            goto bad;
        }
    } else {
        qd_params_default(r->f, &r->params);
        if (qd_params_from_json(r->f, &r->params, params, msg, sizeof msg) != QD_OK) {
            qd_reply_error(err, 400, "bad_param", "%s", msg);
            goto bad;
        }
        for (int i = 0; i < q->nparams; i++) /* the query wins, as on the other routes */
            if (set_param(r, q->param_key[i], q->param_value[i], err))
                goto bad;
    }
    const cJSON *skip = cJSON_GetObjectItemCaseSensitive(o, "skip"), *only = cJSON_GetObjectItemCaseSensitive(o, "only");
    if ((skip && !cJSON_IsString(skip)) || (only && !cJSON_IsString(only))) {
        qd_reply_error(err, 400, "bad_request", "skip and only must be strings (POSIX extended regexes)");
        goto bad;
    }
    r->skip = skip ? strdup(skip->valuestring) : NULL;
    r->only = only ? strdup(only->valuestring) : NULL;
    if (!(r->filter = qd_name_filter_new(r->skip, r->only, msg, sizeof msg))) {
        qd_reply_error(err, 400, "bad_request", "%s", msg);
        goto bad;
    }
    const cJSON *overwrite = cJSON_GetObjectItemCaseSensitive(o, "overwrite");
    if (overwrite && !cJSON_IsBool(overwrite)) {
        qd_reply_error(err, 400, "bad_request", "overwrite must be true or false");
        goto bad;
    }
    r->overwrite = cJSON_IsTrue(overwrite);
    const char *source = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "source"));
    if (confine(root, "source", source, 1, &r->src, err) ||
        confine(root, "destination", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "destination")), 0,
                &r->dst, err))
        goto bad;
    struct stat sst;
    if (stat(r->src, &sst) == 0 && S_ISDIR(sst.st_mode) && check_source_dir(root, r->src, source, err))
        goto bad;
    if (r->gguf && r->gguf->imatrix) { /* opened in the data directory; the file records the name given */
        free(r->gguf->imatrix_path);
        r->gguf->imatrix_path = NULL;
        if (confine(root, "imatrix", r->gguf->imatrix, 1, &r->gguf->imatrix_path, err))
            goto bad;
    }
    /* the engine's own check: the source's kind for the format, the destination usable */
    struct qd_convert_opts co = {.src = r->src, .dst = r->dst, .f = r->f, .to_float = r->to_float,
                                 .params = r->params, .skip = r->skip, .only = r->only, .recipe = r->recipe,
                                 .overwrite = r->overwrite, .root = r->root, .gguf = r->gguf};
    struct qd_convert_dest d;
    enum qd_status st;
    char why[1024];
    if (qd_convert_check(&co, &d, &st, why, sizeof why)) {
        scrub_request(r, why, sizeof why);
        if (d.conflict)
            qd_reply_error(err, 409, "exists", "%s", why);
        else
            qd_reply_error(err, qd_status_http(st), qd_status_code(st), "%s", why);
        goto bad;
    }
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
        for (int i = 0; i < 2; i++)
            if (i ? r->dst : r->src) {
                unlink(i ? r->dst : r->src);
                qd_temp_forget(i ? r->dst : r->src);
            }
        for (int i = 0; i < 2; i++)
            if (r->spool_fd[i] >= 0)
                close(r->spool_fd[i]);
    }
    free(r->root);
    free(r->src);
    free(r->dst);
    free(r->skip);
    free(r->only);
    qd_name_filter_free(r->filter);
    if (r->gguf)
        qd_gguf_options_free(r->gguf);
    free(r->gguf);
    free(r->recipe);
    free(r);
}

/* A run's progress: the job's counters, and with --dry-run each tensor's type. */
struct run {
    struct qd_job *j;
    cJSON *types; /* {name: type} when a dry run, else NULL */
};

static void on_tensor(void *ctx, const struct qd_convert_event *ev)
{
    struct run *run = ctx;
    struct qd_job *j = run->j;
    if (run->types)
        cJSON_AddStringToObject(run->types, ev->name, ev->action == QD_CONVERT_QUANTIZE ? ev->fmt
                                                      : ev->action == QD_CONVERT_CAST ? ev->fmt : "copied");
    atomic_store(&j->tensors_total, ev->count);
    atomic_store(&j->tensors_done, ev->index);
    atomic_store(&j->bytes_total, ev->in_total);
    atomic_store(&j->bytes_done, ev->in_done);
}

static void convert(struct qd_job *j, struct qd_backend *b, void *worker)
{
    const struct qd_convert_request *r = j->payload;
    struct run run = {.j = j, .types = r->gguf && r->gguf->dry_run ? cJSON_CreateObject() : NULL};
    /* (the filter exists without skip and only too: back to float, which takes neither, gets none) */
    struct qd_convert_opts o = {.src = r->src, .dst = r->dst, .f = r->f, .to_float = r->to_float,
                                .params = r->params, .skip = r->skip, .only = r->only,
                                .filter = r->to_float ? NULL : r->filter, .recipe = r->recipe, .gguf = r->gguf,
                                .max_header_bytes = r->max_header_bytes, .backend = b, .worker = worker,
                                .progress = on_tensor, .progress_ctx = &run, .cancel = &j->cancel,
                                .overwrite = r->overwrite || r->spooled, .root = r->root, .one_file = r->spooled};
    char why[256];
    qd_convert_spread(&o, why, sizeof why); /* its tensors go to every device, as the CLI's do */
    struct qd_convert_summary s;
    enum qd_status st;
    char err[1024];
    j->started_us = qd_now_us();
    int failed = qd_convert(&o, &s, &st, err, sizeof err);
    qd_convert_unspread(&o);
    /* a model's headers and plan are many small allocations, freed now: their pages go back
     * rather than stay with the worker's heap */
    malloc_trim(0);
    if (failed) {
        scrub_request(r, err, sizeof err);
        qd_metrics_convert(qd_convert_request_fmt(r), st == QD_ECANCELED ? "cancelled" : "failed", s.bytes_in,
                           s.quantized + s.copied + s.cast);
        qd_reply_error(&j->reply, qd_status_http(st), qd_status_code(st), "%s", err);
        free(s.layout_config);
        cJSON_Delete(run.types);
        return;
    }
    qd_metrics_convert(qd_convert_request_fmt(r), "ok", s.bytes_in, s.quantized + s.copied + s.cast);
    char *config = s.layout_config;
    cJSON *sum = cJSON_CreateObject();
    if (r->recipe) /* the mix asked for, as the CLI's summary has it */
        cJSON_AddStringToObject(sum, "recipe", r->recipe);
    cJSON_AddStringToObject(sum, "fmt", qd_convert_request_fmt(r));
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
    if (s.dry_run) { /* nothing written: each tensor's type and the size the file would have */
        cJSON_AddBoolToObject(sum, "dry_run", 1);
        cJSON_AddItemToObject(sum, "tensors", run.types);
        run.types = NULL;
    }
    if (!r->spooled || s.dry_run) {
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

static void convert_job_run(struct qd_job *j, struct qd_backend *b, void *worker)
{
    const double start = j->started_us;
    convert(j, b, worker);
    j->timing.queue_us = start - j->enqueued_us;
    j->timing.total_us = qd_now_us() - j->received_us;
}

static void convert_job_free(struct qd_job *j)
{
    qd_convert_request_free(j->payload);
    qd_job_answer_free(j);
}

const struct qd_job_type qd_convert_job_type = {
    .own_pool = 1, .run = convert_job_run, .free = convert_job_free, .too_large = qd_job_answer_too_large};

const char *qd_convert_request_fmt(const struct qd_convert_request *r)
{
    return r->f ? r->f->name : r->to_float ? r->to_float : r->recipe;
}

const struct qd_convert_request *qd_convert_job_request(const struct qd_job *j)
{
    return j->type == &qd_convert_job_type ? j->payload : NULL;
}
