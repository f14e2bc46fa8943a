/* Request decoding (see decode.h). Every check here answers 400 (malformed request) or 422 (a
 * well-formed request the format cannot take), with a message naming what to change. */
#include "http/decode.h"
#include "queue/hostmem.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ERRLEN 512

int qd_req_from_query(struct qd_req *q, const struct qd_kv *kv, int n, int allow_op,
                      struct qd_reply *err)
{
    char msg[ERRLEN];
    /* the op, by its name in the ops' table (work.h) */
    int seen = -1;
    for (int i = 0; allow_op && i < n; i++) {
        if (strcmp(kv[i].key, "op"))
            continue;
        const char *v = kv[i].value ? kv[i].value : "";
        int op = 0;
        while (qd_op_name(op) && strcmp(qd_op_name(op), v))
            op++;
        if (!qd_op_name(op)) {
            char names[256] = "";
            for (int k = 0; qd_op_name(k); k++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", qd_op_name(k));
            qd_reply_error(err, 400, "bad_op", "op must be one of %s (got '%.64s')", names, v);
            return -1;
        }
        if (seen >= 0 && seen != op && (qd_op_names_files(seen) || qd_op_names_files(op))) {
            qd_reply_error(err, 400, "bad_op", "op is given twice (%s and '%.64s')", qd_op_name(seen), v);
            return -1;
        }
        q->op = (enum qd_op)(seen = op);
    }
    /* a whole-model job's query is its request's (convert_job.c, model_job.c resolve it with
     * its body): nothing more of it is read here */
    if (qd_op_names_files(q->op))
        return 0;
    /* fmt first: whether another key is a parameter depends on it */
    for (int i = 0; i < n; i++) {
        const char *k = kv[i].key, *v = kv[i].value ? kv[i].value : "";
        if (!strcmp(k, "fmt")) {
            if (!(q->f = qd_format_find(v))) {
                qd_reply_error(err, 400, "unknown_format", "unknown format '%.64s' (GET /formats lists them)", v);
                return -1;
            }
        }
    }
    struct qd_params scratch;
    if (q->f)
        qd_params_default(q->f, &scratch);
    for (int i = 0; i < n; i++) {
        const char *k = kv[i].key, *v = kv[i].value ? kv[i].value : "";
        if (!strcmp(k, "fmt") || (!strcmp(k, "op") && allow_op))
            continue;
        if (!strcmp(k, "dtype")) {
            if (qd_dtype_parse(v, &q->dtype) || !qd_dtype_is_float_input(q->dtype)) {
                qd_reply_error(err, 400, "unknown_dtype", "dtype must be f32, f16 or bf16 (got '%.64s')", v);
                return -1;
            }
            q->has_dtype = 1;
        } else if (!strcmp(k, "shape")) {
            if (qd_shape_parse(v, &q->ndim, q->shape, msg, sizeof msg) != QD_OK) {
                qd_reply_error(err, 400, "bad_shape", "%s", msg);
                return -1;
            }
            q->has_shape = 1;
        } else if (!strcmp(k, "report")) {
            if (strcmp(v, "error") && strcmp(v, "none")) {
                qd_reply_error(err, 400, "bad_param", "report must be error or none (got '%.64s')", v);
                return -1;
            }
            q->report_error = !strcmp(v, "error");
        } else {
            /* a format parameter: checked now against fmt when known, applied later */
            if (!qd_param_find(k) || (q->f && !qd_format_accepts(q->f, k))) {
                qd_reply_error(err, 400, "unknown_param", "unknown parameter '%.32s'%s%s", k,
                               q->f ? " for format " : "", q->f ? q->f->name : "");
                return -1;
            }
            if (q->f && qd_params_set(q->f, &scratch, k, v, msg, sizeof msg) != QD_OK) {
                qd_reply_error(err, 400, "bad_param", "%s", msg);
                return -1;
            }
            if (q->nparams == QD_REQ_MAX_PARAMS || strlen(k) >= sizeof q->param_key[0] ||
                strlen(v) >= sizeof q->param_value[0]) {
                qd_reply_error(err, 400, "bad_param", "too many or too long parameters");
                return -1;
            }
            strcpy(q->param_key[q->nparams], k);
            strcpy(q->param_value[q->nparams++], v);
        }
    }
    return 0;
}

static int media_is(const char *ct, const char *type)
{
    size_t n = strlen(type);
    while (*ct == ' ')
        ct++;
    return !strncasecmp(ct, type, n) && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

int qd_body_kind(const struct qd_req *q, const char *ct, const char *body, size_t len)
{
    int untyped = !ct || !*ct || media_is(ct, "application/x-www-form-urlencoded");
    if (ct && media_is(ct, "application/json"))
        return QD_BODY_JSON;
    if (ct && media_is(ct, "application/octet-stream") && !qd_op_names_files(q->op))
        return q->op == QD_OP_QUANTIZE ? QD_BODY_RAW : QD_BODY_SAFETENSORS;
    if (!untyped)
        return -1;
    /* curl --data-binary without -H sends the form type: a raw tensor when the query says its
     * shape or dtype (and the body does not open as a JSON object); otherwise JSON, or
     * safetensors when the body opens with one's header */
    if (q->op == QD_OP_QUANTIZE) {
        size_t i = 0;
        while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n'))
            i++;
        return q->has_shape || (q->has_dtype && !(i < len && body[i] == '{')) ? QD_BODY_RAW : QD_BODY_JSON;
    }
    if (qd_op_names_files(q->op)) /* a JSON request naming files, never a tensor */
        return QD_BODY_JSON;
    if (len >= 9 && body[8] == '{') {
        uint64_t h = 0;
        for (int i = 7; i >= 0; i--)
            h = h << 8 | (unsigned char)body[i];
        if (h <= len - 8)
            return QD_BODY_SAFETENSORS;
    }
    return QD_BODY_JSON;
}

/* Shape from a JSON array of positive integers. */
static int json_shape(const cJSON *a, int *ndim, int64_t *shape)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < 1 || cJSON_GetArraySize(a) > QD_MAX_DIMS)
        return -1;
    const cJSON *d;
    int n = 0;
    cJSON_ArrayForEach(d, a) {
        if (!cJSON_IsNumber(d) || !(d->valuedouble >= 1) || d->valuedouble > 1e15 ||
            d->valuedouble != (double)(int64_t)d->valuedouble)
            return -1;
        shape[n++] = (int64_t)d->valuedouble;
    }
    struct qd_tensor t;
    *ndim = n;
    return qd_tensor_set_shape(&t, n, shape) == QD_OK ? 0 : -1;
}

