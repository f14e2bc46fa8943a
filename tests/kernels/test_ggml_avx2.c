/* The AVX2 q8_0/q8_1/q4_0 block quantizers (kernels/cpu/ggml_avx2.h) give the scalar _ref
 * bytes: on random blocks, on blocks built to hit every rounding tie, on sign ties of the
 * largest magnitude, zeros, signed zeros, huge and tiny values and non-finite elements. */
#include <stdio.h>

#include "../../kernels/cpu/cpu.h"
#include "../../kernels/cpu/ggml_avx2.h"
#include "helpers.h"

#if QD_GGML_AVX2
static uint64_t rng_state;
static long taken, declined;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float uniform(float scale) { return ((float)rnd() / 4294967296.0f - 0.5f) * 2.0f * scale; }

static void check_block(const float *x)
{
    const int types[] = {QD_Q8_0, QD_Q8_1, QD_Q4_0};
    for (int t = 0; t < 3; t++) {
        uint8_t want[36], got[36];
        memset(want, 0xa5, sizeof want);
        memset(got, 0x5a, sizeof got);
        qd_ggml_quantize_block(types[t], x, want);
        int took = types[t] == QD_Q4_0 ? qd_ggml_q4_0_avx2(x, got) : qd_ggml_q8_avx2(types[t], x, got);
        if (!took) { /* declined (non-finite, or 1/d overflows): the caller runs the scalar code */
            declined++;
            continue;
        }
        taken++;
        assert_memory_equal(got, want, (size_t)qd_ggml_block_bytes(types[t]));
    }
}

static void avx2_equals_scalar_on_random_blocks(void **state)
{
    (void)state;
    rng_state = (uint64_t)time(NULL) * 2654435761u | 1;
    float x[QD_GGML_QK];
    for (int it = 0; it < 200000; it++) {
        float scale = ldexpf(1.0f, (int)(rnd() % 60) - 30);
        for (int j = 0; j < QD_GGML_QK; j++)
            x[j] = uniform(scale);
        check_block(x);
    }
    assert_true(taken == 3 * 200000); /* random finite blocks are never declined */
}

static void avx2_equals_scalar_on_ties(void **state)
{
    (void)state;
    float x[QD_GGML_QK];
    /* amax 127 gives d = 1 and id = 1: every k + 0.5 is a tie for roundf; q4_0 sees
     * amax 8 ties the same way through its +8.5 */
    for (int r = 0; r < 2000; r++) {
        for (int j = 0; j < QD_GGML_QK; j++)
            x[j] = (float)((int)(rnd() % 254) - 127) + ((rnd() & 1) ? 0.5f : 0.0f);
        x[rnd() % QD_GGML_QK] = (rnd() & 1) ? 127.0f : -127.0f;
        check_block(x);
        for (int j = 0; j < QD_GGML_QK; j++)
            x[j] = (float)((int)(rnd() % 16) - 8) + ((rnd() & 1) ? 0.5f : 0.0f);
        x[rnd() % QD_GGML_QK] = -8.0f;
        check_block(x);
        for (int j = 0; j < QD_GGML_QK; j++) /* values just below a half */
            x[j] = nextafterf((float)((int)(rnd() % 254) - 127) + 0.5f, 0.0f);
        check_block(x);
    }
}

static void avx2_equals_scalar_on_special_blocks(void **state)
{
    (void)state;
    float x[QD_GGML_QK];
    memset(x, 0, sizeof x);
    check_block(x); /* all zero */
    for (int j = 0; j < QD_GGML_QK; j++)
        x[j] = -0.0f;
    check_block(x);
    for (int j = 0; j < QD_GGML_QK; j++) /* equal magnitudes of both signs: the first wins */
        x[j] = (j * 7 % 3) ? 2.0f : -2.0f;
    check_block(x);
    for (int j = 0; j < QD_GGML_QK; j++)
        x[j] = (j & 1) ? 3.0e38f : -1.0e38f; /* the f16 scale overflows */
    check_block(x);
    for (int j = 0; j < QD_GGML_QK; j++)
        x[j] = (j & 1) ? 1.0e-40f : -1.4e-45f; /* subnormal */
    check_block(x);
    taken = declined = 0;
    for (int j = 0; j < QD_GGML_QK; j++)
        x[j] = (j & 1) ? 1.0e-40f : -1.4e-45f; /* subnormal */
    check_block(x);
    assert_true(declined == 3);
    const float specials[] = {NAN, -NAN, INFINITY, -INFINITY};
    for (int s = 0; s < 4; s++)
        for (int pos = 0; pos < QD_GGML_QK; pos += 5) {
            for (int j = 0; j < QD_GGML_QK; j++)
                x[j] = uniform(3.0f);
            x[pos] = specials[s];
            check_block(x);
        }
}

/* Eight blocks at a time (qd_ggml_q8_avx2_x8, qd_ggml_q4_0_avx2_x8): each group of eight mixes kinds of block
 * (random at any scale, ties, zeros, signed zeros, tiny, huge, non-finite); the group gives
 * the scalar bytes of each of its blocks, or is declined exactly when one of its blocks would
 * be declined on its own. */
