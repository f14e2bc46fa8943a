/* A Hugging Face safetensors model in -> the directory `mlx_lm.convert --hf-path SRC --mlx-path DST
 * -q [--q-bits B --q-group-size G --q-mode M]` writes (mlx-lm 0.32.2, mlx 0.32.4), for the model
 * types of mlx_archs below:
 * - mlx-lm loads the model class for config.json's model_type, whose sanitize drops or renames
 *   tensors (rotary inv_freq, a tied lm_head) and stacks each MoE layer's experts into one 3-D
 *   SwitchLinear weight; the rules are data (mlx_archs).
 * - quantize_model quantizes every module with to_quantized (Linear, Embedding, SwitchLinear:
 *   here every float ".weight" of 2 or more dimensions, embeddings and the head included) whose
 *   last dimension the group size divides: <m>.weight (U32), <m>.scales, and for affine
 *   <m>.biases (the weight's dtype; the float modes' scales U8). The rest is copied.
 * - Before that, convert casts every float tensor to config.json's "torch_dtype" (float16,
 *   bfloat16 or float32) where it has one, then quantizes the cast weights.
 * - save writes model.safetensors (model-NNNNN-of-NNNNN.safetensors past 5 GiB) with
 *   __metadata__ {"format": "mlx"}, always model.safetensors.index.json (json.dump indent 4,
 *   metadata total_size and total_parameters), config.json (the source's, generation_config's
 *   eos_token_id, without _name_or_path and vision_config, quantization and quantization_config
 *   {"group_size", "bits", "mode"}; top-level keys sorted, indent 4, no final newline), the
 *   tokenizer, *.py, generation_config.json and a model card README.md.
 * Every tensor is read from the source's mapping by the process callback (stacked experts come
 * from several places, maybe several shards), so the pipeline's items carry no source range. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../kernels/fp.h"
#include "checkpoint/convert.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/pipeline.h"
#include "checkpoint/safetensors.h"

/* ---- mlx-lm's model classes, as data ------------------------------------------------------------ */

/* A MoE layer's experts "<layer>.<moe>.experts.E.<from>.weight" stacked (experts 0..n-1, in
 * order) into "<layer>.<moe>.switch_mlp.<to>.weight", as the class's sanitize does. */
struct mlx_stack {
    const char *moe;              /* ".block_sparse_moe." */
    const char *const (*names)[2]; /* {from, to}, NULL-terminated */
};

/* The class's quant_predicate giving a module its own affine params, whatever the mode: a
 * module path ending in `suffix` (recorded per module in config.json's quantization). */
struct mlx_own_params {
    const char *suffix;
    int bits, group_size;
};

struct mlx_arch {
    const char *model_type;
    const char *const *drop;  /* a tensor whose name contains one of these is dropped */
    int tied_drops_head;      /* tie_word_embeddings true: lm_head.weight dropped */
    struct mlx_stack stack;
    const char *refused;      /* why quantd does not write this model type (NULL: it does) */
    struct mlx_own_params own; /* suffix NULL: none */
    /* config.json keys its ModelArgs requires that a transformers 5 config may lack (NULL-ended) */
    const char *const *needs;
    const char *drop_prefix;  /* a tensor whose name starts with it is dropped (NULL: none) */
    const char *const *keep;  /* weights of modules without to_quantized (MoEGate): never quantized */
    const char *no_cast;      /* cast_predicate: a tensor whose name contains it keeps its dtype */
    /* MLA (DeepSeek-V3): each self_attn.kv_b_proj [heads * (nope + v), rank] becomes per-head
     * embed_q = W[:, :nope, :] transposed ([heads, rank, nope]) and unembed_out = W[:, nope:, :]
     * ([heads, v, rank]), MultiLinear modules quantized like the rest */
    int mla_split;
};

static const char *const rotary[] = {"self_attn.rotary_emb.inv_freq", NULL};
static const char *const rotary_any[] = {"rotary_emb.inv_freq", NULL};
static const char *const mixtral_experts[][2] = {{"w1", "gate_proj"}, {"w2", "down_proj"}, {"w3", "up_proj"}, {NULL, NULL}};
static const char *const qwen_experts[][2] = {
    {"up_proj", "up_proj"}, {"down_proj", "down_proj"}, {"gate_proj", "gate_proj"}, {NULL, NULL}};

static const char *const moe_gate[] = {".mlp.gate.weight", NULL};

/* transformers 5 writes num_local_experts and rope_parameters.rope_theta instead */
static const char *const qwen3_moe_needs[] = {"num_experts", "rope_theta", NULL};

