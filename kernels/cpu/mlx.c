/* MLX's formats on the CPU (kernels/mlx.h): mlx_affine groups of 32/64/128 with 1-8 bit codes,
 * mlx_mxfp4 and mlx_mxfp8 groups of 32, mlx_nvfp4 groups of 16; one row of codes is one
 * little-endian stream of 32-bit words, so every 32 elements fill `bits` whole words. */
#include <string.h>

#include "../mlx.h"
#include "cpu.h"

struct mlx_ctx {
    int mode, bits, group, dt; /* dt: the input's dtype (quantize), the scales' (affine dequantize) */
    float enc, inv;            /* nvfp4: 2688 / global_scale and global_scale / 2688 (0: none) */
    int odt;                   /* dequantize: the output dtype */
    uint32_t *words;
    uint8_t *bytes;            /* E8M0 / E4M3 scales */
    void *scales, *biases;     /* affine, in dt */
    const uint32_t *cwords;
    const uint8_t *cbytes;
    const void *cscales, *cbiases;
};

static void store_scalar(void *dst, int64_t i, float v, int dt)
{
    if (dt == QD_F32)
        ((float *)dst)[i] = v;
    else
        ((uint16_t *)dst)[i] = dt == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
}

static float load_scalar(const void *src, int64_t i, int dt)
{
    if (dt == QD_F32)
        return ((const float *)src)[i];
    uint16_t h = ((const uint16_t *)src)[i];
    return dt == QD_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
}

/* Spans start at a group boundary and hold whole groups (the driver's alignment). */
static void affine_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct mlx_ctx *k = c;
    (void)tid;
    const float nbins = (float)((1 << k->bits) - 1);
    for (int64_t at = 0; at < n; at += k->group) {
        const float *g = x + at;
        float lo = g[0], hi = g[0];
        for (int j = 1; j < k->group; j++) {
            lo = g[j] < lo ? g[j] : lo;
            hi = g[j] > hi ? g[j] : hi;
        }
        float scale, bias;
        qd_mlx_affine_params(lo, hi, k->bits, &scale, &bias);
        int64_t gi = (first + at) / k->group;
        store_scalar(k->scales, gi, scale, k->dt);
        store_scalar(k->biases, gi, bias, k->dt);
        uint32_t *w = k->words + (first + at) * k->bits / QD_MLX_CHUNK;
        for (int c0 = 0; c0 < k->group; c0 += QD_MLX_CHUNK, w += k->bits) {
            uint32_t codes[QD_MLX_CHUNK];
            for (int j = 0; j < QD_MLX_CHUNK; j++)
                codes[j] = qd_mlx_affine_code((g[c0 + j] - bias) / scale, nbins);
            qd_mlx_pack32(codes, k->bits, w);
        }
    }
}

static void affine_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct mlx_ctx *k = c;
    (void)tid;
    for (int64_t at = 0; at < n; at += QD_MLX_CHUNK) {
        int64_t gi = (first + at) / k->group;
        float scale = load_scalar(k->cscales, gi, k->dt), bias = load_scalar(k->cbiases, gi, k->dt);
        const uint32_t *w = k->cwords + (first + at) * k->bits / QD_MLX_CHUNK;
        for (int j = 0; j < QD_MLX_CHUNK; j++)
            y[at + j] = qd_mlx_affine_value(qd_mlx_unpack(w, k->bits, j), scale, bias, k->dt);
    }
}

static void fp_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct mlx_ctx *k = c;
    (void)tid;
    for (int64_t at = 0; at < n; at += k->group) {
        int64_t gi = (first + at) / k->group;
        uint32_t *w = k->words + (first + at) * k->bits / QD_MLX_CHUNK;
        k->bytes[gi] = k->mode == QD_MLX_NVFP4 ? qd_mlx_nv_group(k->dt, k->enc, x + at, w)
                                               : qd_mlx_mx_group(k->dt, k->mode == QD_MLX_MXFP8, x + at, w);
    }
}

