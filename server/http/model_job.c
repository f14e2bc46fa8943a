/* Perplexity and imatrix jobs (model_job.h). */
#include "http/model_job.h"

#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "http/data_path.h"
#include "http/work_job.h"
#include "model/engine_backend.h"
#include "model/imatrix_run.h"
#include "model/model.h"
#include "model/perplexity_run.h"

#define MAX_IN_FILES 64

struct qd_model_job_request {
    int op;
    char *root;
    /* the resolved paths (the options point at them) */
    char *model, *text, *tokens, *kld_base, *output, *in_files[MAX_IN_FILES];
    char *dataset; /* the text's (or the token file's) name as the request gives it, recorded in the matrix */
    int n_in;
    int overwrite;
    char backend[8];          /* auto, cpu or cuda (engine_backend.h), resolved when the run starts */
    size_t max_device_bytes;  /* 0: the device's */
    struct qd_perplexity_opts ppl;
    struct qd_imatrix_opts imx;
    /* the progress, written by the run's worker, read by GET /jobs/{id} */
    atomic_int layers_done, layers_total, chunks_done, chunks_total, stage;
};

enum stage { STAGE_QUEUED, STAGE_LAYERS, STAGE_CHUNKS, STAGE_DONE };
static const char *const stage_names[] = {[STAGE_QUEUED] = "queued", [STAGE_LAYERS] = "layers",
                                          [STAGE_CHUNKS] = "chunks", [STAGE_DONE] = "done"};

/* ---- the request ------------------------------------------------------------------------------ */

/* The body's members: one row each, with the ops that take it (bits of 1 << op). */
enum kind { PATH_IN, PATH_OUT, KLD_BASE, IN_FILES, INT, BOOL, CACHE_TYPE, FORMAT, BACKEND, BYTES };
#define PPL (1 << QD_OP_PERPLEXITY)
#define IMX (1 << QD_OP_IMATRIX)
static const struct field {
    const char *name;
    enum kind kind;
    int ops, min; /* min: an integer's least value */
} fields[] = {
    {"model", PATH_IN, PPL | IMX, 0},        {"text", PATH_IN, PPL | IMX, 0},
    {"tokens", PATH_IN, PPL | IMX, 0},       {"ctx_size", INT, PPL | IMX, 1},
    {"chunks", INT, PPL | IMX, -1},          {"batch_size", INT, PPL | IMX, 1},
    {"threads", INT, PPL | IMX, 1},          {"cache_type_k", CACHE_TYPE, PPL | IMX, 0},
    {"cache_type_v", CACHE_TYPE, PPL | IMX, 0}, {"overwrite", BOOL, PPL | IMX, 0},
    {"backend", BACKEND, PPL | IMX, 0},      {"max_device_bytes", BYTES, PPL | IMX, 0},
    {"kl_divergence_base", KLD_BASE, PPL, 0}, {"kl_divergence", BOOL, PPL, 0},
    {"output", PATH_OUT, IMX, 0},            {"output_format", FORMAT, IMX, 0},
    {"in_file", IN_FILES, IMX, 0},           {"process_output", BOOL, IMX, 0},
    {"from_chunk", INT, IMX, 0},             {"no_ppl", BOOL, IMX, 0},
};

static const struct field *field_find(const char *name)
{
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if (!strcmp(fields[i].name, name))
            return &fields[i];
    return NULL;
}

/* The path the body gave for a field (paths: one per row of fields), or NULL. */
static const char *given(const char *const *paths, const char *name)
{
    return paths[field_find(name) - fields];
}

/* The integers and flags into the run's options. */
static int set_int(struct qd_model_job_request *r, const char *name, int v)
{
    struct qd_perplexity_opts *p = &r->ppl;
    struct qd_imatrix_opts *m = &r->imx;
    if (!strcmp(name, "ctx_size")) p->n_ctx = m->n_ctx = v;
    else if (!strcmp(name, "chunks")) p->max_chunks = m->max_chunks = v;
    else if (!strcmp(name, "batch_size")) p->n_batch = m->n_batch = v;
    else if (!strcmp(name, "threads")) p->threads = m->threads = v;
    else if (!strcmp(name, "from_chunk")) m->from_chunk = v;
    else if (!strcmp(name, "overwrite")) r->overwrite = v;
    else if (!strcmp(name, "kl_divergence")) p->kl_divergence = v;
    else if (!strcmp(name, "process_output")) m->process_output = v;
    else if (!strcmp(name, "no_ppl")) m->no_ppl = v;
    return 0;
}