/* mlx_lm/models/<type>.py's sanitize (mistral runs as llama: MODEL_REMAPPING). */
static const struct mlx_arch mlx_archs[] = {
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

static const struct mlx_arch *mlx_arch_find(const char *model_type)
{
    for (size_t i = 0; model_type && i < sizeof mlx_archs / sizeof *mlx_archs; i++)
        if (!strcmp(mlx_archs[i].model_type, model_type))
            return &mlx_archs[i];
    return NULL;
}

/* mlx_lm.convert --q-mode and its (group_size, bits) per format */
static const struct mlx_mode {
    const char *fmt, *mode;
    int group_size, bits;
} mlx_modes[] = {
    {"mlx_affine", "affine", 0, 0}, {"mlx_mxfp4", "mxfp4", 32, 4}, {"mlx_nvfp4", "nvfp4", 16, 4},
    {"mlx_mxfp8", "mxfp8", 32, 8},
};

static const struct mlx_mode *mlx_mode_of(const char *fmt)
{
    for (size_t i = 0; i < sizeof mlx_modes / sizeof *mlx_modes; i++)
        if (!strcmp(mlx_modes[i].fmt, fmt))
            return &mlx_modes[i];
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

static int is_copied_file(const char *name)
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

static cJSON *read_json_file(const char *dir, const char *name, char *err, size_t errlen)
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
    cJSON *config = read_json_file(src, "config.json", e2, sizeof e2);
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(config, "model_type"));
    const struct mlx_arch *a = mlx_arch_find(mt);
    int rc = 0;
    if (!a || a->refused) {
        char known[512];
        size_t at = 0;
        for (size_t i = 0; i < sizeof mlx_archs / sizeof *mlx_archs; i++)
            if (!mlx_archs[i].refused)
                at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", at ? " " : "", mlx_archs[i].model_type);
        if (!config)
            snprintf(err, errlen, "%s/config.json: %s", src, e2);
        else if (!a)
            snprintf(err, errlen, "model_type '%.60s' is not in quantd's MLX table: mlx-lm's model class for it may "
                     "rename or reshape tensors that quantd does not know (quantd writes MLX models of %s)",
                     mt ? mt : "", known);
        else
            snprintf(err, errlen, "model_type %s: %s (quantd writes MLX models of %s)", a->model_type, a->refused,
                     known);
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

/* ---- the plan ---------------------------------------------------------------------------------- */

struct source {
    char *path;
    struct qd_mapped m;
    struct qd_st_file st;
};

struct part {
    const struct qd_st_entry *t;
};

/* One output tensor (copied or cast), or one quantized weight's components back to back. */
struct entry {
    char *name;           /* the weight's (or copied tensor's) name in mlx-lm's model */
    struct part *parts;   /* its source: one tensor, or the experts stacked */
    int nparts, quantize;
    enum qd_dtype from, to; /* source and written dtype of a float tensor (to: after the cast) */
    int is_float;
    const char *st_dtype; /* a copied tensor's safetensors dtype */
    int ndim;
    int64_t shape[QD_ST_MAX_DIMS];
    uint64_t in_bytes, bytes; /* the stacked source's bytes, the output's */
    int nc;
    struct qd_component comps[QD_MAX_COMPONENTS];
    int shard;
    int split;                 /* MLA: 1 embed_q, 2 unembed_out of parts[0] (kv_b_proj) */
    int64_t heads, nope, vdim, rank;
    const struct qd_format *f; /* what it is quantized to, with params (the run's, or the */
    struct qd_params params;   /* class's own for this module: own) */
    int own;
};

static enum qd_dtype st_float(const char *dt, int *is_float)
{
    *is_float = !strcmp(dt, "F32") || !strcmp(dt, "F16") || !strcmp(dt, "BF16");
    return !strcmp(dt, "F32") ? QD_F32 : !strcmp(dt, "F16") ? QD_F16 : QD_BF16;
}

static const char *dtype_st(enum qd_dtype d)
{
    return d == QD_F32 ? "F32" : d == QD_F16 ? "F16" : d == QD_BF16 ? "BF16" : d == QD_U8 ? "U8" : "U32";
}

static int cmp_entry(const void *a, const void *b) { return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name); }

/* If name is expert E of a stacked weight, its stacked name (malloc'd) and E; else NULL. */
static char *stacked_name(const struct mlx_stack *s, const char *name, long *expert)
{
    if (!s->moe)
        return NULL;
    char key[64];
    snprintf(key, sizeof key, "%sexperts.", s->moe);
    const char *at = strstr(name, key);
    if (!at)
        return NULL;
    char *end;
    const char *num = at + strlen(key);
    *expert = strtol(num, &end, 10);
    if (end == num || *end != '.')
        return NULL;
    for (int k = 0; s->names[k][0]; k++) {
        size_t fl = strlen(s->names[k][0]);
        if (!strncmp(end + 1, s->names[k][0], fl) && !strcmp(end + 1 + fl, ".weight")) {
            size_t n = (size_t)(at - name) + strlen(s->moe) + strlen("switch_mlp.") + strlen(s->names[k][1]) +
                       strlen(".weight") + 1;
            char *out = malloc(n);
            if (out)
                snprintf(out, n, "%.*s%sswitch_mlp.%s.weight", (int)(at - name), name, s->moe, s->names[k][1]);
            return out;
        }
    }
    return NULL;
}

struct plan {
    struct entry *e;
    int n, cap;
};

static struct entry *plan_add(struct plan *p)
{
    if (p->n == p->cap) {
        int nc = p->cap ? p->cap * 2 : 64;
        struct entry *e = realloc(p->e, (size_t)nc * sizeof *e);
        if (!e)
            return NULL;
        p->e = e, p->cap = nc;
    }
    memset(&p->e[p->n], 0, sizeof *p->e);
    return &p->e[p->n++];
}

static struct entry *plan_find(struct plan *p, const char *name)
{
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->e[i].name, name))
            return &p->e[i];
    return NULL;
}

/* DeepSeek-V3's kv_b_proj t as its two MultiLinear weights (mla: heads, nope, v, rank from the
 * config). */
