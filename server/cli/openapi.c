/* bin/quantd openapi: api/openapi.yaml's enums made from the tables they mirror (openapi.h).
 *
 * The spec is written by hand but for the enums marked "# quantd openapi: LIST": the line after
 * such a marker is an `enum: [...]` that this file rewrites from LIST's table, so a format, mix
 * or component added to the code reaches the API's contract with `make openapi`, and `make
 * check-openapi` (in make test) fails while the committed file lags. Every list must be named
 * by some marker: one dropped from the spec is an error, not an enum left to go stale. */
#include "cli/openapi.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../../kernels/registry.h"
#include "checkpoint/convert.h"
#include "checkpoint/gguf_recipe.h"
#include "common/files.h"
#include "queue/jobs.h"

#define MARK "# quantd openapi:"
#define WIDTH 112 /* an enum wraps before this column */

/* ---- the lists ------------------------------------------------------------------------------ */

struct names {
    char **v;
    int n, cap;
    int oom;
};

static void names_add(struct names *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], name))
            return;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        char **v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) {
            s->oom = 1;
            return;
        }
        s->v = v, s->cap = cap;
    }
    if (!(s->v[s->n] = strdup(name)))
        s->oom = 1;
    else
        s->n++;
}

static void names_free(struct names *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void fill_formats(struct names *s)
{
    for (int i = 0; i < qd_format_count; i++)
        names_add(s, qd_formats[i].name);
}

/* every mix by name in the table's order, then llama-quantize's numbers for them, ascending */
static void fill_recipes(struct names *s)
{
    int ids[256], nids = 0;
    const struct qd_gguf_recipe *r;
    for (int i = 0; (r = qd_gguf_recipe_at(i)); i++) {
        names_add(s, r->name);
        int seen = 0;
        for (int k = 0; k < nids; k++)
            seen |= ids[k] == r->ftype;
        if (!seen && nids < (int)(sizeof ids / sizeof *ids))
            ids[nids++] = r->ftype;
    }
    for (int i = 1; i < nids; i++) /* insertion sort: a few dozen ids */
        for (int k = i; k > 0 && ids[k - 1] > ids[k]; k--) {
            int t = ids[k];
            ids[k] = ids[k - 1], ids[k - 1] = t;
        }
    for (int i = 0; i < nids; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", ids[i]);
        names_add(s, id);
    }
}

/* the mixes that quantize nothing (F16, BF16, F32, COPY): a conversion's "fmt" names them */
static void fill_float_recipes(struct names *s)
{
    const struct qd_gguf_recipe *r;
    for (int i = 0; (r = qd_gguf_recipe_at(i)); i++)
        if (!r->fmt)
            names_add(s, r->name);
}

static void fill_dtypes(struct names *s)
{
    for (int t = 0; t < QD_DTYPE_COUNT; t++)
        names_add(s, qd_dtype_name((enum qd_dtype)t));
}

static void fill_float_dtypes(struct names *s)
{
    for (int t = 0; t < QD_DTYPE_COUNT; t++)
        if (qd_dtype_is_float_input((enum qd_dtype)t))
            names_add(s, qd_dtype_name((enum qd_dtype)t));
}

/* the dtypes a conversion turns a quantized model back into (the layout table's to_float rows,
 * each named by its dtype) */
static void fill_to_float(struct names *s)
{
    for (int t = 0; t < QD_DTYPE_COUNT; t++) {
        const char *name = qd_convert_to_float_named(qd_dtype_name((enum qd_dtype)t));
        if (name)
            names_add(s, name);
    }
}

/* Every component name some layout gives: each format laid out for a [256, 256] f32 weight
 * under every combination of its bool and enum parameters (the ones layouts switch names on:
 * double_quant, symmetric, flow, ...), the combinations a layout refuses skipped. Sorted. */
static void fill_components(struct names *s)
{
    for (int i = 0; i < qd_format_count; i++) {
        const struct qd_format *f = &qd_formats[i];
        const struct qd_param_desc *swept[16];
        int radix[16], nswept = 0;
        long combos = 1;
        for (const char *const *pn = f->params; *pn && nswept < 16; pn++) {
            const struct qd_param_desc *d = qd_param_find(*pn);
            int n = 0;
            if (d && d->kind == QD_PARAM_BOOL)
                n = 2;
            else if (d && d->kind == QD_PARAM_ENUM)
                while (d->choices[n])
                    n++;
            if (n > 1) {
                swept[nswept] = d, radix[nswept++] = n;
                combos *= n;
            }
        }
        for (long c = 0; c < combos; c++) {
            struct qd_params p;
            char err[512];
            int ok = 1;
            long rest = c;
            qd_params_default(f, &p);
            for (int k = 0; k < nswept; k++) {
                int v = (int)(rest % radix[k]);
                rest /= radix[k];
                const char *text = swept[k]->kind == QD_PARAM_BOOL ? (v ? "true" : "false") : swept[k]->choices[v];
                ok &= qd_params_set(f, &p, swept[k]->name, text, err, sizeof err) == QD_OK;
            }
            struct qd_tensor t = {.dtype = QD_F32};
            const int64_t shape[2] = {256, 256};
            struct qd_component comps[QD_MAX_COMPONENTS];
            int nc = ok && qd_tensor_set_shape(&t, 2, shape) == QD_OK
                         ? qd_format_layout(f, &p, &t, comps, err, sizeof err) : -1;
            for (int k = 0; k < nc; k++)
                names_add(s, comps[k].name);
        }
    }
    if (s->n > 1)
        qsort(s->v, (size_t)s->n, sizeof *s->v, by_name);
}

static void fill_job_ops(struct names *s)
{
    for (int op = 0; qd_op_name(op); op++)
        names_add(s, qd_op_name(op));
}

static void fill_job_states(struct names *s)
{
    for (int st = 0; qd_job_state_name(st); st++)
        names_add(s, qd_job_state_name(st));
}

static const struct list {
    const char *name;
    void (*fill)(struct names *s);
} lists[] = {
    {"formats", fill_formats},           /* kernels/registry.c */
    {"recipes", fill_recipes},           /* server/checkpoint/gguf_recipe.c */
    {"float_recipes", fill_float_recipes},
    {"to_float", fill_to_float},         /* server/checkpoint/convert_layouts.c */
    {"dtypes", fill_dtypes},             /* kernels/registry.h enum qd_dtype */
    {"float_dtypes", fill_float_dtypes},
    {"components", fill_components},     /* the registry's layouts */
    {"job_ops", fill_job_ops},           /* server/queue/work.h */
    {"job_states", fill_job_states},     /* server/queue/jobs.h */
};
#define NLISTS ((int)(sizeof lists / sizeof *lists))

/* ---- the text ------------------------------------------------------------------------------- */

struct text {
    char *p;
    size_t n, cap;
    int oom;
};

static void put(struct text *t, const char *s, size_t n)
{
    if (t->oom)
        return;
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->n + n + 1)
            cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = 1;
            return;
        }
        t->p = p, t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

