/* llama.cpp K-quants on the CPU: rows of cols % 256 == 0, super-blocks of 256 along the
 * flattened tensor (one never crosses a row), each written as ggml's block struct. The search
 * per sub-block is scalar (the reference's float order is the contract); the threads share the
 * blocks. */
#include "../kquants.h"
#include "cpu.h"

struct kquant_ctx {
    int type, block_bytes;
    uint8_t *data;
    const uint8_t *cdata;
};

static void kquant_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct kquant_ctx *k = c;
    (void)tid;
    uint8_t *out = k->data + first / QD_QK_K * k->block_bytes;
    for (int64_t b = 0; b < n / QD_QK_K; b++)
        qd_kquant_quantize_block(k->type, x + b * QD_QK_K, out + b * k->block_bytes);
}

static void kquant_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct kquant_ctx *k = c;
    (void)tid;
    const uint8_t *in = k->cdata + first / QD_QK_K * k->block_bytes;
    for (int64_t b = 0; b < n / QD_QK_K; b++)
        qd_kquant_dequantize_block(k->type, in + b * k->block_bytes, y + b * QD_QK_K);
}

enum qd_status qd_cpu_kquant_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                      struct qd_params *p, void *const *out)
{
    (void)p;
    struct kquant_ctx k = {.type = f->code, .block_bytes = f->block_bytes, .data = out[0]};
    return qd_cpu_spans(in, QD_QK_K, kquant_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_kquant_dequantize(const struct qd_format *f, const void *const *in,
                                        const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    struct kquant_ctx k = {.type = f->code, .block_bytes = f->block_bytes, .cdata = in[0]};
    return qd_cpu_out_spans(out, QD_QK_K, kquant_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
