/* One conversion request's rules and its summary (convert_request.h). */
#include "checkpoint/convert_request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/gguf_recipe.h"

struct qd_convert_spec *qd_convert_spec_new(void)
{
    struct qd_convert_spec *s = calloc(1, sizeof *s);
    if (s)
        qd_gguf_options_init(&s->gguf);
    return s;
}

void qd_convert_spec_free(struct qd_convert_spec *s)
{
    if (!s)
        return;
    free(s->skip);
    free(s->only);
    qd_name_filter_free(s->filter);
    qd_gguf_options_free(&s->gguf);
    free(s);
}

static enum qd_status refuse(struct qd_convert_spec *s, const char *code)
{
    s->code = code;
    return QD_EINVAL;
}

static int all_digits(const char *v) { return *v && strspn(v, "0123456789") == strlen(v); }

/* The format (or mix) named: every name the request carries is resolved here, in any case. */
static enum qd_status resolve_names(struct qd_convert_spec *s, const char *fmt, const char *recipe, char *err,
                                    size_t errlen)
{
    if (fmt && recipe) {
        snprintf(err, errlen, "give --fmt or --recipe, not both (a recipe chooses each tensor's format)");
        return refuse(s, "bad_request");
    }
    /* llama-quantize's numeric ids name mixes: --fmt 2 is --pure Q4_0 */
    if (fmt && all_digits(fmt) && qd_convert_recipe_named(fmt)) {
        recipe = fmt, fmt = NULL;
        s->gguf.pure = 1;
    }
    if (!fmt && !recipe) {
        snprintf(err, errlen, "--fmt FMT or --recipe MIX is required (quantd formats lists the formats; GGUF "
                 "mixes: %s)", qd_gguf_recipe_names());
        return refuse(s, "missing_format");
    }
    if (recipe) {
        const struct qd_gguf_recipe *r = qd_convert_recipe_named(recipe);
        const struct qd_format *f = r ? NULL : qd_convert_format_named(recipe);
        if (f) {
            snprintf(err, errlen, "'%.40s' is a format, not a llama-quantize mix: use --fmt %s", recipe, f->name);
            return refuse(s, "unknown_recipe");
        }
        if (!r) {
            snprintf(err, errlen, "unknown recipe '%.40s' (quantd writes %s; in any case, or by llama-quantize's "
                     "number: 15 is Q4_K_M)", recipe, qd_gguf_recipe_names());
            return refuse(s, "unknown_recipe");
        }
        s->recipe = r->name;
        s->f = r->fmt ? qd_convert_format_named(r->fmt) : NULL; /* (F16, BF16, F32, COPY: none) */
        return QD_OK;
    }
    if ((s->f = qd_convert_format_named(fmt)) || (s->to_float = qd_convert_to_float_named(fmt)))
        return QD_OK;
    const struct qd_gguf_recipe *r = qd_convert_recipe_named(fmt);
    if (r && !r->fmt)
        snprintf(err, errlen, "'%.40s' is a llama-quantize mix, not a format: use --recipe %s", fmt, r->name);
    else if (r)
        snprintf(err, errlen, "'%.40s' is a llama-quantize mix, not one format: use --recipe %s (--fmt gives every "
                 "quantized tensor one type, such as %s)", fmt, r->name, r->fmt);
    else
        snprintf(err, errlen, "unknown format '%.40s': quantd convert writes, from a GGUF, %s; from a Hugging Face "
                 "directory, %s (names in any case; quantd convert --help says what each writes)", fmt,
                 qd_convert_formats_from(QD_INPUT_GGUF), qd_convert_formats_from(QD_INPUT_HF_DIR));
    return refuse(s, "unknown_format");
}