/* One member, checked for its kind; a path is kept as given (confined once every member is in,
 * when whether kl_divergence_base is read or written is known). */
static int member(struct qd_model_job_request *r, const cJSON *it, const char **paths, struct qd_reply *err)
{
    const char *op = qd_op_name(r->op), *k = it->string;
    const struct field *f = field_find(k);
    if (!f || !(f->ops & (1 << r->op))) {
        qd_reply_error(err, 400, "bad_request", "unknown field '%.64s' in the %s request%s", k, op,
                       f ? " (the other job's option)" : "");
        return -1;
    }
    switch (f->kind) {
    case PATH_IN: case PATH_OUT: case KLD_BASE:
        if (!cJSON_IsString(it)) {
            qd_reply_error(err, 400, "bad_request", "%s must be a string (a path relative to --data-dir)", k);
            return -1;
        }
        paths[f - fields] = it->valuestring;
        return 0;
    case IN_FILES: {
        const cJSON *one;
        if (cJSON_IsString(it)) /* (one file; in_files() confines them) */
            return 0;
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) > MAX_IN_FILES) {
            qd_reply_error(err, 400, "bad_request", "in_file must be a path or a list of at most %d paths (relative "
                           "to --data-dir)", MAX_IN_FILES);
            return -1;
        }
        cJSON_ArrayForEach(one, it) if (!cJSON_IsString(one)) {
            qd_reply_error(err, 400, "bad_request", "in_file: every item is a path relative to --data-dir");
            return -1;
        }
        return 0;
    }
    case INT:
        if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int)it->valuedouble || it->valuedouble < f->min) {
            qd_reply_error(err, 400, "bad_param", "%s takes an integer >= %d", k, f->min);
            return -1;
        }
        return set_int(r, k, (int)it->valuedouble);
    case BOOL:
        if (!cJSON_IsBool(it)) {
            qd_reply_error(err, 400, "bad_param", "%s takes true or false", k);
            return -1;
        }
        return set_int(r, k, cJSON_IsTrue(it));
    case CACHE_TYPE: {
        enum qd_dtype t;
        if (!cJSON_IsString(it) || (strcmp(it->valuestring, "f16") && strcmp(it->valuestring, "bf16") &&
                                    strcmp(it->valuestring, "f32")) || qd_dtype_parse(it->valuestring, &t)) {
            qd_reply_error(err, 400, "bad_param", "%s takes f16, bf16 or f32 (quantized KV caches are not emulated)",
                           k);
            return -1;
        }
        *(k[11] == 'k' ? &r->ppl.cache_k : &r->ppl.cache_v) = t;
        *(k[11] == 'k' ? &r->imx.cache_k : &r->imx.cache_v) = t;
        return 0;
    }
    case BACKEND:
        if (!cJSON_IsString(it) || (strcmp(it->valuestring, "auto") && strcmp(it->valuestring, "cpu") &&
                                    strcmp(it->valuestring, "cuda"))) {
            qd_reply_error(err, 400, "bad_param", "backend takes auto, cpu or cuda");
            return -1;
        }
#ifndef QD_WITH_CUDA
        if (!strcmp(it->valuestring, "cuda")) {
            qd_reply_error(err, 400, "bad_param", "backend cuda: this quantd was built without CUDA (use auto or cpu)");
            return -1;
        }
#endif
        snprintf(r->backend, sizeof r->backend, "%s", it->valuestring);
        return 0;
    case BYTES:
        if (cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < 1e18 &&
            it->valuedouble == (double)(long long)it->valuedouble) {
            r->max_device_bytes = (size_t)it->valuedouble;
            return 0;
        }
        if (!cJSON_IsString(it) || qd_parse_bytes(it->valuestring, &r->max_device_bytes)) {
            qd_reply_error(err, 400, "bad_param", "max_device_bytes takes a byte count (4294967296, or \"4GiB\")");
            return -1;
        }
        return 0;
    case FORMAT:
        if (!cJSON_IsString(it) || (strcmp(it->valuestring, "gguf") && strcmp(it->valuestring, "dat"))) {
            qd_reply_error(err, 400, "bad_param", "output_format takes gguf or dat");
            return -1;
        }
        r->imx.format = strcmp(it->valuestring, "gguf") ? 2 : 1;
        return 0;
    }
    return 0;
}

