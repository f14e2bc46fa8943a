/* kernels/awq.h and kernels/cpu/awq.c: AutoAWQ's f16 flow, its packing, and the facts the
 * fast paths rely on, checked over every f16 value they can meet. */
#include "helpers.h"

#include "../../kernels/awq.h"

static void awq_nibbles_follow_the_gemm_interleave(void **state)
{
    (void)state;
    /* group of 32 rows: row 0 all 0, row 1 all 15 -> scale 1, zero 0, so code = value */
    enum { K = 32, N = 16 };
    float w[K * N];
    for (int r = 0; r < K; r++)
        for (int c = 0; c < N; c++)
            w[r * N + c] = r == 0 ? 0.0f : r == 1 ? 15.0f : (float)((r + c) % 16);
    const char *params[] = {"group_size=32", NULL};
    struct test_q q;
    assert_int_equal(test_quantize(&q, "awq", w, K, N, QD_F32, params), QD_OK);
    const uint32_t *qw = q.buf[0];
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (int r = 0; r < K; r++)
        for (int word = 0; word < N / 8; word++)
            for (int i = 0; i < 8; i++)
                assert_int_equal((qw[r * 2 + word] >> (4 * i)) & 15,
                                 (uint32_t)w[r * N + word * 8 + order[i]]);
    assert_int_equal(((uint32_t *)q.buf[1])[0], 0); /* zeros */
    assert_true(qd_f16_to_f32(((uint16_t *)q.buf[2])[0]) == 1.0f);
    tq_release(&q);
}

/* Every f16 scale AutoAWQ can produce: f16(f16(range) / 15) for f16 ranges from its 1e-5
 * floor (168 * 2^-24) to 65504. */
static int awq_scale_possible(uint16_t bits)
{
    float s = qd_f16_to_f32(bits);
    return s >= qd_f16_round(qd_f16_round(1e-5f) / 15.0f) && s <= qd_f16_round(65504.0f / 15.0f);
}

static void awq_scale_divide_by_15_equals_torch_cuda_reciprocal_multiply(void **state)
{
    (void)state;
    /* torch on CUDA divides a tensor by a Python scalar as x * f32(1/15); on the CPU it divides.
     * The f16 results agree on every finite f16 range, so quantd's one rule is both. */
    const float inv15 = 1.0f / 15.0f;
    for (uint32_t b = 0; b < 0x7c00; b++) {
        float r = qd_f16_to_f32((uint16_t)b);
        assert_true(qd_f16_round(r / 15.0f) == qd_f16_round(r * inv15));
    }
}

static void awq_from_linear_recomputation_gives_the_code_back(void **state)
{
    (void)state;
    /* WQLinear_GEMM.from_linear recomputes each code from the fake-quantized f16 weight:
     * round(f16(f16(f16((c - z) * s) + f16(z * s)) / s)). For every scale AutoAWQ can make,
     * every zero and every code, that is the code again, so quantd skips the recomputation,
     * except at the scales qd_awq_scale_defined refuses (where f16 overflows). */
    int64_t checked = 0, undefined = 0;
    for (uint32_t b = 1; b < 0x7c00; b++) {
        if (!awq_scale_possible((uint16_t)b))
            continue;
        float s = qd_f16_to_f32((uint16_t)b);
        for (int z = 0; z < 16; z++) {
            float sz = qd_f16_round((float)z * s);
            for (int c = 0; c < 16; c++) {
                float wq = qd_f16_round((float)(c - z) * s);
                float back = qd_rint(qd_f16_round(qd_f16_round(wq + sz) / s));
                checked++;
                if (back == (float)c)
                    continue;
                /* only at scale 4368, where qd_awq_column_defined refuses a column whose
                 * largest code is c (its max is (c - z) * s) */
                if (s != 4368.0f || qd_awq_column_defined((float)(c - z) * s, s, (float)z))
                    fail_msg("scale 0x%04x zero %d code %d: from_linear gives %g", b, z, c, back);
                undefined++;
            }
        }
    }
    assert_true(checked > 6000000);
    assert_true(undefined >= 16); /* at least zero 15 with every code */
    assert_true(qd_f16_round(qd_f16_round(65504.0f) / 15.0f) == 4368.0f);
    assert_true(qd_f16_round(qd_f16_round(65472.0f) / 15.0f) < 4368.0f);
    assert_false(qd_awq_column_defined(65504.0f, 4368.0f, 0.0f)); /* code 15 */
    assert_false(qd_awq_column_defined(0.0f, 4368.0f, 15.0f));
    assert_false(qd_awq_column_defined(32750.0f, 4368.0f, 8.0f)); /* code 8 + 8 -> 15 */
    assert_true(qd_awq_column_defined(2.0f * 4368.0f, 4368.0f, 8.0f)); /* code 10 */
    assert_true(qd_awq_column_defined(2.0f * 4368.0f, 4368.0f, 13.0f)); /* code 15, but 13 * 4368
                                                                          rounds down: finite */
    assert_false(qd_awq_column_defined(1.0f, INFINITY, 0.0f));
    assert_false(qd_awq_column_defined(1.0f, NAN, 0.0f));
}

