/* llama-quantize's type mixes (Q4_K_M, Q5_K_S, Q3_K_L, ...): which ggml type each tensor of a
 * GGUF model takes when `llama-quantize IN OUT TYPE` runs without --pure and without an
 * importance matrix (llama.cpp src/llama-quant.cpp llama_tensor_get_type_impl, as vendored in
 * llama-cpp-python 0.3.36). */
#ifndef QD_GGUF_RECIPE_H
#define QD_GGUF_RECIPE_H

#include "../../kernels/registry.h"
#include "checkpoint/gguf.h"

struct qd_gguf_recipe {
    const char *name;  /* as llama-quantize spells it: "Q4_K_M" */
    int ftype;         /* llama_ftype: general.file_type */
    const char *fmt;   /* the default type, quantd's format name */
};

/* NULL when llama-quantize has no such name or quantd does not write it (the IQ types, and
 * Q2_K_S, which needs an importance matrix). */
const struct qd_gguf_recipe *qd_gguf_recipe_find(const char *name);
/* The names quantd writes, space-separated (for messages and docs). */
const char *qd_gguf_recipe_names(void);

/* What the rules read from the model; counters advance as tensors are typed in the loader's
 * order. */
struct qd_recipe_state {
    const struct qd_gguf_recipe *r;
    int falcon, glm5_next, is_70b, tied;
    int n_gqa, n_expert, n_layer;
    int n_attention_wv, i_attention_wv, i_ffn_down;
};

void qd_recipe_init(struct qd_recipe_state *s, const struct qd_gguf_recipe *r, const struct qd_gguf *g);
/* The format for tensor t (one that tensor_allows_quantization lets through), before the shape
 * fallback. Call once per such tensor, in the loader's order. */
const struct qd_format *qd_recipe_format(struct qd_recipe_state *s, const struct qd_gguf_tensor *t);

#endif
