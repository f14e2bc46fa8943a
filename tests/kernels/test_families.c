/* The documented edge cases of each format family (docs/formats.md), one test each. */
#include "../../kernels/bnb4.h"
#include "../../kernels/ggml.h"
#include "../../kernels/mx.h"
#include "helpers.h"

static const char *const no_dq[] = {"double_quant=false", NULL};

static void nf4_zero_block_packs_code_0(void **state)
{
    (void)state;
    float x[128];
    for (int i = 0; i < 128; i++)
        x[i] = i < 64 ? 0.0f : test_normal();
    struct test_q q;
    assert_int_equal(test_quantize(&q, "nf4", x, 0, 128, QD_F32, no_dq), QD_OK);
    const uint8_t *data = q.buf[0];
    for (int j = 0; j < 32; j++) /* 0 * (1/0) = NaN: bitsandbytes codes NaN as 0 */
        assert_int_equal(data[j], 0x00);
    assert_true(((float *)q.buf[1])[0] == 0.0f);
    tq_release(&q);
}

static void nf4_odd_tail_pairs_with_code_of_zero(void **state)
{
    (void)state;
    float x[65];
    for (int i = 0; i < 65; i++)
        x[i] = test_normal();
    x[64] = 1.0f; /* last block holds one element: absmax 1, code 15, padding 0.0 -> code 7 */
    struct test_q q;
    assert_int_equal(test_quantize(&q, "nf4", x, 0, 65, QD_F32, no_dq), QD_OK);
    assert_int_equal(q.c[0].shape[0], 33);
    assert_int_equal(((uint8_t *)q.buf[0])[32], 0xF7);
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "fp4", x, 0, 65, QD_F32, no_dq), QD_OK);
    assert_int_equal(((uint8_t *)q.buf[0])[32], 0x30); /* fp4: 1.0 -> 0b0011, 0.0 -> 0 */
    tq_release(&q);
}

static void nf4_single_outlier_takes_the_extreme_code(void **state)
{
    (void)state;
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = 0.001f * test_normal();
    x[10] = -500.0f;
    struct test_q q;
    assert_int_equal(test_quantize(&q, "nf4", x, 0, 64, QD_F32, no_dq), QD_OK);
    const uint8_t *d = q.buf[0];
    assert_int_equal(d[5] >> 4, 0); /* -1.0 */
    for (int j = 0; j < 32; j++) /* everything else rounds to 0.0 (code 7) */
        if (j != 5)
            assert_true((d[j] >> 4) == 7 && (d[j] & 15) == 7);
        else
            assert_int_equal(d[j] & 15, 7);
    tq_release(&q);
}

static void approximate_reciprocal_edges(void **state)
{
    (void)state;
    for (int e = -120; e <= 120; e++) /* powers of two are exact */
        assert_true(qd_rcp_approx(ldexpf(1.0f, e)) == ldexpf(1.0f, -e));
    assert_true(isinf(qd_rcp_approx(0.0f)) && qd_rcp_approx(0.0f) > 0);
    assert_true(isinf(qd_rcp_approx(1e-40f))); /* subnormal input counts as zero */
    assert_true(qd_rcp_approx(INFINITY) == 0.0f);
    assert_true(qd_rcp_approx(3e38f) == 0.0f); /* 1/3e38 is subnormal: flushed */
    for (int i = 0; i < 100000; i++) { /* within one ulp of the exact reciprocal */
        float x = (float)(test_uniform() * 1e6 + 1e-6);
        float r = qd_rcp_approx(x), exact = 1.0f / x;
        int32_t d = (int32_t)qd_f32_bits(r) - (int32_t)qd_f32_bits(exact);
        assert_true(d >= -1 && d <= 1);
    }
}

static void double_quant_offset_is_mean_of_absmax(void **state)
{
    (void)state;
    float x[64 * 300];
    for (int i = 0; i < 64 * 300; i++)
        x[i] = test_normal() * (1 + i / 64 % 7);
    struct test_q q;
    assert_int_equal(test_quantize(&q, "nf4", x, 0, 64 * 300, QD_F32, NULL), QD_OK);
    double sum = 0;
    for (int b = 0; b < 300; b++) {
        float m = 0;
        for (int i = 0; i < 64; i++)
            m = fmaxf(m, fabsf(x[b * 64 + i]));
        sum += m;
    }
    assert_true(q.p.has_offset && q.p.offset == (float)(sum / 300));
    assert_int_equal(q.c[2].shape[0], 2); /* ceil(300 / 256) nested absmax */
    tq_release(&q);
}

