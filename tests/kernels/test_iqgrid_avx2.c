/* The AVX2 grid searches (kernels/cpu/iq2_avx2.h, kernels/cpu/iqgrid_avx2.h) write the scalar
 * code's bytes (kernels/iq2.h, kernels/iq3xxs.h, kernels/iq1.h) for IQ2_XXS, IQ3_XXS and IQ1_S,
 * with an importance and (where the type allows it) without: on N(0, 0.02) super-blocks and on
 * super-blocks whose 32-value sub-blocks mix hard kinds (zeros, tiny ~1e-6, one huge outlier,
 * subnormals, negative only, constant, ramps, random magnitudes 2^-100..2^100, values near
 * FLT_MAX, around the zero thresholds), importance vectors with zeros, tiny, huge and
 * subnormal entries; through qd_quantize on the CPU backend; and the group searches alone over
 * every off-grid tuple with exact ties in the neighbour lists (the scalar first-of-equals). */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "../../kernels/cpu/iq2_avx2.h"
#include "../../kernels/cpu/iqgrid_avx2.h"
#include "helpers.h"
#include "iqlists.h"

#if QD_IQ2_AVX2 && QD_IQGRID_AVX2

#define KINDS 14

static void fill_block(float *x, int kind)
{
    const float scale = ldexpf(1.0f, (int)(test_rand32() % 200) - 100), c = (float)(test_uniform() * 4.0 - 2.0) * scale;
    const float sign = test_rand32() & 1 ? -1.0f : 1.0f;
    const int outlier = (int)(test_rand32() % 32);
    for (int i = 0; i < 32; i++) {
        const float u = test_normal();
        switch (kind) {
        case 0: x[i] = 0.02f * u; break;
        case 1: x[i] = 0.0f; break;
        case 2: x[i] = test_rand32() & 1 ? -0.0f : 0.0f; break;
        case 3: x[i] = 1e-6f * u; break;
        case 4: x[i] = i == outlier ? sign * 1000.0f : 0.02f * u; break;
        case 5: x[i] = u * 1e-42f; break; /* subnormal */
        case 6: x[i] = -0.02f * fabsf(u); break;
        case 7: x[i] = c; break;
        case 8: x[i] = (float)(i - 16) * scale; break;
        case 9: x[i] = (float)i * 0.001f; break;
        case 10: x[i] = u * scale; break;
        case 11: x[i] = u * 1e18f; break;
        case 12: x[i] = i < 16 ? 1e-15f * u : 1e-9f * u; break; /* around the zero thresholds */
        default: x[i] = i == outlier ? sign * 1e30f : 0.02f * u; break;
        }
    }
}

enum { T_IQ2_XXS, T_IQ3_XXS, T_IQ1_S };
static const char *const type_name[] = {"iq2_xxs", "iq3_xxs", "iq1_s"};
static const int type_bytes[] = {QD_IQ2_BLOCK_BYTES(QD_IQ2_XXS), QD_IQ3XXS_BYTES, QD_IQ1S_BYTES};

static void quantize(int type, int avx2, const float *x, const float *qw, uint8_t *blk)
{
    switch (type) {
    case T_IQ2_XXS:
        if (avx2)
            qd_iq2xxs_quantize_avx2(qd_iq2_tables(QD_IQ2_XXS), x, qw, blk);
        else
            qd_iq2_quantize_block(qd_iq2_tables(QD_IQ2_XXS), QD_IQ2_XXS, x, qw, blk);
        break;
    case T_IQ3_XXS:
        if (avx2)
            qd_iq3xxs_quantize_avx2(qd_iq3xxs_grid(), x, qw, blk);
        else
            qd_iq3xxs_quantize(qd_iq3xxs_grid(), x, qw, blk);
        break;
    default:
        if (avx2)
            qd_iq1s_quantize_avx2(qd_iq1_grid(), x, qw, blk);
        else
            qd_iq1s_quantize(qd_iq1_grid(), x, qw, blk);
    }
}

/* iters super-blocks: each sub-block normal data, or (hard) a hard kind with probability 1/2,
 * or (uniform) one kind for the whole super-block, every lane the same kind. */
