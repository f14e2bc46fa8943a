/* kernels/mlx.h and the mlx_* formats: the bit streams (codes crossing 32-bit words), and the
 * rules of mlx's arithmetic that differ from OCP's and NVIDIA's (docs/formats.md). The bytes
 * themselves are compared with mlx in tests/peers/test_mlx.py. */
#include <stdio.h>

#include "../../kernels/mlx.h"
#include "helpers.h"

static const int all_bits[] = {1, 2, 3, 4, 5, 6, 8};

/* Bit i of a little-endian stream of 32-bit words, read one bit at a time. */
static uint32_t stream_bit(const uint32_t *w, int i) { return w[i / 32] >> (i % 32) & 1u; }

static uint32_t stream_code(const uint32_t *w, int bits, int j)
{
    uint32_t c = 0;
    for (int i = 0; i < bits; i++)
        c |= stream_bit(w, j * bits + i) << i;
    return c;
}

static void pack32_lays_codes_in_one_little_endian_stream(void **state)
{
    (void)state;
    for (size_t b = 0; b < sizeof all_bits / sizeof all_bits[0]; b++) {
        int bits = all_bits[b];
        uint32_t codes[32], words[8];
        for (int round = 0; round < 200; round++) {
            for (int j = 0; j < 32; j++)
                codes[j] = (uint32_t)(test_uniform() * (1 << bits)) & ((1u << bits) - 1);
            memset(words, 0xA5, sizeof words);
            qd_mlx_pack32(codes, bits, words);
            for (int j = 0; j < 32; j++) {
                assert_int_equal(stream_code(words, bits, j), codes[j]);
                assert_int_equal(qd_mlx_unpack(words, bits, j), codes[j]);
            }
            for (int k = bits; k < 8; k++) /* nothing written past the run's `bits` words */
                assert_int_equal(words[k], 0xA5A5A5A5u);
        }
        for (int j = 0; j < 32; j++) /* every code at its largest: every bit of the run set */
            codes[j] = (1u << bits) - 1;
        qd_mlx_pack32(codes, bits, words);
        for (int k = 0; k < bits; k++)
            assert_int_equal(words[k], 0xFFFFFFFFu);
    }
}

/* The codes that straddle two words: 3 bits: code 10 at bits 30-32; 5 bits: code 6 at 30-34;
 * 6 bits: code 5 at 30-35 (its low two bits end word 0, the rest start word 1). */
static void codes_crossing_a_word_boundary_split_low_bits_first(void **state)
{
    (void)state;
    const struct { int bits, j; uint32_t code, w0, w1; } cases[] = {
        {3, 10, 0x5, 0x40000000u, 0x1u}, {3, 21, 0x3, 0x80000000u, 0x1u},
        {5, 6, 0x1b, 0xC0000000u, 0x6u}, {5, 12, 0x11, 0x10000000u, 0x1u}, /* bits 60-64: one bit in word 2 */
        {6, 5, 0x2d, 0x40000000u, 0xBu}, {6, 21, 0x3f, 0xC0000000u, 0xFu},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t codes[32] = {0}, words[8];
        codes[cases[i].j] = cases[i].code;
        qd_mlx_pack32(codes, cases[i].bits, words);
        int at = cases[i].j * cases[i].bits, w = at / 32;
        assert_int_equal(words[w], cases[i].w0);
        assert_int_equal(words[w + 1], cases[i].w1);
        for (int k = 0; k < cases[i].bits; k++) /* nothing else set */
            if (k != w && k != w + 1)
                assert_int_equal(words[k], 0);
        assert_int_equal(qd_mlx_unpack(words, cases[i].bits, cases[i].j), cases[i].code);
    }
}

/* Through the public API: a row of 128 3-bit codes is one stream over its 12 words (four groups
 * of 32 back to back), codes 7 - x for the ramp 0..7 (mlx's sign rule puts the edge at the max). */
