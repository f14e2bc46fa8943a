/* config.json as save_pretrained writes it (hf_config.h). The source is not re-serialized
 * through cJSON, whose numbers are doubles with no memory of how they were spelled: its
 * top-level members are cut out as text and written back around the keys that change. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/hf_config.h"

void qd_py_float_repr(double v, char *out, size_t len)
{
    if (v != v || isinf(v)) {
        snprintf(out, len, "%s", v != v ? "NaN" : v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v)
            break;
    }
    char digits[24];
    int nd = 0, neg = e[0] == '-';
    const char *c = e + neg;
    for (; *c && *c != 'e'; c++)
        if (*c != '.')
            digits[nd++] = *c;
    digits[nd] = 0;
    int exp10 = atoi(c + 1);
    char *o = out;
    size_t left = len;
#define PUT(...) do { int k = snprintf(o, left, __VA_ARGS__); o += k; left -= (size_t)k; } while (0)
    if (neg)
        PUT("-");
    if (exp10 >= 16 || exp10 < -4) {
        PUT("%c", digits[0]);
        if (nd > 1)
            PUT(".%s", digits + 1);
        PUT("e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (exp10 >= 0) {
        for (int i = 0; i <= exp10; i++)
            PUT("%c", i < nd ? digits[i] : '0');
        PUT(".%s", nd > exp10 + 1 ? digits + exp10 + 1 : "0");
    } else {
        PUT("0.");
        for (int i = 0; i < -exp10 - 1; i++)
            PUT("0");
        PUT("%s", digits);
    }
#undef PUT
}

/* ---- an append-only text buffer -------------------------------------------------------------- */

static int put(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *len + n + 1)
            nc *= 2;
        char *p = realloc(*buf, nc);
        if (!p)
            return -1;
        *buf = p, *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

static int puts_(char **buf, size_t *len, size_t *cap, const char *s) { return put(buf, len, cap, s, strlen(s)); }

static int indent(char **buf, size_t *len, size_t *cap, int depth, int width)
{
    for (int i = 0; i < depth * width; i++)
        if (put(buf, len, cap, " ", 1))
            return -1;
    return 0;
}

/* A string as json.dumps writes it (ensure_ascii: every non-ASCII code point as \uXXXX). */
static int put_string(char **buf, size_t *len, size_t *cap, const char *s)
{
    if (put(buf, len, cap, "\"", 1))
        return -1;
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        char esc[16];
        uint32_t cp = *p++;
        int extra = cp >= 0xF0 ? 3 : cp >= 0xE0 ? 2 : cp >= 0xC0 ? 1 : 0;
        if (extra) {
            cp &= 0x3Fu >> extra;
            for (int k = 0; k < extra && (*p & 0xC0) == 0x80; k++)
                cp = cp << 6 | (*p++ & 0x3Fu);
        }
        if (cp == '"' || cp == '\\')
            snprintf(esc, sizeof esc, "\\%c", (char)cp);
        else if (cp == '\n' || cp == '\r' || cp == '\t' || cp == '\b' || cp == '\f')
            snprintf(esc, sizeof esc, "\\%c", cp == '\n' ? 'n' : cp == '\r' ? 'r' : cp == '\t' ? 't' : cp == '\b' ? 'b' : 'f');
        else if (cp < 0x20 || (cp > 0x7F && cp < 0x10000))
            snprintf(esc, sizeof esc, "\\u%04x", cp);
        else if (cp >= 0x10000) /* a surrogate pair, as Python writes it */
            snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
        else
            esc[0] = (char)cp, esc[1] = 0;
        if (puts_(buf, len, cap, esc))
            return -1;
    }
    return put(buf, len, cap, "\"", 1);
}

static int cmp_item(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* json.dump's text of v with `width` spaces per level; objects at depth < sort_depth sorted by key */
static int dump(const cJSON *v, int depth, int width, int sort_depth, char **buf, size_t *len, size_t *cap)
{
    char num[48];
    if (cJSON_IsRaw(v))
        return puts_(buf, len, cap, v->valuestring);
    if (cJSON_IsNull(v))
        return puts_(buf, len, cap, "null");
    if (cJSON_IsBool(v))
        return puts_(buf, len, cap, cJSON_IsTrue(v) ? "true" : "false");
    if (cJSON_IsString(v))
        return put_string(buf, len, cap, v->valuestring);
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            snprintf(num, sizeof num, "%.0f", d);
        else
            qd_py_float_repr(d, num, sizeof num);
        return puts_(buf, len, cap, num);
    }
    int n = cJSON_GetArraySize(v), obj = cJSON_IsObject(v);
    if (n == 0)
        return puts_(buf, len, cap, obj ? "{}" : "[]");
    const cJSON **items = malloc((size_t)n * sizeof *items);
    if (!items)
        return -1;
    int k = 0;
    for (const cJSON *c = v->child; c && k < n; c = c->next)
        items[k++] = c;
    if (obj && depth < sort_depth)
        qsort(items, (size_t)n, sizeof *items, cmp_item);
    int rc = puts_(buf, len, cap, obj ? "{\n" : "[\n");
    for (int i = 0; !rc && i < n; i++) {
        rc = indent(buf, len, cap, depth + 1, width);
        if (!rc && obj)
            rc = put_string(buf, len, cap, items[i]->string) || puts_(buf, len, cap, ": ");
        rc = rc || dump(items[i], depth + 1, width, sort_depth, buf, len, cap) ||
             puts_(buf, len, cap, i + 1 < n ? ",\n" : "\n");
    }
    free(items);
    return rc || indent(buf, len, cap, depth, width) || puts_(buf, len, cap, obj ? "}" : "]");
}

