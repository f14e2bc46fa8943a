/* The AVX2 NVFP4 block quantizer (kernels/cpu/nvfp4_avx2.h) gives the scalar code's bytes:
 * its E2M1 rounding on every float of [2^-4, 6] of either sign (every rounding boundary of the
 * grid lies there; below, everything rounds to a signed zero, checked on random values), and
 * whole blocks, single- and two-level, on random data at every scale, on blocks built to land
 * on rounding ties, zeros, signed zeros, subnormals and values near FLT_MAX; blocks with
 * NaN/Inf are declined (the scalar code takes them); the same for eight blocks at once. */
#include <stdio.h>

#include "../../kernels/cpu/nvfp4_avx2.h"
#include "helpers.h"

#if QD_NVFP4_AVX2
static uint32_t rnd(void) { return (uint32_t)(test_uniform() * 4294967296.0); }

static void e2m1_rounding_equals_scalar_on_every_float_of_the_grid(void **state)
{
    (void)state;
    long checked = 0;
    for (int neg = 0; neg < 2; neg++) {
        const uint32_t lo = 0x3d800000u /* 2^-4 */, hi = 0x40c00000u /* 6 */;
        for (uint32_t b = lo; b <= hi; b += 8) {
            uint32_t bits[8];
            for (int k = 0; k < 8; k++)
                bits[k] = (b + (uint32_t)k > hi ? hi : b + (uint32_t)k) | (neg ? 0x80000000u : 0);
            __m256i c = e2m1_codes(_mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)bits)));
            uint32_t got[8];
            _mm256_storeu_si256((__m256i *)got, c);
            for (int k = 0; k < 8; k++) {
                uint8_t want = qd_f32_to_floatx(qd_bits_f32(bits[k]), 2, 1);
                if (got[k] != want)
                    fail_msg("0x%08x: AVX2 code %u, scalar %u", bits[k], got[k], want);
            }
            checked += 8;
        }
    }
    for (int i = 0; i < 1000000; i++) { /* below 2^-4, signed zeros and the subnormal step */
        uint32_t bits[8];
        for (int k = 0; k < 8; k++)
            bits[k] = (rnd() % 0x3d800000u) | (rnd() & 0x80000000u);
        __m256i c = e2m1_codes(_mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)bits)));
        uint32_t got[8];
        _mm256_storeu_si256((__m256i *)got, c);
        for (int k = 0; k < 8; k++)
            assert_int_equal(got[k], qd_f32_to_floatx(qd_bits_f32(bits[k]), 2, 1));
    }
    assert_int_equal(checked, 2 * ((0x40c00000 - 0x3d800000) / 8 + 1) * 8);
}

static long taken, declined;

static void check_block(float pts, const float *x)
{
    uint8_t want[8], got[8], ws, gs = 0;
    memset(want, 0xa5, sizeof want);
    memset(got, 0x5a, sizeof got);
    ws = qd_nvfp4_quantize_block(pts, x, want);
    if (!qd_nvfp4_avx2(pts, x, got, &gs)) {
        declined++;
        return;
    }
    taken++;
    if (gs != ws || memcmp(got, want, 8)) {
        for (int j = 0; j < 16; j++)
            fprintf(stderr, "x[%d] = %a\n", j, x[j]);
        fail_msg("pts %a: scale 0x%02x vs 0x%02x, codes %02x%02x%02x%02x%02x%02x%02x%02x vs "
                 "%02x%02x%02x%02x%02x%02x%02x%02x", pts, gs, ws, got[0], got[1], got[2], got[3], got[4],
                 got[5], got[6], got[7], want[0], want[1], want[2], want[3], want[4], want[5], want[6], want[7]);
    }
}

/* None, an ordinary per-tensor scale, or an extreme one: a subnormal pts (a global_scale near
 * FLT_MAX) makes 1 / pts / scale overflow, so zeros times it are NaN; a huge pts flushes the
 * block scales to the smallest E4M3. */
static float any_pts(void)
{
    switch (rnd() % 8) {
    case 0: case 1: case 2: case 3: return 0.0f;
    case 4: return 1.0f / 3e38f;
    case 5: return ldexpf(1.0f + (float)(rnd() % 1000) / 1000.0f, -127 - (int)(rnd() % 22));
    case 6: return ldexpf(1.0f + (float)(rnd() % 1000) / 1000.0f, 100 + (int)(rnd() % 27));
    default: return ldexpf(1.0f + (float)(rnd() % 1000) / 1000.0f, (int)(rnd() % 60) - 40);
    }
}

