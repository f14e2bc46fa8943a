/* server/checkpoint/gguf.c and safetensors.c on files they must refuse or must read cheaply:
 * a value read only once its type is known (a u8 general.alignment ending the file, placed
 * against an unreadable page so that a read past it crashes in any build), a zero dimension,
 * names twice or with a NUL, the key and tensor counts bounded, duplicate checks in O(n log n)
 * comparisons (counted, not timed), a parse stopped by its cancel flag, a safetensors header
 * over its limit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../kernels/registry.h"
#include "checkpoint/gguf.h"
#include "gguf_bytes.h"
#include "checkpoint/names.h"
#include "checkpoint/safetensors.h"

/* ---- building files ------------------------------------------------------------------------ */

static void gguf_u32_kv(struct buf *b, const char *key, uint32_t v)
{
    put_str(b, key);
    put_u32(b, QD_GGUF_U32);
    put_u32(b, v);
}

/* A 2-D f32 tensor info at offset. */
static void gguf_tensor(struct buf *b, const char *name, uint64_t ne0, uint64_t ne1, uint64_t offset)
{
    put_str(b, name);
    put_u32(b, 2);
    put_u64(b, ne0);
    put_u64(b, ne1);
    put_u32(b, QD_GGML_F32);
    put_u64(b, offset);
}

/* Parses b; returns the status, err holds the message. */
static int parse(const struct buf *b, char *err, size_t errlen)
{
    struct qd_gguf g;
    int rc = qd_gguf_parse(b->p, b->n, &g, NULL, err, errlen);
    if (!rc)
        qd_gguf_free(&g);
    return rc;
}

static void expect_refused(const struct buf *b, const char *words)
{
    char err[512] = "";
    if (parse(b, err, sizeof err) != -1 || !strstr(err, words))
        fail_msg("want an error naming '%s', got: %s", words, err);
}

/* ---- GGUF ------------------------------------------------------------------------------------ */

static void alignment_of_the_wrong_type_is_not_read(void **state)
{
    /* "general.alignment" as a u8, the file's last byte: the checkpoint's fuzz corpus holds this
     * file (fuzz_seeds/alignment_u8_at_end.gguf); here it ends where an unreadable page begins */
    struct buf b = {0};
    gguf_header(&b, 0, 1);
    put_str(&b, "general.alignment");
    put_u32(&b, QD_GGUF_U8);
    uint8_t one = 1;
    put(&b, &one, 1);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    assert_true(b.n < page);
    uint8_t *two = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(two != MAP_FAILED);
    assert_int_equal(mprotect(two + page, page, PROT_NONE), 0);
    uint8_t *at = two + page - b.n;
    memcpy(at, b.p, b.n);
    size_t seed_len;
    FILE *f = fopen("tests/checkpoint/fuzz_seeds/alignment_u8_at_end.gguf", "rb");
    assert_non_null(f);
    uint8_t seed[256];
    seed_len = fread(seed, 1, sizeof seed, f);
    fclose(f);
    assert_int_equal(seed_len, b.n); /* the corpus file is this one */
    assert_memory_equal(seed, b.p, b.n);
    struct qd_gguf g;
    char err[256] = "";
    assert_int_equal(qd_gguf_parse(at, b.n, &g, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "general.alignment must be a u32"));
    munmap(two, 2 * page);
    free(b.p);
}

static void zero_dimension_is_refused(void **state)
{
    struct buf b = {0};
    gguf_header(&b, 1, 0);
    gguf_tensor(&b, "t.weight", 32, 0, 0);
    expect_refused(&b, "tensor 't.weight': dimension 1 is 0");
    free(b.p);
}

static void names_twice_are_refused(void **state)
{
    struct buf b = {0};
    gguf_header(&b, 0, 3);
    gguf_u32_kv(&b, "a", 1);
    gguf_u32_kv(&b, "b", 2);
    gguf_u32_kv(&b, "a", 3);
    expect_refused(&b, "key 'a' appears twice");
    free(b.p);
    b = (struct buf){0};
    gguf_header(&b, 2, 0);
    gguf_tensor(&b, "x", 8, 1, 0);
    gguf_tensor(&b, "x", 8, 1, 32);
    uint8_t zeros[128] = {0};
    put(&b, zeros, (32 - b.n % 32) % 32 + 64);
    expect_refused(&b, "tensor 'x' appears twice");
    free(b.p);
}

/* n keys "k<i>" in reverse order (the worst order for neither method in particular) */
static void many_keys(struct buf *b, int n)
{
    gguf_header(b, 0, (uint64_t)n);
    char key[32];
    for (int i = n; i > 0; i--) {
        snprintf(key, sizeof key, "k%d", i);
        gguf_u32_kv(b, key, (uint32_t)i);
    }
}

static void duplicate_checks_take_n_log_n_comparisons(void **state)
{
    /* the most keys a file may have: pairwise checks would make 2.1e9 comparisons (and took 21 s
     * for 120 k keys); sorted, about n log2 n = 1.0e6 */
    int n = QD_GGUF_MAX_KV;
    struct buf b = {0};
    many_keys(&b, n);
    char err[256] = "";
    unsigned long long before = qd_names_compared();
    if (parse(&b, err, sizeof err))
        fail_msg("%s", err);
    unsigned long long compared = qd_names_compared() - before;
    printf("# %d keys: %llu name comparisons\n", n, compared);
    assert_true(compared < 2ull * (unsigned long long)n * 17);
    free(b.p);
}

