/* libFuzzer target over the request decoders: the URL query, JSON/base64 bodies of /quantize
 * and /dequantize, safetensors containers and base64 alone. The first byte picks the decoder;
 * every input must be accepted or refused with a 4xx/503 reply, never crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/http/decode.h"

static void check_reply(struct qd_reply *r, int rc)
{
    /* a refusal always says why, with a client error or a retry-later status */
    if (rc && !(r->status >= 400 && r->status < 600 && r->body))
        abort();
    qd_reply_free(r);
}

static void fuzz_query(const char *s, size_t n)
{
    char *copy = strndup(s, n);
    struct qd_kv kv[16];
    int k = 0;
    for (char *save, *tok = strtok_r(copy, "&", &save); tok && k < 16; tok = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(tok, '=');
        if (eq)
            *eq++ = 0;
        kv[k++] = (struct qd_kv){tok, eq};
    }
    struct qd_req q = {.op = QD_OP_QUANTIZE};
    struct qd_reply r = {0};
    check_reply(&r, qd_req_from_query(&q, kv, k, 1, &r));
    free(copy);
}

static void fuzz_body(enum qd_op op, enum qd_body_kind kind, const char *fmt, const char *s, size_t n)
{
    struct qd_req q = {.op = op, .f = fmt ? qd_format_find(fmt) : NULL};
    struct qd_work w;
    memset(&w, 0, sizeof w);
    struct qd_reply r = {0};
    char *body = malloc(n ? n : 1);
    memcpy(body, s, n);
    check_reply(&r, qd_work_decode(&w, &q, kind, body, n, &r));
    qd_work_free(&w);
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    static const char *const fmts[] = {NULL, "q8_0", "nf4", "nvfp4", "mxfp6_e3m2", "awq", "int8", "q4_1"};
    const char *fmt = fmts[(data[0] >> 3) & 7];
    switch (data[0] & 7) {
    case 0: fuzz_query(s, n); break;
    case 1: fuzz_body(QD_OP_QUANTIZE, QD_BODY_JSON, fmt, s, n); break;
    case 2: fuzz_body(QD_OP_DEQUANTIZE, QD_BODY_JSON, fmt, s, n); break;
    case 3: fuzz_body(QD_OP_DEQUANTIZE, QD_BODY_SAFETENSORS, fmt, s, n); break;
    case 4: {
        size_t len;
        int oom;
        free(qd_base64_decode(s, n, &len, &oom));
        break;
    }
    default: {
        struct qd_req q = {.op = (data[0] & 1) ? QD_OP_DEQUANTIZE : QD_OP_QUANTIZE};
        (void)qd_body_kind(&q, n ? "application/x-www-form-urlencoded" : NULL, s, n);
        fuzz_body(q.op, (enum qd_body_kind)qd_body_kind(&q, NULL, s, n), fmt, s, n);
    }
    }
    return 0;
}
