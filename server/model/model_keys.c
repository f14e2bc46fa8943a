/* A GGUF's metadata as the model loader reads it ("<arch>.<suffix>" numbers and strings, per-layer
 * arrays of one value), and the keys of the engine's mixtures of experts and of DeepSeek's latent
 * attention (llama.cpp's load_hparams for expert_count and the like, deepseek2's
 * load_arch_hparams, llama_context's YaRN set-up), read into struct qd_model_hparams as
 * model_load.c reads the rest. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/graph.h"
#include "model/model_keys.h"

/* ---- metadata ------------------------------------------------------------------------------- */

int qd_model_kv_number(const struct qd_gguf *g, const char *key, double *out, uint64_t *n_elems)
{
    const struct qd_gguf_kv *kv = qd_gguf_find(g, key);
    if (!kv)
        return 0;
    uint32_t type = kv->type;
    const uint8_t *v = kv->value;
    uint64_t n = 1;
    if (type == QD_GGUF_ARRAY) {
        memcpy(&type, v, 4);
        memcpy(&n, v + 4, 8);
        if (!n)
            return -1;
        v += 12;
    }
    if (n_elems)
        *n_elems = n;
    union {
        uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32;
        uint64_t u64; int64_t i64; double f64;
    } u;
    switch (type) {
    case QD_GGUF_U8: case QD_GGUF_BOOL: memcpy(&u.u8, v, 1); *out = u.u8; return 1;
    case QD_GGUF_I8: memcpy(&u.i8, v, 1); *out = u.i8; return 1;
    case QD_GGUF_U16: memcpy(&u.u16, v, 2); *out = u.u16; return 1;
    case QD_GGUF_I16: memcpy(&u.i16, v, 2); *out = u.i16; return 1;
    case QD_GGUF_U32: memcpy(&u.u32, v, 4); *out = u.u32; return 1;
    case QD_GGUF_I32: memcpy(&u.i32, v, 4); *out = u.i32; return 1;
    case QD_GGUF_F32: memcpy(&u.f32, v, 4); *out = u.f32; return 1;
    case QD_GGUF_U64: memcpy(&u.u64, v, 8); *out = (double)u.u64; return 1;
    case QD_GGUF_I64: memcpy(&u.i64, v, 8); *out = (double)u.i64; return 1;
    case QD_GGUF_F64: memcpy(&u.f64, v, 8); *out = u.f64; return 1;
    default: return -1;
    }
}

/* Whether every element of a per-layer array key equals the first (the engine takes one size
 * for all blocks). */
static int kv_array_uniform(const struct qd_gguf *g, const char *key)
{
    const struct qd_gguf_kv *kv = qd_gguf_find(g, key);
    if (!kv || kv->type != QD_GGUF_ARRAY)
        return 1;
    uint32_t type;
    uint64_t n;
    memcpy(&type, kv->value, 4);
    memcpy(&n, kv->value + 4, 8);
    const size_t size = type == QD_GGUF_U32 || type == QD_GGUF_I32 ? 4 : type == QD_GGUF_U64 || type == QD_GGUF_I64 ? 8 : 0;
    if (!size)
        return 0;
    for (uint64_t i = 1; i < n; i++)
        if (memcmp(kv->value + 12, kv->value + 12 + i * size, size))
            return 0;
    return 1;
}

int qd_model_keys_number(struct qd_model_keys *mt, const char *suffix, int required, double *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    int found = qd_model_kv_number(mt->g, key, out, NULL);
    if (found < 0) {
        snprintf(mt->err, mt->errlen, "the model's key %s is not a number", key);
        return -1;
    }
    if (!found && required) {
        snprintf(mt->err, mt->errlen, "the model has no %s key, which llama.cpp's loader requires too", key);
        return -1;
    }
    if (found && !kv_array_uniform(mt->g, key)) {
        snprintf(mt->err, mt->errlen, "the model's %s differs from block to block: the engine runs blocks of one "
                 "size only", key);
        return -1;
    }
    return found;
}

char *qd_model_keys_string(struct qd_model_keys *mt, const char *suffix)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    return qd_gguf_string(mt->g, key);
}

int qd_model_key(struct qd_model *m, const char *suffix, int required, double *out, char *err, size_t errlen)
{
    struct qd_model_keys mt = {.g = &m->file.g, .arch = m->arch_name, .err = err, .errlen = errlen};
    return qd_model_keys_number(&mt, suffix, required, out);
}

/* ---- the experts' and latent attention's keys ---------------------------------------------- */

/* deepseek2's load_arch_hparams: the leading dense blocks, the experts' width and the shared
 * ones (both required), the weights' renormalisation, scale and gating function. */
