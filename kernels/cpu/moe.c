/* A mixture of experts' ops on the CPU in f32 (kernels/nn.h): the routing and the weighted sum
 * of the chosen experts, each in the order of llama.cpp's build_moe_ffn (src/llama-graph.cpp)
 * and the ggml CPU ops it is made of (soft_max, sigmoid, argsort_top_k, get_rows, sum_rows,
 * clamp, div, scale, mul, add). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../nn.h"

/* ggml_soft_max over one row: the exponentials' sum in double, then one f32 factor */
static void softmax_row(float *p, int n)
{
    float max = -INFINITY;
    for (int i = 0; i < n; i++)
        max = p[i] > max ? p[i] : max;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        p[i] = expf(p[i] - max);
        sum += (double)p[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        p[i] *= inv;
}

/* The n best of score[0..n) into id (descending, ties to the lower index). */
static void top_n(int32_t *id, const float *score, int n_all, int n)
{
    int kept = 0;
    for (int32_t e = 0; e < n_all; e++) {
        int at = kept;
        /* candidates come in index order: on a tie the lower index stays first */
        while (at > 0 && score[id[at - 1]] < score[e])
            at--;
        if (at >= n)
            continue;
        for (int j = kept < n ? kept : n - 1; j > at; j--)
            id[j] = id[j - 1];
        id[at] = e;
        kept += kept < n;
    }
}

/* Group-limited routing: the experts outside the n_group_used best groups (each scored by the
 * sum of its two best, ggml_sum_rows in double) masked to -inf (ggml_fill + set_rows). */
static void mask_groups(float *score, int n_expert, int n_group, int n_group_used)
{
    const int per = n_expert / n_group;
    float group_score[QD_NN_MAX_EXPERTS];
    int32_t best[QD_NN_MAX_EXPERTS];
    for (int g = 0; g < n_group; g++) {
        const int two = per < 2 ? per : 2;
        top_n(best, score + g * per, per, two);
        double sum = 0.0;
        for (int j = 0; j < two; j++)
            sum += (double)score[g * per + best[j]];
        group_score[g] = (float)sum;
    }
    top_n(best, group_score, n_group, n_group_used);
    for (int g = 0; g < n_group; g++) {
        int kept = 0;
        for (int j = 0; j < n_group_used; j++)
            kept |= best[j] == g;
        if (!kept)
            for (int i = 0; i < per; i++)
                score[g * per + i] = -INFINITY;
    }
}

/* n_expert <= QD_NN_MAX_EXPERTS (the loader checks it) */
void qd_nn_moe_route(int32_t *ids, float *weights, float *logits, int64_t T, int n_expert, int n_used,
                     const struct qd_nn_moe_gating *g)
{
    for (int64_t t = 0; t < T; t++) {
        float *p = logits + t * n_expert;
        int32_t *id = ids + t * n_used;
        float *w = weights + t * n_used;
        if (g->func == QD_MOE_SIGMOID)
            for (int e = 0; e < n_expert; e++)
                p[e] = 1.0f / (1.0f + expf(-p[e]));
        else
            softmax_row(p, n_expert);
        /* the n_used best (n_used is small: 2 to 16); the bias and the groups only rank, the
         * weights come from the unbiased probabilities */
        float score[QD_NN_MAX_EXPERTS];
        for (int e = 0; e < n_expert; e++)
            score[e] = g->bias ? p[e] + g->bias[e] : p[e];
        if (g->n_group > 1)
            mask_groups(score, n_expert, g->n_group, g->n_group_used);
        top_n(id, score, n_expert, n_used);
        for (int j = 0; j < n_used; j++)
            w[j] = p[id[j]];
        if (g->norm_w) {
            /* ggml_sum_rows (in double), clamped to f16's smallest normal, then ggml_div */
            double sum = 0.0;
            for (int j = 0; j < n_used; j++)
                sum += (double)w[j];
            float s = (float)sum;
            s = s < 6.103515625e-5f ? 6.103515625e-5f : s;
            for (int j = 0; j < n_used; j++)
                w[j] = w[j] / s;
        }
        if (g->w_scale != 0.0f && g->w_scale != 1.0f)
            for (int j = 0; j < n_used; j++)
                w[j] *= g->w_scale;
    }
}

void qd_nn_moe_sum(float *out, const float *experts, const float *weights, int64_t T, int n_used, int64_t n)
{
    for (int64_t t = 0; t < T; t++) {
        const float *e = experts + t * n_used * n, *w = weights + t * n_used;
        float *y = out + t * n;
        for (int64_t i = 0; i < n; i++)
            y[i] = e[i] * w[0];
        for (int j = 1; j < n_used; j++)
            for (int64_t i = 0; i < n; i++) {
                const float product = e[j * n + i] * w[j];
                y[i] = y[i] + product;
            }
    }
}

void qd_nn_sigmoid_gate(float *y, const float *g, int64_t T, int64_t n)
{
    for (int64_t t = 0; t < T; t++) {
        /* ggml_silu (x / (1 + e^-x)) then ggml_div by x */
        const float silu = g[t] / (1.0f + expf(-g[t]));
        const float gate = silu / g[t];
        for (int64_t i = 0; i < n; i++)
            y[t * n + i] *= gate;
    }
}

void qd_nn_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n, int64_t div)
{
    for (int64_t i = 0; i < count; i++)
        memcpy(dst + i * n, src + rows[i] / div * n, (size_t)n * sizeof *dst);
}

void qd_nn_scatter_rows(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n)
{
    for (int64_t i = 0; i < count; i++)
        memcpy(dst + (int64_t)rows[i] * n, src + i * n, (size_t)n * sizeof *dst);
}
