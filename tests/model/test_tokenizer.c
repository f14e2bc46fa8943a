/* The tokenizer (server/model/tokenizer*.c) and the token-id readers (server/model/tokens_in.c).
 *
 * Against llama.cpp: every .inp/.out pair of the llama-cpp-python 0.3.36 sdist's vocabularies
 * (QD_VOCAB_DIR, default build/vocab: `make build/vocab/ok` fetches them), and the hard texts of
 * tests/fixtures/tokenizer/expected.json (llama-tokenize's ids, also on vocabularies with keys
 * rewritten: other pre-tokenizers, add_space_prefix off, ...). Missing files fail the test.
 * Then the pieces one at a time: UTF-8 decoding, categories, the regular expressions, token-id
 * input, and refusals. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../checkpoint/gguf_bytes.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"
#include "model/tokenizer_regex.h"
#include "model/tokenizer_unicode.h"
#include "model/tokens_in.h"

static const char *vocab_dir(void)
{
    const char *d = getenv("QD_VOCAB_DIR");
    return d && *d ? d : "build/vocab";
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static struct qd_vocab *open_vocab(const char *name)
{
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", vocab_dir(), name);
    struct qd_vocab *v = NULL;
    if (qd_vocab_open(path, &v, err, sizeof err) != QD_OK)
        fail_msg("%s (llama.cpp's vocabularies: make build/vocab/ok, or QD_VOCAB_DIR)", err);
    return v;
}

static uint64_t fnv1a64_ids(const int32_t *ids, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++)
            h = (h ^ ((uint32_t)ids[i] >> (8 * b) & 0xFF)) * 0x100000001B3ull;
    return h;
}

/* ---- llama.cpp's own vectors ---------------------------------------------------------------- */

