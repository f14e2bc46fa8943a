/* Opening a GGUF model for the engine (model.h): its hyperparameters as llama.cpp's loader reads
 * them (llama_model::load_hparams and the architecture's load_arch_hparams), its vocabulary's
 * size and BOS (llama_vocab::load), every block tensor found and checked up front, then each
 * block read and dequantized to f32 when the engine asks for it. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../kernels/cpu/cpu.h"
#include "../../kernels/fp.h"
#include "../../kernels/quantize.h"
#include "checkpoint/gguf_recipe.h"
#include "model/graph.h"
#include "model/model_keys.h"

/* llama_model::load_hparams, for the keys the engine's architectures read. */
static int read_hparams(struct qd_model *m, char *err, size_t errlen)
{
    struct qd_model_keys keys = {.g = &m->file.g, .arch = m->arch_name, .err = err, .errlen = errlen};
    struct qd_model_hparams *hp = &m->hp;
    double v;
    if (qd_model_keys_number(&keys, "context_length", 1, &v) < 0)
        return -1;
    hp->n_ctx_train = (int64_t)v;
    if (qd_model_keys_number(&keys, "embedding_length", 1, &v) < 0)
        return -1;
    hp->n_embd = (int64_t)v;
    if (qd_model_keys_number(&keys, "block_count", 1, &v) < 0)
        return -1;
    hp->n_layer = (int64_t)v;
    if (qd_model_keys_number(&keys, "feed_forward_length", 1, &v) < 0)
        return -1;
    hp->n_ff = (int64_t)v;
    if (qd_model_keys_number(&keys, "attention.head_count", 1, &v) < 0)
        return -1;
    hp->n_head = (int)v;
    hp->n_head_kv = hp->n_head;
    if (qd_model_keys_number(&keys, "attention.head_count_kv", 0, &v) < 0)
        return -1;
    else if (v > 0)
        hp->n_head_kv = (int)v;
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_ff <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv || hp->n_embd % hp->n_head) {
        snprintf(err, errlen, "the model's sizes do not fit together: embedding %" PRId64 ", %" PRId64 " blocks, "
                 "feed-forward %" PRId64 ", %d heads, %d key/value heads", hp->n_embd, hp->n_layer, hp->n_ff,
                 hp->n_head, hp->n_head_kv);
        return -1;
    }
    hp->head_dim_k = hp->head_dim_v = (int)(hp->n_embd / hp->n_head);
    int found;
    if ((found = qd_model_keys_number(&keys, "attention.key_length", 0, &v)) < 0)
        return -1;
    if (found)
        hp->head_dim_k = (int)v;
    if ((found = qd_model_keys_number(&keys, "attention.value_length", 0, &v)) < 0)
        return -1;
    if (found)
        hp->head_dim_v = (int)v;

    const char *eps_key = m->arch->norm == QD_NORM_RMS ? "attention.layer_norm_rms_epsilon" : "attention.layer_norm_epsilon";
    if (qd_model_keys_number(&keys, eps_key, 1, &v) < 0)
        return -1;
    hp->norm_eps = (float)v;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim_k);

    struct qd_nn_rope *r = &hp->rope;
    r->kind = m->arch->rope;
    r->n_rot = hp->head_dim_k;
    if ((found = qd_model_keys_number(&keys, "rope.dimension_count", 0, &v)) < 0)
        return -1;
    if (found)
        r->n_rot = (int)v;
    if (m->arch->mla && qd_model_read_mla(&keys, m) < 0)
        return -1;
    if (!m->arch->mla && r->n_rot != hp->head_dim_k) { /* llama.cpp refuses it for llama; qwen's graphs assert it */
        snprintf(err, errlen, "the model rotates %d of each head's %d values (rope.dimension_count): the %s graph "
                 "rotates whole heads (llama.cpp refuses it too)", r->n_rot, hp->head_dim_k, m->arch_name);
        return -1;
    }
    r->freq_base = 10000.0f;
    if (qd_model_keys_number(&keys, "rope.freq_base", 0, &v) < 0)
        return -1;
    else if (v > 0)
        r->freq_base = (float)v;
    char *scaling = qd_model_keys_string(&keys, "rope.scaling.type");
    int none = scaling && !strcmp(scaling, "none");
    /* YaRN: deepseek2's (the graph that reads its log multiplier and pre-scales the scores);
     * LongRoPE: the architectures with rope_factors_long/short (phi3) */
    const int yarn = scaling && !strcmp(scaling, "yarn") && m->arch->mla;
    const int longrope = scaling && !strcmp(scaling, "longrope") && m->arch->rope_long_short;
    if (scaling && strcmp(scaling, "none") && strcmp(scaling, "linear") && !yarn && !longrope) {
        snprintf(err, errlen, "the model's rope scaling '%s' is not one the engine runs yet for %s (it runs none and "
                 "linear, Llama 3's rope_freqs, phi3's longrope and deepseek2's yarn)", scaling, m->arch_name);
        free(scaling);
        return -1;
    }
    free(scaling);
    double factor = 0;
    if ((found = qd_model_keys_number(&keys, "rope.scaling.factor", 0, &factor)) < 0)
        return -1;
    if (!found && qd_model_keys_number(&keys, "rope.scale_linear", 0, &factor) < 0)
        return -1;
    r->freq_scale = factor == 0.0 || none ? 1.0f : (float)(1.0 / factor);
    r->n_ctx_orig = (int)hp->n_ctx_train;
    if ((found = qd_model_keys_number(&keys, "rope.scaling.original_context_length", 0, &v)) < 0)
        return -1;
    if (found && v > 0)
        r->n_ctx_orig = (int)v;
    if (qd_model_read_experts(&keys, m) < 0)
        return -1;
    /* llama_context_default_params: YaRN off unless the scaling is YaRN */
    r->ext_factor = 0.0f;
    r->attn_factor = 1.0f;
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    /* llama_context: the cos/sin factor times rope.scaling.attn_factor (LongRoPE's, e.g.; YaRN's
     * reader below sets its own and multiplies this in) */
    if ((found = qd_model_keys_number(&keys, "rope.scaling.attn_factor", 0, &v)) < 0)
        return -1;
    if (found && v != 0.0)
        r->attn_factor = (float)v;
    if (yarn && qd_model_read_yarn(&keys, m) < 0)
        return -1;
    if (m->arch->mla) {
        /* deepseek2.cpp: the scores' scale mscale^2 / sqrt(nope + rope), mscale 1 without YaRN */
        const float attn_factor_org = r->attn_factor * (1.0f + 0.1f * logf(1.0f / r->freq_scale));
        const float mscale = attn_factor_org * (1.0f + 0.1f * hp->yarn_log_mul * logf(1.0f / r->freq_scale));
        hp->attn_scale = 1.0f * mscale * mscale / sqrtf((float)hp->head_dim_k_mla);
    }

    if (hp->n_layer > QD_MODEL_MAX_LAYERS) {
        snprintf(err, errlen, "the model has %" PRId64 " blocks: the engine runs at most %d (llama.cpp's "
                 "LLAMA_MAX_LAYERS)", hp->n_layer, QD_MODEL_MAX_LAYERS);
        return -1;
    }
    hp->embd_scale = 1.0f;
    hp->rope_swa = *r;
    return m->arch->hparams ? m->arch->hparams(m, err, errlen) : 0;
}