static void equals_scalar(int type, int with_importance, int mode, int iters)
{
    float x[QD_QK_K], qw[QD_QK_K];
    uint8_t want[128], got[128];
    const int bytes = type_bytes[type];
    for (int it = 0; it < iters; it++) {
        const int uniform_kind = it % KINDS;
        for (int j = 0; j < 8; j++)
            fill_block(x + 32 * j, mode == 0 ? 0 : mode == 2 ? uniform_kind : test_rand32() % 2 ? 0 : 1 + (int)(test_rand32() % (KINDS - 1)));
        test_fill_importance(qw, QD_QK_K);
        const float *w = with_importance ? qw : NULL;
        memset(want, 0xa5, sizeof want);
        memset(got, 0x5a, sizeof got);
        quantize(type, 0, x, w, want);
        quantize(type, 1, x, w, got);
        if (memcmp(want, got, (size_t)bytes)) {
            test_dump("x", x, QD_QK_K);
            if (w)
                test_dump("importance", w, QD_QK_K);
            for (int i = 0; i < bytes; i++)
                if (want[i] != got[i])
                    fail_msg("%s%s byte %d: %02x / %02x (scalar / AVX2)", type_name[type],
                             w ? " + importance" : "", i, want[i], got[i]);
        }
    }
}

#define CASE(name, type, imp, mode, iters)                                                                          \
    static void name(void **state)                                                                                 \
    {                                                                                                              \
        (void)state;                                                                                               \
        test_seed();                                                                                               \
        equals_scalar(type, imp, mode, iters);                                                                     \
    }
CASE(iq2_xxs_normal_data_importance, T_IQ2_XXS, 1, 0, 2000)
CASE(iq2_xxs_normal_data, T_IQ2_XXS, 0, 0, 1000)
CASE(iq2_xxs_hard_blocks_importance, T_IQ2_XXS, 1, 1, 4000)
CASE(iq2_xxs_hard_blocks, T_IQ2_XXS, 0, 1, 2000)
CASE(iq2_xxs_uniform_hard_importance, T_IQ2_XXS, 1, 2, 1400)
CASE(iq3_xxs_normal_data_importance, T_IQ3_XXS, 1, 0, 2000)
CASE(iq3_xxs_normal_data, T_IQ3_XXS, 0, 0, 1000)
CASE(iq3_xxs_hard_blocks_importance, T_IQ3_XXS, 1, 1, 4000)
CASE(iq3_xxs_hard_blocks, T_IQ3_XXS, 0, 1, 2000)
CASE(iq3_xxs_uniform_hard_importance, T_IQ3_XXS, 1, 2, 1400)
CASE(iq1_s_normal_data_importance, T_IQ1_S, 1, 0, 2000)
CASE(iq1_s_hard_blocks_importance, T_IQ1_S, 1, 1, 4000)
CASE(iq1_s_uniform_hard_importance, T_IQ1_S, 1, 2, 1400)

/* Through qd_quantize on the CPU backend, two importance vectors over the rows: the bytes are
 * the scalar function's, block by block. */
static void quantize_rows_equal_scalar_blocks(void **state)
{
    (void)state;
    test_seed();
    for (int type = 0; type < 3; type++) {
        const int64_t rows = 2 * 9, cols = 512, n = rows * cols;
        const int bytes = type_bytes[type];
        float *x = malloc((size_t)n * sizeof(float)), *imp = malloc((size_t)cols * 2 * sizeof(float));
        for (int64_t b = 0; b < n / 32; b++)
            fill_block(x + 32 * b, test_rand32() % 2 ? 0 : 1 + (int)(test_rand32() % 12)); /* finite kinds */
        test_fill_importance(imp, (int)cols * 2);
        const struct qd_format *f = qd_format_find(type_name[type]);
        struct qd_params p;
        qd_params_default(f, &p);
        p.importance = imp;
        p.importance_n = cols * 2;
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
        for (int64_t b = 0; b < n / QD_QK_K; b++) {
            const int64_t e = b * QD_QK_K, row = e / cols;
            quantize(type, 0, x + e, imp + (row < rows / 2 ? 0 : cols) + e % cols, want + b * bytes);
        }
        for (int64_t b = 0; b < n / QD_QK_K; b++)
            if (memcmp(want + b * bytes, got + b * bytes, (size_t)bytes))
                fail_msg("%s block %lld differs from the scalar block", type_name[type], (long long)b);
        free(got);
        free(want);
        free(x);
        free(imp);
    }
}

/* The group searches alone, every off-grid tuple of the grid in the lanes: x on the lattice
 * (x = s (2 l + 1), s a power of 2, so every distance is exact and the candidates at one lattice
 * distance tie exactly), weights all 1, random in {0, 1, 2}, all 0 (every distance 0), huge
 * (every distance Inf), one NaN, or x off the lattice. Each lane's levels must be the scalar
 * group's (qd_iq3xxs_best_neighbour / qd_iq2_group: the first of equals). ties counts the picks
 * among equal minima, ties_late those whose minimum recurs in a later block of 8 candidates. */
