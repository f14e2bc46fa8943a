/* The AVX2 sub-block searches of every K-quant (kernels/cpu/kquant_avx2.h) give the scalar
 * searches' scales, minimums and codes bit for bit (kernels/kquants.h), on super-blocks
 * whose eight sub-blocks mix kinds: random at every scale, all zero, signed zeros, constant
 * (positive: the minimum clamps to 0; negative: max == min), one outlier, one-signed, ramps,
 * values on the code grid, subnormals and values near FLT_MAX. */
#include <math.h>
#include <stdio.h>

#include "../../kernels/cpu/kquant_avx2.h"
#include "helpers.h"

#if QD_KQUANT_AVX2
static uint32_t rnd(void) { return (uint32_t)(test_uniform() * 4294967296.0); }

static void fill_sub_block(float *x, int kind)
{
    float scale = ldexpf(1.0f, (int)(rnd() % 200) - 100), c = (float)(test_uniform() * 4.0 - 2.0) * scale;
    for (int i = 0; i < 32; i++) {
        float u = (float)test_normal();
        x[i] = kind == 0   ? 0.0f
               : kind == 1 ? (rnd() & 1 ? -0.0f : 0.0f)
               : kind == 2 ? c
               : kind == 3 ? (i == (int)(rnd() % 32) ? 1000.0f * scale : 0.001f * u * scale)
               : kind == 4 ? fabsf(u) * scale
               : kind == 5 ? (float)(i - 16) * scale
               : kind == 6 ? (float)((int)(rnd() % 31) - 15) * 0.25f
               : kind == 7 ? u * 1e-42f
               : kind == 8 ? u * 1e37f
                           : u * scale;
    }
}

static void searches_equal_scalar(void **state)
{
    (void)state;
    test_seed();
    float x[QD_QK_K];
    long blocks = 0;
    for (int it = 0; it < 40000; it++) {
        for (int j = 0; j < 8; j++)
            fill_sub_block(x + 32 * j, (int)(rnd() % 10));
        for (int five = 0; five < 2; five++) {
            float ws[8], wm[8], gs[8], gm[8];
            uint8_t wl[QD_QK_K], gl[QD_QK_K];
            qd_kq_search_q45(five, x, ws, wm, wl);
            qd_kq_search_q45_avx2(x, five ? 31 : 15, five ? -0.5f : -1.0f, five ? 15 : 20, gs, gm, gl);
            for (int j = 0; j < 8; j++)
                if (qd_f32_bits(ws[j]) != qd_f32_bits(gs[j]) || qd_f32_bits(wm[j]) != qd_f32_bits(gm[j]) ||
                    memcmp(wl + 32 * j, gl + 32 * j, 32)) {
                    for (int i = 0; i < 32; i++)
                        fprintf(stderr, "%a%c", x[32 * j + i], i % 8 == 7 ? '\n' : ' ');
                    fail_msg("q%d_K sub-block %d: scale %a / %a, min %a / %a (scalar / AVX2)", five ? 5 : 4, j,
                             ws[j], gs[j], wm[j], gm[j]);
                }
            blocks++;
        }
    }
    assert_int_equal(blocks, 80000);
}

/* q2_K's search (make_qkx2 on 16 values, |x| weights, absolute error), eight at a time */
static void q2_searches_equal_scalar(void **state)
{
    (void)state;
    test_seed();
    float x[128];
    for (int it = 0; it < 60000; it++) {
        for (int j = 0; j < 8; j++) {
            float sub[32];
            fill_sub_block(sub, (int)(rnd() % 10));
            memcpy(x + 16 * j, sub + (rnd() % 2) * 16, 16 * sizeof(float));
        }
        float ws[8], wm[8], gs[8], gm[8], weights[16];
        uint8_t wl[128], gl[128], aux[16];
        for (int j = 0; j < 8; j++) {
            for (int i = 0; i < 16; i++)
                weights[i] = qd_absf(x[16 * j + i]);
            ws[j] = qd_kq_make_qkx2(16, 3, x + 16 * j, weights, wl + 16 * j, &wm[j], aux, -0.5f, 0.1f, 15, 1);
        }
        qd_kq_search_q2_avx2(x, gs, gm, gl);
        for (int j = 0; j < 8; j++)
            if (qd_f32_bits(ws[j]) != qd_f32_bits(gs[j]) || qd_f32_bits(wm[j]) != qd_f32_bits(gm[j]) ||
                memcmp(wl + 16 * j, gl + 16 * j, 16)) {
                for (int i = 0; i < 16; i++)
                    fprintf(stderr, "%a%c", x[16 * j + i], i % 8 == 7 ? '\n' : ' ');
                fail_msg("q2_K sub-block %d: scale %a / %a, min %a / %a (scalar / AVX2)", j, ws[j], gs[j], wm[j], gm[j]);
            }
    }
}

