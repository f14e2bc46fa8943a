/* ggml's IQ2_XXS, IQ2_XS and IQ2_S on the CPU (kernels/iq2.h): 256-element super-blocks along
 * the flattened tensor (one never crosses a row), the threads sharing them, all reading the
 * type's tables (kernels/iq2.c). IQ2_XXS runs a super-block's eight sub-block searches side by
 * side in AVX2 lanes where the build has AVX2 (iq2_avx2.h: the reference's bits). */
#include "../iq2.h"
#include "cpu.h"
#include "iq2_avx2.h"

struct iq2_ctx {
    int type;
    const struct qd_iq2_tables *t;
    uint8_t *data;
    const uint8_t *cdata;
    const struct qd_params *p;
    const struct qd_tensor *in;
};

static void iq2_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct iq2_ctx *k = c;
    (void)tid;
    const int64_t cols = k->in->cols;
    const int bytes = qd_iq2_block_bytes(k->type);
    for (int64_t b = 0; b < n / QD_QK_K; b++) {
        const int64_t e = first + b * QD_QK_K;
        const float *qw = k->p->importance ? qd_importance_row(k->p, k->in, e / cols) + e % cols : NULL;
        if (QD_IQ2_AVX2 && k->type == QD_IQ2_XXS) /* the eight sub-blocks in AVX2 lanes, the same bytes */
            qd_iq2xxs_quantize_avx2(k->t, x + b * QD_QK_K, qw, k->data + e / QD_QK_K * bytes);
        else
            qd_iq2_quantize_block(k->t, k->type, x + b * QD_QK_K, qw, k->data + e / QD_QK_K * bytes);
    }
}

static void iq2_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct iq2_ctx *k = c;
    (void)tid;
    const int bytes = qd_iq2_block_bytes(k->type);
    for (int64_t b = 0; b < n / QD_QK_K; b++)
        qd_iq2_dequantize_block(k->t, k->type, k->cdata + (first / QD_QK_K + b) * bytes, y + b * QD_QK_K);
}

enum qd_status qd_cpu_iq2_quantize(const struct qd_format *f, const struct qd_tensor *in, struct qd_params *p,
                                   void *const *out)
{
    struct iq2_ctx k = {.type = f->code, .t = qd_iq2_tables(f->code), .data = out[0], .p = p, .in = in};
    if (!k.t)
        return QD_ENOMEM;
    return qd_cpu_spans(in, QD_QK_K, iq2_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_iq2_dequantize(const struct qd_format *f, const void *const *in, const struct qd_params *p,
                                     struct qd_tensor *out)
{
    (void)p;
    struct iq2_ctx k = {.type = f->code, .t = qd_iq2_tables(f->code), .cdata = in[0]};
    if (!k.t)
        return QD_ENOMEM;
    return qd_cpu_out_spans(out, QD_QK_K, iq2_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
