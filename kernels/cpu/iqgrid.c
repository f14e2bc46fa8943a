/* ggml's iq3_xxs, iq1_s and iq1_m on the CPU (kernels/iqgrid_quants.h): 256-element super-blocks
 * along the flattened tensor (one never crosses a row), the threads sharing them, over the grid
 * tables built once on the host. Where the build has AVX2, iq3_xxs and iq1_s take the forms in
 * iqgrid_avx2.h (the reference's bytes). */
#include "../iqgrid_quants.h"
#include "cpu.h"
#include "iqgrid_avx2.h"

struct iqgrid_ctx {
    int type;
    const struct qd_iq_grid *g;
    uint8_t *data;
    const uint8_t *cdata;
    const struct qd_params *p;
    const struct qd_tensor *in;
};

static void iqgrid_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct iqgrid_ctx *k = c;
    (void)tid;
    const int64_t cols = k->in->cols;
    const int bytes = qd_iqgrid_block_bytes(k->type);
    for (int64_t b = 0; b < n / QD_QK_K; b++) {
        const int64_t e = first + b * QD_QK_K;
        const float *qw = k->p->importance ? qd_importance_row(k->p, k->in, e / cols) + e % cols : NULL;
        uint8_t *blk = k->data + e / QD_QK_K * bytes;
        if (QD_IQGRID_AVX2 && k->type == QD_IQ3_XXS) /* the eight sub-blocks in AVX2 lanes, the same bytes */
            qd_iq3xxs_quantize_avx2(k->g, x + b * QD_QK_K, qw, blk);
        else if (QD_IQGRID_AVX2 && k->type == QD_IQ1_S && qw) /* the split search eight candidates at a time */
            qd_iq1s_quantize_avx2(k->g, x + b * QD_QK_K, qw, blk);
        else
            qd_iqgrid_quantize_block(k->type, k->g, x + b * QD_QK_K, qw, blk);
    }
}

static void iqgrid_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct iqgrid_ctx *k = c;
    (void)tid;
    const int bytes = qd_iqgrid_block_bytes(k->type);
    for (int64_t b = 0; b < n / QD_QK_K; b++)
        qd_iqgrid_dequantize_block(k->type, k->g, k->cdata + (first / QD_QK_K + b) * bytes, y + b * QD_QK_K);
}

enum qd_status qd_cpu_iqgrid_quantize(const struct qd_format *f, const struct qd_tensor *in, struct qd_params *p,
                                      void *const *out)
{
    struct iqgrid_ctx k = {.type = f->code, .g = qd_iqgrid_tables(f->code), .data = out[0], .p = p, .in = in};
    if (!k.g)
        return QD_ENOMEM;
    return qd_cpu_spans(in, QD_QK_K, iqgrid_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_iqgrid_dequantize(const struct qd_format *f, const void *const *in, const struct qd_params *p,
                                        struct qd_tensor *out)
{
    (void)p;
    struct iqgrid_ctx k = {.type = f->code, .g = qd_iqgrid_tables(f->code), .cdata = in[0]};
    if (!k.g)
        return QD_ENOMEM;
    return qd_cpu_out_spans(out, QD_QK_K, iqgrid_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
