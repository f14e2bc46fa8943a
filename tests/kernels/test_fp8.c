/* fp8_e4m3 and w8a8 (kernels/fp8.h, kernels/cpu/fp8.c): the edge cases docs/formats.md names,
 * one test each, in both peers' arithmetic (compressed-tensors: flow=compressed_tensors, the
 * default; transformers' FineGrainedFP8: flow=transformers). */
#include "../../kernels/cpu/cpu.h"
#include "../../kernels/fp8.h"
#include "helpers.h"

static const char *const ct_block[] = {"granularity=block", NULL};
static const char *const ct_tensor[] = {"granularity=tensor", NULL};
static const char *const tf_channel[] = {"flow=transformers", NULL};
static const char *const tf_block[] = {"flow=transformers", "granularity=block", NULL};

static uint16_t half_at(const struct test_q *q, int c, int64_t i) { return ((const uint16_t *)q->buf[c])[i]; }
static float f32_at(const struct test_q *q, int c, int64_t i) { return ((const float *)q->buf[c])[i]; }
static uint8_t code_at(const struct test_q *q, int64_t i) { return ((const uint8_t *)q->buf[0])[i]; }

/* A row, block or tensor of zeros: compressed-tensors' scale 0 becomes the dtype's eps;
 * transformers' scale is 1; the codes are 0. */
static void fp8_zero_rows_get_eps_or_one(void **state)
{
    (void)state;
    float x[2 * 64] = {0};
    for (int i = 64; i < 128; i++)
        x[i] = 0.01f * test_normal();
    struct test_q q;
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 2, 64, QD_BF16, NULL), QD_OK);
    assert_int_equal(q.c[1].dtype, QD_BF16);
    assert_int_equal(half_at(&q, 1, 0), 0x3c00); /* bf16 eps 2^-7 */
    for (int i = 0; i < 64; i++)
        assert_int_equal(code_at(&q, i), 0);
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 2, 64, QD_F16, NULL), QD_OK);
    assert_int_equal(half_at(&q, 1, 0), 0x1400); /* f16 eps 2^-10 */
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 2, 64, QD_F32, NULL), QD_OK);
    assert_true(f32_at(&q, 1, 0) == 0x1p-23f);
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "w8a8", x, 2, 64, QD_BF16, NULL), QD_OK);
    assert_int_equal(half_at(&q, 1, 0), 0x3c00);
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 2, 64, QD_BF16, tf_channel), QD_OK);
    assert_int_equal(q.c[1].dtype, QD_F32);
    assert_string_equal(q.c[1].name, "weight_scale_inv");
    assert_true(f32_at(&q, 1, 0) == 1.0f);
    for (int i = 0; i < 64; i++)
        assert_int_equal(code_at(&q, i), 0);
    tq_release(&q);
    /* a zero block (the first of [2 x 64] in 1x32 blocks) and a zero tensor, in both flows */
    const char *const blocks[][4] = {{"granularity=block", "block=1x32", NULL}, {"granularity=block", "block=1x32",
                                                                                 "flow=transformers", NULL}};
    for (int flow = 0; flow < 2; flow++) {
        assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 2, 64, QD_F16, blocks[flow]), QD_OK);
        assert_int_equal(q.c[1].shape[0], 2);
        assert_int_equal(q.c[1].shape[1], 2);
        if (flow)
            assert_true(f32_at(&q, 1, 0) == 1.0f && f32_at(&q, 1, 1) == 1.0f && f32_at(&q, 1, 2) != 1.0f);
        else
            assert_true(half_at(&q, 1, 0) == 0x1400 && half_at(&q, 1, 1) == 0x1400 && half_at(&q, 1, 2) != 0x1400);
        tq_release(&q);
        const char *const tensor[] = {"granularity=tensor", flow ? "flow=transformers" : NULL, NULL};
        float z[64] = {0};
        assert_int_equal(test_quantize(&q, "fp8_e4m3", z, 1, 64, QD_F32, tensor), QD_OK);
        assert_true(f32_at(&q, 1, 0) == (flow ? 1.0f : 0x1p-23f));
        float *y = test_dequantize(&q, "fp8_e4m3", QD_BF16);
        for (int i = 0; i < 64; i++)
            assert_true(code_at(&q, i) == 0 && y[i] == 0.0f);
        free(y);
        tq_release(&q);
    }
}

