/* The importance-weighted K-quant searches in AVX2 lanes (kernels/cpu/kquant_imx_avx2.h) give
 * the scalar searches' sub-block scales, minimums, weight sums and codes bit for bit, and the
 * scalar path's block bytes (kernels/imatrix.h qd_imx_quantize_kquant), for every K-quant: on
 * N(0, 0.02) super-blocks and on hard ones (all zero, tiny, one huge outlier, subnormals,
 * negative only, constant, ramps, values whose quotient by the scale lands on .5, near
 * FLT_MAX), whole or mixed per 16-value run, with importance vectors that are random, zero,
 * tiny, huge, subnormal, -0 or mixed per run; make_qp_quants with its trials in lanes on its
 * own, on inputs no fit gives. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "../../kernels/cpu/kquant_imx_avx2.h"
#include "helpers.h"

#if QD_KQUANT_IMX_AVX2

enum { X_KINDS = 13, QW_KINDS = 9 };

/* n values of kind `kind` at x. */
static void fill_values(float *x, int n, int kind)
{
    const float scale = ldexpf(1.0f, (int)(test_rand32() % 40) - 20), c = (float)(test_uniform() * 4.0 - 2.0) * scale;
    const int outlier = (int)(test_rand32() % (unsigned)n);
    /* codes on a half grid: with |max| = nmax * s every first-try quotient is k + 0.5 */
    static const int half_max[] = {3, 4, 15, 31, 32};
    const int hm = half_max[test_rand32() % 5];
    const float hs = ldexpf(1.0f, (int)(test_rand32() % 20) - 10), hsign = test_rand32() & 1 ? -1.0f : 1.0f;
    for (int i = 0; i < n; i++) {
        const float u = test_normal();
        switch (kind) {
        case 0: x[i] = 0.02f * u; break;
        case 1: x[i] = 0.0f; break;
        case 2: x[i] = 1e-6f * u; break;
        case 3: x[i] = i == outlier ? (test_rand32() & 1 ? -1e4f : 1e4f) : 0.02f * u; break;
        case 4: x[i] = u * 1e-41f; break;
        case 5: x[i] = -fabsf(0.02f * u) - 1e-9f; break;
        case 6: x[i] = c; break;
        case 7: x[i] = (float)(i - n / 2) * scale; break;
        case 8:
            x[i] = i == 0 ? hsign * (float)hm * hs
                          : ((float)((int)(test_rand32() % (unsigned)hm) - (hsign > 0 ? 0 : hm / 2)) + 0.5f) * hs;
            break;
        case 9: x[i] = (float)((int)(test_rand32() % 31) - 15) * 0.25f; break;
        case 10: x[i] = u * 1e37f; break;
        case 11: x[i] = test_rand32() & 1 ? -0.0f : 0.0f; break;
        default: x[i] = fabsf(u) * scale; break;
        }
    }
}

/* n importance values of kind `kind` at qw (never below 0: /quantize refuses those). */
static void fill_importance(float *qw, int n, int kind)
{
    for (int i = 0; i < n; i++) {
        const float u = (float)test_uniform();
        switch (kind) {
        case 0: qw[i] = u * 10.0f; break;
        case 1: qw[i] = 0.0f; break;
        case 2: qw[i] = u * 1e-30f; break;
        case 3: qw[i] = u * 1e30f; break;
        case 4: qw[i] = u < 0.3f ? 0.0f : u; break;
        case 5: qw[i] = u * 1e-40f; break;
        case 6: qw[i] = u < 0.1f ? 1e20f * u : u < 0.2f ? 1e-20f * u : u; break;
        case 7: qw[i] = -0.0f; break; /* not negative: accepted, and its weights sum to +0 */
        default: qw[i] = 1.0f; break;
        }
    }
}

/* A super-block and its importance: one kind for the whole block, or one per 16-value run. */
static void fill_block(float *x, float *qw)
{
    if (test_rand32() % 3 == 0) {
        fill_values(x, QD_QK_K, (int)(test_rand32() % X_KINDS));
    } else {
        for (int r = 0; r < QD_QK_K / 16; r++)
            fill_values(x + 16 * r, 16, (int)(test_rand32() % X_KINDS));
    }
    if (test_rand32() % 2 == 0) {
        fill_importance(qw, QD_QK_K, (int)(test_rand32() % QW_KINDS));
    } else {
        for (int r = 0; r < QD_QK_K / 16; r++)
            fill_importance(qw + 16 * r, 16, (int)(test_rand32() % QW_KINDS));
    }
}

static int same_f32(const float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++)
        if (qd_f32_bits(a[i]) != qd_f32_bits(b[i]))
            return 0;
    return 1;
}

static const char *const type_names[] = {"q2_K", "q3_K", "q4_K", "q5_K", "q6_K"};