static void affine_rows_are_one_stream_across_groups(void **state)
{
    (void)state;
    float x[2 * 128];
    for (int i = 0; i < 2 * 128; i++)
        x[i] = (float)(i % 8);
    struct test_q q;
    const char *params[] = {"bits=3", "group_size=32", NULL};
    assert_int_equal(test_quantize(&q, "mlx_affine", x, 2, 128, QD_F32, params), QD_OK);
    assert_int_equal(q.c[0].dtype, QD_U32);
    assert_int_equal(q.c[0].shape[1], 12);
    const uint32_t *w = q.buf[0];
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 128; j++)
            assert_int_equal(stream_code(w + 12 * r, 3, j), 7 - (j % 8));
    for (int g = 0; g < 8; g++) {
        assert_true(((float *)q.buf[1])[g] == -1.0f);
        assert_true(((float *)q.buf[2])[g] == 7.0f);
    }
    float *y = test_dequantize(&q, "mlx_affine", QD_F32);
    for (int i = 0; i < 2 * 128; i++)
        assert_true(y[i] == x[i]);
    free(y);
    tq_release(&q);
}

static void affine_scale_and_bias_rules(void **state)
{
    (void)state;
    float s, b;
    qd_mlx_affine_params(0.0f, 0.0f, 4, &s, &b); /* zero group: -eps, no bias */
    assert_true(s == -1e-7f && b == 0.0f);
    qd_mlx_affine_params(-2.0f, 1.0f, 2, &s, &b); /* the min is the edge: 3 steps of 1 */
    assert_true(s == 1.0f && b == -2.0f);
    qd_mlx_affine_params(-1.0f, 2.0f, 2, &s, &b); /* the max is: the scale turns negative */
    assert_true(s == -1.0f && b == 2.0f);
    qd_mlx_affine_params(0.25f, 0.25f, 8, &s, &b); /* constant: rint(0.25 / -1e-7) steps */
    assert_true(b == 0.25f && s == 0.25f / -2500000.0f);
    qd_mlx_affine_params(-3.0f, 5.0f, 1, &s, &b); /* 1 bit: 0 is the min, 1 the max */
    assert_true(s == 8.0f && b == -3.0f);
    qd_mlx_affine_params(-3e38f, 3e38f, 1, &s, &b); /* the range overflows: inf / inf quotients */
    assert_true(s == INFINITY);
    assert_int_equal(qd_mlx_affine_code((3e38f - b) / s, 1.0f), 0);
    assert_int_equal(qd_mlx_affine_code(2.5f, 15.0f), 2); /* half to even */
    assert_int_equal(qd_mlx_affine_code(3.5f, 15.0f), 4);
    assert_int_equal(qd_mlx_affine_code(-0.7f, 15.0f), 0);
    assert_int_equal(qd_mlx_affine_code(15.6f, 15.0f), 15);
}

static void e2m1_ties_go_to_the_smaller_magnitude_and_negative_zero_to_code_0(void **state)
{
    (void)state;
    const struct { float q; uint32_t code; } cases[] = {
        {0.25f, 0}, {0.2500001f, 1}, {0.75f, 1}, {1.25f, 2}, {1.75f, 3}, {2.5f, 4}, {3.5f, 5}, {5.0f, 6},
        {5.0000005f, 7}, {6.0f, 7}, {7.9f, 7}, {-0.0f, 0}, {-1e-30f, 0}, {-0.25f, 0}, {-0.2500001f, 9},
        {-0.75f, 9}, {-1.75f, 11}, {-5.0f, 14}, {-6.5f, 15},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (qd_mlx_e2m1_near(cases[i].q) != cases[i].code || qd_mlx_e2m1(cases[i].q) != cases[i].code)
            fail_msg("E2M1 of %g: %u, mlx's argmin gives %u", (double)cases[i].q, qd_mlx_e2m1(cases[i].q),
                     cases[i].code);
    }
}

/* nvfp4's quotients beyond 8 (a saturated scale, a tiny one): the f32 distances to the table
 * round and tie, and argmin keeps the first; NaN and infinities give code 0. */
