/* What a block's graph function sees (server/model/arch_*.c) and the builders it composes, as
 * llama.cpp's models compose llm_graph_context's build_norm / build_qkv / build_attn / build_ffn:
 * a graph says which ops run in which order; the engine (engine.c) says which chunk and which
 * block, and owns the memory. */
#ifndef QD_MODEL_GRAPH_H
#define QD_MODEL_GRAPH_H

#include "model/model.h"

/* Called with the activations entering each matmul (x [T][K], the backend's memory), before it
 * runs, with the weight's GGUF name: the importance-matrix collector's tap. */
typedef void (*qd_matmul_input_fn)(void *ctx, int layer, const char *weight, const float *x, int64_t T, int64_t K);
/* The same tap for an expert's weight (a 3-D *_exps tensor): x [rows][K] are the activations of
 * the tokens routed to expert `expert` (of the tensor's n_expert), the rows llama.cpp's
 * MUL_MAT_ID hands that expert (the per-expert counts of llama-imatrix). A caller that sets only
 * on_matmul_input gets these rows there, under the tensor's name, expert by expert. */
typedef void (*qd_matmul_expert_input_fn)(void *ctx, int layer, const char *weight, int expert, int n_expert,
                                          const float *x, int64_t rows, int64_t K);
/* The tap for one head's slice of a per-head 3-D weight (DeepSeek's attn_k_b / attn_v_b, a
 * batched MUL_MAT in llama.cpp): x [T][K] enters slice `head` of n_head; all heads see the same
 * T tokens (one count, as llama-imatrix keeps for a dense 3-D weight). A caller that sets only
 * on_matmul_input gets these rows there, under the tensor's name, head by head. */
typedef void (*qd_matmul_head_input_fn)(void *ctx, int layer, const char *weight, int head, int n_head,
                                        const float *x, int64_t T, int64_t K);

/* One chunk's scratch for one block, sized by qd_block_scratch_floats. */
struct qd_block_scratch {
    float *cur;   /* [T][n_embd]: a norm's output */
    float *q, *k, *v;
    float *attn;  /* [T][n_head * head_dim_v] */
    float *proj;  /* [T][n_embd]: a sub-block's output before the residual */
    float *gate, *up; /* [T][n_ff] (the widest of the dense, expert and shared-expert FFNs) */
    /* a mixture of experts (none without experts) */
    float *router;        /* [T][n_expert]: the router's logits, then probabilities */
    float *expert_w;      /* [T][n_expert_used] */
    int32_t *expert_ids;  /* [T][n_expert_used] */
    int32_t *expert_rows; /* [T][n_expert_used]: the rows routed to each expert, expert after
                             expert (token x n_expert_used + slot) */
    float *expert_x;      /* [T][n_embd]: their activations */
    float *expert_y;      /* [T][n_embd]: one expert's outputs */
    float *expert_out;    /* [T][n_expert_used][n_embd]: each token's experts' outputs, by slot */
};

struct qd_block_run {
    const struct qd_model *m;
    const struct qd_model_block *b;
    const struct qd_nn_backend *nn;
    int layer;
    float *hidden;        /* [T][n_embd], in and out */
    int64_t T;
    const int32_t *pos;   /* [T] */
    struct qd_block_scratch *s;
    qd_matmul_input_fn on_matmul_input;
    qd_matmul_expert_input_fn on_matmul_expert_input;
    qd_matmul_head_input_fn on_matmul_head_input;
    void *hook_ctx;
    int64_t seq;          /* the T rows are chunks of seq tokens run together, each attending within
                             itself (T itself: one chunk) */
    enum qd_dtype cache_k, cache_v; /* K (after rope) and V rounded to these, as llama.cpp's KV cache
                                       of that type holds them (QD_F32: as they are) */
    char *err;
    size_t errlen;
};

/* Before the host reads or writes activations itself (a hook, an expert's gathered rows): the
 * backend's ops so far are done (kernels/nn.h: its memory is the host's once they are). */
static inline void qd_graph_sync(const struct qd_block_run *r)
{
    if (r->nn->sync)
        r->nn->sync();
}

/* Floats of scratch one chunk of T tokens needs, and the scratch laid out in buf. */
int64_t qd_block_scratch_floats(const struct qd_model_hparams *hp, int64_t T);
void qd_block_scratch_init(struct qd_block_scratch *s, float *buf, const struct qd_model_hparams *hp, int64_t T);

/* build_norm: the architecture's norm of x [rows][n] times weight role (plus bias where the file
 * has one; QD_W_COUNT: none), into out. */
void qd_graph_norm(struct qd_block_run *r, float *out, const float *x, enum qd_model_weight role,
                   enum qd_model_weight bias, int64_t rows, int64_t n);
/* build_lora_mm plus the bias: out [T][rows of w] = x . w^T (+ b where the file has it), the
 * hook told first. */
void qd_graph_linear(struct qd_block_run *r, float *out, const float *x, enum qd_model_weight w,
                     enum qd_model_weight bias);
/* build_qkv + the q/k norms where present + rope + build_attn: self-attention of r->s->cur into
 * r->s->proj (after the output projection). */
enum qd_status qd_graph_attention(struct qd_block_run *r);
/* build_ffn with a parallel gate (LLM_FFN_PAR): down(act(gate(x)) * up(x)) of r->s->cur into
 * r->s->proj. */
void qd_graph_ffn(struct qd_block_run *r);

/* build_moe_ffn (+ qwen2moe's gated shared expert): the mixture of experts of r->s->cur into
 * r->s->proj (arch_moe.c). */
void qd_graph_moe(struct qd_block_run *r);
/* A pre-norm block's second half: r->hidden += ffn(norm(r->hidden)), the mixture of experts
 * where the block has a router, the dense FFN elsewhere (llama.cpp's ffn_inp -> l_out). */
void qd_graph_ffn_residual(struct qd_block_run *r);
/* the architectures' ways of holding experts (arch_moe.c) */
extern const struct qd_model_moe qd_moe_mixtral, qd_moe_qwen2moe, qd_moe_qwen3moe, qd_moe_deepseek2;

/* The graphs of one block (arch_*.c), named in the architecture table (model_arch.c). */
enum qd_status qd_arch_llama_block(struct qd_block_run *r);
enum qd_status qd_arch_deepseek2_block(struct qd_block_run *r);
/* ---- dense architectures beyond llama (arch_gemma.c): graphs and hyperparameters ---- */
enum qd_status qd_arch_gemma_block(struct qd_block_run *r);
int qd_arch_gemma2_hparams(struct qd_model *m, char *err, size_t errlen);
int qd_arch_gemma3_hparams(struct qd_model *m, char *err, size_t errlen);
int qd_arch_mistral3_hparams(struct qd_model *m, char *err, size_t errlen); /* arch_mistral3.c */

#endif
