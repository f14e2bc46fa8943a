/* Every format in the registry, through the public API: round trips for each input and output
 * dtype, every output byte written, the same bytes on one thread and on several, zero tensors,
 * rejected shapes and non-finite inputs. */
#include <stdio.h>
#include <string.h>

#include "../../kernels/cpu/cpu.h"
#include "../../kernels/mx.h"
#include "helpers.h"

static const enum qd_dtype dtypes[] = {QD_F32, QD_F16, QD_BF16};

/* Shape and extra params that every format accepts (awq groups along K). */
static void shape_for(const struct qd_format *f, int64_t *rows, int64_t *cols, const char **params)
{
    *rows = 96;
    *cols = 256;
    params[0] = !strcmp(f->name, "awq") ? "group_size=32" : NULL;
    params[1] = NULL;
}

static double nmse_bound(const struct qd_format *f)
{
    /* ternary codes at d = amax are made for ternary weights (BitNet): on N(0,1) nearly every
     * value rounds to 0 (nmse about 0.65) */
    if (!strcmp(f->name, "tq1_0") || !strcmp(f->name, "tq2_0"))
        return 0.75;
    /* iq1_s/iq1_m: three levels per value on a grid (the best 3-level quantizer of N(0,1) alone
     * leaves 0.19); iq1_m without an importance weighs by x^2, which favours the large values
     * (about 0.34) */
    if (f->bits_per_weight < 2)
        return 0.4;
    /* iq2_xxs: 8 magnitudes as one of 256 grid points, 2.06 bits; 0.117-0.120 over these sizes'
     * seeds (one above 0.12: 0.120041) */
    if (!strcmp(f->name, "iq2_xxs"))
        return 0.13;
    return f->bits_per_weight < 3 ? 0.12 : f->bits_per_weight < 5 ? 0.05 : f->bits_per_weight < 7 ? 0.012 : 0.005;
}

static float *normal_data(int64_t n)
{
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = test_normal();
    return x;
}

static void round_trip_every_format_and_dtype(void **state)
{
    (void)state;
    for (int i = 0; i < qd_format_count; i++) {
        const struct qd_format *f = &qd_formats[i];
        int64_t rows, cols;
        const char *params[2];
        shape_for(f, &rows, &cols, params);
        float *x = normal_data(rows * cols);
        for (int d = 0; d < 3; d++) {
            struct test_q q;
            assert_int_equal(test_quantize(&q, f->name, x, rows, cols, dtypes[d], params), QD_OK);
            for (int o = 0; o < 3; o++) {
                float *y = test_dequantize(&q, f->name, dtypes[o]);
                double num = 0, den = 0;
                for (int64_t k = 0; k < rows * cols; k++) {
                    double ref = test_decode(q.in.data, k, dtypes[d]);
                    num += (ref - y[k]) * (ref - y[k]);
                    den += ref * ref;
                }
                if (!(num / den < nmse_bound(f)))
                    fail_msg("%s %s->%s: nmse %g over %g", f->name, qd_dtype_name(dtypes[d]),
                             qd_dtype_name(dtypes[o]), num / den, nmse_bound(f));
                free(y);
            }
            tq_release(&q);
        }
        free(x);
    }
}

/* Quantizing twice, over two different poisons, on 1 and on 2 threads, gives one result. */
static void every_byte_written_and_thread_count_irrelevant(void **state)
{
    (void)state;
    int saved = qd_cpu_threads();
    for (int i = 0; i < qd_format_count; i++) {
        const struct qd_format *f = &qd_formats[i];
        int64_t rows = 1024, cols = 512; /* large enough to split across threads */
        const char *params[2] = {!strcmp(f->name, "awq") ? "group_size=64" : NULL, NULL};
        float *x = normal_data(rows * cols);
        struct test_q a, b;
        qd_cpu_set_threads(1);
        assert_int_equal(test_quantize(&a, f->name, x, rows, cols, QD_BF16, params), QD_OK);
        qd_cpu_set_threads(2);
        /* second run over a different poison */
        assert_int_equal(test_quantize(&b, f->name, x, rows, cols, QD_BF16, params), QD_OK);
        for (int c = 0; c < a.n; c++) {
            memset(b.buf[c], 0x5A, (size_t)b.c[c].bytes);
        }
        assert_int_equal(qd_quantize(QD_BACKEND_CPU, f, &b.in, &b.p, b.buf, b.err, sizeof b.err), QD_OK);
        for (int c = 0; c < a.n; c++)
            if (memcmp(a.buf[c], b.buf[c], (size_t)a.c[c].bytes))
                fail_msg("%s: component %s differs between runs/threads", f->name, a.c[c].name);
        tq_release(&a);
        tq_release(&b);
        free(x);
    }
    qd_cpu_set_threads(saved);
}