static int plan_mla(struct plan *p, const int64_t mla[4], const struct qd_st_entry *t, char *err, size_t errlen)
{
    if (t->ndim != 2 || mla[0] < 1 || mla[1] < 1 || mla[2] < 1 || t->shape[0] != mla[0] * (mla[1] + mla[2]) ||
        t->shape[1] != mla[3]) {
        snprintf(err, errlen, "'%s': shape is not [num_attention_heads * (qk_nope_head_dim + v_head_dim), "
                 "kv_lora_rank] of config.json", t->name);
        return -1;
    }
    static const char *const names[] = {"embed_q.weight", "unembed_out.weight"};
    for (int k = 0; k < 2; k++) {
        struct entry *e = plan_add(p);
        if (!e || !(e->parts = calloc(1, sizeof *e->parts)) ||
            !(e->name = malloc(strlen(t->name) + strlen(names[k]) + 1)))
            goto nomem;
        snprintf(e->name, strlen(t->name) + strlen(names[k]) + 1, "%.*s%s",
                 (int)(strlen(t->name) - strlen("kv_b_proj.weight")), t->name, names[k]);
        e->parts[0].t = t, e->nparts = 1, e->split = k + 1;
        e->heads = mla[0], e->nope = mla[1], e->vdim = mla[2], e->rank = mla[3];
    }
    return 0;
nomem:
    snprintf(err, errlen, "no memory for the plan");
    return -1;
}

/* The entries of the model, from its headers: dropped, stacked, cast and quantized as mlx-lm's
 * load, convert and quantize_model do. */
static int plan_model(const struct qd_convert_opts *o, const struct mlx_arch *a, int tied, int has_cast,
                      enum qd_dtype cast_to, const int64_t mla[4], struct source *src, int nsrc,
                      const struct qd_name_filter *nf, struct plan *p, char *err, size_t errlen)
{
    const int group = o->params.group_size;
    for (int k = 0; k < nsrc; k++)
        for (int i = 0; i < src[k].st.n; i++) {
            const struct qd_st_entry *t = &src[k].st.t[i];
            int dropped = (tied && a->tied_drops_head && !strcmp(t->name, "lm_head.weight")) ||
                          (a->drop_prefix && !strncmp(t->name, a->drop_prefix, strlen(a->drop_prefix)));
            for (int d = 0; a->drop && a->drop[d]; d++)
                dropped |= strstr(t->name, a->drop[d]) != NULL;
            if (dropped)
                continue;
            if (a->mla_split && ends_with(t->name, "self_attn.kv_b_proj.weight")) {
                if (plan_mla(p, mla, t, err, errlen))
                    return -1;
                continue;
            }
            long expert = 0;
            char *stacked = stacked_name(&a->stack, t->name, &expert);
            struct entry *e = stacked ? plan_find(p, stacked) : NULL;
            if (e) {
                free(stacked);
            } else {
                if (!(e = plan_add(p))) {
                    free(stacked);
                    goto nomem;
                }
                e->name = stacked ? stacked : strdup(t->name);
                if (!e->name)
                    goto nomem;
            }
            if (expert >= 0 && expert >= e->nparts) {
                struct part *np = realloc(e->parts, (size_t)(expert + 1) * sizeof *np);
                if (!np)
                    goto nomem;
                memset(np + e->nparts, 0, (size_t)(expert + 1 - e->nparts) * sizeof *np);
                e->parts = np, e->nparts = (int)expert + 1;
            }
            if (expert < 0 || e->parts[expert].t) {
                snprintf(err, errlen, "tensor '%s': expert %ld twice", t->name, expert);
                return -1;
            }
            e->parts[expert].t = t;
        }
    for (int i = 0; i < p->n; i++) {
        struct entry *e = &p->e[i];
        const struct qd_st_entry *t0 = e->parts[0].t;
        for (int x = 0; x < e->nparts; x++) { /* the experts of one weight: all there, alike */
            const struct qd_st_entry *t = e->parts[x].t;
            if (!t || !t0 || strcmp(t->dtype, t0->dtype) || t->ndim != t0->ndim ||
                memcmp(t->shape, t0->shape, sizeof t->shape)) {
                snprintf(err, errlen, "'%s': the experts to stack (0..%d) are not all there with one dtype and "
                         "shape (expert %d)", e->name, e->nparts - 1, x);
                return -1;
            }
        }
        const int stacked = e->nparts > 1 || strstr(e->name, "switch_mlp.");
        e->ndim = t0->ndim + stacked;
        if (e->ndim > QD_ST_MAX_DIMS) {
            snprintf(err, errlen, "'%s': too many dimensions", e->name);
            return -1;
        }
        e->shape[0] = e->nparts;
        memcpy(e->shape + stacked, t0->shape, (size_t)t0->ndim * sizeof *e->shape);
        e->in_bytes = (t0->end - t0->begin) * (uint64_t)e->nparts;
        if (e->split) { /* [heads, rank, nope] or [heads, v, rank] */
            const int64_t rows = e->split == 1 ? e->nope : e->vdim;
            e->ndim = 3, e->shape[0] = e->heads;
            e->shape[1] = e->split == 1 ? e->rank : rows, e->shape[2] = e->split == 1 ? rows : e->rank;
            e->in_bytes = (uint64_t)(e->heads * rows * e->rank) * (uint64_t)t0->elem_bits / 8;
        }
        e->from = st_float(t0->dtype, &e->is_float);
        e->to = e->is_float && has_cast && !(a->no_cast && strstr(e->name, a->no_cast)) ? cast_to : e->from;
        e->st_dtype = e->is_float ? dtype_st(e->to) : t0->dtype;
        const uint64_t elems = e->in_bytes * 8 / (uint64_t)t0->elem_bits;
        e->bytes = e->is_float ? elems * qd_dtype_size(e->to) : e->in_bytes;
        const int64_t cols = e->shape[e->ndim - 1];
        e->quantize = e->is_float && e->ndim >= 2 && ends_with(e->name, ".weight") && cols % group == 0 &&
                      qd_name_filter_keeps(nf, e->name);
        for (int k = 0; a->keep && a->keep[k]; k++)
            e->quantize &= !ends_with(e->name, a->keep[k]);
        for (int x = 0; e->quantize && x < e->nparts; x++) /* --skip / --only by the source's names too */
            e->quantize = qd_name_filter_keeps(nf, e->parts[x].t->name);
        if (!e->quantize)
            continue;
        e->f = o->f, e->params = o->params;
        const size_t module_len = strlen(e->name) - strlen(".weight");
        if (a->own.suffix && module_len >= strlen(a->own.suffix) &&
            !strncmp(e->name + module_len - strlen(a->own.suffix), a->own.suffix, strlen(a->own.suffix))) {
            e->own = 1, e->f = qd_format_find("mlx_affine");
            qd_params_default(e->f, &e->params);
            e->params.bits = a->own.bits, e->params.group_size = a->own.group_size;
        }
        struct qd_tensor in = {.dtype = e->to};
        int64_t shape[2] = {(int64_t)(elems / (uint64_t)cols), cols};
        qd_tensor_set_shape(&in, 2, shape);
        struct qd_params prm = e->params;
        if ((e->nc = qd_format_layout(e->f, &prm, &in, e->comps, err, errlen)) < 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "'%s': %s", e->name, err);
            snprintf(err, errlen, "%s", msg);
            return -1;
        }
        e->bytes = 0;
        for (int c = 0; c < e->nc; c++)
            e->bytes += (uint64_t)e->comps[c].bytes;
    }
    qsort(p->e, (size_t)p->n, sizeof *p->e, cmp_entry);
    return 0;
