/* What llama-quantize does differently per model architecture (general.architecture), as data:
 * llama.cpp src/llama-quant.cpp (as vendored in llama-cpp-python 0.3.36) reads the architecture
 * in tensor_allows_quantization, llama_tensor_get_type_impl and its model-type checks. An
 * architecture the table lacks follows the generic rules (every field zero). */
#ifndef QD_GGUF_ARCH_H
#define QD_GGUF_ARCH_H

struct qd_gguf_arch {
    const char *name;            /* general.architecture */
    int falcon_rules;            /* the mixes' Falcon branches (output Q8_0, attn/ffn_down ladders) */
    int mxfp4_ffn_experts_only;  /* MXFP4_MOE writes only the ffn experts MXFP4, other 3-D tensors Q8_0 */
    int layers_70b;              /* the block count of its 70B model type (llm_type LLM_TYPE_70B); 0: none */
    int layers_70b_with_gqa;     /* ... and only when n_head != n_head_kv (llama's 70B vs its 65B) */
    const char *const *keep;     /* names containing any of these stay unquantized (NULL-terminated) */
    const char *const *q8_0;     /* names containing any of these take Q8_0 in every mix */
};

/* The entry for arch (NULL or unknown: the generic one, named ""). Never NULL. */
const struct qd_gguf_arch *qd_gguf_arch_find(const char *arch);
/* Whether name contains any of list's strings (list NULL: no). */
int qd_gguf_arch_names_any(const char *name, const char *const *list);

#endif
