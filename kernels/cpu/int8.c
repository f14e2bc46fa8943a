/* int8 / uint8 on the CPU, per tensor (two passes: range, then codes) or per row (one). */
#include "../int8.h"
#include "cpu.h"

struct int8_ctx {
    int asym, per_row;
    int64_t cols;
    void *data;
    float *scale;
    uint8_t *zero_point;
    const void *cdata;
    const float *cscale;
    const uint8_t *czero_point;
};

static void int8_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct int8_ctx *k = c;
    (void)tid;
    int64_t rows = k->per_row ? n / k->cols : 1, len = k->per_row ? k->cols : n;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * len;
        int64_t row = k->per_row ? first / k->cols + r : 0;
        if (k->per_row) { /* the row's range, then its scale */
            float amax = 0.0f, lo = xr[0], hi = xr[0];
            for (int64_t i = 0; i < len; i++) {
                float a = qd_absf(xr[i]);
                amax = a > amax ? a : amax;
                lo = xr[i] < lo ? xr[i] : lo;
                hi = xr[i] > hi ? xr[i] : hi;
            }
            k->scale[row] = k->asym ? qd_uint8_scale(lo, hi) : qd_int8_scale(amax);
            if (k->asym)
                k->zero_point[row] = qd_uint8_zero_point(lo, k->scale[row]);
        }
        float s = k->scale[row];
        int64_t base = k->per_row ? first + r * len : first;
        if (k->asym) {
            uint8_t zp = k->zero_point[row], *out = (uint8_t *)k->data + base;
            for (int64_t i = 0; i < len; i++)
                out[i] = qd_uint8_code(xr[i], s, zp);
        } else {
            int8_t *out = (int8_t *)k->data + base;
            for (int64_t i = 0; i < len; i++)
                out[i] = qd_int8_code(xr[i], s);
        }
    }
}

static void int8_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct int8_ctx *k = c;
    (void)tid;
    for (int64_t i = 0; i < n; i++) {
        int64_t row = k->per_row ? (first + i) / k->cols : 0;
        if (k->asym)
            y[i] = (float)((int)((const uint8_t *)k->cdata)[first + i] - (int)k->czero_point[row]) *
                   k->cscale[row];
        else
            y[i] = (float)((const int8_t *)k->cdata)[first + i] * k->cscale[row];
    }
}

enum qd_status qd_cpu_int8_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                    struct qd_params *p, void *const *out)
{
    struct int8_ctx k = {.asym = f->code, .per_row = p->granularity == QD_GRAN_ROW,
                         .cols = in->cols, .data = out[0], .scale = out[1],
                         .zero_point = f->code ? out[2] : NULL};
    if (!k.per_row) {
        float amax, lo, hi;
        qd_cpu_minmax(in, &amax, &lo, &hi);
        k.scale[0] = k.asym ? qd_uint8_scale(lo, hi) : qd_int8_scale(amax);
        if (k.asym)
            k.zero_point[0] = qd_uint8_zero_point(lo, k.scale[0]);
    }
    int64_t align = k.per_row ? in->cols : 1;
    return qd_cpu_spans(in, align, int8_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_int8_dequantize(const struct qd_format *f, const void *const *in,
                                      const struct qd_params *p, struct qd_tensor *out)
{
    struct int8_ctx k = {.asym = f->code, .per_row = p->granularity == QD_GRAN_ROW,
                         .cols = out->cols, .cdata = in[0], .cscale = in[1],
                         .czero_point = f->code ? in[2] : NULL};
    return qd_cpu_out_spans(out, 1, int8_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
