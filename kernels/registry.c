/* The format registry: one entry per format (see registry.h), its parameters and layouts. */
#include "registry.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bnb4.h"
#include "cpu/cpu.h"
#include "fp8.h"
#include "ggml.h"
#include "iqgrid_quants.h"
#include "iq2.h"
#include "iquants.h"
#include "kquants.h"
#include "mlx.h"
#include "mx.h"

#ifdef QD_WITH_CUDA
#include "cuda/cuda.h"
#define CUDA_FNS(fam) {qd_cuda_##fam##_quantize, qd_cuda_##fam##_dequantize}
#else
#define CUDA_FNS(fam) {NULL, NULL}
#endif
#define BACKENDS(fam) {[QD_BACKEND_CPU] = {qd_cpu_##fam##_quantize, qd_cpu_##fam##_dequantize}, \
                       [QD_BACKEND_CUDA] = CUDA_FNS(fam)}

/* ---- parameters ----------------------------------------------------------------------------- */

static const char *const layouts[] = {"linear", "swizzled", NULL};
static const char *const roundings[] = {"floor", "rceil", "even", NULL};
static const char *const flows[] = {"torchao", "compressed_tensors", "transformers", NULL};
static const char *const granularities[] = {"tensor", "row", "channel", "block", NULL};
static const char *const fp6_packings[] = {"packed", "unpacked", NULL};
static const char *const scale_dtypes[] = {"auto", "f32", "f16", "bf16", NULL};

#define OFF(field) offsetof(struct qd_params, field)

const struct qd_param_desc qd_param_descs[] = {
    {"blocksize", QD_PARAM_INT, OFF(blocksize), 0, "64", 32, 4096, 1, NULL,
     "elements per absmax block (bitsandbytes: a power of two, 32..4096)"},
    {"double_quant", QD_PARAM_BOOL, OFF(double_quant), 0, "true", 0, 0, 0, NULL,
     "quantize the absmax with the 8-bit dynamic map (bitsandbytes compress_statistics)"},
    {"offset", QD_PARAM_FLOAT, OFF(offset), OFF(has_offset), NULL, 0, 0, 0, NULL,
     "double quant: mean of absmax subtracted before quantizing it; computed when absent"},
    {"group_size", QD_PARAM_INT, OFF(group_size), 0, "128", 1, 1 << 30, 0, NULL,
     "elements sharing one scale (and zero): rows of K per column (awq), columns per row (w4a16, w8a16; "
     "mlx_affine: 32, 64 or 128)"},
    {"bits", QD_PARAM_INT, OFF(bits), 0, "4", 1, 8, 0, NULL,
     "mlx_affine: bits per code, 1, 2, 3, 4, 5, 6 or 8"},
    {"symmetric", QD_PARAM_BOOL, OFF(symmetric), 0, "true", 0, 0, 0, NULL,
     "w4a16/w8a16: scale = max|x| / 7.5 (127.5) and no zero point (false: (max - min) / 15 (255) "
     "and a zero point)"},
    {"scale_dtype", QD_PARAM_ENUM, OFF(scale_dtype), 0, "auto", 0, 0, 0, scale_dtypes,
     "w4a16/w8a16/w8a8/fp8_e4m3, mlx_affine: the scales' dtype, the weight's (auto resolves to it when "
     "quantizing; dequantizing reads it, whatever the output dtype; fp8_e4m3 flow=transformers: f32)"},
    {"global_scale", QD_PARAM_FLOAT, OFF(global_scale), OFF(has_global_scale), NULL, 0, 0, 0,
     NULL, "nvfp4: encode scale 448*6/amax (TensorRT-LLM convention), computed when absent; mlx_nvfp4: "
     "mlx's global_scale (mlx-lm passes the tensor's amax; the encode factor is 2688/global_scale), none when absent"},
    {"per_tensor_scale", QD_PARAM_FLOAT, OFF(per_tensor_scale), OFF(has_per_tensor_scale), NULL,
     0, 0, 0, NULL, "decode scale amax/(448*6) (torchao convention); wins over global_scale"},
    {"two_level", QD_PARAM_BOOL, OFF(two_level), 0, "true", 0, 0, 0, NULL,
     "use a per-tensor scale (false: torchao's single-level E4M3 scales)"},
    {"flow", QD_PARAM_ENUM, OFF(flow), 0, "torchao", 0, 0, 0, flows,
     "whose arithmetic: nvfp4 torchao's nvfp4_quantize, or compressed_tensors (llm-compressor NVFP4A16: "
     "global scale 2688/amax in the weight's dtype, scales and codes as its compressor computes them); "
     "fp8_e4m3 compressed_tensors (llm-compressor FP8 / FP8_DYNAMIC / FP8_BLOCK: scale amax / 448 in the "
     "weight's dtype) or transformers (FineGrainedFP8: f32, x * (448 / amax), weight_scale_inv = its inverse)"},
    {"scale_layout", QD_PARAM_ENUM, OFF(scale_layout), 0, "linear", 0, 0, 0, layouts,
     "linear [rows, cols/block] or the swizzled 128x4 tensor-core tiling"},
    {"scale_rounding", QD_PARAM_ENUM, OFF(scale_rounding), 0, "floor", 0, 0, 0, roundings,
     "E8M0 scale rule: floor (OCP v1.0), rceil (NVIDIA cvt.rp.ue8m0) or even (mxfp4 only: "
     "compressed-tensors' MXFP4A16, the amax rounded to a power of two up from mantissa 1.75 in the weight's dtype)"},
    {"granularity", QD_PARAM_ENUM, OFF(granularity), 0, "tensor", 0, 0, 0, granularities,
     "int8/uint8: one scale for the tensor or one per row; fp8_e4m3: tensor, channel (one per row) or "
     "block (one per block of each matrix: the block parameter)"},
    {"block", QD_PARAM_BLOCK, OFF(block_rows), 0, "128x128", 1, QD_FP8_MAX_BLOCK, 0, NULL,
     "fp8_e4m3 granularity=block: ROWSxCOLS elements per scale (at most 16384 in all; partial blocks at "
     "the edges of each matrix)"},
    {"fp6_packing", QD_PARAM_ENUM, OFF(fp6_packing), 0, "packed", 0, 0, 0, fp6_packings,
     "fp6 codes packed 4 per 3 bytes, or one per byte (torchao)"},
    {"allow_nonfinite", QD_PARAM_BOOL, OFF(allow_nonfinite), 0, "false", 0, 0, 0, NULL,
     "accept NaN/Inf input (results follow the peer's arithmetic, see docs/formats.md)"},
};
const int qd_param_desc_count = (int)(sizeof qd_param_descs / sizeof qd_param_descs[0]);