static void awq_code_rounds_the_f16_quotient_half_to_even(void **state)
{
    (void)state;
    /* scale 1/16 (exact): the f16 ulp in [2, 4) is 2^-9, so quotients within 2^-10 of 2.5 or
     * 3.5 become those f16 ties and round to even; f32 arithmetic would round them by side */
    float s = 0.0625f;
    assert_int_equal(qd_awq_code((2.5f + 0x1p-11f) * s, s, 0.0f), 2); /* f32: 3 */
    assert_int_equal(qd_awq_code((3.5f - 0x1p-11f) * s, s, 0.0f), 4); /* f32: 3 */
    assert_int_equal(qd_awq_code((2.5f - 0x1p-9f) * s, s, 0.0f), 2);  /* an f16 below the tie */
    assert_int_equal(qd_awq_code((2.5f + 0x1p-9f) * s, s, 0.0f), 3);  /* an f16 above it */
    assert_int_equal(qd_awq_code((2.5f + 0x1p-11f) * s, s, 3.0f), 5); /* the zero is added after */
}

static void awq_weights_are_halved_before_the_statistics(void **state)
{
    (void)state;
    /* f32 weights that differ below f16 precision give the bytes of their f16 roundings */
    enum { K = 64, N = 16 };
    float w[K * N], w16[K * N];
    for (int i = 0; i < K * N; i++) {
        w[i] = test_normal() * 0.02f;
        w16[i] = qd_f16_round(w[i]);
    }
    const char *params[] = {"group_size=32", NULL};
    struct test_q a, b;
    assert_int_equal(test_quantize(&a, "awq", w, K, N, QD_F32, params), QD_OK);
    assert_int_equal(test_quantize(&b, "awq", w16, K, N, QD_F16, params), QD_OK);
    for (int i = 0; i < a.n; i++)
        assert_memory_equal(a.buf[i], b.buf[i], (size_t)a.c[i].bytes);
    tq_release(&a);
    tq_release(&b);
}