static void blocks_equal_scalar(void **state)
{
    (void)state;
    test_seed();
    float x[16];
    static const float grid[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
    for (int it = 0; it < 400000; it++) {
        int kind = (int)(rnd() % 8);
        float scale = ldexpf(1.0f, (int)(rnd() % 280) - 150);
        float pts = any_pts();
        for (int j = 0; j < 16; j++) {
            float u = (float)test_uniform() * 2.0f - 1.0f;
            x[j] = kind == 0   ? 0.0f
                   : kind == 1 ? -0.0f
                   : kind == 2 ? (rnd() & 1 ? -1.0f : 1.0f) * grid[rnd() % 15] /* ties once scaled by 1 */
                   : kind == 3 ? u * 1e-40f                                     /* subnormal */
                   : kind == 4 ? u * 3.0e38f                                    /* near FLT_MAX */
                               : u * scale;
        }
        if (kind == 2)
            x[rnd() % 16] = 6.0f; /* amax 6: block scale 1 exactly */
        check_block(pts, x);
        if (it % 16 == 0) { /* a NaN or Inf anywhere is declined */
            x[rnd() % 16] = (rnd() & 1) ? NAN : -INFINITY;
            long before = declined;
            check_block(pts, x);
            assert_int_equal(declined, before + 1);
        }
    }
    assert_true(taken > 390000);
}
/* Eight blocks at once: each group mixes kinds of block; it gives each block's scalar bytes,
 * or is declined exactly when one of its blocks holds NaN/Inf. */
static void eight_blocks_equal_scalar(void **state)
{
    (void)state;
    test_seed();
    float x[128];
    static const float grid[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
    long groups_taken = 0, groups_declined = 0;
    for (int it = 0; it < 60000; it++) {
        float pts = any_pts();
        int bad = 0;
        for (int b = 0; b < 8; b++) {
            int kind = (int)(rnd() % 8);
            float scale = ldexpf(1.0f, (int)(rnd() % 280) - 150);
            for (int j = 0; j < 16; j++) {
                float u = (float)test_uniform() * 2.0f - 1.0f;
                x[16 * b + j] = kind == 0   ? 0.0f
                                : kind == 1 ? -0.0f
                                : kind == 2 ? (rnd() & 1 ? -1.0f : 1.0f) * grid[rnd() % 15]
                                : kind == 3 ? u * 1e-40f
                                : kind == 4 ? u * 3.0e38f
                                            : u * scale;
            }
            if (kind == 5 && rnd() % 16 == 0)
                x[16 * b + rnd() % 16] = (rnd() & 1) ? NAN : -INFINITY, bad = 1;
        }
        for (int j = 0; j < 128; j++) /* scales up to 2^129 overflow too */
            bad |= !isfinite(x[j]);
        uint8_t want[64], got[64], ws[8], gs[8];
        for (int b = 0; b < 8; b++)
            ws[b] = qd_nvfp4_quantize_block(pts, x + 16 * b, want + 8 * b);
        memset(got, 0x5a, sizeof got);
        int took = qd_nvfp4_avx2_x8(pts, pts > 0.0f ? 1.0f / pts : 1.0f, x, got, gs);
        if (took != !bad) {
            for (int j = 0; j < 128; j++)
                fprintf(stderr, "%a%c", x[j], j % 16 == 15 ? '\n' : ' ');
            fail_msg("group declined: %d, has NaN/Inf: %d", !took, bad);
        }
        if (took) {
            assert_memory_equal(gs, ws, 8);
            assert_memory_equal(got, want, 64);
        }
        groups_taken += took;
        groups_declined += !took;
    }
    assert_true(groups_taken > 1000 && groups_declined > 1000);
}
#else
static void eight_blocks_equal_scalar(void **state) { skip(); }
static void e2m1_rounding_equals_scalar_on_every_float_of_the_grid(void **state) { skip(); }
/* None, an ordinary per-tensor scale, or an extreme one: a subnormal pts (a global_scale near
 * FLT_MAX) makes 1 / pts / scale overflow, so zeros times it are NaN; a huge pts flushes the
 * block scales to the smallest E4M3. */
static float any_pts(void)
{
    switch (rnd() % 8) {
    case 0: case 1: case 2: case 3: return 0.0f;
    case 4: return 1.0f / 3e38f;
    case 5: return ldexpf(1.0f + (float)(rnd() % 1000) / 1000.0f, -127 - (int)(rnd() % 22));
    case 6: return ldexpf(1.0f + (float)(rnd() % 1000) / 1000.0f, 100 + (int)(rnd() % 27));
    default: return ldexpf(1.0f + (float)(rnd() % 1000) / 1000.0f, (int)(rnd() % 60) - 40);
    }
}

static void blocks_equal_scalar(void **state) { skip(); }
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(e2m1_rounding_equals_scalar_on_every_float_of_the_grid),
        cmocka_unit_test(blocks_equal_scalar),
        cmocka_unit_test(eight_blocks_equal_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