/* llama_vocab::load: the vocabulary's size and whether each sequence starts with a BOS. */
static int read_vocab(struct qd_model *m, char *err, size_t errlen)
{
    const struct qd_gguf *g = &m->file.g;
    const struct qd_gguf_kv *tokens = qd_gguf_find(g, "tokenizer.ggml.tokens");
    char *model = qd_gguf_string(g, "tokenizer.ggml.model");
    if (!tokens || tokens->type != QD_GGUF_ARRAY || !model) {
        free(model);
        snprintf(err, errlen, "the model has no vocabulary (tokenizer.ggml.model and tokenizer.ggml.tokens): "
                 "llama.cpp cannot run it either; convert it again with its tokenizer");
        return -1;
    }
    uint64_t n;
    memcpy(&n, tokens->value + 4, 8);
    /* the BOS default by tokenizer kind (llama_vocab::load: SPM and WPM add one, BPE for the
     * Llama 3 family of pre-tokenizers), then the file's own key */
    char *pre = qd_gguf_string(g, "tokenizer.ggml.pre");
    static const char *const llama3_pre[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                             "midm-2.0", "lfm2", "jina-v5-nano"};
    m->add_bos = !strcmp(model, "llama") || !strcmp(model, "bert");
    if (!strcmp(model, "gpt2") && pre)
        for (size_t i = 0; i < sizeof llama3_pre / sizeof *llama3_pre; i++)
            m->add_bos |= !strcmp(pre, llama3_pre[i]);
    m->bos = !strcmp(model, "llama") ? 1 : !strcmp(model, "gpt2") ? 11 : -1;
    free(pre);
    free(model);
    double v;
    if (qd_model_kv_number(g, "tokenizer.ggml.add_bos_token", &v, NULL) > 0)
        m->add_bos = v != 0;
    if (qd_model_kv_number(g, "tokenizer.ggml.bos_token_id", &v, NULL) > 0)
        m->bos = (int32_t)v;
    if (m->add_bos && (m->bos < 0 || (uint64_t)m->bos >= n)) {
        snprintf(err, errlen, "the vocabulary adds a BOS token but names none within its %" PRIu64 " tokens", n);
        return -1;
    }
    m->hp.n_vocab = (int64_t)n;
    return 0;
}

