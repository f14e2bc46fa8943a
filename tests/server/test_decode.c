/* The request decoders on their own (server/decode.c, base64.c, safetensors.c): the cases the
 * service tests cannot reach cheaply. */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "../../server/http/decode.h"
#include "../../server/http/encode.h"
#include "../../server/queue/hostmem.h"

static void base64_round_trips_every_length(void **state)
{
    unsigned char in[300];
    for (int i = 0; i < 300; i++)
        in[i] = (unsigned char)(i * 37 + 11);
    for (size_t n = 0; n <= 300; n++) {
        char enc[404];
        qd_base64_encode(in, n, enc);
        size_t len;
        int oom;
        unsigned char *dec = qd_base64_decode(enc, qd_base64_encoded_len(n), &len, &oom);
        assert_non_null(dec);
        assert_int_equal(len, n);
        assert_memory_equal(dec, in, n);
        free(dec);
    }
}

/* RFC 4648 written out bit by bit: the encoder (vector code for long inputs) must equal it on
 * random bytes of every length up to 600 and on a long buffer holding every byte value at every
 * offset of its group. */
static void ref_encode(const unsigned char *in, size_t n, char *out)
{
    static const char *abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t bit = 0; bit < n * 8; bit += 6) {
        unsigned v = 0;
        for (int k = 0; k < 6; k++) {
            size_t b = bit + (size_t)k;
            v = v << 1 | (b < n * 8 ? (in[b / 8] >> (7 - b % 8)) & 1u : 0u);
        }
        out[o++] = abc[v];
    }
    while (o % 4)
        out[o++] = '=';
}

static void base64_encoder_matches_the_rfc(void **state)
{
    uint64_t r = (uint64_t)time(NULL) | 1;
    unsigned char *in = malloc(3 * 256 * 4 + 64);
    char *got = malloc(5000), *want = malloc(5000);
    for (size_t n = 0; n <= 600; n++) {
        for (size_t i = 0; i < n; i++)
            r ^= r << 13, r ^= r >> 7, r ^= r << 17, in[i] = (unsigned char)r;
        memset(got, 0, 5000), memset(want, 1, 5000);
        qd_base64_encode(in, n, got);
        ref_encode(in, n, want);
        assert_memory_equal(got, want, qd_base64_encoded_len(n));
    }
    size_t n = 0;
    for (int pos = 0; pos < 3; pos++)
        for (int v = 0; v < 256; v++, n += 3)
            in[n] = 0x55, in[n + 1] = 0xaa, in[n + 2] = 0x0f, in[n + pos] = (unsigned char)v;
    qd_base64_encode(in, n, got);
    ref_encode(in, n, want);
    assert_memory_equal(got, want, qd_base64_encoded_len(n));
    free(in), free(got), free(want);
}

static void base64_refuses_bad_input(void **state)
{
    const char *bad[] = {"A", "AB", "ABC", "AB=C", "A===", "AB!D", "ABC\n", "AAB=", "AA=A", "====", "QUJD RA=="};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t len;
        int oom;
        unsigned char *d = qd_base64_decode(bad[i], strlen(bad[i]), &len, &oom);
        if (d)
            fail_msg("accepted '%s'", bad[i]);
        assert_int_equal(oom, 0);
    }
}