/* Quotients on e4m3 ties (scale 2^-10 exactly, amax 448 * 2^-10): to even, normal and subnormal. */
static void fp8_ties_round_to_even(void **state)
{
    (void)state;
    const float t[] = {448.0f, 1.0625f, 1.1875f, 248.0f, 0x1p-9f, 3 * 0x1p-10f, 0x1p-10f, -1.0625f, 5 * 0x1p-10f};
    const uint8_t want[] = {0x7e, 0x38, 0x3a, 0x78, 0x01, 0x02, 0x00, 0xb8, 0x02};
    float x[16] = {0};
    for (int i = 0; i < 9; i++)
        x[i] = t[i] * 0x1p-10f;
    for (int d = 0; d < 3; d++) {
        const enum qd_dtype dt = d == 0 ? QD_F32 : d == 1 ? QD_F16 : QD_BF16;
        for (int flow = 0; flow < 2; flow++) { /* transformers: (1 / amax) * 448 = 2^10 exactly too */
            struct test_q q;
            assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 1, 16, dt, flow ? tf_channel : NULL), QD_OK);
            for (int i = 0; i < 9; i++)
                if (code_at(&q, i) != want[i])
                    fail_msg("%s flow %d: %g gives 0x%02x, not 0x%02x", qd_dtype_name(dt), flow, (double)t[i],
                             code_at(&q, i), want[i]);
            tq_release(&q);
        }
    }
}

/* compressed-tensors' zero point (+0) turns a -0 quotient into +0: -0.0 inputs, and negatives
 * whose f32 quotient underflows to -0; a negative whose f32 quotient is nonzero keeps its sign
 * when e4m3 rounds it to zero, even where the weight's dtype would have flushed it (the eager
 * torch path's -0 there, then +0). transformers multiplies: -0 stays -0. */
static void fp8_negative_zero_is_code_0_for_compressed_tensors(void **state)
{
    (void)state;
    float x[8] = {896.0f, -0.0f, -1e-6f, 0x1p-24f * -1.0f, 0, 0, 0, 0}; /* scale 2 */
    struct test_q q;
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 1, 8, QD_F16, NULL), QD_OK);
    assert_int_equal(code_at(&q, 0), 0x7e);
    assert_int_equal(code_at(&q, 1), 0x00);
    assert_int_equal(code_at(&q, 2), 0x80); /* -5e-7 in f16, an e4m3 -0 */
    assert_int_equal(code_at(&q, 3), 0x80); /* -2^-25 in f32 (f16 would round it to -0) */
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 1, 8, QD_F32, NULL), QD_OK);
    assert_int_equal(code_at(&q, 1), 0x00);
    assert_int_equal(code_at(&q, 3), 0x80);
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 1, 8, QD_F16, tf_channel), QD_OK);
    assert_int_equal(code_at(&q, 1), 0x80);
    assert_int_equal(code_at(&q, 3), 0x80);
    tq_release(&q);
    /* bf16, scale 2^18: -2^-133 / 2^18 = -2^-151 is -0 in f32 too, -2^-126 / 2^18 is not */
    float y[4] = {448.0f * 0x1p18f, -0x1p-133f, -0x1p-126f, 0};
    assert_int_equal(test_quantize(&q, "fp8_e4m3", y, 1, 4, QD_BF16, NULL), QD_OK);
    assert_int_equal(half_at(&q, 1, 0), qd_f32_to_bf16(0x1p18f));
    assert_int_equal(code_at(&q, 1), 0x00);
    assert_int_equal(code_at(&q, 2), 0x80);
    tq_release(&q);
}

/* compressed-tensors' codes come from the f32 quotient (its Triton kernel, as llm-compressor runs
 * on a GPU): quotients that land on an e4m3 (int8) midpoint only once rounded to bf16 or f16 go to
 * the nearer code of the f32 quotient, not to the even one the eager torch path would pick. The
 * first element is the amax, 1.0 (scale 1 / 448 or 1 / 127.5 in the dtype). */
