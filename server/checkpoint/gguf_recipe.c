/* The rules of gguf_recipe.h, for the mixes quantd writes, with llama-quantize's per-tensor
 * options (gguf_options.h). Only the branches those mixes reach are here (and the IQ2 mixes',
 * which share the IQ1 mixes' branch). */
#include "checkpoint/gguf_recipe.h"

#include "checkpoint/convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 7, Q5_0 = 8, Q5_1 = 9, Q2_K = 10, Q3_K_S = 11, Q3_K_M = 12, Q3_K_L = 13,
       Q4_K_S = 14, Q4_K_M = 15, Q5_K_S = 16, Q5_K_M = 17, Q6_K = 18, Q2_K_S = 21, IQ4_NL = 25, IQ4_XS = 30,
       TQ1_0 = 36, TQ2_0 = 37, MXFP4_MOE = 38, IQ2_XXS = 19, IQ2_XS = 20, IQ3_XS = 22, IQ3_XXS = 23, IQ1_S = 24,
       IQ3_S = 26, IQ3_M = 27, IQ2_S = 28, IQ2_M = 29, IQ1_M = 31 };
/* ggml type ids the IQ rules name */
enum { T_IQ2_XXS = 16, T_IQ3_XXS = 18, T_IQ3_S = 21, T_IQ2_S = 22 };

#define MIX(name, ftype, fmt) {name, ftype, fmt, 0, 0}
static const struct qd_gguf_recipe recipes[] = {
    MIX("Q4_0", Q4_0, "q4_0"),     MIX("Q4_1", Q4_1, "q4_1"),     MIX("Q5_0", Q5_0, "q5_0"),
    MIX("Q5_1", Q5_1, "q5_1"),     MIX("Q8_0", Q8_0, "q8_0"),     MIX("Q2_K", Q2_K, "q2_K"),
    MIX("Q3_K_S", Q3_K_S, "q3_K"), MIX("Q3_K_M", Q3_K_M, "q3_K"), MIX("Q3_K_L", Q3_K_L, "q3_K"),
    MIX("Q4_K_S", Q4_K_S, "q4_K"), MIX("Q4_K_M", Q4_K_M, "q4_K"), MIX("Q5_K_S", Q5_K_S, "q5_K"),
    MIX("Q5_K_M", Q5_K_M, "q5_K"), MIX("Q6_K", Q6_K, "q6_K"),
    MIX("Q2_K_S", Q2_K_S, "q2_K"), /* (with an importance matrix only: qd_recipe_requires_imatrix) */
    MIX("IQ4_NL", IQ4_NL, "iq4_nl"), MIX("IQ4_XS", IQ4_XS, "iq4_xs"), MIX("TQ1_0", TQ1_0, "tq1_0"),
    MIX("TQ2_0", TQ2_0, "tq2_0"),     MIX("MXFP4_MOE", MXFP4_MOE, "mxfp4_ggml"),
    MIX("IQ3_S", IQ3_S, "iq3_s"),     MIX("IQ3_M", IQ3_M, "iq3_s"),
    /* (with an importance matrix only: their IQ3_XXS and IQ1 tensors) */
    MIX("IQ3_XXS", IQ3_XXS, "iq3_xxs"), MIX("IQ3_XS", IQ3_XS, "iq3_s"), MIX("IQ1_S", IQ1_S, "iq1_s"),
    MIX("IQ1_M", IQ1_M, "iq1_m"),
    /* (with an importance matrix only; IQ2_S's default type is IQ2_XS, IQ2_M's IQ2_S) */
    MIX("IQ2_XXS", IQ2_XXS, "iq2_xxs"), MIX("IQ2_XS", IQ2_XS, "iq2_xs"), MIX("IQ2_S", IQ2_S, "iq2_xs"),
    MIX("IQ2_M", IQ2_M, "iq2_s"),
    /* every quantizable tensor converted to one float type; COPY after F32, whose id (0) it shares */
    {"F16", 1, NULL, QD_GGML_F16, 0}, {"BF16", 32, NULL, QD_GGML_BF16, 0}, {"F32", 0, NULL, QD_GGML_F32, 0},
    {"COPY", 0, NULL, QD_GGML_F32, 1},
    /* llama-quantize's aliases */
    MIX("Q3_K", Q3_K_M, "q3_K"),   MIX("Q4_K", Q4_K_M, "q4_K"),   MIX("Q5_K", Q5_K_M, "q5_K"),
};