static void zero_tensor_dequantizes_to_zero(void **state)
{
    (void)state;
    for (int i = 0; i < qd_format_count; i++) {
        const struct qd_format *f = &qd_formats[i];
        int64_t rows, cols;
        const char *params[2];
        shape_for(f, &rows, &cols, params);
        float *x = calloc((size_t)(rows * cols), sizeof(float));
        struct test_q q;
        assert_int_equal(test_quantize(&q, f->name, x, rows, cols, QD_F32, params), QD_OK);
        float *y = test_dequantize(&q, f->name, QD_F32);
        for (int64_t k = 0; k < rows * cols; k++)
            if (y[k] != 0.0f)
                fail_msg("%s: zero input gives %g at %lld", f->name, y[k], (long long)k);
        free(y);
        tq_release(&q);
        free(x);
    }
}

static void nonfinite_rejected_with_its_index_unless_allowed(void **state)
{
    (void)state;
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < qd_format_count; i++) {
        const struct qd_format *f = &qd_formats[i];
        int64_t rows, cols;
        const char *params[3];
        shape_for(f, &rows, &cols, params);
        float *x = normal_data(rows * cols);
        x[4321] = bad[i % 3];
        x[5000] = NAN;
        struct test_q q;
        assert_int_equal(test_quantize(&q, f->name, x, rows, cols, QD_F32, params), QD_ENONFINITE);
        assert_non_null(strstr(q.err, "element 4321"));
        tq_release(&q);
        int k = params[0] ? 1 : 0; /* after awq's group_size, if any */
        params[k] = "allow_nonfinite=true";
        params[k + 1] = NULL;
        if (qd_format_accepts(f, "allow_nonfinite")) {
            assert_int_equal(test_quantize(&q, f->name, x, rows, cols, QD_F32, params), QD_OK);
            tq_release(&q);
        } else { /* the K-quants: NaN/Inf is always refused (docs/formats.md), the param too */
            struct qd_params p;
            char err[256];
            qd_params_default(f, &p);
            assert_int_equal(qd_params_set(f, &p, "allow_nonfinite", "true", err, sizeof err), QD_EINVAL);
        }
        free(x);
    }
}

