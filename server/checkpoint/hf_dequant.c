/* Back to float: a quantized Hugging Face checkpoint in, the unquantized layout transformers
 * loads out (`--fmt bf16|f16|f32`). The input's kind comes from config.json's
 * quantization_config (sources[] below); this file turns back these, hf_dequant_bnb.c and
 * hf_dequant_awq.c their families:
 * - transformers' FineGrainedFP8 (quant_method "fp8"; DeepSeek-V3, Qwen3-FP8): <m>.weight e4m3
 *   and <m>.weight_scale_inv f32, one per weight_block_size block (partial edge blocks):
 *   DeepSeek's fp8_cast_bf16 arithmetic, code (e4m3 -> f32) times the block's scale in f32,
 *   rounded once to the output dtype;
 * - compressed-tensors "float-quantized" / "int-quantized" (FP8_DYNAMIC, FP8_BLOCK, W8A8):
 *   <m>.weight e4m3 / int8 and <m>.weight_scale (per tensor, channel or block), decompressed as
 *   compressed-tensors does in a model of the output dtype (transformers' from_pretrained with
 *   dtype=...: the scale parameter is that dtype), x_q.to(scale.dtype) * scale: the scale cast to
 *   the output dtype, the product rounded once to it;
 * - compressed-tensors "pack-quantized" (W4A16, W4A16_ASYM, W8A16): <m>.weight_packed (int32
 *   words, each row's codes packed densely from bit 0, offset by 2^(bits-1)), <m>.weight_scale
 *   per group or channel, <m>.weight_shape, and without symmetry <m>.weight_zero_point (the same
 *   packing down each column of the [rows, groups] zero points); decompressed the same way,
 *   (x_q - zero_point) in the output dtype (exact) times the scale;
 * - compressed-tensors nvfp4-/mxfp4-pack-quantized (NVFP4A16, MXFP4A16): two e2m1 codes a byte
 *   (low nibble first) times the group's scale in f32 (e4m3 / weight_global_scale, or e8m0),
 *   then one cast to the output dtype (transformers' decompressed bf16 model).
 * Every other tensor is copied as it is, the scales are dropped, and config.json loses
 * quantization_config and says the output dtype (transformers' save_pretrained of the model
 * loaded with dequantize=True). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "../../kernels/fp.h"
#include "../../kernels/fp8.h"
#include "checkpoint/hf_dequant.h"
#include "checkpoint/pipeline.h"

/* The input layouts read back, by config.json's quantization_config. */
struct source {
    const char *quant_method, *format; /* format NULL: any */
    const char *format_key;            /* where quantization_config names the format (NULL: "format") */
    const char *must_be_true;          /* a key of quantization_config that must be true (NULL: none) */
    const struct qd_hf_dequant_family *family; /* its own plan (NULL: this file's, with the fields below) */
    const char *scale_suffix;          /* the scale tensor beside <m>.weight */
    const char *block_key;             /* where the block's [rows, cols] is (NULL: none) */
    int scale_cast;                    /* the scale is cast to the output dtype (qd_hf_out) */
    int packed;                        /* <m>.weight_packed and <m>.weight_shape for <m>.weight */
    int fp4;                           /* <m>.weight_packed: two e2m1 codes a byte; 1 NVFP4 (e4m3 group
                                          scales over weight_global_scale), 2 MXFP4 (e8m0 scales) */
};
static const struct source sources[] = {
    {"fp8", NULL, NULL, NULL, NULL, "weight_scale_inv", "weight_block_size", 0, 0, 0},
    {"compressed-tensors", "float-quantized", NULL, NULL, NULL, "weight_scale", "block_structure", 1, 0, 0},
    {"compressed-tensors", "int-quantized", NULL, NULL, NULL, "weight_scale", "block_structure", 1, 0, 0},
    {"compressed-tensors", "pack-quantized", NULL, NULL, NULL, "weight_scale", "block_structure", 1, 1, 0},
    {"compressed-tensors", "nvfp4-pack-quantized", NULL, NULL, NULL, "weight_scale", "block_structure", 0, 0, 1},
    {"compressed-tensors", "mxfp4-pack-quantized", NULL, NULL, NULL, "weight_scale", "block_structure", 0, 0, 2},
    {"bitsandbytes", NULL, NULL, "load_in_4bit", &qd_hf_dequant_bnb, NULL, NULL, 0, 0, 0},
    {"awq", "gemm", "version", NULL, &qd_hf_dequant_awq, NULL, NULL, 0, 0, 0},
};
static const char supported[] = "transformers' FineGrainedFP8 (quant_method \"fp8\": DeepSeek-V3, Qwen3-FP8), "
                                "compressed-tensors float-quantized / int-quantized (FP8_DYNAMIC, FP8_BLOCK, W8A8), "
                                "pack-quantized (W4A16, W4A16_ASYM, W8A16), nvfp4-pack-quantized (NVFP4A16), "
                                "mxfp4-pack-quantized (MXFP4A16), transformers + bitsandbytes 4-bit (nf4, fp4) and "
                                "AutoAWQ GEMM";