/* ---- layouts -------------------------------------------------------------------------------- */

static void comp(struct qd_component *c, const char *name, enum qd_dtype dt, int ndim,
                 int64_t d0, int64_t d1)
{
    c->name = name;
    c->in_scale_dtype = 0;
    c->dtype = dt;
    c->ndim = ndim;
    c->shape[0] = d0;
    c->shape[1] = ndim > 1 ? d1 : 1;
    c->bytes = d0 * c->shape[1] * (int64_t)qd_dtype_size(dt);
}

static int cols_multiple(const struct qd_format *f, int64_t cols, int block, char *err, size_t len)
{
    if (cols % block == 0)
        return 1;
    snprintf(err, len, "%s needs the last dimension to be a multiple of %d (got %" PRId64 ")",
             f->name, block, cols);
    return 0;
}

static int layout_bnb4(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                       int64_t cols, struct qd_component *c, char *err, size_t len)
{
    (void)f, (void)err, (void)len;
    int64_t n = rows * cols, nblocks = (n + p->blocksize - 1) / p->blocksize;
    comp(&c[0], "data", QD_U8, 1, (n + 1) / 2, 0);
    if (!p->double_quant) {
        comp(&c[1], "absmax", QD_F32, 1, nblocks, 0);
        comp(&c[2], "quant_map", QD_F32, 1, 16, 0);
        return 3;
    }
    comp(&c[1], "absmax", QD_U8, 1, nblocks, 0);
    comp(&c[2], "nested_absmax", QD_F32, 1, (nblocks + 255) / 256, 0);
    comp(&c[3], "nested_quant_map", QD_F32, 1, 256, 0);
    comp(&c[4], "quant_map", QD_F32, 1, 16, 0);
    return 5;
}

static int layout_ggml(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                       int64_t cols, struct qd_component *c, char *err, size_t len)
{
    (void)p;
    if (!cols_multiple(f, cols, QD_GGML_QK, err, len))
        return -1;
    comp(&c[0], "data", QD_U8, 2, rows, cols / QD_GGML_QK * f->block_bytes);
    return 1;
}

static int layout_iquant(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                         int64_t cols, struct qd_component *c, char *err, size_t len)
{
    (void)p;
    if (!cols_multiple(f, cols, f->block_elems, err, len))
        return -1;
    comp(&c[0], "data", QD_U8, 2, rows, cols / f->block_elems * f->block_bytes);
    return 1;
}

static int layout_kquant(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                         int64_t cols, struct qd_component *c, char *err, size_t len)
{
    (void)p;
    if (!cols_multiple(f, cols, QD_QK_K, err, len))
        return -1;
    comp(&c[0], "data", QD_U8, 2, rows, cols / QD_QK_K * f->block_bytes);
    return 1;
}

/* compressed-tensors pack-quantized integers (the format's code: 4 or 8 bits), weight [out, in],
 * 32 / bits codes per int32; weight_scale takes the weight's dtype (qd_format_layout sets it:
 * F32 here stands for it) */
