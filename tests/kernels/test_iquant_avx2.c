/* The AVX2 iq4 searches (kernels/cpu/iquant_avx2.h) write the scalar code's bytes
 * (kernels/iquants.h qd_iq4_quantize) for iq4_nl and iq4_xs, with and without an importance:
 * on N(0, 0.02) data and on blocks that mix hard kinds (all zero, signed zeros, tiny, one huge
 * outlier, subnormals, negative only, constant, ramps, values on the grid and on its midpoints
 * at the search's own scale, random scales from 2^-100 to 2^100, values near FLT_MAX, NaN and
 * Inf), importance vectors with zeros, tiny, huge and subnormal entries; and through
 * qd_quantize, where iq4_nl's groups of eight blocks cross rows and threads. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "../../kernels/cpu/iquant_avx2.h"
#include "helpers.h"

#if QD_IQUANT_AVX2

/* The grid's midpoints and values, which x / scale meets exactly when scale is a power of two. */
static const float grid_points[] = {-127.0f, -115.5f, -104.0f, -93.5f, -83.0f, -74.0f, -65.0f, -57.0f, -49.0f,
                                    -42.0f,  -35.0f,  -28.5f,  -22.0f, -16.0f, -10.0f, -4.5f,  1.0f,   7.0f,
                                    13.0f,   19.0f,   25.0f,   31.5f,  38.0f,  45.5f,  53.0f,  61.0f,  69.0f,
                                    79.0f,   89.0f,   101.0f,  113.0f};
#define GRID_POINTS (int)(sizeof grid_points / sizeof grid_points[0])

enum { KIND_NORMAL, KIND_HARD_FIRST }; /* kinds 1.. are the hard ones */
#define KINDS 15

static void fill_block(float *x, int kind)
{
    const float scale = ldexpf(1.0f, (int)(test_rand32() % 200) - 100), c = (float)(test_uniform() * 4.0 - 2.0) * scale;
    const float sign = test_rand32() & 1 ? -1.0f : 1.0f, unit = ldexpf(1.0f, (int)(test_rand32() % 40) - 30);
    const int outlier = (int)(test_rand32() % 32);
    for (int i = 0; i < 32; i++) {
        const float u = test_normal();
        switch (kind) {
        case 0: x[i] = 0.02f * u; break;
        case 1: x[i] = 0.0f; break;
        case 2: x[i] = test_rand32() & 1 ? -0.0f : 0.0f; break;
        case 3: x[i] = 1e-6f * u; break;
        case 4: x[i] = i == outlier ? sign * 1000.0f : 0.02f * u; break;
        case 5: x[i] = u * 1e-42f; break;
        case 6: x[i] = -0.02f * fabsf(u); break;
        case 7: x[i] = c; break;
        case 8: x[i] = (float)(i - 16) * scale; break;
        case 9: /* the first value sets max = ±127 unit: the first pass sees the points exactly */
            x[i] = i == 0 ? sign * 127.0f * unit : sign * unit * grid_points[test_rand32() % GRID_POINTS];
            if (i && test_rand32() % 3 == 0) /* or one ulp beside them */
                x[i] = nextafterf(x[i], test_rand32() & 1 ? INFINITY : -INFINITY);
            break;
        case 10: x[i] = u * scale; break;
        case 11: x[i] = u * 1e37f; break;
        case 12: x[i] = i == outlier ? sign * FLT_MAX : u; break;
        case 13: x[i] = i == outlier ? (test_rand32() & 1 ? NAN : sign * INFINITY) : u * scale; break;
        default: x[i] = i < 16 ? 1e-15f * u : u; break; /* around QD_KQ_EPS */
        }
    }
}

/* 8 blocks of 32: each block normal data with probability 1/2, else a hard kind. */
static void fill_blocks(float *x, int normal_only)
{
    for (int j = 0; j < 8; j++)
        fill_block(x + 32 * j, normal_only || test_rand32() % 2 ? KIND_NORMAL : 1 + (int)(test_rand32() % (KINDS - 1)));
}

