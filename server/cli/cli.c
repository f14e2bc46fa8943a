/* bin/quantd formats | quantize | dequantize: raw little-endian tensors in, one raw file per
 * component plus meta.json out, and back. Errors go to stderr with exit status 1 (2 for usage). */
#include "cli/cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../kernels/quantize.h"
#include "common/files.h"
#include "common/report_json.h"

#define ERRLEN 8192

static int fail(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "quantd: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 1;
}

int qd_cli_formats(int argc, char **argv)
{
    (void)argc, (void)argv;
    char *s = qd_registry_json();
    puts(s);
    free(s);
    return 0;
}

static const char *arg_value(int *i, int argc, char **argv)
{
    if (*i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

int qd_cli_quantize(int argc, char **argv)
{
    const char *fmt = NULL, *dtype = NULL, *shape = NULL, *in = NULL, *out = NULL;
    const char *params[64];
    int nparams = 0, report = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--no-report")) {
            report = 0;
            continue;
        }
        if (strncmp(a, "--", 2) || !(v = arg_value(&i, argc, argv)))
            return fail("quantize: bad or incomplete argument '%s'%s", a, ""), 2;
        if (!strcmp(a, "--fmt")) fmt = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--shape")) shape = v;
        else if (!strcmp(a, "--in")) in = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--param") && nparams < 64) params[nparams++] = v;
        else return fail("quantize: unknown option '%s'%s", a, ""), 2;
    }
    if (!fmt || !dtype || !shape || !in || !out)
        return fail("usage: quantd quantize --fmt FMT --dtype DT --shape R,C --in FILE --out DIR "
                    "[--param k=v ...]%s%s", "", ""), 2;
    const struct qd_format *f = qd_format_find(fmt);
    if (!f)
        return fail("unknown format '%s' (see quantd formats)%s", fmt, "");
    struct qd_tensor t = {0};
    char err[ERRLEN];
    if (qd_dtype_parse(dtype, &t.dtype) || !qd_dtype_is_float_input(t.dtype))
        return fail("unknown input dtype '%s' (f32, f16, bf16)%s", dtype, "");
    int ndim;
    int64_t dims[QD_MAX_DIMS];
    if (qd_shape_parse(shape, &ndim, dims, err, sizeof err) != QD_OK)
        return fail("%s%s", err, "");
    qd_tensor_set_shape(&t, ndim, dims);
    struct qd_params p;
    qd_params_default(f, &p);
    for (int i = 0; i < nparams; i++) {
        char key[64];
        const char *eq = strchr(params[i], '=');
        if (!eq || (size_t)(eq - params[i]) >= sizeof key)
            return fail("--param expects key=value (got '%s')%s", params[i], "");
        memcpy(key, params[i], (size_t)(eq - params[i]));
        key[eq - params[i]] = 0;
        if (qd_params_set(f, &p, key, eq + 1, err, sizeof err) != QD_OK)
            return fail("%s%s", err, "");
    }
    struct qd_component comps[QD_MAX_COMPONENTS];
    int nc = qd_format_layout(f, &p, &t, comps, err, sizeof err);
    if (nc < 0)
        return fail("%s%s", err, "");
    size_t len;
    t.data = qd_file_read(in, &len);
    if (!t.data)
        return fail("cannot read %s: %s", in, strerror(errno));
    int rc = 1;
    void *bufs[QD_MAX_COMPONENTS] = {0};
    float *deq = NULL;
    cJSON *meta = NULL;
    size_t want = (size_t)qd_tensor_numel(&t) * qd_dtype_size(t.dtype);
    if (len != want) {
        snprintf(err, sizeof err, "%s holds %zu bytes but shape %s of %s needs %zu", in, len,
                 shape, dtype, want);
        fail("%s%s", err, "");
        goto done;
    }
    for (int i = 0; i < nc; i++)
        if (!(bufs[i] = calloc(1, (size_t)comps[i].bytes ? (size_t)comps[i].bytes : 1))) {
            fail("out of memory%s%s", "", "");
            goto done;
        }
    if (qd_quantize(QD_BACKEND_CPU, f, &t, &p, bufs, err, sizeof err) != QD_OK) {
        fail("%s%s", err, "");
        goto done;
    }
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fail("cannot create %s: %s", out, strerror(errno));
        goto done;
    }
    meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "fmt", f->name);
    cJSON_AddStringToObject(meta, "dtype", qd_dtype_name(t.dtype));
    cJSON_AddItemToObject(meta, "shape", qd_shape_json(t.ndim, t.shape));
    cJSON_AddItemToObject(meta, "params", qd_params_to_json(f, &p));
    cJSON *cj = cJSON_AddObjectToObject(meta, "components");
    for (int i = 0; i < nc; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.bin", out, comps[i].name);
        if (qd_file_write(path, bufs[i], (size_t)comps[i].bytes) != 0) {
            fail("cannot write %s: %s", path, strerror(errno));
            goto done;
        }
        cJSON *c = cJSON_AddObjectToObject(cj, comps[i].name);
        cJSON_AddStringToObject(c, "dtype", qd_dtype_name(comps[i].dtype));
        cJSON_AddItemToObject(c, "shape", qd_shape_json(comps[i].ndim, comps[i].shape));
        snprintf(path, sizeof path, "%s.bin", comps[i].name);
        cJSON_AddStringToObject(c, "file", path);
    }
    if (report) {
        struct qd_tensor back = t;
        back.dtype = QD_F32;
        back.data = deq = malloc((size_t)qd_tensor_numel(&t) * sizeof(float));
        if (!deq || qd_dequantize(QD_BACKEND_CPU, f, (const void *const *)bufs, &p, &back, err,
                                  sizeof err) != QD_OK) {
            fail("%s%s", deq ? err : "out of memory", "");
            goto done;
        }
        struct qd_error_report r;
        qd_error_report(&t, deq, &r);
        cJSON_AddItemToObject(meta, "error", qd_report_json(&r));
    }
    char *text = cJSON_Print(meta), path[4096];
    snprintf(path, sizeof path, "%s/meta.json", out);
    rc = qd_file_write(path, text, strlen(text)) ? fail("cannot write %s: %s", path, strerror(errno)) : 0;
    free(text);