/* Tensors of a quantized module that this reader does not turn back into a weight. */
static const char *const unsupported_suffixes[] = {"weight_zero_point", "weight_global_scale", "input_scale", NULL};

static const cJSON *member(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* The source layout config.json names, or NULL with why. */
static const struct source *source_of(const cJSON *config, char *err, size_t errlen)
{
    const cJSON *q = member(config, "quantization_config");
    if (!cJSON_IsObject(q)) {
        snprintf(err, errlen, "convert: the model's config.json has no quantization_config: it is not quantized, "
                 "there is nothing to convert back (quantd reads back %s)", supported);
        return NULL;
    }
    const char *method = cJSON_GetStringValue(member(q, "quant_method")), *format = NULL, *flag = NULL;
    for (size_t i = 0; method && i < sizeof sources / sizeof *sources; i++) {
        const struct source *r = &sources[i];
        if (strcmp(r->quant_method, method))
            continue;
        format = cJSON_GetStringValue(member(q, r->format_key ? r->format_key : "format"));
        if (r->format && (!format || strcasecmp(r->format, format))) /* (AutoAWQ spells it "GEMM" in its quant_config) */
            continue;
        if (r->must_be_true && !cJSON_IsTrue(member(q, r->must_be_true))) {
            flag = r->must_be_true;
            continue;
        }
        return r;
    }
    snprintf(err, errlen, "convert: back to float is not supported from quant_method '%.40s'%s%.40s%s%s%.40s%s; "
             "quantd reads back %s", method ? method : "(none)", format ? " (format '" : "", format ? format : "",
             format ? "')" : "", flag ? " (" : "", flag ? flag : "", flag ? " is not true)" : "", supported);
    return NULL;
}

/* The block of a block-quantized source: [rows, cols] from quantization_config (FineGrainedFP8's
 * weight_block_size, compressed-tensors' weights.block_structure of a config group), 128x128 when
 * absent. */
static void config_block(const cJSON *config, const struct source *src, int block[2])
{
    const cJSON *q = member(config, "quantization_config"), *b = member(q, src->block_key), *g;
    if (!b)
        cJSON_ArrayForEach(g, member(q, "config_groups")) {
            const cJSON *s = member(member(g, "weights"), src->block_key);
            if (cJSON_GetArraySize(s) == 2)
                b = s;
        }
    block[0] = block[1] = 128;
    cJSON_ArrayForEach(g, member(q, "config_groups")) { /* group strategy: one scale per group of a row */
        const cJSON *gs = member(member(g, "weights"), "group_size");
        if (!b && cJSON_IsNumber(gs) && gs->valueint > 0)
            block[0] = 1, block[1] = gs->valueint;
    }
    if (cJSON_GetArraySize(b) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(b, 0)) &&
        cJSON_IsNumber(cJSON_GetArrayItem(b, 1)) && cJSON_GetArrayItem(b, 0)->valueint > 0 &&
        cJSON_GetArrayItem(b, 1)->valueint > 0) {
        block[0] = cJSON_GetArrayItem(b, 0)->valueint;
        block[1] = cJSON_GetArrayItem(b, 1)->valueint;
    }
}