static void ct_codes_come_from_the_f32_quotient(void **state)
{
    (void)state;
    static const struct {
        const char *fmt;
        enum qd_dtype dt;
        uint16_t scale;
        float x[4];
        uint8_t want[4];
    } cases[] = {
        /* f32 quotients 1.18493, 1.31507, -1.31507 (bf16: 1.1875, 1.3125, -1.3125: ties) */
        {"fp8_e4m3", QD_BF16, 0x3b12, {1.0f, 0x1.5ap-9f, 0x1.8p-9f, -0x1.8p-9f}, {0x7e, 0x39, 0x3b, 0xbb}},
        /* 1.18718, 1.31282 (f16: 1.1875, 1.3125) */
        {"fp8_e4m3", QD_F16, 0x1892, {1.0f, 0x1.5b4p-9f, 0x1.8p-9f, -0x1.8p-9f}, {0x7e, 0x39, 0x3b, 0xbb}},
        /* 1.49612, 6.51163, -6.51163 (bf16: 1.5, 6.5, -6.5) */
        {"w8a8", QD_BF16, 0x3c01, {1.0f, 0x1.82p-7f, 0x1.a4p-5f, -0x1.a4p-5f}, {127, 1, 7, (uint8_t)-7}},
        /* 4.50195, 5.49805 (f16: 4.5, 5.5) */
        {"w8a8", QD_F16, 0x2004, {1.0f, 0x1.214p-5f, 0x1.614p-5f, -0x1.614p-5f}, {127, 5, 5, (uint8_t)-5}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct test_q q;
        assert_int_equal(test_quantize(&q, cases[c].fmt, cases[c].x, 1, 4, cases[c].dt, NULL), QD_OK);
        assert_int_equal(half_at(&q, 1, 0), cases[c].scale);
        for (int i = 0; i < 4; i++)
            if (code_at(&q, i) != cases[c].want[i])
                fail_msg("%s %s: x[%d] gives 0x%02x, not 0x%02x", cases[c].fmt, qd_dtype_name(cases[c].dt), i,
                         code_at(&q, i), cases[c].want[i]);
        tq_release(&q);
    }
}

/* A scale rounded down (an f16 subnormal: 1.4 * 2^-24 -> 2^-24) sends quotients past 448: the
 * clamp before the cast makes them 448, never NaN. */
static void fp8_saturates_at_448(void **state)
{
    (void)state;
    float x[4] = {627 * 0x1p-24f, -627 * 0x1p-24f, 300 * 0x1p-24f, 0.0f};
    struct test_q q;
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 1, 4, QD_F16, NULL), QD_OK);
    assert_int_equal(half_at(&q, 1, 0), 0x0001);
    assert_int_equal(code_at(&q, 0), 0x7e);
    assert_int_equal(code_at(&q, 1), 0xfe);
    assert_int_equal(code_at(&q, 2), 0x79); /* 300 -> 288 */
    tq_release(&q);
}

/* An f32 block whose amax is below ~1.3e-36: transformers' 448 / amax is infinite, its stored
 * inverse 0; nonzero values saturate and 0 * inf is NaN (0x7f, the GPU's, where transformers runs). */
static void fp8_transformers_infinite_scale(void **state)
{
    (void)state;
    float x[4] = {1e-40f, -3e-41f, 0.0f, 1e-45f};
    struct test_q q;
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 1, 4, QD_F32, tf_channel), QD_OK);
    assert_true(f32_at(&q, 1, 0) == 0.0f);
    assert_int_equal(code_at(&q, 0), 0x7e);
    assert_int_equal(code_at(&q, 1), 0xfe);
    assert_int_equal(code_at(&q, 2), 0x7f);
    assert_int_equal(code_at(&q, 3), 0x7e);
    tq_release(&q);
}

/* Blocks: partial ones at the right and bottom edges take their own elements' maximum, and a
 * stacked [2, 100, 64] tensor has its own block rows per matrix (2 x ceil(100 / 64)). */
