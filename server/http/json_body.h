/* A JSON request body read lean (json_body.c). */
#ifndef QD_JSON_BODY_H
#define QD_JSON_BODY_H

#include <stddef.h>

#include "http/reply.h"

struct cJSON;

/* A JSON request body read lean (json_body.c): every "data" member whose value is a string (the
 * base64 tensors, nearly all of a body) stays where it is in the text, a cJSON raw node in its
 * place; the rest is parsed by cJSON, at most limit bytes of it (0: QD_JSON_LIMIT_DEFAULT). */
#define QD_JSON_LIMIT_DEFAULT ((size_t)64 << 10)
struct qd_json_span {
    size_t at, len; /* the string token, quotes included */
    int escapes, nul;
};
struct qd_json_body {
    struct cJSON *root;
    const char *text;
    int n, cap;
    struct qd_json_span *span;
    size_t parsed;  /* bytes parsed by cJSON */
};
/* 0, or -1 with 400 (not a JSON object) or 413 (over the limit) in err. */
int qd_json_body_parse(struct qd_json_body *b, const char *text, size_t len, size_t limit, struct qd_reply *err);
/* The bytes of a "data" value (a raw node or a string), base64-decoded into a malloc'd buffer;
 * NULL when it is not valid base64 or not a string, or on no memory (*oom set). */
unsigned char *qd_json_body_data(const struct qd_json_body *b, const struct cJSON *v, size_t *n, int *oom);
void qd_json_body_free(struct qd_json_body *b);

#endif