/* ---- tensors -------------------------------------------------------------------------------- */

static const struct qd_gguf_tensor *find_tensor(const struct qd_model *m, const char *name)
{
    for (int64_t i = 0; i < m->file.g.n_tensors; i++)
        if (!strcmp(m->file.g.tensors[i].name, name))
            return &m->file.g.tensors[i];
    return NULL;
}

static int is_float_type(uint32_t type)
{
    return type == QD_GGML_F32 || type == QD_GGML_F16 || type == QD_GGML_BF16;
}

/* A tensor the engine reads: 2-D (or 1-D; 3-D for experts) of the expected shape and a type
 * quantd dequantizes. */
static int check_tensor3(const struct qd_gguf_tensor *t, int64_t cols, int64_t rows, int64_t experts, char *err,
                         size_t errlen)
{
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != experts || t->ne[3] != 1) {
        char third[32] = "";
        if (experts > 1)
            snprintf(third, sizeof third, ", %" PRId64, experts);
        snprintf(err, errlen, "tensor %s is [%" PRId64 ", %" PRId64 ", %" PRId64 "], the model's sizes say [%" PRId64
                 ", %" PRId64 "%s]", t->name, t->ne[0], t->ne[1], t->ne[2], cols, rows, third);
        return -1;
    }
    if (!is_float_type(t->type)) {
        const struct qd_format *f = qd_gguf_format_of(t->type);
        if (!f || !f->backend[QD_BACKEND_CPU].dequantize) {
            const struct qd_ggml_type *ty = qd_ggml_type(t->type);
            snprintf(err, errlen, "tensor %s is of ggml type %s, which quantd does not dequantize", t->name,
                     ty ? ty->name : "(unknown)");
            return -1;
        }
    }
    return 0;
}

static int check_tensor(const struct qd_gguf_tensor *t, int64_t cols, int64_t rows, char *err, size_t errlen)
{
    return check_tensor3(t, cols, rows, 1, err, errlen);
}