static int layout_ctint(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                        int64_t cols, struct qd_component *c, char *err, size_t len)
{
    const int per = 32 / f->code;
    if (p->group_size % 8 != 0) {
        snprintf(err, len, "%s needs group_size to be a multiple of 8 (got %d)", f->name, p->group_size);
        return -1;
    }
    if (!cols_multiple(f, cols, p->group_size, err, len))
        return -1;
    comp(&c[0], "weight_packed", QD_I32, 2, rows, cols / per);
    comp(&c[1], "weight_scale", QD_F32, 2, rows, cols / p->group_size);
    c[1].in_scale_dtype = 1;
    if (p->symmetric)
        return 2;
    comp(&c[2], "weight_zero_point", QD_I32, 2, (rows + per - 1) / per, cols / p->group_size);
    return 3;
}

static int layout_awq(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                      int64_t cols, struct qd_component *c, char *err, size_t len)
{
    (void)f;
    if (rows % p->group_size != 0) {
        snprintf(err, len, "awq needs K (the first dimension, %" PRId64 ") to be a multiple of "
                 "group_size %d", rows, p->group_size);
        return -1;
    }
    if (cols % 8 != 0) {
        snprintf(err, len, "awq needs N (the last dimension, %" PRId64 ") to be a multiple of 8",
                 cols);
        return -1;
    }
    comp(&c[0], "qweight", QD_I32, 2, rows, cols / 8);
    comp(&c[1], "qzeros", QD_I32, 2, rows / p->group_size, cols / 8);
    comp(&c[2], "scales", QD_F16, 2, rows / p->group_size, cols);
    return 3;
}

static void scale_comp(struct qd_component *c, const struct qd_params *p, int64_t rows,
                       int64_t scale_cols)
{
    if (p->scale_layout == QD_LAYOUT_SWIZZLED)
        comp(c, "scales", QD_U8, 2, (rows + 127) / 128 * 128, (scale_cols + 3) / 4 * 4);
    else
        comp(c, "scales", QD_U8, 2, rows, scale_cols);
}

static int layout_mx(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                     int64_t cols, struct qd_component *c, char *err, size_t len)
{
    if (!cols_multiple(f, cols, QD_MX_BLOCK, err, len))
        return -1;
    if (p->scale_rounding == QD_ROUND_EVEN && f->code != QD_E2M1) {
        snprintf(err, len, "scale_rounding=even is compressed-tensors' MXFP4 rule: %s takes floor or rceil",
                 f->name);
        return -1;
    }
    int bytes = qd_mx_block_data_bytes(f->code, p->fp6_packing == QD_FP6_UNPACKED);
    comp(&c[0], "data", QD_U8, 2, rows, cols / QD_MX_BLOCK * bytes);
    scale_comp(&c[1], p, rows, cols / QD_MX_BLOCK);
    return 2;
}

static int layout_nvfp4(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                        int64_t cols, struct qd_component *c, char *err, size_t len)
{
    if (!cols_multiple(f, cols, QD_NVFP4_BLOCK, err, len))
        return -1;
    if (p->flow == QD_FLOW_TRANSFORMERS) {
        snprintf(err, len, "nvfp4 takes flow=torchao or compressed_tensors (transformers is fp8_e4m3's)");
        return -1;
    }
    if (p->flow == QD_FLOW_COMPRESSED_TENSORS && (!p->two_level || p->has_per_tensor_scale)) {
        snprintf(err, len, "flow=compressed_tensors always has a global scale (global_scale, the encode "
                 "scale 2688/amax); per_tensor_scale and two_level=false are torchao's");
        return -1;
    }
    if (p->flow == QD_FLOW_COMPRESSED_TENSORS && p->has_global_scale &&
        !(p->global_scale > 0.0f && p->global_scale <= 3.40282347e38f)) {
        snprintf(err, len, "global_scale must be a positive finite number");
        return -1;
    }
    comp(&c[0], "data", QD_U8, 2, rows, cols / 2);
    scale_comp(&c[1], p, rows, cols / QD_NVFP4_BLOCK);
    comp(&c[2], "global_scale", QD_F32, 1, 1, 0);
    return 3;
}

static int layout_int8(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                       int64_t cols, struct qd_component *c, char *err, size_t len)
{
    if (p->granularity != QD_GRAN_TENSOR && p->granularity != QD_GRAN_ROW) {
        snprintf(err, len, "%s takes granularity=tensor or row (channel and block are fp8_e4m3's)", f->name);
        return -1;
    }
    int64_t nscale = p->granularity == QD_GRAN_ROW ? rows : 1;
    comp(&c[0], "data", f->code ? QD_U8 : QD_I8, 2, rows, cols);
    comp(&c[1], "scale", QD_F32, 1, nscale, 0);
    if (!f->code)
        return 2;
    comp(&c[2], "zero_point", QD_U8, 1, nscale, 0);
    return 3;
}

/* MLX: weight u32 [rows, cols * bits / 32] (each row one little-endian bit stream); affine adds
 * scales and biases in the input's dtype, the float modes one scale byte per group. */
