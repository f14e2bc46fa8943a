/* Parameters: defaults, parsing from text, printing, and the registry as JSON. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"

static int parse_bool(const char *v, int *out)
{
    if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes")) {
        *out = 1;
        return 0;
    }
    if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no")) {
        *out = 0;
        return 0;
    }
    return -1;
}

static enum qd_status set_desc(const struct qd_param_desc *d, struct qd_params *p, const char *v,
                               char *err, size_t len)
{
    char *field = (char *)p + d->offset;
    char *end;
    switch (d->kind) {
    case QD_PARAM_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || x < d->min || x > d->max || (d->pow2 && (x & (x - 1)))) {
            snprintf(err, len, "parameter %s must be %s integer in [%lld, %lld] (got '%s')", d->name,
                     d->pow2 ? "a power-of-two" : "an", (long long)d->min, (long long)d->max, v);
            return QD_EINVAL;
        }
        *(int *)field = (int)x;
        return QD_OK;
    }
    case QD_PARAM_BOOL:
        if (parse_bool(v, (int *)field)) {
            snprintf(err, len, "parameter %s must be true or false (got '%s')", d->name, v);
            return QD_EINVAL;
        }
        return QD_OK;
    case QD_PARAM_FLOAT: {
        errno = 0;
        float x = strtof(v, &end);
        if (errno || end == v || *end || !isfinite(x) || x <= 0.0f) {
            /* offset may be any finite value; scales must be positive */
            if (!(strcmp(d->name, "offset") == 0 && end != v && !*end && isfinite(x))) {
                snprintf(err, len, "parameter %s must be a %s finite number (got '%s')", d->name,
                         strcmp(d->name, "offset") ? "positive" : "", v);
                return QD_EINVAL;
            }
        }
        *(float *)field = x;
        *(int *)((char *)p + d->has_offset) = 1;
        return QD_OK;
    }
    case QD_PARAM_BLOCK: {
        errno = 0;
        long long r = strtoll(v, &end, 10), c = -1;
        if (!errno && end != v && (*end == 'x' || *end == 'X')) {
            const char *at = end + 1;
            c = strtoll(at, &end, 10);
            if (end == at)
                c = -1;
        }
        if (errno || *end || r < d->min || r > d->max || c < d->min || c > d->max) {
            snprintf(err, len, "parameter %s must be ROWSxCOLS, each in [%lld, %lld] (got '%s')", d->name,
                     (long long)d->min, (long long)d->max, v);
            return QD_EINVAL;
        }
        ((int *)field)[0] = (int)r;
        ((int *)field)[1] = (int)c;
        return QD_OK;
    }
    case QD_PARAM_ENUM:
        for (int i = 0; d->choices[i]; i++)
            if (!strcmp(d->choices[i], v)) {
                *(int *)field = i;
                return QD_OK;
            }
        snprintf(err, len, "parameter %s must be one of", d->name);
        for (int i = 0; d->choices[i]; i++) {
            size_t l = strlen(err);
            snprintf(err + l, len - l, "%s %s", i ? "," : "", d->choices[i]);
        }
        {
            size_t l = strlen(err);
            snprintf(err + l, len - l, " (got '%s')", v);
        }
        return QD_EINVAL;
    }
    return QD_EINVAL;
}

void qd_params_default(const struct qd_format *f, struct qd_params *p)
{
    char err[64];
    memset(p, 0, sizeof *p);
    for (int i = 0; i < qd_param_desc_count; i++) {
        const struct qd_param_desc *d = &qd_param_descs[i];
        const char *v = f ? qd_format_param_default(f, d->name) : NULL;
        if (!v)
            v = d->deflt;
        if (v && *v) /* "": the format leaves it unset (an optional value absent by default) */
            set_desc(d, p, v, err, sizeof err);
    }
}

enum qd_status qd_params_set(const struct qd_format *f, struct qd_params *p, const char *key,
                             const char *value, char *err, size_t len)
{
    const struct qd_param_desc *d = qd_param_find(key);
    if (!d || !qd_format_accepts(f, key)) {
        snprintf(err, len, "unknown parameter '%s' for format %s (accepted:", key, f->name);
        for (const char *const *n = f->params; *n; n++) {
            size_t l = strlen(err);
            snprintf(err + l, len - l, " %s", *n);
        }
        size_t l = strlen(err);
        snprintf(err + l, len - l, ")");
        return QD_EINVAL;
    }
    return set_desc(d, p, value, err, len);
}

int qd_params_get(const struct qd_params *p, const struct qd_param_desc *d, char *buf, size_t len)
{
    const char *field = (const char *)p + d->offset;
    switch (d->kind) {
    case QD_PARAM_INT: snprintf(buf, len, "%d", *(const int *)field); return 1;
    case QD_PARAM_BOOL: snprintf(buf, len, "%s", *(const int *)field ? "true" : "false"); return 1;
    case QD_PARAM_FLOAT:
        if (!*(const int *)((const char *)p + d->has_offset))
            return 0;
        snprintf(buf, len, "%.9g", (double)*(const float *)field); /* round-trips an f32 */
        return 1;
    case QD_PARAM_ENUM: snprintf(buf, len, "%s", d->choices[*(const int *)field]); return 1;
    case QD_PARAM_BLOCK: snprintf(buf, len, "%dx%d", ((const int *)field)[0], ((const int *)field)[1]); return 1;
    }
    return 0;
}