/* The expected [cols, rows, experts] of a block tensor role (GGUF ne[0], ne[1], ne[2]). */
static void role_shape(const struct qd_model_arch *a, const struct qd_model_hparams *hp, enum qd_model_weight w,
                       int64_t *cols, int64_t *rows, int64_t *experts)
{
    *experts = 1;
    /* DeepSeek's latent attention: q and the output have the heads' own sizes */
    const int dk = hp->n_lora_kv ? hp->head_dim_k_mla : hp->head_dim_k;
    const int dv = hp->n_lora_kv ? hp->head_dim_v_mla : hp->head_dim_v, nope = dk - hp->rope.n_rot;
    const int64_t q = (int64_t)hp->n_head * dk, k = (int64_t)hp->n_head_kv * hp->head_dim_k;
    const int64_t v = (int64_t)hp->n_head_kv * hp->head_dim_v, o = (int64_t)hp->n_head * dv;
    *rows = 1;
    switch (w) {
    case QD_W_ATTN_NORM: case QD_W_FFN_NORM: case QD_W_ATTN_OUT_B: case QD_W_FFN_DOWN_B:
    case QD_W_ATTN_POST_NORM: case QD_W_FFN_POST_NORM: *cols = hp->n_embd; break;
    case QD_W_ATTN_QKV: *cols = hp->n_embd, *rows = q + k + v; break;
    case QD_W_ATTN_Q: *cols = hp->n_embd, *rows = q; break;
    case QD_W_ATTN_K: *cols = hp->n_embd, *rows = k; break;
    case QD_W_ATTN_V: *cols = hp->n_embd, *rows = v; break;
    case QD_W_ATTN_Q_B: *cols = q; break;
    case QD_W_ATTN_K_B: *cols = k; break;
    case QD_W_ATTN_V_B: *cols = v; break;
    case QD_W_ATTN_Q_NORM: case QD_W_ATTN_K_NORM: *cols = hp->head_dim_k; break;
    case QD_W_ATTN_OUT: *cols = o, *rows = hp->n_embd; break;
    case QD_W_FFN_GATE: *cols = hp->n_embd, *rows = hp->n_ff; break;
    case QD_W_FFN_UP: *cols = hp->n_embd, *rows = a->ffn_up_fused ? 2 * hp->n_ff : hp->n_ff; break;
    case QD_W_FFN_GATE_B: case QD_W_FFN_UP_B: *cols = hp->n_ff; break;
    case QD_W_FFN_DOWN: *cols = hp->n_ff, *rows = hp->n_embd; break;
    case QD_W_FFN_GATE_INP: *cols = hp->n_embd, *rows = hp->n_expert; break;
    case QD_W_FFN_GATE_EXPS: case QD_W_FFN_UP_EXPS: *cols = hp->n_embd, *rows = hp->n_ff_exp, *experts = hp->n_expert; break;
    case QD_W_FFN_DOWN_EXPS: *cols = hp->n_ff_exp, *rows = hp->n_embd, *experts = hp->n_expert; break;
    case QD_W_FFN_GATE_INP_SHEXP: *cols = hp->n_embd; break;
    case QD_W_FFN_GATE_SHEXP: case QD_W_FFN_UP_SHEXP: *cols = hp->n_embd, *rows = hp->n_ff_shexp; break;
    case QD_W_FFN_DOWN_SHEXP: *cols = hp->n_ff_shexp, *rows = hp->n_embd; break;
    case QD_W_FFN_EXP_PROBS_B: *cols = hp->n_expert; break;
    case QD_W_ATTN_QA: *cols = hp->n_embd, *rows = hp->n_lora_q; break;
    case QD_W_ATTN_QA_NORM: *cols = hp->n_lora_q; break;
    case QD_W_ATTN_QB: *cols = hp->n_lora_q, *rows = q; break;
    case QD_W_ATTN_KV_A_MQA: *cols = hp->n_embd, *rows = hp->n_lora_kv + hp->rope.n_rot; break;
    case QD_W_ATTN_KV_A_NORM: *cols = hp->n_lora_kv; break;
    case QD_W_ATTN_KV_B: *cols = hp->n_lora_kv, *rows = (int64_t)hp->n_head * (nope + dv); break;
    case QD_W_ATTN_K_B_MLA: *cols = nope, *rows = hp->n_lora_kv, *experts = hp->n_head; break;
    case QD_W_ATTN_V_B_MLA: *cols = hp->n_lora_kv, *rows = dv, *experts = hp->n_head; break;
    default: *cols = 0; break;
    }
}