nomem:
    snprintf(err, errlen, "no memory for the plan");
    return -1;
}

/* ---- writing ----------------------------------------------------------------------------------- */

#define MLX_SHARD_BYTES (5ull << 30) /* MAX_FILE_SIZE_GB */

struct mlx_job {
    const struct qd_convert_opts *o;
    struct entry **items;  /* per pipeline item (0: the header) */
    void *scratch;         /* a stacked or cast weight, gathered */
    struct qd_convert_summary *s;
    int index, count;
    uint64_t in_total;
    double last, nmse;
};

static float load_f32(enum qd_dtype d, const uint8_t *p, uint64_t k)
{
    uint16_t h;
    float x;
    if (d == QD_F32) {
        memcpy(&x, p + k * 4, 4);
        return x;
    }
    memcpy(&h, p + k * 2, 2);
    return d == QD_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
}

/* The source of e as one buffer of its written dtype: the mapping itself where that is it, else
 * its parts concatenated (and cast: mlx's astype, round to nearest even) into dst. */
static void store(enum qd_dtype d, uint8_t *p, uint64_t k, float v)
{
    if (d == QD_F32) {
        memcpy(p + k * 4, &v, 4);
        return;
    }
    const uint16_t h = d == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
    memcpy(p + k * 2, &h, 2);
}

/* MLA: embed_q[h][r][n] = W[h * (nope + v) + n][r], unembed_out[h][j][r] = W[h * (nope + v) + nope + j][r]
 * (a float's bits pass through f32 unchanged, so copies stay exact) */
static void gather_mla(const struct entry *e, uint8_t *o)
{
    const uint8_t *w = e->parts[0].t->data;
    const int64_t hd = e->nope + e->vdim;
    uint64_t k = 0;
    for (int64_t h = 0; h < e->heads; h++)
        if (e->split == 1)
            for (int64_t r = 0; r < e->rank; r++)
                for (int64_t n = 0; n < e->nope; n++)
                    store(e->to, o, k++, load_f32(e->from, w, (uint64_t)((h * hd + n) * e->rank + r)));
        else
            for (int64_t j = 0; j < e->vdim; j++)
                for (int64_t r = 0; r < e->rank; r++)
                    store(e->to, o, k++, load_f32(e->from, w, (uint64_t)((h * hd + e->nope + j) * e->rank + r)));
}

static const void *gather(const struct entry *e, void *dst)
{
    if (e->split) {
        gather_mla(e, dst);
        return dst;
    }
    if (e->nparts == 1 && e->from == e->to)
        return e->parts[0].t->data;
    uint8_t *o = dst;
    for (int x = 0; x < e->nparts; x++) {
        const struct qd_st_entry *t = e->parts[x].t;
        const uint64_t nb = t->end - t->begin;
        if (!e->is_float || e->from == e->to) {
            memcpy(o, t->data, nb);
            o += nb;
            continue;
        }
        const uint64_t n = nb / qd_dtype_size(e->from);
        for (uint64_t k = 0; k < n; k++) {
            const float v = load_f32(e->from, t->data, k);
            if (e->to == QD_F32)
                memcpy(o + k * 4, &v, 4);
            else {
                const uint16_t h = e->to == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
                memcpy(o + k * 2, &h, 2);
            }
        }
        o += n * qd_dtype_size(e->to);
    }
    return dst;
}