static void vectors_of(const char *name)
{
    struct qd_vocab *v = open_vocab(name);
    char path[1024];
    size_t in_len, out_len;
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.inp", vocab_dir(), name);
    char *in = slurp(path, &in_len);
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.out", vocab_dir(), name);
    char *out = slurp(path, &out_len);
    if (!in || !out)
        fail_msg("%s: missing (make build/vocab/ok)", path);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = in, *line = out;
    int cases = 0;
    while (p < in + in_len) {
        char *next = strstr(p, sep);
        size_t len = next ? (size_t)(next - p) : strlen(p);
        char *eol = strchr(line, '\n');
        if (!eol) /* (the last line may have no newline) */
            eol = line + strlen(line);
        else
            *eol = 0;
        int32_t want[4096];
        size_t nw = 0;
        for (char *q = line, *end; *q; q = end) {
            long x = strtol(q, &end, 10);
            if (end == q)
                break;
            want[nw++] = (int32_t)x;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        char err[512];
        assert_int_equal(qd_tokenize(v, p, len, 0, 0, &ids, &n, err, sizeof err), QD_OK);
        if (n != nw || (n && memcmp(ids, want, n * sizeof *ids)))
            fail_msg("%s case %d ('%.40s'): %zu ids, llama.cpp %zu", name, cases, p, n, nw);
        free(ids);
        cases++;
        line = *eol || eol == out + out_len ? eol : eol + 1;
        if (!next)
            break;
        p = next + strlen(sep);
    }
    assert_true(cases > 40);
    free(in);
    free(out);
    qd_vocab_free(v);
}

#define VECTORS(fn, name) static void fn(void **state) { (void)state; vectors_of(name); }
VECTORS(llama_spm_vectors_equal_llama_cpp, "llama-spm")
VECTORS(phi3_vectors_equal_llama_cpp, "phi-3")
VECTORS(llama_bpe_vectors_equal_llama_cpp, "llama-bpe")
VECTORS(qwen2_vectors_equal_llama_cpp, "qwen2")
VECTORS(qwen35_vectors_equal_llama_cpp, "qwen35")
VECTORS(gpt2_vectors_equal_llama_cpp, "gpt-2")
VECTORS(deepseek_llm_vectors_equal_llama_cpp, "deepseek-llm")
VECTORS(deepseek_coder_vectors_equal_llama_cpp, "deepseek-coder")
VECTORS(falcon_vectors_equal_llama_cpp, "falcon")
VECTORS(mpt_vectors_equal_llama_cpp, "mpt")
VECTORS(starcoder_vectors_equal_llama_cpp, "starcoder")
VECTORS(refact_vectors_equal_llama_cpp, "refact")
VECTORS(command_r_vectors_equal_llama_cpp, "command-r")
VECTORS(gemma4_vectors_equal_llama_cpp, "gemma-4")

/* ---- the hard texts of expected.json -------------------------------------------------------- */

/* A vocabulary with the keys of a variant rewritten (as tests/fixtures/tokenizer/gguf_rewrite.py
 * writes it for llama-tokenize). */
static struct qd_vocab *variant(const cJSON *fixture, const char *name)
{
    const cJSON *var = cJSON_GetObjectItem(cJSON_GetObjectItem(fixture, "variants"), name);
    if (!var)
        return open_vocab(name);
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", vocab_dir(), cJSON_GetObjectItem(var, "base")->valuestring);
    size_t len;
    char *file = slurp(path, &len);
    if (!file)
        fail_msg("%s: missing (make build/vocab/ok)", path);
    struct qd_gguf g;
    assert_int_equal(qd_gguf_parse((const uint8_t *)file, len, &g, NULL, err, sizeof err), 0);
    const cJSON *set = cJSON_GetObjectItem(var, "set");
    const struct qd_gguf_kv *keep[256];
    int n_keep = 0, n_new = 0;
    for (int64_t i = 0; i < g.n_kv; i++)
        if (!cJSON_GetObjectItem(set, g.kv[i].key))
            keep[n_keep++] = &g.kv[i];
    struct qd_gguf_new_kv extra[8];
    for (const cJSON *k = set->child; k; k = k->next, n_new++) {
        const char *type = cJSON_GetArrayItem(k, 0)->valuestring;
        const cJSON *val = cJSON_GetArrayItem(k, 1);
        extra[n_new] = (struct qd_gguf_new_kv){.key = k->string};
        if (!strcmp(type, "string"))
            extra[n_new].type = QD_GGUF_STRING, extra[n_new].s = val->valuestring;
        else if (!strcmp(type, "bool"))
            extra[n_new].type = QD_GGUF_BOOL, extra[n_new].i = cJSON_IsTrue(val);
        else if (!strcmp(type, "u32"))
            extra[n_new].type = QD_GGUF_U32, extra[n_new].i = (int64_t)val->valuedouble;
        else
            fail_msg("variant %s: type %s", name, type);
    }
    size_t out_len;
    uint8_t *bytes = qd_gguf_write_meta(keep, n_keep, extra, n_new, NULL, 0, 32, &out_len);
    assert_non_null(bytes);
    qd_gguf_free(&g);
    free(file);
    struct qd_gguf g2;
    assert_int_equal(qd_gguf_parse(bytes, out_len, &g2, NULL, err, sizeof err), 0);
    struct qd_vocab *v = NULL;
    if (qd_vocab_load(&g2, &v, err, sizeof err) != QD_OK)
        fail_msg("variant %s: %s", name, err);
    qd_gguf_free(&g2);
    free(bytes);
    return v;
}

static cJSON *load_fixture(void)
{
    size_t len;
    char *s = slurp("tests/fixtures/tokenizer/expected.json", &len);
    assert_non_null(s);
    cJSON *j = cJSON_Parse(s);
    free(s);
    assert_non_null(j);
    return j;
}

/* base64 (the fixture's texts) */
static size_t unbase64(const char *in, char *out)
{
    static const char *abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (; *in && *in != '='; in++) {
        const char *p = strchr(abc, *in);
        assert_non_null(p);
        acc = acc << 6 | (uint32_t)(p - abc);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (char)(acc >> bits & 0xFF);
        }
    }
    return n;
}