static int layout_mlx(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                      int64_t cols, struct qd_component *c, char *err, size_t len)
{
    static const int bits[] = {[QD_MLX_MXFP4] = 4, [QD_MLX_NVFP4] = 4, [QD_MLX_MXFP8] = 8};
    static const int group[] = {[QD_MLX_MXFP4] = QD_MLX_MX_GROUP, [QD_MLX_NVFP4] = QD_MLX_NV_GROUP,
                                [QD_MLX_MXFP8] = QD_MLX_MX_GROUP};
    int affine = f->code == QD_MLX_AFFINE;
    int b = affine ? p->bits : bits[f->code], g = affine ? p->group_size : group[f->code];
    if (affine && (b == 7 || (g != 32 && g != 64 && g != 128))) {
        snprintf(err, len, "mlx_affine takes bits 1, 2, 3, 4, 5, 6 or 8 and group_size 32, 64 or 128 (got "
                 "bits=%d, group_size=%d)", b, g);
        return -1;
    }
    if (!cols_multiple(f, cols, g, err, len))
        return -1;
    if (f->code == QD_MLX_NVFP4 && rows * cols % 32) {
        snprintf(err, len, "mlx_nvfp4 packs 8 codes per word across the tensor in 32-element units: it needs "
                 "the element count to be a multiple of 32 (got %" PRId64 ", an odd number of 16-element "
                 "groups)", rows * cols);
        return -1;
    }
    comp(&c[0], "weight", QD_U32, 2, rows, cols * b / 32);
    if (!affine) {
        comp(&c[1], "scales", QD_U8, 2, rows, cols / g);
        return 2;
    }
    comp(&c[1], "scales", QD_F32, 2, rows, cols / g);
    comp(&c[2], "biases", QD_F32, 2, rows, cols / g);
    c[1].in_scale_dtype = c[2].in_scale_dtype = 1;
    return 3;
}

/* What mx.dequantize returns unless asked: affine the scales' dtype, the float modes bf16, nvfp4
 * with a global scale f32 (its scale is computed in f32). */
static enum qd_dtype mlx_affine_dequant_dtype(const struct qd_params *p, enum qd_dtype in)
{
    return (enum qd_dtype)qd_mlx_scale_dtype_to(p->scale_dtype, in);
}

static enum qd_dtype mlx_fp_dequant_dtype(const struct qd_params *p, enum qd_dtype in)
{
    (void)in;
    return p->has_global_scale ? QD_F32 : QD_BF16;
}

/* fp8_e4m3 and w8a8 (kernels/fp8.h): the 8-bit weight and one scale per tensor, row or block, named
 * as compressed-tensors (weight_scale, in the weight's dtype) or transformers (weight_scale_inv,
 * f32) saves them */
static int layout_fp8(const struct qd_format *f, const struct qd_params *p, int64_t rows,
                      int64_t cols, struct qd_component *c, char *err, size_t len)
{
    if (f->code == QD_FP8_E4M3 && p->flow == QD_FLOW_TORCHAO) {
        snprintf(err, len, "fp8_e4m3 takes flow=compressed_tensors (llm-compressor FP8, FP8_DYNAMIC, FP8_BLOCK) "
                 "or transformers (FineGrainedFP8)");
        return -1;
    }
    if (f->code == QD_FP8_E4M3 && p->granularity == QD_GRAN_ROW) {
        snprintf(err, len, "fp8_e4m3 takes granularity=tensor, channel (one scale per row) or block");
        return -1;
    }
    struct qd_fp8_plan k = qd_fp8_plan_for(f, p, p->layout_dtype);
    if (!k.ct && p->scale_dtype != QD_SCALE_AUTO && p->scale_dtype != QD_SCALE_F32) {
        snprintf(err, len, "flow=transformers keeps its scales (weight_scale_inv) in f32: scale_dtype must be "
                 "auto or f32");
        return -1;
    }
    if (k.gran == QD_GRAN_BLOCK && (int64_t)k.block_rows * k.block_cols > QD_FP8_MAX_BLOCK) {
        snprintf(err, len, "fp8_e4m3 blocks hold at most %d elements (got block=%dx%d)", QD_FP8_MAX_BLOCK,
                 k.block_rows, k.block_cols);
        return -1;
    }
    int64_t mrows = p->layout_matrix_rows > 0 ? p->layout_matrix_rows : rows;
    static const enum qd_dtype of_code[] = {QD_F32, QD_F16, QD_BF16};
    enum qd_dtype sdt = of_code[k.dt];
    const char *sname = k.ct ? "weight_scale" : "weight_scale_inv";
    comp(&c[0], "weight", k.int8 ? QD_I8 : QD_U8, 2, rows, cols);
    if (k.gran == QD_GRAN_TENSOR)
        comp(&c[1], sname, sdt, 1, 1, 0);
    else if (k.gran == QD_GRAN_CHANNEL)
        comp(&c[1], sname, sdt, 2, rows, 1);
    else
        comp(&c[1], sname, sdt, 2, qd_fp8_block_rows(rows, mrows, k.block_rows),
             (cols + k.block_cols - 1) / k.block_cols);
    return 2;
}