static enum qd_status mlx_process(void *ctx, int lane, int item, const void *in, void *out, char *err, size_t errlen)
{
    (void)in;
    struct mlx_job *j = ctx;
    const struct entry *e = j->items[item];
    const void *x = gather(e, e->quantize ? j->scratch : out);
    enum qd_status st = QD_OK;
    if (!e->quantize) {
        if (x != out)
            memcpy(out, x, (size_t)e->bytes);
    } else {
        struct qd_convert_opts ot = *j->o;
        qd_convert_use_lane(&ot, lane);
        ot.f = e->f, ot.params = e->params;
        const int64_t cols = e->shape[e->ndim - 1];
        st = qd_convert_quantize(&ot, x, e->to, (int64_t)(e->in_bytes / qd_dtype_size(e->from)) / cols, cols, out,
                                 (int64_t)e->bytes, &j->nmse, NULL, err, errlen);
        if (st != QD_OK) {
            char msg[600];
            snprintf(msg, sizeof msg, "tensor '%s': %s", e->name, err);
            snprintf(err, errlen, "%s", msg);
        }
    }
    for (int k = 0; k < e->nparts && !(e->split == 1); k++) /* what was read stops counting as resident (a
                                                                 kv_b_proj after its second part) */
        qd_release_pages(e->parts[k].t->data, e->parts[k].t->end - e->parts[k].t->begin);
    return st;
}

static void mlx_handed(void *ctx, int item)
{
    struct mlx_job *j = ctx;
    if (item == 0)
        return;
    const struct entry *e = j->items[item];
    struct qd_convert_summary *s = j->s;
    s->bytes_in += e->in_bytes;
    if (e->quantize) {
        s->quantized++;
        s->params_quantized += e->in_bytes / qd_dtype_size(e->from);
    } else if (e->from != e->to)
        s->cast++;
    else
        s->copied++;
    j->index++;
    const double now = qd_pipe_clock_s();
    if (j->o->progress) {
        struct qd_convert_event ev = {.index = j->index, .count = j->count, .name = e->name,
                                      .action = e->quantize ? QD_CONVERT_QUANTIZE : QD_CONVERT_COPY,
                                      .fmt = j->o->f->name, .rule = "table", .ndim = e->ndim < 4 ? e->ndim : 4,
                                      .ms = (now - j->last) * 1e3, .has_nmse = j->o->report_error && e->quantize,
                                      .nmse = j->nmse, .in_done = s->bytes_in, .in_total = j->in_total};
        for (int d = 0; d < ev.ndim; d++)
            ev.shape[d] = e->shape[d];
        j->o->progress(j->o->progress_ctx, &ev);
    }
    j->last = now;
}

/* "<m>.weight" -> "<m>.<component>" */
static char *component_name(const char *weight, const char *component)
{
    const size_t n = strlen(weight) - strlen("weight") + strlen(component) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%.*s%s", (int)(strlen(weight) - strlen("weight")), weight, component);
    return s;
}

/* One output file: the entries of shard k. */
static int write_file(struct mlx_job *j, struct plan *p, int k, int src_fd, const char *path,
                      struct qd_pipe_pool *pool, cJSON *wm, const char *file_name, enum qd_status *status, char *err,
                      size_t errlen)
{
    int n = 0, nt = 0, rc = -1;
    for (int i = 0; i < p->n; i++)
        if (p->e[i].shard == k)
            n++, nt += p->e[i].quantize ? p->e[i].nc : 1;
    struct qd_st_out *h = calloc((size_t)nt + 1, sizeof *h);
    char **names = calloc((size_t)nt + 1, sizeof *names);
    struct qd_pipe_item *items = calloc((size_t)n + 1, sizeof *items);
    struct entry **of = calloc((size_t)n + 1, sizeof *of);
    uint8_t *header = NULL;
    struct qd_outfile out = {.fd = -1};
    if (!h || !names || !items || !of)
        goto nomem;
    int ni = 1, th = 0;
    for (int i = 0; i < p->n; i++) {
        struct entry *e = &p->e[i];
        if (e->shard != k)
            continue;
        for (int c = 0; c < (e->quantize ? e->nc : 1); c++) {
            struct qd_st_out *t = &h[th];
            if (!e->quantize) {
                *t = (struct qd_st_out){.name = e->name, .dtype = e->st_dtype, .ndim = e->ndim, .bytes = e->bytes};
                memcpy(t->shape, e->shape, sizeof t->shape);
            } else { /* the weight's leading dimensions, then the component's last */
                const struct qd_component *q = &e->comps[c];
                if (!(names[th] = component_name(e->name, q->name)))
                    goto nomem;
                *t = (struct qd_st_out){.name = names[th], .dtype = dtype_st(q->dtype), .ndim = e->ndim,
                                        .bytes = (uint64_t)q->bytes};
                memcpy(t->shape, e->shape, sizeof t->shape);
                t->shape[e->ndim - 1] = q->shape[1];
            }
            if (!cJSON_AddStringToObject(wm, t->name, file_name))
                goto nomem;
            th++;
        }
        of[ni] = e;
        items[ni++] = (struct qd_pipe_item){.kind = QD_PIPE_PROCESS, .out_bytes = e->bytes};
    }
    cJSON *meta = cJSON_CreateObject();
    if (!meta || !cJSON_AddStringToObject(meta, "format", "mlx")) {
        cJSON_Delete(meta);
        goto nomem;
    }
    size_t hlen;
    header = qd_st_header(h, nt, meta, &hlen);
    cJSON_Delete(meta);
    if (!header)
        goto nomem;
    items[0] = (struct qd_pipe_item){.kind = QD_PIPE_BYTES, .bytes = header, .out_bytes = hlen};
    if (qd_outfile_open(&out, path, err, errlen)) {
        *status = QD_EIO;
        goto done;
    }
    j->items = of;
    struct qd_pipe pipe = {.src_fd = src_fd, .out = &out, .items = items, .n = ni, .process = mlx_process,
                           .handed = mlx_handed, .ctx = j, .pool = pool, .cancel = j->o->cancel,
                           .stats = &j->s->stages, .lanes = 1};
    if (qd_pipe_run(&pipe, status, err, errlen))
        goto done;
    j->s->bytes_out += out.written;
    if (qd_outfile_commit(&out, err, errlen)) {
        *status = qd_status_of_write(errno);
        goto done;
    }
    rc = 0;
    goto done;
nomem:
    *status = QD_ENOMEM;
    snprintf(err, errlen, "no memory");
done:
    if (rc && out.fd >= 0)
        qd_outfile_abort(&out);
    for (int i = 0; names && i < nt; i++)
        free(names[i]);
    free(names), free(h), free(items), free(of), free(header);
    return rc;
}

