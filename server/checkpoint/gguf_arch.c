/* The per-architecture rules of gguf_arch.h. The 70B block counts are those llama.cpp's
 * src/models/<arch>.cpp map to LLM_TYPE_70B, for the architectures whose 70B type the mixes read. */
#include "checkpoint/gguf_arch.h"

#include <string.h>

static const char *const glm5_next_keep[] = {
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
    "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight", NULL};
static const char *const glm5_next_q8_0[] = {"attn_q_a", "attn_q_b", "nextn.eh_proj", NULL};

static const struct qd_gguf_arch archs[] = {
    {.name = "llama", .layers_70b = 80, .layers_70b_with_gqa = 1},
    {.name = "qwen2", .layers_70b = 80},
    {.name = "olmo", .layers_70b = 80},
    {.name = "deci", .layers_70b = 80},
    {.name = "jais2", .layers_70b = 68},
    {.name = "falcon", .falcon_rules = 1},
    {.name = "bailingmoe3", .mxfp4_ffn_experts_only = 1},
    {.name = "glm5-next", .keep = glm5_next_keep, .q8_0 = glm5_next_q8_0},
};

static const struct qd_gguf_arch generic = {.name = ""};

const struct qd_gguf_arch *qd_gguf_arch_find(const char *arch)
{
    for (size_t i = 0; arch && i < sizeof archs / sizeof *archs; i++)
        if (!strcmp(archs[i].name, arch))
            return &archs[i];
    return &generic;
}

int qd_gguf_arch_names_any(const char *name, const char *const *list)
{
    for (; list && *list; list++)
        if (strstr(name, *list))
            return 1;
    return 0;
}