static const struct qd_gguf_tensor *block_tensor(const struct qd_model *m, int layer, enum qd_model_weight w)
{
    char name[QD_GGUF_MAX_NAME + 16];
    snprintf(name, sizeof name, "blk.%d.%s", layer, qd_model_weight_names[w]);
    return find_tensor(m, name);
}

/* The roles block `layer` of m needs and may have: the row's, with the experts' in place of the
 * dense FFN in a block with experts (after deepseek2's leading dense blocks), and DeepSeek's q
 * and key/value expansion in the form the file has. */
#define DENSE_FFN (QD_W_BIT(QD_W_FFN_GATE) | QD_W_BIT(QD_W_FFN_UP) | QD_W_BIT(QD_W_FFN_DOWN) | \
                   QD_W_BIT(QD_W_FFN_GATE_B) | QD_W_BIT(QD_W_FFN_UP_B) | QD_W_BIT(QD_W_FFN_DOWN_B))
#define MLA_FORMS (QD_W_BIT(QD_W_ATTN_Q) | QD_W_BIT(QD_W_ATTN_QA) | QD_W_BIT(QD_W_ATTN_QA_NORM) | \
                   QD_W_BIT(QD_W_ATTN_QB) | QD_W_BIT(QD_W_ATTN_KV_B) | QD_W_BIT(QD_W_ATTN_K_B_MLA) | \
                   QD_W_BIT(QD_W_ATTN_V_B_MLA))
static uint64_t roles_required(const struct qd_model *m, int layer)
{
    const struct qd_model_arch *a = m->arch;
    const struct qd_model_hparams *hp = &m->hp;
    uint64_t req = hp->n_expert && layer >= hp->n_dense_lead ? (a->required & ~DENSE_FFN) | a->moe->required
                                                              : a->required;
    if (a->mla) {
        req |= hp->n_lora_q > 0 ? QD_W_BIT(QD_W_ATTN_QA) | QD_W_BIT(QD_W_ATTN_QA_NORM) | QD_W_BIT(QD_W_ATTN_QB)
                                : QD_W_BIT(QD_W_ATTN_Q);
        req |= hp->mla_absorbed ? QD_W_BIT(QD_W_ATTN_K_B_MLA) | QD_W_BIT(QD_W_ATTN_V_B_MLA) : QD_W_BIT(QD_W_ATTN_KV_B);
    }
    return req;
}

static uint64_t roles_read(const struct qd_model *m, int layer)
{
    const struct qd_model_arch *a = m->arch;
    const struct qd_model_hparams *hp = &m->hp;
    uint64_t read = a->required | a->optional;
    if (hp->n_expert && layer >= hp->n_dense_lead)
        read = (read & ~DENSE_FFN) | a->moe->required | a->moe->optional;
    if (a->mla) /* only the form the file's keys say */
        read = (read & ~MLA_FORMS) | (roles_required(m, layer) & MLA_FORMS);
    return read;
}

/* A per-pair rope factor tensor (n_rot/2 f32 values) copied into *out; absent: NULL. */
static int read_rope_factors(struct qd_model *m, const char *name, float **out, char *err, size_t errlen)
{
    const struct qd_gguf_tensor *t = find_tensor(m, name);
    const int n = m->hp.rope.n_rot / 2;
    if (!t)
        return 0;
    if (t->type != QD_GGML_F32 || t->ne[0] != n || t->ne[1] != 1) {
        snprintf(err, errlen, "tensor %s must hold %d f32 values (n_rot/2)", name, n);
        return -1;
    }
    if (!(*out = malloc((size_t)n * sizeof **out))) {
        snprintf(err, errlen, "no memory");
        return -1;
    }
    memcpy(*out, t->data, (size_t)n * sizeof **out);
    return 0;
}