static int read_deepseek2_experts(struct qd_model_keys *mt, struct qd_model *m)
{
    struct qd_model_hparams *hp = &m->hp;
    double v = 0;
    int found;
    if ((found = qd_model_keys_number(mt, "leading_dense_block_count", 0, &v)) < 0)
        return -1;
    hp->n_dense_lead = found ? (int)v : 0;
    if (qd_model_keys_number(mt, "expert_feed_forward_length", 1, &v) < 0)
        return -1;
    hp->n_ff_exp = (int64_t)v;
    if (qd_model_keys_number(mt, "expert_shared_count", 1, &v) < 0)
        return -1;
    hp->n_expert_shared = (int)v;
    hp->n_ff_shexp = hp->n_ff_exp * hp->n_expert_shared;
    v = 0;
    if ((found = qd_model_keys_number(mt, "expert_weights_scale", 0, &v)) < 0)
        return -1;
    hp->gating.w_scale = (float)v;
    v = 0;
    if ((found = qd_model_keys_number(mt, "expert_weights_norm", 0, &v)) < 0)
        return -1;
    hp->gating.norm_w = v != 0;
    v = 0;
    if ((found = qd_model_keys_number(mt, "expert_gating_func", 0, &v)) < 0)
        return -1;
    /* llama_expert_gating_func_type: 0 (none: DeepSeek V2's softmax), 1 softmax, 2 sigmoid */
    if (v != 0 && v != 1 && v != 2) {
        snprintf(mt->err, mt->errlen, "the model's expert gating function %g (%s.expert_gating_func) is not one the "
                 "engine runs (1: softmax, 2: sigmoid)", v, mt->arch);
        return -1;
    }
    hp->gating.func = v == 2 ? QD_MOE_SIGMOID : QD_MOE_SOFTMAX;
    if (hp->n_dense_lead < 0 || hp->n_dense_lead > hp->n_layer || hp->n_ff_exp <= 0 || hp->n_expert_shared < 0) {
        snprintf(mt->err, mt->errlen, "the model's expert sizes do not fit together: %d leading dense blocks of %"
                 PRId64 ", experts %" PRId64 " wide, %d shared", hp->n_dense_lead, hp->n_layer, hp->n_ff_exp,
                 hp->n_expert_shared);
        return -1;
    }
    return 0;
}

/* deepseek2's latent attention keys: the compressions' ranks and, in files that split kv_b, the
 * heads' own sizes (key_length then holds the shared head llama.cpp attends with). */
int qd_model_read_mla(struct qd_model_keys *mt, struct qd_model *m)
{
    struct qd_model_hparams *hp = &m->hp;
    double v = 0;
    int found;
    if (qd_model_keys_number(mt, "attention.q_lora_rank", 1, &v) < 0)
        return -1;
    hp->n_lora_q = (int)v;
    if (qd_model_keys_number(mt, "attention.kv_lora_rank", 1, &v) < 0)
        return -1;
    hp->n_lora_kv = (int)v;
    hp->head_dim_k_mla = hp->head_dim_k, hp->head_dim_v_mla = hp->head_dim_v;
    double k = 0, vl = 0;
    int has_k, has_v;
    if ((has_k = qd_model_keys_number(mt, "attention.key_length_mla", 0, &k)) < 0 ||
        (has_v = qd_model_keys_number(mt, "attention.value_length_mla", 0, &vl)) < 0)
        return -1;
    hp->mla_absorbed = has_k && k > 0;
    if (hp->mla_absorbed) {
        hp->head_dim_k_mla = (int)k, hp->head_dim_v_mla = (int)vl;
        if (hp->head_dim_k != hp->n_lora_kv + hp->rope.n_rot || hp->head_dim_v != hp->n_lora_kv) {
            snprintf(mt->err, mt->errlen, "the model's shared key/value head (attention.key_length %d, value_length "
                     "%d) is not kv_lora_rank + rope (%d + %d) and kv_lora_rank", hp->head_dim_k, hp->head_dim_v,
                     hp->n_lora_kv, hp->rope.n_rot);
            return -1;
        }
    }
    (void)found;
    if (hp->n_lora_q < 0 || hp->n_lora_kv <= 0 || hp->head_dim_k_mla <= hp->rope.n_rot || hp->head_dim_v_mla <= 0 ||
        hp->rope.n_rot % 2) {
        snprintf(mt->err, mt->errlen, "the model's latent attention sizes do not fit together: q rank %d, kv rank %d, "
                 "key %d (rope %d), value %d", hp->n_lora_q, hp->n_lora_kv, hp->head_dim_k_mla, hp->rope.n_rot,
                 hp->head_dim_v_mla);
        return -1;
    }
    return 0;
}

/* The experts' keys (llama_model::load_hparams's expert_count and expert_used_count, the
 * architectures' expert_feed_forward_length and expert_shared_feed_forward_length): 0, or -1
 * with mt->err. Without an architecture row for experts, a file with them is refused. */