static void iq4_xs_equals_scalar(int with_importance, int normal_only, int iters)
{
    float x[QD_QK_K], qw[QD_QK_K];
    for (int it = 0; it < iters; it++) {
        fill_blocks(x, normal_only);
        if (with_importance)
            test_fill_importance(qw, QD_QK_K);
        const float *w = with_importance ? qw : NULL;
        uint8_t want[136], got[136];
        qd_iq4_quantize(1, x, w, want);
        qd_iq4_xs_quantize_avx2(x, w, got);
        if (memcmp(want, got, sizeof want)) {
            test_dump("x", x, QD_QK_K);
            if (w)
                test_dump("importance", w, QD_QK_K);
            for (int i = 0; i < 136; i++)
                if (want[i] != got[i])
                    fail_msg("iq4_xs%s byte %d: %02x / %02x (scalar / AVX2)", w ? " + importance" : "", i, want[i],
                             got[i]);
        }
    }
}

static void iq4_nl_equals_scalar(int with_importance, int normal_only, int iters)
{
    float x[256], qwb[8][32];
    const float *qw[8];
    for (int it = 0; it < iters; it++) {
        fill_blocks(x, normal_only);
        for (int j = 0; j < 8; j++) { /* each block's importance apart from the others' */
            test_fill_importance(qwb[j], 32);
            qw[j] = qwb[7 - j];
        }
        uint8_t want[8 * 18], got[8 * 18];
        for (int j = 0; j < 8; j++)
            qd_iq4_quantize(0, x + 32 * j, with_importance ? qw[j] : NULL, want + 18 * j);
        qd_iq4_nl_quantize8_avx2(x, with_importance ? qw : NULL, got);
        for (int j = 0; j < 8; j++)
            if (memcmp(want + 18 * j, got + 18 * j, 18)) {
                test_dump("x", x + 32 * j, 32);
                if (with_importance)
                    test_dump("importance", qw[j], 32);
                for (int i = 0; i < 18; i++)
                    if (want[18 * j + i] != got[18 * j + i])
                        fail_msg("iq4_nl%s block %d byte %d: %02x / %02x (scalar / AVX2)",
                                 with_importance ? " + importance" : "", j, i, want[18 * j + i], got[18 * j + i]);
            }
    }
}

static void iq4_xs_normal_data(void **state) { (void)state; test_seed(); iq4_xs_equals_scalar(0, 1, 4000); }
static void iq4_xs_normal_data_importance(void **state) { (void)state; test_seed(); iq4_xs_equals_scalar(1, 1, 4000); }
static void iq4_xs_hard_blocks(void **state) { (void)state; test_seed(); iq4_xs_equals_scalar(0, 0, 20000); }
static void iq4_xs_hard_blocks_importance(void **state) { (void)state; test_seed(); iq4_xs_equals_scalar(1, 0, 20000); }
static void iq4_nl_normal_data(void **state) { (void)state; test_seed(); iq4_nl_equals_scalar(0, 1, 4000); }
static void iq4_nl_normal_data_importance(void **state) { (void)state; test_seed(); iq4_nl_equals_scalar(1, 1, 4000); }
static void iq4_nl_hard_blocks(void **state) { (void)state; test_seed(); iq4_nl_equals_scalar(0, 0, 20000); }
static void iq4_nl_hard_blocks_importance(void **state) { (void)state; test_seed(); iq4_nl_equals_scalar(1, 0, 20000); }

/* Every hard kind in all eight lanes at once (a whole super-block of one kind), each importance
 * kind: the lanes that the mixed cases leave normal get every kind too. */