/* ---- the table ------------------------------------------------------------------------------ */

static const char *const bnb4_params[] = {"blocksize", "double_quant", "offset", "allow_nonfinite", NULL};
static const char *const ggml_params[] = {"allow_nonfinite", NULL};
static const char *const kquant_params[] = {NULL};
static const char *const ctint_params[] = {"group_size", "symmetric", "scale_dtype", NULL};
static const char *const awq_params[] = {"group_size", "allow_nonfinite", NULL};
static const char *const mx_params[] = {"scale_rounding", "scale_layout", "allow_nonfinite", NULL};
static const char *const mx6_params[] = {"scale_rounding", "scale_layout", "fp6_packing",
                                         "allow_nonfinite", NULL};
static const char *const nvfp4_params[] = {"global_scale", "per_tensor_scale", "two_level",
                                           "scale_layout", "flow", "allow_nonfinite", NULL};
static const char *const int8_params[] = {"granularity", "allow_nonfinite", NULL};
static const char *const nvfp4_defaults[] = {"scale_layout=swizzled", NULL};
static const char *const mlx_affine_params[] = {"bits", "group_size", "scale_dtype", NULL};
static const char *const mlx_affine_defaults[] = {"group_size=64", NULL};
static const char *const mlx_fp_params[] = {NULL};
static const char *const mlx_nvfp4_params[] = {"global_scale", NULL};
static const char *const mlx_nvfp4_defaults[] = {"global_scale=", NULL}; /* none: single-level */
static const char *const fp8_params[] = {"granularity", "block", "flow", "scale_dtype", NULL};
static const char *const w8a8_params[] = {"scale_dtype", NULL};
static const char *const fp8_defaults[] = {"granularity=channel", "flow=compressed_tensors", NULL};

#define BNB4(nm, cd, dc)                                                                        \
    {.name = nm, .family = "bnb4", .doc = dc, .block_elems = 64, .block_axis = "flat",         \
     .bits_per_weight = 4.0 + 8.0 / 64 + 32.0 / (256 * 64), .code = cd, .params = bnb4_params,  \
     .layout = layout_bnb4, .backend = BACKENDS(bnb4)}
/* imp: the backends that honour an importance vector (QD_IMPORTANCE_ON bits) */
#define ANY_BACKEND (QD_IMPORTANCE_ON(QD_BACKEND_CPU) | QD_IMPORTANCE_ON(QD_BACKEND_CUDA))
#define GGML(nm, cd, bytes, gguf, ftype, imp, dc)                                               \
    {.name = nm, .importance = imp, .family = "ggml", .doc = dc, .block_elems = 32, .block_bytes = bytes,         \
     .block_axis = "last", .bits_per_weight = bytes * 8.0 / 32, .code = cd,                    \
     .gguf_type = gguf, .gguf_file_type = ftype, .params = ggml_params, .layout = layout_ggml,  \
     .backend = BACKENDS(ggml)}
#define KQUANT(nm, cd, bytes, gguf, ftype, dc)                                                  \
    {.name = nm, .importance = ANY_BACKEND, .family = "kquant", .doc = dc, .block_elems = QD_QK_K, .block_bytes = bytes,  \
     .block_axis = "last", .bits_per_weight = bytes * 8.0 / QD_QK_K, .code = cd,               \
     .gguf_type = gguf, .gguf_file_type = ftype, .params = kquant_params,                      \
     .layout = layout_kquant, .backend = BACKENDS(kquant)}
/* ggml's iq4_nl/iq4_xs/ternary/MXFP4 (kernels/iquants.h) */
#define IQUANT(nm, cd, elems, bytes, gguf, ftype, imp, dc)                                      \
    {.name = nm, .family = "iquant", .doc = dc, .block_elems = elems, .block_bytes = bytes,    \
     .block_axis = "last", .bits_per_weight = bytes * 8.0 / elems, .code = cd,                 \
     .gguf_type = gguf, .gguf_file_type = ftype, .params = kquant_params, .importance = imp,   \
     .layout = layout_iquant, .backend = BACKENDS(iquant)}
/* ggml's grid-searched iq3_xxs/iq1_s/iq1_m (kernels/iqgrid_quants.h) */
#define IQGRID(nm, cd, bytes, gguf, ftype, needs, dc)                                          \
    {.name = nm, .family = "iqgrid", .doc = dc, .block_elems = QD_QK_K, .block_bytes = bytes,  \
     .block_axis = "last", .bits_per_weight = bytes * 8.0 / QD_QK_K, .code = cd,               \
     .gguf_type = gguf, .gguf_file_type = ftype, .params = kquant_params,                      \
     .importance = ANY_BACKEND, .importance_required = needs, .layout = layout_iquant,             \
     .backend = BACKENDS(iqgrid)}
#define MLX_FP(nm, cd, group, bits, prm, dflt, dc)                                              \
    {.name = nm, .family = "mlx", .doc = dc, .block_elems = group, .block_axis = "last",        \
     .bits_per_weight = bits + 8.0 / group, .code = cd, .params = prm, .param_defaults = dflt,  \
     .layout = layout_mlx, .backend = BACKENDS(mlx), .dequant_dtype = mlx_fp_dequant_dtype}