static void fp8_partial_blocks_stay_inside_their_matrix(void **state)
{
    (void)state;
    const int64_t rows = 200, cols = 300;
    float *x = calloc((size_t)(rows * cols), sizeof(float));
    for (int64_t i = 0; i < rows * cols; i++)
        x[i] = 0.01f * test_normal();
    x[150 * cols + 299] = 44.8f; /* block (1, 2): 72 x 44 elements */
    struct test_q q;
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, rows, cols, QD_F32, ct_block), QD_OK);
    assert_int_equal(q.c[1].shape[0], 2);
    assert_int_equal(q.c[1].shape[1], 3);
    assert_true(f32_at(&q, 1, 5) == 44.8f / 448.0f);
    assert_true(f32_at(&q, 1, 2) < 0.01f);
    tq_release(&q);
    /* the same bytes as the matrices one by one */
    const int64_t m = 100, c = 64;
    float *y = malloc((size_t)(2 * m * c) * sizeof(float));
    for (int64_t i = 0; i < 2 * m * c; i++)
        y[i] = 0.01f * test_normal();
    y[(m + 70) * c + 3] = 9.0f; /* matrix 1, block row 1 */
    const char *const b64[] = {"granularity=block", "block=64x64", NULL};
    assert_int_equal(test_quantize(&q, "fp8_e4m3", y, 2 * m, c, QD_BF16, b64), QD_OK);
    struct test_q s; /* stacked: [2, 100, 64] */
    memset(&s, 0, sizeof s);
    const struct qd_format *f = qd_format_find("fp8_e4m3");
    s.p = q.p;
    s.p.scale_dtype = QD_SCALE_AUTO;
    int64_t shape[3] = {2, m, c};
    assert_int_equal(qd_tensor_set_shape(&s.in, 3, shape), QD_OK);
    s.in.dtype = QD_BF16;
    s.n = qd_format_layout(f, &s.p, &s.in, s.c, s.err, sizeof s.err);
    assert_int_equal(s.n, 2);
    assert_int_equal(s.c[1].shape[0], 4); /* 2 matrices x 2 block rows */
    assert_int_equal(q.c[1].shape[0], 4); /* [200, 64] 2-D: ceil(200 / 64) = 4 too, other rows */
    s.in.data = test_encode(y, 2 * m * c, QD_BF16);
    for (int i = 0; i < 2; i++)
        s.buf[i] = malloc((size_t)s.c[i].bytes);
    assert_int_equal(qd_quantize(QD_BACKEND_CPU, f, &s.in, &s.p, s.buf, s.err, sizeof s.err), QD_OK);
    /* matrix 1's second block row is rows 164..199: the 9.0 sits there (row 170) */
    assert_int_equal(((uint16_t *)s.buf[1])[3], qd_f32_to_bf16(9.0f / 448.0f));
    /* 2-D, blocks run 192..199 for the last: row 170 is in block row 2 */
    assert_int_equal(((uint16_t *)q.buf[1])[2], qd_f32_to_bf16(9.0f / 448.0f));
    for (int i = 0; i < 2; i++)
        free(s.buf[i]);
    free(s.in.data);
    tq_release(&q);
    free(x);
    free(y);
}

/* The CPU's threads split blocks at block rows (a single matrix's short last one included) or,
 * for a stack of matrices whose rows are not a multiple of the block's, at matrices: the bytes
 * are the same on one thread and on two. */
static void fp8_block_bytes_do_not_depend_on_threads(void **state)
{
    (void)state;
    const int64_t shapes[][3] = {{1, 1000, 520}, {3, 100, 1000}};
    const char *const b64[] = {"granularity=block", "block=64x64", NULL};
    const int saved = qd_cpu_threads();
    for (int si = 0; si < 2; si++) {
        const int64_t n = shapes[si][0] * shapes[si][1] * shapes[si][2];
        float *x = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++)
            x[i] = 0.02f * test_normal();
        struct test_q one, two;
        qd_cpu_set_threads(1);
        assert_int_equal(test_quantize(&one, "fp8_e4m3", x, shapes[si][0] * shapes[si][1], shapes[si][2], QD_BF16,
                                       si ? b64 : ct_block), QD_OK);
        qd_cpu_set_threads(2);
        assert_int_equal(test_quantize(&two, "fp8_e4m3", x, shapes[si][0] * shapes[si][1], shapes[si][2], QD_BF16,
                                       si ? b64 : ct_block), QD_OK);
        if (si) { /* as a stack: [3, 100, 1000], blocks per matrix, on one thread and on two */
            const struct qd_format *f = qd_format_find("fp8_e4m3");
            for (int t = 1; t <= 2; t++) {
                struct test_q *q = t == 1 ? &one : &two;
                qd_cpu_set_threads(t);
                q->p.scale_dtype = QD_SCALE_AUTO;
                assert_int_equal(qd_tensor_set_shape(&q->in, 3, shapes[si]), QD_OK);
                assert_int_equal(qd_format_layout(f, &q->p, &q->in, q->c, q->err, sizeof q->err), 2);
                for (int c = 0; c < 2; c++) {
                    free(q->buf[c]);
                    q->buf[c] = malloc((size_t)q->c[c].bytes);
                    memset(q->buf[c], 0xa5 + t, (size_t)q->c[c].bytes);
                }
                assert_int_equal(qd_quantize(QD_BACKEND_CPU, f, &q->in, &q->p, q->buf, q->err, sizeof q->err), QD_OK);
            }
            assert_int_equal(one.c[1].shape[0], 3 * 2);
        }
        for (int c = 0; c < 2; c++) {
            assert_int_equal(one.c[c].bytes, two.c[c].bytes);
            assert_memory_equal(one.buf[c], two.buf[c], (size_t)one.c[c].bytes);
        }
        tq_release(&one);
        tq_release(&two);
        free(x);
    }
    qd_cpu_set_threads(saved);
}