static void far_e2m1_quotients_take_the_first_of_tied_distances(void **state)
{
    (void)state;
    assert_int_equal(qd_mlx_e2m1(9.0f), 7);
    assert_int_equal(qd_mlx_e2m1(-9.0f), 15);
    assert_int_equal(qd_mlx_e2m1(1e30f), 0); /* |q - v| = |q| for every v */
    assert_int_equal(qd_mlx_e2m1(-1e30f), 0);
    /* 2^26 + 8 (f32 steps of 8 above 2^26, 4 below): q - 4 ties to 2^26, q - 6 rounds to it: the
     * first index with that distance is 4.0's */
    assert_int_equal(qd_mlx_e2m1(0x1p26f + 8.0f), 6);
    assert_int_equal(qd_mlx_e2m1(INFINITY), 0);
    assert_int_equal(qd_mlx_e2m1(-INFINITY), 0);
    assert_int_equal(qd_mlx_e2m1(NAN), 0);
}

static void mx_scale_is_the_smallest_power_of_two_at_least_amax_over_max(void **state)
{
    (void)state;
    float x[32] = {0};
    uint32_t w[8];
    struct { float amax; int fp8, dt; uint8_t byte; } cases[] = {
        {6.0f, 0, QD_F32, 127},                    /* s = 1 exactly */
        {6.0000005f, 0, QD_F32, 128},              /* just above: up (OCP's floor rule: 127) */
        {11.9f, 0, QD_F32, 128},                   /* log2(s) = 0.99: 1 (floor: 0) */
        {8.4f, 0, QD_F32, 128},                    /* log2(s) = 0.49: mlx still steps up */
        {448.0f, 1, QD_F32, 127},
        {449.0f, 1, QD_F32, 128},
        {0.0f, 0, QD_F32, 127},                    /* a zero group: e = 0 */
        {6.0f * 0x1p-130f, 0, QD_F32, 253},        /* s = 2^-130: e + 127 = -3 wraps to 253 */
        {0x1p-126f, 0, QD_F32, 255},               /* 2^-128.58: e = -128, byte 255 (dequantizes to inf) */
        {1e-45f, 0, QD_F32, 127},                  /* s rounds to 0 in f32 */
        {7.0f * 0x1p-24f, 0, QD_F16, 103},        /* f16: s rounds to 2^-24 before the log */
        {7.0f * 0x1p-24f, 0, QD_F32, 104},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        x[3] = cases[i].amax;
        uint8_t b = qd_mlx_mx_group(cases[i].dt, cases[i].fp8, x, w);
        if (b != cases[i].byte)
            fail_msg("amax %a (%s, %s): byte %u, mlx gives %u", (double)cases[i].amax, cases[i].fp8 ? "fp8" : "fp4",
                     qd_dtype_name(cases[i].dt), b, cases[i].byte);
    }
    /* the element: x / 2^e, rounded to the input's dtype, then the code */
    memset(x, 0, sizeof x);
    x[0] = 6.0f, x[1] = 0.75f, x[2] = -0.25f, x[3] = -0.75f;
    assert_int_equal(qd_mlx_mx_group(QD_F32, 0, x, w), 127);
    assert_int_equal(w[0], 0x9017u); /* codes 7, 1, 0, 9 */
}

static void nvfp4_zero_and_tiny_groups_have_scale_0_and_codes_0(void **state)
{
    (void)state;
    float x[16] = {0};
    uint32_t w[2];
    assert_int_equal(qd_mlx_nv_group(QD_F32, 1.0f, x, w), 0);
    assert_true(w[0] == 0 && w[1] == 0);
    for (int j = 0; j < 16; j++) /* amax / 6 below e4m3's half-step 2^-10: scale 0, x / 0 */
        x[j] = j % 2 ? 1e-4f : -5e-5f;
    assert_int_equal(qd_mlx_nv_group(QD_F32, 1.0f, x, w), 0);
    assert_true(w[0] == 0 && w[1] == 0);
    x[0] = 6.0f; /* scale 1: 1e-4 and -5e-5 round to code 0 */
    assert_int_equal(qd_mlx_nv_group(QD_F32, 1.0f, x, w), 0x38);
    assert_true(w[0] == 7 && w[1] == 0);
    /* a global scale: encode by 2688 / g; a scale that saturates at 448 leaves quotients far
     * beyond 6, tied to code 0 for the values whose distances round together */
    assert_int_equal(qd_mlx_nv_group(QD_F32, 2688.0f / 1e-3f, x, w), 0x7e);
}