int qd_format_layout(const struct qd_format *f, const struct qd_params *p,
                     const struct qd_tensor *in, struct qd_component *comps, char *err, size_t len)
{
    if (f->matrix_only && in->ndim != 2) {
        snprintf(err, len, "%s needs a 2-D weight [K, N] (got %d dimensions)", f->name, in->ndim);
        return -1;
    }
    struct qd_params q = *p; /* what the layout may know of the tensor beyond rows x cols */
    q.layout_dtype = in->dtype;
    q.layout_matrix_rows = in->ndim > 1 ? in->shape[in->ndim - 2] : 1;
    int n = f->layout(f, &q, in->rows, in->cols, comps, err, len);
    /* scales kept in the weight's dtype (compressed-tensors' weight_scale, mlx's scales and
     * biases): the resolved scale_dtype names it, the input's until quantizing resolves it */
    static const enum qd_dtype of[] = {QD_F32, QD_F32, QD_F16, QD_BF16};
    for (int i = 0; i < n; i++)
        if (comps[i].in_scale_dtype) {
            comps[i].dtype = p->scale_dtype == QD_SCALE_AUTO ? in->dtype : of[p->scale_dtype];
            comps[i].bytes = comps[i].shape[0] * comps[i].shape[1] * (int64_t)qd_dtype_size(comps[i].dtype);
        }
    return n;
}

static cJSON *param_json(const struct qd_format *f, const struct qd_param_desc *d)
{
    static const char *kinds[] = {"int", "bool", "float", "enum", "block"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", d->name);
    cJSON_AddStringToObject(o, "type", kinds[d->kind]);
    const char *def = qd_format_param_default(f, d->name);
    if (!def)
        def = d->deflt;
    cJSON_AddStringToObject(o, "default", !def ? "computed" : *def ? def : "none");
    if (d->kind == QD_PARAM_INT || d->kind == QD_PARAM_BLOCK) {
        cJSON_AddNumberToObject(o, "min", (double)d->min);
        cJSON_AddNumberToObject(o, "max", (double)d->max);
        if (d->pow2)
            cJSON_AddTrueToObject(o, "power_of_two");
    }
    if (d->choices) {
        cJSON *c = cJSON_AddArrayToObject(o, "choices");
        for (int i = 0; d->choices[i]; i++)
            cJSON_AddItemToArray(c, cJSON_CreateString(d->choices[i]));
    }
    cJSON_AddStringToObject(o, "doc", d->doc);
    return o;
}

char *qd_registry_json(void)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "formats");
    for (int i = 0; i < qd_format_count; i++) {
        const struct qd_format *f = &qd_formats[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", f->name);
        cJSON_AddStringToObject(o, "family", f->family);
        cJSON_AddStringToObject(o, "doc", f->doc);
        cJSON *blk = cJSON_AddObjectToObject(o, "block");
        cJSON_AddNumberToObject(blk, "elements", f->block_elems);
        if (f->block_bytes)
            cJSON_AddNumberToObject(blk, "bytes", f->block_bytes);
        cJSON_AddStringToObject(blk, "axis", f->block_axis);
        cJSON_AddNumberToObject(o, "bits_per_weight", f->bits_per_weight);
        /* /quantize takes an "importance" vector (on any backend: the CPU code runs it where the
         * GPU's does not read it) */
        cJSON_AddBoolToObject(o, "importance", f->importance != 0);
        if (f->importance_required)
            cJSON_AddBoolToObject(o, "importance_required", 1);
        cJSON *ps = cJSON_AddArrayToObject(o, "params");
        for (const char *const *n = f->params; *n; n++)
            cJSON_AddItemToArray(ps, param_json(f, qd_param_find(*n)));
        /* components as laid out for an example [256, 256] f32 input at default params */
        struct qd_params p;
        struct qd_component c[QD_MAX_COMPONENTS];
        char err[128];
        qd_params_default(f, &p);
        p.layout_dtype = QD_F32;
        p.layout_matrix_rows = 256;
        int nc = f->layout(f, &p, 256, 256, c, err, sizeof err);
        cJSON *cs = cJSON_AddArrayToObject(o, "components");
        for (int j = 0; j < nc; j++) {
            cJSON *co = cJSON_CreateObject();
            cJSON_AddStringToObject(co, "name", c[j].name);
            cJSON_AddStringToObject(co, "dtype", qd_dtype_name(c[j].dtype));
            cJSON *sh = cJSON_AddArrayToObject(co, "shape_for_256x256");
            for (int k = 0; k < c[j].ndim; k++)
                cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)c[j].shape[k]));
            cJSON_AddItemToArray(cs, co);
        }
        cJSON_AddItemToArray(arr, o);
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}
