/* A GGUF model as the forward engine runs it: its architecture's row (model_arch.c), its
 * hyperparameters read once from the metadata as llama.cpp's loader reads them
 * (llama_model::load_hparams), the vocabulary facts a pass needs (size, BOS), and its tensors,
 * read a block at a time and dequantized to f32 (model_load.c). */
#ifndef QD_MODEL_H
#define QD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/gguf_shards.h"
#include "../../kernels/nn.h"

/* The tensors of one block, by role. A row of the architecture table says which it needs and
 * which it may have; the GGUF names are "blk.N." + qd_model_weight_names[role]. */
enum qd_model_weight {
    QD_W_ATTN_NORM,
    QD_W_ATTN_Q, QD_W_ATTN_Q_B,
    QD_W_ATTN_K, QD_W_ATTN_K_B,
    QD_W_ATTN_V, QD_W_ATTN_V_B,
    QD_W_ATTN_Q_NORM, QD_W_ATTN_K_NORM,
    QD_W_ATTN_OUT, QD_W_ATTN_OUT_B,
    QD_W_FFN_NORM,
    QD_W_FFN_GATE, QD_W_FFN_GATE_B,
    QD_W_FFN_UP, QD_W_FFN_UP_B,
    QD_W_FFN_DOWN, QD_W_FFN_DOWN_B,
    /* mixture of experts (arch_moe.c): the router, the experts' 3-D weights [n_expert][rows][cols],
     * a shared expert and its scalar gate (qwen2moe) */
    QD_W_FFN_GATE_INP,
    QD_W_FFN_GATE_EXPS, QD_W_FFN_UP_EXPS, QD_W_FFN_DOWN_EXPS,
    QD_W_FFN_GATE_INP_SHEXP, QD_W_FFN_GATE_SHEXP, QD_W_FFN_UP_SHEXP, QD_W_FFN_DOWN_SHEXP,
    QD_W_FFN_EXP_PROBS_B,
    /* DeepSeek's multi-head latent attention (arch_deepseek2.c): q through a low-rank pair
     * with a norm between (or one q), the compressed key/value and the shared rope key, their
     * norm, and the expansion to heads (kv_b, or its halves k_b / v_b per head) */
    QD_W_ATTN_QA, QD_W_ATTN_QA_NORM, QD_W_ATTN_QB,
    QD_W_ATTN_KV_A_MQA, QD_W_ATTN_KV_A_NORM, QD_W_ATTN_KV_B, QD_W_ATTN_K_B_MLA, QD_W_ATTN_V_B_MLA,
    /* ---- dense architectures beyond llama (gemma2, gemma3, phi3) ---- */
    QD_W_ATTN_QKV,                             /* phi3: q, k and v in one matrix, in that order */
    QD_W_ATTN_POST_NORM, QD_W_FFN_POST_NORM,   /* gemma: norms of each sub-block's output */
    QD_W_COUNT
};

#define QD_W_BIT(w) (1ull << (w))

extern const char *const qd_model_weight_names[QD_W_COUNT];

enum qd_norm_kind { QD_NORM_RMS, QD_NORM_LAYER };

#define QD_MODEL_MAX_LAYERS 512 /* llama.cpp's LLAMA_MAX_LAYERS */