/* The format from the query and/or body; they must agree when both are given. */
static int pick_format(struct qd_work *w, const char *body_fmt, struct qd_reply *err)
{
    const struct qd_format *bf = body_fmt ? qd_format_find(body_fmt) : NULL;
    if (body_fmt && !bf) {
        qd_reply_error(err, 400, "unknown_format", "unknown format '%.64s' in the body", body_fmt);
        return -1;
    }
    if (w->req.f && bf && bf != w->req.f) {
        qd_reply_error(err, 400, "bad_request", "fmt=%s in the query but %s in the body",
                       w->req.f->name, bf->name);
        return -1;
    }
    if (!(w->f = w->req.f ? w->req.f : bf)) {
        qd_reply_error(err, 400, "missing_format", "fmt is required (query fmt=... or body \"fmt\")");
        return -1;
    }
    return 0;
}

/* Defaults, then params from the body, then those from the query. */
static int resolve_params(struct qd_work *w, const cJSON *body_params, struct qd_reply *err)
{
    char msg[ERRLEN];
    qd_params_default(w->f, &w->p);
    if (qd_params_from_json(w->f, &w->p, body_params, msg, sizeof msg) != QD_OK)
        goto bad;
    for (int i = 0; i < w->req.nparams; i++)
        if (qd_params_set(w->f, &w->p, w->req.param_key[i], w->req.param_value[i], msg, sizeof msg) != QD_OK)
            goto bad;
    return 0;
bad:
    qd_reply_error(err, 400, strstr(msg, "unknown") ? "unknown_param" : "bad_param", "%s", msg);
    return -1;
}