static int check_tensors(struct qd_model *m, char *err, size_t errlen)
{
    const struct qd_model_hparams *hp = &m->hp;
    const struct qd_model_arch *a = m->arch;
    for (int l = 0; l < hp->n_layer; l++)
        for (int w = 0; w < QD_W_COUNT; w++) {
            const uint64_t required = roles_required(m, l), read = roles_read(m, l);
            const uint64_t bit = QD_W_BIT(w);
            const struct qd_gguf_tensor *t = read & bit ? block_tensor(m, l, w) : NULL;
            int64_t cols, rows, experts;
            if (!t && (required & bit)) {
                snprintf(err, errlen, "the model has no tensor blk.%d.%s, which a %s block%s needs", l,
                         qd_model_weight_names[w], a->name, hp->n_expert ? " with experts" : "");
                return -1;
            }
            role_shape(a, hp, w, &cols, &rows, &experts);
            if (t && check_tensor3(t, cols, rows, experts, err, errlen))
                return -1;
        }
    /* a fused q/k/v (phi3) or the three apart (create_tensor_qkv takes either) */
    for (int l = 0; (a->optional & QD_W_BIT(QD_W_ATTN_QKV)) && l < hp->n_layer; l++)
        if (!block_tensor(m, l, QD_W_ATTN_QKV) &&
            !(block_tensor(m, l, QD_W_ATTN_Q) && block_tensor(m, l, QD_W_ATTN_K) && block_tensor(m, l, QD_W_ATTN_V))) {
            snprintf(err, errlen, "the model has neither blk.%d.attn_qkv.weight nor blk.%d's attn_q, attn_k and "
                     "attn_v, one of which a %s block needs", l, l, a->name);
            return -1;
        }
    m->token_embd = find_tensor(m, "token_embd.weight");
    m->output_norm = find_tensor(m, "output_norm.weight");
    m->output = find_tensor(m, "output.weight");
    m->output_b = find_tensor(m, "output.bias");
    if (!m->token_embd || !m->output_norm) {
        snprintf(err, errlen, "the model has no %s", m->token_embd ? "output_norm.weight" : "token_embd.weight");
        return -1;
    }
    if (!m->output || a->tied_output) /* tied: llama.cpp duplicates the token embedding (TENSOR_DUPLICATED) */
        m->output = m->token_embd;
    hp = &m->hp;
    if (check_tensor(m->token_embd, hp->n_embd, hp->n_vocab, err, errlen) ||
        check_tensor(m->output, hp->n_embd, hp->n_vocab, err, errlen) ||
        check_tensor(m->output_norm, hp->n_embd, 1, err, errlen) ||
        (m->output_b && check_tensor(m->output_b, hp->n_vocab, 1, err, errlen)))
        return -1;
    if (a->rope_long_short && (read_rope_factors(m, "rope_factors_short.weight", &m->rope_short, err, errlen) ||
                               read_rope_factors(m, "rope_factors_long.weight", &m->rope_long, err, errlen)))
        return -1;
    const struct qd_gguf_tensor *freqs = a->rope_freqs ? find_tensor(m, "rope_freqs.weight") : NULL;
    if (freqs) {
        if (freqs->type != QD_GGML_F32 || freqs->ne[0] < hp->rope.n_rot / 2) {
            snprintf(err, errlen, "tensor rope_freqs.weight must hold %d f32 values (n_rot/2)", hp->rope.n_rot / 2);
            return -1;
        }
        if (!(m->rope_freqs = malloc((size_t)freqs->ne[0] * sizeof *m->rope_freqs))) {
            snprintf(err, errlen, "no memory");
            return -1;
        }
        memcpy(m->rope_freqs, freqs->data, (size_t)freqs->ne[0] * sizeof *m->rope_freqs);
        m->hp.rope.freq_factors = m->hp.rope_swa.freq_factors = m->rope_freqs;
    }
    return 0;
}

