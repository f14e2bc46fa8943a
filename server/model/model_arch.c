/* The architectures the engine runs: one row each (llama.cpp's per-architecture
 * load_arch_tensors and llama_model_rope_type, as data), and the GGUF names of a block's
 * tensors (llama-arch.cpp LLM_TENSOR_NAMES). Adding an architecture is a row here plus, when
 * its block differs, a graph function (arch_*.c). */
#include <string.h>

#include "model/graph.h"

const char *const qd_model_weight_names[QD_W_COUNT] = {
    [QD_W_ATTN_NORM] = "attn_norm.weight",
    [QD_W_ATTN_Q] = "attn_q.weight",         [QD_W_ATTN_Q_B] = "attn_q.bias",
    [QD_W_ATTN_K] = "attn_k.weight",         [QD_W_ATTN_K_B] = "attn_k.bias",
    [QD_W_ATTN_V] = "attn_v.weight",         [QD_W_ATTN_V_B] = "attn_v.bias",
    [QD_W_ATTN_Q_NORM] = "attn_q_norm.weight", [QD_W_ATTN_K_NORM] = "attn_k_norm.weight",
    [QD_W_ATTN_OUT] = "attn_output.weight",  [QD_W_ATTN_OUT_B] = "attn_output.bias",
    [QD_W_FFN_NORM] = "ffn_norm.weight",
    [QD_W_FFN_GATE] = "ffn_gate.weight",     [QD_W_FFN_GATE_B] = "ffn_gate.bias",
    [QD_W_FFN_UP] = "ffn_up.weight",         [QD_W_FFN_UP_B] = "ffn_up.bias",
    [QD_W_FFN_DOWN] = "ffn_down.weight",     [QD_W_FFN_DOWN_B] = "ffn_down.bias",
    /* mixtures of experts (arch_moe.c) */
    [QD_W_FFN_GATE_INP] = "ffn_gate_inp.weight",
    [QD_W_FFN_GATE_EXPS] = "ffn_gate_exps.weight", [QD_W_FFN_UP_EXPS] = "ffn_up_exps.weight",
    [QD_W_FFN_DOWN_EXPS] = "ffn_down_exps.weight",
    [QD_W_FFN_GATE_INP_SHEXP] = "ffn_gate_inp_shexp.weight", [QD_W_FFN_GATE_SHEXP] = "ffn_gate_shexp.weight",
    [QD_W_FFN_UP_SHEXP] = "ffn_up_shexp.weight",   [QD_W_FFN_DOWN_SHEXP] = "ffn_down_shexp.weight",
    [QD_W_FFN_EXP_PROBS_B] = "exp_probs_b.bias",
    /* DeepSeek's latent attention (arch_deepseek2.c) */
    [QD_W_ATTN_QA] = "attn_q_a.weight", [QD_W_ATTN_QA_NORM] = "attn_q_a_norm.weight",
    [QD_W_ATTN_QB] = "attn_q_b.weight", [QD_W_ATTN_KV_A_MQA] = "attn_kv_a_mqa.weight",
    [QD_W_ATTN_KV_A_NORM] = "attn_kv_a_norm.weight", [QD_W_ATTN_KV_B] = "attn_kv_b.weight",
    [QD_W_ATTN_K_B_MLA] = "attn_k_b.weight", [QD_W_ATTN_V_B_MLA] = "attn_v_b.weight",
    [QD_W_ATTN_QKV] = "attn_qkv.weight",
    [QD_W_ATTN_POST_NORM] = "post_attention_norm.weight", [QD_W_FFN_POST_NORM] = "post_ffw_norm.weight",
};

#define B QD_W_BIT
/* the dense pre-norm block every row below starts from */
#define DENSE (B(QD_W_ATTN_NORM) | B(QD_W_ATTN_Q) | B(QD_W_ATTN_K) | B(QD_W_ATTN_V) | B(QD_W_ATTN_OUT) | \
               B(QD_W_FFN_NORM) | B(QD_W_FFN_GATE) | B(QD_W_FFN_UP) | B(QD_W_FFN_DOWN))
#define QKV_BIAS (B(QD_W_ATTN_Q_B) | B(QD_W_ATTN_K_B) | B(QD_W_ATTN_V_B))

