/* kernels/cpu/moe.c, a mixture of experts' ops: the routing against a reference written from
 * build_moe_ffn's definition (probabilities, the n_used largest by a full sort, their weights,
 * renormalised or not, scaled), the choice bias that ranks without weighing, ties to the lower
 * index, group-limited routing; the weighted sum in slot order; the shared expert's sigmoid gate. */
#include <math.h>

#include "../../kernels/nn.h"
#include "helpers.h"

/* the reference's ranking: every expert sorted by score, descending, ties by index */
static void sort_desc(int32_t *order, const double *score, int n)
{
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && (score[order[j]] > score[order[j - 1]] ||
                                  (score[order[j]] == score[order[j - 1]] && order[j] < order[j - 1]));
             j--) {
            int32_t tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
}

static void route_matches_sorted_probabilities(void **state)
{
    (void)state;
    test_seed();
    enum { T = 37, N_EXPERT = 12 };
    const int useds[] = {1, 2, 4, 12};
    float bias[N_EXPERT];
    for (int e = 0; e < N_EXPERT; e++)
        bias[e] = test_normal() * 0.5f;
    for (int func = 0; func < 2; func++)
        for (int norm = 0; norm < 2; norm++)
            for (int with_bias = 0; with_bias < 2; with_bias++)
                for (size_t u = 0; u < sizeof useds / sizeof *useds; u++) {
                    const int k = useds[u];
                    const struct qd_nn_moe_gating g = {.func = func ? QD_MOE_SIGMOID : QD_MOE_SOFTMAX, .norm_w = norm,
                                                       .w_scale = norm ? 2.5f : 0.0f,
                                                       .bias = with_bias ? bias : NULL};
                    float logits[T * N_EXPERT], raw[T * N_EXPERT], w[T * N_EXPERT];
                    int32_t ids[T * N_EXPERT];
                    for (int i = 0; i < T * N_EXPERT; i++)
                        raw[i] = logits[i] = test_normal() * 2.0f;
                    qd_nn_moe_route(ids, w, logits, T, N_EXPERT, k, &g);
                    for (int t = 0; t < T; t++) {
                        double p[N_EXPERT], score[N_EXPERT], max = -INFINITY, sum = 0;
                        for (int e = 0; e < N_EXPERT; e++)
                            max = fmax(max, raw[t * N_EXPERT + e]);
                        for (int e = 0; e < N_EXPERT; e++) {
                            const double x = raw[t * N_EXPERT + e];
                            p[e] = func ? 1.0 / (1.0 + exp(-x)) : exp(x - max);
                            sum += p[e];
                        }
                        for (int e = 0; e < N_EXPERT; e++) {
                            p[e] = func ? p[e] : p[e] / sum;
                            assert_true(fabs(logits[t * N_EXPERT + e] - p[e]) <= 1e-6);
                            score[e] = (double)logits[t * N_EXPERT + e] + (with_bias ? bias[e] : 0.0);
                        }
                        int32_t order[N_EXPERT];
                        sort_desc(order, score, N_EXPERT);
                        double wsum = 0;
                        for (int j = 0; j < k; j++)
                            wsum += p[order[j]];
                        /* the sum's floor (f16's smallest normal): a bias can choose an expert
                         * whose probability is below it */
                        wsum = wsum < 6.103515625e-5 ? 6.103515625e-5 : wsum;
                        for (int j = 0; j < k; j++) {
                            assert_int_equal(ids[t * k + j], order[j]);
                            const double ref = norm ? p[order[j]] / wsum * 2.5 : p[order[j]];
                            if (fabs(w[t * k + j] - ref) > 1e-6 * fabs(ref) + 1e-7)
                                fail_msg("func %d norm %d bias %d k %d token %d slot %d: %.9g vs %.9g", func, norm,
                                         with_bias, k, t, j, w[t * k + j], ref);
                        }
                    }
                }
}

static void route_breaks_ties_by_lower_index_and_bias_only_ranks(void **state)
{
    (void)state;
    /* experts 1, 3 and 5 tie at the top; the bias lifts expert 0 above them for the choice */
    float logits[6] = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f, 2.0f}, w[3];
    int32_t ids[3];
    struct qd_nn_moe_gating g = {.func = QD_MOE_SOFTMAX};
    qd_nn_moe_route(ids, w, logits, 1, 6, 3, &g);
    assert_int_equal(ids[0], 1), assert_int_equal(ids[1], 3), assert_int_equal(ids[2], 5);
    assert_true(w[0] == w[1] && w[1] == w[2]);
    float again[6] = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f, 2.0f};
    const float bias[6] = {10.0f, 0, 0, 0, 0, 0};
    g.bias = bias;
    qd_nn_moe_route(ids, w, again, 1, 6, 3, &g);
    assert_int_equal(ids[0], 0), assert_int_equal(ids[1], 1), assert_int_equal(ids[2], 3);
    /* the weight is expert 0's probability, not its biased score */
    assert_true(w[0] == again[0] && w[0] < 0.1f);
}