static void safetensors_round_trip_and_refusals(void **state)
{
    uint16_t scales[6] = {1, 2, 3, 4, 5, 6};
    unsigned char data[5] = {9, 8, 7, 6, 5};
    struct qd_st_tensor t[2] = {{.name = "data", .dtype = QD_U8, .ndim = 1, .shape = {5}, .data = data, .bytes = 5},
                                {.name = "scales", .dtype = QD_F16, .ndim = 2, .shape = {2, 3},
                                 .data = (unsigned char *)scales, .bytes = 12}};
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "fmt", "q8_0");
    size_t len;
    char *buf = qd_safetensors_build(t, 2, meta, &len);
    cJSON_Delete(meta);
    struct qd_st_tensor back[4];
    cJSON *md;
    char err[256];
    assert_int_equal(qd_safetensors_parse((unsigned char *)buf, len, 0, back, 4, &md, err, sizeof err), 2);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(md, "fmt")), "q8_0");
    cJSON_Delete(md);
    for (int i = 0; i < 2; i++) {
        int k = strcmp(back[0].name, t[i].name) ? 1 : 0;
        assert_int_equal(back[k].bytes, t[i].bytes);
        assert_memory_equal(back[k].data, t[i].data, t[i].bytes);
        assert_int_equal(back[k].dtype, t[i].dtype);
    }
    /* the header length may not exceed the body; nor offsets the data */
    assert_int_equal(qd_safetensors_parse((unsigned char *)buf, len - 1, 0, back, 4, &md, err, sizeof err), -1);
    buf[0] = (char)0xff;
    assert_int_equal(qd_safetensors_parse((unsigned char *)buf, len, 0, back, 4, &md, err, sizeof err), -1);
    qd_hostmem_put(buf);
    const char *bad_headers[] = {
        "{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,5]}}",
        "{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[3,1]}}",
        "{\"x\":{\"dtype\":\"Q8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
        "{\"x\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}",
        "{\"x\":{\"dtype\":\"U8\",\"shape\":[4.5],\"data_offsets\":[0,4]}}",
        "{\"__metadata__\":[1]}", "[]", "{"};
    for (size_t i = 0; i < sizeof bad_headers / sizeof bad_headers[0]; i++) {
        size_t hl = strlen(bad_headers[i]);
        unsigned char b[256] = {(unsigned char)hl};
        memcpy(b + 8, bad_headers[i], hl);
        if (qd_safetensors_parse(b, 8 + hl + 4, 0, back, 4, &md, err, sizeof err) != -1)
            fail_msg("accepted %s", bad_headers[i]);
    }
}

static int query(struct qd_req *q, const char *const *kv, struct qd_reply *r)
{
    struct qd_kv pairs[16];
    int n = 0;
    for (; kv[2 * n]; n++)
        pairs[n] = (struct qd_kv){kv[2 * n], kv[2 * n + 1]};
    memset(q, 0, sizeof *q);
    memset(r, 0, sizeof *r);
    return qd_req_from_query(q, pairs, n, 1, r);
}

static void query_decoding(void **state)
{
    struct qd_req q;
    struct qd_reply r;
    /* params may come before fmt */
    assert_int_equal(query(&q, (const char *[]){"blocksize", "128", "fmt", "nf4", "dtype", "bf16", "shape", "4,256", NULL}, &r), 0);
    assert_int_equal(q.nparams, 1);
    assert_int_equal(q.shape[1], 256);
    assert_int_equal(q.dtype, QD_BF16);
    /* a parameter of another format is refused */
    assert_int_equal(query(&q, (const char *[]){"fmt", "q8_0", "blocksize", "128", NULL}, &r), -1);
    assert_int_equal(r.status, 400);
    qd_reply_free(&r);
    /* a value is checked against its limits */
    assert_int_equal(query(&q, (const char *[]){"fmt", "nf4", "blocksize", "8", NULL}, &r), -1);
    qd_reply_free(&r);
    /* a parameter without fmt (dequantize reads fmt from the body) is kept if it exists at all */
    assert_int_equal(query(&q, (const char *[]){"scale_layout", "linear", NULL}, &r), 0);
    assert_int_equal(query(&q, (const char *[]){"op", "dequantize", "dtype", "f16", NULL}, &r), 0);
    assert_int_equal(q.op, QD_OP_DEQUANTIZE);
    assert_int_equal(query(&q, (const char *[]){"dtype", NULL, NULL}, &r), -1);
    qd_reply_free(&r);
}

static void body_kinds(void **state)
{
    struct qd_req qz = {.op = QD_OP_QUANTIZE, .has_shape = 1}, dq = {.op = QD_OP_DEQUANTIZE};
    assert_int_equal(qd_body_kind(&qz, "application/json; charset=utf-8", NULL, 0), QD_BODY_JSON);
    assert_int_equal(qd_body_kind(&qz, NULL, NULL, 0), QD_BODY_RAW);
    assert_int_equal(qd_body_kind(&qz, "application/x-www-form-urlencoded", NULL, 0), QD_BODY_RAW);
    assert_int_equal(qd_body_kind(&qz, "text/plain", NULL, 0), -1);
    assert_int_equal(qd_body_kind(&qz, "application/jsonx", NULL, 0), -1);
    assert_int_equal(qd_body_kind(&dq, "application/octet-stream", NULL, 0), QD_BODY_SAFETENSORS);
    assert_int_equal(qd_body_kind(&dq, NULL, "{\"fmt\":1}", 9), QD_BODY_JSON);
    const char st[] = "\x02\0\0\0\0\0\0\0{}";
    assert_int_equal(qd_body_kind(&dq, NULL, st, 10), QD_BODY_SAFETENSORS);
}