static void iq4_uniform_hard_super_blocks(void **state)
{
    (void)state;
    test_seed();
    float x[QD_QK_K], qwb[8][32];
    for (int it = 0; it < 3000; it++) {
        const int kind = it % KINDS;
        for (int j = 0; j < 8; j++)
            fill_block(x + 32 * j, kind);
        for (int j = 0; j < 8; j++)
            test_fill_importance(qwb[j], 32);
        const float *qw[8];
        for (int j = 0; j < 8; j++)
            qw[j] = qwb[j];
        for (int imp = 0; imp < 2; imp++) {
            uint8_t want[8 * 18], got[8 * 18];
            qd_iq4_quantize(1, x, imp ? &qwb[0][0] : NULL, want);
            qd_iq4_xs_quantize_avx2(x, imp ? &qwb[0][0] : NULL, got);
            if (memcmp(want, got, 136))
                fail_msg("iq4_xs kind %d%s differs", kind, imp ? " + importance" : "");
            for (int j = 0; j < 8; j++)
                qd_iq4_quantize(0, x + 32 * j, imp ? qw[j] : NULL, want + 18 * j);
            qd_iq4_nl_quantize8_avx2(x, imp ? qw : NULL, got);
            if (memcmp(want, got, sizeof want))
                fail_msg("iq4_nl kind %d%s differs", kind, imp ? " + importance" : "");
        }
    }
}

static void nearest_check(const struct iq4_grid8 *g, const float *v)
{
    __m256 q;
    int32_t index[8];
    float value[8];
    _mm256_storeu_si256((__m256i *)index, iq4_nearest8(g, _mm256_loadu_ps(v), &q));
    _mm256_storeu_ps(value, q);
    for (int l = 0; l < 8; l++) {
        const int want = qd_iq4_best_index(v[l]);
        if (index[l] != want || qd_f32_bits(value[l]) != qd_f32_bits((float)qd_iq4_value(want)))
            fail_msg("%a: index %d value %g / index %d value %g (scalar / AVX2)", v[l], want,
                     (double)qd_iq4_value(want), index[l], (double)value[l]);
    }
}

/* The grid lookup itself: random bit patterns (every magnitude, NaNs), uniform values over the
 * grid, the grid values and midpoints and every f32 within 2^16 ulps of them, ±0, ±Inf, NaN
 * (all 2^32 patterns were checked once by hand; that takes minutes). */
static void iq4_nearest_equals_best_index(void **state)
{
    (void)state;
    test_seed();
    const struct iq4_grid8 g = iq4_grid8_load();
    float v[8];
    for (int it = 0; it < 2000000; it++) {
        for (int l = 0; l < 8; l++) {
            const int kind = (int)(test_rand32() % 4);
            const float m = grid_points[test_rand32() % GRID_POINTS];
            v[l] = kind == 0   ? qd_bits_f32(test_rand32())
                   : kind == 1 ? (float)(test_uniform() * 300.0 - 150.0)
                   : kind == 2 ? m
                               : nextafterf(m, test_rand32() & 1 ? INFINITY : -INFINITY);
        }
        if (it == 0) {
            const float special[8] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 113.0f, -127.0f};
            memcpy(v, special, sizeof v);
        }
        nearest_check(&g, v);
    }
    /* every f32 within 2^16 ulps of each grid value and midpoint, both sides */
    for (int p = 0; p < GRID_POINTS; p++)
        for (int32_t k = -65536; k < 65536; k += 8) {
            for (int l = 0; l < 8; l++)
                v[l] = qd_bits_f32((uint32_t)((int32_t)qd_f32_bits(grid_points[p]) + k + l));
            nearest_check(&g, v);
        }
}

/* Through qd_quantize on the CPU backend: rows of 96 values (three iq4_nl blocks, so a group of
 * eight crosses rows, and the threads' spans cut groups), an importance per row run; the bytes
 * are the scalar function's, block by block. */
