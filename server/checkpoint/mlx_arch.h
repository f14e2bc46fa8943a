/* mlx-lm's model classes as data (mlx_lm/models/<type>.py of mlx-lm 0.32.2): what each class's
 * sanitize drops, renames, stacks and splits, and what its quant_predicate and cast_predicate
 * change; and what mlx-lm's load needs of a source directory (a tokenizer). mlx_convert.c writes
 * MLX directories by these rules. */
#ifndef QD_MLX_ARCH_H
#define QD_MLX_ARCH_H

#include <cjson/cJSON.h>

/* A MoE layer's experts "<layer>.<moe>.experts.E.<from>.weight" stacked (experts 0..n-1, in
 * order) into "<layer>.<moe>.switch_mlp.<to>.weight", as the class's sanitize does. */
struct qd_mlx_stack {
    const char *moe;               /* ".block_sparse_moe." (NULL: no experts to stack) */
    const char *const (*names)[2]; /* {from, to}, NULL-terminated */
};

/* The class's quant_predicate giving a module its own affine params, whatever the mode: a
 * module path ending in `suffix` (recorded per module in config.json's quantization). */
struct qd_mlx_own_params {
    const char *suffix;
    int bits, group_size;
};

struct qd_mlx_arch {
    const char *model_type;
    const char *const *drop;  /* a tensor whose name contains one of these is dropped */
    const char *drop_prefix;  /* a tensor whose name starts with it is dropped (NULL: none) */
    int tied_drops_head;      /* tie_word_embeddings true: lm_head.weight dropped */
    struct qd_mlx_stack stack;
    struct qd_mlx_own_params own; /* suffix NULL: none */
    const char *const *keep;  /* weights of modules without to_quantized (MoEGate): never quantized */
    const char *no_cast;      /* cast_predicate: a tensor whose name contains it keeps its dtype */
    /* MLA (DeepSeek-V3): each self_attn.kv_b_proj [heads * (nope + v), rank] becomes per-head
     * embed_q = W[:, :nope, :] transposed ([heads, rank, nope]) and unembed_out = W[:, nope:, :]
     * ([heads, v, rank]), MultiLinear modules quantized like the rest */
    int mla_split;
    /* config.json keys its ModelArgs requires that a transformers 5 config may lack (NULL-ended) */
    const char *const *needs;
};

/* The entry for a model_type, or NULL. */
const struct qd_mlx_arch *qd_mlx_arch_find(const char *model_type);

/* Whether mlx-lm's save puts a copy of dir/name in its output (the tokenizer's files, *.py,
 * generation_config.json) and it is a regular file. */
int qd_mlx_copied_file(const char *dir, const char *name);

/* dir/name, a JSON object read as Python reads it (hf_config.h), or NULL with err. */
cJSON *qd_mlx_read_json(const char *dir, const char *name, char *err, size_t errlen);

#endif