static void shapes_the_format_cannot_take_are_named(void **state)
{
    (void)state;
    struct { const char *fmt; int64_t rows, cols; const char *needle; } cases[] = {
        {"q4_0", 2, 48, "multiple of 32"}, {"q8_1", 1, 31, "multiple of 32"},
        {"mxfp4", 4, 40, "multiple of 32"}, {"mxfp6_e2m3", 4, 16, "multiple of 32"},
        {"nvfp4", 3, 24, "multiple of 16"}, {"awq", 100, 64, "multiple of group_size"},
        {"awq", 128, 12, "multiple of 8"}, {"q4_K", 2, 288, "multiple of 256"}, {"q6_K", 1, 32, "multiple of 256"},
        {"mlx_affine", 2, 96, "multiple of 64"}, {"mlx_mxfp8", 2, 48, "multiple of 32"},
        {"mlx_nvfp4", 3, 16, "element count to be a multiple of 32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float *x = normal_data(cases[i].rows * cases[i].cols);
        struct test_q q;
        assert_int_equal(test_quantize(&q, cases[i].fmt, x, cases[i].rows, cases[i].cols, QD_F32, NULL),
                         QD_ESHAPE);
        if (!strstr(q.err, cases[i].needle))
            fail_msg("%s: message '%s' lacks '%s'", cases[i].fmt, q.err, cases[i].needle);
        free(x);
    }
}

static void bad_params_are_refused_with_what_is_accepted(void **state)
{
    (void)state;
    struct qd_params p;
    char err[512];
    const struct qd_format *nf4 = qd_format_find("nf4");
    qd_params_default(nf4, &p);
    assert_int_equal(qd_params_set(nf4, &p, "blocksize", "48", err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "power-of-two"));
    assert_int_equal(qd_params_set(nf4, &p, "blocksize", "8192", err, sizeof err), QD_EINVAL);
    assert_int_equal(qd_params_set(nf4, &p, "group_size", "64", err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "accepted"));
    const struct qd_format *mx = qd_format_find("mxfp4");
    qd_params_default(mx, &p);
    assert_int_equal(qd_params_set(mx, &p, "scale_rounding", "ceil", err, sizeof err), QD_EINVAL);
    assert_non_null(strstr(err, "floor, rceil"));
    assert_int_equal(qd_params_set(mx, &p, "allow_nonfinite", "maybe", err, sizeof err), QD_EINVAL);
    const struct qd_format *nv = qd_format_find("nvfp4");
    qd_params_default(nv, &p);
    assert_int_equal(p.scale_layout, QD_LAYOUT_SWIZZLED); /* nvfp4's own default */
    assert_int_equal(qd_params_set(nv, &p, "global_scale", "-1", err, sizeof err), QD_EINVAL);
    assert_int_equal(qd_params_set(nv, &p, "global_scale", "nan", err, sizeof err), QD_EINVAL);
    /* mlx_affine: its own group_size default; bits and group sizes outside mlx's are named */
    const struct qd_format *ma = qd_format_find("mlx_affine");
    qd_params_default(ma, &p);
    assert_int_equal(p.group_size, 64);
    assert_int_equal(p.bits, 4);
    assert_int_equal(qd_params_set(ma, &p, "bits", "9", err, sizeof err), QD_EINVAL);
    float *x = normal_data(4 * 128);
    struct test_q q;
    const char *seven[] = {"bits=7", NULL}, *g16[] = {"group_size=16", NULL};
    assert_int_equal(test_quantize(&q, "mlx_affine", x, 4, 128, QD_F32, seven), QD_ESHAPE);
    assert_non_null(strstr(q.err, "bits 1, 2, 3, 4, 5, 6 or 8"));
    assert_int_equal(test_quantize(&q, "mlx_affine", x, 4, 128, QD_F32, g16), QD_ESHAPE);
    assert_non_null(strstr(q.err, "group_size 32, 64 or 128"));
    const char *f16[] = {"scale_dtype=f16", NULL}; /* mlx keeps scales in the input's dtype */
    assert_int_equal(test_quantize(&q, "mlx_affine", x, 4, 128, QD_F32, f16), QD_EINVAL);
    tq_release(&q);
    free(x);
}

/* Components kept in the weight's dtype (compressed-tensors' weight_scale, mlx's scales and
 * biases) are laid out in the dtype scale_dtype resolved to, whatever the dequantize's output
 * dtype: their byte counts follow it. */
static void scale_dtype_components_keep_their_dtype_for_any_output(void **state)
{
    (void)state;
    const char *fmts[] = {"w4a16", "mlx_affine"};
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        float *x = normal_data(8 * 128);
        struct test_q q;
        assert_int_equal(test_quantize(&q, fmts[i], x, 8, 128, QD_BF16, NULL), QD_OK);
        assert_int_equal(q.p.scale_dtype, QD_SCALE_BF16);
        for (int o = 0; o < 3; o++) {
            struct qd_tensor out = q.in;
            struct qd_component c[QD_MAX_COMPONENTS];
            char err[256];
            out.dtype = dtypes[o];
            int n = qd_format_layout(qd_format_find(fmts[i]), &q.p, &out, c, err, sizeof err);
            assert_int_equal(n, q.n);
            for (int k = 0; k < n; k++) {
                assert_int_equal(c[k].dtype, q.c[k].dtype);
                if (c[k].bytes != q.c[k].bytes)
                    fail_msg("%s to %s: component %s takes %lld bytes, quantize wrote %lld", fmts[i],
                             qd_dtype_name(dtypes[o]), c[k].name, (long long)c[k].bytes, (long long)q.c[k].bytes);
            }
        }
        tq_release(&q);
        free(x);
    }
}

/* compressed-tensors' arithmetic: combinations it does not have are refused by name, and an MX
 * scale that would be infinite in f16 is refused naming its block (or, allowed, stored as 255). */
