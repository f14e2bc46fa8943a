/* kernels/cpu/nn.c, the transformer ops on the CPU: each against a plain double-precision
 * reference written from its definition (ggml's op), on awkward sizes (rows that are not whole
 * 8-lanes, tiles cut short, K across several blocks), and the properties the engine relies on: a
 * token's matmul row does not depend on which other tokens share the batch or on the thread
 * count; rope at position 0 is the identity; attention over one position returns its value
 * (with a sliding window of one, every position). */
#include "../../kernels/cpu/cpu.h"
#include "../../kernels/fp.h"
#include "../../kernels/nn.h"
#include "helpers.h"

static float *randn(int64_t n, float scale)
{
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = test_normal() * scale;
    return x;
}

static void matmul_matches_double_reference(void **state)
{
    (void)state;
    test_seed();
    const int64_t Ts[] = {1, 3, 5, 67, 130}, Ks[] = {1, 7, 8, 64, 600, 1030}, Ns[] = {1, 2, 3, 50, 97};
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 6; b++)
            for (size_t c = 0; c < 5; c++) {
                const int64_t T = Ts[a], K = Ks[b], N = Ns[c];
                float *x = randn(T * K, 1.0f), *w = randn(N * K, 0.05f), *y = malloc((size_t)(T * N) * sizeof *y);
                qd_nn_matmul(y, x, w, T, K, N);
                for (int64_t t = 0; t < T; t++)
                    for (int64_t n = 0; n < N; n++) {
                        double ref = 0, mag = 0;
                        for (int64_t k = 0; k < K; k++) {
                            ref += (double)x[t * K + k] * w[n * K + k];
                            mag += fabs((double)x[t * K + k] * w[n * K + k]);
                        }
                        /* f32 accumulation: within a few ulps of the sum of magnitudes */
                        if (fabs(y[t * N + n] - ref) > 1e-6 * mag + 1e-30) {
                            fail_msg("T=%lld K=%lld N=%lld at [%lld][%lld]: %.9g vs %.9g", (long long)T, (long long)K,
                                     (long long)N, (long long)t, (long long)n, y[t * N + n], ref);
                        }
                    }
                free(x), free(w), free(y);
            }
}

static void matmul_row_does_not_depend_on_the_batch_or_threads(void **state)
{
    (void)state;
    test_seed();
    const int64_t T = 77, K = 1100, N = 101;
    float *x = randn(T * K, 1.0f), *w = randn(N * K, 0.02f);
    float *all = malloc((size_t)(T * N) * sizeof *all), *one = malloc((size_t)N * sizeof *one);
    qd_nn_set_threads(2);
    qd_nn_matmul(all, x, w, T, K, N);
    qd_nn_set_threads(1);
    for (int64_t t = 0; t < T; t++) {
        qd_nn_matmul(one, x + t * K, w, 1, K, N);
        assert_memory_equal(one, all + t * N, (size_t)N * sizeof *one);
    }
    qd_nn_set_threads(0);
    free(x), free(w), free(all), free(one);
}

/* The CPU backend's matmul on a matrix bound as the file stores it (f16, bf16, or f32 bytes at
 * another address) equals the f32 matmul on its widened copy bit for bit: the values widen
 * exactly as they load; slices (a fused weight's rows, an expert) map inside the binding. */
