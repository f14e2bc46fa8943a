/* Test helpers: random tensors, quantize/dequantize through the public API. */
#ifndef QD_TEST_HELPERS_H
#define QD_TEST_HELPERS_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "../../kernels/fp.h"
#include "../../kernels/quantize.h"

static uint64_t test_rng_state;

/* Fresh data every run: seeded from the clock unless QD_TEST_SEED is set (printed on failure). */
static inline void test_seed(void)
{
    const char *s = getenv("QD_TEST_SEED");
    test_rng_state = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) * 2654435761u + (uint64_t)clock();
    if (!test_rng_state)
        test_rng_state = 1;
    print_message("seed %llu\n", (unsigned long long)test_rng_state);
}

static inline double test_uniform(void)
{
    test_rng_state ^= test_rng_state << 13;
    test_rng_state ^= test_rng_state >> 7;
    test_rng_state ^= test_rng_state << 17;
    return (double)(test_rng_state >> 11) / 9007199254740992.0;
}

static inline float test_normal(void)
{
    double u = test_uniform(), v = test_uniform();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

/* 32 random bits */
static inline uint32_t test_rand32(void) { return (uint32_t)(test_uniform() * 4294967296.0); }

/* n importance values, one kind drawn for all of them: all ones, uniform, uniform with zeros,
 * all zero, tiny, huge, subnormal, or a mix of zeros, tiny and huge. */
static inline void test_fill_importance(float *qw, int n)
{
    const int kind = (int)(test_rand32() % 8);
    for (int i = 0; i < n; i++) {
        const float u = (float)test_uniform();
        qw[i] = kind == 0   ? 1.0f
                : kind == 1 ? u
                : kind == 2 ? (test_rand32() % 4 == 0 ? 0.0f : u)
                : kind == 3 ? 0.0f
                : kind == 4 ? 1e-30f * u
                : kind == 5 ? 1e30f * u
                : kind == 6 ? 1e-40f * u /* subnormal */
                            : (test_rand32() % 3 == 0 ? 0.0f : test_rand32() % 2 ? 1e-20f * u : 1e20f * u);
    }
}

/* v[0..n) to stderr in hex floats, 8 a line, under a heading: the data of a failing case */
static inline void test_dump(const char *what, const float *v, int n)
{
    fprintf(stderr, "%s:\n", what);
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%a%c", v[i], i % 8 == 7 ? '\n' : ' ');
}

/* A tensor of `dtype` holding the values of f32 array x (rounded to nearest even). */
static inline void *test_encode(const float *x, int64_t n, enum qd_dtype dt)
{
    void *p = malloc((size_t)n * qd_dtype_size(dt) + 1);
    for (int64_t i = 0; i < n; i++) {
        if (dt == QD_F32)
            ((float *)p)[i] = x[i];
        else if (dt == QD_F16)
            ((uint16_t *)p)[i] = qd_f32_to_f16(x[i]);
        else
            ((uint16_t *)p)[i] = qd_f32_to_bf16(x[i]);
    }
    return p;
}

static inline float test_decode(const void *p, int64_t i, enum qd_dtype dt)
{
    if (dt == QD_F32)
        return ((const float *)p)[i];
    if (dt == QD_F16)
        return qd_f16_to_f32(((const uint16_t *)p)[i]);
    return qd_bf16_to_f32(((const uint16_t *)p)[i]);
}

struct test_q {
    int n;
    struct qd_component c[QD_MAX_COMPONENTS];
    void *buf[QD_MAX_COMPONENTS];
    struct qd_params p;
    struct qd_tensor in;
    float *importance; /* all ones, for a format that needs one (iq2_xxs, iq2_xs) */
    char err[512];
};

/* Quantizes x (rows x cols, 1-D when rows == 0) as dtype with optional "k=v" params. */
static inline enum qd_status test_quantize(struct test_q *q, const char *fmt, const float *x,
                                           int64_t rows, int64_t cols, enum qd_dtype dt,
                                           const char *const *params)
{
    const struct qd_format *f = qd_format_find(fmt);
    assert_non_null(f);
    memset(q, 0, sizeof *q);
    qd_params_default(f, &q->p);
    for (int i = 0; params && params[i]; i++) {
        char key[64];
        const char *eq = strchr(params[i], '=');
        memcpy(key, params[i], (size_t)(eq - params[i]));
        key[eq - params[i]] = 0;
        assert_int_equal(qd_params_set(f, &q->p, key, eq + 1, q->err, sizeof q->err), QD_OK);
    }
    int64_t shape[2] = {rows, cols};
    assert_int_equal(rows ? qd_tensor_set_shape(&q->in, 2, shape)
                          : qd_tensor_set_shape(&q->in, 1, shape + 1), QD_OK);
    q->in.dtype = dt;
    q->n = qd_format_layout(f, &q->p, &q->in, q->c, q->err, sizeof q->err);
    if (q->n < 0)
        return QD_ESHAPE;
    int64_t numel = qd_tensor_numel(&q->in);
    q->in.data = test_encode(x, numel, dt);
    if (f->importance_required) {
        q->importance = malloc((size_t)q->in.cols * sizeof(float));
        for (int64_t i = 0; i < q->in.cols; i++)
            q->importance[i] = 1.0f;
        q->p.importance = q->importance;
        q->p.importance_n = q->in.cols;
    }
    for (int i = 0; i < q->n; i++) {
        q->buf[i] = malloc((size_t)q->c[i].bytes + 1);
        memset(q->buf[i], 0xA5, (size_t)q->c[i].bytes); /* poison: every byte must be written */
    }
    return qd_quantize(QD_BACKEND_CPU, f, &q->in, &q->p, q->buf, q->err, sizeof q->err);
}

/* Dequantizes q's components to f32. */
static inline float *test_dequantize(struct test_q *q, const char *fmt, enum qd_dtype out_dt)
{
    struct qd_tensor out = q->in;
    out.dtype = out_dt;
    int64_t n = qd_tensor_numel(&out);
    out.data = malloc((size_t)n * qd_dtype_size(out_dt));
    assert_int_equal(qd_dequantize(QD_BACKEND_CPU, qd_format_find(fmt), (const void *const *)q->buf,
                                   &q->p, &out, q->err, sizeof q->err), QD_OK);
    float *y = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        y[i] = test_decode(out.data, i, out_dt);
    free(out.data);
    return y;
}

static inline void tq_release(struct test_q *q)
{
    for (int i = 0; i < q->n; i++)
        free(q->buf[i]);
    free(q->in.data);
    free(q->importance);
    q->n = 0;
    q->in.data = NULL;
    q->importance = NULL;
}

#endif
