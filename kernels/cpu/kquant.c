/* llama.cpp K-quants on the CPU: rows of cols % 256 == 0, super-blocks of 256 along the
 * flattened tensor (one never crosses a row), each written as ggml's block struct. The
 * sub-block searches of a super-block run side by side in AVX2 lanes (kquant_avx2.h: each lane
 * the reference's float operations in order, so the same bits); the threads share the blocks. */
#include "../imatrix.h"
#include "../kquants.h"
#include "cpu.h"
#include "kquant_avx2.h"
#include "kquant_imx_avx2.h"

struct kquant_ctx {
    int type, block_bytes;
    uint8_t *data;
    const uint8_t *cdata;
    const struct qd_params *p;
    const struct qd_tensor *in;
};

static void kquant_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct kquant_ctx *k = c;
    (void)tid;
    uint8_t *out = k->data + first / QD_QK_K * k->block_bytes;
    const int q45 = k->type == QD_Q4_K || k->type == QD_Q5_K, five = k->type == QD_Q5_K;
    for (int64_t b = 0; b < n / QD_QK_K; b++) {
        const float *xb = x + b * QD_QK_K;
        uint8_t *o = out + b * k->block_bytes;
        if (QD_KQUANT_AVX2 && q45) { /* the eight sub-block searches side by side, same bits */
            uint8_t L[QD_QK_K];
            float scales[8], mins[8];
            qd_kq_search_q45_avx2(xb, five ? 31 : 15, five ? -0.5f : -1.0f, five ? 15 : 20, scales, mins, L);
            qd_kq_finish_q45(five, xb, scales, mins, L, o);
        } else if (QD_KQUANT_AVX2 && k->type == QD_Q2_K) { /* sixteen searches, eight at a time */
            uint8_t L[QD_QK_K];
            float scales[16], mins[16];
            qd_kq_search_q2_avx2(xb, scales, mins, L);
            qd_kq_search_q2_avx2(xb + 128, scales + 8, mins + 8, L + 128);
            qd_kq_finish_q2(xb, scales, mins, L, o);
        } else if (QD_KQUANT_AVX2 && k->type == QD_Q3_K) {
            int8_t L[QD_QK_K];
            float scales[16];
            qd_kq_search_q3_avx2(xb, scales, L);
            qd_kq_search_q3_avx2(xb + 128, scales + 8, L + 128);
            qd_kq_finish_q3(xb, scales, L, o);
        } else if (QD_KQUANT_AVX2 && k->type == QD_Q6_K) { /* sixteen searches, eight at a time */
            int8_t L[QD_QK_K];
            float scales[16];
            qd_kq_search_q6_avx2(xb, scales, L);
            qd_kq_search_q6_avx2(xb + 128, scales + 8, L + 128);
            qd_kq_finish_q6(xb, scales, L, o);
        } else
            qd_kquant_quantize_block(k->type, xb, o);
    }
}

/* ggml's quantize_row_<type>_impl: each super-block weighted by its columns' importance, its
 * sub-block fits side by side in AVX2 lanes where the build has them (the same bytes). */
static void kquant_importance_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct kquant_ctx *k = c;
    (void)tid;
    const int64_t cols = k->in->cols;
    uint8_t *out = k->data + first / QD_QK_K * k->block_bytes;
    const int64_t blocks = n / QD_QK_K;
    const float twice = qd_imx_sigma2_twice(k->type);
    float sigma2[8] = {0};
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t e = first + b * QD_QK_K;
        const float *qw = qd_importance_row(k->p, k->in, e / cols) + e % cols;
        if (QD_KQUANT_IMX_AVX2) {
            /* eight blocks' sigma2 at once, each a sequential sum in its lane */
            if (b % 8 == 0 && twice != 0.0f) {
                if (blocks - b >= 8)
                    qd_imx_block_sigma2_8(x + b * QD_QK_K, twice, sigma2);
                else
                    for (int64_t j = b; j < blocks; j++)
                        sigma2[j - b] = qd_imx_block_sigma2(x + j * QD_QK_K, twice);
            }
            qd_imx_quantize_kquant_avx2(k->type, x + b * QD_QK_K, qw, sigma2[b % 8], out + b * k->block_bytes);
        } else
            qd_imx_quantize_kquant(k->type, x + b * QD_QK_K, qw, out + b * k->block_bytes);
    }
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
    struct kquant_ctx k = {.type = f->code, .block_bytes = f->block_bytes, .data = out[0], .p = p, .in = in};
    return qd_cpu_spans(in, QD_QK_K, p->importance ? kquant_importance_span : kquant_quantize_span, &k) < 0
               ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_kquant_dequantize(const struct qd_format *f, const void *const *in,
                                        const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    struct kquant_ctx k = {.type = f->code, .block_bytes = f->block_bytes, .cdata = in[0]};
    return qd_cpu_out_spans(out, QD_QK_K, kquant_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
