/* server/cli/openapi.c: api/openapi.yaml's enums are the code's tables. The committed spec is
 * what the generator makes of it; every format of the registry, every llama-quantize mix and its
 * number, every component a layout gives (non-default parameters included), every dtype, job op
 * and job state is in its enum and nothing else is; a stale enum is rewritten; a marker naming
 * no list, or a list no marker names, is refused. Run from the source tree (make test-unit). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "../../kernels/registry.h"
#include "checkpoint/convert.h"
#include "checkpoint/gguf_recipe.h"
#include "common/files.h"
#include "cli/openapi.h"
#include "queue/jobs.h"

#define SPEC "api/openapi.yaml"
#define MAX_ITEMS 512

static char *committed(size_t *len)
{
    char *raw = qd_file_read(SPEC, len);
    if (!raw)
        fail_msg("cannot read %s: run the test from the source tree", SPEC);
    char *s = malloc(*len + 1);
    assert_non_null(s);
    memcpy(s, raw, *len);
    s[*len] = 0;
    free(raw);
    return s;
}

static char *generated(const char *spec)
{
    char err[1024] = "";
    char *out = qd_openapi_generate(spec, strlen(spec), err, sizeof err);
    if (!out)
        fail_msg("quantd openapi refused the spec: %s", err);
    return out;
}

/* The items of the enum after "# quantd openapi: LIST" in text, quotes and spaces stripped. */
struct items {
    char v[MAX_ITEMS][48];
    int n;
};

static void enum_of(const char *text, const char *list, struct items *it)
{
    char mark[64];
    snprintf(mark, sizeof mark, "# quantd openapi: %s ", list);
    const char *m = strstr(text, mark);
    if (!m)
        fail_msg("no '%s' in the spec", mark);
    const char *open = strchr(m, '['), *close = open ? strchr(open, ']') : NULL;
    assert_non_null(close);
    it->n = 0;
    for (const char *p = open + 1; p < close;) {
        while (p < close && strchr(" \n,'", *p))
            p++;
        size_t n = 0;
        while (p + n < close && !strchr(" \n,'", p[n]))
            n++;
        if (!n)
            break;
        assert_true(n < sizeof it->v[0] && it->n < MAX_ITEMS);
        memcpy(it->v[it->n], p, n);
        it->v[it->n++][n] = 0;
        p += n;
    }
}

static int has(const struct items *it, const char *name)
{
    for (int i = 0; i < it->n; i++)
        if (!strcmp(it->v[i], name))
            return 1;
    return 0;
}

static void must_have(const struct items *it, const char *list, const char *name)
{
    if (!has(it, name))
        fail_msg("the %s enum lacks '%s'", list, name);
}

static void committed_spec_is_what_the_code_makes(void **state)
{
    (void)state;
    size_t len;
    char *spec = committed(&len), *out = generated(spec);
    if (strcmp(spec, out))
        fail_msg("%s is not what quantd openapi makes of it: run 'make openapi' and commit the result", SPEC);
    free(out);
    free(spec);
}

static void every_format_is_in_the_format_enum(void **state)
{
    (void)state;
    size_t len;
    char *spec = committed(&len), *out = generated(spec);
    static struct items it;
    enum_of(out, "formats", &it);
    assert_int_equal(it.n, qd_format_count);
    for (int i = 0; i < qd_format_count; i++)
        assert_string_equal(it.v[i], qd_formats[i].name); /* the registry's order */
    free(out);
    free(spec);
}

/* every mix by name and by llama-quantize's number, and nothing the recipe lookup refuses */
static void every_mix_and_its_number_is_a_recipe(void **state)
{
    (void)state;
    size_t len;
    char *spec = committed(&len), *out = generated(spec);
    static struct items it, floats;
    enum_of(out, "recipes", &it);
    enum_of(out, "float_recipes", &floats);
    const struct qd_gguf_recipe *r;
    int nfloat = 0;
    for (int i = 0; (r = qd_gguf_recipe_at(i)); i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", r->ftype);
        must_have(&it, "recipes", r->name);
        must_have(&it, "recipes", id);
        if (!r->fmt) {
            must_have(&floats, "float_recipes", r->name);
            nfloat++;
        }
    }
    assert_true(has(&it, "Q4_K_M") && has(&it, "15") && has(&it, "IQ2_M"));
    for (int i = 0; i < it.n; i++)
        if (!qd_gguf_recipe_find(it.v[i]))
            fail_msg("the recipes enum names '%s', which no mix answers to", it.v[i]);
    assert_int_equal(floats.n, nfloat);
    assert_true(has(&floats, "COPY") && has(&floats, "F16"));
    free(out);
    free(spec);
}

/* the components of every format at default parameters (GET /formats) and those only other
 * parameters lay out, each laid out here */
