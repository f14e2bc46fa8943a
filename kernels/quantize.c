/* Validation and dispatch shared by every caller (see quantize.h). */
#include "quantize.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu/cpu.h"
#ifdef QD_WITH_CUDA
#include "cuda/cuda.h"
#endif
#include "awq.h"
#include "mx.h"
#include "fp.h"

static const char *device_error(void)
{
#ifdef QD_WITH_CUDA
    return qd_cuda_last_error();
#else
    return "";
#endif
}

static enum qd_status nonfinite_error(int64_t bad, char *err, size_t len)
{
    if (bad & QD_BAD_AWQ_F16_RANGE)
        snprintf(err, len, "awq: the group starting at input element %" PRId64 " (its column's "
                 "first row in the group) overflows f16: AutoAWQ halves the weight and computes "
                 "in f16, where a value beyond +-65504, a range max - min past 65504, or at the "
                 "largest scale (4368) a zero or code of 15 gives inf (an assert, or inf cast "
                 "to int); set allow_nonfinite=true to quantize it anyway (docs/formats.md)",
                 bad & ~QD_BAD_AWQ_F16_RANGE);
    else if (bad & QD_BAD_MX_SCALE_RANGE)
        snprintf(err, len, "mxfp4 scale_rounding=even: the block starting at input element %" PRId64
                 " has a max |x| whose power-of-two rounding overflows the weight's dtype (f16: 57344 "
                 "and up): compressed-tensors would store an infinite scale; set allow_nonfinite=true to "
                 "quantize it anyway (scale byte 255, codes 0; docs/formats.md)",
                 bad & ~QD_BAD_MX_SCALE_RANGE);
    else
        snprintf(err, len, "input element %" PRId64 " is not finite (NaN or Inf); set "
                 "allow_nonfinite=true to quantize it anyway", bad);
    return QD_ENONFINITE;
}

static const char *const backend_names[QD_BACKEND_COUNT] = {"cpu", "cuda"};

enum qd_status qd_importance_check(enum qd_backend_kind b, const struct qd_format *f,
                                   const struct qd_tensor *in, const struct qd_params *p,
                                   char *err, size_t len)
{
    if (!p->importance && f->importance_required) {
        snprintf(err, len, "format %s needs an importance vector (ggml's quantizer refuses to run without one): "
                 "send \"importance\", one entry of a llama-imatrix file (or quantd convert --imatrix FILE)",
                 f->name);
        return QD_EINVAL;
    }
    if (!p->importance)
        return QD_OK;
    if (!(f->importance & QD_IMPORTANCE_ON(b))) {
        snprintf(err, len, "format %s takes no importance%s%s (ggml's types do: GET /formats lists "
                 "\"importance\": true)", f->name, f->importance ? " on the backend " : "",
                 f->importance ? backend_names[b] : "");
        return QD_EINVAL;
    }
    if (p->allow_nonfinite) {
        snprintf(err, len, "allow_nonfinite does not go with an importance: ggml's weighted searches have no "
                 "defined result on NaN/Inf");
        return QD_EINVAL;
    }
    int64_t k = p->importance_n / in->cols;
    if (p->importance_n % in->cols || k < 1 || in->rows % k) {
        int64_t matrices = in->ndim >= 3 ? in->rows / in->shape[in->ndim - 2] : 1;
        snprintf(err, len, "importance has %" PRId64 " values; it needs one per column (%" PRId64 "), or one per "
                 "column for each of k equal runs of rows (k dividing the %" PRId64 " rows%s)",
                 p->importance_n, in->cols, in->rows, matrices > 1 ? ": the tensor's matrices, one vector each" : "");
        return QD_EINVAL;
    }
    for (int64_t i = 0; i < p->importance_n; i++)
        if (!(p->importance[i] >= 0.0f && p->importance[i] <= 3.40282347e38f)) {
            snprintf(err, len, "importance value %" PRId64 " is %g: importance values must be finite and >= 0",
                     i, (double)p->importance[i]);
            return QD_EINVAL;
        }
    return QD_OK;
}

enum qd_status qd_quantize(enum qd_backend_kind b, const struct qd_format *f,
                           const struct qd_tensor *in, struct qd_params *p, void *const *out,
                           char *err, size_t len)
{
    if (!qd_dtype_is_float_input(in->dtype)) {
        snprintf(err, len, "input dtype must be f32, f16 or bf16 (got %s)", qd_dtype_name(in->dtype));
        return QD_EINVAL;
    }
    qd_quantize_fn fn = f->backend[b].quantize;
    if (!fn) {
        snprintf(err, len, "format %s has no quantizer on this backend", f->name);
        return QD_EINVAL;
    }
    enum qd_status s = qd_importance_check(b, f, in, p, err, len);
    if (s != QD_OK)
        return s;
    int64_t bad = -1;
    if (!p->allow_nonfinite && b == QD_BACKEND_CPU) {
        /* checked inside the format's first pass over the input, on chunks already in cache */
        qd_cpu_scan_begin(&bad);
        s = fn(f, in, p, out);
        if (!qd_cpu_scan_end()) /* the format made no input pass: scan on its own */
            bad = qd_cpu_find_nonfinite(in);
    } else if (b == QD_BACKEND_CUDA) {
        /* device data: the kernels check while they read; qd_quantize_finish says where */
        s = fn(f, in, p, out);
    } else {
        if (!p->allow_nonfinite)
            bad = qd_cpu_find_nonfinite(in);
        s = bad < 0 ? fn(f, in, p, out) : QD_OK;
    }
    if (bad >= 0)
        return nonfinite_error(bad, err, len);
    if (s != QD_OK)
        snprintf(err, len, "%s quantize failed: %s%s%s", f->name, qd_strerror(s),
                 s == QD_EDEVICE ? ": " : "", s == QD_EDEVICE ? device_error() : "");
    return s;
}

