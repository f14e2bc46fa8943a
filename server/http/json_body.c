/* JSON request bodies read lean (decode.h): walked member by member (checkpoint/json_span.h);
 * the base64 "data" strings, nearly all of a body, are decoded from where they lie instead of
 * copied into a cJSON string first, and what cJSON parses (everything else) is bounded, so a
 * body costs its own size plus the decoded tensor, not the ~40x of a whole cJSON tree. */
#include <cjson/cJSON.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/json_span.h"
#include "http/base64.h"
#include "http/json_body.h"

/* Objects deeper than this are parsed whole by cJSON: the root, "tensors" and a component are
 * the levels whose "data" members decode reads. */
#define WALK_DEPTH 3
/* What a "data" member counts against the limit (the string itself does not count). */
#define DATA_MEMBER_COST 64
/* A tree built from this much JSON or more is a few MB of small allocations: once freed, their
 * pages go back to the system instead of staying with the thread's heap. */
#define TRIM_AFTER_BYTES ((size_t)256 << 10)

struct walk {
    struct qd_json_body *b;
    size_t used, limit;
    int too_large;
};

static int count(struct walk *w, size_t n)
{
    w->used += n;
    if (w->used > w->limit)
        w->too_large = 1;
    return w->too_large ? -1 : 0;
}

static cJSON *data_node(struct walk *w, const struct qd_json_member *m)
{
    struct qd_json_body *b = w->b;
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 4;
        struct qd_json_span *s = realloc(b->span, (size_t)cap * sizeof *s);
        if (!s)
            return NULL;
        b->span = s;
        b->cap = cap;
    }
    cJSON *v = cJSON_CreateRaw("");
    if (!v)
        return NULL;
    b->span[b->n] = (struct qd_json_span){.at = (size_t)(m->value - b->text), .len = m->value_len,
                                          .escapes = m->value_escapes, .nul = m->value_nul};
    v->valueint = b->n++;
    v->valuedouble = v->valueint;
    return v;
}

/* The object at [at, end) as a cJSON object whose "data" strings are raw nodes; NULL when
 * malformed, over the limit or out of memory. */
static cJSON *walk_object(struct walk *w, const char *at, const char *end, int depth)
{
    cJSON *o = cJSON_CreateObject();
    struct qd_json_member m = {0};
    int rc;
    if (!o)
        return NULL;
    while ((rc = qd_json_member_next(&at, end, &m)) == 1) {
        char *key = count(w, m.key_len) ? NULL : qd_json_member_key(&m);
        cJSON *v = NULL;
        if (key && m.value_string && !strcmp(key, "data"))
            v = count(w, DATA_MEMBER_COST) ? NULL : data_node(w, &m);
        else if (key && *m.value == '{' && depth < WALK_DEPTH)
            v = walk_object(w, m.value, m.value + m.value_len, depth + 1);
        else if (key && !count(w, m.value_len))
            v = qd_json_parse_span(m.value, m.value_len);
        if (!v) {
            free(key);
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddItemToObject(o, key, v);
        free(key);
    }
    if (rc < 0 || at != end) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int qd_json_body_parse(struct qd_json_body *b, const char *text, size_t len, size_t limit, struct qd_reply *err)
{
    memset(b, 0, sizeof *b);
    b->text = text;
    const char *end = text + len, *at = qd_json_skip_ws(text, end), *stop = at < end && *at == '{'
                                                                        ? qd_json_value_end(at, end) : NULL;
    struct walk w = {.b = b, .limit = limit ? limit : QD_JSON_LIMIT_DEFAULT};
    if (stop && qd_json_skip_ws(stop, end) == end)
        b->root = walk_object(&w, at, stop, 1);
    b->parsed = w.used;
    if (b->root)
        return 0;
    if (w.too_large)
        qd_reply_error(err, 413, "json_too_large", "the JSON apart from its base64 \"data\" takes more than %zu bytes "
                       "(--max-json-bytes)", w.limit);
    else
        qd_reply_error(err, 400, "bad_json", "the body is not a JSON object");
    qd_json_body_free(b);
    return -1;
}

unsigned char *qd_json_body_data(const struct qd_json_body *b, const cJSON *v, size_t *n, int *oom)
{
    *oom = 0;
    if (cJSON_IsString(v)) /* a "data" deeper than the walk */
        return qd_base64_decode(v->valuestring, strlen(v->valuestring), n, oom);
    if (!cJSON_IsRaw(v) || v->valueint < 0 || v->valueint >= b->n)
        return NULL;
    const struct qd_json_span *s = &b->span[v->valueint];
    if (s->nul)
        return NULL;
    if (!s->escapes) /* the usual case: the characters between the quotes are the base64 */
        return qd_base64_decode(b->text + s->at + 1, s->len - 2, n, oom);
    /* escaped (a writer that sends "\/" for "/"): unescaped by cJSON, then decoded */
    cJSON *str = qd_json_parse_span(b->text + s->at, s->len);
    unsigned char *out = cJSON_IsString(str) ? qd_base64_decode(str->valuestring, strlen(str->valuestring), n, oom)
                                             : NULL;
    cJSON_Delete(str);
    return out;
}

void qd_json_body_free(struct qd_json_body *b)
{
    cJSON_Delete(b->root);
    free(b->span);
    if (b->parsed >= TRIM_AFTER_BYTES)
        malloc_trim(0);
    memset(b, 0, sizeof *b);
}