/* One case: want is the ids, or {"n", "fnv1a64"}, or null where llama.cpp fails. */
static int check_case(struct qd_vocab *v, const char *vname, const char *tname, const char *text, size_t len,
                      int bos, int special, const cJSON *want)
{
    /* llama-tokenize: add_special follows the vocabulary's add_bos unless --no-bos */
    int add_special = bos && qd_vocab_add_bos(v);
    int32_t *ids = NULL;
    size_t n = 0;
    char err[512];
    enum qd_status st = qd_tokenize(v, text, len, add_special, special, &ids, &n, err, sizeof err);
    if (cJSON_IsNull(want)) { /* where llama.cpp throws, quantd refuses */
        if (st != QD_EINVAL)
            fail_msg("%s / %s: llama.cpp fails here, quantd gave %zu ids", vname, tname, n);
        return 0;
    }
    if (st != QD_OK)
        fail_msg("%s / %s: %s", vname, tname, err);
    int same;
    size_t nw;
    if (cJSON_IsArray(want)) {
        nw = (size_t)cJSON_GetArraySize(want);
        same = nw == n;
        int k = 0;
        for (const cJSON *w = want->child; same && w; w = w->next, k++)
            same = ids[k] == (int32_t)w->valuedouble;
    } else {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a64_ids(ids, n));
        nw = (size_t)cJSON_GetObjectItem(want, "n")->valuedouble;
        same = nw == n && !strcmp(hex, cJSON_GetObjectItem(want, "fnv1a64")->valuestring);
    }
    if (!same)
        fail_msg("%s / %s (bos %d, special %d): %zu ids differ from llama-tokenize's %zu", vname, tname, bos, special,
                 n, nw);
    free(ids);
    return 1;
}

static void hard_texts_equal_llama_tokenize(void **state)
{
    (void)state;
    cJSON *fx = load_fixture();
    const cJSON *texts = cJSON_GetObjectItem(fx, "texts"), *flagsets = cJSON_GetObjectItem(fx, "flagsets");
    int checked = 0, refused = 0;
    for (const cJSON *vr = cJSON_GetObjectItem(fx, "results")->child; vr; vr = vr->next) {
        struct qd_vocab *v = variant(fx, vr->string);
        for (const cJSON *tr = vr->child; tr; tr = tr->next) {
            const char *b64 = cJSON_GetObjectItem(texts, tr->string)->valuestring;
            char *text = malloc(strlen(b64) + 1);
            size_t len = unbase64(b64, text);
            const cJSON *want = tr->child, *flags = flagsets->child;
            for (; want && flags; want = want->next, flags = flags->next) {
                int bos = 1, special = 1; /* llama-tokenize's defaults, less the flags given */
                for (const cJSON *f = flags->child; f; f = f->next) {
                    bos &= strcmp(f->valuestring, "--no-bos") != 0;
                    special &= strcmp(f->valuestring, "--no-parse-special") != 0;
                }
                if (check_case(v, vr->string, tr->string, text, len, bos, special, want))
                    checked++;
                else
                    refused++;
            }
            free(text);
        }
        qd_vocab_free(v);
    }
    cJSON_Delete(fx);
    assert_true(checked > 2500);
    assert_true(refused > 0);
}

/* ---- UTF-8 and categories ------------------------------------------------------------------- */