/* The scalar sub-block fits of imatrix.h against the lanes, one type. */
static int searches_equal(int type, const float *x, const float *qw)
{
    float ss[16], sm[16] = {0}, sw[16] = {0}, gs[16], gm[16] = {0}, gw[16] = {0}, weight[32];
    uint8_t sl[QD_QK_K], gl[QD_QK_K], aux[32];
    if (type == QD_Q4_K || type == QD_Q5_K) {
        const int five = type == QD_Q5_K;
        const float sigma2 = qd_imx_block_sigma2(x, 2.0f);
        for (int j = 0; j < 8; j++) {
            sw[j] = qd_imx_weights(x + 32 * j, qw + 32 * j, sigma2, 32, weight);
            ss[j] = qd_kq_make_qkx2(32, five ? 31 : 15, x + 32 * j, weight, sl + 32 * j, &sm[j], aux, -0.9f, 0.05f,
                                    36, 0);
        }
        qd_imx_search_q45_avx2(five, x, qw, sigma2, gs, gm, gw, gl);
        return same_f32(ss, gs, 8) && same_f32(sm, gm, 8) && same_f32(sw, gw, 8) && !memcmp(sl, gl, QD_QK_K);
    }
    const float sigma2 = qd_imx_block_sigma2(x, type == QD_Q2_K ? 1.0f : 2.0f);
    for (int j = 0; j < 16; j++) {
        if (type != QD_Q6_K)
            sw[j] = qd_imx_weights(x + 16 * j, qw + 16 * j, sigma2, 16, weight);
        if (type == QD_Q2_K)
            ss[j] = qd_kq_make_qkx2(16, 3, x + 16 * j, weight, sl + 16 * j, &sm[j], aux, -0.9f, 0.05f, 36, 0);
        else
            ss[j] = qd_kq_make_qx(16, type == QD_Q3_K ? 4 : 32, x + 16 * j, (int8_t *)sl + 16 * j,
                                  type == QD_Q3_K ? weight : qw + 16 * j);
    }
    for (int h = 0; h < 2; h++) {
        const float *xh = x + 128 * h, *qh = qw + 128 * h;
        if (type == QD_Q2_K)
            qd_imx_search_q2_avx2(xh, qh, sigma2, gs + 8 * h, gm + 8 * h, gw + 8 * h, gl + 128 * h);
        else if (type == QD_Q3_K)
            qd_imx_search_q3_avx2(xh, qh, sigma2, gs + 8 * h, gw + 8 * h, (int8_t *)gl + 128 * h);
        else
            qd_imx_search_q6_avx2(xh, qh, gs + 8 * h, (int8_t *)gl + 128 * h);
    }
    return same_f32(ss, gs, 16) && same_f32(sm, gm, 16) && same_f32(sw, gw, 16) && !memcmp(sl, gl, QD_QK_K);
}

/* Super-blocks in runs of eight, as the CPU backend runs them: their sigma2 from the lanes
 * (each against qd_imx_block_sigma2), then each block's fits and bytes. */
static void check_blocks(int type, int iterations)
{
    test_seed();
    static float x[8 * QD_QK_K], qw[8 * QD_QK_K];
    uint8_t want[256], got[256];
    const int bytes = qd_kquant_block_bytes(type);
    const float twice = qd_imx_sigma2_twice(type);
    for (int it = 0; it < iterations; it += 8) {
        float sigma2[8] = {0};
        for (int k = 0; k < 8; k++)
            fill_block(x + k * QD_QK_K, qw + k * QD_QK_K);
        if (twice != 0.0f)
            qd_imx_block_sigma2_8(x, twice, sigma2);
        for (int k = 0; k < 8; k++) {
            const float *xb = x + k * QD_QK_K, *qb = qw + k * QD_QK_K;
            if (twice != 0.0f && qd_f32_bits(sigma2[k]) != qd_f32_bits(qd_imx_block_sigma2(xb, twice))) {
                test_dump("x", xb, QD_QK_K);
                fail_msg("%s block %d: sigma2 %a / %a (scalar / lanes)", type_names[type], it + k,
                         qd_imx_block_sigma2(xb, twice), sigma2[k]);
            }
            memset(want, 0xAA, sizeof want);
            memset(got, 0x55, sizeof got);
            qd_imx_quantize_kquant(type, xb, qb, want);
            qd_imx_quantize_kquant_avx2(type, xb, qb, sigma2[k], got);
            const int searches = searches_equal(type, xb, qb);
            if (!searches || memcmp(want, got, (size_t)bytes)) {
                test_dump("x", xb, QD_QK_K);
                test_dump("importance", qb, QD_QK_K);
                fail_msg("%s block %d: %s differ (scalar / AVX2)", type_names[type], it + k,
                         searches ? "block bytes" : "sub-block fits");
            }
        }
    }
}