static const struct qd_model_arch archs[] = {
    /* llama (SmolLM2, Llama 2/3, Mistral 7B's GGUFs): optional biases everywhere
     * (create_tensor_qkv, wo_b, the FFN's), Llama 3's rope_freqs */
    {.name = "llama", .norm = QD_NORM_RMS, .rope = QD_ROPE_NORMAL, .required = DENSE,
     .optional = QKV_BIAS | B(QD_W_ATTN_OUT_B) | B(QD_W_FFN_GATE_B) | B(QD_W_FFN_UP_B) | B(QD_W_FFN_DOWN_B),
     .act = QD_GLU_SILU, .rope_freqs = 1, .moe = &qd_moe_mixtral, .block = qd_arch_llama_block},
    /* qwen2: neox rope, q/k/v biases */
    {.name = "qwen2", .norm = QD_NORM_RMS, .rope = QD_ROPE_NEOX, .required = DENSE, .optional = QKV_BIAS,
     .act = QD_GLU_SILU, .block = qd_arch_llama_block},
    /* qwen3: neox rope, per-head q/k rms norms before rope */
    {.name = "qwen3", .norm = QD_NORM_RMS, .rope = QD_ROPE_NEOX,
     .required = DENSE | B(QD_W_ATTN_Q_NORM) | B(QD_W_ATTN_K_NORM), .optional = QKV_BIAS, .act = QD_GLU_SILU,
     .block = qd_arch_llama_block},
    /* ---- dense architectures beyond llama ---- */
    /* gemma2: post-norms, GELU, q scaled before the scores, soft-capped scores and logits, a
     * sliding window on every other block; the output always the token embedding */
    {.name = "gemma2", .norm = QD_NORM_RMS, .rope = QD_ROPE_NEOX,
     .required = DENSE | B(QD_W_ATTN_POST_NORM) | B(QD_W_FFN_POST_NORM), .optional = QKV_BIAS, .act = QD_GLU_GELU,
     .q_prescale = 1, .tied_output = 1, .hparams = qd_arch_gemma2_hparams, .block = qd_arch_gemma_block},
    /* gemma3: gemma2's block with q/k norms, five sliding blocks to one global with their own rope
     * base, no score soft-capping */
    {.name = "gemma3", .norm = QD_NORM_RMS, .rope = QD_ROPE_NEOX,
     .required = DENSE | B(QD_W_ATTN_POST_NORM) | B(QD_W_FFN_POST_NORM) | B(QD_W_ATTN_Q_NORM) |
                 B(QD_W_ATTN_K_NORM), .optional = QKV_BIAS, .act = QD_GLU_GELU,
     .q_prescale = 1, .hparams = qd_arch_gemma3_hparams, .block = qd_arch_gemma_block},
    /* phi3: q, k, v in one matrix (or apart), the gate and up in one, q scaled before the scores,
     * LongRoPE's factors; its sliding window is ignored, as llama.cpp does for now */
    {.name = "phi3", .norm = QD_NORM_RMS, .rope = QD_ROPE_NEOX,
     .required = B(QD_W_ATTN_NORM) | B(QD_W_ATTN_OUT) | B(QD_W_FFN_NORM) | B(QD_W_FFN_UP) | B(QD_W_FFN_DOWN),
     .optional = B(QD_W_ATTN_QKV) | B(QD_W_ATTN_Q) | B(QD_W_ATTN_K) | B(QD_W_ATTN_V) | QKV_BIAS, .act = QD_GLU_SILU,
     .q_prescale = 1, .ffn_up_fused = 1, .rope_long_short = 1, .block = qd_arch_llama_block},
    /* mistral3: llama's block and tensors (optional output and FFN biases, rope_freqs) */
    {.name = "mistral3", .norm = QD_NORM_RMS, .rope = QD_ROPE_NORMAL, .required = DENSE,
     .optional = QKV_BIAS | B(QD_W_ATTN_OUT_B) | B(QD_W_FFN_GATE_B) | B(QD_W_FFN_UP_B) | B(QD_W_FFN_DOWN_B),
     .act = QD_GLU_SILU, .rope_freqs = 1, .hparams = qd_arch_mistral3_hparams, .block = qd_arch_llama_block},
    /* ---- mixtures of experts (arch_moe.c) ---- */
    /* qwen2moe: qwen2's attention (neox rope, q/k/v biases), experts and a gated shared expert */
    {.name = "qwen2moe", .norm = QD_NORM_RMS, .rope = QD_ROPE_NEOX, .required = DENSE, .optional = QKV_BIAS,
     .act = QD_GLU_SILU, .moe = &qd_moe_qwen2moe, .block = qd_arch_llama_block},
    /* qwen3moe: qwen3's attention (per-head q/k norms), experts */
    {.name = "qwen3moe", .norm = QD_NORM_RMS, .rope = QD_ROPE_NEOX,
     .required = DENSE | B(QD_W_ATTN_Q_NORM) | B(QD_W_ATTN_K_NORM), .optional = QKV_BIAS, .act = QD_GLU_SILU,
     .moe = &qd_moe_qwen3moe, .block = qd_arch_llama_block},
    /* deepseek2: latent attention (the q LoRA or one q; kv_b or k_b / v_b: which the file has
     * is checked by the loader), leading dense blocks, then experts with shared ones */
    {.name = "deepseek2", .norm = QD_NORM_RMS, .rope = QD_ROPE_NORMAL,
     .required = B(QD_W_ATTN_NORM) | B(QD_W_ATTN_KV_A_MQA) | B(QD_W_ATTN_KV_A_NORM) | B(QD_W_ATTN_OUT) |
                 B(QD_W_FFN_NORM) | B(QD_W_FFN_GATE) | B(QD_W_FFN_UP) | B(QD_W_FFN_DOWN),
     .optional = B(QD_W_ATTN_Q) | B(QD_W_ATTN_QA) | B(QD_W_ATTN_QA_NORM) | B(QD_W_ATTN_QB) | B(QD_W_ATTN_KV_B) |
                 B(QD_W_ATTN_K_B_MLA) | B(QD_W_ATTN_V_B_MLA),
     .act = QD_GLU_SILU, .moe = &qd_moe_deepseek2, .mla = 1, .block = qd_arch_deepseek2_block},
};
#undef B

const struct qd_model_arch *qd_model_arch_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof archs / sizeof *archs; i++)
        if (!strcmp(archs[i].name, name))
            return &archs[i];
    return NULL;
}

const char *qd_model_arch_names(void)
{
    return "llama qwen2 qwen3 gemma2 gemma3 phi3 mistral3 qwen2moe qwen3moe deepseek2";
}
