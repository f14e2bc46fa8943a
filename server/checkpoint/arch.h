/* Which weights each runtime's tool quantizes, per model architecture (config.json's model_type)
 * and checkpoint layout: a table generated from what the tools themselves wrote for tiny models
 * of each architecture (tests/fixtures/arch/, derive_arch_table.py -> arch_table.c; docs/convert.md
 * lists it). A model type the table lacks converts by the generic rule (qd_arch_generic). */
#ifndef QD_ARCH_H
#define QD_ARCH_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* The Hugging Face layouts quantd writes: transformers + bitsandbytes, compressed-tensors
 * (llm-compressor), AutoAWQ GEMM. */
enum qd_hf_layout { QD_HF_BNB, QD_HF_CT, QD_HF_AWQ, QD_HF_LAYOUTS };

/* Name patterns over tensor (or module) names: '*' stands for one run of decimal digits (a layer
 * or expert index), every other character for itself. NULL-terminated lists. */
struct qd_arch_rules {
    const char *const *quantize; /* the weights the tool quantizes */
    const char *const *keep;     /* weights the generic rule would quantize and the tool leaves as
                                    they are (routers, experts that are not nn.Linear) */
    const char *const *ignore;   /* compressed-tensors: the modules its quantization_config's
                                    "ignore" lists, in the model's module order */
    const char *const *to_f32;   /* kept tensors the tool saves as F32 whatever their dtype
                                    (transformers' _keep_in_fp32_modules) */
    const char *const *offset_norm; /* kept tensors the tool rewrites as dtype(dtype(1 + w) - 1)
                                    (llm-compressor's round trip of Gemma's 1 + w norms) */
    const char *const *skip;     /* AutoAWQ: its config's modules_to_not_convert (NULL: null) */
    const char *none;            /* no rule for this layout: why (the tool does not support it) */
};

struct qd_arch {
    const char *model_type;
    struct qd_arch_rules layout[QD_HF_LAYOUTS];
};

/* The generated table, ended by an entry whose model_type is NULL. */
extern const struct qd_arch qd_arch_table[];

/* The entry for a model_type, or NULL. */
const struct qd_arch *qd_arch_find(const char *model_type);

/* 1 when name matches pattern ('*' = one run of digits). */
int qd_arch_match(const char *pattern, const char *name);

/* The first pattern of a list that name matches, its index; -1 for none (or no list). */
int qd_arch_find_pattern(const char *const *patterns, const char *name);

enum qd_arch_decision { QD_ARCH_QUANTIZE, QD_ARCH_KEEP, QD_ARCH_UNLISTED };

/* What the rules say of a weight name: quantize, keep, or nothing (the generic rule decides). */
enum qd_arch_decision qd_arch_decide(const struct qd_arch_rules *r, const char *name);

/* The generic rule, for model types the table lacks: every 2-D F32/F16/BF16 "<module>.weight"
 * whose module's last name contains no "embed" and is not wte, wpe or lm_head (transformers'
 * nn.Linear modules on Llama-like models). dtype is the safetensors dtype name. */
int qd_arch_generic(const char *name, int ndim, const char *dtype);

/* compressed-tensors' quantization_config "ignore" for a model whose tensors are names[0..n): the
 * modules (tensor names less ".weight") matching a pattern of r->ignore that has an index, in the
 * model's module order (by layer, then in the order of the patterns: llm-compressor lists the
 * unquantized Linear-like modules as named_modules() walks them), then the literal patterns
 * (lm_head, listed whether or not the head is tied). r NULL or without a list: ["lm_head"]. A new
 * cJSON array, NULL without memory. */
cJSON *qd_arch_ignore_list(const struct qd_arch_rules *r, const char *const *names, size_t n);

/* The layer index of a name ("model.layers.12.mlp.gate" -> 12; the first run of digits between
 * dots), or -1 without one. */
long qd_arch_layer(const char *name);

#endif