static void ggml_all_zero_block_has_negative_zero_scale(void **state)
{
    (void)state;
    /* ggml starts from max = 0.0f, so d = 0.0f / -8 = -0.0 (f16 0x8000); gguf's numpy port
     * takes the element itself and may give +0.0: ggml's C reference is the contract. */
    float x[32] = {0};
    x[0] = -0.0f;
    uint8_t blk[22];
    qd_ggml_quantize_block(QD_Q4_0, x, blk);
    assert_int_equal(blk[0], 0x00);
    assert_int_equal(blk[1], 0x80);
    for (int j = 2; j < 18; j++)
        assert_int_equal(blk[j], 0x88); /* (int8)(0 + 8.5) = 8 */
    qd_ggml_quantize_block(QD_Q5_0, x, blk);
    assert_int_equal(blk[1], 0x80);
}

static void ggml_signed_max_first_wins_on_ties(void **state)
{
    (void)state;
    float x[32] = {0};
    x[3] = -2.0f;
    x[9] = 2.0f; /* same magnitude later: the first (-2) sets d = -2 / -8 = 0.25 */
    uint8_t blk[18];
    qd_ggml_quantize_block(QD_Q4_0, x, blk);
    assert_true(qd_get_f16(blk) == 0.25f);
    assert_int_equal(blk[2 + 3] & 15, 0);  /* -2 * 4 + 8.5 = 0.5 -> 0 */
    assert_int_equal(blk[2 + 9] & 15, 15); /* 2 * 4 + 8.5 = 16.5 -> 16 -> capped 15 */
}

static void ggml_q8_rounds_half_away_from_zero(void **state)
{
    (void)state;
    float x[32] = {0};
    x[0] = 127.0f; /* d = 1, id = 1 */
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = 0.5f;
    uint8_t blk[36];
    qd_ggml_quantize_block(QD_Q8_1, x, blk);
    const int8_t *qs = (const int8_t *)blk + 4;
    assert_int_equal(qs[1], 3);
    assert_int_equal(qs[2], -3);
    assert_int_equal(qs[3], 1);
    assert_true(qd_get_f16(blk + 2) == (float)(127 + 3 - 3 + 1)); /* s = d * sum(qs) */
}

static void ggml_huge_block_overflows_the_f16_scale_as_ggml(void **state)
{
    (void)state;
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = 1e7f * (i + 1);
    uint8_t blk[34];
    qd_ggml_quantize_block(QD_Q8_0, x, blk);
    assert_true(isinf(qd_get_f16(blk))); /* 3.2e8 / 127 does not fit an f16 */
}

static void mx_floor_scale_and_element_codes(void **state)
{
    (void)state;
    float x[32] = {0};
    x[0] = 1.0f;  /* amax 1: exponent 0 - emax 2 = -2 -> byte 125; 1.0 * 4 = 4.0 -> e2m1 0b110 */
    x[1] = -0.75f; /* -3.0 -> 0b1101 */
    uint8_t out[32];
    assert_int_equal(qd_mx_quantize_block(QD_E2M1, 0, 0, x, out), 125);
    assert_int_equal(out[0], 0x6 | 0xD << 4); /* first element in the low nibble */
    x[0] = 0.0f;
    x[1] = 0.0f;
    assert_int_equal(qd_mx_quantize_block(QD_E2M1, 0, 0, x, out), 0); /* zero block: byte 0 */
    x[5] = INFINITY;
    assert_int_equal(qd_mx_quantize_block(QD_E4M3, 0, 0, x, out), 0xFF);
    x[5] = 100.0f; /* rceil: 100/448 -> 2^-2 -> 125; floor: 6 - 8 -> 125 as well */
    assert_int_equal(qd_mx_quantize_block(QD_E4M3, 1, 0, x, out), 125);
    x[5] = 500.0f; /* floor: 8 - 8 = 0 -> 127, 500 saturates to 448; rceil: 500/448 -> 2^1 */
    assert_int_equal(qd_mx_quantize_block(QD_E4M3, 0, 0, x, out), 127);
    assert_int_equal(out[5], 0x7E);
    assert_int_equal(qd_mx_quantize_block(QD_E4M3, 1, 0, x, out), 128);
}

static void mx_fp6_packs_four_codes_in_three_bytes_low_first(void **state)
{
    (void)state;
    uint8_t codes[32], out[32];
    for (int j = 0; j < 32; j++)
        codes[j] = (uint8_t)((j * 7 + 3) & 63);
    qd_mx_pack(QD_E2M3, 0, codes, out);
    uint32_t w = (uint32_t)out[0] | (uint32_t)out[1] << 8 | (uint32_t)out[2] << 16;
    assert_int_equal(w & 63, codes[0]);
    assert_int_equal((w >> 6) & 63, codes[1]);
    assert_int_equal((w >> 18) & 63, codes[3]);
    for (int j = 0; j < 32; j++)
        assert_int_equal(qd_mx_unpack(QD_E2M3, 0, out, j), codes[j]);
}

