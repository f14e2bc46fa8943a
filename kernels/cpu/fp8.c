/* fp8_e4m3 and w8a8 (kernels/fp8.h) on the CPU. Per tensor: the range pass, then the codes; per
 * channel: spans of whole rows, each row's scale then its codes; per block: spans of whole
 * block rows (whole matrices where a stack's matrices have rows that are not a multiple of the
 * block's), each block row's maxima column block by column block, then its codes. */
#include <stdlib.h>

#include "../fp8.h"
#include "cpu.h"

struct fp8_ctx {
    struct qd_fp8_plan k;
    int64_t cols, mrows;   /* mrows: rows of one matrix */
    int64_t ncb, nbr;      /* block columns; block rows per matrix */
    uint8_t *codes;
    void *scales;
    float scale;           /* granularity=tensor: the encode scale */
    float *work;           /* per thread: 2 * ncb floats (block maxima, then scales) */
    const uint8_t *ccodes;
    const void *cscales;
};

static void tensor_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct fp8_ctx *k = c;
    (void)tid;
    for (int64_t i = 0; i < n; i++)
        k->codes[first + i] = qd_fp8_code(x[i], k->scale, k->k.int8, k->k.ct);
}

static void channel_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct fp8_ctx *k = c;
    (void)tid;
    for (int64_t at = 0; at < n; at += k->cols) {
        const float *row = x + at;
        float amax = 0.0f;
        for (int64_t i = 0; i < k->cols; i++) {
            float a = qd_absf(row[i]);
            amax = a > amax ? a : amax;
        }
        float s = qd_fp8_encode_scale(amax, k->k.int8, k->k.ct, k->k.dt);
        qd_fp8_put_scale(k->scales, (first + at) / k->cols, qd_fp8_stored_scale(s, k->k.ct), k->k.dt);
        uint8_t *out = k->codes + first + at;
        for (int64_t i = 0; i < k->cols; i++)
            out[i] = qd_fp8_code(row[i], s, k->k.int8, k->k.ct);
    }
}

static void block_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct fp8_ctx *k = c;
    const int64_t cols = k->cols, bc = k->k.block_cols, ncb = k->ncb;
    float *amax = k->work + (int64_t)tid * 2 * ncb, *scale = amax + ncb;
    for (int64_t r = first / cols, end = (first + n) / cols; r < end;) {
        /* the block row starting at r: the span driver's alignment puts r on one */
        const int64_t m = r / k->mrows, in_m = r % k->mrows;
        const int64_t h = k->k.block_rows < k->mrows - in_m ? k->k.block_rows : k->mrows - in_m;
        const float *xr = x + (r * cols - first);
        for (int64_t b = 0; b < ncb; b++)
            amax[b] = 0.0f;
        for (int64_t i = 0; i < h; i++)
            for (int64_t b = 0; b < ncb; b++) {
                float a = amax[b];
                for (int64_t j = b * bc, je = j + bc < cols ? j + bc : cols; j < je; j++) {
                    float v = qd_absf(xr[i * cols + j]);
                    a = v > a ? v : a;
                }
                amax[b] = a;
            }
        const int64_t srow = m * k->nbr + in_m / k->k.block_rows;
        for (int64_t b = 0; b < ncb; b++) {
            scale[b] = qd_fp8_encode_scale(amax[b], k->k.int8, k->k.ct, k->k.dt);
            qd_fp8_put_scale(k->scales, srow * ncb + b, qd_fp8_stored_scale(scale[b], k->k.ct), k->k.dt);
        }
        uint8_t *out = k->codes + r * cols;
        for (int64_t i = 0; i < h; i++)
            for (int64_t j = 0; j < cols; j++)
                out[i * cols + j] = qd_fp8_code(xr[i * cols + j], scale[j / bc], k->k.int8, k->k.ct);
        r += h;
    }
}

static void dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct fp8_ctx *k = c;
    (void)tid;
    const struct qd_fp8_plan *p = &k->k;
    for (int64_t e = first, end = first + n; e < end;) {
        const int64_t r = e / k->cols, row_end = (r + 1) * k->cols < end ? (r + 1) * k->cols : end;
        const int64_t srow = p->gran == QD_GRAN_TENSOR    ? 0
                             : p->gran == QD_GRAN_CHANNEL ? r
                                                          : (r / k->mrows * k->nbr + r % k->mrows / p->block_rows) * k->ncb;
        for (; e < row_end; e++) {
            const int64_t s = p->gran == QD_GRAN_BLOCK ? srow + (e % k->cols) / p->block_cols : srow;
            y[e - first] = qd_fp8_value(k->ccodes[e], qd_fp8_get_scale(k->cscales, s, p->dt), p->int8, p->dt);
        }
    }
}

static void geometry(struct fp8_ctx *k, const struct qd_tensor *t)
{
    k->cols = t->cols;
    k->mrows = t->ndim > 1 ? t->shape[t->ndim - 2] : 1;
    k->ncb = (t->cols + k->k.block_cols - 1) / k->k.block_cols;
    k->nbr = (k->mrows + k->k.block_rows - 1) / k->k.block_rows;
}

enum qd_status qd_cpu_fp8_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                   struct qd_params *p, void *const *out)
{
    if (qd_fp8_resolve_scale_dtype(f, p, in->dtype))
        return QD_EINVAL; /* (the layout refuses it first, naming it) */
    struct fp8_ctx k = {.k = qd_fp8_plan_for(f, p, in->dtype), .codes = out[0], .scales = out[1]};
    geometry(&k, in);
    if (k.k.gran == QD_GRAN_TENSOR) {
        float amax, lo, hi;
        qd_cpu_minmax(in, &amax, &lo, &hi);
        k.scale = qd_fp8_encode_scale(amax, k.k.int8, k.k.ct, k.k.dt);
        qd_fp8_put_scale(k.scales, 0, qd_fp8_stored_scale(k.scale, k.k.ct), k.k.dt);
        return qd_cpu_spans(in, 1, tensor_span, &k) < 0 ? QD_ENOMEM : QD_OK;
    }
    if (k.k.gran == QD_GRAN_CHANNEL)
        return qd_cpu_spans(in, in->cols, channel_span, &k) < 0 ? QD_ENOMEM : QD_OK;
    /* spans of whole block rows; of whole matrices when a block row can end one of several early
     * (a single matrix's short last block row is the tensor's end) */
    int64_t unit_rows = k.mrows % k.k.block_rows == 0 || k.mrows == in->rows ? k.k.block_rows : k.mrows;
    int threads = qd_cpu_threads_for(qd_tensor_numel(in));
    if (!(k.work = malloc((size_t)(threads * 2 * k.ncb) * sizeof(float))))
        return QD_ENOMEM;
    int rc = qd_cpu_spans(in, unit_rows * in->cols, block_span, &k);
    free(k.work);
    return rc < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_fp8_dequantize(const struct qd_format *f, const void *const *in,
                                     const struct qd_params *p, struct qd_tensor *out)
{
    struct fp8_ctx k = {.k = qd_fp8_plan_for(f, p, out->dtype), .ccodes = in[0], .cscales = in[1]};
    geometry(&k, out);
    return qd_cpu_out_spans(out, 1, dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