int qd_json_py_dump(const cJSON *v, int depth, char **buf, size_t *len, size_t *cap)
{
    return dump(v, depth, 2, 1 << 30, buf, len, cap);
}

char *qd_json_py_text_styled(const cJSON *v, int width, int sort_depth)
{
    char *out = NULL;
    size_t len = 0, cap = 0;
    if (dump(v, 0, width, sort_depth, &out, &len, &cap)) {
        free(out);
        return NULL;
    }
    return out;
}

char *qd_json_py_text(const cJSON *v)
{
    char *out = NULL;
    size_t len = 0, cap = 0;
    if (qd_json_py_dump(v, 0, &out, &len, &cap) || put(&out, &len, &cap, "\n", 1)) {
        free(out);
        return NULL;
    }
    return out;
}

/* ---- the source, read as Python's json.loads reads it ------------------------------------------ */

/* A recursive-descent reader that keeps what cJSON's parser drops: whether a number was written
 * as a float. Numbers become raw items holding what json.dumps writes for them (an integer's
 * digits, a float's repr); Python's NaN and Infinity literals are read too. Strings are
 * decoded (json.dumps re-escapes them); a repeated key keeps its last value, as a dict does. */
struct reader {
    const char *p, *end;
    int depth;
};

#define MAX_DEPTH 64

static void ws(struct reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int literal(struct reader *r, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n))
        return 0;
    r->p += n;
    return 1;
}

static int hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v << 4 | (unsigned)d;
    }
    return 0;
}

static void utf8(char *o, size_t *k, uint32_t cp)
{
    if (cp < 0x80)
        o[(*k)++] = (char)cp;
    else if (cp < 0x800)
        o[(*k)++] = (char)(0xC0 | cp >> 6), o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    else if (cp < 0x10000)
        o[(*k)++] = (char)(0xE0 | cp >> 12), o[(*k)++] = (char)(0x80 | (cp >> 6 & 0x3F)),
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    else
        o[(*k)++] = (char)(0xF0 | cp >> 18), o[(*k)++] = (char)(0x80 | (cp >> 12 & 0x3F)),
        o[(*k)++] = (char)(0x80 | (cp >> 6 & 0x3F)), o[(*k)++] = (char)(0x80 | (cp & 0x3F));
}

/* The string at r->p (a '"'), decoded to UTF-8 in a new buffer; NULL when malformed. A lone
 * surrogate escape is kept as its code point's 3 bytes, so it is written back as the same
 * escape. */
static char *read_string(struct reader *r)
{
    const char *s = ++r->p;
    while (r->p < r->end && *r->p != '"')
        r->p += *r->p == '\\' ? 2 : 1;
    if (r->p >= r->end)
        return NULL;
    char *o = malloc((size_t)(r->p - s) + 1);
    size_t k = 0;
    for (const char *c = s; o && c < r->p; c++) {
        if (*c != '\\') {
            if ((unsigned char)*c < 0x20) /* a raw control character: json.loads refuses it */
                goto bad;
            o[k++] = *c;
            continue;
        }
        c++;
        const char *simple = strchr("\"\\/bfnrt", *c), *to = "\"\\/\b\f\n\r\t";
        if (simple && *c) {
            o[k++] = to[simple - "\"\\/bfnrt"];
            continue;
        }
        unsigned v, lo;
        if (*c != 'u' || r->p - c < 5 || hex4(c + 1, &v) || v == 0) /* no NUL inside a C string */
            goto bad;
        c += 4;
        if (v >= 0xD800 && v < 0xDC00 && r->p - c >= 7 && c[1] == '\\' && c[2] == 'u' && !hex4(c + 3, &lo) &&
            lo >= 0xDC00 && lo < 0xE000) {
            v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            c += 6;
        }
        utf8(o, &k, v);
    }
    if (!o)
        return NULL;
    o[k] = 0;
    r->p++; /* the closing quote */
    return o;
bad:
    free(o);
    return NULL;
}