enum { W_ONES, W_SMALL_INTS, W_ZEROS, W_HUGE, W_NAN, W_NOISE, W_MODES };

static void lattice_lane(const int *level, int dim, int mode, float s, float *x, float *wa)
{
    for (int i = 0; i < dim; i++) {
        x[i] = s * (float)(2 * level[i] + 1);
        wa[i] = mode == W_ONES ? 1.0f : mode == W_SMALL_INTS ? (float)(test_rand32() % 3) : mode == W_ZEROS ? 0.0f
              : mode == W_HUGE ? 1e30f : mode == W_NAN ? (i == 1 ? NAN : 1.0f) : (float)test_uniform();
        if (mode == W_NOISE)
            x[i] += s * 0.6f * test_normal();
    }
}

/* how the scalar scan's minimum falls in list nb: tied (2+ at it), late (one at position >= 8) */
static void count_ties(const uint16_t *nb, float d2_of(const void *, int, const float *, const float *, float),
                       const void *tables, const float *x, const float *wa, float s, int *ties, int *ties_late)
{
    float best = 3.40282347e38f;
    int first = -1, n_at = 0, late = 0;
    for (int j = 1; j <= nb[0]; j++) {
        const float d2 = d2_of(tables, nb[j], x, wa, s);
        if (d2 < best) {
            best = d2;
            first = j;
            n_at = 1;
            late = 0;
        } else if (d2 == best && first > 0) {
            n_at++;
            late |= (j - 1) / 8 != (first - 1) / 8;
        }
    }
    *ties += n_at > 1;
    *ties_late += late;
}

static float iq3_d2(const void *tables, int p, const float *x, const float *wa, float s)
{
    const uint8_t *q = qd_iq_point(tables, p);
    float d2 = 0.0f;
    for (int i = 0; i < 4; i++) {
        const float diff = s * (float)(2 * q[i] + 1) - x[i];
        d2 += wa[i] * diff * diff;
    }
    return d2;
}

static float iq2_d2(const void *tables, int p, const float *x, const float *wa, float s)
{
    const struct qd_iq2_tables *t = tables;
    float d2 = 0.0f;
    for (int i = 0; i < 8; i++) {
        const float diff = s * (float)t->grid[p][i] - x[i];
        d2 += wa[i] * diff * diff;
    }
    return d2;
}

static void iq3_group_equals_scalar(void **state)
{
    (void)state;
    test_seed();
    const struct qd_iq_grid *g = qd_iq3xxs_grid();
    const struct qd_iq_scan *scan = qd_iq3xxs_scan();
    assert_non_null(scan);
    float xl[8][32], wl[8][32];
    const struct qd_iq_lanes lanes = {.scan = scan, .x = (const float(*)[32])xl, .wa = (const float(*)[32])wl};
    int ties = 0, ties_late = 0, off_lanes = 0;
    for (int mode = 0; mode < W_MODES; mode++) {
        int lane = 0, tuples[8], k = (int)(test_rand32() % 8);
        float s[8];
        for (int u = 0; u < g->map_size; u++) {
            if (g->map[u] >= 0)
                continue;
            int level[4];
            for (int i = 0; i < 4; i++)
                level[i] = u >> 3 * i & 7;
            s[lane] = mode == W_HUGE ? 0x1p60f : ldexpf(1.0f, (int)(test_rand32() % 20) - 10);
            lattice_lane(level, 4, mode, s[lane], xl[lane] + 4 * k, wl[lane] + 4 * k);
            tuples[lane++] = u;
            if (lane < 8 && u + 1 < g->map_size)
                continue;
            for (; lane < 8; lane++) /* a short last call: the lanes left repeat lane 0 */
                s[lane] = s[0], memcpy(xl[lane], xl[0], sizeof xl[0]), memcpy(wl[lane], wl[0], sizeof wl[0]);
            lane = 0;
            __m256 xt[4], id, scale = _mm256_loadu_ps(s);
            for (int i = 0; i < 4; i++)
                xt[i] = _mm256_setr_ps(xl[0][4 * k + i], xl[1][4 * k + i], xl[2][4 * k + i], xl[3][4 * k + i],
                                       xl[4][4 * k + i], xl[5][4 * k + i], xl[6][4 * k + i], xl[7][4 * k + i]);
            id = _mm256_div_ps(_mm256_set1_ps(1.0f), scale);
            __m256i L[4];
            int32_t got[4][8];
            (void)iq3_group8(g, &lanes, k, xt, id, scale, L);
            for (int i = 0; i < 4; i++)
                _mm256_storeu_si256((__m256i *)got[i], L[i]);
            for (int l = 0; l < 8; l++) {
                const float *x = xl[l] + 4 * k, *wa = wl[l] + 4 * k;
                int8_t want[4];
                int uu = 0; /* qd_iq_tuple, written out for gcc's uninitialized-read analysis */
                for (int i = 0; i < 4; i++) {
                    want[i] = (int8_t)qd_iq3xxs_level(1.0f / s[l], x[i]);
                    uu |= want[i] << 3 * i;
                }
                if (g->map[uu] < 0) {
                    off_lanes++;
                    qd_iq3xxs_best_neighbour(g, uu, x, wa, s[l], want);
                    count_ties(qd_iq_neighbours(g, uu), iq3_d2, g, x, wa, s[l], &ties, &ties_late);
                }
                for (int i = 0; i < 4; i++)
                    if (got[i][l] != want[i])
                        fail_msg("iq3_xxs group, weights mode %d, tuple %d lane %d level %d: %d / %d (scalar / AVX2)",
                                 mode, tuples[l], l, i, want[i], got[i][l]);
            }
        }
    }
    print_message("%d off-grid lanes, %d picks among ties\n", off_lanes, ties);
    assert_true(ties > 1000);
}