int qd_model_read_experts(struct qd_model_keys *mt, struct qd_model *m)
{
    struct qd_model_hparams *hp = &m->hp;
    const struct qd_model_moe *moe = m->arch->moe;
    double v = 0;
    int found;
    if ((found = qd_model_keys_number(mt, "expert_count", 0, &v)) < 0)
        return -1;
    hp->n_expert = found ? (int)v : 0;
    v = 0;
    if ((found = qd_model_keys_number(mt, "expert_used_count", 0, &v)) < 0)
        return -1;
    hp->n_expert_used = found ? (int)v : 0;
    if (!hp->n_expert && moe && moe->experts_required) {
        snprintf(mt->err, mt->errlen, "a %s model needs %s.expert_count > 0 (llama.cpp refuses it too)", m->arch->name,
                 mt->arch);
        return -1;
    }
    if (!hp->n_expert)
        return 0;
    if (!moe) {
        snprintf(mt->err, mt->errlen, "the model has %d experts (%s.expert_count), which the engine's %s graph does "
                 "not run", hp->n_expert, mt->arch, m->arch->name);
        return -1;
    }
    if (hp->n_expert < 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert) {
        snprintf(mt->err, mt->errlen, "the model uses %d of its %d experts a token (%s.expert_used_count): it must "
                 "use between 1 and all of them", hp->n_expert_used, hp->n_expert, mt->arch);
        return -1;
    }
    /* the experts' width: Mixtral's is n_ff; the qwens name theirs or take n_ff / n_expert_used
     * (deepseek2's: read_deepseek2_experts) */
    hp->n_ff_exp = hp->n_ff;
    if (moe != &qd_moe_mixtral) {
        v = 0;
        if ((found = qd_model_keys_number(mt, "expert_feed_forward_length", 0, &v)) < 0)
            return -1;
        hp->n_ff_exp = found && v > 0 ? (int64_t)v : hp->n_ff / hp->n_expert_used;
    }
    v = 0;
    if ((found = qd_model_keys_number(mt, "expert_shared_feed_forward_length", 0, &v)) < 0)
        return -1;
    hp->n_ff_shexp = found && v > 0 ? (int64_t)v : hp->n_ff;
    /* llama.cpp passes softmax and no scale (expert_weights_scale is not read for these) */
    hp->gating = (struct qd_nn_moe_gating){.func = QD_MOE_SOFTMAX, .norm_w = moe->norm_w, .w_scale = 0.0f};
    if (hp->n_expert > QD_NN_MAX_EXPERTS) {
        snprintf(mt->err, mt->errlen, "the model has %d experts: the engine (as llama.cpp) runs at most %d",
                 hp->n_expert, QD_NN_MAX_EXPERTS);
        return -1;
    }
    /* group-limited routing (llama_model::load_hparams reads it for every architecture) */
    v = 0;
    if ((found = qd_model_keys_number(mt, "expert_group_count", 0, &v)) < 0)
        return -1;
    hp->gating.n_group = found ? (int)v : 0;
    v = 0;
    if ((found = qd_model_keys_number(mt, "expert_group_used_count", 0, &v)) < 0)
        return -1;
    hp->gating.n_group_used = found ? (int)v : 0;
    if (hp->gating.n_group > 1 && (hp->n_expert % hp->gating.n_group || hp->gating.n_group_used < 1 ||
                                   hp->gating.n_group_used > hp->gating.n_group)) {
        snprintf(mt->err, mt->errlen, "the model's %d experts in %d groups, %d used (%s.expert_group_count, "
                 "expert_group_used_count), do not fit together", hp->n_expert, hp->gating.n_group,
                 hp->gating.n_group_used, mt->arch);
        return -1;
    }
    return moe == &qd_moe_deepseek2 ? read_deepseek2_experts(mt, m) : 0;
}

/* YaRN as llama_context sets it up for deepseek2: the ramp on (ext_factor 1), the log
 * multiplier deepseek2's loader reads (over 0.1), and the attention factor that rope's own
 * 1 + 0.1 ln(factor) cancels, times rope.scaling.attn_factor. */
int qd_model_read_yarn(struct qd_model_keys *mt, struct qd_model *m)
{
    struct qd_model_hparams *hp = &m->hp;
    struct qd_nn_rope *r = &hp->rope;
    double v = 0;
    int found;
    if ((found = qd_model_keys_number(mt, "rope.scaling.yarn_log_multiplier", 0, &v)) < 0)
        return -1;
    hp->yarn_log_mul = found ? (float)v / 0.1f : 0.0f;
    r->ext_factor = 1.0f;
    const float factor = 1.0f / r->freq_scale;
    if (hp->yarn_log_mul != 0.0f) {
        /* get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dims) with deepseek2's
         * mscale = mscale_all_dims unless that is 1: the same number over itself */
        const float mscale = hp->yarn_log_mul;
        const float a = factor <= 1.0f ? 1.0f : 0.1f * mscale * logf(factor) + 1.0f;
        r->attn_factor = a / a;
    } else
        r->attn_factor = factor <= 1.0f ? 1.0f : 0.1f * 1.0f * logf(factor) + 1.0f;
    r->attn_factor *= 1.0f / (1.0f + 0.1f * logf(factor));
    v = 1.0;
    if ((found = qd_model_keys_number(mt, "rope.scaling.attn_factor", 0, &v)) < 0)
        return -1;
    r->attn_factor *= found ? (float)v : 1.0f;
    return 0;
}