static int write_text(const char *dir, const char *name, const char *text, char *err, size_t errlen)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct qd_outfile out;
    if (qd_outfile_open(&out, p, err, errlen))
        return -1;
    if (qd_outfile_write(&out, text, strlen(text), err, errlen) || qd_outfile_commit(&out, err, errlen)) {
        qd_outfile_abort(&out);
        return -1;
    }
    return 0;
}

static int copy_file(const char *from_dir, const char *to_dir, const char *name, char *err, size_t errlen)
{
    char from[4400], to[4400];
    snprintf(from, sizeof from, "%s/%s", from_dir, name);
    snprintf(to, sizeof to, "%s/%s", to_dir, name);
    struct qd_mapped m;
    struct qd_outfile out;
    if (qd_map_file(from, &m, err, errlen))
        return -1;
    int rc = qd_outfile_open(&out, to, err, errlen);
    if (!rc && (qd_outfile_write(&out, m.data, m.size, err, errlen) || qd_outfile_commit(&out, err, errlen)))
        rc = -1, qd_outfile_abort(&out);
    qd_unmap_file(&m);
    return rc;
}

/* Python's truth of a JSON value (generation_config's eos_token_id replaces the config's when
 * truthy: load_config) */
static int truthy(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return 0;
    if (cJSON_IsRaw(v))
        return strtod(v->valuestring, NULL) != 0.0;
    if (cJSON_IsString(v))
        return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v))
        return cJSON_GetArraySize(v) > 0;
    return 1;
}

/* A module's place in the model's tree, as nn.quantize visits it: by layer number, then name. */
static long layer_of(const char *name)
{
    const char *l = strstr(name, "layers.");
    return l ? strtol(l + strlen("layers."), NULL, 10) : -1;
}

static int cmp_module(const void *a, const void *b)
{
    const struct entry *x = *(const struct entry *const *)a, *y = *(const struct entry *const *)b;
    long lx = layer_of(x->name), ly = layer_of(y->name);
    return lx != ly ? (lx < ly ? -1 : 1) : strcmp(x->name, y->name);
}

/* config.json as save_config writes it; the modules with their own params follow the run's
 * {"group_size", "bits", "mode"} in quantization, each as the class's predicate returned them. */
