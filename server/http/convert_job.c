/* Conversion jobs (convert_job.h). */
#include "http/convert_job.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/convert.h"
#include "checkpoint/convert_request.h"
#include "http/data_path.h"
#include "http/work_job.h"
#include "common/metrics.h"

/* The server's paths out of an engine message: the data directory's become relative to it. */
static void scrub_request(const struct qd_convert_request *r, char *msg, size_t cap)
{
    if (r->spooled) {
        qd_data_path_scrub(msg, cap, r->src, "the uploaded model");
        qd_data_path_scrub(msg, cap, r->dst, "the converted file");
    }
    if (r->root)
        qd_data_path_unroot(r->root, msg, cap);
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

/* The texts a request's items are made of, held until it is resolved. */
struct texts {
    char **p;
    int n, cap;
};

static const char *keep(struct texts *t, char *text)
{
    if (text && t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 16;
        char **p = realloc(t->p, (size_t)cap * sizeof *p);
        if (!p) {
            free(text);
            return NULL;
        }
        t->p = p, t->cap = cap;
    }
    if (text)
        t->p[t->n++] = text;
    return text;
}

static void texts_free(struct texts *t)
{
    for (int i = 0; i < t->n; i++)
        free(t->p[i]);
    free(t->p);
}

/* A request's items, growing (the body's members and the query's keys). */
struct items {
    struct qd_convert_arg *a;
    int n, cap;
    struct texts texts;
};

static int add(struct items *it, const char *key, const char *value, struct qd_reply *err)
{
    if (it->n == it->cap) {
        int cap = it->cap ? 2 * it->cap : 32;
        struct qd_convert_arg *a = realloc(it->a, (size_t)cap * sizeof *a);
        if (!a) {
            qd_reply_error(err, 503, "out_of_memory", "no memory");
            return -1;
        }
        it->a = a, it->cap = cap;
    }
    it->a[it->n++] = (struct qd_convert_arg){key, value};
    return 0;
}

static void items_free(struct items *it)
{
    free(it->a);
    texts_free(&it->texts);
}

/* A JSON scalar as the command line would write it: true/false, a whole number without a
 * point, a string as it is; NULL for another type (or without memory). */
static char *json_text(const cJSON *v)
{
    char buf[64];
    if (cJSON_IsBool(v))
        return strdup(cJSON_IsTrue(v) ? "true" : "false");
    if (cJSON_IsString(v))
        return strdup(v->valuestring);
    if (!cJSON_IsNumber(v))
        return NULL;
    double x = v->valuedouble;
    if (x == (double)(long long)x && fabs(x) < 1e15)
        snprintf(buf, sizeof buf, "%lld", (long long)x);
    else
        snprintf(buf, sizeof buf, "%.17g", x);
    return strdup(buf);
}

/* A query parameter or a body member that HTTP does not take, though the command line does:
 * tensor_type_file reads a file of the server's. 1 when key is such, with the 400 in err. */
static int http_refuses(const char *key, struct qd_reply *err)
{
    if (strcmp(key, "tensor_type_file") && strcmp(key, "tensor-type-file"))
        return 0;
    qd_reply_error(err, 400, "bad_request", "tensor_type_file reads a file of the server's: give the entries as "
                   "tensor_type (PATTERN=TYPE, repeated)");
    return 1;
}

/* A job body's member that is one of llama-quantize's options, as items: a flag as true/false,
 * a value as a string; the repeatable ones (tensor_type, override_kv, include_weights,
 * exclude_weights) also as a list of strings, prune_layers as a list of layer numbers,
 * split_max_tensors as a number. -1 with the 400. */
static int gguf_option_json(struct items *items, const cJSON *it, struct qd_reply *err)
{
    int takes_value;
    qd_gguf_option_known(it->string, &takes_value);
    const int prune = !strcmp(it->string, "prune_layers");
    const int repeatable = !strcmp(it->string, "tensor_type") || !strcmp(it->string, "override_kv") ||
                           !strcmp(it->string, "include_weights") || !strcmp(it->string, "exclude_weights");
    if (http_refuses(it->string, err))
        return -1;
    if (!takes_value && !cJSON_IsBool(it)) {
        qd_reply_error(err, 400, "bad_param", "%.40s takes true or false", it->string);
        return -1;
    }
    if (!takes_value || (cJSON_IsString(it) && strcmp(it->string, "split_max_tensors")) ||
        (cJSON_IsNumber(it) && !strcmp(it->string, "split_max_tensors"))) {
        const char *text = keep(&items->texts, json_text(it));
        if (!text) {
            qd_reply_error(err, 503, "out_of_memory", "no memory");
            return -1;
        }
        return add(items, it->string, text, err);
    }
    if (!strcmp(it->string, "split_max_tensors")) {
        qd_reply_error(err, 400, "bad_param", "split_max_tensors takes a positive integer");
        return -1;
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
        if (!prune && add(items, it->string, one->valuestring, err))
            return -1;
        if (prune && at < sizeof layers - 16)
            at += (size_t)snprintf(layers + at, sizeof layers - at, "%s%d", at ? "," : "", (int)one->valuedouble);
    }
    const char *text = prune && at ? keep(&items->texts, strdup(layers)) : NULL;
    if (prune && at && !text) {
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        return -1;
    }
    return prune && at ? add(items, it->string, text, err) : 0;
}

/* The body's "params" object, each member a "param" item k=v. */
static int params_json(struct items *items, const cJSON *params, struct qd_reply *err)
{
    if (!cJSON_IsObject(params)) {
        qd_reply_error(err, 400, "bad_param", "params must be a JSON object");
        return -1;
    }
    const cJSON *p;
    cJSON_ArrayForEach(p, params) {
        char *v = json_text(p), *kv = NULL;
        if (!cJSON_IsBool(p) && !cJSON_IsNumber(p) && !cJSON_IsString(p)) {
            free(v);
            qd_reply_error(err, 400, "bad_param", "parameter %.40s must be a number, boolean or string", p->string);
            return -1;
        }
        size_t n = v ? strlen(p->string) + strlen(v) + 2 : 0;
        if (v && (kv = malloc(n)))
            snprintf(kv, n, "%s=%s", p->string, v);
        free(v);
        if (!keep(&items->texts, kv)) {
            qd_reply_error(err, 503, "out_of_memory", "no memory");
            return -1;
        }
        if (add(items, "param", kv, err))
            return -1;
    }
    return 0;
}

/* The request's items from the JSON body (its own members: source, destination and overwrite
 * into r), then the query's (which come later, so win). -1 with the 400. */
static int request_items(struct qd_convert_request *r, const cJSON *o, const struct qd_kv *query, int nquery,
                         struct items *items, const char **source, const char **destination, struct qd_reply *err)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        const char *k = it->string;
        if (!strcmp(k, "source") || !strcmp(k, "destination")) {
            if (!cJSON_IsString(it)) {
                qd_reply_error(err, 400, "bad_request", "%s must be a string (a path relative to --data-dir)", k);
                return -1;
            }
            *(k[0] == 's' ? source : destination) = it->valuestring;
        } else if (!strcmp(k, "overwrite")) {
            if (!cJSON_IsBool(it)) {
                qd_reply_error(err, 400, "bad_request", "overwrite must be true or false");
                return -1;
            }
            r->overwrite = cJSON_IsTrue(it);
        } else if (!strcmp(k, "fmt") || !strcmp(k, "recipe") || !strcmp(k, "skip") || !strcmp(k, "only")) {
            if (!cJSON_IsString(it)) {
                qd_reply_error(err, 400, !strcmp(k, "fmt") ? "unknown_format" : !strcmp(k, "recipe") ?
                               "unknown_recipe" : "bad_request", "%s must be a string%s", k,
                               k[0] == 's' || k[0] == 'o' ? " (a POSIX extended regex)" : "");
                return -1;
            }
            if (add(items, k, it->valuestring, err))
                return -1;
        } else if (!strcmp(k, "params")) {
            if (params_json(items, it, err))
                return -1;
        } else if (!strchr(k, '-') && qd_gguf_option_known(k, NULL)) { /* llama-quantize's, spelled with '_' */
            if (gguf_option_json(items, it, err))
                return -1;
        } else {
            qd_reply_error(err, 400, "bad_request", "unknown field '%.64s' in the convert request", k);
            return -1;
        }
    }
    for (int i = 0; i < nquery; i++) {
        if (!strcmp(query[i].key, "op"))
            continue;
        if (http_refuses(query[i].key, err) || add(items, query[i].key, query[i].value, err))
            return -1;
    }
    return 0;
}