const struct qd_gguf_recipe *qd_gguf_recipe_find(const char *name)
{
    int id = -1;
    if (name && *name && strspn(name, "0123456789") == strlen(name) && strlen(name) < 4)
        id = atoi(name); /* llama-quantize's numeric ids: the first mix of that ftype, not an alias */
    for (size_t i = 0; name && i < sizeof recipes / sizeof *recipes; i++)
        if (id >= 0 ? recipes[i].ftype == id : !strcmp(recipes[i].name, name))
            return &recipes[i];
    return NULL;
}

const char *qd_gguf_recipe_names(void)
{
    return "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K (Q3_K, Q4_K, "
           "Q5_K: the _M mixes), IQ4_NL IQ4_XS IQ3_S IQ3_M TQ1_0 TQ2_0 MXFP4_MOE, Q2_K_S IQ3_XXS IQ3_XS IQ2_XXS IQ2_XS "
           "IQ2_S IQ2_M IQ1_S IQ1_M (with --imatrix), F16 BF16 F32 COPY";
}

/* An integer key's value (an array's first element), or def. */
/* An --override-kv int reaches the loader's hyperparameters too (llama-quantize hands its
 * overrides to llama_model_loader). */
static int64_t kv_int(const struct qd_gguf *g, const struct qd_gguf_options *opt, const char *arch,
                      const char *suffix, int64_t def)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    for (int i = opt->n_kv_overrides - 1; i >= 0; i--)
        if (opt->kv_overrides[i].tag == QD_KVO_INT && !strcmp(opt->kv_overrides[i].key, key))
            return opt->kv_overrides[i].i;
    const struct qd_gguf_kv *kv = qd_gguf_find(g, key);
    if (!kv)
        return def;
    uint32_t type = kv->type;
    const uint8_t *v = kv->value;
    if (type == QD_GGUF_ARRAY) {
        uint64_t n;
        memcpy(&type, v, 4);
        memcpy(&n, v + 4, 8);
        if (!n)
            return def;
        v += 12;
    }
    uint64_t u = 0;
    switch (type) {
    case QD_GGUF_U8: case QD_GGUF_I8: case QD_GGUF_BOOL: return type == QD_GGUF_I8 ? (int8_t)v[0] : v[0];
    case QD_GGUF_U16: case QD_GGUF_I16: memcpy(&u, v, 2); return type == QD_GGUF_I16 ? (int16_t)u : (int64_t)u;
    case QD_GGUF_U32: case QD_GGUF_I32: memcpy(&u, v, 4); return type == QD_GGUF_I32 ? (int32_t)u : (int64_t)u;
    case QD_GGUF_U64: case QD_GGUF_I64: memcpy(&u, v, 8); return (int64_t)u;
    default: return def;
    }
}

enum category { TOKEN_EMBD, ATTN_Q, ATTN_V, ATTN_K, ATTN_QKV, ATTN_KV_B, ATTN_OUTPUT, FFN_UP, FFN_GATE, FFN_DOWN,
                OUTPUT, OTHER };

/* tensor_get_category: by name, first match wins */
static enum category category(const char *name)
{
    static const struct {
        const char *part;
        enum category c;
    } parts[] = {{"attn_qkv.weight", ATTN_QKV}, {"attn_kv_b.weight", ATTN_KV_B}, {"attn_v.weight", ATTN_V},
                 {"attn_k.weight", ATTN_K},     {"attn_q.weight", ATTN_Q},       {"attn_output.weight", ATTN_OUTPUT},
                 {"ffn_up", FFN_UP},            {"ffn_gate", FFN_GATE},          {"ffn_down", FFN_DOWN}};
    if (!strcmp(name, "output.weight"))
        return OUTPUT;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight"))
        return TOKEN_EMBD;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (strstr(name, parts[i].part))
            return parts[i].c;
    return OTHER;
}

static int attn_v_like(enum category c) { return c == ATTN_V || c == ATTN_QKV || c == ATTN_KV_B; }

static const struct qd_gguf_options no_options = {.output_tensor_type = QD_GGUF_TYPE_NONE,
                                                  .token_embedding_type = QD_GGUF_TYPE_NONE};