/* An output: confined, not an existing file unless overwrite, never one of the inputs. */
static int output_path(struct qd_model_job_request *r, const char *what, const char *rel, char **out,
                       struct qd_reply *err)
{
    if (qd_data_path_confine(r->root, what, rel, 0, out, err))
        return -1;
    struct stat st, in;
    if (stat(*out, &st) == 0 && S_ISDIR(st.st_mode)) {
        qd_reply_error(err, 400, "bad_request", "%s '%.200s' is a directory: name a file", what, rel);
        return -1;
    }
    if (stat(*out, &st) == 0 && !r->overwrite) {
        qd_reply_error(err, 409, "exists", "%s '%.200s' exists: quantd replaces an existing output only when asked "
                       "(\"overwrite\": true)", what, rel);
        return -1;
    }
    const char *inputs[] = {r->model, r->text, r->tokens};
    for (int i = 0; i < 3; i++)
        if (inputs[i] && stat(*out, &st) == 0 && stat(inputs[i], &in) == 0 && st.st_ino == in.st_ino &&
            st.st_dev == in.st_dev) {
            qd_reply_error(err, 400, "bad_request", "%s '%.200s' names an input of the job: give it a file of its own",
                           what, rel);
            return -1;
        }
    return 0;
}

/* What the command line refuses before a run, in the request's words. */
static int check_options(const struct qd_model_job_request *r, const char *const *paths, const cJSON *in_file,
                         struct qd_reply *err)
{
    const int has_tokens = given(paths, "text") || given(paths, "tokens");
    if (r->op == QD_OP_PERPLEXITY) {
        if (r->ppl.kl_divergence && !given(paths, "kl_divergence_base")) {
            qd_reply_error(err, 400, "bad_request", "kl_divergence needs kl_divergence_base, the base model's "
                           "log-probabilities (written by a perplexity job with kl_divergence_base alone)");
            return -1;
        }
        if (!given(paths, "model") || (!r->ppl.kl_divergence && !has_tokens)) {
            qd_reply_error(err, 400, "bad_request", "%s is required", !given(paths, "model") ? "model" : "text or tokens");
            return -1;
        }
        if (r->ppl.n_ctx == 1) {
            qd_reply_error(err, 400, "bad_param", "ctx_size takes an integer >= 2");
            return -1;
        }
        return 0;
    }
    if (!has_tokens && !in_file) {
        qd_reply_error(err, 400, "bad_request", "give text or tokens (and model) to compute an importance matrix, or "
                       "in_file to combine earlier ones");
        return -1;
    }
    if (has_tokens && !given(paths, "model")) {
        qd_reply_error(err, 400, "bad_request", "model is required with text or tokens");
        return -1;
    }
    if (!given(paths, "output")) {
        qd_reply_error(err, 400, "bad_request", "output is missing (the importance matrix's file, a path relative to "
                       "--data-dir)");
        return -1;
    }
    return 0;
}

/* The in_file paths, each confined (one path each: a comma would split it in the run). */
static int in_files(struct qd_model_job_request *r, const cJSON *it, struct qd_reply *err)
{
    const cJSON *one;
    const int single = cJSON_IsString(it);
    for (one = single ? it : it->child; one; one = single ? NULL : one->next) {
        if (strchr(one->valuestring, ',')) {
            qd_reply_error(err, 400, "bad_request", "in_file '%.200s' holds a comma: give the files as a list",
                           one->valuestring);
            return -1;
        }
        if (qd_data_path_confine(r->root, "in_file", one->valuestring, 1, &r->in_files[r->n_in], err))
            return -1;
        r->n_in++;
    }
    return 0;
}

/* The model as the engine would open it: its architecture, hyperparameters, vocabulary and block
 * tensors (model.h), so that a model it cannot run is refused before the job. */
static int check_model(const struct qd_model_job_request *r, struct qd_reply *err)
{
    struct qd_model m;
    enum qd_status st;
    char msg[1024];
    int rc = qd_model_open(r->model, &m, &st, msg, sizeof msg);
    qd_model_close(&m);
    if (rc) {
        qd_data_path_unroot(r->root, msg, sizeof msg);
        qd_reply_error(err, st == QD_ENOMEM ? 503 : 400, st == QD_ENOMEM ? "out_of_memory" : "bad_model", "model: %s",
                       msg);
        return -1;
    }
    return 0;
}

