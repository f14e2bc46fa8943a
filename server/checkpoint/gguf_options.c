/* The options of gguf_options.h, parsed as llama-quantize parses them. */
#include "checkpoint/gguf_options.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "checkpoint/convert.h"

void qd_gguf_options_init(struct qd_gguf_options *o)
{
    memset(o, 0, sizeof *o);
    o->output_tensor_type = o->token_embedding_type = QD_GGUF_TYPE_NONE;
}

void qd_gguf_options_free(struct qd_gguf_options *o)
{
    for (int i = 0; i < o->n_tensor_types; i++) {
        free(o->tensor_types[i].pattern);
        qd_name_filter_free(o->tensor_types[i].match);
    }
    for (int i = 0; i < o->n_include; i++)
        free(o->include_weights[i]);
    for (int i = 0; i < o->n_exclude; i++)
        free(o->exclude_weights[i]);
    free(o->imatrix);
    free(o->imatrix_path);
    qd_gguf_options_init(o);
}

uint32_t qd_gguf_type_parse(const char *name)
{
    for (uint32_t t = 0; name && t < QD_GGML_TYPE_COUNT; t++)
        if (qd_ggml_type(t) && !strcasecmp(qd_ggml_type(t)->name, name))
            return t;
    return QD_GGUF_TYPE_NONE;
}

static int type_arg(uint32_t *slot, const char *opt, const char *v, char *err, size_t errlen)
{
    if ((*slot = qd_gguf_type_parse(v)) == QD_GGUF_TYPE_NONE) {
        snprintf(err, errlen, "--%s: '%.40s' is not a ggml type (q4_0, q8_0, q4_K, q6_K, f16, ... in any case)", opt,
                 v);
        return -1;
    }
    return 0;
}

/* llama.cpp compiles the pattern as a std::regex (ECMAScript) and searches the name with it;
 * quantd's name filters are POSIX extended regexes, which read the patterns people write for
 * tensor names (literals, '.', classes, groups, alternation, repetition) the same way. \d, which
 * POSIX lacks, becomes [0-9] (a \D was lowercased to \d before, as llama-quantize lowercases
 * the whole pattern); ECMAScript's own group syntax ((?...)) is refused rather than read
 * differently. */
static int translate_pattern(const char *in, char *out, size_t cap, char *err, size_t errlen)
{
    size_t n = 0;
    for (const char *p = in; *p; p++) {
        const char *put = NULL;
        char one[3] = {*p, 0, 0};
        if (p[0] == '(' && p[1] == '?') {
            snprintf(err, errlen, "--tensor-type: '%.80s': (?...) groups are ECMAScript syntax quantd does not take; "
                     "write the pattern without them", in);
            return -1;
        }
        if (p[0] == '\\' && p[1]) {
            p++;
            put = *p == 'd' ? "[0-9]" : *p == 'D' ? "[^0-9]" : NULL;
            if (!put) {
                one[0] = '\\', one[1] = *p;
                put = one;
            }
        } else
            put = one;
        size_t k = strlen(put);
        if (n + k >= cap) {
            snprintf(err, errlen, "--tensor-type: the pattern '%.40s...' is longer than %d bytes", in,
                     QD_NAME_FILTER_MAX_BYTES);
            return -1;
        }
        memcpy(out + n, put, k);
        n += k;
    }
    out[n] = 0;
    return 0;
}