static void counts_over_the_limits_are_refused(void **state)
{
    struct buf b = {0};
    many_keys(&b, 120000); /* the size of the file that held a worker 21 s */
    expect_refused(&b, "quantd reads at most 65536 key/values and 65536 tensors");
    free(b.p);
}

static void cancel_stops_a_parse(void **state)
{
    struct buf b = {0};
    many_keys(&b, 20000);
    struct qd_gguf g;
    char err[256] = "";
    volatile int cancel = 1;
    assert_int_equal(qd_gguf_parse(b.p, b.n, &g, &cancel, err, sizeof err), -1);
    assert_non_null(strstr(err, "cancelled"));
    cancel = 0;
    assert_int_equal(qd_gguf_parse(b.p, b.n, &g, &cancel, err, sizeof err), 0);
    qd_gguf_free(&g);
    free(b.p);
}

/* ---- safetensors ----------------------------------------------------------------------------- */

/* A file of the given header text and data bytes. */
static struct buf st_file(const char *header, size_t data_bytes)
{
    struct buf b = {0};
    put_u64(&b, strlen(header));
    put(&b, header, strlen(header));
    for (size_t i = 0; i < data_bytes; i++)
        put(&b, "", 1);
    return b;
}

static void st_expect(const char *header, size_t data_bytes, uint64_t max_header, const char *words)
{
    struct buf b = st_file(header, data_bytes);
    struct qd_st_file f;
    char err[512] = "";
    int rc = qd_st_parse(b.p, b.n, max_header, "x.safetensors", &f, err, sizeof err);
    if (!words) {
        if (rc)
            fail_msg("%s: %s", header, err);
        qd_st_free(&f);
    } else if (rc != -1 || !strstr(err, words))
        fail_msg("%s: want an error naming '%s', got: %s", header, words, rc ? err : "(accepted)");
    free(b.p);
}

static void safetensors_names_are_whole_and_unique(void **state)
{
    const char *one = "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
    char h[512];
    snprintf(h, sizeof h, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", one);
    st_expect(h, 8, 0, NULL);
    snprintf(h, sizeof h, "{%s,\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", one);
    st_expect(h, 8, 0, "tensor 'a' appears twice");
    /* "a\u0000b" would be the name "a" to every C reader */
    st_expect("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0,
              "a tensor name holds a NUL character (\\u0000)");
    /* an escaped name that is not a NUL reads as itself */
    st_expect("{\"a\\u0062\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0, NULL);
    snprintf(h, sizeof h, "{\"__metadata__\":{\"k\":\"v\\u0000w\"},%s}", one);
    st_expect(h, 4, 0, "__metadata__ holds a NUL character");
    snprintf(h, sizeof h, "{\"__metadata__\":{\"k\":\"v\"},%s,\"__metadata__\":{}}", one);
    st_expect(h, 4, 0, "__metadata__ appears twice");
    snprintf(h, sizeof h, "{%s}x", one);
    st_expect(h, 4, 0, "not a JSON object");
    snprintf(h, sizeof h, "{%s{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", one);
    st_expect(h, 8, 0, "not a JSON object"); /* a second object opened where a ',' belongs */
    snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1x],\"data_offsets\":[0,4]}}");
    st_expect(h, 4, 0, "its entry is not a JSON object");
}

static void safetensors_header_limit(void **state)
{
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    st_expect(h, 4, strlen(h), NULL);
    st_expect(h, 4, strlen(h) - 1, "over the limit of");
}

/* The GGUF reader's type table and the registry read each block size from one struct
 * (kernels/ggml_blocks.h): every format with a GGUF type has its geometry there, the same. */
static void gguf_types_match_the_registry(void **state)
{
    (void)state;
    int checked = 0;
    for (int i = 0; i < qd_format_count; i++) {
        const struct qd_format *f = &qd_formats[i];
        if (!f->gguf_type)
            continue;
        const struct qd_ggml_type *t = qd_ggml_type((uint32_t)f->gguf_type);
        if (!t)
            fail_msg("%s: GGUF type %d is not in gguf.c's table", f->name, f->gguf_type);
        if (t->block_elems != f->block_elems || t->block_bytes != f->block_bytes)
            fail_msg("%s: the registry says %d elements in %d bytes, gguf.c's %s %d in %d", f->name,
                     f->block_elems, f->block_bytes, t->name, t->block_elems, t->block_bytes);
        checked++;
    }
    assert_true(checked >= 23); /* the legacy, K, IQ, ternary and MXFP4 types */
    assert_int_equal(qd_ggml_type(15)->block_bytes, 292); /* q8_K: read, never written */
    assert_int_equal(qd_ggml_type(40)->block_bytes, 36);  /* ggml's nvfp4 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(alignment_of_the_wrong_type_is_not_read),
        cmocka_unit_test(zero_dimension_is_refused),
        cmocka_unit_test(names_twice_are_refused),
        cmocka_unit_test(duplicate_checks_take_n_log_n_comparisons),
        cmocka_unit_test(counts_over_the_limits_are_refused),
        cmocka_unit_test(cancel_stops_a_parse),
        cmocka_unit_test(safetensors_names_are_whole_and_unique),
        cmocka_unit_test(safetensors_header_limit),
        cmocka_unit_test(gguf_types_match_the_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
