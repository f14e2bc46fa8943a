/* ggml's iq4_nl, iq4_xs, tq1_0, tq2_0 and MXFP4 on the CPU (kernels/iquants.h): blocks of 32 or
 * 256 along the flattened tensor (one never crosses a row), the threads sharing them. The iq4
 * searches run eight blocks side by side in AVX2 lanes where the build has AVX2
 * (iquant_avx2.h: each lane the reference's float operations in order, so the same bits). */
#include "../iquants.h"
#include "cpu.h"
#include "iquant_avx2.h"

struct iquant_ctx {
    int type, block_elems, block_bytes;
    uint8_t *data;
    const uint8_t *cdata;
    const struct qd_params *p;
    const struct qd_tensor *in;
};

static void iquant_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct iquant_ctx *k = c;
    (void)tid;
    const int64_t cols = k->in->cols;
    uint8_t *out = k->data + first / k->block_elems * k->block_bytes;
    const int64_t blocks = n / k->block_elems;
    int64_t b = 0;
    if (QD_IQUANT_AVX2 && k->type == QD_IQ4_XS)
        for (; b < blocks; b++) {
            const int64_t e = first + b * QD_QK_K;
            const float *qw = k->p->importance ? qd_importance_row(k->p, k->in, e / cols) + e % cols : NULL;
            qd_iq4_xs_quantize_avx2(x + b * QD_QK_K, qw, out + b * k->block_bytes);
        }
    if (QD_IQUANT_AVX2 && k->type == QD_IQ4_NL)
        for (; b + 8 <= blocks; b += 8) { /* eight blocks, which may lie in two rows */
            const float *qw[8];
            for (int j = 0; j < 8; j++) {
                const int64_t e = first + (b + j) * 32;
                qw[j] = k->p->importance ? qd_importance_row(k->p, k->in, e / cols) + e % cols : NULL;
            }
            qd_iq4_nl_quantize8_avx2(x + b * 32, k->p->importance ? qw : NULL, out + b * k->block_bytes);
        }
    for (; b < blocks; b++) { /* the other types, and the last iq4_nl blocks short of eight */
        const int64_t e = first + b * k->block_elems;
        const float *qw = k->p->importance ? qd_importance_row(k->p, k->in, e / cols) + e % cols : NULL;
        qd_iquant_quantize_block(k->type, x + b * k->block_elems, qw, out + b * k->block_bytes);
    }
}

static void iquant_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct iquant_ctx *k = c;
    (void)tid;
    const uint8_t *in = k->cdata + first / k->block_elems * k->block_bytes;
    for (int64_t b = 0; b < n / k->block_elems; b++)
        qd_iquant_dequantize_block(k->type, in + b * k->block_bytes, y + b * k->block_elems);
}

enum qd_status qd_cpu_iquant_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                      struct qd_params *p, void *const *out)
{
    struct iquant_ctx k = {.type = f->code, .block_elems = f->block_elems, .block_bytes = f->block_bytes,
                           .data = out[0], .p = p, .in = in};
    return qd_cpu_spans(in, f->block_elems, iquant_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_iquant_dequantize(const struct qd_format *f, const void *const *in,
                                        const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    struct iquant_ctx k = {.type = f->code, .block_elems = f->block_elems, .block_bytes = f->block_bytes,
                           .cdata = in[0]};
    return qd_cpu_out_spans(out, f->block_elems, iquant_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