static void route_renormalises_with_a_floor(void **state)
{
    (void)state;
    /* sigmoids of very negative logits: their sum is clamped at f16's smallest normal */
    float logits[4] = {-30.0f, -31.0f, -32.0f, -33.0f}, w[2];
    int32_t ids[2];
    const struct qd_nn_moe_gating g = {.func = QD_MOE_SIGMOID, .norm_w = 1};
    qd_nn_moe_route(ids, w, logits, 1, 4, 2, &g);
    assert_int_equal(ids[0], 0), assert_int_equal(ids[1], 1);
    const float s0 = 1.0f / (1.0f + expf(30.0f)), s1 = 1.0f / (1.0f + expf(31.0f));
    assert_true(w[0] == s0 / 6.103515625e-5f);
    assert_true(w[1] == s1 / 6.103515625e-5f);
}

static void route_keeps_to_the_best_groups(void **state)
{
    (void)state;
    /* 8 experts in 4 groups of 2; groups scored by their two best: g0 0.9+0.0, g1 0.5+0.5,
     * g2 0.8+0.3, g3 0.2+0.1. The best two groups are g2 (1.1) and g1 (1.0): expert 0 (the best
     * alone) is out */
    float logits[8] = {0.9f, 0.0f, 0.5f, 0.5f, 0.8f, 0.3f, 0.2f, 0.1f}, w[3];
    int32_t ids[3];
    const struct qd_nn_moe_gating g = {.func = QD_MOE_SIGMOID, .n_group = 4, .n_group_used = 2};
    /* the logits as sigmoid inputs that give those probabilities */
    for (int e = 0; e < 8; e++)
        logits[e] = logf(logits[e] / (1.0f - logits[e] + 1e-30f) + 1e-30f);
    qd_nn_moe_route(ids, w, logits, 1, 8, 3, &g);
    assert_int_equal(ids[0], 4);
    assert_true((ids[1] == 2 && ids[2] == 3) || (ids[1] == 3 && ids[2] == 2));
    /* without groups expert 0 leads */
    const struct qd_nn_moe_gating plain = {.func = QD_MOE_SIGMOID};
    float again[8] = {0.9f, 0.0f, 0.5f, 0.5f, 0.8f, 0.3f, 0.2f, 0.1f};
    for (int e = 0; e < 8; e++)
        again[e] = logf(again[e] / (1.0f - again[e] + 1e-30f) + 1e-30f);
    qd_nn_moe_route(ids, w, again, 1, 8, 3, &plain);
    assert_int_equal(ids[0], 0);
}

static void sum_adds_weighted_slots_in_order(void **state)
{
    (void)state;
    test_seed();
    enum { T = 5, K = 3, N = 19 };
    float e[T * K * N], w[T * K], out[T * N];
    for (int i = 0; i < T * K * N; i++)
        e[i] = test_normal();
    for (int i = 0; i < T * K; i++)
        w[i] = (float)test_uniform();
    qd_nn_moe_sum(out, e, w, T, K, N);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N; i++) {
            /* f32 products, f32 sums, slot 0 first: bit for bit */
            volatile float acc = e[(t * K + 0) * N + i] * w[t * K + 0];
            for (int j = 1; j < K; j++) {
                volatile float product = e[(t * K + j) * N + i] * w[t * K + j];
                acc = acc + product;
            }
            assert_true(out[t * N + i] == acc);
        }
}

static void sigmoid_gate_scales_each_row(void **state)
{
    (void)state;
    float y[3 * 4], g[3] = {-2.0f, 0.5f, 7.0f};
    for (int i = 0; i < 12; i++)
        y[i] = (float)(i + 1);
    qd_nn_sigmoid_gate(y, g, 3, 4);
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4; i++) {
            const double ref = (t * 4 + i + 1) / (1.0 + exp(-(double)g[t]));
            assert_true(fabs(y[t * 4 + i] - ref) <= 1e-6 * fabs(ref));
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(route_matches_sorted_probabilities),
        cmocka_unit_test(route_breaks_ties_by_lower_index_and_bias_only_ranks),
        cmocka_unit_test(route_renormalises_with_a_floor),
        cmocka_unit_test(route_keeps_to_the_best_groups),
        cmocka_unit_test(sum_adds_weighted_slots_in_order),
        cmocka_unit_test(sigmoid_gate_scales_each_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
