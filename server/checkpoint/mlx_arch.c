/* mlx-lm's model classes as data, and what its load needs of a source directory (mlx_arch.h). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/convert.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/mlx_arch.h"

static const char *const rotary[] = {"self_attn.rotary_emb.inv_freq", NULL};
static const char *const rotary_any[] = {"rotary_emb.inv_freq", NULL};
static const char *const mixtral_experts[][2] = {{"w1", "gate_proj"}, {"w2", "down_proj"}, {"w3", "up_proj"}, {NULL, NULL}};
static const char *const qwen_experts[][2] = {
    {"up_proj", "up_proj"}, {"down_proj", "down_proj"}, {"gate_proj", "gate_proj"}, {NULL, NULL}};

static const char *const moe_gate[] = {".mlp.gate.weight", NULL};

/* transformers 5 writes num_local_experts and rope_parameters.rope_theta instead */
static const char *const qwen3_moe_needs[] = {"num_experts", "rope_theta", NULL};

/* mlx_lm/models/<type>.py's sanitize (mistral runs as llama: MODEL_REMAPPING). */
static const struct qd_mlx_arch archs[] = {
    {.model_type = "llama", .drop = rotary, .tied_drops_head = 1},
    {.model_type = "mistral", .drop = rotary, .tied_drops_head = 1},
    {.model_type = "qwen2", .drop = rotary, .tied_drops_head = 1},
    {.model_type = "qwen3", .tied_drops_head = 1},
    {.model_type = "gemma2"},      /* the head is the embedding (no lm_head parameter) */
    {.model_type = "gemma3_text"}, /* an lm_head.weight present is kept, else tied */
    {.model_type = "phi3"},
    {.model_type = "mixtral", .tied_drops_head = 1, .stack = {".block_sparse_moe.", mixtral_experts}},
    {.model_type = "qwen2_moe", .stack = {".mlp.", qwen_experts}},
    /* Model.quant_predicate: the router at 8 bits, group 64 */
    {.model_type = "qwen3_moe", .tied_drops_head = 1, .stack = {".mlp.", qwen_experts}, .own = {".mlp.gate", 8, 64},
     .needs = qwen3_moe_needs},
    /* the MTP layer (61 of DeepSeek-V3's 61 + 1) dropped, its router a MoEGate, experts stacked */
    {.model_type = "deepseek_v3", .drop = rotary_any, .stack = {".mlp.", qwen_experts},
     .drop_prefix = "model.layers.61", .keep = moe_gate, .no_cast = "e_score_correction_bias", .mla_split = 1},
};

const struct qd_mlx_arch *qd_mlx_arch_find(const char *model_type)
{
    for (size_t i = 0; model_type && i < sizeof archs / sizeof *archs; i++)
        if (!strcmp(archs[i].model_type, model_type))
            return &archs[i];
    return NULL;
}

/* The files that make a tokenizer transformers' AutoTokenizer loads (mlx-lm's load needs one) */
static const char *const tokenizer_files[] = {"tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json",
                                              "vocab.txt", "spiece.model", NULL};
/* What save copies or rewrites besides the weights and config: the tokenizer's files (written
 * back by tokenizer.save_pretrained; quantd copies the source's), *.py, generation_config.json */
static const char *const copied_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                           "added_tokens.json", "tokenizer.model", "tiktoken.model", "vocab.json",
                                           "vocab.txt", "merges.txt", "spiece.model", "chat_template.jinja",
                                           "chat_template.json", "generation_config.json", NULL};
static const char *const copied_suffixes[] = {".py", ".tiktoken", NULL};

static int ends_with(const char *s, const char *end)
{
    size_t n = strlen(s), m = strlen(end);
    return n >= m && !strcmp(s + n - m, end);
}

static int copied_name(const char *name)
{
    for (const char *const *f = copied_files; *f; f++)
        if (!strcmp(name, *f))
            return 1;
    for (const char *const *f = copied_suffixes; *f; f++)
        if (ends_with(name, *f) && name[0] != '.')
            return 1;
    return 0;
}

static int regular_file(const char *dir, const char *name)
{
    char p[4400];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int has_tokenizer(const char *dir)
{
    for (const char *const *f = tokenizer_files; *f; f++)
        if (regular_file(dir, *f))
            return 1;
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)))
        found = ends_with(e->d_name, ".tiktoken");
    if (d)
        closedir(d);
    return found;
}

cJSON *qd_mlx_read_json(const char *dir, const char *name, char *err, size_t errlen)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct qd_mapped m;
    if (qd_map_file(p, &m, err, errlen))
        return NULL;
    cJSON *v = qd_json_py_read((const char *)m.data, m.size, name, err, errlen);
    qd_unmap_file(&m);
    return v;
}

int qd_mlx_copied_file(const char *dir, const char *name) { return copied_name(name) && regular_file(dir, name); }

int qd_convert_mlx_check(const char *src, enum qd_convert_input in, char *err, size_t errlen)
{
    if (in != QD_INPUT_HF_DIR) {
        snprintf(err, errlen, "%s is not a directory: mlx-lm loads a model directory (config.json, a tokenizer and "
                 ".safetensors weights), so the MLX layouts convert one (not a single .safetensors file)", src);
        return -1;
    }
    if (!has_tokenizer(src)) {
        snprintf(err, errlen, "%s has no tokenizer (tokenizer.json, tokenizer.model, vocab.json ...): mlx-lm's load "
                 "needs one beside the weights and would not open the converted model; copy the model's tokenizer "
                 "files into the directory first", src);
        return -1;
    }
    char e2[256];
    cJSON *config = qd_mlx_read_json(src, "config.json", e2, sizeof e2);
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(config, "model_type"));
    const struct qd_mlx_arch *a = qd_mlx_arch_find(mt);
    int rc = 0;
    if (!a) {
        char known[512];
        size_t at = 0;
        for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
            at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", at ? " " : "", archs[i].model_type);
        if (!config)
            snprintf(err, errlen, "%s/config.json: %s", src, e2);
        else
            snprintf(err, errlen, "model_type '%.60s' is not in quantd's MLX table: mlx-lm's model class for it may "
                     "rename or reshape tensors that quantd does not know (quantd writes MLX models of %s)",
                     mt ? mt : "", known);
        rc = -1;
    }
    for (int k = 0; !rc && a->needs && a->needs[k]; k++)
        if (!cJSON_GetObjectItemCaseSensitive(config, a->needs[k])) {
            snprintf(err, errlen, "%s/config.json has no '%s': mlx-lm 0.32.2's %s model needs it and would not load "
                     "the converted model (a transformers 5 config spells num_experts num_local_experts and keeps "
                     "rope_theta in rope_parameters): add it to config.json", src, a->needs[k], a->model_type);
            rc = -1;
        }
    cJSON_Delete(config);
    return rc;
}

