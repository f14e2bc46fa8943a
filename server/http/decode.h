/* Request decoders: the URL query, raw and JSON/base64 tensors, safetensors containers. Pure
 * functions over bytes (no HTTP, no globals), so they are unit-tested and fuzzed directly
 * (tests/server/fuzz_decode.c). Each failure fills a qd_reply with a 4xx JSON error. */
#ifndef QD_DECODE_H
#define QD_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "http/reply.h"
#include "queue/work.h"

struct qd_kv {
    const char *key, *value;
};

/* Decodes the query of /quantize, /dequantize or /jobs into q (op set by the caller, or by an
 * op= key when allow_op). Unknown keys that are not parameters of fmt are errors. Returns 0, or
 * -1 with a 400 in err. */
int qd_req_from_query(struct qd_req *q, const struct qd_kv *kv, int n, int allow_op,
                      struct qd_reply *err);

/* The body kind for a request and its Content-Type (NULL when absent); -1 for a type quantd
 * does not take (415). curl's default form type is taken as untyped, as curl --data-binary
 * sends it without -H. */
int qd_body_kind(const struct qd_req *q, const char *content_type, const char *body, size_t len);

/* Decodes a whole request: q from the query, body of the given kind. Fills w (which then owns
 * any buffers it allocated; the body must outlive w when raw). Returns 0 or -1 with err. */
/* The body of an asynchronous job checked before it is accepted, by the decode the worker will
 * run (raw bodies were checked on their length already). Sets *fmt to the format run (for
 * metrics). 0, or -1 with the answer. */
int qd_work_precheck(const struct qd_req *q, enum qd_body_kind kind, const char *body, size_t len,
                     const struct qd_format **fmt, struct qd_reply *err);
int qd_work_decode(struct qd_work *w, const struct qd_req *q, enum qd_body_kind kind, char *body,
                   size_t len, struct qd_reply *err);

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

/* Standard base64 with padding. decode returns a malloc'd buffer, NULL on bad input (bad
 * character, bad length or padding) or no memory (*oom set). encode writes 4*ceil(n/3) chars. */
unsigned char *qd_base64_decode(const char *s, size_t n, size_t *out_len, int *oom);
size_t qd_base64_encoded_len(size_t n);
void qd_base64_encode(const unsigned char *in, size_t n, char *out);

/* One tensor of a safetensors container, pointing into the container. */
struct qd_st_tensor {
    char name[64];
    enum qd_dtype dtype;
    int ndim;
    int64_t shape[QD_MAX_DIMS];
    const unsigned char *data;
    size_t bytes;
};

#define QD_ST_MAX_TENSORS 16

/* Parses a safetensors container: u64 LE header length, JSON header, data. On success returns
 * the tensor count and sets *metadata to the parsed __metadata__ object (caller deletes; NULL
 * when absent). -1 with a message on malformed input. The header may take max_header bytes (0:
 * QD_JSON_LIMIT_DEFAULT). */
int qd_safetensors_parse(const unsigned char *buf, size_t len, size_t max_header, struct qd_st_tensor *t, int max,
                         struct cJSON **metadata, char *err, size_t errlen);

#endif