static void matmul_on_16_bit_weights_equals_their_f32_copy(void **state)
{
    (void)state;
    test_seed();
    const int64_t T = 37, K = 1027, N = 53; /* K: a tail past the lanes */
    float *x = randn(T * K, 1.0f), *w = randn(2 * N * K, 0.05f);
    float *key = malloc((size_t)(2 * N * K) * sizeof *key); /* the address the ops are handed, never read */
    uint16_t *h = malloc((size_t)(2 * N * K) * 2);
    float *wide = malloc((size_t)(2 * N * K) * sizeof *wide), *want = malloc((size_t)(T * N) * sizeof *want);
    float *got = malloc((size_t)(T * N) * sizeof *got);
    const enum qd_dtype types[3] = {QD_F16, QD_BF16, QD_F32};
    for (int t = 0; t < 3; t++) {
        for (int64_t i = 0; i < 2 * N * K; i++) {
            h[i] = types[t] == QD_F16 ? qd_f32_to_f16(w[i]) : qd_f32_to_bf16(w[i]);
            wide[i] = types[t] == QD_F32 ? w[i] : types[t] == QD_F16 ? qd_f16_to_f32(h[i]) : qd_bf16_to_f32(h[i]);
            key[i] = NAN;
        }
        assert_int_equal(qd_nn_cpu.bind(key, 2 * N * K, QD_NN_MATRIX, types[t] == QD_F32 ? (const void *)wide : h,
                                         types[t]), QD_OK);
        for (int half = 0; half < 2; half++) { /* the second half: a slice inside the binding */
            qd_nn_matmul(want, x, wide + half * N * K, T, K, N);
            qd_nn_cpu.matmul(got, x, key + half * N * K, T, K, N);
            assert_memory_equal(got, want, (size_t)(T * N) * sizeof *got);
        }
        qd_nn_cpu.unbind(key);
        for (int64_t i = 0; i < 2 * N * K; i++) /* unbound: the handed address itself is read */
            key[i] = wide[i];
        qd_nn_cpu.matmul(got, x, key, T, K, N);
        qd_nn_matmul(want, x, wide, T, K, N);
        assert_memory_equal(got, want, (size_t)(T * N) * sizeof *got);
    }
    free(x), free(w), free(key), free(h), free(wide), free(want), free(got);
}

static void rms_norm_matches_its_definition(void **state)
{
    (void)state;
    test_seed();
    const int64_t rows = 9, n = 333;
    float *x = randn(rows * n, 3.0f), *w = randn(n, 1.0f), *y = malloc((size_t)(rows * n) * sizeof *y);
    qd_nn_rms_norm(y, x, w, rows, n, 1e-5f);
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++)
            ss += (double)x[r * n + i] * x[r * n + i];
        const double scale = 1.0 / sqrt(ss / n + 1e-5);
        for (int64_t i = 0; i < n; i++)
            assert_true(fabs(y[r * n + i] - x[r * n + i] * scale * w[i]) <= 1e-6 * fabs(x[r * n + i] * scale * w[i]) + 1e-7);
    }
    /* in place gives the same bits */
    float *z = malloc((size_t)(rows * n) * sizeof *z);
    memcpy(z, x, (size_t)(rows * n) * sizeof *z);
    qd_nn_rms_norm(z, z, w, rows, n, 1e-5f);
    assert_memory_equal(z, y, (size_t)(rows * n) * sizeof *z);
    free(x), free(w), free(y), free(z);
}

/* rope in double: pair (a, b) rotated by pos * base^(-2i/n_rot) / factor[i] */
static void rope_reference(double *x, int head_dim, int n_rot, int neox, int pos, float base, const float *ff)
{
    for (int i = 0; i < n_rot / 2; i++) {
        const double theta = pos * pow(base, -2.0 * i / n_rot) / (ff ? ff[i] : 1.0);
        double *a = neox ? &x[i] : &x[2 * i], *b = neox ? &x[i + n_rot / 2] : &x[2 * i + 1];
        const double x0 = *a, x1 = *b;
        *a = x0 * cos(theta) - x1 * sin(theta);
        *b = x0 * sin(theta) + x1 * cos(theta);
    }
    (void)head_dim;
}

