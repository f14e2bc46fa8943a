/* AWQ int4 on the CPU: one span per group of group_size rows (contiguous in memory); column
 * statistics are kept in per-span arrays so the inner loops run along rows and vectorize. */
#include <stdlib.h>

#include "../awq.h"
#include "cpu.h"

struct awq_ctx {
    int64_t n_cols, group;
    uint32_t *qweight, *qzeros;
    uint16_t *scales;
    const uint32_t *cqweight, *cqzeros;
    const uint16_t *cscales;
    int failed;
};

static void awq_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct awq_ctx *k = c;
    (void)tid;
    const int64_t N = k->n_cols, G = k->group;
    static const int shift_of_col[8] = QD_AWQ_SHIFT_OF_COL;
    float *stats = malloc((size_t)N * 4 * sizeof(float) + (size_t)N);
    if (!stats) {
        __atomic_store_n(&k->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *lo = stats, *hi = stats + N, *scale = stats + 2 * N, *zero = stats + 3 * N;
    uint8_t *code = (uint8_t *)(stats + 4 * N);
    for (int64_t g0 = 0; g0 < n; g0 += G * N) {
        const float *w = x + g0;
        int64_t g = (first + g0) / (G * N), row0 = g * G;
        for (int64_t j = 0; j < N; j++)
            lo[j] = hi[j] = w[j];
        for (int64_t r = 1; r < G; r++)
            for (int64_t j = 0; j < N; j++) {
                float v = w[r * N + j];
                lo[j] = v < lo[j] ? v : lo[j];
                hi[j] = v > hi[j] ? v : hi[j];
            }
        for (int64_t j = 0; j < N; j++) {
            /* f16 rounding is monotone: the min and max of the halved weights are these */
            float lo16 = qd_f16_round(lo[j]), hi16 = qd_f16_round(hi[j]);
            scale[j] = qd_awq_scale(lo16, hi16);
            zero[j] = qd_awq_zero(lo16, scale[j]);
            k->scales[g * N + j] = qd_f32_to_f16_scale(scale[j]);
            if (!qd_awq_column_defined(hi16, scale[j], zero[j])) /* noted unless NaN/Inf are allowed */
                qd_cpu_note_nonfinite(QD_BAD_AWQ_F16_RANGE | (row0 * N + j));
        }
        for (int64_t j = 0; j < N / 8; j++) {
            uint32_t word = 0;
            for (int i = 0; i < 8; i++)
                word |= (uint32_t)zero[8 * j + i] << shift_of_col[i];
            k->qzeros[g * (N / 8) + j] = word;
        }
        for (int64_t r = 0; r < G; r++) {
            const float *wr = w + r * N;
            for (int64_t j = 0; j < N; j++) /* along the row: vectorizes */
                code[j] = (uint8_t)qd_awq_code(qd_f16_round(wr[j]), scale[j], zero[j]);
            uint32_t *out = k->qweight + (row0 + r) * (N / 8);
            for (int64_t j = 0; j < N / 8; j++) {
                uint32_t word = 0;
                for (int i = 0; i < 8; i++)
                    word |= (uint32_t)code[8 * j + i] << shift_of_col[i];
                out[j] = word;
            }
        }
    }
    free(stats);
}

static void awq_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct awq_ctx *k = c;
    (void)tid;
    const int64_t N = k->n_cols;
    for (int64_t e = 0; e < n; e++) {
        int64_t idx = first + e, row = idx / N, col = idx % N, g = row / k->group;
        static const int shift_of_col[8] = QD_AWQ_SHIFT_OF_COL;
        int shift = shift_of_col[col % 8];
        int q = (int)((k->cqweight[row * (N / 8) + col / 8] >> shift) & 15);
        int z = (int)((k->cqzeros[g * (N / 8) + col / 8] >> shift) & 15);
        y[e] = (float)(q - z) * qd_f16_to_f32(k->cscales[g * N + col]);
    }
}

enum qd_status qd_cpu_awq_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                   struct qd_params *p, void *const *out)
{
    (void)f;
    struct awq_ctx k = {.n_cols = in->cols, .group = p->group_size,
                        .qweight = out[0], .qzeros = out[1], .scales = out[2]};
    if (qd_cpu_spans(in, k.group * k.n_cols, awq_quantize_span, &k) < 0 || k.failed)
        return QD_ENOMEM;
    return QD_OK;
}

enum qd_status qd_cpu_awq_dequantize(const struct qd_format *f, const void *const *in,
                                     const struct qd_params *p, struct qd_tensor *out)
{
    (void)f;
    struct awq_ctx k = {.n_cols = out->cols, .group = p->group_size,
                        .cqweight = in[0], .cqzeros = in[1], .cscales = in[2]};
    return qd_cpu_out_spans(out, out->cols, awq_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