static void iq2_group_equals_scalar(void **state)
{
    (void)state;
    test_seed();
    const struct qd_iq2_tables *t = qd_iq2_tables(QD_IQ2_XXS);
    const struct qd_iq_scan *scan = qd_iq2xxs_scan();
    assert_non_null(scan);
    float xl[8][32], wl[8][32];
    const struct qd_iq_lanes lanes = {.scan = scan, .x = (const float(*)[32])xl, .wa = (const float(*)[32])wl};
    int ties = 0, ties_late = 0, off_lanes = 0;
    for (int mode = 0; mode < W_MODES; mode++) {
        int lane = 0, tuples[8], k = (int)(test_rand32() % 4);
        float s[8];
        for (int u = 0; u < QD_IQ2_TUPLES; u++) {
            if (t->map[u] >= 0)
                continue;
            int level[8];
            for (int i = 0, v = u; i < 8; i++, v /= 3)
                level[i] = v % 3;
            s[lane] = mode == W_HUGE ? 0x1p60f : ldexpf(1.0f, (int)(test_rand32() % 20) - 10);
            lattice_lane(level, 8, mode, s[lane], xl[lane] + 8 * k, wl[lane] + 8 * k);
            tuples[lane++] = u;
            if (lane < 8 && u + 1 < QD_IQ2_TUPLES)
                continue;
            for (; lane < 8; lane++)
                s[lane] = s[0], memcpy(xl[lane], xl[0], sizeof xl[0]), memcpy(wl[lane], wl[0], sizeof wl[0]);
            lane = 0;
            __m256 xt[8], id, scale = _mm256_loadu_ps(s);
            for (int i = 0; i < 8; i++)
                xt[i] = _mm256_setr_ps(xl[0][8 * k + i], xl[1][8 * k + i], xl[2][8 * k + i], xl[3][8 * k + i],
                                       xl[4][8 * k + i], xl[5][8 * k + i], xl[6][8 * k + i], xl[7][8 * k + i]);
            id = _mm256_div_ps(_mm256_set1_ps(1.0f), scale);
            __m256i L[8];
            int32_t got[8][8];
            iq2_group8(t, &lanes, k, xt, id, scale, L);
            for (int i = 0; i < 8; i++)
                _mm256_storeu_si256((__m256i *)got[i], L[i]);
            for (int l = 0; l < 8; l++) {
                const float *x = xl[l] + 8 * k, *wa = wl[l] + 8 * k;
                int8_t want[8];
                if (!qd_iq2_group(t, x, wa, 1.0f / s[l], s[l], want)) {
                    int8_t lv[8];
                    for (int i = 0; i < 8; i++)
                        lv[i] = (int8_t)qd_iq2_level(1.0f / s[l], x[i]);
                    off_lanes++;
                    count_ties(t->neighbours + (-t->map[qd_iq2_tuple(lv)] - 1), iq2_d2, t, x, wa, s[l], &ties,
                               &ties_late);
                }
                for (int i = 0; i < 8; i++)
                    if (got[i][l] != want[i])
                        fail_msg("iq2_xxs group, weights mode %d, tuple %d lane %d level %d: %d / %d (scalar / AVX2)",
                                 mode, tuples[l], l, i, want[i], got[i][l]);
            }
        }
    }
    print_message("%d off-grid lanes, %d picks among ties, %d with the minimum again in a later block\n", off_lanes,
                  ties, ties_late);
    assert_true(ties > 1000);
    assert_true(ties_late > 100);
}
#else /* a build without AVX2 has no fast path to compare */
#define SKIPPED(name) static void name(void **state) { (void)state; skip(); }
SKIPPED(iq2_xxs_normal_data_importance)
SKIPPED(iq2_xxs_normal_data)
SKIPPED(iq2_xxs_hard_blocks_importance)
SKIPPED(iq2_xxs_hard_blocks)
SKIPPED(iq2_xxs_uniform_hard_importance)
SKIPPED(iq3_xxs_normal_data_importance)
SKIPPED(iq3_xxs_normal_data)
SKIPPED(iq3_xxs_hard_blocks_importance)
SKIPPED(iq3_xxs_hard_blocks)
SKIPPED(iq3_xxs_uniform_hard_importance)
SKIPPED(iq1_s_normal_data_importance)
SKIPPED(iq1_s_hard_blocks_importance)
SKIPPED(iq1_s_uniform_hard_importance)
SKIPPED(quantize_rows_equal_scalar_blocks)
SKIPPED(iq3_group_equals_scalar)
SKIPPED(iq2_group_equals_scalar)
#endif

