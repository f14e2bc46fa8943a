/* The AutoAWQ GEMM layout: what AutoAWQ 0.2.9's quantize (without its activation-aware search)
 * and save_quantized write: per Linear <m>.qweight, .qzeros, .scales from the weight transposed
 * to [in, out]; every other float tensor cast to f16 (its model is half); AwqConfig's
 * quantization_config. AutoAWQ loads the model in float16 with use_cache=False
 * (BaseAWQForCausalLM.from_pretrained) and saves that config: its dtype key (where the source has
 * one) says float16 and use_cache is false. */
#include "checkpoint/hf_layout.h"

/* AwqConfig.to_transformers_dict(), in its order */
static cJSON *quantization_config(const struct qd_convert_opts *o, const struct qd_arch_rules *rules,
                                  const struct qd_hf_shard *sh, int nshards, const char *compute_dtype)
{
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "quant_method", "awq");
    cJSON_AddBoolToObject(q, "zero_point", 1);
    cJSON_AddNumberToObject(q, "group_size", o->params.group_size);
    cJSON_AddNumberToObject(q, "bits", 4);
    cJSON_AddStringToObject(q, "version", "gemm");
    int nskip = 0; /* AutoAWQ's model class's modules_to_not_convert (Mixtral: ["gate"]) */
    while (rules && rules->skip && rules->skip[nskip])
        nskip++;
    if (nskip)
        cJSON_AddItemToObject(q, "modules_to_not_convert", cJSON_CreateStringArray(rules->skip, nskip));
    else
        cJSON_AddNullToObject(q, "modules_to_not_convert");
    return q;
}

static const struct qd_hf_config_key keys[] = {
    {"torch_dtype", "\"float16\"", 1}, {"dtype", "\"float16\"", 1}, {"use_cache", "false", 0}};
_Static_assert(sizeof keys / sizeof *keys <= QD_HF_MAX_CONFIG_KEYS, "QD_HF_MAX_CONFIG_KEYS");

const struct qd_hf_layout_desc qd_hf_awq = {
    .tool = "AutoAWQ",
    .arch = QD_HF_AWQ,
    .cast_f16 = 1,
    .transpose = 1,
    .config_newline = 1,
    .config_keys = keys,
    .nconfig_keys = sizeof keys / sizeof *keys,
    .component = qd_hf_module_component,
    .quantization_config = quantization_config,
};
