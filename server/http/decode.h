/* Request decoders: the URL query, raw and JSON/base64 tensors, safetensors containers. Pure
 * functions over bytes (no HTTP, no globals), so they are unit-tested and fuzzed directly
 * (tests/server/fuzz_decode.c). Each failure fills a qd_reply with a 4xx JSON error. */
#ifndef QD_DECODE_H
#define QD_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "http/base64.h"
#include "http/json_body.h"
#include "http/reply.h"
#include "http/safetensors.h"
#include "queue/work.h"

struct qd_kv {
    const char *key, *value;
};

/* Decodes the query of /quantize, /dequantize or /jobs into q (op set by the caller, or by an
 * op= key when allow_op). Unknown keys that are not parameters of fmt are errors. op=convert
 * only sets q->op: a conversion's query is its request's (convert_job.h). Returns 0, or -1
 * with a 400 in err. */
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

#endif