static void q4_K_imx_equals_scalar(void **state) { (void)state; check_blocks(QD_Q4_K, 20000); }
static void q5_K_imx_equals_scalar(void **state) { (void)state; check_blocks(QD_Q5_K, 20000); }
static void q6_K_imx_equals_scalar(void **state) { (void)state; check_blocks(QD_Q6_K, 20000); }
static void q3_K_imx_equals_scalar(void **state) { (void)state; check_blocks(QD_Q3_K, 20000); }
static void q2_K_imx_equals_scalar(void **state) { (void)state; check_blocks(QD_Q2_K, 20000); }

/* The planted rows of tests/peers/test_imatrix.py's kind, whole blocks, every importance kind. */
static void hard_blocks_every_importance_kind(void **state)
{
    (void)state;
    test_seed();
    float x[QD_QK_K], qw[QD_QK_K];
    uint8_t want[256], got[256];
    for (int xk = 0; xk < X_KINDS; xk++)
        for (int qk = 0; qk < QW_KINDS; qk++)
            for (int rep = 0; rep < 8; rep++) {
                fill_values(x, QD_QK_K, xk);
                fill_importance(qw, QD_QK_K, qk);
                if (rep == 7) /* one sub-block of 32 with no importance at all */
                    memset(qw + 32 * (int)(test_rand32() % 8), 0, 32 * sizeof(float));
                for (int type = QD_Q2_K; type <= QD_Q6_K; type++) {
                    qd_imx_quantize_kquant(type, x, qw, want);
                    qd_imx_quantize_kquant_avx2(type, x, qw, qd_imx_block_sigma2(x, qd_imx_sigma2_twice(type)),
                                                got);
                    if (!searches_equal(type, x, qw) || memcmp(want, got, (size_t)qd_kquant_block_bytes(type)))
                        fail_msg("%s: values kind %d, importance kind %d differ (scalar / AVX2)", type_names[type],
                                 xk, qk);
                }
            }
}
/* make_qp_quants with its trials in lanes against the scalar one, on 8 and 16 values: fit
 * outputs and what no fit gives (negative values, whose codes wrap as ggml's uint8_t; repeated
 * values, so that trials tie; zeros, tiny, huge), weights of every importance kind. */
static void make_qp_lanes_equal_scalar(void **state)
{
    (void)state;
    test_seed();
    float v[16], w[16];
    for (int it = 0; it < 200000; it++) {
        const int n = test_rand32() & 1 ? 16 : 8, nmax = n == 8 ? 63 : 15;
        const float scale = ldexpf(1.0f, (int)(test_rand32() % 60) - 40);
        const int kind = (int)(test_rand32() % 6);
        for (int i = 0; i < n; i++) {
            const float u = (float)test_uniform();
            v[i] = kind == 0   ? u * scale
                   : kind == 1 ? (float)(test_rand32() % 4) * scale /* repeated values: tied trials */
                   : kind == 2 ? (u - 0.25f) * scale
                   : kind == 3 ? (test_rand32() % 3 ? 0.0f : u * scale)
                   : kind == 4 ? u * 1e-16f
                               : u * 1e30f;
        }
        fill_importance(w, n, (int)(test_rand32() % QW_KINDS));
        uint8_t want[16], got[16];
        memset(want, 0xAA, sizeof want);
        memset(got, 0x55, sizeof got);
        const float d_want = qd_imx_make_qp(n, nmax, v, want, w), d_got = kq_make_qp_8(n, nmax, v, got, w);
        if (qd_f32_bits(d_want) != qd_f32_bits(d_got) || memcmp(want, got, (size_t)n)) {
            test_dump("values", v, n);
            test_dump("weights", w, n);
            fail_msg("make_qp_quants(%d, %d): scale %a / %a (scalar / lanes)", n, nmax, d_want, d_got);
        }
    }
}
#else /* a build without AVX2 has no fast path to compare: each case says it was skipped */
static void q4_K_imx_equals_scalar(void **state) { (void)state; skip(); }
static void q5_K_imx_equals_scalar(void **state) { (void)state; skip(); }
static void q6_K_imx_equals_scalar(void **state) { (void)state; skip(); }
static void q3_K_imx_equals_scalar(void **state) { (void)state; skip(); }
static void q2_K_imx_equals_scalar(void **state) { (void)state; skip(); }
static void hard_blocks_every_importance_kind(void **state) { (void)state; skip(); }
static void make_qp_lanes_equal_scalar(void **state) { (void)state; skip(); }
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hard_blocks_every_importance_kind),
        cmocka_unit_test(make_qp_lanes_equal_scalar),
        cmocka_unit_test(q4_K_imx_equals_scalar),
        cmocka_unit_test(q5_K_imx_equals_scalar),
        cmocka_unit_test(q6_K_imx_equals_scalar),
        cmocka_unit_test(q3_K_imx_equals_scalar),
        cmocka_unit_test(q2_K_imx_equals_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