static void rope_normal_and_neox_rotate_their_pairs(void **state)
{
    (void)state;
    test_seed();
    const int T = 40, n_head = 3, head_dim = 16;
    float ff[8];
    for (int i = 0; i < 8; i++)
        ff[i] = 1.0f + (float)i;
    for (int kind = 0; kind < 2; kind++)
        for (int with_ff = 0; with_ff < 2; with_ff++) {
            const int64_t stride = n_head * head_dim + 5; /* rows wider than the heads (a fused qkv's view) */
            float *x = randn(T * stride, 1.0f), *orig = malloc((size_t)(T * stride) * sizeof *orig);
            memcpy(orig, x, (size_t)(T * stride) * sizeof *x);
            int32_t pos[40];
            for (int t = 0; t < T; t++)
                pos[t] = t * 7;
            struct qd_nn_rope r = {.kind = kind ? QD_ROPE_NEOX : QD_ROPE_NORMAL, .n_rot = head_dim, .freq_base = 10000.0f,
                                   .freq_scale = 1.0f, .attn_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f,
                                   .n_ctx_orig = 4096, .freq_factors = with_ff ? ff : NULL};
            assert_int_equal(qd_nn_rope(x, T, stride, n_head, head_dim, pos, &r), QD_OK);
            for (int t = 0; t < T; t++) {
                for (int h = 0; h < n_head; h++) {
                    double ref[16];
                    for (int i = 0; i < head_dim; i++)
                        ref[i] = orig[t * stride + h * head_dim + i];
                    rope_reference(ref, head_dim, head_dim, kind, pos[t], 10000.0f, with_ff ? ff : NULL);
                    for (int i = 0; i < head_dim; i++)
                        assert_true(fabs(x[t * stride + h * head_dim + i] - ref[i]) < 2e-4 * (1 + fabs(ref[i])));
                }
                /* the values past the heads are untouched */
                assert_memory_equal(x + t * stride + n_head * head_dim, orig + t * stride + n_head * head_dim,
                                    5 * sizeof *x);
            }
            /* position 0 is the identity */
            assert_memory_equal(x, orig, (size_t)(n_head * head_dim) * sizeof *x);
            free(x), free(orig);
        }
}

/* The attention of a, in double from its definition: scores q.k, soft-capped where a says, times
 * the scale, softmax over the positions the causal mask and the window leave. */
static void attention_check(const struct qd_nn_attn *a, uint64_t seed_note)
{
    const int T = (int)a->T, n_head = a->n_head, n_kv = a->n_head_kv, dk = a->head_dim_k, dv = a->head_dim_v;
    float *q = randn(T * n_head * dk, 2.0f), *k = randn(T * n_kv * dk, 2.0f), *v = randn(T * n_kv * dv, 1.0f);
    float *out = malloc((size_t)(T * n_head * dv) * sizeof *out);
    double *s = malloc((size_t)T * sizeof *s);
    qd_nn_set_threads(2);
    assert_int_equal(qd_nn_attention(out, q, k, v, a), QD_OK);
    qd_nn_set_threads(0);
    for (int h = 0; h < n_head; h++) {
        const int hk = h / (n_head / n_kv);
        for (int i = 0; i < T; i++) {
            const int first = a->window > 0 && i - a->window + 1 > 0 ? i - (int)a->window + 1 : 0;
            double max = -1e300, sum = 0;
            for (int t = first; t <= i; t++) {
                s[t] = 0;
                for (int d = 0; d < dk; d++)
                    s[t] += (double)q[i * n_head * dk + h * dk + d] * k[t * n_kv * dk + hk * dk + d];
                if (a->softcap > 0)
                    s[t] = a->softcap * tanh(s[t] / a->softcap);
                s[t] *= a->scale;
                max = s[t] > max ? s[t] : max;
            }
            for (int t = first; t <= i; t++)
                sum += s[t] = exp(s[t] - max);
            for (int d = 0; d < dv; d++) {
                double o = 0;
                for (int t = first; t <= i; t++)
                    o += s[t] / sum * v[t * n_kv * dv + hk * dv + d];
                if (fabs(out[i * n_head * dv + h * dv + d] - o) >= 1e-5)
                    fail_msg("case %llu head %d row %d dim %d: %.9g vs %.9g", (unsigned long long)seed_note, h, i, d,
                             out[i * n_head * dv + h * dv + d], o);
            }
        }
    }
    /* the first position attends to itself alone: its value, exactly (p = 1) */
    for (int h = 0; h < n_head; h++)
        assert_memory_equal(out + h * dv, v + h / (n_head / n_kv) * dv, (size_t)dv * sizeof *out);
    free(q), free(k), free(v), free(out), free(s);
}