static void swizzled_scale_offsets_follow_the_128x4_tiles(void **state)
{
    (void)state;
    assert_int_equal(qd_swizzle_offset(0, 0, 8), 0);
    assert_int_equal(qd_swizzle_offset(33, 2, 8), 16 + 4 + 2);
    assert_int_equal(qd_swizzle_offset(0, 4, 8), 512); /* next tile along columns */
    assert_int_equal(qd_swizzle_offset(128, 0, 8), 1024); /* next tile row: 2 column tiles */
    assert_int_equal(qd_swizzle_offset(127, 3, 5), 31 * 16 + 3 * 4 + 3);
    assert_int_equal(qd_swizzle_bytes(130, 5), 256 * 8);
}

static void nvfp4_global_scale_given_is_used_and_reported(void **state)
{
    (void)state;
    float x[64 * 32];
    for (int i = 0; i < 64 * 32; i++)
        x[i] = test_normal();
    const char *given[] = {"global_scale=500", "scale_layout=linear", NULL};
    struct test_q q;
    assert_int_equal(test_quantize(&q, "nvfp4", x, 64, 32, QD_F32, given), QD_OK);
    assert_true(*(float *)q.buf[2] == 500.0f);
    assert_true(q.p.per_tensor_scale == 1.0f / 500.0f);
    tq_release(&q);
    const char *computed[] = {"scale_layout=linear", NULL};
    assert_int_equal(test_quantize(&q, "nvfp4", x, 64, 32, QD_F32, computed), QD_OK);
    float amax = 0;
    for (int i = 0; i < 64 * 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    assert_true(q.p.per_tensor_scale == amax / 2688.0f);
    tq_release(&q);
}

static void nvfp4_swizzle_padding_is_zero(void **state)
{
    (void)state;
    float x[3 * 32];
    for (int i = 0; i < 96; i++)
        x[i] = test_normal();
    struct test_q q;
    assert_int_equal(test_quantize(&q, "nvfp4", x, 3, 32, QD_F32, NULL), QD_OK);
    const uint8_t *s = q.buf[1];
    assert_int_equal(q.c[1].bytes, 512);
    for (int r = 0; r < 128; r++)
        for (int c = 0; c < 4; c++) {
            uint8_t v = s[qd_swizzle_offset(r, c, 2)];
            if (r >= 3 || c >= 2)
                assert_int_equal(v, 0);
            else
                assert_int_not_equal(v, 0);
        }
    tq_release(&q);
}

static void int8_zero_tensor_gets_scale_one(void **state)
{
    (void)state;
    float x[64] = {0};
    struct test_q q;
    assert_int_equal(test_quantize(&q, "int8", x, 2, 32, QD_F32, NULL), QD_OK);
    assert_true(*(float *)q.buf[1] == 1.0f);
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "uint8", x, 2, 32, QD_F32, NULL), QD_OK);
    assert_true(*(float *)q.buf[1] == 1.0f);
    assert_int_equal(*(uint8_t *)q.buf[2], 0);
    tq_release(&q);
}

static void uint8_range_includes_zero(void **state)
{
    (void)state;
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = i < 32 ? 1.0f + (float)i : -1.0f - (float)i; /* row 0 positive, row 1 negative */
    const char *rows[] = {"granularity=row", NULL};
    struct test_q q;
    assert_int_equal(test_quantize(&q, "uint8", x, 2, 32, QD_F32, rows), QD_OK);
    const uint8_t *zp = q.buf[2];
    assert_int_equal(zp[0], 0);   /* [0, 32] */
    assert_int_equal(zp[1], 255); /* [-64, 0] */
    assert_true(((float *)q.buf[1])[0] == 32.0f / 255.0f);
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "int8", x, 2, 32, QD_F32, rows), QD_OK);
    assert_int_equal(((int8_t *)q.buf[0])[31], 127);
    assert_int_equal(((int8_t *)q.buf[0])[63], -127);
    tq_release(&q);
}