static int layout(struct qd_work *w, const struct qd_tensor *shape_of, struct qd_reply *err)
{
    char msg[ERRLEN];
    w->nc = qd_format_layout(w->f, &w->p, shape_of, w->comps, msg, sizeof msg);
    if (w->nc < 0) {
        w->nc = 0;
        qd_reply_error(err, 422, "unsupported_shape", "%s", msg);
        return -1;
    }
    return 0;
}

static int oom(struct qd_reply *err)
{
    qd_reply_error(err, 503, "out_of_memory", "out of memory for this request; retry later");
    return -1;
}

/* "importance": {"data": base64 of little-endian f32, "dtype": "f32" (optional)}: one value per
 * column, or per column for each of k equal runs of rows (struct qd_params); checked against the format and the
 * shape once both are known. Its "data" stays out of the JSON limit as the tensor's does. */
static int decode_importance(struct qd_work *w, const struct qd_json_body *jb, const cJSON *imp,
                             struct qd_reply *err)
{
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(imp, "data"),
                *dt = cJSON_GetObjectItemCaseSensitive(imp, "dtype");
    if (!cJSON_IsObject(imp) || !(cJSON_IsString(data) || cJSON_IsRaw(data)) ||
        (dt && (!cJSON_IsString(dt) || strcmp(dt->valuestring, "f32")))) {
        qd_reply_error(err, 400, "bad_importance", "\"importance\" must be an object {\"data\": base64 of "
                       "little-endian f32 values, one per column} (dtype, if given, f32)");
        return -1;
    }
    size_t n;
    int no_mem;
    unsigned char *b = qd_json_body_data(jb, data, &n, &no_mem);
    if (!b) {
        if (no_mem)
            return oom(err);
        qd_reply_error(err, 400, "bad_base64", "\"importance\" \"data\" is not valid base64 (standard "
                       "alphabet, padded)");
        return -1;
    }
    if (n == 0 || n % 4) {
        free(b);
        qd_reply_error(err, 400, "bad_importance", "\"importance\" holds %zu bytes: it needs a whole "
                       "number (at least one) of f32 values", n);
        return -1;
    }
    w->importance_owned = (float *)b; /* malloc'd: aligned for float */
    w->p.importance = w->importance_owned;
    w->p.importance_n = (int64_t)(n / 4);
    return 0;
}