#define MX(nm, cd, bits, prm, dc)                                                               \
    {.name = nm, .family = "mx", .doc = dc, .block_elems = 32, .block_axis = "last",           \
     .bits_per_weight = bits + 8.0 / 32, .code = cd, .params = prm, .layout = layout_mx,       \
     .backend = BACKENDS(mx)}

const struct qd_format qd_formats[] = {
    BNB4("nf4", 0, "bitsandbytes NormalFloat4 (quantize_4bit quant_type='nf4')"),
    BNB4("fp4", 1, "bitsandbytes FP4 (quantize_4bit quant_type='fp4')"),
    GGML("q4_0", QD_Q4_0, sizeof(struct qd_block_q4_0), 2, 2, ANY_BACKEND, "ggml block_q4_0: f16 d, 32 x 4-bit"),
    GGML("q4_1", QD_Q4_1, sizeof(struct qd_block_q4_1), 3, 3, ANY_BACKEND, "ggml block_q4_1: f16 d, f16 m, 32 x 4-bit"),
    GGML("q5_0", QD_Q5_0, sizeof(struct qd_block_q5_0), 6, 8, ANY_BACKEND, "ggml block_q5_0: f16 d, 32 x 5-bit"),
    GGML("q5_1", QD_Q5_1, sizeof(struct qd_block_q5_1), 7, 9, ANY_BACKEND, "ggml block_q5_1: f16 d, f16 m, 32 x 5-bit"),
    GGML("q8_0", QD_Q8_0, sizeof(struct qd_block_q8_0), 8, 7, ANY_BACKEND /* read and ignored, as ggml does */, "ggml block_q8_0: f16 d, 32 x int8"),
    GGML("q8_1", QD_Q8_1, sizeof(struct qd_block_q8_1), 9, 0, 0, "ggml block_q8_1: f16 d, f16 s = d*sum(q), 32 x int8"),
    /* llama_ftype of the mix whose default type this is (llama-quantize --pure Q4_K writes 15) */
    KQUANT("q2_K", QD_Q2_K, sizeof(struct qd_block_q2_K), 10, 10, "ggml block_q2_K: 256 elements, 16 x (4-bit scale, 4-bit min), 2-bit codes"),
    KQUANT("q3_K", QD_Q3_K, sizeof(struct qd_block_q3_K), 11, 12, "ggml block_q3_K: 256 elements, 16 x 6-bit scales, 3-bit codes"),
    KQUANT("q4_K", QD_Q4_K, sizeof(struct qd_block_q4_K), 12, 15, "ggml block_q4_K: 256 elements, 8 x (6-bit scale, 6-bit min), 4-bit codes"),
    KQUANT("q5_K", QD_Q5_K, sizeof(struct qd_block_q5_K), 13, 17, "ggml block_q5_K: 256 elements, 8 x (6-bit scale, 6-bit min), 5-bit codes"),
    KQUANT("q6_K", QD_Q6_K, sizeof(struct qd_block_q6_K), 14, 18, "ggml block_q6_K: 256 elements, 16 x int8 scales, 6-bit codes"),
    IQUANT("iq4_nl", QD_IQ4_NL, QD_GGML_QK, sizeof(struct qd_block_iq4_nl), 20, 25, ANY_BACKEND,
           "ggml block_iq4_nl: f16 d, 32 x 4-bit indices into a 16-value non-linear grid"),
    IQUANT("iq4_xs", QD_IQ4_XS, QD_QK_K, sizeof(struct qd_block_iq4_xs), 23, 30, ANY_BACKEND,
           "ggml block_iq4_xs: 256 elements, f16 d, 8 x 6-bit scales, 4-bit non-linear grid indices"),
    IQUANT("tq1_0", QD_TQ1_0, QD_QK_K, sizeof(struct qd_block_tq1_0), 34, 36, ANY_BACKEND /* read and ignored, as ggml does */,
           "ggml block_tq1_0: 256 ternary codes (-1, 0, 1) x f16 d, five per byte"),
    IQUANT("tq2_0", QD_TQ2_0, QD_QK_K, sizeof(struct qd_block_tq2_0), 35, 37, ANY_BACKEND /* read and ignored, as ggml does */,
           "ggml block_tq2_0: 256 ternary codes (-1, 0, 1) x f16 d, two bits each"),
    {.name = "iq3_s", .family = "iq3s", .doc = "ggml block_iq3_s: 256 elements, f16 d, 8 x 4-bit scales, "
     "4-tuples of |x| as points of a 512-point grid, signs apart", .block_elems = QD_QK_K,
     .block_bytes = sizeof(struct qd_block_iq3_s), .block_axis = "last",
     .bits_per_weight = sizeof(struct qd_block_iq3_s) * 8.0 / QD_QK_K, .gguf_type = 21, .gguf_file_type = 26,
     .params = kquant_params, .importance = ANY_BACKEND, .layout = layout_iquant, .backend = BACKENDS(iq3s)},
    IQGRID("iq3_xxs", QD_IQ3_XXS, sizeof(struct qd_block_iq3_xxs), 18, 23, 0, "ggml block_iq3_xxs: 256 elements, f16 d, 8 x 4-bit scales, "
           "4-tuples of |x| as points of a 256-point grid, 7 sign bits per 8 values"),
    IQGRID("iq1_s", QD_IQ1_S, sizeof(struct qd_block_iq1_s), 19, 24, 1, "ggml block_iq1_s: 256 elements, f16 d, 8 x (3-bit scale, shift sign), "
           "8-tuples of ternary values as points of a 2048-point grid (importance required)"),
    IQGRID("iq1_m", QD_IQ1_M, sizeof(struct qd_block_iq1_m), 29, 31, 0, "ggml block_iq1_m: 256 elements, 16 x (3-bit scale), 32 shift signs, "
           "8-tuples of ternary values as points of a 2048-point grid, f16 d spread over the scales"),
    /* ggml's 2-bit grid types (kernels/iq2.h); iq2_xxs and iq2_xs quantize only with an importance */
#define IQ2(nm, cd, bytes, gguf, ftype, req, dc)                                                \
    {.name = nm, .family = "iq2", .doc = dc, .block_elems = QD_QK_K, .block_bytes = bytes,     \
     .block_axis = "last", .bits_per_weight = bytes * 8.0 / QD_QK_K, .code = cd, .gguf_type = gguf, \
     .gguf_file_type = ftype, .params = kquant_params, .importance = ANY_BACKEND,               \
     .importance_required = req, .layout = layout_iquant, .backend = BACKENDS(iq2)}
    IQ2("iq2_xxs", QD_IQ2_XXS, sizeof(struct qd_block_iq2_xxs), 16, 19, 1, "ggml block_iq2_xxs: 256 elements, f16 d, per 32 a 4-bit scale and "
        "four 8-tuples of |x| as points of a 256-point grid, 7 signs each (the eighth keeps an even count)"),
    IQ2("iq2_xs", QD_IQ2_XS, sizeof(struct qd_block_iq2_xs), 17, 20, 1, "ggml block_iq2_xs: 256 elements, f16 d, per 16 a 4-bit scale, "
        "8-tuples of |x| as points of a 512-point grid, 7 signs each (the eighth keeps an even count)"),
    IQ2("iq2_s", QD_IQ2_S, sizeof(struct qd_block_iq2_s), 22, 28, 0, "ggml block_iq2_s: 256 elements, f16 d, per 16 a 4-bit scale, "
        "8-tuples of |x| as points of a 1024-point grid, 8 signs each"),
    /* "mxfp4" is the OCP layout (scales apart, OCP rounding); llama.cpp's own MXFP4 type keeps its
     * exponent in the block and picks codes by least error: other bytes, hence its own name */
    IQUANT("mxfp4_ggml", QD_MXFP4_GGML, QD_GGML_QK, sizeof(struct qd_block_mxfp4_ggml), 39, 38, ANY_BACKEND /* read and ignored, as ggml does */,
           "ggml block_mxfp4 (llama.cpp's MXFP4, GGUF type 39): an E8M0 exponent, 32 x E2M1 codes"),
    {.name = "awq", .family = "awq", .doc = "AutoAWQ WQLinear_GEMM int4, input W [K, N]",
     .block_elems = 128, .block_axis = "rows", .bits_per_weight = 4.0 + 20.0 / 128,
     .params = awq_params, .layout = layout_awq, .backend = BACKENDS(awq), .matrix_only = 1},
    {.name = "w4a16", .family = "ctint", .doc = "compressed-tensors pack-quantized int4 weights, [out, in], "
     "groups along in (llm-compressor W4A16 / W4A16_ASYM)", .block_elems = 128, .block_axis = "last",
     .bits_per_weight = 4.0 + 16.0 / 128, .code = 4, .params = ctint_params, .layout = layout_ctint,
     .backend = BACKENDS(ctint)},
    {.name = "w8a16", .family = "ctint", .doc = "compressed-tensors pack-quantized int8 weights, [out, in], "
     "groups along in (llm-compressor W8A16)", .block_elems = 128, .block_axis = "last",
     .bits_per_weight = 8.0 + 16.0 / 128, .code = 8, .params = ctint_params, .layout = layout_ctint,
     .backend = BACKENDS(ctint)},
    {.name = "nvfp4", .family = "nvfp4", .doc = "NVFP4: E2M1, 16-element blocks, E4M3 scales, "
     "f32 per-tensor scale (torchao nvfp4_quantize)", .block_elems = 16, .block_axis = "last",
     .bits_per_weight = 4.5, .params = nvfp4_params, .param_defaults = nvfp4_defaults,
     .layout = layout_nvfp4, .backend = BACKENDS(nvfp4)},
    MX("mxfp4", QD_E2M1, 4, mx_params, "OCP MXFP4: E2M1 elements, E8M0 scale per 32"),
    MX("mxfp6_e2m3", QD_E2M3, 6, mx6_params, "OCP MXFP6 E2M3, E8M0 scale per 32"),
    MX("mxfp6_e3m2", QD_E3M2, 6, mx6_params, "OCP MXFP6 E3M2, E8M0 scale per 32"),
    MX("mxfp8_e4m3", QD_E4M3, 8, mx_params, "OCP MXFP8 E4M3, E8M0 scale per 32"),
    MX("mxfp8_e5m2", QD_E5M2, 8, mx_params, "OCP MXFP8 E5M2, E8M0 scale per 32"),
    {.name = "int8", .family = "int8", .doc = "symmetric int8, scale = amax/127",
     .block_axis = "flat", .bits_per_weight = 8, .code = 0, .params = int8_params,
     .layout = layout_int8, .backend = BACKENDS(int8), .checkpoint_as = "w8a16"},
    {.name = "uint8", .family = "int8", .doc = "asymmetric uint8 with zero point",
     .block_axis = "flat", .bits_per_weight = 8, .code = 1, .params = int8_params,
     .layout = layout_int8, .backend = BACKENDS(int8)},
    {.name = "mlx_affine", .family = "mlx", .doc = "MLX affine (mx.quantize mode='affine'): 1-8 bit codes, "
     "a scale and a bias per group in the input's dtype", .block_elems = 64, .block_axis = "last",
     .bits_per_weight = 4.0 + 32.0 / 64, .code = QD_MLX_AFFINE, .params = mlx_affine_params,
     .param_defaults = mlx_affine_defaults, .layout = layout_mlx, .backend = BACKENDS(mlx),
     .dequant_dtype = mlx_affine_dequant_dtype},
    MLX_FP("mlx_mxfp4", QD_MLX_MXFP4, 32, 4, mlx_fp_params, NULL,
           "MLX mxfp4 (mx.quantize mode='mxfp4'): E2M1 codes, an E8M0 scale per 32, MLX's rounding"),
    MLX_FP("mlx_nvfp4", QD_MLX_NVFP4, 16, 4, mlx_nvfp4_params, mlx_nvfp4_defaults,
           "MLX nvfp4 (mx.quantize mode='nvfp4'): E2M1 codes, an E4M3 scale per 16, optional global_scale"),
    MLX_FP("mlx_mxfp8", QD_MLX_MXFP8, 32, 8, mlx_fp_params, NULL,
           "MLX mxfp8 (mx.quantize mode='mxfp8'): E4M3 codes, an E8M0 scale per 32"),
    /* block_elems 0: the default scale covers a whole row (granularity=channel) */
    {.name = "fp8_e4m3", .family = "fp8", .doc = "FP8 E4M3 weights [out, in], one scale per tensor, channel or "
     "block: compressed-tensors (llm-compressor FP8, FP8_DYNAMIC, FP8_BLOCK) or transformers FineGrainedFP8",
     .block_axis = "last", .bits_per_weight = 8, .code = QD_FP8_E4M3, .params = fp8_params,
     .param_defaults = fp8_defaults, .layout = layout_fp8, .backend = BACKENDS(fp8)},
    {.name = "w8a8", .family = "fp8", .doc = "compressed-tensors int-quantized int8 weights [out, in], one "
     "symmetric scale per output channel (llm-compressor W8A8)", .block_axis = "last", .bits_per_weight = 8,
     .code = QD_FP8_INT8, .params = w8a8_params, .layout = layout_fp8, .backend = BACKENDS(fp8)},
};
const int qd_format_count = (int)(sizeof qd_formats / sizeof qd_formats[0]);

/* Format-specific defaults that differ from the parameter's own (the entry's param_defaults). */
const char *qd_format_param_default(const struct qd_format *f, const char *param)
{
    size_t n = strlen(param);
    for (const char *const *d = f->param_defaults; d && *d; d++)
        if (!strncmp(*d, param, n) && (*d)[n] == '=')
            return *d + n + 1;
    return NULL;
}

enum qd_dtype qd_format_dequant_dtype(const struct qd_format *f, const struct qd_params *p, enum qd_dtype in)
{
    return f->dequant_dtype ? f->dequant_dtype(p, in) : in;
}

const struct qd_format *qd_format_find(const char *name)
{
    for (int i = 0; name && i < qd_format_count; i++)
        if (!strcmp(qd_formats[i].name, name))
            return &qd_formats[i];
    return NULL;
}

const struct qd_param_desc *qd_param_find(const char *name)
{
    for (int i = 0; name && i < qd_param_desc_count; i++)
        if (!strcmp(qd_param_descs[i].name, name))
            return &qd_param_descs[i];
    return NULL;
}

int qd_format_accepts(const struct qd_format *f, const char *param)
{
    for (const char *const *p = f->params; *p; p++)
        if (!strcmp(*p, param))
            return 1;
    return 0;
}
