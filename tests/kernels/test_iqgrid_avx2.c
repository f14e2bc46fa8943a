/* The AVX2 grid searches (kernels/cpu/iq2_avx2.h, kernels/cpu/iqgrid_avx2.h) write the scalar
 * code's bytes (kernels/iq2.h, kernels/iq3xxs.h, kernels/iq1.h) for IQ2_XXS, IQ3_XXS and IQ1_S,
 * with an importance and (where the type allows it) without: on N(0, 0.02) super-blocks and on
 * super-blocks whose 32-value sub-blocks mix hard kinds (zeros, tiny ~1e-6, one huge outlier,
 * subnormals, negative only, constant, ramps, random magnitudes 2^-100..2^100, values near
 * FLT_MAX, around the zero thresholds), importance vectors with zeros, tiny, huge and
 * subnormal entries; and through qd_quantize on the CPU backend. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "../../kernels/cpu/iq2_avx2.h"
#include "../../kernels/cpu/iqgrid_avx2.h"
#include "helpers.h"

#if QD_IQ2_AVX2 && QD_IQGRID_AVX2
static uint32_t rnd(void) { return (uint32_t)(test_uniform() * 4294967296.0); }

#define KINDS 14

static void fill_block(float *x, int kind)
{
    const float scale = ldexpf(1.0f, (int)(rnd() % 200) - 100), c = (float)(test_uniform() * 4.0 - 2.0) * scale;
    const float sign = rnd() & 1 ? -1.0f : 1.0f;
    const int outlier = (int)(rnd() % 32);
    for (int i = 0; i < 32; i++) {
        const float u = test_normal();
        switch (kind) {
        case 0: x[i] = 0.02f * u; break;
        case 1: x[i] = 0.0f; break;
        case 2: x[i] = rnd() & 1 ? -0.0f : 0.0f; break;
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

static void fill_importance(float *qw, int n)
{
    const int kind = (int)(rnd() % 8);
    for (int i = 0; i < n; i++) {
        const float u = (float)test_uniform();
        qw[i] = kind == 0   ? 1.0f
                : kind == 1 ? u
                : kind == 2 ? (rnd() % 4 == 0 ? 0.0f : u)
                : kind == 3 ? 0.0f
                : kind == 4 ? 1e-30f * u
                : kind == 5 ? 1e30f * u
                : kind == 6 ? 1e-40f * u /* subnormal */
                            : (rnd() % 3 == 0 ? 0.0f : rnd() % 2 ? 1e-20f * u : 1e20f * u);
    }
}

static void dump(const char *what, const float *v, int n)
{
    fprintf(stderr, "%s:\n", what);
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%a%c", v[i], i % 8 == 7 ? '\n' : ' ');
}

enum { T_IQ2_XXS, T_IQ3_XXS, T_IQ1_S };
static const char *const type_name[] = {"iq2_xxs", "iq3_xxs", "iq1_s"};
static const int type_bytes[] = {66, QD_IQ3XXS_BYTES, QD_IQ1S_BYTES};

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
            fill_block(x + 32 * j, mode == 0 ? 0 : mode == 2 ? uniform_kind : rnd() % 2 ? 0 : 1 + (int)(rnd() % (KINDS - 1)));
        fill_importance(qw, QD_QK_K);
        const float *w = with_importance ? qw : NULL;
        memset(want, 0xa5, sizeof want);
        memset(got, 0x5a, sizeof got);
        quantize(type, 0, x, w, want);
        quantize(type, 1, x, w, got);
        if (memcmp(want, got, (size_t)bytes)) {
            dump("x", x, QD_QK_K);
            if (w)
                dump("importance", w, QD_QK_K);
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
            fill_block(x + 32 * b, rnd() % 2 ? 0 : 1 + (int)(rnd() % 12)); /* finite kinds */
        fill_importance(imp, (int)cols * 2);
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
#endif

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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
