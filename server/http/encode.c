/* Response encoding (see encode.h). Big tensors are written once into the final buffer: the JSON
 * around them is printed by cJSON, the base64 is written straight after it. */
#include "http/encode.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/hostmem.h"

cJSON *qd_timing_json(const struct qd_timing *t)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "queue_us", round(t->queue_us * 10) / 10);
    cJSON_AddNumberToObject(o, "h2d_us", round(t->h2d_us * 10) / 10);
    cJSON_AddNumberToObject(o, "kernel_us", round(t->kernel_us * 10) / 10);
    cJSON_AddNumberToObject(o, "d2h_us", round(t->d2h_us * 10) / 10);
    cJSON_AddNumberToObject(o, "total_us", round(t->total_us * 10) / 10);
    return o;
}

/* Everything about a quantize result except the tensors. */
static cJSON *quantize_head(const struct qd_work *w)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "fmt", w->f->name);
    cJSON_AddStringToObject(o, "dtype", qd_dtype_name(w->in.dtype));
    cJSON_AddItemToObject(o, "shape", qd_shape_json(w->in.ndim, w->in.shape));
    cJSON_AddItemToObject(o, "params", qd_params_to_json(w->f, &w->p));
    cJSON_AddItemToObject(o, "timing", qd_timing_json(&w->t));
    cJSON_AddStringToObject(o, "backend", w->backend);
    if (w->has_report)
        cJSON_AddItemToObject(o, "error", qd_report_json(&w->report));
    return o;
}

static void oom_reply(struct qd_reply *r)
{
    qd_reply_error(r, 503, "out_of_memory", "out of memory while encoding the answer");
}

/* Appends a NUL-terminated string; the caller sized the buffer. */
static char *put(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

/* {"k":v,...} from head, then ,"<key>":{"<name>":{"dtype","shape","data":"<base64>"},...}} */
static void json_with_tensors(struct qd_reply *r, cJSON *head, const char *key, int n,
                              const char *const *names, const enum qd_dtype *dtypes,
                              const int *ndims, const int64_t (*shapes)[QD_MAX_DIMS],
                              void *const *data, const size_t *bytes)
{
    char *h = cJSON_PrintUnformatted(head);
    cJSON_Delete(head);
    char *metas[QD_MAX_COMPONENTS] = {0};
    size_t total = h ? strlen(h) + strlen(key) + 16 : 0;
    for (int i = 0; h && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "dtype", qd_dtype_name(dtypes[i]));
        cJSON_AddItemToObject(m, "shape", qd_shape_json(ndims[i], shapes[i]));
        metas[i] = cJSON_PrintUnformatted(m);
        cJSON_Delete(m);
        if (!metas[i])
            total = 0;
        else
            total += strlen(names[i]) + strlen(metas[i]) + qd_base64_encoded_len(bytes[i]) + 16;
    }
    char *out = total ? malloc(total) : NULL, *p = out;
    if (out) {
        p = put(p, h);
        p[-1] = ','; /* reopen the object: its closing brace becomes a comma */
        p = put(p, "\"");
        p = put(p, key);
        p = put(p, "\":{");
        for (int i = 0; i < n; i++) {
            p = put(p, i ? ",\"" : "\"");
            p = put(p, names[i]);
            p = put(p, "\":");
            p = put(p, metas[i]);
            p[-1] = ',';
            p = put(p, "\"data\":\"");
            qd_base64_encode(data[i], bytes[i], p);
            p += qd_base64_encoded_len(bytes[i]);
            p = put(p, "\"}");
        }
        p = put(p, "}}");
        qd_reply_take(r, 200, "application/json", out, (size_t)(p - out));
    } else
        oom_reply(r);
    free(h);
    for (int i = 0; i < n; i++)
        free(metas[i]);
}

static void quantize_json(const struct qd_work *w, struct qd_reply *r)
{
    const char *names[QD_MAX_COMPONENTS];
    enum qd_dtype dtypes[QD_MAX_COMPONENTS];
    int ndims[QD_MAX_COMPONENTS];
    int64_t shapes[QD_MAX_COMPONENTS][QD_MAX_DIMS];
    size_t bytes[QD_MAX_COMPONENTS];
    for (int i = 0; i < w->nc; i++) {
        names[i] = w->comps[i].name;
        dtypes[i] = w->comps[i].dtype;
        ndims[i] = w->comps[i].ndim;
        shapes[i][0] = w->comps[i].shape[0];
        shapes[i][1] = w->comps[i].shape[1];
        bytes[i] = (size_t)w->comps[i].bytes;
    }
    json_with_tensors(r, quantize_head(w), "tensors", w->nc, names, dtypes, ndims,
                      (const int64_t(*)[QD_MAX_DIMS])shapes, w->comp, bytes);
}