static void quantize_rows_equal_scalar_blocks(void **state)
{
    (void)state;
    test_seed();
    for (int t = 0; t < 2; t++) {
        const char *fmt = t ? "iq4_xs" : "iq4_nl";
        const int64_t rows = 2 * 3 * 37, cols = t ? 512 : 96, n = rows * cols, block = t ? 256 : 32;
        const int bytes = t ? 136 : 18;
        float *x = malloc((size_t)n * sizeof(float)), *imp = malloc((size_t)cols * 2 * sizeof(float));
        for (int64_t b = 0; b < n / 32; b++)
            fill_block(x + 32 * b, test_rand32() % 2 ? KIND_NORMAL : 1 + (int)(test_rand32() % 12)); /* finite kinds */
        test_fill_importance(imp, (int)cols * 2);
        for (int with = 0; with < 2; with++) {
            const struct qd_format *f = qd_format_find(fmt);
            struct qd_params p;
            qd_params_default(f, &p);
            if (with) { /* two vectors: each for half of the rows */
                p.importance = imp;
                p.importance_n = cols * 2;
            }
            struct qd_tensor in = {0};
            const int64_t shape[2] = {rows, cols};
            assert_int_equal(qd_tensor_set_shape(&in, 2, shape), QD_OK);
            in.dtype = QD_F32;
            in.data = x;
            struct qd_component c[QD_MAX_COMPONENTS];
            char err[256];
            assert_int_equal(qd_format_layout(f, &p, &in, c, err, sizeof err), 1);
            uint8_t *got = malloc((size_t)c[0].bytes), *want = malloc((size_t)c[0].bytes);
            void *out[1] = {got};
            assert_int_equal(qd_quantize(QD_BACKEND_CPU, f, &in, &p, out, err, sizeof err), QD_OK);
            for (int64_t b = 0; b < n / block; b++) {
                const int64_t e = b * block, row = e / cols;
                const float *qw = with ? imp + (row < rows / 2 ? 0 : cols) + e % cols : NULL;
                qd_iquant_quantize_block(t ? QD_IQ4_XS : QD_IQ4_NL, x + e, qw, want + b * bytes);
            }
            for (int64_t b = 0; b < n / block; b++)
                if (memcmp(want + b * bytes, got + b * bytes, (size_t)bytes))
                    fail_msg("%s%s block %lld differs from the scalar block", fmt, with ? " + importance" : "",
                             (long long)b);
            free(got);
            free(want);
        }
        free(x);
        free(imp);
    }
}
#else /* a build without AVX2 has no fast path to compare: each case says it was skipped */
#define SKIPPED(name) static void name(void **state) { (void)state; skip(); }
SKIPPED(iq4_xs_normal_data)
SKIPPED(iq4_xs_normal_data_importance)
SKIPPED(iq4_xs_hard_blocks)
SKIPPED(iq4_xs_hard_blocks_importance)
SKIPPED(iq4_nl_normal_data)
SKIPPED(iq4_nl_normal_data_importance)
SKIPPED(iq4_nl_hard_blocks)
SKIPPED(iq4_nl_hard_blocks_importance)
SKIPPED(iq4_uniform_hard_super_blocks)
SKIPPED(iq4_nearest_equals_best_index)
SKIPPED(quantize_rows_equal_scalar_blocks)
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(iq4_nearest_equals_best_index),
        cmocka_unit_test(iq4_xs_normal_data),
        cmocka_unit_test(iq4_xs_normal_data_importance),
        cmocka_unit_test(iq4_xs_hard_blocks),
        cmocka_unit_test(iq4_xs_hard_blocks_importance),
        cmocka_unit_test(iq4_nl_normal_data),
        cmocka_unit_test(iq4_nl_normal_data_importance),
        cmocka_unit_test(iq4_nl_hard_blocks),
        cmocka_unit_test(iq4_nl_hard_blocks_importance),
        cmocka_unit_test(iq4_uniform_hard_super_blocks),
        cmocka_unit_test(quantize_rows_equal_scalar_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