void qd_recipe_init(struct qd_recipe_state *s, const struct qd_gguf_recipe *r, uint32_t default_type,
                    const struct qd_gguf_options *opt, const struct qd_gguf *g, const char *const *names, int n)
{
    memset(s, 0, sizeof *s);
    s->r = r;
    s->opt = opt ? opt : &no_options;
    s->default_type = default_type;
    s->pure = !r || s->opt->pure;
    opt = s->opt;
    char *arch = qd_gguf_string(g, "general.architecture");
    const char *a = arch ? arch : "";
    s->arch = qd_gguf_arch_find(arch);
    s->n_layer = (int)kv_int(g, opt, a, "block_count", 0);
    int64_t n_head = kv_int(g, opt, a, "attention.head_count", 0);
    int64_t n_head_kv = kv_int(g, opt, a, "attention.head_count_kv", n_head);
    s->n_gqa = n_head_kv ? (int)(n_head / n_head_kv) : 0;
    s->n_expert = (int)kv_int(g, opt, a, "expert_count", 0);
    s->is_70b = s->arch->layers_70b && s->n_layer == s->arch->layers_70b &&
                (!s->arch->layers_70b_with_gqa || n_head != n_head_kv);
    s->tied = 1; /* until output.weight is seen */
    for (int i = 0; i < n; i++) {
        enum category c = category(names[i]);
        s->n_attention_wv += attn_v_like(c);
        if (c == OUTPUT)
            s->tied = 0;
    }
    free(arch);
}

static int use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int block_of(uint32_t type) { return qd_ggml_type(type)->block_elems; }

/* the IQ1 and IQ2 mixes, which llama.cpp types by rules of their own */
static int low_bit(int ft)
{
    return ft == IQ2_XXS || ft == IQ2_XS || ft == IQ1_S || ft == IQ2_S || ft == IQ2_M || ft == IQ1_M;
}

static int iq2_sm(int ft) { return ft == IQ2_S || ft == IQ2_M; }

/* the layer of an ffn tensor: its counter's, or for experts (not in layer order) its name's */
static int ffn_layer(const struct qd_recipe_state *s, const char *name, int counter)
{
    int i = counter;
    if (s->n_expert > 1)
        sscanf(name, "blk.%d.", &i);
    return i;
}