static int decode_quantize(struct qd_work *w, enum qd_body_kind kind, char *body, size_t len,
                           struct qd_reply *err)
{
    struct qd_req *q = &w->req;
    struct qd_json_body jb = {0};
    const cJSON *params = NULL, *importance = NULL;
    int rc = -1;
    if (kind == QD_BODY_SAFETENSORS || kind < 0) {
        qd_reply_error(err, 415, "unsupported_media_type", "/quantize takes a raw tensor or JSON");
        return -1;
    }
    if (kind == QD_BODY_RAW) {
        if (!q->has_dtype || !q->has_shape) {
            qd_reply_error(err, 400, "bad_request", "a raw body needs %s in the query (shape: integers separated by "
                           "commas, e.g. shape=4096,4096; dtype: f32, f16 or bf16)",
                           q->has_dtype ? "shape=" : q->has_shape ? "dtype=" : "dtype= and shape=");
            return -1;
        }
        w->in.data = body;
    } else {
        if (qd_json_body_parse(&jb, body, len, (size_t)q->json_limit, err))
            goto done;
        const cJSON *j = jb.root;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype"),
                    *sh = cJSON_GetObjectItemCaseSensitive(j, "shape"),
                    *data = cJSON_GetObjectItemCaseSensitive(j, "data"),
                    *fmt = cJSON_GetObjectItemCaseSensitive(j, "fmt");
        params = cJSON_GetObjectItemCaseSensitive(j, "params");
        importance = cJSON_GetObjectItemCaseSensitive(j, "importance");
        enum qd_dtype t;
        if (dt && (qd_dtype_parse(cJSON_GetStringValue(dt), &t) || !qd_dtype_is_float_input(t))) {
            qd_reply_error(err, 400, "unknown_dtype", "\"dtype\" must be f32, f16 or bf16");
            goto done;
        }
        int nd;
        int64_t dims[QD_MAX_DIMS];
        if (sh && json_shape(sh, &nd, dims)) {
            qd_reply_error(err, 400, "bad_shape", "\"shape\" must be 1 to %d positive integers", QD_MAX_DIMS);
            goto done;
        }
        if ((dt && q->has_dtype && t != q->dtype) ||
            (sh && q->has_shape && (nd != q->ndim || memcmp(dims, q->shape, sizeof *dims * (size_t)nd)))) {
            qd_reply_error(err, 400, "bad_request", "dtype or shape differ between query and body");
            goto done;
        }
        if (dt)
            q->dtype = t, q->has_dtype = 1;
        if (sh)
            q->ndim = nd, memcpy(q->shape, dims, sizeof dims), q->has_shape = 1;
        if (!q->has_dtype || !q->has_shape || !(cJSON_IsString(data) || cJSON_IsRaw(data))) {
            qd_reply_error(err, 400, "bad_request", "the JSON body needs \"dtype\", \"shape\" and \"data\" (base64); "
                           "missing:%s%s%s", q->has_dtype ? "" : " dtype", q->has_shape ? "" : " shape",
                           cJSON_IsString(data) || cJSON_IsRaw(data) ? "" : " data");
            goto done;
        }
        if (fmt && !cJSON_IsString(fmt)) {
            qd_reply_error(err, 400, "bad_request", "\"fmt\" must be a string");
            goto done;
        }
        int no_mem;
        if (!(w->in_owned = qd_json_body_data(&jb, data, &len, &no_mem))) {
            if (no_mem)
                oom(err);
            else
                qd_reply_error(err, 400, "bad_base64", "\"data\" is not valid base64 (standard alphabet, padded)");
            goto done;
        }
        w->in.data = w->in_owned;
        if (pick_format(w, cJSON_GetStringValue(fmt), err))
            goto done;
    }
    if (kind == QD_BODY_RAW && pick_format(w, NULL, err))
        goto done;
    w->in.dtype = q->dtype;
    qd_tensor_set_shape(&w->in, q->ndim, q->shape);
    size_t want = (size_t)qd_tensor_numel(&w->in) * qd_dtype_size(q->dtype);
    if (len != want) {
        qd_reply_error(err, 400, "length_mismatch", "the tensor has %zu bytes but shape x dtype needs %zu",
                       len, want);
        goto done;
    }
    if (resolve_params(w, params, err) || layout(w, &w->in, err))
        goto done;
    if (importance || w->f->importance_required) {
        char msg[ERRLEN];
        /* any backend: one whose kernels do not read it runs the format's CPU code */
        if (importance && decode_importance(w, &jb, importance, err))
            goto done;
        if (qd_importance_check(QD_BACKEND_CPU, w->f, &w->in, &w->p, msg, sizeof msg) != QD_OK) {
            qd_reply_error(err, 422, "bad_importance", "%s", msg);
            goto done;
        }
    }
    for (int i = 0; i < w->nc; i++) {
        /* from the body pool: pinned on a CUDA backend, so the results come straight back */
        if (!(w->comp[i] = qd_hostmem_get((size_t)w->comps[i].bytes))) {
            oom(err);
            goto done;
        }
        w->comp_owned |= 1u << i;
    }
    rc = 0;
done:
    qd_json_body_free(&jb);
    return rc;
}