static void tiny_and_huge_magnitudes_keep_their_error(void **state)
{
    (void)state;
    /* scale-free formats: scaling by a power of two in range leaves the relative error */
    const char *fmts[] = {"nf4", "fp4", "mxfp4", "mxfp8_e4m3", "int8", "uint8", "nvfp4"};
    float x[4096], y[4096];
    for (int i = 0; i < 4096; i++)
        x[i] = test_normal();
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        double ref = -1;
        for (int e = -60; e <= 60; e += 30) {
            for (int i = 0; i < 4096; i++)
                y[i] = ldexpf(x[i], e);
            struct test_q q;
            assert_int_equal(test_quantize(&q, fmts[f], y, 64, 64, QD_F32, NULL), QD_OK);
            float *back = test_dequantize(&q, fmts[f], QD_F32);
            double num = 0, den = 0;
            for (int i = 0; i < 4096; i++) {
                num += ((double)back[i] - y[i]) * ((double)back[i] - y[i]);
                den += (double)y[i] * y[i];
            }
            if (ref < 0)
                ref = num / den;
            else if (fabs(num / den - ref) > 1e-9 + 1e-6 * ref)
                fail_msg("%s at 2^%d: nmse %g vs %g", fmts[f], e, num / den, ref);
            free(back);
            tq_release(&q);
        }
    }
}

static double exact_mean_total(const float *v, int n)
{
    uint64_t bins[QD_SUM_BINS] = {0};
    for (int i = 0; i < n; i++) {
        uint32_t b;
        uint64_t a;
        qd_sum_bin(v[i], &b, &a);
        if (b == 255)
            bins[255] |= a;
        else
            bins[b] += a;
    }
    return qd_sum_bins_total(bins);
}

/* The double-quant offset's sum is exact and rounded once: equal to a double sum where that is
 * exact, independent of order, and right where a running double sum is not. */
static void bnb_offset_sum_is_exact_and_order_free(void **state)
{
    (void)state;
    test_seed();
    enum { N = 100000 };
    static float v[N];
    double plain = 0.0;
    for (int i = 0; i < N; i++) { /* multiples of 2^-10 below 1024: every partial sum exact */
        v[i] = (float)(int)(test_uniform() * 1048576.0) / 1024.0f;
        plain += v[i];
    }
    assert_true(exact_mean_total(v, N) == plain);
    for (int i = N - 1; i > 0; i--) { /* shuffled: the same bits */
        int j = (int)(test_uniform() * (i + 1));
        float t = v[i];
        v[i] = v[j], v[j] = t;
    }
    assert_true(exact_mean_total(v, N) == plain);
    /* 2^60 + 128 + 1: a running double sum ties at +128 and rounds down to 2^60, then drops the
     * 1; the exact sum is past the midpoint and rounds up to 2^60 + 256 */
    float w[3] = {0x1p60f, 128.0f, 1.0f};
    assert_true(exact_mean_total(w, 3) == 0x1p60 + 256.0);
    float tiny[2] = {0x1p-149f, 0x1p-149f}; /* subnormals, exactly */
    assert_true(exact_mean_total(tiny, 2) == 0x1p-148);
    float big[2] = {3.0e38f, 3.0e38f}; /* beyond f32, fine in double */
    assert_true(exact_mean_total(big, 2) == 2.0 * (double)3.0e38f);
    float inf[3] = {1.0f, INFINITY, 2.0f}, nan[3] = {1.0f, INFINITY, NAN};
    assert_true(isinf(exact_mean_total(inf, 3)));
    assert_true(isnan(exact_mean_total(nan, 3)));
    float zero[2] = {0.0f, 0.0f};
    assert_true(exact_mean_total(zero, 2) == 0.0);
}

int main(void)
{
    test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nf4_zero_block_packs_code_0),
        cmocka_unit_test(nf4_odd_tail_pairs_with_code_of_zero),
        cmocka_unit_test(nf4_single_outlier_takes_the_extreme_code),
        cmocka_unit_test(approximate_reciprocal_edges),
        cmocka_unit_test(double_quant_offset_is_mean_of_absmax),
        cmocka_unit_test(bnb_offset_sum_is_exact_and_order_free),
        cmocka_unit_test(ggml_all_zero_block_has_negative_zero_scale),
        cmocka_unit_test(ggml_signed_max_first_wins_on_ties),
        cmocka_unit_test(ggml_q8_rounds_half_away_from_zero),
        cmocka_unit_test(ggml_huge_block_overflows_the_f16_scale_as_ggml),
        cmocka_unit_test(mx_floor_scale_and_element_codes),
        cmocka_unit_test(mx_fp6_packs_four_codes_in_three_bytes_low_first),
        cmocka_unit_test(swizzled_scale_offsets_follow_the_128x4_tiles),
        cmocka_unit_test(nvfp4_global_scale_given_is_used_and_reported),
        cmocka_unit_test(nvfp4_swizzle_padding_is_zero),
        cmocka_unit_test(int8_zero_tensor_gets_scale_one),
        cmocka_unit_test(uint8_range_includes_zero),
        cmocka_unit_test(tiny_and_huge_magnitudes_keep_their_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