static void compressed_tensors_variants_are_checked(void **state)
{
    (void)state;
    float *x = normal_data(4 * 64);
    struct test_q q;
    const char *even[] = {"scale_rounding=even", NULL};
    assert_int_equal(test_quantize(&q, "mxfp8_e4m3", x, 4, 64, QD_BF16, even), QD_ESHAPE);
    assert_non_null(strstr(q.err, "even is compressed-tensors' MXFP4 rule"));
    const char *pts[] = {"flow=compressed_tensors", "per_tensor_scale=0.5", NULL};
    assert_int_equal(test_quantize(&q, "nvfp4", x, 4, 64, QD_BF16, pts), QD_ESHAPE);
    assert_non_null(strstr(q.err, "torchao's"));
    const char *single[] = {"flow=compressed_tensors", "two_level=false", NULL};
    assert_int_equal(test_quantize(&q, "nvfp4", x, 4, 64, QD_BF16, single), QD_ESHAPE);
    x[32 + 5] = 60000.0f; /* f16: rounds to 2^16, infinite */
    assert_int_equal(test_quantize(&q, "mxfp4", x, 4, 64, QD_F16, even), QD_ENONFINITE);
    assert_non_null(strstr(q.err, "block starting at input element 32 "));
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "mxfp4", x, 4, 64, QD_BF16, even), QD_OK); /* bf16 holds it */
    tq_release(&q);
    const char *allowed[] = {"scale_rounding=even", "scale_layout=linear", "allow_nonfinite=true", NULL};
    assert_int_equal(test_quantize(&q, "mxfp4", x, 4, 64, QD_F16, allowed), QD_OK);
    assert_int_equal(((uint8_t *)q.buf[1])[1], 255);
    tq_release(&q);
    free(x);
    /* the scale rules themselves: up from a mantissa of 1.75; f16 subnormal amax; gparam fallback */
    assert_int_equal(qd_ct_mx_scale(0.4375f, QD_BF16), 127 - 1 - 2);
    assert_int_equal(qd_ct_mx_scale(0.421875f, QD_BF16), 127 - 2 - 2);
    assert_int_equal(qd_ct_mx_scale(0.0f, QD_F32), 0);
    assert_int_equal(qd_ct_mx_scale(0x1p-15f, QD_F16), 127);           /* rounds to 0: scale 1 */
    assert_int_equal(qd_ct_mx_scale(0.75f * 0x1p-14f, QD_F16), 127 - 14 - 2);
    assert_int_equal(qd_ct_mx_scale(57344.0f, QD_F16), -1);
    assert_true(qd_ct_nvfp4_global_scale(0.01f, QD_F16) == 1.0f);       /* 2688 / 0.01 overflows f16 */
    assert_true(qd_ct_nvfp4_global_scale(0.3f, QD_BF16) == 8960.0f);
}

static void registry_names_are_unique_and_json_lists_them(void **state)
{
    (void)state;
    for (int i = 0; i < qd_format_count; i++)
        for (int j = i + 1; j < qd_format_count; j++)
            assert_string_not_equal(qd_formats[i].name, qd_formats[j].name);
    char *json = qd_registry_json();
    for (int i = 0; i < qd_format_count; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "\"%s\"", qd_formats[i].name);
        assert_non_null(strstr(json, needle));
    }
    free(json);
    assert_int_equal(qd_format_count, 42);
    assert_null(qd_format_find("q4_2"));
}

static void shape_text_is_validated(void **state)
{
    (void)state;
    int n;
    int64_t s[QD_MAX_DIMS];
    char err[256];
    assert_int_equal(qd_shape_parse("4096,4096", &n, s, err, sizeof err), QD_OK);
    assert_int_equal(n, 2);
    assert_int_equal(qd_shape_parse("7", &n, s, err, sizeof err), QD_OK);
    assert_int_equal(qd_shape_parse("2,3,4", &n, s, err, sizeof err), QD_OK);
    /* commas only: "2048x512" is refused with the message that names them */
    const char *bad[] = {"", "0,4", "-1", "4,", "a", "4,,4", "99999999999,99999999999", "1,2,3,4,5,6,7,8,9",
                         "2048x512", "4x", "4 ,4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(qd_shape_parse(bad[i], &n, s, err, sizeof err), QD_ESHAPE);
    assert_int_equal(qd_shape_parse("2048x512", &n, s, err, sizeof err), QD_ESHAPE);
    assert_non_null(strstr(err, "separated by commas"));
}

int main(void)
{
    test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip_every_format_and_dtype),
        cmocka_unit_test(every_byte_written_and_thread_count_irrelevant),
        cmocka_unit_test(zero_tensor_dequantizes_to_zero),
        cmocka_unit_test(nonfinite_rejected_with_its_index_unless_allowed),
        cmocka_unit_test(shapes_the_format_cannot_take_are_named),
        cmocka_unit_test(bad_params_are_refused_with_what_is_accepted),
        cmocka_unit_test(scale_dtype_components_keep_their_dtype_for_any_output),
        cmocka_unit_test(compressed_tensors_variants_are_checked),
        cmocka_unit_test(registry_names_are_unique_and_json_lists_them),
        cmocka_unit_test(shape_text_is_validated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
