/* The 8-bit layouts (formats fp8_e4m3 and w8a8, kernels/fp8.h):
 * - compressed-tensors, as llm-compressor 0.14.0.1's data-free `oneshot` with a
 *   QuantizationModifier (targets Linear, ignore lm_head) then
 *   `save_pretrained(save_compressed=True)` writes its FP8_DYNAMIC (fp8_e4m3, granularity=channel),
 *   FP8_BLOCK (granularity=block, 128x128) and W8A8 (w8a8) presets: per Linear <m>.weight
 *   (F8_E4M3, or I8 for W8A8: the naive "float-quantized" / "int-quantized" compressors keep the
 *   name) and <m>.weight_scale (the weight's dtype, [out, 1] or one per block), and config.json's
 *   quantization_config with the preset's dynamic input activations;
 * - transformers 5.17's FineGrainedFP8 (fp8_e4m3, flow=transformers), as
 *   from_pretrained(quantization_config=FineGrainedFP8Config()) then save_pretrained writes it
 *   (and as DeepSeek-V3 and Qwen3-FP8 checkpoints are laid out): <m>.weight (F8_E4M3) and
 *   <m>.weight_scale_inv (F32, one per 128x128 block), quant_method "fp8".
 * FP8 (a static per-tensor input scale, which needs calibration data) is refused. */
#include <stdio.h>
#include <string.h>

#include "../../kernels/fp8.h"
#include "checkpoint/hf_layout.h"

/* compressed-tensors' 8-bit presets differ in data only. */
struct scheme {
    const char *format;       /* compressed-tensors' format */
    const char *type;         /* "float" or "int" */
    const char *act_strategy; /* the dynamic input activations' strategy */
    int act_group;            /* their group size (0: null) */
};
static const struct scheme fp8_dynamic = {"float-quantized", "float", "token", 0};
static const struct scheme fp8_block = {"float-quantized", "float", "group", 128};
static const struct scheme w8a8 = {"int-quantized", "int", "token", 0};

static const struct scheme *scheme_of(const struct qd_convert_opts *o)
{
    return o->f->code == QD_FP8_INT8 ? &w8a8 : o->params.granularity == QD_GRAN_BLOCK ? &fp8_block : &fp8_dynamic;
}

/* quantd's components keep their names (weight, weight_scale / weight_scale_inv); the codes are
 * saved as torch saves float8_e4m3fn and int8 tensors */
static void component(const struct qd_convert_opts *o, const struct qd_st_entry *t, const struct qd_component *c,
                      int k, struct qd_hf_out *out)
{
    out->name = qd_hf_module_name(t->name, c->name);
    out->dtype = k ? qd_hf_dtype_to_st(c->dtype) : c->dtype == QD_I8 ? "I8" : "F8_E4M3";
    out->ndim = c->ndim;
    out->shape[0] = c->shape[0], out->shape[1] = c->shape[1];
}

/* An expert of a MoE (".experts.N."): transformers 5.17 stacks the experts into one 3-D
 * parameter (FP8Experts) and its save splits the stacked scales back per expert, dropping their
 * dimensions of size 1 (a [1, 2] or [2, 1] grid is saved as [2]). */
static int fused_expert(const char *name)
{
    for (const char *p = strstr(name, ".experts."); p; p = strstr(p + 1, ".experts."))
        if (p[9] >= '0' && p[9] <= '9')
            return 1;
    return 0;
}

static void fg_component(const struct qd_convert_opts *o, const struct qd_st_entry *t, const struct qd_component *c,
                         int k, struct qd_hf_out *out)
{
    component(o, t, c, k, out);
    if (k && out->ndim == 2 && fused_expert(t->name) && (out->shape[0] == 1) != (out->shape[1] == 1)) {
        out->shape[0] = out->shape[0] == 1 ? out->shape[1] : out->shape[0];
        out->ndim = 1;
    }
}

/* one QuantizationArgs as compressed-tensors serializes it (keys sorted) */
static cJSON *args(const char *type, int dynamic, int group_size, const char *strategy, const struct qd_params *block,
                   const char *observer)
{
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNullToObject(a, "actorder");
    if (block) {
        const int b[2] = {block->block_rows, block->block_cols};
        cJSON_AddItemToObject(a, "block_structure", cJSON_CreateIntArray(b, 2));
    } else
        cJSON_AddNullToObject(a, "block_structure");
    cJSON_AddBoolToObject(a, "dynamic", dynamic);
    if (group_size)
        cJSON_AddNumberToObject(a, "group_size", group_size);
    else
        cJSON_AddNullToObject(a, "group_size");
    cJSON_AddNumberToObject(a, "num_bits", 8);
    if (observer)
        cJSON_AddStringToObject(a, "observer", observer);
    else
        cJSON_AddNullToObject(a, "observer");
    cJSON_AddObjectToObject(a, "observer_kwargs");
    cJSON_AddNullToObject(a, "scale_dtype");
    cJSON_AddStringToObject(a, "strategy", strategy);
    cJSON_AddBoolToObject(a, "symmetric", 1);
    cJSON_AddStringToObject(a, "type", type);
    cJSON_AddNullToObject(a, "zp_dtype");
    return a;
}

