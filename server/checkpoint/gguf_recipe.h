/* llama-quantize's type mixes (Q4_K_M, Q5_K_S, Q3_K_L, ...): which ggml type each tensor of a
 * GGUF model takes when `llama-quantize IN OUT TYPE` runs without --pure and without an
 * importance matrix (llama.cpp src/llama-quant.cpp llama_tensor_get_type_impl, as vendored in
 * llama-cpp-python 0.3.36). */
#ifndef QD_GGUF_RECIPE_H
#define QD_GGUF_RECIPE_H

#include "../../kernels/registry.h"
#include "checkpoint/gguf.h"
#include "checkpoint/gguf_arch.h"
#include "checkpoint/gguf_options.h"

struct qd_gguf_recipe {
    const char *name;  /* as llama-quantize spells it: "Q4_K_M" */
    int ftype;         /* llama_ftype: general.file_type */
    const char *fmt;   /* the default type, quantd's format name; NULL for the float mixes and COPY */
    uint32_t type;     /* the float mixes: their ggml type (F32, F16, BF16) */
    int copy;          /* COPY: every tensor as it is, the input's file type */
};

/* NULL when llama-quantize has no such name or quantd does not write it. llama-quantize's numeric ids (its llama_ftype:
 * "15" is Q4_K_M) name the mix too. */
const struct qd_gguf_recipe *qd_gguf_recipe_find(const char *name);
/* The names quantd writes, space-separated (for messages and docs). */
const char *qd_gguf_recipe_names(void);
/* The table's entry i, in its order (the mixes, the float mixes, then the aliases), NULL past
 * the last: what api/openapi.yaml's Recipe enum is made from. */
const struct qd_gguf_recipe *qd_gguf_recipe_at(int i);

/* What the rules read from the model; counters advance as tensors are typed in the loader's
 * order. */
struct qd_recipe_state {
    const struct qd_gguf_recipe *r;      /* NULL: one type for all (--fmt) */
    const struct qd_gguf_options *opt;   /* never NULL */
    uint32_t default_type;               /* ggml type id */
    int pure;                            /* no mix rules (--fmt, --pure) */
    int has_imatrix;                     /* an importance matrix is given (set after init) */
    const struct qd_gguf_arch *arch;     /* never NULL */
    int is_70b, tied;
    int n_gqa, n_expert, n_layer;
    int n_attention_wv, i_attention_wv, i_ffn_down, i_ffn_gate, i_ffn_up;
};

/* r NULL: default_type for every tensor (llama-quantize --pure). opt NULL: the defaults. The
 * tensors counted are names[0..n) (after --prune-layers). */
void qd_recipe_init(struct qd_recipe_state *s, const struct qd_gguf_recipe *r, uint32_t default_type,
                    const struct qd_gguf_options *opt, const struct qd_gguf *g, const char *const *names, int n);
/* llama_tensor_get_type: the ggml type for tensor t (named name: t's after --prune-layers), one
 * that tensor_allows_quantization lets through, with the user's overrides and the shape
 * fallback applied; QD_GGUF_TYPE_NONE when a row fits no block and llama.cpp has no fallback
 * for the type. Call once per such tensor, in the loader's order. */
uint32_t qd_recipe_type(struct qd_recipe_state *s, const struct qd_gguf_tensor *t, const char *name);
/* tensor_requires_imatrix: whether llama-quantize refuses to write tensor name as type without
 * an importance matrix (the 1- to 3-bit IQ types but IQ3_S, and Q2_K_S's Q2_K tensors; never
 * token_embd or output). */
int qd_recipe_requires_imatrix(const struct qd_recipe_state *s, const char *name, uint32_t type);
/* The registry format that writes ggml type id `type`, or NULL. */
const struct qd_format *qd_gguf_format_of(uint32_t type);

#endif
