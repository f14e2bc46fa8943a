/* iq1_s's GPU form of a sub-block's sort and split search (kernels/cuda/iq1s_regs.cuh: ranks
 * for the sort, the prefix sums in registers, the split's chain entered by a jump) gives the
 * CPU's levels, scale and shift (kernels/iq1.h: qd_iq1s_sub_sums, qd_iq1s_split_search,
 * qd_iq1s_sub_levels), built here as C, on a machine without a GPU: N(0, 0.02) sub-blocks,
 * hard kinds (ties, signed zeros, tiny and subnormal runs, outliers up to 1e30, constants,
 * ramps, values around the zero threshold) and importance of every kind test_fill_importance
 * draws. test_gpu checks the whole kernel's bytes on a GPU. */
#include "helpers.h"

#include "../../kernels/iq1.h"

/* the CUDA header as C: its qualifiers dropped, nvcc's unroll pragmas ignored */
#define __device__
#define __forceinline__ static inline
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#include "../../kernels/cuda/iq1s_regs.cuh"
#pragma GCC diagnostic pop

#define KINDS 13

static void fill(float *x, int kind)
{
    const float scale = ldexpf(1.0f, (int)(test_rand32() % 200) - 100), c = (float)(test_uniform() * 4.0 - 2.0) * scale;
    const int outlier = (int)(test_rand32() % 32);
    for (int i = 0; i < 32; i++) {
        const float u = test_normal();
        switch (kind) {
        case 0: x[i] = 0.02f * u; break;
        case 1: x[i] = (float)((int)(test_rand32() % 7) - 3) * 0.01f; break; /* ties */
        case 2: x[i] = i == outlier ? 0.05f : test_rand32() & 1 ? -0.0f : 0.0f; break;
        case 3: x[i] = 1e-9f * u; break;
        case 4: x[i] = i == outlier ? 1000.0f * (u < 0.0f ? -1.0f : 1.0f) : 0.02f * u; break;
        case 5: x[i] = ldexpf((float)(test_rand32() % 5), -140); break; /* subnormal */
        case 6: x[i] = c; break;
        case 7: x[i] = (float)(i - 16) * scale; break;
        case 8: x[i] = u * scale; break;
        case 9: x[i] = i < 16 ? 1e-13f * u : 1e-11f * u; break; /* around the zero threshold */
        case 10: x[i] = i == outlier ? 1e18f : i == (outlier + 7) % 32 ? -3e17f : 0.02f * u; break;
        case 11: x[i] = i == outlier ? 1e30f : 0.02f * u; break; /* x^2 overflows: never coded */
        default: x[i] = 0.02f * u * (i % 2 ? 1.0f : 1e-3f); break;
        }
    }
}

/* The CPU's pieces and the GPU's form on one sub-block: the same sums, and where it is coded the
 * same levels, scale and shift. Returns whether it was coded. */
static int check(const float *x, const float *qw, float sigma2)
{
    struct qd_iq1s_sub s;
    int8_t Lc[32], Lg[32];
    float scale_c = 0.0f, scale_g = 0.0f;
    int shift_c = 0, shift_g = 0;
    const int coded_c = qd_iq1s_sub_sums(x, qw, sigma2, &s) && qd_iq1s_sub_levels(&s, qd_iq1s_split_search(&s), Lc,
                                                                                  &scale_c, &shift_c);
    float w[32];
    const float max = qd_iq1s_sub_weights(x, qw, sigma2, w);
    int coded_g = 0;
    if (max >= QD_IQ1S_ZERO) {
        uint32_t rk[8];
        float srt[64], sumx[33], sumw[33];
        iq1s_ranks(x, w, rk, srt, sumx, sumw);
        assert_memory_equal(sumx, s.sumx, sizeof sumx);
        assert_memory_equal(sumw, s.sumw, sizeof sumw);
        coded_g = iq1s_levels(rk, iq1s_split(sumx, sumw, max), Lg, &scale_g, &shift_g);
    }
    assert_int_equal(coded_g, coded_c);
    if (coded_c) {
        assert_memory_equal(Lg, Lc, sizeof Lc);
        assert_memory_equal(&scale_g, &scale_c, sizeof scale_c);
        assert_int_equal(shift_g, shift_c);
    }
    return coded_c;
}

static void normal_data(void **state)
{
    (void)state;
    test_seed();
    float x[32], qw[32];
    int coded = 0;
    for (int it = 0; it < 20000; it++) {
        fill(x, 0);
        for (int i = 0; i < 32; i++)
            qw[i] = 0.5f + fabsf(test_normal());
        coded += check(x, qw, 2.0f * 0.02f * 0.02f);
    }
    print_message("%d of 20000 sub-blocks coded\n", coded);
    assert_true(coded > 19000);
}

static void hard_sub_blocks(void **state)
{
    (void)state;
    test_seed();
    float x[32], qw[32];
    int coded[KINDS] = {0};
    for (int it = 0; it < 26000; it++) {
        const int kind = it % KINDS;
        fill(x, kind);
        test_fill_importance(qw, 32);
        float sumx2 = 0.0f;
        for (int i = 0; i < 32; i++)
            sumx2 += x[i] * x[i];
        coded[kind] += check(x, qw, 2.0f * sumx2 / 32.0f);
    }
    for (int k = 0; k < KINDS; k++)
        print_message("kind %d: %d of %d coded\n", k, coded[k], 26000 / KINDS);
    assert_true(coded[1] > 0 && coded[4] > 0 && coded[10] > 0); /* the searches ran on the hard rows */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(normal_data),
        cmocka_unit_test(hard_sub_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
