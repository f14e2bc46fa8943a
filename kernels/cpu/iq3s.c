/* ggml's IQ3_S on the CPU (kernels/iq3s.h, its tables kernels/iq3s.c): super-blocks of 256
 * along the flattened tensor (one never crosses a row), the threads sharing them. */
#include "../iq3s.h"
#include "cpu.h"

struct iq3s_ctx {
    const struct qd_iq3s_tables *t;
    uint8_t *data;
    const uint8_t *cdata;
    const struct qd_params *p;
    const struct qd_tensor *in;
};

static void iq3s_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct iq3s_ctx *k = c;
    (void)tid;
    const int64_t cols = k->in->cols;
    for (int64_t b = 0; b < n / QD_QK_K; b++) {
        const int64_t e = first + b * QD_QK_K;
        const float *qw = k->p->importance ? qd_importance_row(k->p, k->in, e / cols) + e % cols : NULL;
        qd_iq3s_quantize(k->t, x + b * QD_QK_K, qw, k->data + e / QD_QK_K * QD_IQ3S_BLOCK_BYTES);
    }
}

static void iq3s_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct iq3s_ctx *k = c;
    (void)tid;
    for (int64_t b = 0; b < n / QD_QK_K; b++)
        qd_iq3s_dequantize(k->t, k->cdata + (first / QD_QK_K + b) * QD_IQ3S_BLOCK_BYTES, y + b * QD_QK_K);
}

enum qd_status qd_cpu_iq3s_quantize(const struct qd_format *f, const struct qd_tensor *in, struct qd_params *p,
                                    void *const *out)
{
    (void)f;
    struct iq3s_ctx k = {.t = qd_iq3s_tables(), .data = out[0], .p = p, .in = in};
    if (!k.t)
        return QD_EINVAL;
    return qd_cpu_spans(in, QD_QK_K, iq3s_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_iq3s_dequantize(const struct qd_format *f, const void *const *in, const struct qd_params *p,
                                      struct qd_tensor *out)
{
    (void)f, (void)p;
    struct iq3s_ctx k = {.t = qd_iq3s_tables(), .cdata = in[0]};
    if (!k.t)
        return QD_EINVAL;
    return qd_cpu_out_spans(out, QD_QK_K, iq3s_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