/* Values are f32 here; the driver rounds them once to the output dtype. mx: the code's value
 * times round_O(2^(byte - 127)), exact in f32; nvfp4: times the E4M3 value, exact in f32 too,
 * or with a global scale times (e4m3 * global_scale / 2688) rounded in f32, as mlx computes. */
static void fp_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct mlx_ctx *k = c;
    (void)tid;
    static const float e2m1[16] = QD_MLX_E2M1_VALUES;
    for (int64_t at = 0; at < n; at += k->group) {
        int64_t gi = (first + at) / k->group;
        const uint32_t *w = k->cwords + (first + at) * k->bits / QD_MLX_CHUNK;
        uint8_t byte = k->cbytes[gi];
        if (k->mode == QD_MLX_MXFP8) {
            float s = qd_mlx_mx_scale(byte, k->odt);
            for (int j = 0; j < k->group; j++)
                y[at + j] = qd_e4m3_to_f32((uint8_t)(w[j / 4] >> (8 * (j % 4)))) * s;
            continue;
        }
        float s = k->mode == QD_MLX_MXFP4 ? qd_mlx_mx_scale(byte, k->odt) : qd_mlx_nv_scale(byte, k->inv);
        for (int j = 0; j < k->group; j++)
            y[at + j] = e2m1[(w[j / 8] >> (4 * (j % 8))) & 15] * s;
    }
}

static void mlx_setup(struct mlx_ctx *k, const struct qd_format *f, const struct qd_params *p)
{
    static const int group[] = {[QD_MLX_AFFINE] = 0, [QD_MLX_MXFP4] = QD_MLX_MX_GROUP,
                                [QD_MLX_NVFP4] = QD_MLX_NV_GROUP, [QD_MLX_MXFP8] = QD_MLX_MX_GROUP};
    static const int bits[] = {[QD_MLX_MXFP4] = 4, [QD_MLX_NVFP4] = 4, [QD_MLX_MXFP8] = 8};
    k->mode = f->code;
    k->group = k->mode == QD_MLX_AFFINE ? p->group_size : group[k->mode];
    k->bits = k->mode == QD_MLX_AFFINE ? p->bits : bits[k->mode];
    k->enc = k->mode == QD_MLX_NVFP4 && p->has_global_scale ? QD_MLX_NV_ENCODE / p->global_scale : 1.0f;
    k->inv = k->mode == QD_MLX_NVFP4 && p->has_global_scale ? p->global_scale / QD_MLX_NV_ENCODE : 0.0f;
}

enum qd_status qd_cpu_mlx_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                   struct qd_params *p, void *const *out)
{
    struct mlx_ctx k = {.dt = in->dtype, .words = out[0]};
    mlx_setup(&k, f, p);
    if (k.mode != QD_MLX_AFFINE) {
        k.bytes = out[1];
        return qd_cpu_spans(in, k.group, fp_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
    }
    int own = qd_mlx_scale_dtype_of(in->dtype);
    if (p->scale_dtype != QD_SCALE_AUTO && p->scale_dtype != own)
        return QD_EINVAL; /* mlx keeps the scales and biases in the input's dtype */
    p->scale_dtype = own; /* recorded with the result, read back to dequantize */
    k.scales = out[1];
    k.biases = out[2];
    return qd_cpu_spans(in, k.group, affine_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_mlx_dequantize(const struct qd_format *f, const void *const *in,
                                     const struct qd_params *p, struct qd_tensor *out)
{
    struct mlx_ctx k = {.odt = out->dtype, .cwords = in[0]};
    mlx_setup(&k, f, p);
    if (k.mode != QD_MLX_AFFINE) {
        k.cbytes = in[1];
        return qd_cpu_out_spans(out, k.group, fp_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
    }
    k.dt = qd_mlx_scale_dtype_to(p->scale_dtype, out->dtype);
    k.cscales = in[1];
    k.cbiases = in[2];
    return qd_cpu_out_spans(out, QD_MLX_CHUNK, affine_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