/* The format's parameters, in order (the later of two alike wins). */
static enum qd_status resolve_params(struct qd_convert_spec *s, const struct qd_convert_arg *const *params, int n,
                                     char *err, size_t errlen)
{
    if (n && !s->f) { /* back to float, a float mix, COPY: no quantizer to take them */
        char what[64];
        if (s->to_float)
            snprintf(what, sizeof what, "--fmt %s (back to float)", s->to_float);
        else
            snprintf(what, sizeof what, "the %s mix", s->recipe);
        snprintf(err, errlen, "--param does not apply to %s: it quantizes nothing", what);
        return refuse(s, "bad_param");
    }
    if (s->f)
        qd_params_default(s->f, &s->params);
    for (int i = 0; i < n; i++) {
        const struct qd_convert_arg *a = params[i];
        char key[64];
        const char *value = a->value ? a->value : "";
        if (!strcmp(a->key, "param")) { /* k=v */
            const char *eq = strchr(value, '=');
            if (!eq || eq == value || (size_t)(eq - value) >= sizeof key) {
                snprintf(err, errlen, "--param needs k=v (got '%.60s')", value);
                return refuse(s, "bad_param");
            }
            memcpy(key, value, (size_t)(eq - value));
            key[eq - value] = 0;
            value = eq + 1;
        } else
            snprintf(key, sizeof key, "%s", a->key);
        const int known = qd_param_find(key) && qd_format_accepts(s->f, key);
        if (qd_params_set(s->f, &s->params, key, value, err, errlen) != QD_OK)
            return refuse(s, known ? "bad_param" : "unknown_param");
    }
    return QD_OK;
}

static enum qd_status set_text(struct qd_convert_spec *s, char **slot, const char *v, char *err, size_t errlen)
{
    free(*slot);
    if (!(*slot = strdup(v ? v : ""))) {
        snprintf(err, errlen, "no memory");
        s->code = "out_of_memory";
        return QD_ENOMEM;
    }
    return QD_OK;
}

enum qd_status qd_convert_resolve(struct qd_convert_spec *s, const struct qd_convert_arg *args, int n, char *err,
                                  size_t errlen)
{
    const char *fmt = NULL, *recipe = NULL;
    const struct qd_convert_arg **params = malloc((size_t)(n > 0 ? n : 1) * sizeof *params);
    int nparams = 0;
    enum qd_status st = QD_OK;
    s->code = NULL;
    if (!params) {
        snprintf(err, errlen, "no memory");
        s->code = "out_of_memory";
        return QD_ENOMEM;
    }
    for (int i = 0; st == QD_OK && i < n; i++) {
        const char *k = args[i].key, *v = args[i].value;
        if (!strcmp(k, "fmt"))
            fmt = v ? v : "";
        else if (!strcmp(k, "recipe"))
            recipe = v ? v : "";
        else if (!strcmp(k, "skip") || !strcmp(k, "only"))
            st = set_text(s, k[0] == 's' ? &s->skip : &s->only, v, err, errlen);
        else if (qd_gguf_option_known(k, NULL)) { /* llama-quantize's: checked as they come */
            if (qd_gguf_option_set(&s->gguf, k, v, err, errlen))
                st = refuse(s, "bad_param");
        } else
            params[nparams++] = &args[i];
    }
    if (st == QD_OK)
        st = resolve_names(s, fmt, recipe, err, errlen);
    if (st == QD_OK)
        st = resolve_params(s, params, nparams, err, errlen);
    free(params);
    if (st == QD_OK && !(s->filter = qd_name_filter_new(s->skip, s->only, err, errlen)))
        st = refuse(s, "bad_request");
    return st;
}

void qd_convert_spec_opts(const struct qd_convert_spec *s, struct qd_convert_opts *o)
{
    o->f = s->f;
    o->to_float = s->to_float;
    o->params = s->params;
    o->skip = s->skip;
    o->only = s->only;
    /* back to float takes no --skip / --only (qd_convert_check says so): an empty filter is none */
    o->filter = s->to_float ? NULL : s->filter;
    o->recipe = s->recipe;
    o->gguf = &s->gguf;
}