struct qd_model_job_request *qd_model_job_parse(int op, const char *data_dir, const struct qd_kv *query, int nquery,
                                                const char *body, size_t len, struct qd_reply *err)
{
    char root[PATH_MAX];
    if (!data_dir || !*data_dir || !realpath(data_dir, root)) {
        qd_reply_error(err, 403, "forbidden", "%s jobs are off: start quantd serve with --data-dir (their files are "
                       "read and written there)", qd_op_name(op));
        return NULL;
    }
    for (int i = 0; i < nquery; i++)
        if (strcmp(query[i].key, "op")) {
            qd_reply_error(err, 400, "bad_request", "unknown query parameter '%.64s': a %s job takes its options in "
                           "the JSON body", query[i].key, qd_op_name(op));
            return NULL;
        }
    struct qd_model_job_request *r = calloc(1, sizeof *r);
    cJSON *o = cJSON_ParseWithLength(body ? body : "", len);
    if (!r || !(r->root = strdup(root))) {
        cJSON_Delete(o);
        qd_model_job_free(r);
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        return NULL;
    }
    r->op = op;
    snprintf(r->backend, sizeof r->backend, "auto");
    r->ppl.max_chunks = r->imx.max_chunks = -1;
    r->ppl.cache_k = r->ppl.cache_v = r->imx.cache_k = r->imx.cache_v = QD_F16; /* llama.cpp's default */
    const char *paths[sizeof fields / sizeof *fields] = {0};
    if (body && qd_data_path_json_has_nul(body, len)) {
        qd_reply_error(err, 400, "bad_request", "the request holds a NUL character (\\u0000): paths cannot contain "
                       "one");
        goto bad;
    }
    if (!cJSON_IsObject(o)) {
        qd_reply_error(err, 400, "bad_json", "the body must be a JSON object {\"model\", \"text\" or \"tokens\", ...}");
        goto bad;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, o) if (member(r, it, paths, err)) goto bad;
    const cJSON *in_file = cJSON_GetObjectItemCaseSensitive(o, "in_file");
    if (check_options(r, paths, in_file, err))
        goto bad;
    const char *model = given(paths, "model"), *text = given(paths, "text"), *tokens = given(paths, "tokens");
    const char *base = given(paths, "kl_divergence_base"), *output = given(paths, "output");
    if ((model && qd_data_path_confine(root, "model", model, 1, &r->model, err)) ||
        (text && qd_data_path_confine(root, "text", text, 1, &r->text, err)) ||
        (tokens && qd_data_path_confine(root, "tokens", tokens, 1, &r->tokens, err)) ||
        (in_file && in_files(r, in_file, err)))
        goto bad;
    /* the base logits: read with kl_divergence, else written */
    if (base && (r->ppl.kl_divergence ? qd_data_path_confine(root, "kl_divergence_base", base, 1, &r->kld_base, err)
                                      : output_path(r, "kl_divergence_base", base, &r->kld_base, err)))
        goto bad;
    if (output && output_path(r, "output", output, &r->output, err))
        goto bad;
    if (r->model && check_model(r, err))
        goto bad;
    r->ppl.model = r->imx.model = r->model;
    r->ppl.text = r->imx.text = r->text;
    r->imx.dataset = text ? text : tokens; /* (as the client names it) */
    r->ppl.tokens = r->imx.tokens = r->tokens;
    r->ppl.kld_base = r->kld_base;
    r->imx.output = r->output;
    r->imx.in_files = (const char *const *)r->in_files;
    r->imx.n_in_files = r->n_in;
    if (r->imx.dataset && !(r->imx.dataset = r->dataset = strdup(r->imx.dataset))) {
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        goto bad;
    }
    cJSON_Delete(o);
    return r;
bad:
    cJSON_Delete(o);
    qd_model_job_free(r);
    return NULL;
}

void qd_model_job_free(struct qd_model_job_request *r)
{
    if (!r)
        return;
    free(r->root);
    free(r->model), free(r->text), free(r->tokens), free(r->kld_base), free(r->output), free(r->dataset);
    for (int i = 0; i < r->n_in; i++)
        free(r->in_files[i]);
    free(r);
}

/* ---- the run ---------------------------------------------------------------------------------- */