int qd_model_open(const char *path, struct qd_model *m, enum qd_status *status, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (qd_gguf_model_open(path, 0, &m->file, NULL, status, err, errlen))
        return -1;
    *status = QD_EINVAL;
    char *arch = qd_gguf_string(&m->file.g, "general.architecture");
    if (!arch) {
        snprintf(err, errlen, "the model has no general.architecture key");
        return -1;
    }
    snprintf(m->arch_name, sizeof m->arch_name, "%s", arch);
    free(arch);
    if (!(m->arch = qd_model_arch_find(m->arch_name))) {
        snprintf(err, errlen, "the engine does not run architecture '%s' yet: it runs %s", m->arch_name,
                 qd_model_arch_names());
        return -1;
    }
    if (read_hparams(m, err, errlen) || read_vocab(m, err, errlen) || check_tensors(m, err, errlen))
        return -1;
    uint64_t bytes = 0;
    for (int64_t i = 0; i < m->file.g.n_tensors; i++)
        bytes += m->file.g.tensors[i].bytes;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    m->release_pages = pages <= 0 || page <= 0 || bytes > (uint64_t)pages * (uint64_t)page / 2;
    *status = QD_OK;
    return 0;
}

void qd_model_close(struct qd_model *m)
{
    qd_gguf_model_close(&m->file);
    free(m->rope_freqs);
    free(m->rope_short);
    free(m->rope_long);
    memset(m, 0, sizeof *m);
}

/* ---- dequantizing ----------------------------------------------------------------------------- */

static uint64_t row_bytes(const struct qd_gguf_tensor *t)
{
    const int64_t ne[4] = {t->ne[0], 1, 1, 1};
    return qd_ggml_nbytes(t->type, ne);
}

/* f16 / bf16 / f32 values to f32 on every core (a block of an 8B model holds 218 M) */
struct widen_job {
    const uint8_t *data;
    float *out;
    int64_t count;
    int type;
};

static void widen_span(void *ctx, int tid, int n)
{
    const struct widen_job *j = ctx;
    const int64_t per = (j->count + n - 1) / n, lo = tid * per, hi = lo + per < j->count ? lo + per : j->count;
    if (j->type == QD_GGML_F32) {
        if (hi > lo)
            memcpy(j->out + lo, j->data + 4 * lo, (size_t)(hi - lo) * 4);
        return;
    }
    for (int64_t i = lo; i < hi; i++) {
        uint16_t h;
        memcpy(&h, j->data + 2 * i, 2);
        j->out[i] = j->type == QD_GGML_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
    }
}

static void widen(const uint8_t *data, float *out, int64_t count, int type)
{
    struct widen_job j = {data, out, count, type};
    const int64_t spans = count / 65536 + 1;
    qd_cpu_parallel(spans < qd_cpu_threads() ? (int)spans : qd_cpu_threads(), widen_span, &j);
}

/* n rows of t starting at data (rows of t's type) to f32 */
static enum qd_status rows_f32(const struct qd_gguf_tensor *t, const uint8_t *data, int64_t n, float *out, char *err,
                               size_t errlen)
{
    const int64_t count = n * t->ne[0];
    switch (t->type) {
    case QD_GGML_F32: case QD_GGML_F16: case QD_GGML_BF16:
        if (count < 65536) { /* a row or a norm: no threads */
            struct widen_job j = {data, out, count, t->type};
            widen_span(&j, 0, 1);
        } else
            widen(data, out, count, t->type);
        return QD_OK;
    default: break;
    }
    const struct qd_format *f = qd_gguf_format_of(t->type);
    struct qd_params p;
    qd_params_default(f, &p);
    struct qd_tensor o = {.data = out, .dtype = QD_F32};
    const int64_t shape[2] = {n, t->ne[0]};
    enum qd_status st = qd_tensor_set_shape(&o, 2, shape);
    const void *comp[1] = {data};
    if (st == QD_OK)
        st = qd_dequantize(QD_BACKEND_CPU, f, comp, &p, &o, err, errlen);
    return st;
}

enum qd_status qd_model_rows(const struct qd_model *m, const struct qd_gguf_tensor *t, const int32_t *ids, int64_t n,
                             float *out, char *err, size_t errlen)
{
    const uint64_t rb = row_bytes(t);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->ne[1]) {
            snprintf(err, errlen, "token id %" PRId32 " is outside the vocabulary's %" PRId64 " tokens", ids[i], t->ne[1]);
            return QD_EINVAL;
        }
        enum qd_status st = rows_f32(t, t->data + (uint64_t)ids[i] * rb, 1, out + i * t->ne[0], err, errlen);
        if (st != QD_OK)
            return st;
    }
    (void)m;
    return QD_OK;
}