struct qd_model_hparams {
    int64_t n_vocab, n_embd, n_layer, n_ff;
    int n_head, n_head_kv, head_dim_k, head_dim_v;
    int64_t n_ctx_train;
    float norm_eps;             /* rms or layer norm epsilon, as the architecture's norm takes */
    float attn_scale;           /* the scores' scale: 1/sqrt(head_dim_k) unless the file names one */
    struct qd_nn_rope rope;     /* freq_factors set once rope_freqs.weight is read */
    /* mixture of experts (n_expert 0: a dense FFN): expert_count, expert_used_count, the
     * experts' and the shared expert's widths, and the routing (kernels/nn.h) */
    int n_expert, n_expert_used;
    int64_t n_ff_exp, n_ff_shexp;
    struct qd_nn_moe_gating gating;
    int n_dense_lead;          /* leading blocks with a dense FFN (leading_dense_block_count) */
    int n_expert_shared;       /* DeepSeek's shared experts, one FFN n_expert_shared * n_ff_exp wide */
    /* DeepSeek's latent attention (0 elsewhere): the ranks of q's and kv's compressions, each
     * head's key (nope + rope) and value sizes, and whether the file splits kv_b into k_b / v_b
     * (attention.key_length_mla: the absorbed form llama.cpp runs as one shared key/value head) */
    int n_lora_q, n_lora_kv, head_dim_k_mla, head_dim_v_mla, mla_absorbed;
    float yarn_log_mul;        /* rope.scaling.yarn_log_multiplier / 0.1 (deepseek2's reading) */
    /* ---- dense architectures beyond llama (gemma2, gemma3, phi3) ---- */
    float embd_scale;           /* the token embeddings times this (gemma: sqrt(n_embd)); 1: none */
    float attn_softcap;         /* attention logit soft-capping (gemma2); 0: none */
    float final_softcap;        /* final logit soft-capping (gemma2, gemma3); 0: none */
    int64_t n_swa;              /* the sliding window of the layers marked in swa[]; 0: none */
    unsigned char swa[QD_MODEL_MAX_LAYERS]; /* 1: block l attends through the window, with rope_swa */
    struct qd_nn_rope rope_swa; /* the sliding-window layers' rope (gemma3: its own base) */
};

struct qd_model;
struct qd_model_block;
struct qd_block_run;

/* One architecture: its GGUF name, the kinds of its norm and rope, the block tensors it needs
 * and those it may have, the activation of its FFN, and the graph of one block. */
struct qd_model_arch {
    const char *name;
    enum qd_norm_kind norm;
    enum qd_rope_kind rope;
    uint64_t required, optional; /* QD_W_BIT(role) */
    enum qd_glu_kind act;
    int rope_freqs;              /* reads rope_freqs.weight (Llama 3's scaling) when the file has it */
    const struct qd_model_moe *moe; /* NULL: no experts */
    int mla;                        /* DeepSeek's latent attention: its keys, rope on part of a head */
    /* ---- dense architectures beyond llama (gemma2, gemma3, phi3) ---- */
    int q_prescale;              /* q times attn_scale before the scores, which then take 1.0 (gemma, phi3) */
    int ffn_up_fused;            /* ffn_up holds the gate's rows then the up's, [2 n_ff] (phi3) */
    int tied_output;             /* the token embedding is the output even where output.weight exists (gemma2) */
    int rope_long_short;         /* LongRoPE: rope_factors_long/short.weight, long past n_ctx_orig (phi3) */
    /* the architecture's own hyperparameters (its load_arch_hparams), after the common ones; 0 or
     * -1 with err */
    int (*hparams)(struct qd_model *m, char *err, size_t errlen);
    enum qd_status (*block)(struct qd_block_run *r);
};

const struct qd_model_arch *qd_model_arch_find(const char *name);
/* The names the engine runs, space separated ("llama qwen2 qwen3 ..."). */
const char *qd_model_arch_names(void);

/* How an architecture's blocks hold experts (arch_moe.c's rows; llama.cpp's load_arch_tensors
 * and the arguments its graph passes build_moe_ffn): the roles that replace the dense FFN when
 * the file has experts (required) or may come with them (optional), whether the routing weights
 * are renormalised over the chosen experts (norm_w), and whether the file must have experts
 * (qwen2moe, qwen3moe) or may (llama: Mixtral). */
struct qd_model_moe {
    uint64_t required, optional;
    int norm_w;
    int experts_required;
};

/* One weight in f32, [rows][cols] (cols the input width), or data NULL when absent. */
struct qd_model_tensor {
    float *data;
    int64_t rows, cols;
    int64_t experts;  /* 1, or the experts of a 3-D weight stored one [rows][cols] after another */
    const char *name; /* its GGUF name (the hooks see it) */
};