const char *qd_convert_spec_fmt(const struct qd_convert_spec *s)
{
    return s->f ? s->f->name : s->to_float ? s->to_float : s->recipe;
}

/* Three decimals (a millisecond, a thousandth of a bit): what the figures can tell. */
static double milli(double x) { return round(x * 1000.0) / 1000.0; }

cJSON *qd_convert_summary_json(const struct qd_convert_spec *s, const struct qd_convert_summary *sum,
                               const char *backend)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    if (s->recipe) { /* the mix asked for, before the rest */
        cJSON_AddStringToObject(o, "recipe", s->recipe);
        if (s->gguf.pure)
            cJSON_AddBoolToObject(o, "pure", 1);
    }
    if (sum->dry_run) /* nothing written: bytes_out is the size the file would have */
        cJSON_AddBoolToObject(o, "dry_run", 1);
    cJSON_AddStringToObject(o, "fmt", qd_convert_spec_fmt(s));
    cJSON_AddStringToObject(o, "backend", backend ? backend : "");
    cJSON_AddNumberToObject(o, "quantized", sum->quantized);
    cJSON_AddNumberToObject(o, "copied", sum->copied);
    cJSON_AddNumberToObject(o, "cast_f16", sum->cast);
    cJSON_AddNumberToObject(o, "bytes_in", (double)sum->bytes_in);
    cJSON_AddNumberToObject(o, "bytes_out", (double)sum->bytes_out);
    cJSON_AddNumberToObject(o, "bits_per_weight",
                            milli(sum->params_total ? (double)sum->bytes_out * 8.0 / (double)sum->params_total : 0.0));
    cJSON_AddNumberToObject(o, "seconds", milli(sum->seconds));
    cJSON_AddNumberToObject(o, "gb_per_s", milli(sum->seconds > 0 ? (double)sum->bytes_in / sum->seconds / 1e9 : 0.0));
    cJSON_AddNumberToObject(o, "read_s", milli(sum->stages.read_s));
    cJSON_AddNumberToObject(o, "quantize_s", milli(sum->stages.process_s));
    cJSON_AddNumberToObject(o, "write_s", milli(sum->stages.write_s));
    if (sum->rule) { /* Hugging Face layouts: the model type and which rule chose the weights */
        cJSON_AddStringToObject(o, "arch", sum->arch);
        cJSON_AddStringToObject(o, "rule", sum->rule);
        if (sum->rule_why[0])
            cJSON_AddStringToObject(o, "rule_why", sum->rule_why);
    }
    if (sum->imatrix) { /* what the importance matrix covered of the tensors quantized */
        cJSON_AddStringToObject(o, "imatrix", sum->imatrix);
        cJSON_AddNumberToObject(o, "imatrix_entries", sum->imatrix_entries);
        cJSON_AddNumberToObject(o, "imatrix_covered", sum->imatrix_covered);
    }
    return o;
}

void qd_convert_imatrix_note(const struct qd_convert_summary *sum, char *out, size_t len)
{
    out[0] = 0;
    if (!sum->imatrix || !sum->imatrix_missing)
        return;
    const int of = sum->imatrix_covered + sum->imatrix_missing;
    char others[48] = "";
    if (sum->imatrix_missing > 1)
        snprintf(others, sizeof others, " and %d other%s", sum->imatrix_missing - 1, sum->imatrix_missing > 2 ? "s" : "");
    if (!sum->imatrix_covered)
        snprintf(out, len, "the importance matrix %s covered none of the %d quantized tensors (no entry for %s%s): was "
                 "it made for another model? They were quantized without one, and the output records none", sum->imatrix,
                 of, sum->imatrix_first_missing, others);
    else
        snprintf(out, len, "the importance matrix %s covered %d of the %d quantized tensors (no entry for %s%s): those "
                 "were quantized without one", sum->imatrix, sum->imatrix_covered, of, sum->imatrix_first_missing,
                 others);
}