int qd_hf_ends_with(const char *s, const char *end)
{
    size_t n = strlen(s), m = strlen(end);
    return n >= m && !strcmp(s + n - m, end) && (n == m || s[n - m - 1] == '.');
}

const struct qd_st_entry *qd_hf_tensor_named(const struct qd_hf_shard *sh, const char *name)
{
    for (int k = 0; k < sh->st.n; k++)
        if (!strcmp(sh->st.t[k].name, name))
            return &sh->st.t[k];
    return NULL;
}

void qd_hf_store(void *out, size_t k, float v, enum qd_dtype odt)
{
    if (odt == QD_F32)
        memcpy((char *)out + k * 4, &v, 4);
    else {
        const uint16_t h = odt == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
        memcpy((char *)out + k * 2, &h, 2);
    }
}

/* The tensor named <module of weight>.<suffix> in the shard, or NULL. */
static const struct qd_st_entry *sibling(const struct qd_hf_shard *sh, const char *weight, const char *suffix)
{
    const char *dot = strrchr(weight, '.');
    const size_t m = dot ? (size_t)(dot - weight) + 1 : 0;
    for (int k = 0; k < sh->st.n; k++) {
        const char *n = sh->st.t[k].name;
        if (!strncmp(n, weight, m) && !strcmp(n + m, suffix))
            return &sh->st.t[k];
    }
    return NULL;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The weights config's group 0 quantizes (compressed-tensors' config_groups), or NULL */
static const cJSON *group_weights(const cJSON *config)
{
    const cJSON *g, *w = NULL;
    cJSON_ArrayForEach(g, member(member(config, "quantization_config"), "config_groups"))
        w = w ? w : member(g, "weights");
    return w;
}