static void on_progress(void *ctx, const struct qd_run_progress *p)
{
    struct qd_model_job_request *r = ctx;
    atomic_store(&r->layers_done, p->layers_done);
    atomic_store(&r->layers_total, p->layers_total);
    atomic_store(&r->chunks_done, p->chunks_done);
    atomic_store(&r->chunks_total, p->chunks_total);
    atomic_store(&r->stage, !strcmp(p->stage, "layers") ? STAGE_LAYERS : !strcmp(p->stage, "chunks") ? STAGE_CHUNKS
                                                                                                       : STAGE_DONE);
}

/* Runs of the model take turns: the engine's device backend is one per process (one stream, one
 * memory limit). */
static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;

static void model_job_run(struct qd_job *j, struct qd_backend *b, void *worker)
{
    struct qd_model_job_request *r = j->payload;
    j->started_us = qd_now_us();
    const struct qd_run_io io = {.ctx = r, .progress = on_progress, .cancel = &j->cancel};
    char err[1024];
    cJSON *summary = NULL;
    enum qd_status st;
    pthread_mutex_lock(&run_lock);
    const struct qd_nn_backend *nn = NULL;
    if (qd_engine_backend(r->backend, r->max_device_bytes, &nn, err, sizeof err)) {
        st = QD_EDEVICE; /* (no device answers: the job's error) */
    } else if (r->op == QD_OP_PERPLEXITY) {
        r->ppl.nn = nn;
        r->ppl.io = io;
        st = qd_perplexity_run(&r->ppl, &summary, err, sizeof err);
    } else {
        r->imx.nn = nn;
        r->imx.io = io;
        st = qd_imatrix_run(&r->imx, &summary, err, sizeof err);
    }
    pthread_mutex_unlock(&run_lock);
    malloc_trim(0); /* (a model's blocks in f32 are large allocations; their pages go back now) */
    if (st == QD_OK) /* (a run that only combines matrices has no blocks to report) */
        atomic_store(&r->stage, STAGE_DONE);
    if (st != QD_OK) {
        qd_data_path_unroot(r->root, err, sizeof err);
        qd_reply_error(&j->reply, qd_status_http(st), qd_status_code(st), "%s", err);
    } else {
        if (!cJSON_HasObjectItem(summary, "backend")) /* (matrices only combined: no engine ran) */
            cJSON_AddStringToObject(summary, "backend", "cpu");
        /* the process's peak memory is the daemon's, not the run's (conversion jobs leave it out too) */
        cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(summary, "memory"), "peak_rss_bytes");
        char *printed = cJSON_PrintUnformatted(summary);
        const size_t cap = printed ? strlen(printed) + PATH_MAX : 0; /* (room: "--data-dir" may be longer) */
        char *text = printed ? realloc(printed, cap) : NULL;
        if (!text)
            free(printed);
        else /* the server's paths out */
            qd_data_path_unroot(r->root, text, cap);
        if (text)
            qd_reply_take(&j->reply, 200, "application/json", text, strlen(text));
        else
            qd_reply_error(&j->reply, 503, "out_of_memory", "no memory for the summary");
    }
    cJSON_Delete(summary);
    j->timing.queue_us = j->started_us - j->enqueued_us;
    j->timing.total_us = qd_now_us() - j->received_us;
}

static void model_job_free(struct qd_job *j)
{
    qd_model_job_free(j->payload);
    qd_job_answer_free(j);
}

const struct qd_job_type qd_model_job_type = {
    .own_pool = 1, .run = model_job_run, .free = model_job_free, .too_large = qd_job_answer_too_large};

void qd_model_job_progress_json(const struct qd_job *j, cJSON *o)
{
    if (j->type != &qd_model_job_type)
        return;
    const struct qd_model_job_request *r = j->payload;
    cJSON *p = cJSON_AddObjectToObject(o, "progress");
    cJSON_AddStringToObject(p, "stage", stage_names[atomic_load(&r->stage)]);
    cJSON_AddNumberToObject(p, "layers_done", atomic_load(&r->layers_done));
    cJSON_AddNumberToObject(p, "layers_total", atomic_load(&r->layers_total));
    cJSON_AddNumberToObject(p, "chunks_done", atomic_load(&r->chunks_done));
    cJSON_AddNumberToObject(p, "chunks_total", atomic_load(&r->chunks_total));
}