static void awq_f16_overflow_is_refused_naming_the_group(void **state)
{
    (void)state;
    enum { K = 64, N = 16 };
    float w[K * N];
    const char *params[] = {"group_size=32", NULL};
    const char *allowed[] = {"group_size=32", "allow_nonfinite=true", NULL};
    struct test_q q;
    for (int kind = 0; kind < 3; kind++) {
        for (int i = 0; i < K * N; i++)
            w[i] = test_normal();
        if (kind == 2) { /* max - min = 65500: the f16 range 65504, scale 4368, a code 15 */
            w[(32 + 3) * N + 5] = 32750.0f;
            w[(32 + 9) * N + 5] = -32750.0f;
        } else if (kind == 0) { /* a range over 65504 in group 1, column 5: both ends finite in f16 */
            w[(32 + 3) * N + 5] = 40000.0f;
            w[(32 + 9) * N + 5] = -40000.0f;
        } else /* a weight beyond f16 (f32 input): inf once halved */
            w[(32 + 7) * N + 5] = 70000.0f;
        assert_int_equal(test_quantize(&q, "awq", w, K, N, QD_F32, params), QD_ENONFINITE);
        assert_non_null(strstr(q.err, "group starting at input element 517 "));
        assert_non_null(strstr(q.err, "overflows f16"));
        tq_release(&q);
        /* allowed: the f16 flow carries on with the inf scale (docs/formats.md) */
        assert_int_equal(test_quantize(&q, "awq", w, K, N, QD_F32, allowed), QD_OK);
        assert_int_equal(((uint16_t *)q.buf[2])[N + 5], kind == 2 ? 0x6c44 : 0x7c00); /* 4368, inf */
        tq_release(&q);
    }
    /* a NaN before the group still wins: it is the first bad element */
    w[2] = NAN;
    assert_int_equal(test_quantize(&q, "awq", w, K, N, QD_F32, params), QD_ENONFINITE);
    assert_non_null(strstr(q.err, "input element 2 is not finite"));
    tq_release(&q);
}

static void awq_subnormal_f16_scales(void **state)
{
    (void)state;
    /* tiny weights: f16 subnormal weights and scales, the 1e-5 range floor, zero groups */
    enum { K = 32, N = 8 };
    float w[K * N];
    for (int i = 0; i < K * N; i++)
        w[i] = (i % N) == 0 ? 0.0f : (i % N) == 1 ? 3e-7f * (float)(i % 5) : test_normal() * 1e-4f;
    const char *params[] = {"group_size=32", NULL};
    struct test_q q;
    assert_int_equal(test_quantize(&q, "awq", w, K, N, QD_F32, params), QD_OK);
    const uint16_t *sc = q.buf[2];
    assert_int_equal(sc[0], 11); /* zero column: f16(f16(1e-5) / 15) = 11 * 2^-24 */
    for (int c = 0; c < N; c++)
        assert_true(sc[c] < 0x0400); /* every scale subnormal */
    tq_release(&q);
}

/* awq's layout is of a 2-D W [K, N]: any other rank is refused by name (the registry's
 * matrix_only), while 2-D lays out. */
static void awq_takes_only_a_matrix(void **state)
{
    const struct qd_format *f = qd_format_find("awq");
    struct qd_params p;
    qd_params_default(f, &p);
    struct qd_component c[QD_MAX_COMPONENTS];
    char err[160] = "";
    struct qd_tensor t = {.dtype = QD_F16};
    int64_t three[3] = {2, 128, 128}, two[2] = {128, 128};
    qd_tensor_set_shape(&t, 3, three);
    assert_int_equal(qd_format_layout(f, &p, &t, c, err, sizeof err), -1);
    assert_string_equal(err, "awq needs a 2-D weight [K, N] (got 3 dimensions)");
    qd_tensor_set_shape(&t, 2, two);
    assert_true(qd_format_layout(f, &p, &t, c, err, sizeof err) > 0);
    assert_false(qd_format_find("w4a16")->matrix_only);
}

int main(void)
{
    test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(awq_nibbles_follow_the_gemm_interleave),
        cmocka_unit_test(awq_scale_divide_by_15_equals_torch_cuda_reciprocal_multiply),
        cmocka_unit_test(awq_from_linear_recomputation_gives_the_code_back),
        cmocka_unit_test(awq_code_rounds_the_f16_quotient_half_to_even),
        cmocka_unit_test(awq_weights_are_halved_before_the_statistics),
        cmocka_unit_test(awq_f16_overflow_is_refused_naming_the_group),
        cmocka_unit_test(awq_subnormal_f16_scales),
        cmocka_unit_test(awq_takes_only_a_matrix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
