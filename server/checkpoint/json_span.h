/* JSON read member by member as spans of the text, without building it: a safetensors header
 * and a request body are walked this way so that only small values go through cJSON (whose
 * tree takes up to ~40 times the text it parses), and large strings stay where they are. The
 * walk checks the structure it steps over (objects, keys, strings); cJSON checks every value it
 * is given. */
#ifndef QD_JSON_SPAN_H
#define QD_JSON_SPAN_H

#include <stddef.h>

/* p past any JSON whitespace. */
const char *qd_json_skip_ws(const char *p, const char *end);

/* A string token at p (on its '"'): the end (after the closing quote), or NULL when it does not
 * close. *escapes: it holds a backslash; *nul: it holds the escape \u0000 (which a C string would
 * cut short). */
const char *qd_json_string_end(const char *p, const char *end, int *escapes, int *nul);

/* The end of the value at p: a string, an object or array (brackets counted, strings skipped),
 * or a bare word (number, true, false, null). NULL when the text ends first or p holds none. */
const char *qd_json_value_end(const char *p, const char *end);

struct qd_json_member {
    int index;                /* members read so far: 0 (zeroed) before the first call */
    const char *key, *value;  /* raw tokens, the key's quotes included */
    size_t key_len, value_len;
    int key_nul;              /* the key holds \u0000 */
    int value_string;         /* the value is a string token */
    int value_escapes, value_nul;
};

/* The members of an object in turn: *at on its '{' and m zeroed for the first call, then where
 * the last call left them. 1 with the next member in m, 0 at the end (*at after the '}'), -1
 * when malformed. */
int qd_json_member_next(const char **at, const char *end, struct qd_json_member *m);

/* One value of [p, p + n) parsed by cJSON, which must end exactly there; NULL when it does not
 * (or on no memory). */
struct cJSON *qd_json_parse_span(const char *p, size_t n);

/* The key of m unescaped (malloc'd), NULL on no memory or a malformed escape. */
char *qd_json_member_key(const struct qd_json_member *m);

#endif