done:
    cJSON_Delete(meta);
    for (int i = 0; i < nc; i++)
        free(bufs[i]);
    free(deq);
    free(t.data);
    return rc;
}

int qd_cli_dequantize(int argc, char **argv)
{
    const char *in = NULL, *dtype = NULL, *out = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = arg_value(&i, argc, argv);
        if (!v)
            return fail("dequantize: option '%s' needs a value%s", a, ""), 2;
        if (!strcmp(a, "--in")) in = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--out")) out = v;
        else return fail("dequantize: unknown option '%s'%s", a, ""), 2;
    }
    if (!in || !dtype || !out)
        return fail("usage: quantd dequantize --in DIR --dtype DT --out FILE%s%s", "", ""), 2;
    char path[4096], err[ERRLEN];
    snprintf(path, sizeof path, "%s/meta.json", in);
    size_t len;
    char *text = qd_file_read(path, &len);
    if (!text)
        return fail("cannot read %s: %s", path, strerror(errno));
    cJSON *meta = cJSON_ParseWithLength(text, len);
    free(text);
    int rc = 1, nc = 0;
    void *bufs[QD_MAX_COMPONENTS] = {0};
    struct qd_tensor t = {0};
    const struct qd_format *f = NULL;
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(meta, "shape"), *dim;
    int ndim = 0;
    int64_t dims[QD_MAX_DIMS];
    if (!meta || !(f = qd_format_find(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "fmt")))) ||
        !cJSON_IsArray(shape)) {
        fail("%s is not a quantd meta.json (fmt, shape, params)%s", path, "");
        goto done;
    }
    cJSON_ArrayForEach(dim, shape) {
        if (ndim == QD_MAX_DIMS || !cJSON_IsNumber(dim))
            break;
        dims[ndim++] = (int64_t)dim->valuedouble;
    }
    if (qd_dtype_parse(dtype, &t.dtype) || !qd_dtype_is_float_input(t.dtype)) {
        fail("unknown output dtype '%s' (f32, f16, bf16)%s", dtype, "");
        goto done;
    }
    if (qd_tensor_set_shape(&t, ndim, dims) != QD_OK) {
        fail("bad shape in %s%s", path, "");
        goto done;
    }
    struct qd_params p;
    qd_params_default(f, &p);
    if (qd_params_from_json(f, &p, cJSON_GetObjectItemCaseSensitive(meta, "params"), err,
                            sizeof err) != QD_OK) {
        fail("%s%s", err, "");
        goto done;
    }
    struct qd_component comps[QD_MAX_COMPONENTS];
    nc = qd_format_layout(f, &p, &t, comps, err, sizeof err);
    if (nc < 0) {
        fail("%s%s", err, "");
        nc = 0;
        goto done;
    }
    for (int i = 0; i < nc; i++) {
        snprintf(path, sizeof path, "%s/%s.bin", in, comps[i].name);
        if (!(bufs[i] = qd_file_read(path, &len))) {
            fail("cannot read %s: %s", path, strerror(errno));
            goto done;
        }
        if (len != (size_t)comps[i].bytes) {
            snprintf(err, sizeof err, "%s holds %zu bytes, expected %" PRId64, path, len,
                     comps[i].bytes);
            fail("%s%s", err, "");
            goto done;
        }
    }
    size_t bytes = (size_t)qd_tensor_numel(&t) * qd_dtype_size(t.dtype);
    if (!(t.data = malloc(bytes ? bytes : 1))) {
        fail("out of memory%s%s", "", "");
        goto done;
    }
    if (qd_dequantize(QD_BACKEND_CPU, f, (const void *const *)bufs, &p, &t, err, sizeof err) != QD_OK) {
        fail("%s%s", err, "");
        goto done;
    }
    rc = qd_file_write(out, t.data, bytes) ? fail("cannot write %s: %s", out, strerror(errno)) : 0;
done:
    cJSON_Delete(meta);
    for (int i = 0; i < nc; i++)
        free(bufs[i]);
    free(t.data);
    return rc;
}
