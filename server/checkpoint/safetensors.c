/* safetensors checkpoint files: the reader and header writer of safetensors.h. */
#include "checkpoint/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/json_span.h"
#include "checkpoint/names.h"

/* The dtypes of safetensors' Dtype enum and their element widths in bits. */
static const struct {
    const char *name;
    int bits;
} st_dtypes[] = {{"BOOL", 8},  {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8},
                 {"I16", 16},  {"U16", 16}, {"F16", 16}, {"BF16", 16},   {"I32", 32},    {"U32", 32},
                 {"F32", 32},  {"F64", 64}, {"I64", 64}, {"U64", 64},    {"F4", 4},      {"F6_E2M3", 6},
                 {"F6_E3M2", 6}, {NULL, 0}};

int qd_st_dtype_bits(const char *dtype)
{
    for (int i = 0; dtype && st_dtypes[i].name; i++)
        if (!strcmp(dtype, st_dtypes[i].name))
            return st_dtypes[i].bits;
    return 0;
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static int json_u53(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return -1;
    *out = (uint64_t)v->valuedouble;
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const struct qd_st_entry *x = *(const struct qd_st_entry *const *)a, *y = *(const struct qd_st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* A tensor's entry ({"dtype", "shape", "data_offsets"}: under 300 bytes as writers lay it out)
 * is parsed by cJSON on its own, so at most this many bytes of it. */
#define ENTRY_MAX_BYTES 65536
/* __metadata__ pairs (transformers writes one, quantd a few). */
#define METADATA_MAX_PAIRS 1024

/* __metadata__: strings to strings, none holding \u0000 (a C string would cut it short). */
static int parse_metadata(const struct qd_json_member *m, const char *what, cJSON **out, char *err, size_t errlen)
{
    const char *at = m->value, *end = m->value + m->value_len;
    struct qd_json_member pair = {0};
    int rc, n = 0;
    if (*at != '{') {
        snprintf(err, errlen, "%s: __metadata__ must map strings to strings", what);
        return -1;
    }
    while ((rc = qd_json_member_next(&at, end, &pair)) == 1) {
        if (!pair.value_string || ++n > METADATA_MAX_PAIRS) {
            snprintf(err, errlen, "%s: __metadata__ must map strings to strings (at most %d of them)", what,
                     METADATA_MAX_PAIRS);
            return -1;
        }
        if (pair.key_nul || pair.value_nul) {
            snprintf(err, errlen, "%s: __metadata__ holds a NUL character (\\u0000) in a key or value", what);
            return -1;
        }
    }
    if (rc < 0 || !(*out = qd_json_parse_span(m->value, m->value_len))) {
        snprintf(err, errlen, "%s: __metadata__ is not a JSON object of strings", what);
        return -1;
    }
    return 0;
}

/* One tensor's entry into t (t->name set). */
static int parse_entry(const struct qd_json_member *m, uint64_t data_len, const uint8_t *data, const char *what,
                       struct qd_st_entry *t, char *err, size_t errlen)
{
    if (m->value_len > ENTRY_MAX_BYTES) {
        snprintf(err, errlen, "%s: tensor '%.200s': its entry takes %zu bytes of the header (at most %d)", what,
                 t->name, m->value_len, ENTRY_MAX_BYTES);
        return -1;
    }
    cJSON *e = qd_json_parse_span(m->value, m->value_len);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(e, "shape"),
                *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), *d;
    int rc = -1;
    const char *dts = cJSON_GetStringValue(dt);
    if (!cJSON_IsObject(e)) {
        snprintf(err, errlen, "%s: tensor '%.200s': its entry is not a JSON object {\"dtype\", \"shape\", "
                 "\"data_offsets\"}", what, t->name);
        goto done;
    }
    if (!dts || strlen(dts) >= sizeof t->dtype || !(t->elem_bits = qd_st_dtype_bits(dts))) {
        snprintf(err, errlen, "%s: tensor '%.200s': dtype %.20s unknown", what, t->name, dts ? dts : "(none)");
        goto done;
    }
    strcpy(t->dtype, dts);
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > QD_ST_MAX_DIMS || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2 || json_u53(cJSON_GetArrayItem(off, 0), &t->begin) ||
        json_u53(cJSON_GetArrayItem(off, 1), &t->end) || t->begin > t->end || t->end > data_len) {
        snprintf(err, errlen, "%s: tensor '%.200s': shape or data_offsets missing, malformed or past the "
                 "%" PRIu64 "-byte data", what, t->name, data_len);
        goto done;
    }
    uint64_t numel = 1;
    cJSON_ArrayForEach(d, sh) {
        uint64_t v;
        if (json_u53(d, &v) || (v && numel > (UINT64_C(1) << 60) / v)) {
            snprintf(err, errlen, "%s: tensor '%.200s': bad or overflowing shape", what, t->name);
            goto done;
        }
        numel *= v;
        t->shape[t->ndim++] = (int64_t)v;
    }
    uint64_t bits = numel * (uint64_t)t->elem_bits;
    if (bits % 8 || bits / 8 != t->end - t->begin) {
        snprintf(err, errlen, "%s: tensor '%.200s': %" PRIu64 " bytes for a shape and dtype that need %" PRIu64
                 "%s", what, t->name, t->end - t->begin, bits / 8, bits % 8 ? " and a bit" : "");
        goto done;
    }
    t->data = data + t->begin;
    rc = 0;
done:
    cJSON_Delete(e);
    return rc;
}

int qd_st_parse(const uint8_t *buf, size_t len, uint64_t max_header, const char *what, struct qd_st_file *f,
                char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    if (!max_header)
        max_header = QD_ST_MAX_HEADER;
    if (len < 8) {
        snprintf(err, errlen, "%s: %zu bytes, shorter than the 8-byte header length", what, len);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > len - 8) {
        snprintf(err, errlen, "%s: header length %" PRIu64 " is past the end (%zu bytes)", what, hlen, len);
        return -1;
    }
    if (hlen > max_header) {
        snprintf(err, errlen, "%s: the header takes %" PRIu64 " bytes, over the limit of %" PRIu64, what, hlen,
                 max_header);
        return -1;
    }
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    /* walked member by member: each entry is a small cJSON parse of its own, never the whole header */
    const char *at = qd_json_skip_ws((const char *)buf + 8, (const char *)data), *end = (const char *)data;
    struct qd_st_entry **order = NULL;
    const char **names = NULL;
    struct qd_json_member m = {0};
    int rc, cap = 0;
    if (at >= end || *at != '{') {
        snprintf(err, errlen, "%s: the header is not a JSON object", what);
        goto bad;
    }
    while ((rc = qd_json_member_next(&at, end, &m)) == 1) {
        if (m.key_nul) {
            snprintf(err, errlen, "%s: a tensor name holds a NUL character (\\u0000)", what);
            goto bad;
        }
        char *name = qd_json_member_key(&m);
        if (!name) {
            snprintf(err, errlen, "%s: the header is not a JSON object (a malformed name)", what);
            goto bad;
        }
        if (!strcmp(name, "__metadata__")) {
            int twice = f->metadata != NULL;
            free(name);
            if (twice) {
                snprintf(err, errlen, "%s: __metadata__ appears twice", what);
                goto bad;
            }
            if (parse_metadata(&m, what, &f->metadata, err, errlen))
                goto bad;
            continue;
        }
        if (f->n == cap) {
            int more = cap ? cap * 2 : 64;
            struct qd_st_entry *t = realloc(f->t, (size_t)more * sizeof *t);
            if (!t) {
                free(name);
                snprintf(err, errlen, "%s: no memory for %d tensors", what, more);
                goto bad;
            }
            memset(t + cap, 0, (size_t)(more - cap) * sizeof *t);
            f->t = t;
            cap = more;
        }
        struct qd_st_entry *t = &f->t[f->n++];
        t->name = name;
        if (parse_entry(&m, data_len, data, what, t, err, errlen))
            goto bad;
    }
    if (rc < 0 || qd_json_skip_ws(at, end) != end) {
        snprintf(err, errlen, "%s: the header is not a JSON object (malformed at byte %zu)", what,
                 (size_t)(at - (const char *)buf));
        goto bad;
    }
    /* every name once: a second entry of a name would write a file its readers refuse */
    names = malloc((size_t)(f->n ? f->n : 1) * sizeof *names);
    order = malloc((size_t)(f->n ? f->n : 1) * sizeof *order);
    if (!names || !order) {
        snprintf(err, errlen, "%s: no memory for %d tensors", what, f->n);
        goto bad;
    }
    for (int i = 0; i < f->n; i++)
        names[i] = f->t[i].name, order[i] = &f->t[i];
    const char *dup;
    qd_names_duplicate(names, (size_t)f->n, &dup);
    if (dup) {
        snprintf(err, errlen, "%s: tensor '%.200s' appears twice in the header", what, dup);
        goto bad;
    }
    /* the tensors tile the data section: in offset order, each begins where the last ended */
    qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
    uint64_t pos = 0;
    for (int i = 0; i < f->n; i++) {
        if (order[i]->begin != pos) {
            snprintf(err, errlen, "%s: tensor '%.200s' begins at %" PRIu64 ", not where the one before ends (%" PRIu64
                     "): overlapping or a hole", what, order[i]->name, order[i]->begin, pos);
            goto bad;
        }
        pos = order[i]->end;
    }
    if (pos != data_len) {
        snprintf(err, errlen, "%s: the tensors cover %" PRIu64 " of the %" PRIu64 " data bytes", what, pos, data_len);
        goto bad;
    }
    free(names);
    free(order);
    return 0;
bad:
    free(names);
    free(order);
    qd_st_free(f);
    return -1;
}

void qd_st_free(struct qd_st_file *f)
{
    for (int i = 0; f->t && i < f->n; i++)
        free(f->t[i].name);
    free(f->t);
    cJSON_Delete(f->metadata);
    memset(f, 0, sizeof *f);
}

/* A JSON string as cJSON prints it ('"', '\\' and the control characters escaped, the rest as
 * is), so that the header's bytes are the ones a cJSON tree would give. */
static void put_json_string(FILE *o, const char *s)
{
    fputc('"', o);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        static const char short_escape[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
        if (*p == '"' || *p == '\\')
            fprintf(o, "\\%c", *p);
        else if (*p < 32 && *p < sizeof short_escape && short_escape[*p])
            fprintf(o, "\\%c", short_escape[*p]);
        else if (*p < 32)
            fprintf(o, "\\u%04x", *p);
        else
            fputc(*p, o);
    }
    fputc('"', o);
}

/* A count or offset as cJSON prints a number: 15 significant digits when they give it back
 * (every integer below 10^15 in full), else 17. */
static void put_json_number(FILE *o, uint64_t v)
{
    char b[32];
    double d = (double)v, back = 0;
    snprintf(b, sizeof b, "%1.15g", d);
    if (sscanf(b, "%lg", &back) != 1 || back != d)
        snprintf(b, sizeof b, "%1.17g", d);
    fputs(b, o);
}

uint8_t *qd_st_header(const struct qd_st_out *t, int n, const cJSON *metadata, size_t *len)
{
    /* written as text, entry by entry: a tree of every tensor would cost ~40x the header */
    char *text = NULL;
    size_t tl = 0;
    FILE *o = open_memstream(&text, &tl);
    if (!o)
        return NULL;
    fputc('{', o);
    if (metadata) {
        char *m = cJSON_PrintUnformatted(metadata);
        if (!m) {
            fclose(o);
            free(text);
            return NULL;
        }
        fprintf(o, "\"__metadata__\":%s", m);
        free(m);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (i || metadata)
            fputc(',', o);
        put_json_string(o, t[i].name);
        fputs(":{\"dtype\":", o);
        put_json_string(o, t[i].dtype);
        fputs(",\"shape\":[", o);
        for (int d = 0; d < t[i].ndim; d++) {
            if (d)
                fputc(',', o);
            put_json_number(o, (uint64_t)t[i].shape[d]);
        }
        fputs("],\"data_offsets\":[", o);
        put_json_number(o, off);
        fputc(',', o);
        put_json_number(o, off + t[i].bytes);
        fputs("]}", o);
        off += t[i].bytes;
    }
    fputc('}', o);
    if (fclose(o)) {
        free(text);
        return NULL;
    }
    /* padded with spaces so that the data section, and every 8-byte dtype in it, is aligned */
    size_t hl = (tl + 7) / 8 * 8;
    uint8_t *out = malloc(8 + hl);
    if (out) {
        for (int i = 0; i < 8; i++)
            out[i] = (uint8_t)((uint64_t)hl >> (8 * i));
        memcpy(out + 8, text, tl);
        memset(out + 8 + tl, ' ', hl - tl);
        *len = 8 + hl;
    }
    free(text);
    return out;
}