/* Finds component name among the decoded tensors and checks it against the layout. */
static int take_component(struct qd_work *w, int i, const void *data, size_t bytes, enum qd_dtype dt,
                          int ndim, const int64_t *shape, int owned, struct qd_reply *err)
{
    const struct qd_component *c = &w->comps[i];
    int same_shape = ndim == c->ndim;
    for (int d = 0; same_shape && d < ndim; d++)
        same_shape = shape[d] == c->shape[d];
    if (bytes != (size_t)c->bytes || dt != c->dtype || !same_shape) {
        qd_reply_error(err, 400, "length_mismatch", "component %s must be %s with %lld bytes for this shape",
                       c->name, qd_dtype_name(c->dtype), (long long)c->bytes);
        return -1;
    }
    /* kernels read scales as typed arrays: give them aligned memory */
    if (!owned && ((uintptr_t)data % 16)) {
        void *copy = malloc(bytes ? bytes : 1);
        if (!copy)
            return oom(err);
        memcpy(copy, data, bytes);
        data = copy;
        owned = 1;
    }
    w->comp[i] = (void *)data;
    if (owned)
        w->comp_owned |= 1u << i;
    return 0;
}

static int decode_dequantize(struct qd_work *w, enum qd_body_kind kind, char *body, size_t len,
                             struct qd_reply *err)
{
    struct qd_req *q = &w->req;
    cJSON *j = NULL, *meta_params = NULL; /* (safetensors: the metadata) */
    struct qd_json_body jb = {0};
    const cJSON *params = NULL, *tensors = NULL;
    struct qd_st_tensor st[QD_ST_MAX_TENSORS];
    int nst = 0, rc = -1, nd = 0;
    int64_t dims[QD_MAX_DIMS];
    enum qd_dtype body_dtype = QD_F32;
    const char *fmt = NULL;
    char msg[ERRLEN];
    if (kind == QD_BODY_RAW || kind < 0) {
        qd_reply_error(err, 415, "unsupported_media_type", "/dequantize takes the JSON /quantize returned, or its safetensors");
        return -1;
    }
    if (kind == QD_BODY_SAFETENSORS) {
        if ((nst = qd_safetensors_parse((const unsigned char *)body, len, (size_t)q->json_limit, st, QD_ST_MAX_TENSORS, &j,
                                        msg, sizeof msg)) < 0) {
            qd_reply_error(err, 400, "bad_safetensors", "%s", msg);
            goto done;
        }
        /* quantd's own metadata: fmt, dtype, shape and params (JSON text) */
        const char *shape_text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "shape"));
        const char *params_text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "params"));
        cJSON *shape_json = shape_text ? cJSON_Parse(shape_text) : NULL;
        int bad = !shape_json || json_shape(shape_json, &nd, dims);
        cJSON_Delete(shape_json);
        if (bad) {
            qd_reply_error(err, 400, "bad_shape", "safetensors __metadata__ needs \"shape\" like \"[4096,4096]\"");
            goto done;
        }
        if (params_text && !cJSON_IsObject(meta_params = cJSON_Parse(params_text))) {
            qd_reply_error(err, 400, "bad_param", "safetensors __metadata__ \"params\" must be a JSON object");
            goto done;
        }
        params = meta_params;
        fmt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "fmt"));
        const char *dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "dtype"));
        if (dt && (qd_dtype_parse(dt, &body_dtype) || !qd_dtype_is_float_input(body_dtype))) {
            qd_reply_error(err, 400, "unknown_dtype", "bad dtype '%.32s' in __metadata__", dt);
            goto done;
        }
    } else {
        if (qd_json_body_parse(&jb, body, len, (size_t)q->json_limit, err))
            goto done;
        const cJSON *root = jb.root;
        if (json_shape(cJSON_GetObjectItemCaseSensitive(root, "shape"), &nd, dims)) {
            qd_reply_error(err, 400, "bad_shape", "\"shape\" must be 1 to %d positive integers", QD_MAX_DIMS);
            goto done;
        }
        params = cJSON_GetObjectItemCaseSensitive(root, "params");
        tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "fmt"),
                    *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
        if ((f && !cJSON_IsString(f)) || !cJSON_IsObject(tensors)) {
            qd_reply_error(err, 400, "bad_request", "the body needs \"fmt\" (string) and \"tensors\" (object)");
            goto done;
        }
        fmt = cJSON_GetStringValue(f);
        if (dt && (qd_dtype_parse(cJSON_GetStringValue(dt), &body_dtype) || !qd_dtype_is_float_input(body_dtype))) {
            qd_reply_error(err, 400, "unknown_dtype", "\"dtype\" must be f32, f16 or bf16");
            goto done;
        }
    }
    if (pick_format(w, fmt, err) || resolve_params(w, params, err))
        goto done;
    w->out.dtype = q->has_dtype ? q->dtype : qd_format_dequant_dtype(w->f, &w->p, body_dtype);
    qd_tensor_set_shape(&w->out, nd, dims);
    if (layout(w, &w->out, err))
        goto done;
    for (int i = 0; i < w->nc; i++) {
        const char *name = w->comps[i].name;
        if (kind == QD_BODY_SAFETENSORS) {
            int k = 0;
            while (k < nst && strcmp(st[k].name, name))
                k++;
            if (k == nst) {
                qd_reply_error(err, 400, "bad_request", "component %s is missing", name);
                goto done;
            }
            if (take_component(w, i, st[k].data, st[k].bytes, st[k].dtype, st[k].ndim, st[k].shape, 0, err))
                goto done;
            continue;
        }
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(tensors, name);
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(c, "data");
        enum qd_dtype dt;
        int cnd;
        int64_t cdims[QD_MAX_DIMS];
        if (!(cJSON_IsString(data) || cJSON_IsRaw(data)) || qd_dtype_parse(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "dtype")), &dt) ||
            json_shape(cJSON_GetObjectItemCaseSensitive(c, "shape"), &cnd, cdims)) {
            qd_reply_error(err, 400, "bad_request", "component %s needs \"dtype\", \"shape\" and \"data\"", name);
            goto done;
        }
        size_t n;
        int no_mem;
        unsigned char *bytes = qd_json_body_data(&jb, data, &n, &no_mem);
        if (!bytes) {
            if (no_mem)
                oom(err);
            else
                qd_reply_error(err, 400, "bad_base64", "component %s: \"data\" is not valid base64", name);
            goto done;
        }
        if (take_component(w, i, bytes, n, dt, cnd, cdims, 1, err)) {
            free(bytes);
            goto done;
        }
    }
    size_t out_bytes = (size_t)qd_tensor_numel(&w->out) * qd_dtype_size(w->out.dtype);
    if (!(w->out.data = qd_hostmem_get(out_bytes))) {
        oom(err);
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(j);
    cJSON_Delete(meta_params);
    qd_json_body_free(&jb);
    return rc;
}