static void put_spaces(struct text *t, int n)
{
    for (int i = 0; i < n; i++)
        put(t, " ", 1);
}

/* YAML reads a bare 15 as a number and yes/no/on/off/null as other scalars: those are quoted */
static int needs_quotes(const char *s)
{
    static const char *const special[] = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", NULL};
    if (!(*s == '_' || (*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z')))
        return 1;
    for (const char *c = s; *c; c++)
        if (!(*c == '_' || (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9')))
            return 1;
    for (int i = 0; special[i]; i++)
        if (!strcasecmp(s, special[i]))
            return 1;
    return 0;
}

/* "enum: [a, b, ...]" at indent, wrapped before WIDTH with the items aligned after the '[' */
static void put_enum(struct text *t, int indent, const struct names *s)
{
    const int start = indent + (int)strlen("enum: [");
    int col = start;
    put_spaces(t, indent);
    put(t, "enum: [", strlen("enum: ["));
    for (int i = 0; i < s->n; i++) {
        const int q = needs_quotes(s->v[i]), len = (int)strlen(s->v[i]) + 2 * q;
        if (i && col + 2 + len + 1 > WIDTH) {
            put(t, ",\n", 2);
            put_spaces(t, start);
            col = start;
        } else if (i) {
            put(t, ", ", 2);
            col += 2;
        }
        if (q)
            put(t, "'", 1);
        put(t, s->v[i], strlen(s->v[i]));
        if (q)
            put(t, "'", 1);
        col += len;
    }
    put(t, "]\n", 2);
}

static const char *line_end(const char *p, const char *end)
{
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    return eol ? eol + 1 : end;
}

static int is_blank(const char *p, const char *end)
{
    for (; p < end; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n')
            return 0;
    return 1;
}

char *qd_openapi_generate(const char *spec, size_t len, char *err, size_t errlen)
{
    struct text out = {0};
    int used[NLISTS] = {0}, line = 1;
    const char *p = spec, *end = spec + len;
    while (p < end) {
        const char *eol = line_end(p, end), *s = p;
        while (s < eol && (*s == ' ' || *s == '\t'))
            s++;
        if ((size_t)(eol - s) < strlen(MARK) || memcmp(s, MARK, strlen(MARK))) {
            put(&out, p, (size_t)(eol - p));
            p = eol, line++;
            continue;
        }
        /* a marker: the list it names, then the enum line(s) it owns */
        const char *w = s + strlen(MARK);
        while (w < eol && *w == ' ')
            w++;
        size_t wn = 0;
        while (w + wn < eol && ((w[wn] >= 'a' && w[wn] <= 'z') || w[wn] == '_'))
            wn++;
        int li = -1;
        for (int i = 0; i < NLISTS; i++)
            if (strlen(lists[i].name) == wn && !memcmp(lists[i].name, w, wn))
                li = i;
        if (li < 0) {
            size_t l = (size_t)snprintf(err, errlen, "line %d: unknown list '%.*s' after '" MARK "' (the lists:", line,
                                        (int)(wn ? wn : (size_t)(eol - w > 40 ? 40 : eol - w)), w);
            for (int i = 0; i < NLISTS && l < errlen; i++)
                l += (size_t)snprintf(err + l, errlen - l, " %s", lists[i].name);
            if (l < errlen)
                snprintf(err + l, errlen - l, ")");
            free(out.p);
            return NULL;
        }
        put(&out, p, (size_t)(eol - p));
        p = eol, line++;
        const char *e = p;
        while (e < end && *e == ' ')
            e++;
        if (p >= end || (size_t)(end - e) < strlen("enum: [") || memcmp(e, "enum: [", strlen("enum: ["))) {
            snprintf(err, errlen, "line %d: '" MARK " %s' is not followed by a line 'enum: [...]'", line - 1,
                     lists[li].name);
            free(out.p);
            return NULL;
        }
        const int indent = (int)(e - p);
        const char *close = memchr(e, ']', (size_t)(end - e));
        if (!close) {
            snprintf(err, errlen, "line %d: the %s enum has no closing ']'", line, lists[li].name);
            free(out.p);
            return NULL;
        }
        const char *after = line_end(close, end);
        if (!is_blank(close + 1, after)) {
            snprintf(err, errlen, "line %d: text after the %s enum's ']' (the marked enum stands alone on its lines)",
                     line, lists[li].name);
            free(out.p);
            return NULL;
        }
        for (const char *c = p; c < after; c++)
            line += *c == '\n';
        struct names names = {0};
        lists[li].fill(&names);
        put_enum(&out, indent, &names);
        out.oom |= names.oom;
        names_free(&names);
        used[li] = 1;
        p = after;
    }
    for (int i = 0; i < NLISTS; i++)
        if (!used[i]) {
            snprintf(err, errlen, "no '" MARK " %s' line: the %s enum would not be made from the code", lists[i].name,
                     lists[i].name);
            free(out.p);
            return NULL;
        }
    if (out.oom || !out.p) {
        snprintf(err, errlen, "%s", out.oom ? "out of memory" : "the spec is empty");
        free(out.p);
        return NULL;
    }
    return out.p;
}

int qd_cli_openapi(int argc, char **argv)
{
    static const char usage[] = "usage: quantd openapi [SPEC]\n"
                                "  prints SPEC (default api/openapi.yaml) with each enum after a '" MARK " LIST'\n"
                                "  line made from the code's table (make openapi writes it back)\n";
    if (argc == 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc > 1 || (argc == 1 && argv[0][0] == '-')) {
        fprintf(stderr, "quantd openapi: unexpected argument '%s'\n%s", argv[argc > 1 ? 1 : 0], usage);
        return 2;
    }
    const char *path = argc ? argv[0] : "api/openapi.yaml";
    size_t len = 0;
    char *spec = qd_file_read(path, &len);
    if (!spec) {
        fprintf(stderr, "quantd openapi: cannot read %s: %s (run it in quantd's source tree, or name the spec: "
                        "quantd openapi PATH)\n", path, strerror(errno));
        return 1;
    }
    char err[1024];
    char *out = qd_openapi_generate(spec, len, err, sizeof err);
    free(spec);
    if (!out) {
        fprintf(stderr, "quantd openapi: %s: %s\n", path, err);
        return 1;
    }
    size_t n = strlen(out);
    int bad = fwrite(out, 1, n, stdout) != n || fflush(stdout) != 0;
    free(out);
    if (bad) {
        fprintf(stderr, "quantd openapi: writing the spec: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}