static void attention_matches_causal_softmax_with_gqa(void **state)
{
    (void)state;
    test_seed();
    const int T = 37, n_head = 6, n_kv = 2, dk = 12, dv = 20;
    const struct qd_nn_attn a = {.T = T, .n_head = n_head, .n_head_kv = n_kv, .head_dim_k = dk, .head_dim_v = dv,
                                 .q_stride = n_head * dk, .k_stride = n_kv * dk, .v_stride = n_kv * dv,
                                 .scale = 1.0f / sqrtf((float)dk)};
    attention_check(&a, 0);
}

/* Gemma's: a sliding window shorter than the chunk (and one of a single position: each token
 * sees itself only, so its output is its own value), scores soft-capped at a cap they exceed
 * (q and k of 2: raw scores of some tens against a cap of 3), a scale of 1 (q scaled before) */
static void attention_window_and_softcap_match_their_definition(void **state)
{
    (void)state;
    test_seed();
    const int T = 45, n_head = 4, n_kv = 2, dk = 16, dv = 8;
    const int64_t windows[] = {0, 1, 8, 33, 45, 100};
    const float caps[] = {0.0f, 3.0f};
    for (size_t w = 0; w < sizeof windows / sizeof *windows; w++)
        for (size_t c = 0; c < 2; c++) {
            const struct qd_nn_attn a = {.T = T, .n_head = n_head, .n_head_kv = n_kv, .head_dim_k = dk,
                                         .head_dim_v = dv, .q_stride = n_head * dk, .k_stride = n_kv * dk,
                                         .v_stride = n_kv * dv, .scale = c ? 1.0f : 0.25f, .softcap = caps[c],
                                         .window = windows[w]};
            attention_check(&a, w * 2 + c);
        }
    /* a window of one: every row its own value */
    const struct qd_nn_attn one = {.T = 20, .n_head = 2, .n_head_kv = 2, .head_dim_k = 8, .head_dim_v = 8,
                                   .q_stride = 16, .k_stride = 16, .v_stride = 16, .scale = 1.0f, .window = 1};
    float *q = randn(20 * 16, 2.0f), *k = randn(20 * 16, 2.0f), *v = randn(20 * 16, 1.0f), out[20 * 16];
    assert_int_equal(qd_nn_attention(out, q, k, v, &one), QD_OK);
    assert_memory_equal(out, v, sizeof out);
    free(q), free(k), free(v);
}

/* gelu's tanh approximation in double */
static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x))); }

/* ggml's f16 table: the result is an f16 value within half an f16 step of gelu at the input's f16
 * value, the same for every input that rounds to that f16 value; exact (x, 0) beyond +-10. */