/* compressed-tensors' quantization_config for FP8_DYNAMIC / FP8_BLOCK / W8A8 */
static cJSON *ct_config(const struct qd_convert_opts *o, const struct qd_arch_rules *rules,
                        const struct qd_hf_shard *sh, int nshards, const char *compute_dtype)
{
    const struct scheme *s = scheme_of(o);
    const int block = s == &fp8_block;
    cJSON *ignore = qd_hf_ct_ignore(rules, sh, nshards);
    if (!ignore)
        return NULL;
    cJSON *q = cJSON_CreateObject(), *groups = cJSON_AddObjectToObject(q, "config_groups");
    cJSON *g = cJSON_AddObjectToObject(groups, "group_0");
    cJSON_AddStringToObject(g, "format", s->format);
    cJSON_AddItemToObject(g, "input_activations", args(s->type, 1, s->act_group, s->act_strategy, NULL, NULL));
    cJSON_AddNullToObject(g, "output_activations");
    cJSON_AddItemToObject(g, "targets", cJSON_CreateStringArray((const char *[]){"Linear"}, 1));
    cJSON_AddItemToObject(g, "weights", args(s->type, 0, 0, block ? "block" : "channel", block ? &o->params : NULL,
                                             "memoryless_minmax"));
    return qd_hf_ct_config_close(q, s->format, ignore);
}

/* FineGrainedFP8Config's to_dict as save_pretrained writes it (keys sorted) */
static cJSON *fg_config(const struct qd_convert_opts *o, const struct qd_arch_rules *rules,
                        const struct qd_hf_shard *sh, int nshards, const char *compute_dtype)
{
    cJSON *q = cJSON_CreateObject();
    const int b[2] = {o->params.block_rows, o->params.block_cols};
    cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
    cJSON_AddBoolToObject(q, "dequantize", 0);
    cJSON_AddNullToObject(q, "modules_to_convert");
    cJSON_AddNullToObject(q, "modules_to_not_convert");
    cJSON_AddStringToObject(q, "quant_method", "fp8");
    cJSON_AddStringToObject(q, "scale_fmt", "float");
    cJSON_AddItemToObject(q, "weight_block_size", cJSON_CreateIntArray(b, 2));
    return q;
}

/* FineGrainedFP8HfQuantizer.update_tp_plan: the model class's expert-parallel plan, each
 * "grouped_gemm" entry joined by its "_scale_inv", written into the config it saves. The
 * classes' plans (transformers 5.17) of the MoE types in the architecture table: */
static const struct {
    const char *model_type, *plan;
} ep_plans[] = {
#define EXPERTS_PLAN                                                                                                   \
    "{\"layers.*.mlp.experts\": \"moe_tp_experts\", \"layers.*.mlp.experts.down_proj\": \"grouped_gemm\", "       \
    "\"layers.*.mlp.experts.down_proj_scale_inv\": \"grouped_gemm\", \"layers.*.mlp.experts.gate_up_proj\": "        \
    "\"grouped_gemm\", \"layers.*.mlp.experts.gate_up_proj_scale_inv\": \"grouped_gemm\", \"layers.*.mlp.gate\": "  \
    "\"ep_router\"}"
    {"mixtral", EXPERTS_PLAN},
    {"deepseek_v3", EXPERTS_PLAN},
    {"qwen2_moe", EXPERTS_PLAN},
    {"qwen3_moe", EXPERTS_PLAN},
#undef EXPERTS_PLAN
};

static cJSON *fg_config_extra(const cJSON *config, const char **key)
{
    const char *model_type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(config, "model_type"));
    for (size_t i = 0; model_type && i < sizeof ep_plans / sizeof *ep_plans; i++)
        if (!strcmp(ep_plans[i].model_type, model_type)) {
            *key = "base_model_ep_plan";
            return cJSON_Parse(ep_plans[i].plan);
        }
    return NULL;
}

/* FineGrainedFP8 has block scales only (weight_block_size) */
static void fg_prepare(struct qd_convert_opts *o) { o->params.granularity = QD_GRAN_BLOCK; }


const struct qd_hf_layout_desc qd_hf_fp8_transformers = {
    .tool = "transformers FineGrainedFP8",
    .arch = QD_HF_CT, /* nn.Linear and the experts (FP8Experts), not the routers: compressed-tensors' set */
    .config_newline = 1, /* save_pretrained */
    .plain_norms = 1,
    .prepare = fg_prepare,
    .config_extra = fg_config_extra,
    .component = fg_component,
    .quantization_config = fg_config,
};

static const struct qd_hf_layout_desc *pick(const struct qd_format *f, const struct qd_params *p, char *err,
                                            size_t errlen)
{
    if (f->code == QD_FP8_INT8)
        return &qd_hf_ct_fp8;
    if (p->flow == QD_FLOW_TRANSFORMERS)
        return &qd_hf_fp8_transformers;
    if (p->granularity == QD_GRAN_TENSOR) {
        snprintf(err, errlen, "convert: fp8_e4m3 granularity=tensor is compressed-tensors' FP8 preset, whose static "
                 "per-tensor input scale needs calibrated activation statistics, which quantd does not take; "
                 "use granularity=channel (FP8_DYNAMIC) or granularity=block (FP8_BLOCK), whose activations are "
                 "quantized at run time");
        return NULL;
    }
    return &qd_hf_ct_fp8;
}

/* The table's row for the 8-bit formats: compressed-tensors unless flow=transformers */
const struct qd_hf_layout_desc qd_hf_ct_fp8 = {
    .tool = "compressed-tensors",
    .arch = QD_HF_CT,
    .component = component,
    .pick = pick,
    .quantization_config = ct_config,
};