/* plan_tensor for the sources of this file: a weight and its scale (and zero point) */
static int plan_scaled(const cJSON *config, const struct source *src, const struct qd_hf_shard *sh, int i,
                       struct qd_hf_out *out, char *err, size_t errlen)
{
    const struct qd_st_entry *t = &sh->st.t[i];
    const int asym = src->packed && cJSON_IsFalse(member(group_weights(config), "symmetric"));
    if (src->fp4 == 1 && qd_hf_ends_with(t->name, "weight_global_scale"))
        return 2;
    if (asym && qd_hf_ends_with(t->name, "weight_zero_point")) /* read with its weight */
        return 2;
    for (const char *const *u = unsupported_suffixes; *u; u++)
        if (qd_hf_ends_with(t->name, *u)) {
            snprintf(err, errlen, "convert: tensor '%.200s': back to float reads %s, without %s tensors", t->name,
                     supported, *u);
            return -1;
        }
    if (qd_hf_ends_with(t->name, src->scale_suffix) || (src->packed && qd_hf_ends_with(t->name, "weight_shape")))
        return 2;
    if (!qd_hf_ends_with(t->name, src->packed || src->fp4 ? "weight_packed" : "weight"))
        return 0;
    const int fp8 = !strcmp(t->dtype, "F8_E4M3"), int8 = !strcmp(t->dtype, "I8");
    const int packed = src->packed && !strcmp(t->dtype, "I32"), fp4 = src->fp4 && !strcmp(t->dtype, "U8");
    const struct qd_st_entry *s = sibling(sh, t->name, src->scale_suffix);
    if (!fp8 && !int8 && !packed && !fp4)
        return 0; /* a weight left unquantized (the head, embeddings, norms, an ignored module) */
    if (!s) {
        snprintf(err, errlen, "convert: tensor '%.200s' (%s) has no %s beside it in its shard: quantd reads a "
                 "quantized weight's scale from the same .safetensors file", t->name, t->dtype, src->scale_suffix);
        return -1;
    }
    const char *want_scale = src->fp4 == 1 ? "F8_E4M3" : src->fp4 == 2 ? "U8" : NULL;
    if (t->ndim != 2 || (want_scale ? strcmp(s->dtype, want_scale)
                                    : strcmp(s->dtype, "F32") && strcmp(s->dtype, "F16") && strcmp(s->dtype, "BF16"))) {
        snprintf(err, errlen, "convert: tensor '%.200s': back to float reads 2-D weights with F32/F16/BF16 scales "
                 "(it has %d dimensions, its scale %s)", t->name, t->ndim, s->dtype);
        return -1;
    }
    /* the scale grid: [rows, 1] per channel, [1, 1] or [1] per tensor, [ceil(rows/br), ceil(cols/bc)]
     * per block (transformers saves a MoE expert's [1, n] or [n, 1] grid as [n]) */
    int64_t rows = t->shape[0], cols = t->shape[1];
    if (packed) { /* the weight's shape is weight_shape's; the bits, config's num_bits */
        const struct qd_st_entry *ws = sibling(sh, t->name, "weight_shape");
        const cJSON *nb = member(group_weights(config), "num_bits");
        out->packed_bits = cJSON_IsNumber(nb) ? nb->valueint : 0;
        int64_t shape[2] = {0, 0};
        if (ws && !strcmp(ws->dtype, "I64") && ws->ndim == 1 && ws->shape[0] == 2)
            memcpy(shape, ws->data, sizeof shape);
        if ((out->packed_bits != 4 && out->packed_bits != 8) || shape[0] != rows || shape[1] < 1 ||
            (shape[1] * out->packed_bits + 31) / 32 != cols) {
            snprintf(err, errlen, "convert: tensor '%.200s': back to float reads pack-quantized weights of 4 or 8 "
                     "bits with their weight_shape beside them in the same file", t->name);
            return -1;
        }
        cols = shape[1];
    }
    if (fp4) {
        cols *= 2;
        out->packed_bits = -src->fp4;
        if (src->fp4 == 1) { /* the global scale, one f32 */
            const struct qd_st_entry *g = sibling(sh, t->name, "weight_global_scale");
            if (!g || strcmp(g->dtype, "F32") || g->end - g->begin != 4) {
                snprintf(err, errlen, "convert: tensor '%.200s': an NVFP4 weight needs its weight_global_scale "
                         "(one F32) beside it in the same file", t->name);
                return -1;
            }
            memcpy(&out->gs, g->data, 4);
            out->has_gs = 1;
        }
    }
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++)
        n *= s->shape[d];
    int64_t sr = s->ndim == 2 ? s->shape[0] : 1, sc = s->ndim == 2 ? s->shape[1] : 1;
    int block[2];
    config_block(config, src, block);
    if (s->ndim == 1 && n > 1) {
        sr = cdiv(rows, block[0]) == n ? n : 1;
        sc = sr == 1 ? n : 1;
    }
    out->block[0] = sr == rows ? 1 : sr == 1 ? (int)rows : block[0];
    out->block[1] = sc == cols ? 1 : sc == 1 ? (int)cols : block[1];
    if (s->ndim > 2 || n != sr * sc || cdiv(rows, out->block[0]) != sr || cdiv(cols, out->block[1]) != sc) {
        snprintf(err, errlen, "convert: tensor '%.200s' [%lld, %lld]: its %s has %lld values, which is not one per "
                 "tensor, per row or per %dx%d block", t->name, (long long)rows, (long long)cols, src->scale_suffix,
                 (long long)n, block[0], block[1]);
        return -1;
    }
    if (asym) { /* [ceil(rows * bits / 32), groups] int32: each column's zero points packed down it */
        const struct qd_st_entry *z = sibling(sh, t->name, "weight_zero_point");
        if (!z || strcmp(z->dtype, "I32") || z->ndim != 2 || z->shape[0] != cdiv(rows * out->packed_bits, 32) ||
            z->shape[1] != sc) {
            snprintf(err, errlen, "convert: tensor '%.200s': an asymmetric pack-quantized weight needs its "
                     "weight_zero_point beside it in the same file, I32 [%lld, %lld] (packed as compressed-tensors "
                     "packs it)", t->name, (long long)cdiv(rows * out->packed_bits, 32), (long long)sc);
            return -1;
        }
        out->zero = z;
    }
    out->name = strdup(t->name);
    if ((packed || fp4) && out->name) /* <m>.weight_packed -> <m>.weight */
        out->name[strlen(out->name) - strlen("_packed")] = 0;
    out->shape[0] = rows, out->shape[1] = cols;
    out->scale = s;
    out->scale_cast = src->scale_cast;
    return out->name ? 1 : -1;
}