static void geglu_reads_gelu_as_ggmls_f16_table(void **state)
{
    (void)state;
    test_seed();
    const int64_t n = 20000;
    float *g = randn(n, 4.0f), *u = malloc((size_t)n * sizeof *u), *o = malloc((size_t)n * sizeof *o);
    float *g16 = malloc((size_t)n * sizeof *g16), *o16 = malloc((size_t)n * sizeof *o16);
    g[0] = 10.0f, g[1] = 123.5f, g[2] = -10.0f, g[3] = -55.0f, g[4] = 9.99f, g[5] = -9.99f;
    for (int64_t i = 0; i < n; i++) {
        u[i] = 1.0f;
        g16[i] = qd_f16_to_f32(qd_f32_to_f16(g[i]));
    }
    qd_nn_glu(o, g, u, n, QD_GLU_GELU);
    qd_nn_glu(o16, g16, u, n, QD_GLU_GELU);
    assert_true(o[0] == 10.0f && o[1] == 123.5f && o[2] == 0.0f && o[3] == 0.0f);
    for (int64_t i = 4; i < n; i++) {
        if (fabsf(g[i]) >= 10.0f)
            continue;
        assert_true(o[i] == o16[i]);                              /* one result per f16 input */
        assert_true(qd_f16_to_f32(qd_f32_to_f16(o[i])) == o[i]); /* an f16 value */
        const double ref = gelu_ref(g16[i]);
        /* half an f16 step of the result (2^-11 relative; subnormals' step 2^-24), plus f32's
         * own error where 1 + tanh cancels for negative inputs (an f32 step of 1, times x / 2) */
        const double bound = fabs(ref) * (1.0 / 2048) + 3e-8 + 0.5 * fabs(g16[i]) * 1.2e-7;
        if (fabs(o[i] - ref) > bound)
            fail_msg("gelu(%.9g) = %.9g, want %.9g", g16[i], o[i], ref);
    }
    /* the one entry of ggml_table_gelu_f16 (read from ggml-cpu's own table) that gelu without
     * the fused multiply-add ggml-cpu.c is compiled with misses: f16 0xbfff (-1.99902344) gives
     * f16 0xa9d3, not 0xa9d2 */
    const float at = qd_f16_to_f32(0xbfff), one = 1.0f;
    float got;
    qd_nn_glu(&got, &at, &one, 1, QD_GLU_GELU);
    assert_int_equal(qd_f32_to_f16(got), 0xa9d3);
    /* times up */
    for (int64_t i = 0; i < n; i++)
        u[i] = (float)(i % 7) - 3.0f;
    qd_nn_glu(o16, g, u, n, QD_GLU_GELU);
    for (int64_t i = 0; i < n; i++)
        assert_true(o16[i] == o[i] * u[i]);
    free(g), free(u), free(o), free(g16), free(o16);
}

static void softcap_and_scale_match_their_definitions(void **state)
{
    (void)state;
    test_seed();
    const int64_t n = 5000;
    float *x = randn(n, 20.0f), *y = malloc((size_t)n * sizeof *y);
    memcpy(y, x, (size_t)n * sizeof *y);
    qd_nn_softcap(y, n, 6.0f);
    for (int64_t i = 0; i < n; i++) {
        const double ref = 6.0 * tanh(x[i] / 6.0);
        assert_true(fabs(y[i] - ref) <= 1e-6 * 6.0);
        assert_true(fabsf(y[i]) <= 6.0f);
    }
    memcpy(y, x, (size_t)n * sizeof *y);
    qd_nn_scale(y, n, 0.125f);
    for (int64_t i = 0; i < n; i++)
        assert_true(y[i] == x[i] * 0.125f);
    free(x), free(y);
}

static void swiglu_is_silu_times_up(void **state)
{
    (void)state;
    test_seed();
    const int64_t n = 1000;
    float *g = randn(n, 4.0f), *u = randn(n, 1.0f), *o = malloc((size_t)n * sizeof *o);
    qd_nn_glu(o, g, u, n, QD_GLU_SILU);
    for (int64_t i = 0; i < n; i++) {
        const double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        assert_true(fabs(o[i] - ref) <= 1e-6 * fabs(ref) + 1e-7);
    }
    free(g), free(u), free(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matmul_matches_double_reference),
        cmocka_unit_test(matmul_row_does_not_depend_on_the_batch_or_threads),
        cmocka_unit_test(matmul_on_16_bit_weights_equals_their_f32_copy),
        cmocka_unit_test(rms_norm_matches_its_definition),
        cmocka_unit_test(rope_normal_and_neox_rotate_their_pairs),
        cmocka_unit_test(attention_matches_causal_softmax_with_gqa),
        cmocka_unit_test(swiglu_is_silu_times_up),
        cmocka_unit_test(attention_window_and_softcap_match_their_definition),
        cmocka_unit_test(geglu_reads_gelu_as_ggmls_f16_table),
        cmocka_unit_test(softcap_and_scale_match_their_definitions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