static void mx_dequantize_scale_is_computed_in_the_output_dtype(void **state)
{
    (void)state;
    assert_true(qd_mlx_mx_scale(255, QD_F32) == INFINITY); /* 2^128, not E8M0's NaN */
    assert_true(qd_mlx_mx_scale(255, QD_BF16) == INFINITY);
    assert_true(qd_mlx_mx_scale(0, QD_F32) == 0x1p-127f);
    assert_true(qd_mlx_mx_scale(127 + 16, QD_F16) == INFINITY);
    assert_true(qd_mlx_mx_scale(127 + 15, QD_F16) == 32768.0f);
    assert_true(qd_mlx_mx_scale(127 - 24, QD_F16) == 0x1p-24f);
    assert_true(qd_mlx_mx_scale(127 - 25, QD_F16) == 0.0f); /* a tie, to even: 0 */
    assert_true(qd_mlx_nv_scale(0x7f, 0.0f) != qd_mlx_nv_scale(0x7f, 0.0f)); /* E4M3 NaN */
    assert_true(qd_mlx_nv_scale(0x38, 2.0f / 2688.0f) == 2.0f / 2688.0f);
}

static void dequantize_dtype_is_what_mlx_returns(void **state)
{
    (void)state;
    struct qd_params p;
    const struct qd_format *a = qd_format_find("mlx_affine"), *nv = qd_format_find("mlx_nvfp4");
    qd_params_default(a, &p);
    assert_int_equal(qd_format_dequant_dtype(a, &p, QD_F16), QD_F16); /* auto: the input's */
    p.scale_dtype = QD_SCALE_BF16;
    assert_int_equal(qd_format_dequant_dtype(a, &p, QD_F32), QD_BF16); /* the scales' */
    const char *fp[] = {"mlx_mxfp4", "mlx_nvfp4", "mlx_mxfp8"};
    for (int i = 0; i < 3; i++) {
        qd_params_default(qd_format_find(fp[i]), &p);
        assert_int_equal(qd_format_dequant_dtype(qd_format_find(fp[i]), &p, QD_F32), QD_BF16);
    }
    char err[128];
    qd_params_default(nv, &p);
    assert_int_equal(p.has_global_scale, 0); /* none unless given (nvfp4 computes its own) */
    char *json = qd_registry_json();
    assert_non_null(strstr(json, "\"none\""));
    free(json);
    assert_int_equal(qd_params_set(nv, &p, "global_scale", "3.5", err, sizeof err), QD_OK);
    assert_int_equal(qd_format_dequant_dtype(nv, &p, QD_F16), QD_F32);
    assert_int_equal(qd_format_dequant_dtype(qd_format_find("q4_0"), &p, QD_F16), QD_F16);
}

int main(void)
{
    test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pack32_lays_codes_in_one_little_endian_stream),
        cmocka_unit_test(codes_crossing_a_word_boundary_split_low_bits_first),
        cmocka_unit_test(affine_rows_are_one_stream_across_groups),
        cmocka_unit_test(affine_scale_and_bias_rules),
        cmocka_unit_test(e2m1_ties_go_to_the_smaller_magnitude_and_negative_zero_to_code_0),
        cmocka_unit_test(far_e2m1_quotients_take_the_first_of_tied_distances),
        cmocka_unit_test(mx_scale_is_the_smallest_power_of_two_at_least_amax_over_max),
        cmocka_unit_test(nvfp4_zero_and_tiny_groups_have_scale_0_and_codes_0),
        cmocka_unit_test(mx_dequantize_scale_is_computed_in_the_output_dtype),
        cmocka_unit_test(dequantize_dtype_is_what_mlx_returns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