/* W8A8: scale amax / 127.5 in the dtype; -amax is code -128, +amax clamps to 127; ties to even. */
static void w8a8_codes_span_minus_128_to_127(void **state)
{
    (void)state;
    float x[8] = {-127.5f * 0x1p-7f, 127.5f * 0x1p-7f, 0.5f * 0x1p-7f, 1.5f * 0x1p-7f, -2.5f * 0x1p-7f, 0, 0, 0};
    const int8_t want[] = {-128, 127, 0, 2, -2, 0, 0, 0};
    for (int d = 0; d < 3; d++) {
        const enum qd_dtype dt = d == 0 ? QD_F32 : d == 1 ? QD_F16 : QD_BF16;
        struct test_q q;
        assert_int_equal(test_quantize(&q, "w8a8", x, 1, 8, dt, NULL), QD_OK);
        assert_int_equal(q.c[0].dtype, QD_I8);
        assert_int_equal(q.c[1].shape[0], 1);
        assert_int_equal(q.c[1].shape[1], 1);
        for (int i = 0; i < 8; i++)
            assert_int_equal(((int8_t *)q.buf[0])[i], want[i]);
        float *y = test_dequantize(&q, "w8a8", QD_F32);
        assert_true(y[0] == -1.0f);
        assert_true(y[1] == 127 * 0x1p-7f);
        free(y);
        tq_release(&q);
    }
}

/* Dequantize multiplies in the scale's dtype (compressed-tensors' x_q.to(scale.dtype) * scale):
 * an f32 output holds the bf16 product, not the exact one. */
static void dequantize_rounds_to_the_scale_dtype(void **state)
{
    (void)state;
    /* bf16 scale 1.0078125 (451.5 is 452 in bf16; 452 / 448 rounds to it), code 1.125, whose product
     * with it, 1.1337890625, bf16 rounds to 1.1328125 */
    float x[2] = {451.5f, 1.125f * 1.0078125f};
    struct test_q q;
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 1, 2, QD_BF16, NULL), QD_OK);
    assert_int_equal(half_at(&q, 1, 0), qd_f32_to_bf16(1.0078125f));
    assert_int_equal(code_at(&q, 1), 0x39);
    float *y = test_dequantize(&q, "fp8_e4m3", QD_F32);
    assert_true(y[1] == qd_bf16_to_f32(qd_f32_to_bf16(1.125f * 1.0078125f)));
    assert_true(y[1] != 1.125f * 1.0078125f);
    free(y);
    tq_release(&q);
    /* transformers: f32 product, weight_scale_inv read as given */
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 1, 2, QD_BF16, tf_channel), QD_OK);
    y = test_dequantize(&q, "fp8_e4m3", QD_F32);
    assert_true(y[1] == qd_e4m3_to_f32(code_at(&q, 1)) * f32_at(&q, 1, 0));
    free(y);
    tq_release(&q);
}

