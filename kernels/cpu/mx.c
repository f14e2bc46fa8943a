/* OCP MX formats on the CPU: 32-element blocks along the last dim, one E8M0 scale each, in a
 * linear [rows, cols/32] or the swizzled tensor-core layout. */
#include <pthread.h>
#include <string.h>

#include "../mx.h"
#include "cpu.h"

struct mx_ctx {
    int elem, rceil, unpacked, swizzled, data_bytes;
    int even, dt; /* scale_rounding=even (compressed-tensors, mxfp4): the input's dtype matters */
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
        if (k->even) {
            int overflow;
            k->scales[scale_index(k, block)] =
                qd_ct_mx_block(k->dt, x + b * QD_MX_BLOCK, k->data + block * k->data_bytes, &overflow);
            if (overflow) /* noted unless NaN/Inf are allowed */
                qd_cpu_note_nonfinite(QD_BAD_MX_SCALE_RANGE | (first + b * QD_MX_BLOCK));
            continue;
        }
        k->scales[scale_index(k, block)] = qd_mx_quantize_block(
            k->elem, k->rceil, k->unpacked, x + b * QD_MX_BLOCK, k->data + block * k->data_bytes);
    }
}

/* Every code's value per element type: decoding is one load instead of bit arithmetic. */
static float elem_values[5][256];
static pthread_once_t elem_values_once = PTHREAD_ONCE_INIT;

static void elem_values_init(void)
{
    for (int e = 0; e < 5; e++)
        for (int c = 0; c < 256; c++)
            elem_values[e][c] = qd_mx_decode(e, (uint8_t)c);
}

static void mx_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct mx_ctx *k = c;
    (void)tid;
    const float *v = elem_values[k->elem];
    for (int64_t b = 0; b < n / QD_MX_BLOCK; b++) {
        int64_t block = first / QD_MX_BLOCK + b;
        const uint8_t *in = k->cdata + block * k->data_bytes;
        float s = qd_e8m0_to_f32(k->cscales[scale_index(k, block)]);
        float *yb = y + b * QD_MX_BLOCK;
        if (k->elem == QD_E2M1)
            for (int j = 0; j < QD_MX_BLOCK / 2; j++) { /* same product as qd_mx_dequantize_block */
                yb[2 * j] = v[in[j] & 15] * s;
                yb[2 * j + 1] = v[in[j] >> 4] * s;
            }
        else if (k->data_bytes == 32)
            for (int j = 0; j < QD_MX_BLOCK; j++)
                yb[j] = v[in[j] & (k->elem <= QD_E3M2 ? 63 : 255)] * s;
        else
            for (int j = 0; j < QD_MX_BLOCK; j++)
                yb[j] = v[qd_mx_unpack(k->elem, 0, in, j)] * s;
    }
}

static void mx_setup(struct mx_ctx *k, const struct qd_format *f, const struct qd_params *p,
                     int64_t cols)
{
    k->elem = f->code;
    k->rceil = p->scale_rounding == QD_ROUND_RCEIL;
    k->even = p->scale_rounding == QD_ROUND_EVEN;
    k->unpacked = p->fp6_packing == QD_FP6_UNPACKED;
    k->swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    k->data_bytes = qd_mx_block_data_bytes(k->elem, k->unpacked);
    k->scale_cols = cols / QD_MX_BLOCK;
}

enum qd_status qd_cpu_mx_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                  struct qd_params *p, void *const *out)
{
    struct mx_ctx k = {.data = out[0], .scales = out[1], .dt = in->dtype};
    mx_setup(&k, f, p, in->cols);
    if (k.swizzled) /* padding of the 128x4 tiles is zero */
        memset(k.scales, 0, (size_t)qd_swizzle_bytes(in->rows, k.scale_cols));
    return qd_cpu_spans(in, QD_MX_BLOCK, mx_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_mx_dequantize(const struct qd_format *f, const void *const *in,
                                    const struct qd_params *p, struct qd_tensor *out)
{
    struct mx_ctx k = {.cdata = in[0], .cscales = in[1]};
    pthread_once(&elem_values_once, elem_values_init);
    mx_setup(&k, f, p, out->cols);
    return qd_cpu_out_spans(out, QD_MX_BLOCK, mx_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