/* The weights of one block, dequantized; buffers reused from block to block. */
struct qd_model_block {
    int layer;
    struct qd_model_tensor w[QD_W_COUNT];
    char names[QD_W_COUNT][QD_GGUF_MAX_NAME];
    float *buf[QD_W_COUNT];      /* the allocations behind w[].data, kept across blocks */
    size_t capacity[QD_W_COUNT]; /* floats allocated per role */
    /* Roles the caller takes as stored when the file holds them in f32, f16 or bf16 (a device
     * backend copies those bytes itself): their w[].data is an address of the right size left
     * unwritten (what the backend maps to its copy), raw[] the file's bytes, raw_type[] their
     * type (QD_F32 / QD_F16 / QD_BF16; QD_F32 with raw NULL: widened as any other). Set by the
     * caller before qd_model_block_load. */
    uint64_t keep_raw;
    const void *raw[QD_W_COUNT];
    enum qd_dtype raw_type[QD_W_COUNT];
    const struct qd_gguf_tensor *raw_tensor[QD_W_COUNT];
};

struct qd_model {
    struct qd_gguf_model file;
    const struct qd_model_arch *arch;
    char arch_name[64];
    struct qd_model_hparams hp;
    int32_t bos;          /* -1: none */
    int add_bos;          /* the vocabulary adds a BOS (llama_vocab_get_add_bos) */
    float *rope_freqs;    /* n_rot/2 values, or NULL */
    const struct qd_gguf_tensor *token_embd, *output, *output_norm, *output_b;
    float *rope_short, *rope_long; /* LongRoPE's factors (n_rot/2 each), or NULL (phi3) */
    int release_pages;    /* the file's pages dropped once read (a model larger than half the
                             memory: its pages would push out everything else); a smaller one
                             stays cached for the next run, as a mapped file does */
};

/* Opens the model at path (a GGUF, or a split model's first shard) and checks everything a pass
 * needs: an architecture the engine runs (a clear message listing them otherwise), the
 * hyperparameters, a vocabulary, every block tensor present with its shape and a type quantd
 * dequantizes. 0, or -1 with err and *status. qd_model_close frees m either way. */
int qd_model_open(const char *path, struct qd_model *m, enum qd_status *status, char *err, size_t errlen);
void qd_model_close(struct qd_model *m);
/* The number under "<architecture>.<suffix>" (an array's first element) into *out: 1 found, 0
 * absent (an error when required), -1 with err when not a number: for the architectures'
 * hparams functions. */
int qd_model_key(struct qd_model *m, const char *suffix, int required, double *out, char *err, size_t errlen);

/* Reads block `layer`'s weights into b, dequantized to f32 (b's buffers grow as needed and are
 * kept; qd_model_block_free releases them); the file's pages of that block are dropped after.
 * QD_OK, or a status with err. */
enum qd_status qd_model_block_load(struct qd_model *m, int layer, struct qd_model_block *b, char *err, size_t errlen);
void qd_model_block_free(struct qd_model_block *b);
/* Bytes of f32 the largest block takes. */
size_t qd_model_block_bytes(const struct qd_model *m);

/* Rows `ids` of tensor t (a [rows][cols] weight, any type quantd dequantizes), in f32, into out
 * [n][cols]: the token embedding's lookup. */
enum qd_status qd_model_rows(const struct qd_model *m, const struct qd_gguf_tensor *t, const int32_t *ids, int64_t n,
                             float *out, char *err, size_t errlen);
/* The whole tensor t in f32 into out (rows x cols values). */
enum qd_status qd_model_tensor_f32(const struct qd_model *m, const struct qd_gguf_tensor *t, float *out, char *err,
                                   size_t errlen);
/* Drops the file's cached pages of t (a weight read once per run) where m->release_pages. */
void qd_model_release(const struct qd_model *m, const struct qd_gguf_tensor *t);

#endif