int qd_work_decode(struct qd_work *w, const struct qd_req *q, enum qd_body_kind kind, char *body,
                   size_t len, struct qd_reply *err)
{
    w->req = *q;
    return q->op == QD_OP_QUANTIZE ? decode_quantize(w, kind, body, len, err)
                                   : decode_dequantize(w, kind, body, len, err);
}

int qd_work_precheck(const struct qd_req *q, enum qd_body_kind kind, const char *body, size_t len,
                     const struct qd_format **fmt, struct qd_reply *err)
{
    *fmt = q->f;
    if (kind == QD_BODY_RAW)
        return 0; /* its length was checked against dtype x shape before the body */
    /* the worker's own decode, thrown away: the body is only read (decoded data goes to new
     * buffers, safetensors components point into it) */
    struct qd_work w;
    memset(&w, 0, sizeof w);
    int rc = qd_work_decode(&w, q, kind, (char *)body, len, err);
    if (rc == 0)
        *fmt = w.f;
    qd_work_free(&w);
    return rc;
}

void qd_work_free(struct qd_work *w)
{
    free(w->in_owned);
    free(w->importance_owned);
    for (int i = 0; i < w->nc; i++)
        if (w->comp_owned & (1u << i))
            qd_hostmem_put(w->comp[i]);
    qd_hostmem_put(w->out.data);
    memset(w, 0, sizeof *w);
}