static int plan_tensor(const struct qd_convert_opts *o, const cJSON *config, const struct qd_hf_shard *sh, int i,
                       struct qd_hf_out *out, char *err, size_t errlen)
{
    const struct source *src = source_of(config, err, errlen);
    if (!src)
        return -1;
    const int r = src->family ? src->family->plan(member(config, "quantization_config"), sh, i, out, err, errlen)
                              : plan_scaled(config, src, sh, i, out, err, errlen);
    if (r == 1) {
        const char *dt = !strcmp(o->to_float, "f32") ? "F32" : !strcmp(o->to_float, "f16") ? "F16" : "BF16";
        out->dtype = dt;
        out->ndim = 2;
        out->bytes = (uint64_t)(out->shape[0] * out->shape[1]) * (dt[1] == '3' ? 4 : 2);
    }
    return r;
}

/* scale k of s, whose dtype is dt */
static float scale_at(const struct qd_st_entry *s, enum qd_dtype dt, int64_t k)
{
    if (dt == QD_F32) {
        float f;
        memcpy(&f, s->data + k * 4, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, s->data + k * 2, 2);
    return dt == QD_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
}

/* the scale of a float-/int-/pack-quantized weight, cast to the output dtype where it is */
static float scale_of(const struct qd_hf_out *t, const struct qd_st_entry *s, enum qd_dtype dt, int64_t k, int odc)
{
    const float scale = scale_at(s, dt, k);
    return t->scale_cast ? qd_ct_round(scale, odc) : scale;
}

/* zero point r of column g of a pack-quantized weight (bits each, packed down the columns) */
static int zero_at(const struct qd_hf_out *t, int64_t r, int64_t g)
{
    const int bits = t->packed_bits;
    const int64_t groups = t->zero->shape[1], w = r * bits / 32;
    uint32_t word;
    memcpy(&word, t->zero->data + (size_t)(w * groups + g) * 4, 4);
    return (int)((word >> (r * bits % 32)) & ((1u << bits) - 1)) - (1 << (bits - 1));
}

struct rows_job {
    const struct qd_hf_out *t;
    const void *in;
    void *out;
};

/* rows [r0, r1) of one weight */
static int process_rows(void *ctx, int64_t r0, int64_t r1)
{
    const struct rows_job *job = ctx;
    const struct qd_hf_out *t = job->t;
    const void *in = job->in;
    void *out = job->out;
    if (t->dequant) /* bitsandbytes, AutoAWQ: their own arithmetic */
        return t->dequant(t, in, out, r0, r1);
    const struct qd_st_entry *w = t->src, *s = t->scale;
    const int int8 = !strcmp(w->dtype, "I8"), bits = t->packed_bits; /* (< 0: fp4) */
    /* FineGrainedFP8: the product in f32, then one cast to the output dtype; compressed-tensors:
     * the scale in the output dtype, the product rounded to it (the codes are exact there) */
    const enum qd_dtype odt = qd_hf_st_to_dtype(t->dtype), sdtype = qd_hf_st_to_dtype(s->dtype);
    const int odc = qd_fp8_dtype_code(odt), sdt = t->scale_cast ? odc : 0;
    const int64_t cols = t->shape[1], sc = cdiv(cols, t->block[1]);
    const int64_t words = bits > 0 ? cdiv(cols * bits, 32) : 0;
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    const uint8_t *q = in;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t srow = (r / t->block[0]) * sc;
        for (int64_t c = 0; c < cols; c++) {
            float v;
            if (bits < 0) { /* fp4: code c is byte c/2's low (even c) or high nibble; the product in f32 */
                const uint8_t b = q[r * (cols / 2) + c / 2], sb = s->data[srow + c / t->block[1]];
                const float scale = bits == -1 ? qd_e4m3_to_f32(sb) / t->gs : qd_e8m0_to_f32(sb);
                v = e2m1[c & 1 ? b >> 4 : b & 15] * scale;
            } else if (bits) { /* code c of the row: bits c*bits.. of its words, less the offset */
                uint32_t word;
                memcpy(&word, q + (size_t)(r * words + c * bits / 32) * 4, 4);
                int code = (int)((word >> (c * bits % 32)) & ((1u << bits) - 1)) - (1 << (bits - 1));
                if (t->zero) /* x_q - zero_point: exact in every output dtype (|.| < 2^bits) */
                    code -= zero_at(t, r, c / t->block[1]);
                v = qd_ct_round((float)code * scale_of(t, s, sdtype, srow + c / t->block[1], odc), sdt);
            } else
                v = qd_fp8_value(q[r * cols + c], scale_of(t, s, sdtype, srow + c / t->block[1], odc), int8, sdt);
            qd_hf_store(out, (size_t)(r * cols + c), v, odt);
        }
    }
    return 0;
}

