/* llama.cpp / ggml blocks on the CPU: rows of cols % 32 == 0, blocks of 32 along the flattened
 * tensor (a block never crosses a row), each written as ggml's block struct. */
#include "../ggml.h"
#include "../imatrix.h"
#include "cpu.h"
#include "ggml_avx2.h"

struct ggml_ctx {
    int type, block_bytes;
    uint8_t *data;
    const uint8_t *cdata;
    const struct qd_params *p; /* with an importance vector: spans of whole rows */
    const struct qd_tensor *in;
};

/* The types with AVX2 block code: it checks for NaN/Inf on the way (no separate scan). */
static int vector_type(int type)
{
    return QD_GGML_AVX2 && (type == QD_Q8_0 || type == QD_Q8_1 || type == QD_Q4_0);
}

/* One block by the vector code, or (declined: NaN/Inf here, or a tiny block) by the scalar
 * reference, noting the block's first non-finite element. */
static void quantize_one(const struct ggml_ctx *k, const float *x, uint8_t *out, int64_t first, int64_t b)
{
    const float *xb = x + b * QD_GGML_QK;
    uint8_t *o = out + b * k->block_bytes;
    if (k->type == QD_Q4_0 ? qd_ggml_q4_0_avx2(xb, o) : qd_ggml_q8_avx2(k->type, xb, o))
        return;
    for (int j = 0; j < QD_GGML_QK; j++)
        if (!qd_isfinite(xb[j])) {
            qd_cpu_note_nonfinite(first + b * QD_GGML_QK + j);
            break;
        }
    qd_ggml_quantize_block(k->type, xb, o);
}

static void ggml_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct ggml_ctx *k = c;
    (void)tid;
    uint8_t *out = k->data + first / QD_GGML_QK * k->block_bytes;
    if (vector_type(k->type)) {
        int64_t b = 0;
        for (; b + 8 <= n / QD_GGML_QK; b += 8) { /* eight blocks at a time where all eight are plain */
            const float *xb = x + b * QD_GGML_QK;
            uint8_t *o = out + b * k->block_bytes;
            if (!(k->type == QD_Q4_0 ? qd_ggml_q4_0_avx2_x8(xb, o) : qd_ggml_q8_avx2_x8(k->type, xb, o)))
                for (int e = 0; e < 8; e++)
                    quantize_one(k, x, out, first, b + e);
        }
        for (; b < n / QD_GGML_QK; b++)
            quantize_one(k, x, out, first, b);
        return;
    }
    for (int64_t b = 0; b < n / QD_GGML_QK; b++)
        qd_ggml_quantize_block(k->type, x + b * QD_GGML_QK, out + b * k->block_bytes);
}

/* ggml's quantize_row_<type>_impl: each row's mean square first (the weights use it), then its
 * blocks weighted by the row's importance. */
static void ggml_importance_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct ggml_ctx *k = c;
    (void)tid;
    const int64_t cols = k->in->cols;
    uint8_t *out = k->data + first / QD_GGML_QK * k->block_bytes;
    for (int64_t r = 0; r < n / cols; r++) {
        const float *xr = x + r * cols;
        const float *qw = qd_importance_row(k->p, k->in, first / cols + r);
        const float sigma2 = qd_imx_row_sigma2(xr, cols);
        for (int64_t b = 0; b < cols / QD_GGML_QK; b++, out += k->block_bytes)
            qd_imx_quantize_legacy(k->type, xr + b * QD_GGML_QK, qw + b * QD_GGML_QK, sigma2, out);
    }
}

static void ggml_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct ggml_ctx *k = c;
    (void)tid;
    const uint8_t *in = k->cdata + first / QD_GGML_QK * k->block_bytes;
    for (int64_t b = 0; b < n / QD_GGML_QK; b++)
        qd_ggml_dequantize_block(k->type, in + b * k->block_bytes, y + b * QD_GGML_QK);
}

enum qd_status qd_cpu_ggml_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                    struct qd_params *p, void *const *out)
{
    struct ggml_ctx k = {.type = f->code, .block_bytes = f->block_bytes, .data = out[0], .p = p, .in = in};
    if (p->importance && f->code != QD_Q8_0) /* q8_0 has no weighted form: ggml ignores it */
        return qd_cpu_spans(in, in->cols, ggml_importance_span, &k) < 0 ? QD_ENOMEM : QD_OK;
    int rc = vector_type(f->code) ? qd_cpu_spans_self_checked(in, QD_GGML_QK, ggml_quantize_span, &k)
                                  : qd_cpu_spans(in, QD_GGML_QK, ggml_quantize_span, &k);
    return rc < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_ggml_dequantize(const struct qd_format *f, const void *const *in,
                                      const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    struct ggml_ctx k = {.type = f->code, .block_bytes = f->block_bytes, .cdata = in[0]};
    return qd_cpu_out_spans(out, QD_GGML_QK, ggml_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