static char *mlx_config_text(const char *src, cJSON *config, const struct mlx_mode *mm, const struct qd_params *p,
                             const struct plan *plan)
{
    char e2[256];
    cJSON *gen = read_json_file(src, "generation_config.json", e2, sizeof e2);
    cJSON *eos = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id");
    if (truthy(eos)) {
        cJSON_DeleteItemFromObjectCaseSensitive(config, "eos_token_id");
        cJSON_AddItemToObject(config, "eos_token_id", cJSON_Duplicate(eos, 1));
    }
    cJSON_Delete(gen);
    cJSON_DeleteItemFromObjectCaseSensitive(config, "_name_or_path");
    cJSON_DeleteItemFromObjectCaseSensitive(config, "vision_config");
    cJSON_DeleteItemFromObjectCaseSensitive(config, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(config, "quantization_config");
    for (int k = 0; k < 2; k++) { /* {"group_size", "bits", "mode"}, in that order */
        cJSON *q = cJSON_AddObjectToObject(config, k ? "quantization_config" : "quantization");
        if (!q)
            return NULL;
        cJSON_AddNumberToObject(q, "group_size", mm->group_size ? mm->group_size : p->group_size);
        cJSON_AddNumberToObject(q, "bits", mm->bits ? mm->bits : p->bits);
        cJSON_AddStringToObject(q, "mode", mm->mode);
        const struct entry **own = malloc((size_t)(plan->n ? plan->n : 1) * sizeof *own);
        int nown = 0;
        if (!own)
            return NULL;
        for (int i = 0; i < plan->n; i++)
            if (plan->e[i].quantize && plan->e[i].own)
                own[nown++] = &plan->e[i];
        qsort(own, (size_t)nown, sizeof *own, cmp_module);
        for (int i = 0; i < nown; i++) {
            char module[512];
            snprintf(module, sizeof module, "%.*s", (int)(strlen(own[i]->name) - strlen(".weight")), own[i]->name);
            cJSON *m = cJSON_AddObjectToObject(q, module);
            cJSON_AddNumberToObject(m, "group_size", own[i]->params.group_size);
            cJSON_AddNumberToObject(m, "bits", own[i]->params.bits);
        }
        free(own);
    }
    return qd_json_py_text_styled(config, 4, 1);
}

/* A config number (qd_json_py_read keeps numbers as their text), or 0 */
static int64_t raw_int(const cJSON *v)
{
    return cJSON_IsRaw(v) ? (int64_t)strtod(v->valuestring, NULL) : cJSON_IsNumber(v) ? (int64_t)v->valuedouble : 0;
}

static const char model_card[] = "---\nlanguage: en\nlibrary_name: mlx\npipeline_tag: text-generation\ntags:\n- mlx\n---\n";

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_item(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

int qd_convert_mlx(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status, char *err,
                   size_t errlen)
{
    const double t0 = qd_pipe_clock_s();
    const struct mlx_mode *mm = mlx_mode_of(o->f->name);
    struct qd_convert_opts run = *o;
    struct source *src = NULL;
    int nsrc = 0, rc = -1;
    char **files = NULL;
    struct plan plan = {0};
    cJSON *config = NULL, *index = NULL, *wm = NULL;
    struct qd_outdir od = {0};
    struct qd_pipe_pool *pool = NULL;
    void *scratch = NULL;
    struct qd_name_filter *own_nf = o->filter ? NULL : qd_name_filter_new(o->skip, o->only, err, errlen);
    const struct qd_name_filter *nf = o->filter ? o->filter : own_nf;
    *status = QD_EINVAL;
    if (!nf)
        goto done;
    if (qd_convert_mlx_check(o->src, qd_convert_input_kind(o->src), err, errlen))
        goto done;
    if (!mm || (mm->group_size && run.params.has_global_scale) || run.params.scale_dtype != QD_SCALE_AUTO) {
        snprintf(err, errlen, "%s: mlx_lm.convert writes no global_scale and keeps affine scales in the weight's "
                 "dtype (scale_dtype=auto)", o->f->name);
        goto done;
    }
    if (mm->group_size) /* the float modes' geometry is fixed */
        run.params.group_size = mm->group_size;
    if (!(config = read_json_file(o->src, "config.json", err, errlen)))
        goto done;
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(config, "model_type"));
    const struct mlx_arch *a = mlx_arch_find(mt);
    snprintf(s->arch, sizeof s->arch, "%s", mt);
    s->rule = "table";
    const int tied = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(config, "tie_word_embeddings"));
    /* convert's dtype: config's torch_dtype, else text_config's dtype; every float cast to it */
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(config, "torch_dtype");
    if (!td || cJSON_IsNull(td))
        td = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(config, "text_config"), "dtype");
    const char *dt = cJSON_GetStringValue(td);
    const int has_cast = dt && (!strcmp(dt, "float16") || !strcmp(dt, "bfloat16") || !strcmp(dt, "float32"));
    const enum qd_dtype cast_to = !has_cast ? QD_F32 : !strcmp(dt, "float16") ? QD_F16 : !strcmp(dt, "bfloat16") ? QD_BF16 : QD_F32;
    /* the weight files: load_model reads every model*.safetensors of the directory */
    DIR *d = opendir(o->src);
    struct dirent *de;
    int cap = 0;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, "model", 5) && ends_with(de->d_name, ".safetensors")) {
            if (nsrc == cap) {
                cap = cap ? cap * 2 : 8;
                char **nfiles = realloc(files, (size_t)cap * sizeof *files);
                if (!nfiles)
                    break;
                files = nfiles;
            }
            if (!(files[nsrc] = strdup(de->d_name)))
                break;
            nsrc++;
        }
    if (d)
        closedir(d);
    if (!nsrc) {
        snprintf(err, errlen, "%s: no model*.safetensors weights (mlx-lm loads those)", o->src);
        *status = QD_ENOTFOUND;
        goto done;
    }
    qsort(files, (size_t)nsrc, sizeof *files, cmp_str);
    if (!(src = calloc((size_t)nsrc, sizeof *src)))
        goto nomem;
    uint64_t in_total = 0;
    for (int k = 0; k < nsrc; k++) {
        const size_t n = strlen(o->src) + strlen(files[k]) + 2;
        if (!(src[k].path = malloc(n)))
            goto nomem;
        snprintf(src[k].path, n, "%s/%s", o->src, files[k]);
        if (qd_map_file(src[k].path, &src[k].m, err, errlen)) {
            *status = QD_ENOTFOUND;
            goto done;
        }
        if (qd_st_parse(src[k].m.data, src[k].m.size, o->max_header_bytes, src[k].path, &src[k].st, err, errlen))
            goto done;
        for (int i = 0; i < src[k].st.n; i++) {
            const struct qd_st_entry *t = &src[k].st.t[i];
            s->params_total += (t->end - t->begin) * 8 / (uint64_t)t->elem_bits;
        }
    }
    int64_t mla[4] = {0};
    static const char *const mla_keys[] = {"num_attention_heads", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank"};
    for (int k = 0; a->mla_split && k < 4; k++)
        mla[k] = raw_int(cJSON_GetObjectItemCaseSensitive(config, mla_keys[k]));
    if (plan_model(&run, a, tied, has_cast, cast_to, mla, src, nsrc, nf, &plan, err, errlen))
        goto done;
    /* shards: make_shards' rule (a new file where the next tensor would pass 5 GiB) over the
     * entries in name order */
    uint64_t in_cap = 1, out_cap = 1, scratch_cap = 0, fill = 0, total_size = 0, total_params = 0;
    int nshards = 0;
    for (int i = 0; i < plan.n; i++) {
        struct entry *e = &plan.e[i];
        if (!nshards || fill + e->bytes > MLX_SHARD_BYTES)
            nshards++, fill = 0;
        e->shard = nshards - 1;
        fill += e->bytes;
        total_size += e->bytes;
        in_total += e->in_bytes;
        total_params += e->is_float ? e->in_bytes / qd_dtype_size(e->from) : e->in_bytes * 8 / (uint64_t)e->parts[0].t->elem_bits;
        out_cap = e->bytes > out_cap ? e->bytes : out_cap;
        if (e->quantize && (e->nparts > 1 || e->from != e->to || e->split)) {
            const uint64_t nb = e->in_bytes / qd_dtype_size(e->from) * qd_dtype_size(e->to);
            scratch_cap = nb > scratch_cap ? nb : scratch_cap;
        }
    }
    pool = qd_pipe_pool_new(o->backend, in_cap, out_cap, 1);
    if (!pool || qd_pipe_pool_modes(pool, 0, 1) || (scratch_cap && !(scratch = malloc(scratch_cap))))
        goto nomem;
    if (qd_outdir_open(&od, o->dst, err, errlen)) {
        *status = QD_EIO;
        goto done;
    }
    index = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(index, "metadata");
    cJSON_AddNumberToObject(md, "total_size", (double)total_size);
    cJSON_AddNumberToObject(md, "total_parameters", (double)total_params);
    wm = cJSON_CreateObject();
    struct mlx_job job = {.o = &run, .scratch = scratch, .s = s, .count = plan.n, .in_total = in_total,
                          .last = qd_pipe_clock_s()};
    int fd = qd_open_input(src[0].path, err, errlen);
    if (fd < 0) {
        *status = QD_EIO;
        goto fail_dir;
    }
    for (int k = 0; k < nshards; k++) {
        char name[64], path[4400];
        if (nshards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nshards);
        snprintf(path, sizeof path, "%s/%s", od.tmp, name);
        if (write_file(&job, &plan, k, fd, path, pool, wm, name, status, err, errlen)) {
            close(fd);
            goto fail_dir;
        }
    }
    close(fd);
    /* the index: weight_map sorted by name (save_model), json.dump(indent=4) */
    int nw = cJSON_GetArraySize(wm);
    const cJSON **sorted = malloc((size_t)(nw ? nw : 1) * sizeof *sorted);
    if (!sorted)
        goto nomem_dir;
    int at = 0;
    for (const cJSON *c = wm->child; c; c = c->next)
        sorted[at++] = c;
    cJSON *wms = cJSON_AddObjectToObject(index, "weight_map");
    qsort(sorted, (size_t)nw, sizeof *sorted, cmp_item);
    for (int i = 0; wms && i < nw; i++)
        cJSON_AddStringToObject(wms, sorted[i]->string, sorted[i]->valuestring);
    free(sorted);
    char *itext = qd_json_py_text_styled(index, 4, 0);
    char *ctext = mlx_config_text(o->src, config, mm, &run.params, &plan);
    int r = itext && ctext ? 0 : -1;
    if (r)
        snprintf(err, errlen, "no memory for config.json");
    r = r || write_text(od.tmp, "model.safetensors.index.json", itext, err, errlen) ||
        write_text(od.tmp, "config.json", ctext, err, errlen) || write_text(od.tmp, "README.md", model_card, err, errlen);
    free(itext), free(ctext);
    if (r)
        goto fail_dir;
    d = opendir(o->src);
    while (d && (de = readdir(d)))
        if (is_copied_file(de->d_name) && regular_file(o->src, de->d_name) &&
            copy_file(o->src, od.tmp, de->d_name, err, errlen)) {
            closedir(d);
            goto fail_dir;
        }
    if (d)
        closedir(d);
    if (qd_outdir_commit(&od, err, errlen)) {
        *status = QD_EIO;
        goto done;
    }
    rc = 0;
    goto done;
nomem_dir:
    snprintf(err, errlen, "no memory");
    *status = QD_ENOMEM;
fail_dir:
    if (*status == QD_EINVAL)
        *status = QD_EIO;
    qd_outdir_abort(&od);
    goto done;
nomem:
    snprintf(err, errlen, "no memory for the conversion's buffers");
    *status = QD_ENOMEM;
done:
    if (rc == 0)
        *status = QD_OK;
    s->seconds = qd_pipe_clock_s() - t0;
    qd_pipe_pool_free(pool);
    free(scratch);
    for (int i = 0; i < plan.n; i++)
        free(plan.e[i].name), free(plan.e[i].parts);
    free(plan.e);
    for (int k = 0; src && k < nsrc; k++) {
        qd_st_free(&src[k].st);
        qd_unmap_file(&src[k].m);
        free(src[k].path);
    }
    for (int k = 0; files && k < nsrc; k++)
        free(files[k]);
    free(files);
    free(src);
    cJSON_Delete(config);
    cJSON_Delete(index);
    cJSON_Delete(wm);
    qd_name_filter_free(own_nf);
    return rc;
}