enum qd_status qd_model_tensor_f32(const struct qd_model *m, const struct qd_gguf_tensor *t, float *out, char *err,
                                   size_t errlen)
{
    (void)m;
    return rows_f32(t, t->data, t->ne[1] * t->ne[2] * t->ne[3], out, err, errlen);
}

void qd_model_release(const struct qd_model *m, const struct qd_gguf_tensor *t)
{
    if (m->release_pages)
        qd_release_pages(t->data, t->bytes);
}

enum qd_status qd_model_block_load(struct qd_model *m, int layer, struct qd_model_block *b, char *err, size_t errlen)
{
    const uint64_t read = roles_read(m, layer);
    b->layer = layer;
    for (int w = 0; w < QD_W_COUNT; w++) {
        struct qd_model_tensor *mt = &b->w[w];
        const struct qd_gguf_tensor *t = read & QD_W_BIT(w) ? block_tensor(m, layer, w) : NULL;
        if (!t) {
            mt->data = NULL;
            continue;
        }
        /* every expert at once: a block of a large mixture takes n_expert times its FFN in f32 */
        const size_t count = (size_t)(t->ne[0] * t->ne[1] * t->ne[2]);
        if (count > b->capacity[w]) {
            /* 64-byte aligned: the matmuls' 32-byte loads then never straddle a cache line
             * (malloc's 16 would split every other one); the old contents are not kept */
            free(b->buf[w]);
            b->buf[w] = NULL, b->capacity[w] = 0;
            float *grown = aligned_alloc(64, (count * sizeof *grown + 63) / 64 * 64);
            if (!grown) {
                snprintf(err, errlen, "no memory for tensor %s (%zu bytes in f32)", t->name, count * sizeof *grown);
                return QD_ENOMEM;
            }
            b->buf[w] = grown;
            b->capacity[w] = count;
        }
        mt->data = b->buf[w];
        snprintf(b->names[w], sizeof b->names[w], "%s", t->name);
        mt->name = b->names[w];
        mt->cols = t->ne[0];
        mt->rows = t->ne[1];
        mt->experts = t->ne[2];
        b->raw[w] = NULL, b->raw_tensor[w] = NULL, b->raw_type[w] = QD_F32;
        if ((b->keep_raw & QD_W_BIT(w)) &&
            (t->type == QD_GGML_F32 || t->type == QD_GGML_F16 || t->type == QD_GGML_BF16)) {
            b->raw[w] = t->data; /* (its pages released by the caller once it has copied them) */
            b->raw_tensor[w] = t;
            b->raw_type[w] = t->type == QD_GGML_F32 ? QD_F32 : t->type == QD_GGML_F16 ? QD_F16 : QD_BF16;
            continue;
        }
        enum qd_status st = qd_model_tensor_f32(m, t, mt->data, err, errlen);
        if (st != QD_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", err);
            snprintf(err, errlen, "tensor %s: %s", t->name, why);
            return st;
        }
        qd_model_release(m, t);
    }
    return QD_OK;
}

void qd_model_block_free(struct qd_model_block *b)
{
    for (int w = 0; w < QD_W_COUNT; w++)
        free(b->buf[w]);
    memset(b, 0, sizeof *b);
}

size_t qd_model_block_bytes(const struct qd_model *m)
{
    size_t most = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const uint64_t read = roles_read(m, l);
        size_t sum = 0;
        for (int w = 0; w < QD_W_COUNT; w++) {
            const struct qd_gguf_tensor *t = block_tensor(m, l, w);
            if (t && (read & QD_W_BIT(w)))
                sum += (size_t)(t->ne[0] * t->ne[1] * t->ne[2]) * sizeof(float);
        }
        most = sum > most ? sum : most;
    }
    return most;
}