/* __metadata__ values must be strings: nested objects go in as JSON text. */
static void add_json_text(cJSON *meta, const char *key, cJSON *value)
{
    char *s = cJSON_PrintUnformatted(value);
    cJSON_AddStringToObject(meta, key, s ? s : "");
    free(s);
}

/* The answer as a safetensors file, sent as its header followed by the components in their own
 * pooled buffers, never joined into one (a copy of the whole answer saved per request); a
 * component this work does not own is copied into a buffer of its own. */
static void quantize_safetensors(struct qd_work *w, struct qd_reply *r)
{
    cJSON *head = quantize_head(w), *meta = cJSON_CreateObject(), *it;
    cJSON_ArrayForEach(it, head) {
        if (cJSON_IsString(it))
            cJSON_AddStringToObject(meta, it->string, it->valuestring);
        else
            add_json_text(meta, it->string, it);
    }
    cJSON_Delete(head);
    struct qd_st_tensor st[QD_MAX_COMPONENTS];
    void *part[QD_REPLY_MAX_PARTS];
    size_t part_len[QD_REPLY_MAX_PARTS];
    int n = 1;
    for (int i = 0; i < w->nc; i++) {
        snprintf(st[i].name, sizeof st[i].name, "%s", w->comps[i].name);
        st[i].dtype = w->comps[i].dtype;
        st[i].ndim = w->comps[i].ndim;
        st[i].shape[0] = w->comps[i].shape[0];
        st[i].shape[1] = w->comps[i].shape[1];
        st[i].data = w->comp[i];
        st[i].bytes = (size_t)w->comps[i].bytes;
    }
    part[0] = qd_safetensors_header(st, w->nc, meta, &part_len[0]);
    cJSON_Delete(meta);
    for (int i = 0; part[0] && i < w->nc; i++, n++) {
        part_len[n] = st[i].bytes;
        if ((w->comp_owned >> i) & 1) { /* handed over: the reply gives it back once sent */
            part[n] = w->comp[i];
            w->comp[i] = NULL;
            w->comp_owned &= ~(1u << i);
        } else if ((part[n] = qd_hostmem_get(st[i].bytes)))
            memcpy(part[n], st[i].data, st[i].bytes);
        else
            break;
    }
    if (!part[0] || n < w->nc + 1) {
        for (int k = 0; k < n; k++)
            qd_hostmem_put(part[k]);
        oom_reply(r);
        return;
    }
    qd_reply_take_parts(r, 200, "application/octet-stream", n, part, part_len);
}

static void dequantize_json(const struct qd_work *w, struct qd_reply *r)
{
    size_t bytes = (size_t)qd_tensor_numel(&w->out) * qd_dtype_size(w->out.dtype);
    size_t n = qd_base64_encoded_len(bytes);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "fmt", w->f->name);
    cJSON_AddStringToObject(o, "dtype", qd_dtype_name(w->out.dtype));
    cJSON_AddItemToObject(o, "shape", qd_shape_json(w->out.ndim, w->out.shape));
    cJSON_AddItemToObject(o, "timing", qd_timing_json(&w->t));
    cJSON_AddStringToObject(o, "backend", w->backend);
    char *h = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char *out = h ? malloc(strlen(h) + n + 16) : NULL, *p = out;
    if (out) {
        p = put(p, h);
        p = put(p - 1, ",\"data\":\"");
        qd_base64_encode(w->out.data, bytes, p);
        p = put(p + n, "\"}");
        qd_reply_take(r, 200, "application/json", out, (size_t)(p - out));
    } else
        oom_reply(r);
    free(h);
}

void qd_encode_result(struct qd_work *w, struct qd_reply *r)
{
    if (w->req.op == QD_OP_QUANTIZE) {
        if (w->req.binary_out)
            quantize_safetensors(w, r);
        else
            quantize_json(w, r);
        return;
    }
    if (!w->req.binary_out) {
        dequantize_json(w, r);
        return;
    }
    /* raw tensor: the shape and dtype travel in headers */
    size_t bytes = (size_t)qd_tensor_numel(&w->out) * qd_dtype_size(w->out.dtype);
    char *p = r->shape_header;
    for (int i = 0; i < w->out.ndim; i++)
        p += snprintf(p, sizeof r->shape_header - (size_t)(p - r->shape_header), i ? ",%lld" : "%lld",
                      (long long)w->out.shape[i]);
    snprintf(r->dtype_header, sizeof r->dtype_header, "%s", qd_dtype_name(w->out.dtype));
    qd_reply_take(r, 200, "application/octet-stream", w->out.data, bytes);
    w->out.data = NULL;
}