static void utf8_decodes_as_llama_cpp_leniently(void **state)
{
    (void)state;
    uint32_t out[16];
    /* overlong forms and surrogates are taken; a bad byte is U+FFFD and decoding goes on after it */
    const struct {
        const char *in;
        size_t n;
        uint32_t want[8];
        size_t nw;
    } cases[] = {
        {"\xc0\x80", 2, {0}, 1},
        {"\xed\xa0\x80", 3, {0xD800}, 1},
        {"\xe2\x82", 2, {0xFFFD, 0xFFFD}, 2},
        {"\x80" "a", 2, {0xFFFD, 'a'}, 2},
        {"\xf4\x90\x80\x80", 4, {0x110000}, 1},
        {"\xf8\x88\x80\x80\x80", 5, {0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD}, 5},
        {"\xe2\x96\x81x", 4, {0x2581, 'x'}, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = qd_utf8_decode((const uint8_t *)cases[c].in, cases[c].n, out);
        assert_int_equal(n, cases[c].nw);
        assert_memory_equal(out, cases[c].want, n * sizeof *out);
    }
    uint8_t u[4];
    assert_int_equal(qd_utf8_encode(0x110000, u), 0);
    assert_int_equal(qd_utf8_encode(0x10FFFF, u), 4);
}

static void categories_follow_unicode_15_1(void **state)
{
    (void)state;
    assert_int_equal(qd_unicode_category('a'), QD_UCAT_L);
    assert_int_equal(qd_unicode_category(0xE9), QD_UCAT_L);
    assert_int_equal(qd_unicode_category(0x663), QD_UCAT_N);    /* ARABIC-INDIC DIGIT THREE */
    assert_int_equal(qd_unicode_category(0x301), QD_UCAT_M);    /* COMBINING ACUTE ACCENT */
    assert_int_equal(qd_unicode_category(0x2EBF0), QD_UCAT_L);  /* CJK Extension I: new in 15.1 */
    assert_int_equal(qd_unicode_category(0x10D40), QD_UCAT_UNDEF); /* Garay: not until 16.0 */
    assert_int_equal(qd_unicode_category(0x110000), QD_UCAT_UNDEF);
    assert_true(qd_unicode_flags(0x3000) & QD_UF_SPACE);
    assert_true(qd_unicode_flags(0x85) & QD_UF_SPACE);
    assert_false(qd_unicode_flags(0x1C) & QD_UF_SPACE); /* Python's isspace says yes; White_Space no */
    assert_false(qd_unicode_flags(0x200B) & QD_UF_SPACE);
    for (unsigned b = 0; b < 256; b++)
        assert_int_equal(qd_cpt_to_byte(qd_byte_to_cpt((uint8_t)b)), (int)b);
    assert_int_equal(qd_byte_to_cpt(' '), 0x120); /* GPT-2's 'Ġ' */
    assert_int_equal(qd_byte_to_cpt(0xAD), 0x143);
}

/* ---- regular expressions -------------------------------------------------------------------- */

/* Splits text (ASCII) with pattern (ASCII) and checks the piece lengths. */
static void split_is(const char *pattern, const char *text, const size_t *want, size_t nw)
{
    uint32_t p[256], t[256];
    size_t pn = strlen(pattern), tn = strlen(text), lens[256];
    for (size_t i = 0; i < pn; i++)
        p[i] = (uint8_t)pattern[i];
    for (size_t i = 0; i < tn; i++)
        t[i] = (uint8_t)text[i];
    char err[160];
    struct qd_regex *re = qd_regex_compile(p, pn, err, sizeof err);
    if (!re)
        fail_msg("'%s': %s", pattern, err);
    size_t n = qd_regex_split(re, t, tn, lens);
    if (n != nw || memcmp(lens, want, n * sizeof *lens)) {
        char got[256] = "";
        for (size_t i = 0; i < n; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%zu ", lens[i]);
        fail_msg("'%s' on '%s': pieces %s", pattern, text, got);
    }
    qd_regex_free(re);
}
#define SPLIT(p, t, ...) do { size_t w_[] = {__VA_ARGS__}; split_is(p, t, w_, sizeof w_ / sizeof w_[0]); } while (0)

static void regex_takes_the_first_alternative_that_matches(void **state)
{
    (void)state;
    SPLIT("a|ab", "abab", 1, 1, 1, 1);           /* ECMAScript: not the longest */
    SPLIT("ab|a", "abab", 2, 2);
    SPLIT("x+", "axxbx", 1, 2, 1, 1);
    SPLIT("x+?", "xxx", 1, 1, 1);                /* lazy */
    SPLIT("\\d{1,3}", "1234567", 3, 3, 1);
    SPLIT("[^\\s]+", "ab  cd", 2, 2, 2);
}

static void regex_lookahead_and_end_anchor(void **state)
{
    (void)state;
    SPLIT("\\s+(?!\\S)|\\s+", "a   b", 1, 2, 1, 1); /* the last space goes with the word */
    SPLIT("\\s+(?!\\S)", "a   ", 1, 3);
    SPLIT("\\s+$", "a  b  ", 4, 2);             /* only the run at the end */
    SPLIT("((?=[a-z])([^a]))+", "abcade", 1, 2, 1, 2);
    SPLIT("\\b", "ab cd", 2, 1, 2);              /* empty matches make no piece */
}

static void regex_classes_escapes_and_ranges(void **state)
{
    (void)state;
    SPLIT("[!\\-/:\\[\\\\\\]]+", "a!-/:[\\]b", 1, 7, 1);
    SPLIT("[\\r\\n]", "a\r\nb", 1, 1, 1, 1);
    SPLIT("[^\\r\\n a-z]?[a-z]+", "!ab cd", 3, 1, 2);
    SPLIT("[0-9][0-9][0-9]", "12345678", 3, 3, 2);
    char err[160];
    uint32_t bad[] = {'(', 'a'};
    assert_null(qd_regex_compile(bad, 2, err, sizeof err));
    uint32_t lookbehind[] = {'(', '?', '<', '=', 'a', ')'};
    assert_null(qd_regex_compile(lookbehind, 6, err, sizeof err));
}

static void regex_long_runs_take_no_stack(void **state)
{
    (void)state;
    size_t n = 1 << 20;
    uint32_t *t = malloc(n * sizeof *t);
    size_t *lens = malloc(n * sizeof *lens);
    for (size_t i = 0; i < n; i++)
        t[i] = i == n - 1 ? 'x' : ' ';
    uint32_t p[] = {'\\', 's', '+', '(', '?', '!', '\\', 'S', ')', '|', '\\', 's', '+'};
    char err[160];
    struct qd_regex *re = qd_regex_compile(p, sizeof p / sizeof p[0], err, sizeof err);
    assert_non_null(re);
    assert_int_equal(qd_regex_split(re, t, n, lens), 3);
    assert_int_equal(lens[0], n - 2);
    qd_regex_free(re);
    /* \s+$ over a run that does not end the text: each start fails, and is not tried anew */
    uint32_t at_end[] = {'\\', 's', '+', '$'};
    assert_non_null(re = qd_regex_compile(at_end, 4, err, sizeof err));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(qd_regex_split(re, t, n, lens), 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9 < 1.0);
    t[n - 1] = ' ';
    assert_int_equal(qd_regex_split(re, t, n, lens), 1);
    assert_int_equal(lens[0], n);
    qd_regex_free(re);
    free(t);
    free(lens);
}

/* ---- speed ---------------------------------------------------------------------------------- */

static void megabyte_of_prose_takes_well_under_a_second(void **state)
{
    (void)state;
    const char *names[] = {"llama-spm", "llama-bpe", "qwen2"};
    size_t n = 1 << 20;
    char *text = malloc(n);
    const char *prose = "It was the best of times, it was the worst of times; 1859 saw 45 chapters.\n";
    for (size_t i = 0; i < n; i++)
        text[i] = prose[i % strlen(prose)];
    for (int k = 0; k < 3; k++) {
        struct qd_vocab *v = open_vocab(names[k]);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int32_t *ids = NULL;
        size_t count = 0;
        char err[256];
        assert_int_equal(qd_tokenize(v, text, n, 1, 1, &ids, &count, err, sizeof err), QD_OK);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        printf("   1 MiB into %zu %s tokens: %.3f s\n", count, names[k], s);
        assert_true(count > 100000);
        assert_true(s < 2.0); /* ~0.1-0.2 s measured; a quadratic merge would take minutes */
        free(ids);
        qd_vocab_free(v);
    }
    free(text);
}

/* ---- refusals ------------------------------------------------------------------------------- */

static enum qd_status load_bytes(struct buf *b, char *err, size_t errlen)
{
    struct qd_gguf g;
    assert_int_equal(qd_gguf_parse(b->p, b->n, &g, NULL, err, errlen), 0);
    struct qd_vocab *v = NULL;
    enum qd_status s = qd_vocab_load(&g, &v, err, errlen);
    qd_vocab_free(v);
    qd_gguf_free(&g);
    free(b->p);
    return s;
}

static void put_kv_str(struct buf *b, const char *key, const char *val)
{
    put_str(b, key);
    put_u32(b, QD_GGUF_STRING);
    put_str(b, val);
}

static void put_kv_strs(struct buf *b, const char *key, const char *const *vals, int n)
{
    put_str(b, key);
    put_u32(b, QD_GGUF_ARRAY);
    put_u32(b, QD_GGUF_STRING);
    put_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++)
        put_str(b, vals[i]);
}

static void vocabulary_refusals_name_the_problem(void **state)
{
    (void)state;
    char err[2048];
    struct buf b = {0};
    gguf_header(&b, 0, 1);
    put_kv_str(&b, "general.architecture", "llama");
    assert_int_equal(load_bytes(&b, err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "no vocabulary"));

    b = (struct buf){0};
    gguf_header(&b, 0, 1);
    put_kv_str(&b, "tokenizer.ggml.model", "bert");
    assert_int_equal(load_bytes(&b, err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "'bert' is not supported"));

    static const char *const toks[] = {"a", "b", "ab"}, *const merges[] = {"a b"};
    b = (struct buf){0};
    gguf_header(&b, 0, 4);
    put_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    put_kv_str(&b, "tokenizer.ggml.pre", "no-such-pre");
    put_kv_strs(&b, "tokenizer.ggml.tokens", toks, 3);
    put_kv_strs(&b, "tokenizer.ggml.merges", merges, 1);
    assert_int_equal(load_bytes(&b, err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "'no-such-pre'"));
    assert_non_null(strstr(err, "llama-bpe")); /* the known ones are listed */

    static const char *const dup[] = {"a", "b", "a"};
    b = (struct buf){0};
    gguf_header(&b, 0, 2);
    put_kv_str(&b, "tokenizer.ggml.model", "llama");
    put_kv_strs(&b, "tokenizer.ggml.tokens", dup, 3);
    assert_int_equal(load_bytes(&b, err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "tokens 0 and 2 have the same text"));

    b = (struct buf){0};
    gguf_header(&b, 0, 2);
    put_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    put_kv_strs(&b, "tokenizer.ggml.tokens", toks, 3);
    assert_int_equal(load_bytes(&b, err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "tokenizer.ggml.merges"));
}

/* A SentencePiece vocabulary without byte tokens cannot spell every text: a sentence, no crash. */
static void spm_without_a_byte_token_refuses_the_text(void **state)
{
    (void)state;
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a"};
    struct buf b = {0};
    gguf_header(&b, 0, 2);
    put_kv_str(&b, "tokenizer.ggml.model", "llama");
    put_kv_strs(&b, "tokenizer.ggml.tokens", toks, 5);
    struct qd_gguf g;
    char err[512];
    assert_int_equal(qd_gguf_parse(b.p, b.n, &g, NULL, err, sizeof err), 0);
    struct qd_vocab *v = NULL;
    assert_int_equal(qd_vocab_load(&g, &v, err, sizeof err), QD_OK);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(qd_tokenize(v, "a a", 3, 1, 1, &ids, &n, err, sizeof err), QD_OK);
    int32_t want[] = {1, 3, 4, 3, 4}; /* BOS, then "▁a▁a" with no "▁a" token */
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    assert_int_equal(qd_tokenize(v, "ab", 2, 0, 1, &ids, &n, err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "no token for byte 0x62"));
    assert_null(ids);
    qd_vocab_free(v);
    qd_gguf_free(&g);
    free(b.p);
}

/* ---- token ids from a client ---------------------------------------------------------------- */

static void tokens_in_reads_int32_and_json(void **state)
{
    (void)state;
    int32_t *ids;
    size_t n;
    char err[256];
    const uint8_t raw[] = {1, 0, 0, 0, 0x39, 0x30, 0, 0, 0, 0, 0, 0};
    assert_int_equal(qd_tokens_parse(raw, sizeof raw, QD_TOKENS_INT32, 32000, &ids, &n, err, sizeof err), QD_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 12345);
    free(ids);
    const char *json = " [1,\n 15043 ,3186, 0]\n";
    assert_int_equal(qd_tokens_parse(json, strlen(json), QD_TOKENS_JSON, 32000, &ids, &n, err, sizeof err), QD_OK);
    int32_t want[] = {1, 15043, 3186, 0};
    assert_int_equal(n, 4);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    assert_int_equal(qd_tokens_detect(json, strlen(json)), QD_TOKENS_JSON);
    assert_int_equal(qd_tokens_detect(raw, sizeof raw), QD_TOKENS_INT32);
    const uint8_t starts_like_json[] = {'[', 0, 0, 0, 1, 0, 0, 0}; /* ids 91 and 1 */
    assert_int_equal(qd_tokens_detect(starts_like_json, sizeof starts_like_json), QD_TOKENS_INT32);
    /* a file: llama-tokenize --ids output */
    char path[] = "/tmp/qd_tokens_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "[1, 15043, 3186]\n", 17), 17);
    close(fd);
    assert_int_equal(qd_tokens_load(path, 32000, &ids, &n, err, sizeof err), QD_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 3186);
    free(ids);
    assert_int_equal(qd_tokens_load(path, 3000, &ids, &n, err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, path));
    unlink(path);
}

static void tokens_in_refuses_bad_ids_with_their_place(void **state)
{
    (void)state;
    int32_t *ids = (int32_t *)1;
    size_t n;
    char err[256];
    const struct {
        const char *text;
        enum qd_tokens_format fmt;
        size_t len;
        const char *says;
    } cases[] = {
        {"\x01\x00\x00", QD_TOKENS_INT32, 3, "not a whole number"},
        {"\x00\x7d\x00\x00", QD_TOKENS_INT32, 4, "token id 32000 at index 0"},
        {"\xff\xff\xff\xff", QD_TOKENS_INT32, 4, "token id -1 at index 0"},
        {"", QD_TOKENS_INT32, 0, "no id"},
        {"[]", QD_TOKENS_JSON, 0, "no id"},
        {"[1, 2.5]", QD_TOKENS_JSON, 0, "whole numbers"},
        {"[1, 1e3]", QD_TOKENS_JSON, 0, "whole numbers"},
        {"[01]", QD_TOKENS_JSON, 0, "start with 0"},
        {"[1, -2]", QD_TOKENS_JSON, 0, "token id -2 at index 1"},
        {"[1, 32000]", QD_TOKENS_JSON, 0, "token id 32000 at index 1"},
        {"[1, 99999999999999]", QD_TOKENS_JSON, 0, "outside the vocabulary"},
        {"[1, 2", QD_TOKENS_JSON, 0, "cut short"},
        {"[1,]", QD_TOKENS_JSON, 0, "expected an integer"},
        {"[1 2]", QD_TOKENS_JSON, 0, "expected ',' or ']'"},
        {"[1] x", QD_TOKENS_JSON, 0, "nothing may follow"},
        {"{\"ids\": [1]}", QD_TOKENS_JSON, 0, "one array of integers"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t len = cases[c].fmt == QD_TOKENS_INT32 ? cases[c].len : strlen(cases[c].text);
        assert_int_equal(qd_tokens_parse(cases[c].text, len, cases[c].fmt, 32000, &ids, &n, err, sizeof err),
                         QD_EINVAL);
        assert_null(ids);
        if (!strstr(err, cases[c].says))
            fail_msg("'%s': '%s' does not say '%s'", cases[c].text, err, cases[c].says);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(utf8_decodes_as_llama_cpp_leniently),
        cmocka_unit_test(categories_follow_unicode_15_1),
        cmocka_unit_test(regex_takes_the_first_alternative_that_matches),
        cmocka_unit_test(regex_lookahead_and_end_anchor),
        cmocka_unit_test(regex_classes_escapes_and_ranges),
        cmocka_unit_test(regex_long_runs_take_no_stack),
        cmocka_unit_test(vocabulary_refusals_name_the_problem),
        cmocka_unit_test(spm_without_a_byte_token_refuses_the_text),
        cmocka_unit_test(tokens_in_reads_int32_and_json),
        cmocka_unit_test(tokens_in_refuses_bad_ids_with_their_place),
        cmocka_unit_test(llama_spm_vectors_equal_llama_cpp),
        cmocka_unit_test(phi3_vectors_equal_llama_cpp),
        cmocka_unit_test(llama_bpe_vectors_equal_llama_cpp),
        cmocka_unit_test(qwen2_vectors_equal_llama_cpp),
        cmocka_unit_test(qwen35_vectors_equal_llama_cpp),
        cmocka_unit_test(gpt2_vectors_equal_llama_cpp),
        cmocka_unit_test(deepseek_llm_vectors_equal_llama_cpp),
        cmocka_unit_test(deepseek_coder_vectors_equal_llama_cpp),
        cmocka_unit_test(falcon_vectors_equal_llama_cpp),
        cmocka_unit_test(mpt_vectors_equal_llama_cpp),
        cmocka_unit_test(starcoder_vectors_equal_llama_cpp),
        cmocka_unit_test(refact_vectors_equal_llama_cpp),
        cmocka_unit_test(command_r_vectors_equal_llama_cpp),
        cmocka_unit_test(gemma4_vectors_equal_llama_cpp),
        cmocka_unit_test(hard_texts_equal_llama_tokenize),
        cmocka_unit_test(megabyte_of_prose_takes_well_under_a_second),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