/* Per tensor: one scale, from the whole tensor's largest |x|. */
static void fp8_tensor_scale_is_the_tensors(void **state)
{
    (void)state;
    float x[3 * 32];
    for (int i = 0; i < 96; i++)
        x[i] = 0.01f * test_normal();
    x[77] = -89.6f;
    struct test_q q;
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 3, 32, QD_F32, ct_tensor), QD_OK);
    assert_int_equal(q.c[1].ndim, 1);
    assert_int_equal(q.c[1].shape[0], 1);
    assert_true(f32_at(&q, 1, 0) == 89.6f / 448.0f);
    assert_int_equal(code_at(&q, 77), 0xfe);
    tq_release(&q);
    const char *const tf_tensor[] = {"flow=transformers", "granularity=tensor", NULL};
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 3, 32, QD_F32, tf_tensor), QD_OK);
    assert_true(f32_at(&q, 1, 0) == 1.0f / ((1.0f / 89.6f) * 448.0f));
    tq_release(&q);
}

/* What the two flows and the block parameter take, refused by name. */
static void fp8_params_are_checked(void **state)
{
    (void)state;
    const struct qd_format *f = qd_format_find("fp8_e4m3");
    struct qd_params p;
    char err[512];
    qd_params_default(f, &p);
    assert_int_equal(p.granularity, QD_GRAN_CHANNEL); /* the format's own defaults */
    assert_int_equal(p.flow, QD_FLOW_COMPRESSED_TENSORS);
    assert_int_equal(p.block_rows, 128);
    assert_int_equal(p.block_cols, 128);
    assert_int_equal(qd_params_set(f, &p, "block", "64x32", err, sizeof err), QD_OK);
    assert_int_equal(p.block_rows, 64);
    assert_int_equal(p.block_cols, 32);
    const char *bad[] = {"64", "0x5", "64x", "x64", "64x32x2", "-1x4", "16385x1", "ax4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(qd_params_set(f, &p, "block", bad[i], err, sizeof err), QD_EINVAL);
        assert_non_null(strstr(err, "ROWSxCOLS"));
    }
    float x[4 * 64] = {0};
    struct test_q q;
    const char *const big[] = {"granularity=block", "block=256x128", NULL};
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 4, 64, QD_F32, big), QD_ESHAPE);
    assert_non_null(strstr(q.err, "at most 16384"));
    const char *const row[] = {"granularity=row", NULL};
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 4, 64, QD_F32, row), QD_ESHAPE);
    assert_non_null(strstr(q.err, "channel"));
    const char *const torchao[] = {"flow=torchao", NULL};
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 4, 64, QD_F32, torchao), QD_ESHAPE);
    const char *const tf_bf16[] = {"flow=transformers", "scale_dtype=bf16", NULL};
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 4, 64, QD_F32, tf_bf16), QD_ESHAPE);
    assert_non_null(strstr(q.err, "f32"));
    const char *const nv_tf[] = {"flow=transformers", NULL};
    assert_int_equal(test_quantize(&q, "nvfp4", x, 4, 64, QD_F32, nv_tf), QD_ESHAPE);
    const char *const int8_block[] = {"granularity=block", NULL};
    assert_int_equal(test_quantize(&q, "int8", x, 4, 64, QD_F32, int8_block), QD_ESHAPE);
    /* compressed-tensors computes in the weight's dtype: another scale_dtype is refused */
    const char *const ct_f16[] = {"scale_dtype=f16", NULL};
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 4, 64, QD_BF16, ct_f16), QD_EINVAL);
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 4, 64, QD_F16, ct_f16), QD_OK);
    tq_release(&q);
    assert_int_equal(test_quantize(&q, "fp8_e4m3", x, 4, 64, QD_BF16, tf_block), QD_OK);
    assert_int_equal(q.p.scale_dtype, QD_SCALE_F32);
    tq_release(&q);
}

int main(void)
{
    test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp8_zero_rows_get_eps_or_one),
        cmocka_unit_test(fp8_ties_round_to_even),
        cmocka_unit_test(fp8_negative_zero_is_code_0_for_compressed_tensors),
        cmocka_unit_test(ct_codes_come_from_the_f32_quotient),
        cmocka_unit_test(fp8_saturates_at_448),
        cmocka_unit_test(fp8_transformers_infinite_scale),
        cmocka_unit_test(fp8_partial_blocks_stay_inside_their_matrix),
        cmocka_unit_test(fp8_block_bytes_do_not_depend_on_threads),
        cmocka_unit_test(w8a8_codes_span_minus_128_to_127),
        cmocka_unit_test(dequantize_rounds_to_the_scale_dtype),
        cmocka_unit_test(fp8_tensor_scale_is_the_tensors),
        cmocka_unit_test(fp8_params_are_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
