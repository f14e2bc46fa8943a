/* JSON spans (json_span.h). */
#include "checkpoint/json_span.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

const char *qd_json_skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

const char *qd_json_string_end(const char *p, const char *end, int *escapes, int *nul)
{
    *escapes = *nul = 0;
    if (p >= end || *p != '"')
        return NULL;
    for (p++; p < end; p++) {
        if (*p == '"')
            return p + 1;
        if (*p != '\\')
            continue;
        *escapes = 1;
        if (++p >= end)
            return NULL;
        if (*p == 'u' && end - p > 4 && !memcmp(p + 1, "0000", 4))
            *nul = 1;
    }
    return NULL;
}

const char *qd_json_value_end(const char *p, const char *end)
{
    int escapes, nul;
    if (p >= end)
        return NULL;
    if (*p == '"')
        return qd_json_string_end(p, end, &escapes, &nul);
    if (*p != '{' && *p != '[') { /* a bare word: up to the next delimiter */
        const char *q = p;
        while (q < end && !strchr(",:]} \t\r\n{[\"", *q))
            q++;
        return q > p ? q : NULL;
    }
    /* nesting counted, not kept: the depth costs nothing here (cJSON bounds it when it parses) */
    size_t depth = 0;
    while (p < end) {
        if (*p == '"') {
            if (!(p = qd_json_string_end(p, end, &escapes, &nul)))
                return NULL;
            continue;
        }
        if (*p == '{' || *p == '[')
            depth++;
        else if ((*p == '}' || *p == ']') && --depth == 0)
            return p + 1;
        p++;
    }
    return NULL;
}

int qd_json_member_next(const char **at, const char *end, struct qd_json_member *m)
{
    const char *p = *at;
    if (!m->index) { /* the first member, or none */
        if (p >= end || *p != '{')
            return -1;
        p = qd_json_skip_ws(p + 1, end);
        if (p < end && *p == '}') {
            *at = p + 1;
            return 0;
        }
    } else {
        p = qd_json_skip_ws(p, end);
        if (p < end && *p == '}') {
            *at = p + 1;
            return 0;
        }
        if (p >= end || *p != ',')
            return -1;
        p = qd_json_skip_ws(p + 1, end);
    }
    int escapes;
    const char *k = qd_json_string_end(p, end, &escapes, &m->key_nul);
    if (!k)
        return -1;
    m->key = p;
    m->key_len = (size_t)(k - p);
    p = qd_json_skip_ws(k, end);
    if (p >= end || *p != ':')
        return -1;
    p = qd_json_skip_ws(p + 1, end);
    m->value_string = p < end && *p == '"';
    m->value_escapes = m->value_nul = 0;
    const char *v = m->value_string ? qd_json_string_end(p, end, &m->value_escapes, &m->value_nul)
                                    : qd_json_value_end(p, end);
    if (!v)
        return -1;
    m->value = p;
    m->value_len = (size_t)(v - p);
    m->index++;
    *at = v;
    return 1;
}

cJSON *qd_json_parse_span(const char *p, size_t n)
{
    const char *stop = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(p, n, &stop, 0);
    if (v && stop != p + n) { /* "1x": cJSON takes the 1 and would leave the x unread */
        cJSON_Delete(v);
        v = NULL;
    }
    return v;
}

char *qd_json_member_key(const struct qd_json_member *m)
{
    cJSON *s = qd_json_parse_span(m->key, m->key_len);
    char *key = cJSON_IsString(s) ? strdup(s->valuestring) : NULL;
    cJSON_Delete(s);
    return key;
}