/* llama_tensor_get_type_impl: the mix's rule for a tensor of category c. */
static uint32_t mix_type(struct qd_recipe_state *s, const struct qd_gguf_tensor *t, const char *name, enum category c)
{
    const int ft = s->r->ftype;
    uint32_t type = s->default_type;
    const int falcon = s->arch->falcon_rules;
    if (qd_gguf_arch_names_any(name, s->arch->q8_0))
        return QD_GGML_Q8_0;
    if (c == OUTPUT || (s->tied && c == TOKEN_EMBD)) {
        if (s->opt->output_tensor_type != QD_GGUF_TYPE_NONE)
            type = s->opt->output_tensor_type;
        else if (ft == MXFP4_MOE || falcon || t->ne[0] % block_of(type))
            type = QD_GGML_Q8_0;
        else if (low_bit(ft) || ft == IQ3_XXS)
            type = QD_GGML_Q5_K;
        else if (type != QD_GGML_Q8_0)
            type = QD_GGML_Q6_K;
    } else if (ft == MXFP4_MOE) { /* the experts (3-D) MXFP4, the rest Q8_0 */
        const int ffn = c == FFN_UP || c == FFN_GATE || c == FFN_DOWN;
        type = t->ne[2] > 1 && (!s->arch->mxfp4_ffn_experts_only || ffn) ? 39 /* mxfp4 */ : QD_GGML_Q8_0;
    } else if (c == TOKEN_EMBD) {
        if (ft == IQ2_XXS || ft == IQ2_XS || ft == IQ1_S || ft == IQ1_M)
            type = QD_GGML_Q2_K;
        else if (iq2_sm(ft) || ft == IQ3_XXS)
            type = T_IQ3_S;
        else if (ft == TQ1_0 || ft == TQ2_0)
            type = QD_GGML_Q4_K;
    } else if (low_bit(ft)) {
        if (attn_v_like(c)) {
            type = s->n_gqa >= 4 || s->n_expert >= 4 ? QD_GGML_Q4_K : iq2_sm(ft) ? T_IQ3_S : QD_GGML_Q2_K;
            s->i_attention_wv++;
        } else if (s->n_expert == 8 && c == ATTN_K) {
            type = QD_GGML_Q4_K;
        } else if (c == FFN_DOWN) { /* by the counter alone, experts or not */
            if (s->i_ffn_down < s->n_layer / 8)
                type = iq2_sm(ft) ? T_IQ3_S : QD_GGML_Q2_K;
            s->i_ffn_down++;
        } else if (c == ATTN_OUTPUT) {
            if (s->n_expert == 8)
                type = QD_GGML_Q5_K;
            else if (ft == IQ1_S || ft == IQ1_M)
                type = T_IQ2_XXS;
            else if (iq2_sm(ft))
                type = T_IQ3_S;
        }
    } else if (attn_v_like(c)) {
        if (ft == Q2_K)
            type = s->n_gqa >= 4 ? QD_GGML_Q4_K : QD_GGML_Q3_K;
        else if (ft == Q2_K_S && s->n_gqa >= 4)
            type = QD_GGML_Q4_K;
        else if (ft == IQ3_XXS)
            type = s->n_gqa >= 4 ? QD_GGML_Q4_K : !s->has_imatrix ? T_IQ3_S : T_IQ3_XXS;
        else if ((ft == IQ3_XS || ft == IQ3_S) && s->n_gqa >= 4)
            type = QD_GGML_Q4_K;
        else if (ft == IQ3_M)
            type = QD_GGML_Q4_K;
        else if (ft == Q3_K_M)
            type = s->i_attention_wv < 2 ? QD_GGML_Q5_K : QD_GGML_Q4_K;
        else if (ft == Q3_K_L)
            type = QD_GGML_Q5_K;
        else if ((ft == Q4_K_M || ft == Q5_K_M) && use_more_bits(s->i_attention_wv, s->n_attention_wv))
            type = QD_GGML_Q6_K;
        else if ((ft == IQ4_NL || ft == IQ4_XS) && s->n_gqa >= 4)
            type = QD_GGML_Q5_K;
        else if (ft == Q4_K_S && s->i_attention_wv < 4)
            type = QD_GGML_Q5_K;
        if (s->is_70b && (type == QD_GGML_Q3_K || type == QD_GGML_Q4_K))
            type = QD_GGML_Q5_K;
        if (s->n_expert == 8)
            type = QD_GGML_Q8_0;
        s->i_attention_wv++;
    } else if (c == ATTN_K) {
        if (s->n_expert == 8)
            type = QD_GGML_Q8_0;
        else if (ft == IQ3_XS)
            type = T_IQ3_XXS;
        else if (ft == IQ3_XXS)
            type = T_IQ2_S;
    } else if (c == ATTN_Q) {
        if (ft == IQ3_XS)
            type = T_IQ3_XXS;
        else if (ft == IQ3_XXS)
            type = T_IQ2_S;
    } else if (c == FFN_DOWN) {
        const int i = ffn_layer(s, name, s->i_ffn_down), n = s->n_layer;
        if (ft == Q2_K)
            type = QD_GGML_Q3_K;
        else if (ft == Q2_K_S) {
            if (i < n / 8)
                type = QD_GGML_Q4_K;
        } else if (ft == IQ3_XXS && !s->has_imatrix)
            type = i < n / 8 ? QD_GGML_Q4_K : QD_GGML_Q3_K;
        else if (ft == Q3_K_M)
            type = i < n / 16 ? QD_GGML_Q5_K : !falcon || use_more_bits(i, n) ? QD_GGML_Q4_K : QD_GGML_Q3_K;
        else if (ft == IQ3_M && (i < n / 8 || (s->n_expert == 8 && use_more_bits(i, n))))
            type = QD_GGML_Q4_K;
        else if (ft == Q3_K_L)
            type = falcon ? QD_GGML_Q4_K : QD_GGML_Q5_K;
        else if (ft == Q4_K_M) {
            if (falcon)
                type = i < n / 16 ? QD_GGML_Q6_K : use_more_bits(i, n) ? QD_GGML_Q5_K : QD_GGML_Q4_K;
            else if (use_more_bits(i, n))
                type = QD_GGML_Q6_K;
        } else if (i < n / 8 && (ft == IQ4_NL || ft == IQ4_XS) && !s->has_imatrix)
            type = QD_GGML_Q5_K;
        else if (ft == Q5_K_M && use_more_bits(i, n))
            type = QD_GGML_Q6_K;
        else if (ft == Q4_K_S && !falcon && i < n / 8)
            type = QD_GGML_Q5_K;
        else if ((ft == Q4_0 || ft == Q5_0) && s->has_imatrix && i < n / 8)
            type = ft == Q4_0 ? QD_GGML_Q4_1 : QD_GGML_Q5_1; /* llama.cpp's guard for the first ffn_down layers */
        s->i_ffn_down++;
    } else if (c == ATTN_OUTPUT) {
        if (!falcon) {
            if (s->n_expert == 8) {
                if (ft == Q2_K || ft == Q3_K_S || ft == Q3_K_M || ft == Q4_K_S || ft == Q4_K_M || ft == IQ4_NL ||
                    ft == IQ4_XS || ft == IQ3_XS || ft == IQ3_XXS || ft == IQ3_S || ft == IQ3_M)
                    type = QD_GGML_Q5_K;
            } else if (ft == Q2_K)
                type = QD_GGML_Q3_K;
            else if (ft == IQ3_XXS)
                type = T_IQ3_S;
            else if (ft == Q3_K_M || ft == IQ3_M)
                type = QD_GGML_Q4_K;
            else if (ft == Q3_K_L)
                type = QD_GGML_Q5_K;
        } else if (ft == Q3_K_L)
            type = QD_GGML_Q4_K;
    } else if (c == FFN_GATE || c == FFN_UP) { /* IQ3_XS: the middle layers IQ3_XXS */
        int *counter = c == FFN_GATE ? &s->i_ffn_gate : &s->i_ffn_up;
        const int i = ffn_layer(s, name, *counter), n = s->n_layer;
        if (ft == IQ3_XS && i >= n / 8 && i < 7 * n / 8)
            type = T_IQ3_XXS;
        (*counter)++;
    }
    return type;
}