/* A weight's rows go to every core: one core alone turns an 8B FP8 model back to bf16 slower
 * than a disk writes it. */
static enum qd_status process(const struct qd_hf_out *t, const void *in, void *out, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    struct rows_job job = {t, in, out};
    /* spans of at least 1 Mi outputs: threads only where they pay for their start */
    const int64_t min_rows = (((int64_t)1 << 20) + t->shape[1] - 1) / t->shape[1];
    qd_pipe_rows(t->shape[0], min_rows, process_rows, &job);
    return QD_OK;
}

/* (the hf_convert.c run asks for a quantization_config; config.json's is removed) */
static cJSON *no_config(const struct qd_convert_opts *o, const struct qd_arch_rules *rules,
                        const struct qd_hf_shard *sh, int nshards, const char *compute_dtype)
{
    return cJSON_CreateObject();
}

/* transformers' save_pretrained writes the loaded model's dtype */
#define DEQUANT_LAYOUT(var, torch_name)                                                                               \
    static const struct qd_hf_config_key var##_keys[] = {{"dtype", "\"" torch_name "\"", 0}};                        \
    const struct qd_hf_layout_desc var = {                                                                            \
        .tool = "transformers (dequantized)",                                                                         \
        .arch = QD_HF_CT,                                                                                             \
        .config_newline = 1,                                                                                          \
        .config_keys = var##_keys,                                                                                    \
        .nconfig_keys = 1,                                                                                            \
        .plain_norms = 1,                                                                                             \
        .quantization_config = no_config,                                                                             \
        .plan_tensor = plan_tensor,                                                                                   \
        .process = process,                                                                                           \
    };
DEQUANT_LAYOUT(qd_hf_dequant_bf16, "bfloat16")
DEQUANT_LAYOUT(qd_hf_dequant_f16, "float16")
DEQUANT_LAYOUT(qd_hf_dequant_f32, "float32")

/* The table's check: config.json names a layout this reader takes (0), or -1 with why. */
int qd_convert_hf_dequant_check(const char *src, enum qd_convert_input in, char *err, size_t errlen)
{
    if (in != QD_INPUT_HF_DIR) { /* (a single file has no config.json naming its quantization) */
        snprintf(err, errlen, "%s: back to float reads a Hugging Face model directory, whose config.json names its "
                 "quantization (%s)", src, supported);
        return -1;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", src);
    struct qd_mapped m;
    char e2[256];
    if (qd_map_file(path, &m, e2, sizeof e2)) {
        snprintf(err, errlen, "%s: %s", path, e2);
        return -1;
    }
    cJSON *config = cJSON_ParseWithLength((const char *)m.data, m.size);
    qd_unmap_file(&m);
    if (!cJSON_IsObject(config)) {
        snprintf(err, errlen, "%s: a readable JSON config.json is needed beside the weights", path);
        cJSON_Delete(config);
        return -1;
    }
    const int r = source_of(config, err, errlen) ? 0 : -1;
    cJSON_Delete(config);
    return r;
}