static void every_component_a_layout_gives_is_named(void **state)
{
    (void)state;
    size_t len;
    char *spec = committed(&len), *out = generated(spec);
    static struct items it;
    enum_of(out, "components", &it);
    char *json = qd_registry_json();
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    const cJSON *f, *c;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(root, "formats"))
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(f, "components"))
            must_have(&it, "components", cJSON_GetObjectItem(c, "name")->valuestring);
    cJSON_Delete(root);
    free(json);
    static const struct {
        const char *fmt, *key, *value, *component;
    } others[] = {
        {"w4a16", "symmetric", "false", "weight_zero_point"},
        {"fp8_e4m3", "flow", "transformers", "weight_scale_inv"},
        {"nf4", "double_quant", "false", "absmax"},
    };
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        const struct qd_format *fmt = qd_format_find(others[i].fmt);
        struct qd_params p;
        char err[256];
        qd_params_default(fmt, &p);
        assert_int_equal(qd_params_set(fmt, &p, others[i].key, others[i].value, err, sizeof err), QD_OK);
        struct qd_tensor t = {.dtype = QD_BF16};
        const int64_t shape[2] = {128, 256};
        assert_int_equal(qd_tensor_set_shape(&t, 2, shape), QD_OK);
        struct qd_component comps[QD_MAX_COMPONENTS];
        int n = qd_format_layout(fmt, &p, &t, comps, err, sizeof err), found = 0;
        assert_true(n > 0);
        for (int k = 0; k < n; k++) {
            must_have(&it, "components", comps[k].name);
            found |= !strcmp(comps[k].name, others[i].component);
        }
        assert_true(found);
    }
    for (int i = 1; i < it.n; i++) /* sorted, each once */
        assert_true(strcmp(it.v[i - 1], it.v[i]) < 0);
    free(out);
    free(spec);
}

static void dtypes_ops_and_states_are_the_codes(void **state)
{
    (void)state;
    size_t len;
    char *spec = committed(&len), *out = generated(spec);
    static struct items dtypes, floats, to_float, ops, states;
    enum_of(out, "dtypes", &dtypes);
    enum_of(out, "float_dtypes", &floats);
    enum_of(out, "to_float", &to_float);
    enum_of(out, "job_ops", &ops);
    enum_of(out, "job_states", &states);
    assert_int_equal(dtypes.n, QD_DTYPE_COUNT);
    int nfloat = 0;
    for (int t = 0; t < QD_DTYPE_COUNT; t++) {
        must_have(&dtypes, "dtypes", qd_dtype_name((enum qd_dtype)t));
        if (qd_dtype_is_float_input((enum qd_dtype)t)) {
            must_have(&floats, "float_dtypes", qd_dtype_name((enum qd_dtype)t));
            nfloat++;
        }
    }
    assert_int_equal(floats.n, nfloat);
    assert_int_equal(to_float.n, 3);
    for (int i = 0; i < to_float.n; i++)
        assert_non_null(qd_convert_to_float_named(to_float.v[i]));
    assert_int_equal(ops.n, 5);
    for (int op = 0; qd_op_name(op); op++)
        must_have(&ops, "job_ops", qd_op_name(op));
    assert_int_equal(states.n, 4);
    for (int st = 0; qd_job_state_name(st); st++)
        must_have(&states, "job_states", qd_job_state_name(st));
    free(out);
    free(spec);
}

/* the spec with text replaced once (the test fails when it is not there) */
static char *replaced(const char *spec, const char *from, const char *to)
{
    const char *at = strstr(spec, from);
    if (!at)
        fail_msg("'%s' is not in the spec", from);
    size_t n = strlen(spec) - strlen(from) + strlen(to);
    char *s = malloc(n + 1);
    assert_non_null(s);
    snprintf(s, n + 1, "%.*s%s%s", (int)(at - spec), spec, to, at + strlen(from));
    return s;
}

static void a_stale_enum_is_rewritten(void **state)
{
    (void)state;
    size_t len;
    char *spec = committed(&len);
    char *stale = replaced(spec, "enum: [nf4, fp4, ", "enum: [fp4, "); /* a format forgotten */
    char *out = generated(stale);
    assert_string_equal(out, spec);
    free(out);
    free(stale);
    stale = replaced(spec, "enum: [quantize, dequantize, convert, perplexity, imatrix]", "enum: [quantize,\n  nonsense]");
    out = generated(stale);
    assert_string_equal(out, spec);
    free(out);
    free(stale);
    free(spec);
}

static void refused(const char *spec, const char *words)
{
    char err[1024] = "";
    char *out = qd_openapi_generate(spec, strlen(spec), err, sizeof err);
    if (out || !strstr(err, words)) {
        free(out);
        fail_msg("want an error naming \"%s\", got %s", words, out ? "(accepted)" : err);
    }
}

static void bad_markers_are_refused(void **state)
{
    (void)state;
    size_t len;
    char *spec = committed(&len), *bad;
    bad = replaced(spec, "# quantd openapi: formats", "# quantd openapi: formatz");
    refused(bad, "unknown list 'formatz'");
    free(bad);
    bad = replaced(spec, "# quantd openapi: formats", "# formats");
    refused(bad, "no '# quantd openapi: formats' line");
    free(bad);
    bad = replaced(spec, "# quantd openapi: job_ops (server/queue/work.h)\n",
                   "# quantd openapi: job_ops (server/queue/work.h)\n      type: string\n");
    refused(bad, "not followed by a line 'enum: [...]'");
    free(bad);
    bad = replaced(spec, "enum: [queued, running, done, cancelled]", "enum: [queued, running, done, cancelled] # x");
    refused(bad, "text after the job_states enum's ']'");
    free(bad);
    refused("a: b\n# quantd openapi: dtypes\n  enum: [f32,\n", "has no closing ']'");
    free(spec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(committed_spec_is_what_the_code_makes),
        cmocka_unit_test(every_format_is_in_the_format_enum),
        cmocka_unit_test(every_mix_and_its_number_is_a_recipe),
        cmocka_unit_test(every_component_a_layout_gives_is_named),
        cmocka_unit_test(dtypes_ops_and_states_are_the_codes),
        cmocka_unit_test(a_stale_enum_is_rewritten),
        cmocka_unit_test(bad_markers_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