/* quantize.cpp parse_tensor_type: PATTERN=TYPE, the pattern lowercased. */
static int add_tensor_type(struct qd_gguf_options *o, const char *v, char *err, size_t errlen)
{
    const char *eq = strchr(v, '=');
    if (!eq || eq == v || !eq[1]) {
        snprintf(err, errlen, "--tensor-type: '%.80s' %s: give PATTERN=TYPE (attn_v=q8_0, blk\\.[0-9]+\\.ffn_down=q6_k)",
                 v, !eq ? "has no '='" : eq == v ? "has no tensor name" : "has no type");
        return -1;
    }
    if (o->n_tensor_types == QD_GGUF_MAX_TENSOR_TYPES) {
        snprintf(err, errlen, "--tensor-type: at most %d patterns", QD_GGUF_MAX_TENSOR_TYPES);
        return -1;
    }
    uint32_t type = qd_gguf_type_parse(eq + 1);
    if (type == QD_GGUF_TYPE_NONE) {
        snprintf(err, errlen, "--tensor-type: '%.40s' in '%.80s' is not a ggml type (q4_0, q8_0, q4_K, q6_K, f16, ...)",
                 eq + 1, v);
        return -1;
    }
    char *pattern = strndup(v, (size_t)(eq - v));
    char posix[QD_NAME_FILTER_MAX_BYTES + 1];
    if (!pattern) {
        snprintf(err, errlen, "no memory");
        return -1;
    }
    for (char *c = pattern; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    struct qd_name_filter *match = NULL; /* (its refusals name --tensor-type and the pattern given) */
    if (translate_pattern(pattern, posix, sizeof posix, err, errlen) ||
        !(match = qd_name_filter_pattern("--tensor-type", pattern, posix, err, errlen))) {
        free(pattern);
        return -1;
    }
    o->tensor_types[o->n_tensor_types++] = (struct qd_gguf_tensor_type){pattern, match, type};
    return 0;
}

/* quantize.cpp parse_tensor_type_file: PATTERN=TYPE entries separated by white space. */
static int add_tensor_type_file(struct qd_gguf_options *o, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--tensor-type-file: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char word[1024];
    int rc = 0;
    while (!rc && fscanf(f, "%1023s", word) == 1)
        rc = add_tensor_type(o, word, err, errlen);
    fclose(f);
    return rc;
}

/* common.cpp string_parse_kv_override: KEY=int:N, float:X, bool:true|false or str:TEXT. */
static int add_kv_override(struct qd_gguf_options *o, const char *v, char *err, size_t errlen)
{
    const char *eq = strchr(v, '=');
    static const char usage[] = "give KEY=TYPE:VALUE, TYPE int, float, bool or str (tokenizer.ggml.add_bos_token=bool:false)";
    if (!eq || eq == v || eq - v >= 128) {
        snprintf(err, errlen, "--override-kv: '%.80s' %s; %s", v, !eq || eq == v ? "has no key" : "has a key over 127 bytes",
                 usage);
        return -1;
    }
    if (o->n_kv_overrides == QD_GGUF_MAX_KV_OVERRIDES) {
        snprintf(err, errlen, "--override-kv: at most %d keys", QD_GGUF_MAX_KV_OVERRIDES);
        return -1;
    }
    struct qd_gguf_kv_override k = {0};
    memcpy(k.key, v, (size_t)(eq - v));
    const char *val = eq + 1;
    char *end;
    if (!strncmp(val, "int:", 4)) {
        k.tag = QD_KVO_INT;
        errno = 0;
        k.i = strtoll(val + 4, &end, 10);
        if (end == val + 4 || *end || errno) {
            snprintf(err, errlen, "--override-kv: '%.80s': '%.40s' is not an integer", v, val + 4);
            return -1;
        }
    } else if (!strncmp(val, "float:", 6)) {
        k.tag = QD_KVO_FLOAT;
        k.f = strtod(val + 6, &end);
        if (end == val + 6 || *end) {
            snprintf(err, errlen, "--override-kv: '%.80s': '%.40s' is not a number", v, val + 6);
            return -1;
        }
    } else if (!strncmp(val, "bool:", 5)) {
        k.tag = QD_KVO_BOOL;
        if (strcmp(val + 5, "true") && strcmp(val + 5, "false")) {
            snprintf(err, errlen, "--override-kv: '%.80s': a bool is true or false", v);
            return -1;
        }
        k.b = !strcmp(val + 5, "true");
    } else if (!strncmp(val, "str:", 4)) {
        k.tag = QD_KVO_STR;
        if (strlen(val + 4) > 127) {
            snprintf(err, errlen, "--override-kv: '%.60s...': a string value is at most 127 bytes", v);
            return -1;
        }
        snprintf(k.s, sizeof k.s, "%s", val + 4);
    } else {
        snprintf(err, errlen, "--override-kv: '%.80s' has no type; %s", v, usage);
        return -1;
    }
    o->kv_overrides[o->n_kv_overrides++] = k;
    return 0;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* quantize.cpp parse_layer_prune: comma-separated layer numbers, sorted and made unique. */
static int set_prune(struct qd_gguf_options *o, const char *v, char *err, size_t errlen)
{
    o->n_prune = 0;
    for (const char *p = v;;) {
        char *end;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (end == p || id < 0 || id > 1000000 || errno || (*end && *end != ',')) {
            snprintf(err, errlen, "--prune-layers: invalid layer id in '%.80s' (give layer numbers: 0,5,7)", v);
            return -1;
        }
        if (o->n_prune == QD_GGUF_MAX_PRUNE) {
            snprintf(err, errlen, "--prune-layers: at most %d layers", QD_GGUF_MAX_PRUNE);
            return -1;
        }
        o->prune[o->n_prune++] = (int)id;
        if (!*end)
            break;
        p = end + 1;
    }
    qsort(o->prune, (size_t)o->n_prune, sizeof *o->prune, cmp_int);
    int n = 0;
    for (int i = 0; i < o->n_prune; i++)
        if (!n || o->prune[n - 1] != o->prune[i])
            o->prune[n++] = o->prune[i];
    o->n_prune = n;
    return 0;
}

/* --include-weights / --exclude-weights NAME: repeatable, one kind only (quantize.cpp). */
static int add_weight_name(struct qd_gguf_options *o, int include, const char *v, char *err, size_t errlen)
{
    int *n = include ? &o->n_include : &o->n_exclude;
    if ((include ? o->n_exclude : o->n_include) > 0) {
        snprintf(err, errlen, "--include-weights and --exclude-weights cannot be used together (llama-quantize "
                 "refuses it too)");
        return -1;
    }
    if (*n == QD_GGUF_MAX_WEIGHT_NAMES) {
        snprintf(err, errlen, "--%s-weights: at most %d names", include ? "include" : "exclude",
                 QD_GGUF_MAX_WEIGHT_NAMES);
        return -1;
    }
    char **slot = include ? &o->include_weights[*n] : &o->exclude_weights[*n];
    if (!(*slot = strdup(v))) {
        snprintf(err, errlen, "no memory");
        return -1;
    }
    (*n)++;
    return 0;
}

static int set_imatrix(struct qd_gguf_options *o, const char *v, char *err, size_t errlen)
{
    free(o->imatrix);
    free(o->imatrix_path);
    o->imatrix = strdup(v);
    o->imatrix_path = strdup(v);
    if (!o->imatrix || !o->imatrix_path) {
        snprintf(err, errlen, "no memory");
        return -1;
    }
    return 0;
}

/* gguf-split's --split-max-tensors N and --split-max-size N(M|G) (10^6 and 10^9 bytes); one of
 * them. */
static int set_split(struct qd_gguf_options *o, int by_size, const char *v, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    const char unit = by_size ? *end : 0;
    if (end == v || n <= 0 || n > 1000000000L || errno || (by_size ? (unit != 'M' && unit != 'G') || end[1] : *end != 0)) {
        snprintf(err, errlen, "--split-max-%s: '%.40s' is not %s", by_size ? "size" : "tensors", v,
                 by_size ? "a positive size in M (10^6 bytes) or G (10^9 bytes): 500M, 4G" : "a positive count");
        return -1;
    }
    if (by_size ? o->split_max_tensors > 0 : o->split_max_bytes > 0) {
        snprintf(err, errlen, "give --split-max-tensors or --split-max-size, not both (as gguf-split)");
        return -1;
    }
    if (o->keep_split) {
        snprintf(err, errlen, "give --keep-split (the input's shards) or --split-max-%s (a new cut), not both",
                 by_size ? "size" : "tensors");
        return -1;
    }
    if (by_size)
        o->split_max_bytes = (uint64_t)n * (unit == 'M' ? 1000000ull : 1000000000ull);
    else
        o->split_max_tensors = (int)n;
    return 0;
}

/* A flag's value: absent (the command line, a bare query parameter) or true/false. */
static int flag(int *slot, const char *opt, const char *v, char *err, size_t errlen)
{
    if (!v || !*v || !strcmp(v, "true"))
        *slot = 1;
    else if (!strcmp(v, "false"))
        *slot = 0;
    else {
        snprintf(err, errlen, "%s takes true or false (got '%.40s')", opt, v);
        return -1;
    }
    return 0;
}

enum opt_id { PURE, LEAVE_OUTPUT, ALLOW_REQUANT, DRY_RUN, OUTPUT_TYPE, TOKEN_EMBD_TYPE, TENSOR_TYPE,
              TENSOR_TYPE_FILE, OVERRIDE_KV, PRUNE, IMATRIX, INCLUDE_WEIGHTS, EXCLUDE_WEIGHTS, SPLIT_TENSORS,
              SPLIT_SIZE, KEEP_SPLIT };
static const struct {
    const char *name;
    enum opt_id id;
    int takes_value;
} options[] = {
    {"pure", PURE, 0},
    {"leave-output-tensor", LEAVE_OUTPUT, 0},
    {"allow-requantize", ALLOW_REQUANT, 0},
    {"dry-run", DRY_RUN, 0},
    {"output-tensor-type", OUTPUT_TYPE, 1},
    {"token-embedding-type", TOKEN_EMBD_TYPE, 1},
    {"tensor-type", TENSOR_TYPE, 1},
    {"tensor-type-file", TENSOR_TYPE_FILE, 1},
    {"override-kv", OVERRIDE_KV, 1},
    {"prune-layers", PRUNE, 1},
    {"imatrix", IMATRIX, 1},
    {"include-weights", INCLUDE_WEIGHTS, 1},
    {"exclude-weights", EXCLUDE_WEIGHTS, 1},
    {"split-max-tensors", SPLIT_TENSORS, 1},
    {"split-max-size", SPLIT_SIZE, 1},
    {"keep-split", KEEP_SPLIT, 0},
};
#define N_OPTIONS (int)(sizeof options / sizeof *options)

/* The option's index for a name spelled with '-' or '_', or -1. */
static int option_index(const char *name)
{
    for (int i = 0; name && i < N_OPTIONS; i++) {
        const char *a = options[i].name, *b = name;
        while (*a && (*a == *b || (*a == '-' && *b == '_')))
            a++, b++;
        if (!*a && !*b)
            return i;
    }
    return -1;
}

int qd_gguf_option_known(const char *name, int *takes_value)
{
    int i = option_index(name);
    if (i >= 0 && takes_value)
        *takes_value = options[i].takes_value;
    return i >= 0;
}

const char *qd_gguf_option_names(void)
{
    return "--pure --leave-output-tensor --allow-requantize --dry-run --output-tensor-type TYPE "
           "--token-embedding-type TYPE --tensor-type PATTERN=TYPE --tensor-type-file FILE --override-kv KEY=TYPE:VALUE "
           "--prune-layers L0,L1,... --imatrix FILE --include-weights NAME --exclude-weights NAME "
           "--split-max-tensors N --split-max-size N(M|G) --keep-split";
}

int qd_gguf_option_set(struct qd_gguf_options *o, const char *name, const char *v, char *err, size_t errlen)
{
    int i = option_index(name);
    if (i < 0) {
        snprintf(err, errlen, "unknown llama-quantize option '%.60s' (quantd takes %s)", name ? name : "",
                 qd_gguf_option_names());
        return -1;
    }
    const char *opt = options[i].name;
    if (options[i].takes_value && (!v || !*v)) {
        snprintf(err, errlen, "--%s needs a value", opt);
        return -1;
    }
    o->n_set++;
    switch (options[i].id) {
    case PURE: return flag(&o->pure, "--pure", v, err, errlen);
    case LEAVE_OUTPUT: return flag(&o->leave_output_tensor, "--leave-output-tensor", v, err, errlen);
    case ALLOW_REQUANT: return flag(&o->allow_requantize, "--allow-requantize", v, err, errlen);
    case DRY_RUN: return flag(&o->dry_run, "--dry-run", v, err, errlen);
    case OUTPUT_TYPE: return type_arg(&o->output_tensor_type, opt, v, err, errlen);
    case TOKEN_EMBD_TYPE: return type_arg(&o->token_embedding_type, opt, v, err, errlen);
    case TENSOR_TYPE: return add_tensor_type(o, v, err, errlen);
    case TENSOR_TYPE_FILE: return add_tensor_type_file(o, v, err, errlen);
    case OVERRIDE_KV: return add_kv_override(o, v, err, errlen);
    case PRUNE: return set_prune(o, v, err, errlen);
    case IMATRIX: return set_imatrix(o, v, err, errlen);
    case INCLUDE_WEIGHTS: return add_weight_name(o, 1, v, err, errlen);
    case EXCLUDE_WEIGHTS: return add_weight_name(o, 0, v, err, errlen);
    case SPLIT_TENSORS: return set_split(o, 0, v, err, errlen);
    case SPLIT_SIZE: return set_split(o, 1, v, err, errlen);
    case KEEP_SPLIT:
        if (flag(&o->keep_split, "--keep-split", v, err, errlen))
            return -1;
        if (o->keep_split && (o->split_max_tensors || o->split_max_bytes)) {
            snprintf(err, errlen, "give --keep-split (the input's shards) or --split-max-%s (a new cut), not both",
                     o->split_max_bytes ? "size" : "tensors");
            return -1;
        }
        return 0;
    }
    return -1;
}