/* q3_K's search (make_q3_quants: symmetric codes, then passes moving single codes) */
static void q3_searches_equal_scalar(void **state)
{
    (void)state;
    test_seed();
    float x[128];
    for (int it = 0; it < 60000; it++) {
        for (int j = 0; j < 8; j++) {
            float sub[32];
            fill_sub_block(sub, (int)(rnd() % 10));
            memcpy(x + 16 * j, sub + (rnd() % 2) * 16, 16 * sizeof(float));
        }
        float ws[8], gs[8];
        int8_t wl[128], gl[128];
        for (int j = 0; j < 8; j++)
            ws[j] = qd_kq_make_q3(16, 4, x + 16 * j, wl + 16 * j);
        qd_kq_search_q3_avx2(x, gs, gl);
        for (int j = 0; j < 8; j++)
            if (qd_f32_bits(ws[j]) != qd_f32_bits(gs[j]) || memcmp(wl + 16 * j, gl + 16 * j, 16)) {
                for (int i = 0; i < 16; i++)
                    fprintf(stderr, "%a%c", x[16 * j + i], i % 8 == 7 ? '\n' : ' ');
                fail_msg("q3_K sub-block %d: scale %a / %a (scalar / AVX2)", j, ws[j], gs[j]);
            }
    }
}

/* q6_K's symmetric search (qd_kq_make_qx), eight sub-blocks of 16 at a time */
static void q6_searches_equal_scalar(void **state)
{
    (void)state;
    test_seed();
    float x[128];
    for (int it = 0; it < 60000; it++) {
        for (int j = 0; j < 8; j++) {
            float sub[32];
            fill_sub_block(sub, (int)(rnd() % 10));
            memcpy(x + 16 * j, sub + (rnd() % 2) * 16, 16 * sizeof(float));
        }
        float ws[8], gs[8];
        int8_t wl[128], gl[128];
        for (int j = 0; j < 8; j++)
            ws[j] = qd_kq_make_qx(16, 32, x + 16 * j, wl + 16 * j, NULL);
        qd_kq_search_q6_avx2(x, gs, gl);
        for (int j = 0; j < 8; j++)
            if (qd_f32_bits(ws[j]) != qd_f32_bits(gs[j]) || memcmp(wl + 16 * j, gl + 16 * j, 16)) {
                for (int i = 0; i < 16; i++)
                    fprintf(stderr, "%a%c", x[16 * j + i], i % 8 == 7 ? '\n' : ' ');
                fail_msg("q6_K sub-block %d: scale %a / %a (scalar / AVX2)", j, ws[j], gs[j]);
            }
    }
}
#else /* a build without AVX2 has no fast path to compare: each case says it was skipped */
static void searches_equal_scalar(void **state) { (void)state; skip(); }
static void q6_searches_equal_scalar(void **state) { (void)state; skip(); }
static void q2_searches_equal_scalar(void **state) { (void)state; skip(); }
static void q3_searches_equal_scalar(void **state) { (void)state; skip(); }
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(searches_equal_scalar),
        cmocka_unit_test(q6_searches_equal_scalar),
        cmocka_unit_test(q2_searches_equal_scalar),
        cmocka_unit_test(q3_searches_equal_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