static void avx2_eight_blocks_equal_scalar_on_mixed_groups(void **state)
{
    (void)state;
    rng_state = (uint64_t)time(NULL) * 40503u | 1;
    enum { B = 8 * QD_GGML_QK };
    float x[B];
    long groups_taken = 0, groups_declined = 0;
    for (int it = 0; it < 40000; it++) {
        for (int b = 0; b < 8; b++) {
            float *xb = x + b * QD_GGML_QK;
            int kind = (int)(rnd() % 16);
            float scale = ldexpf(1.0f, (int)(rnd() % 250) - 125);
            for (int j = 0; j < QD_GGML_QK; j++)
                xb[j] = kind == 0   ? 0.0f
                        : kind == 1 ? -0.0f
                        : kind == 2 ? (float)((int)(rnd() % 254) - 127) + ((rnd() & 1) ? 0.5f : 0.0f)
                        : kind == 3 ? uniform(1.0e-40f)
                                    : uniform(kind == 4 ? 3.0e38f : scale);
            if (kind == 2)
                xb[rnd() % QD_GGML_QK] = 127.0f;
            if (kind == 5 && rnd() % 8 == 0)
                xb[rnd() % QD_GGML_QK] = (rnd() & 1) ? NAN : -INFINITY;
        }
        const int types[] = {QD_Q8_0, QD_Q8_1, QD_Q4_0};
        for (int ti = 0; ti < 3; ti++) {
            const int t = types[ti], bytes = qd_ggml_block_bytes(t);
            uint8_t want[8 * 36], got[8 * 36];
            int each = 1;
            for (int b = 0; b < 8; b++) {
                uint8_t tmp[36];
                each &= t == QD_Q4_0 ? qd_ggml_q4_0_avx2(x + b * QD_GGML_QK, tmp) : qd_ggml_q8_avx2(t, x + b * QD_GGML_QK, tmp);
                qd_ggml_quantize_block(t, x + b * QD_GGML_QK, want + b * bytes);
            }
            memset(got, 0x5a, sizeof got);
            int took = t == QD_Q4_0 ? qd_ggml_q4_0_avx2_x8(x, got) : qd_ggml_q8_avx2_x8(t, x, got);
            assert_int_equal(took, each);
            if (took)
                assert_memory_equal(got, want, (size_t)(8 * bytes));
            groups_taken += took;
            groups_declined += !took;
        }
    }
    assert_true(groups_taken > 1000 && groups_declined > 1000); /* both paths were exercised */
}

/* These types find NaN/Inf inside the block code instead of the driver's scan: the error
 * still names the first bad index, on either thread's span and for every dtype. */
static void nonfinite_found_by_the_block_code_names_the_first_index(void **state)
{
    (void)state;
    qd_cpu_set_threads(2);
    const int64_t rows = 512, cols = 1024, n = rows * cols;
    const char *fmts[] = {"q8_0", "q8_1", "q4_0"};
    const enum qd_dtype dts[] = {QD_F32, QD_F16, QD_BF16};
    const int64_t firsts[] = {77, 300001, n - 1};
    float *x = malloc((size_t)n * sizeof *x);
    for (int f = 0; f < 3; f++)
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < 3; k++) {
                for (int64_t i = 0; i < n; i++)
                    x[i] = test_normal();
                x[firsts[k]] = (k & 1) ? NAN : -INFINITY;
                if (firsts[k] + 40 < n)
                    x[firsts[k] + 40] = INFINITY; /* a later one, in the next block */
                struct test_q q;
                assert_int_equal(test_quantize(&q, fmts[f], x, rows, cols, dts[d], NULL), QD_ENONFINITE);
                char want[64];
                snprintf(want, sizeof want, "element %lld", (long long)firsts[k]);
                assert_non_null(strstr(q.err, want));
                tq_release(&q);
            }
    /* bad elements in both threads' stretches, the lowest in the second half: threads that
     * finish early take chunks from the other's stretch, out of order, and the least still wins */
    for (int64_t i = 0; i < n; i++)
        x[i] = test_normal();
    const int64_t bad[] = {n - 5, n / 2 + 3, n / 2 + 40000, n / 4 + 77};
    int64_t lowest = n;
    for (int k = 0; k < 4; k++) {
        x[bad[k]] = NAN;
        lowest = bad[k] < lowest ? bad[k] : lowest;
        struct test_q q;
        assert_int_equal(test_quantize(&q, "q8_0", x, rows, cols, QD_F32, NULL), QD_ENONFINITE);
        char want[64];
        snprintf(want, sizeof want, "element %lld", (long long)lowest);
        assert_non_null(strstr(q.err, want));
        tq_release(&q);
    }
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nonfinite_found_by_the_block_code_names_the_first_index),
        cmocka_unit_test(avx2_equals_scalar_on_random_blocks),
        cmocka_unit_test(avx2_equals_scalar_on_ties),
        cmocka_unit_test(avx2_equals_scalar_on_special_blocks),
        cmocka_unit_test(avx2_eight_blocks_equal_scalar_on_mixed_groups),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
static void no_avx2_build(void **state) { (void)state; skip(); }

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(no_avx2_build)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