/* The code beside each neighbour list entry (what the GPU's iq2 searches read) is that
 * entry's grid point, 2 bits a level; a count's slot holds the count (the search reads it there). */
static void iq2_codes_are_their_points_levels(void **state)
{
    (void)state;
    for (int type = QD_IQ2_XXS; type <= QD_IQ2_S; type++) {
        const struct qd_iq2_tables *t = qd_iq2_tables(type);
        assert_non_null(t);
        int64_t lists = 0;
        for (int64_t at = 0; at < t->n_neighbours; at += 1 + t->neighbours[at], lists++) {
            assert_int_equal(t->codes[at], t->neighbours[at]);
            for (int j = 1; j <= t->neighbours[at]; j++)
                for (int k = 0; k < 8; k++)
                    assert_int_equal(2 * (t->codes[at + j] >> 2 * k & 3) + 1, t->grid[t->neighbours[at + j]][k]);
        }
        assert_true(lists > 0);
        test_lists_placed(t->map, QD_IQ2_TUPLES, t->neighbours, t->n_neighbours); /* the GPU's warp search */
    }
}

/* The same for the iq3_xxs and iq1 grids (what the GPU's iq3_xxs search reads): beside each list
 * its count, then each entry's point as its tuple of levels. */
static void grid_codes_are_their_points_tuples(void **state)
{
    (void)state;
    const struct qd_iq_grid *grids[2] = {qd_iq3xxs_grid(), qd_iq1_grid()};
    for (int i = 0; i < 2; i++) {
        const struct qd_iq_grid *g = grids[i];
        assert_non_null(g);
        int64_t lists = 0;
        for (size_t at = 0; at < g->neighbours_len; at += 1 + g->neighbours[at], lists++) {
            assert_int_equal(g->codes[at], g->neighbours[at]);
            for (int j = 1; j <= g->neighbours[at]; j++)
                for (int k = 0; k < g->dim; k++)
                    assert_int_equal(qd_iq_level(g->codes[at + j], g->bits, k),
                                     qd_iq_point(g, g->neighbours[at + j])[k]);
        }
        assert_true(lists > 0);
        test_lists_placed(g->map, g->map_size, g->neighbours, (int64_t)g->neighbours_len);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(iq2_xxs_normal_data_importance),
        cmocka_unit_test(iq2_xxs_normal_data),
        cmocka_unit_test(iq2_xxs_hard_blocks_importance),
        cmocka_unit_test(iq2_xxs_hard_blocks),
        cmocka_unit_test(iq2_xxs_uniform_hard_importance),
        cmocka_unit_test(iq3_xxs_normal_data_importance),
        cmocka_unit_test(iq3_xxs_normal_data),
        cmocka_unit_test(iq3_xxs_hard_blocks_importance),
        cmocka_unit_test(iq3_xxs_hard_blocks),
        cmocka_unit_test(iq3_xxs_uniform_hard_importance),
        cmocka_unit_test(iq1_s_normal_data_importance),
        cmocka_unit_test(iq1_s_hard_blocks_importance),
        cmocka_unit_test(iq1_s_uniform_hard_importance),
        cmocka_unit_test(quantize_rows_equal_scalar_blocks),
        cmocka_unit_test(iq3_group_equals_scalar),
        cmocka_unit_test(iq2_group_equals_scalar),
        cmocka_unit_test(iq2_codes_are_their_points_levels),
        cmocka_unit_test(grid_codes_are_their_points_tuples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