static cJSON *read_value(struct reader *r);

static cJSON *read_container(struct reader *r, int obj)
{
    cJSON *c = obj ? cJSON_CreateObject() : cJSON_CreateArray();
    r->p++;
    ws(r);
    if (!c || ++r->depth > MAX_DEPTH)
        goto bad;
    if (r->p < r->end && *r->p == (obj ? '}' : ']')) {
        r->p++;
        r->depth--;
        return c;
    }
    for (;;) {
        char *key = NULL;
        if (obj) {
            if (r->p >= r->end || *r->p != '"' || !(key = read_string(r)))
                goto bad;
            ws(r);
            if (r->p >= r->end || *r->p != ':') {
                free(key);
                goto bad;
            }
            r->p++;
            ws(r);
        }
        cJSON *v = read_value(r);
        if (!v) {
            free(key);
            goto bad;
        }
        if (obj) {
            cJSON_DeleteItemFromObjectCaseSensitive(c, key); /* the last one wins */
            cJSON_AddItemToObject(c, key, v);
            free(key);
        } else
            cJSON_AddItemToArray(c, v);
        ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            ws(r);
            continue;
        }
        if (r->p < r->end && *r->p == (obj ? '}' : ']')) {
            r->p++;
            r->depth--;
            return c;
        }
        goto bad;
    }
bad:
    cJSON_Delete(c);
    return NULL;
}

/* A number token as json.dumps writes what json.loads made of it. */
static cJSON *read_number(struct reader *r)
{
    const char *s = r->p;
    int is_float = 0;
    if (r->p < r->end && *r->p == '-')
        r->p++;
    const char *digits = r->p;
    while (r->p < r->end && ((*r->p >= '0' && *r->p <= '9') || strchr(".eE+-", *r->p))) {
        is_float |= *r->p == '.' || *r->p == 'e' || *r->p == 'E';
        r->p++;
    }
    size_t n = (size_t)(r->p - s);
    if (n == 0 || digits == r->p || n > 400)
        return NULL;
    char tok[408], out[48];
    memcpy(tok, s, n), tok[n] = 0;
    char *end;
    double d = strtod(tok, &end);
    if (end != tok + n)
        return NULL;
    if (is_float) {
        qd_py_float_repr(d, out, sizeof out);
        return cJSON_CreateRaw(out);
    }
    /* an int: Python's are exact at any size; only "-0" reads back as 0 */
    return cJSON_CreateRaw(d == 0.0 ? "0" : tok);
}

static cJSON *read_value(struct reader *r)
{
    if (r->p >= r->end)
        return NULL;
    switch (*r->p) {
    case '{':
    case '[':
        return read_container(r, *r->p == '{');
    case '"': {
        char *s = read_string(r);
        cJSON *v = s ? cJSON_CreateString(s) : NULL;
        free(s);
        return v;
    }
    }
    if (literal(r, "true"))
        return cJSON_CreateTrue();
    if (literal(r, "false"))
        return cJSON_CreateFalse();
    if (literal(r, "null"))
        return cJSON_CreateNull();
    if (literal(r, "NaN"))
        return cJSON_CreateRaw("NaN");
    if (literal(r, "Infinity"))
        return cJSON_CreateRaw("Infinity");
    if (literal(r, "-Infinity"))
        return cJSON_CreateRaw("-Infinity");
    return read_number(r);
}

cJSON *qd_json_py_read(const char *src, size_t n, const char *what, char *err, size_t errlen)
{
    struct reader r = {src, src + n, 0};
    ws(&r);
    cJSON *v = r.p < r.end && *r.p == '{' ? read_value(&r) : NULL;
    ws(&r);
    if (!v || r.p != r.end) {
        snprintf(err, errlen, "%s is not one JSON object (near byte %zu)", what, (size_t)(r.p - src));
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}

char *qd_hf_config_rewrite(const char *src, size_t n, const struct qd_config_set *sets, int nsets, int newline,
                           char *err, size_t errlen)
{
    cJSON *cfg = qd_json_py_read(src, n, "config.json", err, errlen);
    if (!cfg)
        return NULL;
    char *out = NULL;
    for (int s = 0; s < nsets; s++) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, sets[s].key);
        cJSON *v = sets[s].value ? cJSON_Duplicate(sets[s].value, 1) : NULL;
        if (v)
            cJSON_AddItemToObject(cfg, sets[s].key, v);
        else if (sets[s].value)
            goto nomem;
    }
    if (!(out = qd_json_py_text(cfg)))
        goto nomem;
    if (!newline)
        out[strlen(out) - 1] = 0;
    cJSON_Delete(cfg);
    return out;
nomem:
    snprintf(err, errlen, "no memory for config.json");
    cJSON_Delete(cfg);
    return NULL;
}