/* tensor_type_fallback: the type a row of ncols takes when type's block does not divide it:
 * the 256-block types name a 32-block one, a 32-block type stays, and F16 where the row fits
 * neither; QD_GGUF_TYPE_NONE where llama.cpp defines no fallback (it refuses too). */
static uint32_t fallback_type(uint32_t type, int64_t ncols)
{
    const struct qd_ggml_type *t = qd_ggml_type(type);
    if (ncols % t->block_elems == 0)
        return type;
    const uint32_t back = t->fallback ? t->fallback : t->block_elems <= 32 ? type : QD_GGUF_TYPE_NONE;
    if (back == QD_GGUF_TYPE_NONE)
        return back;
    return ncols % block_of(back) ? QD_GGML_F16 : back;
}

static int is_quantized(uint32_t type)
{
    return type != QD_GGML_F32 && type != QD_GGML_F16 && type != QD_GGML_BF16 && qd_ggml_type(type) &&
           qd_ggml_type(type)->block_elems > 1;
}

uint32_t qd_recipe_type(struct qd_recipe_state *s, const struct qd_gguf_tensor *t, const char *name)
{
    const struct qd_gguf_options *o = s->opt;
    const enum category c = category(name);
    if (o->token_embedding_type != QD_GGUF_TYPE_NONE && c == TOKEN_EMBD) {
        /* per_layer_token_embd follows it unless a --tensor-type names it */
        int named = 0;
        for (int i = 0; !strcmp(name, "per_layer_token_embd.weight") && i < o->n_tensor_types && !named; i++)
            named = qd_name_filter_keeps(o->tensor_types[i].match, name);
        if (!named)
            return o->token_embedding_type;
    }
    if (o->output_tensor_type != QD_GGUF_TYPE_NONE && c == OUTPUT)
        return o->output_tensor_type;
    uint32_t type = s->default_type;
    if (!is_quantized(type))
        return type;
    int manual = 0;
    for (int i = 0; i < o->n_tensor_types && !manual; i++)
        if (qd_name_filter_keeps(o->tensor_types[i].match, name)) {
            type = o->tensor_types[i].type;
            manual = 1;
        }
    if (!manual && !s->pure)
        type = mix_type(s, t, name, c);
    return fallback_type(type, t->ne[0]);
}

int qd_recipe_requires_imatrix(const struct qd_recipe_state *s, const char *name, uint32_t type)
{
    const enum category c = category(name);
    if (c == OUTPUT || c == TOKEN_EMBD)
        return 0;
    /* iq2_xxs iq2_xs iq3_xxs iq1_s iq2_s iq1_m, and Q2_K_S's q2_K */
    return type == 16 || type == 17 || type == 18 || type == 19 || type == 22 || type == 29 ||
           (type == QD_GGML_Q2_K && s->r && s->r->ftype == Q2_K_S);
}

const struct qd_format *qd_gguf_format_of(uint32_t type)
{
    for (int i = 0; i < qd_format_count; i++)
        if (qd_formats[i].gguf_type == (int)type && qd_formats[i].gguf_type)
            return &qd_formats[i];
    return NULL;
}

const struct qd_gguf_recipe *qd_gguf_recipe_at(int i)
{
    return i >= 0 && i < (int)(sizeof recipes / sizeof *recipes) ? &recipes[i] : NULL;
}
