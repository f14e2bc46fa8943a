/* The rules of gguf_recipe.h, for the mixes quantd writes. Only the branches those mixes reach
 * are here: the IQ and ternary mixes, imatrix-only rules and user overrides are llama.cpp's
 * alone. */
#include "checkpoint/gguf_recipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 7, Q5_0 = 8, Q5_1 = 9, Q2_K = 10, Q3_K_S = 11, Q3_K_M = 12, Q3_K_L = 13,
       Q4_K_S = 14, Q4_K_M = 15, Q5_K_S = 16, Q5_K_M = 17, Q6_K = 18 };

static const struct qd_gguf_recipe recipes[] = {
    {"Q4_0", Q4_0, "q4_0"},     {"Q4_1", Q4_1, "q4_1"},     {"Q5_0", Q5_0, "q5_0"},
    {"Q5_1", Q5_1, "q5_1"},     {"Q8_0", Q8_0, "q8_0"},     {"Q2_K", Q2_K, "q2_K"},
    {"Q3_K_S", Q3_K_S, "q3_K"}, {"Q3_K_M", Q3_K_M, "q3_K"}, {"Q3_K_L", Q3_K_L, "q3_K"},
    {"Q4_K_S", Q4_K_S, "q4_K"}, {"Q4_K_M", Q4_K_M, "q4_K"}, {"Q5_K_S", Q5_K_S, "q5_K"},
    {"Q5_K_M", Q5_K_M, "q5_K"}, {"Q6_K", Q6_K, "q6_K"},
    /* llama-quantize's aliases */
    {"Q3_K", Q3_K_M, "q3_K"},   {"Q4_K", Q4_K_M, "q4_K"},   {"Q5_K", Q5_K_M, "q5_K"},
};

const struct qd_gguf_recipe *qd_gguf_recipe_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof recipes / sizeof *recipes; i++)
        if (!strcmp(recipes[i].name, name))
            return &recipes[i];
    return NULL;
}

const char *qd_gguf_recipe_names(void)
{
    return "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K (Q3_K, Q4_K, "
           "Q5_K: the _M mixes)";
}

/* An integer key's value (an array's first element), or def. */
static int64_t kv_int(const struct qd_gguf *g, const char *arch, const char *suffix, int64_t def)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
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

void qd_recipe_init(struct qd_recipe_state *s, const struct qd_gguf_recipe *r, const struct qd_gguf *g)
{
    memset(s, 0, sizeof *s);
    s->r = r;
    char *arch = qd_gguf_string(g, "general.architecture");
    const char *a = arch ? arch : "";
    s->falcon = !strcmp(a, "falcon");
    s->glm5_next = !strcmp(a, "glm5-next");
    s->n_layer = (int)kv_int(g, a, "block_count", 0);
    int64_t n_head = kv_int(g, a, "attention.head_count", 0);
    int64_t n_head_kv = kv_int(g, a, "attention.head_count_kv", n_head);
    s->n_gqa = n_head_kv ? (int)(n_head / n_head_kv) : 0;
    s->n_expert = (int)kv_int(g, a, "expert_count", 0);
    /* the model types whose 70B rule the mixes read (llama.cpp src/models/<arch>.cpp) */
    s->is_70b = (!strcmp(a, "llama") && s->n_layer == 80 && n_head != n_head_kv) ||
                ((!strcmp(a, "qwen2") || !strcmp(a, "olmo") || !strcmp(a, "deci")) && s->n_layer == 80) ||
                (!strcmp(a, "jais2") && s->n_layer == 68);
    s->tied = 1; /* until output.weight is seen */
    for (int64_t i = 0; i < g->n_tensors; i++) {
        enum category c = category(g->tensors[i].name);
        s->n_attention_wv += attn_v_like(c);
        if (c == OUTPUT)
            s->tied = 0;
    }
    free(arch);
}

static int use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int block_of(const char *fmt) { return qd_format_find(fmt)->block_elems; }

const struct qd_format *qd_recipe_format(struct qd_recipe_state *s, const struct qd_gguf_tensor *t)
{
    const int ft = s->r->ftype;
    const char *type = s->r->fmt;
    enum category c = category(t->name);
    if (s->glm5_next && (strstr(t->name, "attn_q_a") || strstr(t->name, "attn_q_b") || strstr(t->name, "nextn.eh_proj")))
        return qd_format_find("q8_0");
    if (c == OUTPUT || (s->tied && c == TOKEN_EMBD)) {
        if (s->falcon || t->ne[0] % block_of(type))
            type = "q8_0";
        else if (strcmp(type, "q8_0"))
            type = "q6_K";
    } else if (c == TOKEN_EMBD) {
        /* (only the IQ and ternary mixes change it) */
    } else if (attn_v_like(c)) {
        if (ft == Q2_K)
            type = s->n_gqa >= 4 ? "q4_K" : "q3_K";
        else if (ft == Q3_K_M)
            type = s->i_attention_wv < 2 ? "q5_K" : "q4_K";
        else if (ft == Q3_K_L)
            type = "q5_K";
        else if ((ft == Q4_K_M || ft == Q5_K_M) && use_more_bits(s->i_attention_wv, s->n_attention_wv))
            type = "q6_K";
        else if (ft == Q4_K_S && s->i_attention_wv < 4)
            type = "q5_K";
        if (s->is_70b && (!strcmp(type, "q3_K") || !strcmp(type, "q4_K")))
            type = "q5_K";
        if (s->n_expert == 8)
            type = "q8_0";
        s->i_attention_wv++;
    } else if (c == ATTN_K) {
        if (s->n_expert == 8)
            type = "q8_0";
    } else if (c == FFN_DOWN) {
        int i = s->i_ffn_down, n = s->n_layer;
        if (s->n_expert > 1) /* experts are not in layer order: the layer is in the name */
            sscanf(t->name, "blk.%d.", &i);
        if (ft == Q2_K)
            type = "q3_K";
        else if (ft == Q3_K_M)
            type = i < n / 16 ? "q5_K" : !s->falcon || use_more_bits(i, n) ? "q4_K" : "q3_K";
        else if (ft == Q3_K_L)
            type = s->falcon ? "q4_K" : "q5_K";
        else if (ft == Q4_K_M) {
            if (s->falcon)
                type = i < n / 16 ? "q6_K" : use_more_bits(i, n) ? "q5_K" : "q4_K";
            else if (use_more_bits(i, n))
                type = "q6_K";
        } else if (ft == Q5_K_M && use_more_bits(i, n))
            type = "q6_K";
        else if (ft == Q4_K_S && !s->falcon && i < n / 8)
            type = "q5_K";
        s->i_ffn_down++;
    } else if (c == ATTN_OUTPUT) {
        if (!s->falcon) {
            if (s->n_expert == 8) {
                if (ft == Q2_K || ft == Q3_K_S || ft == Q3_K_M || ft == Q4_K_S || ft == Q4_K_M)
                    type = "q5_K";
            } else if (ft == Q2_K)
                type = "q3_K";
            else if (ft == Q3_K_M)
                type = "q4_K";
            else if (ft == Q3_K_L)
                type = "q5_K";
        } else if (ft == Q3_K_L)
            type = "q4_K";
    }
    return qd_format_find(type);
}
