/* NVFP4 on the CPU: 16-element blocks along the last dim with E4M3 scales and an f32
 * per-tensor scale (torchao nvfp4_quantize), or with flow=compressed_tensors llm-compressor's
 * NVFP4A16 arithmetic (kernels/mx.h). Without a given scale the tensor's amax is read first:
 * two passes over the input. */
#include <string.h>

#include "../mx.h"
#include "cpu.h"
#include "nvfp4_avx2.h"

/* torchao per_tensor_amax_to_scale: amax / (F8E4M3_MAX * F4_E2M1_MAX) */
#define NVFP4_SCALE_DIVISOR 2688.0f

struct nvfp4_ctx {
    float pts; /* per-tensor (decode) scale; 0 for single-level */
    float gs;  /* flow=compressed_tensors: the global (encode) scale, else 0 */
    int dt;    /* flow=compressed_tensors: the input's dtype */
    int swizzled;
    int64_t scale_cols;
    uint8_t *data, *scales;
    const uint8_t *cdata, *cscales;
};

static int64_t scale_index(const struct nvfp4_ctx *k, int64_t block)
{
    if (!k->swizzled)
        return block;
    return qd_swizzle_offset(block / k->scale_cols, block % k->scale_cols, k->scale_cols);
}

/* One block: the vector code, or the scalar one for a block holding NaN/Inf. */
static void quantize_one(const struct nvfp4_ctx *k, const float *x, int64_t block)
{
    uint8_t s;
    if (!qd_nvfp4_avx2(k->pts, x, k->data + block * 8, &s))
        s = qd_nvfp4_quantize_block(k->pts, x, k->data + block * 8);
    k->scales[scale_index(k, block)] = s;
}

static void nvfp4_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct nvfp4_ctx *k = c;
    (void)tid;
    const float inv_pts = k->pts > 0.0f ? 1.0f / k->pts : 1.0f;
    const int64_t nb = n / QD_NVFP4_BLOCK, first_block = first / QD_NVFP4_BLOCK;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) { /* eight blocks at a time where all eight are finite */
        uint8_t s[8];
        if (qd_nvfp4_avx2_x8(k->pts, inv_pts, x + b * QD_NVFP4_BLOCK, k->data + (first_block + b) * 8, s))
            for (int e = 0; e < 8; e++)
                k->scales[scale_index(k, first_block + b + e)] = s[e];
        else
            for (int e = 0; e < 8; e++)
                quantize_one(k, x + (b + e) * QD_NVFP4_BLOCK, first_block + b + e);
    }
    for (; b < nb; b++)
        quantize_one(k, x + b * QD_NVFP4_BLOCK, first_block + b);
}

/* flow=compressed_tensors: kernels/mx.h, block by block (IEEE divisions, no vector path) */
static void nvfp4_ct_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct nvfp4_ctx *k = c;
    (void)tid;
    for (int64_t b = 0; b < n / QD_NVFP4_BLOCK; b++) {
        int64_t block = first / QD_NVFP4_BLOCK + b;
        k->scales[scale_index(k, block)] = qd_ct_nvfp4_block(k->gs, k->dt, x + b * QD_NVFP4_BLOCK, k->data + block * 8);
    }
}

static void nvfp4_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct nvfp4_ctx *k = c;
    (void)tid;
    for (int64_t b = 0; b < n / QD_NVFP4_BLOCK; b++) {
        int64_t block = first / QD_NVFP4_BLOCK + b;
        if (k->gs > 0.0f)
            qd_ct_nvfp4_dequantize_block(k->gs, k->cscales[scale_index(k, block)], k->cdata + block * 8,
                                         y + b * QD_NVFP4_BLOCK);
        else
            qd_nvfp4_dequantize_block(k->pts, k->cscales[scale_index(k, block)], k->cdata + block * 8,
                                      y + b * QD_NVFP4_BLOCK);
    }
}

/* Resolves per_tensor_scale / global_scale from what was given, or from the tensor's amax. */
static void nvfp4_resolve(const struct qd_tensor *in, struct qd_params *p)
{
    if (p->flow == QD_FLOW_COMPRESSED_TENSORS) { /* the global scale only, in the weight's dtype */
        if (!p->has_global_scale) {
            float amax, lo, hi;
            qd_cpu_minmax(in, &amax, &lo, &hi);
            p->global_scale = qd_ct_nvfp4_global_scale(amax, in->dtype);
            p->has_global_scale = 1;
        }
        return;
    }
    if (!p->two_level)
        return;
    if (!p->has_per_tensor_scale) {
        if (p->has_global_scale) {
            p->per_tensor_scale = 1.0f / p->global_scale;
        } else {
            float amax, lo, hi;
            qd_cpu_minmax(in, &amax, &lo, &hi);
            /* an all-zero tensor would give torchao 0/0 = NaN scales; any positive scale
             * encodes zeros exactly, and 1 keeps the arithmetic plain */
            p->per_tensor_scale = amax > 0.0f ? amax / NVFP4_SCALE_DIVISOR : 1.0f;
        }
        p->has_per_tensor_scale = 1;
    }
    if (!p->has_global_scale) {
        p->global_scale = 1.0f / p->per_tensor_scale;
        p->has_global_scale = 1;
    }
}

enum qd_status qd_cpu_nvfp4_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                     struct qd_params *p, void *const *out)
{
    (void)f;
    nvfp4_resolve(in, p);
    const int ct = p->flow == QD_FLOW_COMPRESSED_TENSORS;
    struct nvfp4_ctx k = {.pts = p->two_level && !ct ? p->per_tensor_scale : 0.0f,
                          .gs = ct ? p->global_scale : 0.0f,
                          .dt = in->dtype,
                          .swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED,
                          .scale_cols = in->cols / QD_NVFP4_BLOCK,
                          .data = out[0],
                          .scales = out[1]};
    if (k.swizzled)
        memset(k.scales, 0, (size_t)qd_swizzle_bytes(in->rows, k.scale_cols));
    *(float *)out[2] = p->two_level ? p->global_scale : 1.0f;
    return qd_cpu_spans(in, QD_NVFP4_BLOCK, ct ? nvfp4_ct_quantize_span : nvfp4_quantize_span, &k) < 0 ? QD_ENOMEM
                                                                                              : QD_OK;
}

enum qd_status qd_cpu_nvfp4_dequantize(const struct qd_format *f, const void *const *in,
                                       const struct qd_params *p, struct qd_tensor *out)
{
    (void)f;
    float pts = 0.0f, gs = 0.0f;
    if (p->flow == QD_FLOW_COMPRESSED_TENSORS)
        gs = p->has_global_scale ? p->global_scale : *(const float *)in[2];
    else if (p->two_level)
        pts = p->has_per_tensor_scale ? p->per_tensor_scale : 1.0f / *(const float *)in[2];
    struct nvfp4_ctx k = {.pts = pts,
                          .gs = gs,
                          .swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED,
                          .scale_cols = out->cols / QD_NVFP4_BLOCK,
                          .cdata = in[0],
                          .cscales = in[1]};
    return qd_cpu_out_spans(out, QD_NVFP4_BLOCK, nvfp4_dequantize_span, &k) < 0 ? QD_ENOMEM
                                                                                   : QD_OK;
}