void qd_convert_resolve_error(const struct qd_convert_spec *spec, enum qd_status st, const char *msg,
                              struct qd_reply *err)
{
    if (st == QD_ENOMEM)
        qd_reply_error(err, 503, "out_of_memory", "%s", msg);
    else
        qd_reply_error(err, 400, spec->code ? spec->code : "bad_request", "%s", msg);
}

struct qd_convert_request *qd_convert_request_parse(const char *data_dir, const struct qd_kv *query, int nquery,
                                                    const char *body, size_t len, struct qd_reply *err)
{
    char root[PATH_MAX];
    if (!data_dir || !*data_dir || !realpath(data_dir, root)) {
        qd_reply_error(err, 403, "forbidden", "conversions are off: start quantd serve with --data-dir");
        return NULL;
    }
    cJSON *o = cJSON_ParseWithLength(body ? body : "", len);
    struct qd_convert_request *r = calloc(1, sizeof *r);
    struct items items = {0};
    if (!r || !(r->root = strdup(root)) || !(r->spec = qd_convert_spec_new())) {
        cJSON_Delete(o);
        qd_convert_request_free(r);
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        return NULL;
    }
    r->spool_fd[0] = r->spool_fd[1] = -1;
    if (body && qd_data_path_json_has_nul(body, len)) {
        qd_reply_error(err, 400, "bad_request", "the request holds a NUL character (\\u0000): paths and names "
                       "cannot contain one");
        goto bad;
    }
    if (!cJSON_IsObject(o)) {
        qd_reply_error(err, 400, "bad_json", "the body must be a JSON object {\"source\", \"destination\", \"fmt\", ...}");
        goto bad;
    }
    const char *source = NULL, *destination = NULL;
    if (request_items(r, o, query, nquery, &items, &source, &destination, err))
        goto bad;
    char msg[1024];
    enum qd_status rs = qd_convert_resolve(r->spec, items.a, items.n, msg, sizeof msg);
    if (rs != QD_OK) {
        qd_convert_resolve_error(r->spec, rs, msg, err);
        goto bad;
    }
    if (qd_data_path_confine(root, "source", source, 1, &r->src, err) || qd_data_path_confine(root, "destination", destination, 0, &r->dst, err))
        goto bad;
    struct stat sst;
    if (stat(r->src, &sst) == 0 && S_ISDIR(sst.st_mode) && check_source_dir(root, r->src, source, err))
        goto bad;
    struct qd_gguf_options *gguf = &r->spec->gguf;
    if (gguf->imatrix) { /* opened in the data directory; the file records the name given */
        free(gguf->imatrix_path);
        gguf->imatrix_path = NULL;
        if (qd_data_path_confine(root, "imatrix", gguf->imatrix, 1, &gguf->imatrix_path, err))
            goto bad;
    }
    /* the engine's own check: the source's kind for the format, the destination usable */
    struct qd_convert_opts co = {.src = r->src, .dst = r->dst, .overwrite = r->overwrite, .root = r->root};
    qd_convert_spec_opts(r->spec, &co);
    struct qd_convert_dest d;
    enum qd_status st;
    if (qd_convert_check(&co, &d, &st, msg, sizeof msg)) {
        scrub_request(r, msg, sizeof msg);
        if (d.conflict)
            qd_reply_error(err, 409, "exists", "%s", msg);
        else
            qd_reply_error(err, qd_status_http(st), qd_status_code(st), "%s", msg);
        goto bad;
    }
    items_free(&items);
    cJSON_Delete(o);
    return r;
bad:
    items_free(&items);
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
    qd_convert_spec_free(r->spec);
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
    struct run run = {.j = j, .types = r->spec->gguf.dry_run ? cJSON_CreateObject() : NULL};
    struct qd_convert_opts o = {.src = r->src, .dst = r->dst, .max_header_bytes = r->max_header_bytes, .backend = b,
                                .worker = worker, .progress = on_tensor, .progress_ctx = &run, .cancel = &j->cancel,
                                .overwrite = r->overwrite || r->spooled, .root = r->root, .one_file = r->spooled};
    qd_convert_spec_opts(r->spec, &o);
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
    cJSON *sum = qd_convert_summary_json(r->spec, &s, j->backend);
    if (s.dry_run) { /* nothing written: each tensor's type */
        cJSON_AddItemToObject(sum, "tensors", run.types);
        run.types = NULL;
    }
    cJSON_Delete(run.types);
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
    return qd_convert_spec_fmt(r->spec);
}

const struct qd_convert_request *qd_convert_job_request(const struct qd_job *j)
{
    return j->type == &qd_convert_job_type ? j->payload : NULL;
}
