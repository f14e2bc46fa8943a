/* OCP MX formats on the CPU: 32-element blocks along the last dim, one E8M0 scale each, in a
 * linear [rows, cols/32] or the swizzled tensor-core layout. */
#include <string.h>

#include "../mx.h"
#include "cpu.h"

struct mx_ctx {
    int elem, rceil, unpacked, swizzled, data_bytes;
    int64_t scale_cols; /* cols / 32 */
    uint8_t *data, *scales;
    const uint8_t *cdata, *cscales;
};

static int64_t scale_index(const struct mx_ctx *k, int64_t block)
{
    if (!k->swizzled)
        return block;
    return qd_swizzle_offset(block / k->scale_cols, block % k->scale_cols, k->scale_cols);
}

static void mx_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct mx_ctx *k = c;
    (void)tid;
    for (int64_t b = 0; b < n / QD_MX_BLOCK; b++) {
        int64_t block = first / QD_MX_BLOCK + b;
        k->scales[scale_index(k, block)] = qd_mx_quantize_block(
            k->elem, k->rceil, k->unpacked, x + b * QD_MX_BLOCK, k->data + block * k->data_bytes);
    }
}

static void mx_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct mx_ctx *k = c;
    (void)tid;
    for (int64_t b = 0; b < n / QD_MX_BLOCK; b++) {
        int64_t block = first / QD_MX_BLOCK + b;
        qd_mx_dequantize_block(k->elem, k->unpacked, k->cscales[scale_index(k, block)],
                               k->cdata + block * k->data_bytes, y + b * QD_MX_BLOCK);
    }
}

static void mx_setup(struct mx_ctx *k, const struct qd_format *f, const struct qd_params *p,
                     int64_t cols)
{
    k->elem = f->code;
    k->rceil = p->scale_rounding == QD_ROUND_RCEIL;
    k->unpacked = p->fp6_packing == QD_FP6_UNPACKED;
    k->swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    k->data_bytes = qd_mx_block_data_bytes(k->elem, k->unpacked);
    k->scale_cols = cols / QD_MX_BLOCK;
}

enum qd_status qd_cpu_mx_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                  struct qd_params *p, void *const *out)
{
    struct mx_ctx k = {.data = out[0], .scales = out[1]};
    mx_setup(&k, f, p, in->cols);
    if (k.swizzled) /* padding of the 128x4 tiles is zero */
        memset(k.scales, 0, (size_t)qd_swizzle_bytes(in->rows, k.scale_cols));
    return qd_cpu_spans(in, QD_MX_BLOCK, mx_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_mx_dequantize(const struct qd_format *f, const void *const *in,
                                    const struct qd_params *p, struct qd_tensor *out)
{
    struct mx_ctx k = {.cdata = in[0], .cscales = in[1]};
    mx_setup(&k, f, p, out->cols);
    return qd_cpu_out_spans(out, QD_MX_BLOCK, mx_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