enum qd_status qd_quantize_finish(enum qd_backend_kind b, struct qd_params *p, char *err, size_t len)
{
#ifdef QD_WITH_CUDA
    if (b == QD_BACKEND_CUDA) {
        enum qd_status s = qd_cuda_finish(p);
        if (s == QD_ENONFINITE)
            return nonfinite_error(qd_cuda_ctx_get()->bad_index, err, len);
        if (s != QD_OK)
            snprintf(err, len, "quantize failed: %s: %s", qd_strerror(s), device_error());
        return s;
    }
#endif
    (void)b, (void)p, (void)err, (void)len;
    return QD_OK;
}

enum qd_status qd_dequantize(enum qd_backend_kind b, const struct qd_format *f,
                             const void *const *in, const struct qd_params *p,
                             struct qd_tensor *out, char *err, size_t len)
{
    if (!qd_dtype_is_float_input(out->dtype)) {
        snprintf(err, len, "output dtype must be f32, f16 or bf16 (got %s)",
                 qd_dtype_name(out->dtype));
        return QD_EINVAL;
    }
    qd_dequantize_fn fn = f->backend[b].dequantize;
    if (!fn) {
        snprintf(err, len, "format %s has no dequantizer on this backend", f->name);
        return QD_EINVAL;
    }
    enum qd_status s = fn(f, in, p, out);
    if (s != QD_OK)
        snprintf(err, len, "%s dequantize failed: %s%s%s", f->name, qd_strerror(s),
                 s == QD_EDEVICE ? ": " : "", s == QD_EDEVICE ? device_error() : "");
    return s;
}

struct err_ctx {
    const float *deq;
    double num[QD_CPU_MAX_THREADS], den[QD_CPU_MAX_THREADS], max[QD_CPU_MAX_THREADS];
};

static void err_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct err_ctx *k = c;
    double num = 0, den = 0, mx = k->max[tid];
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)k->deq[first + i];
        num += d * d;
        den += (double)x[i] * x[i];
        d = fabs(d);
        mx = d > mx || d != d ? d : mx;
    }
    k->num[tid] += num;
    k->den[tid] += den;
    k->max[tid] = mx;
}

void qd_error_report(const struct qd_tensor *ref, const float *deq, struct qd_error_report *r)
{
    struct err_ctx k = {.deq = deq};
    int nt = qd_cpu_spans(ref, 1, err_span, &k);
    double num = 0, den = 0, mx = 0;
    for (int i = 0; i < nt; i++) {
        num += k.num[i];
        den += k.den[i];
        mx = k.max[i] > mx || k.max[i] != k.max[i] ? k.max[i] : mx;
    }
    r->nmse = den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
    r->sqnr_db = r->nmse > 0 ? -10.0 * log10(r->nmse) : INFINITY;
    r->max_abs = mx;
}

cJSON *qd_params_to_json(const struct qd_format *f, const struct qd_params *p)
{
    cJSON *o = cJSON_CreateObject();
    char buf[64];
    for (const char *const *n = f->params; *n; n++) {
        const struct qd_param_desc *d = qd_param_find(*n);
        if (!qd_params_get(p, d, buf, sizeof buf))
            continue;
        if (d->kind == QD_PARAM_BOOL)
            cJSON_AddBoolToObject(o, d->name, strcmp(buf, "true") == 0);
        else if (d->kind == QD_PARAM_ENUM || d->kind == QD_PARAM_BLOCK)
            cJSON_AddStringToObject(o, d->name, buf);
        else if (d->kind == QD_PARAM_INT)
            cJSON_AddNumberToObject(o, d->name, *(const int *)((const char *)p + d->offset));
        else /* f32 widened to double prints back exactly */
            cJSON_AddNumberToObject(o, d->name, (double)*(const float *)((const char *)p + d->offset));
    }
    return o;
}

enum qd_status qd_params_from_json(const struct qd_format *f, struct qd_params *p,
                                   const cJSON *obj, char *err, size_t len)
{
    if (!obj)
        return QD_OK;
    if (!cJSON_IsObject(obj)) {
        snprintf(err, len, "params must be a JSON object");
        return QD_EINVAL;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        char buf[64];
        if (cJSON_IsBool(it))
            snprintf(buf, sizeof buf, "%s", cJSON_IsTrue(it) ? "true" : "false");
        else if (cJSON_IsNumber(it)) {
            double v = it->valuedouble;
            if (v == (double)(long long)v && fabs(v) < 1e15)
                snprintf(buf, sizeof buf, "%lld", (long long)v);
            else
                snprintf(buf, sizeof buf, "%.17g", v);
        } else if (cJSON_IsString(it))
            snprintf(buf, sizeof buf, "%s", it->valuestring);
        else {
            snprintf(err, len, "parameter %s must be a number, boolean or string",
                     it->string ? it->string : "?");
            return QD_EINVAL;
        }
        enum qd_status s = qd_params_set(f, p, it->string ? it->string : "", buf, err, len);
        if (s != QD_OK)
            return s;
    }
    return QD_OK;
}