/* A JSON /quantize body for fmt with a [rows, 64] f32 tensor and an "importance" member (text
 * as written, NULL: none); returns qd_work_decode's result, the work decoded into w. */
static int decode_with_importance(struct qd_work *w, const char *fmt, int64_t rows, const char *importance,
                                  struct qd_reply *r)
{
    static float x[4 * 64];
    char data[1400], body[4096];
    qd_base64_encode((const unsigned char *)x, (size_t)rows * 64 * 4, data);
    data[qd_base64_encoded_len((size_t)rows * 64 * 4)] = 0;
    snprintf(body, sizeof body, "{\"fmt\":\"%s\",\"dtype\":\"f32\",\"shape\":[%s%lld,64],\"data\":\"%s\"%s%s}",
             fmt, rows == 4 ? "2," : "", (long long)(rows == 4 ? 2 : rows), data, importance ? ",\"importance\":" : "",
             importance ? importance : "");
    struct qd_req q = {.op = QD_OP_QUANTIZE};
    memset(w, 0, sizeof *w);
    memset(r, 0, sizeof *r);
    return qd_work_decode(w, &q, QD_BODY_JSON, body, strlen(body), r);
}

/* "importance": base64 f32, one per column or per column of each matrix, checked against the
 * format (only those that take one) and the shape; p.importance points at the decoded values. */
static void importance_decoding(void **state)
{
    float v[2 * 64];
    char imp[1000], b64[800];
    for (int i = 0; i < 2 * 64; i++)
        v[i] = (float)i;
    struct { const char *fmt; int64_t rows; int n; int status; const char *code; } cases[] = {
        {"q8_0", 2, 64, 0, NULL},       /* one per column */
        {"q8_0", 4, 128, 0, NULL},      /* [2, 2, 64]: one per column of each matrix */
        {"q8_0", 2, 128, 0, NULL},      /* [2, 64] flattened experts: one per row */
        {"q8_0", 3, 128, 422, "bad_importance"}, /* two runs do not divide three rows */
        {"q8_0", 2, 63, 422, "bad_importance"},
        {"nf4", 2, 64, 422, "bad_importance"},   /* takes none */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct qd_work w;
        struct qd_reply r;
        qd_base64_encode((const unsigned char *)v, (size_t)cases[c].n * 4, b64);
        b64[qd_base64_encoded_len((size_t)cases[c].n * 4)] = 0;
        snprintf(imp, sizeof imp, "{\"dtype\":\"f32\",\"data\":\"%s\"}", b64);
        int rc = decode_with_importance(&w, cases[c].fmt, cases[c].rows, imp, &r);
        if (!cases[c].status) {
            assert_int_equal(rc, 0);
            assert_non_null(w.p.importance);
            assert_int_equal(w.p.importance_n, cases[c].n);
            assert_memory_equal(w.p.importance, v, (size_t)cases[c].n * 4);
        } else {
            assert_int_equal(rc, -1);
            assert_int_equal(r.status, cases[c].status);
            assert_non_null(strstr(r.body, cases[c].code));
        }
        qd_work_free(&w);
        qd_reply_free(&r);
    }
    const char *bad[] = {"\"AAAA\"", "{\"data\":\"AAA\"}", "{\"data\":\"AAA=\"}",
                         "{\"dtype\":\"f16\",\"data\":\"AAAAAA==\"}", "{\"data\":\"\"}"};
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        struct qd_work w;
        struct qd_reply r;
        assert_int_equal(decode_with_importance(&w, "q8_0", 2, bad[c], &r), -1);
        assert_int_equal(r.status, 400);
        qd_work_free(&w);
        qd_reply_free(&r);
    }
    /* a negative or non-finite value */
    v[5] = -1.0f;
    qd_base64_encode((const unsigned char *)v, 64 * 4, b64);
    b64[qd_base64_encoded_len(64 * 4)] = 0;
    snprintf(imp, sizeof imp, "{\"data\":\"%s\"}", b64);
    struct qd_work w;
    struct qd_reply r;
    assert_int_equal(decode_with_importance(&w, "q8_0", 2, imp, &r), -1);
    assert_non_null(strstr(r.body, "finite and >= 0"));
    qd_work_free(&w);
    qd_reply_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(base64_round_trips_every_length),
        cmocka_unit_test(base64_encoder_matches_the_rfc),
        cmocka_unit_test(base64_refuses_bad_input),
        cmocka_unit_test(safetensors_round_trip_and_refusals),
        cmocka_unit_test(query_decoding),
        cmocka_unit_test(body_kinds),
        cmocka_unit_test(importance_decoding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
