/* Gemma 2 and Gemma 3 (llama.cpp src/models/gemma2.cpp, gemma3.cpp): their hyperparameters
 * (load_arch_hparams) and their block, a Llama block with a norm on each sub-block's output
 * before its residual:
 *
 *     h = h + post_attn_norm(wo . attn(rope(wq . norm(h)) * scale, rope(wk . norm(h)), wv . norm(h)))
 *     h = h + post_ffw_norm(down(gelu(gate . norm(h)) * (up . norm(h))))
 *
 * Gemma 3 adds per-head q/k norms before rope (the shared attention builder's). The norms' weights
 * are used as stored: convert_hf_to_gguf.py already added the 1 of Gemma's (1 + w) RMSNorm. The
 * token embeddings are scaled by sqrt(n_embd) (engine.c), the logits soft-capped where the
 * hyperparameters say (engine.c's head). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/graph.h"

/* load_swa_pattern: the file's per-layer flags (an array of bools), or its period (a number,
 * default n_pattern), read as llama_hparams::set_swa_pattern does: layer l slides unless it is
 * the last of its period. */
static int swa_pattern(struct qd_model *m, unsigned n_pattern, char *err, size_t errlen)
{
    struct qd_model_hparams *hp = &m->hp;
    char key[160];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->arch_name);
    const struct qd_gguf_kv *kv = qd_gguf_find(&m->file.g, key);
    if (kv && kv->type == QD_GGUF_ARRAY) {
        uint32_t type;
        uint64_t n;
        memcpy(&type, kv->value, 4);
        memcpy(&n, kv->value + 4, 8);
        const size_t size = type == QD_GGUF_BOOL ? 1 : type == QD_GGUF_U32 || type == QD_GGUF_I32 ? 4 : 0;
        if (!size || n < (uint64_t)hp->n_layer) {
            snprintf(err, errlen, "the model's %s must hold a bool or an int32 per block (%" PRId64 ")", key,
                     hp->n_layer);
            return -1;
        }
        for (int64_t l = 0; l < hp->n_layer; l++) {
            uint32_t flag = 0;
            memcpy(&flag, kv->value + 12 + l * size, size);
            hp->swa[l] = flag != 0;
        }
        return 0;
    }
    double v;
    int found = qd_model_key(m, "attention.sliding_window_pattern", 0, &v, err, errlen);
    if (found < 0)
        return -1;
    if (found)
        n_pattern = (unsigned)v;
    for (int64_t l = 0; l < hp->n_layer; l++)
        hp->swa[l] = n_pattern == 0 || (unsigned)(l % n_pattern) < n_pattern - 1;
    return 0;
}

/* gemma_pytorch's query_pre_attn_scalar as llama.cpp keys it on the model's size: the 27B's
 * n_embd / n_head, every other size's head size */
static float gemma_attn_scale(const struct qd_model_hparams *hp, int64_t layers_27b)
{
    return hp->n_layer == layers_27b ? 1.0f / sqrtf((float)(hp->n_embd / hp->n_head))
                                     : 1.0f / sqrtf((float)hp->head_dim_k);
}

int qd_arch_gemma2_hparams(struct qd_model *m, char *err, size_t errlen)
{
    struct qd_model_hparams *hp = &m->hp;
    double v;
    int found;
    hp->n_swa = 4096; /* Gemma 2's, unless the file says */
    if (swa_pattern(m, 2, err, errlen) < 0)
        return -1;
    if ((found = qd_model_key(m, "rope.freq_base_swa", 0, &v, err, errlen)) < 0)
        return -1;
    if (found)
        hp->rope_swa.freq_base = (float)v;
    if ((found = qd_model_key(m, "attention.sliding_window", 0, &v, err, errlen)) < 0)
        return -1;
    if (found)
        hp->n_swa = (int64_t)v;
    hp->attn_softcap = 50.0f, hp->final_softcap = 30.0f; /* llama_hparams' defaults */
    if ((found = qd_model_key(m, "attn_logit_softcapping", 0, &v, err, errlen)) < 0)
        return -1;
    if (found)
        hp->attn_softcap = (float)v;
    if ((found = qd_model_key(m, "final_logit_softcapping", 0, &v, err, errlen)) < 0)
        return -1;
    if (found)
        hp->final_softcap = (float)v;
    hp->attn_scale = gemma_attn_scale(hp, 46);
    hp->embd_scale = sqrtf((float)hp->n_embd);
    return 0;
}

int qd_arch_gemma3_hparams(struct qd_model *m, char *err, size_t errlen)
{
    struct qd_model_hparams *hp = &m->hp;
    double v;
    int found;
    if ((found = qd_model_key(m, "attention.sliding_window", 0, &v, err, errlen)) < 0)
        return -1;
    if (found && v > 0) {
        hp->n_swa = (int64_t)v;
        if (swa_pattern(m, 6, err, errlen) < 0)
            return -1;
        /* the local layers' rope: base 10000 unless the file says, never scaled */
        hp->rope_swa.freq_base = 10000.0f;
        hp->rope_swa.freq_scale = 1.0f;
        if ((found = qd_model_key(m, "rope.freq_base_swa", 0, &v, err, errlen)) < 0)
            return -1;
        if (found)
            hp->rope_swa.freq_base = (float)v;
    }
    if ((found = qd_model_key(m, "final_logit_softcapping", 0, &v, err, errlen)) < 0)
        return -1;
    if (found)
        hp->final_softcap = (float)v;
    hp->attn_scale = gemma_attn_scale(hp, 62);
    hp->embd_scale = sqrtf((float)hp->n_embd);
    return 0;
}

enum qd_status qd_arch_gemma_block(struct qd_block_run *r)
{
    const int64_t T = r->T, n_embd = r->m->hp.n_embd;
    struct qd_block_scratch *s = r->s;

    qd_graph_norm(r, s->cur, r->hidden, QD_W_ATTN_NORM, QD_W_COUNT, T, n_embd);
    enum qd_status st = qd_graph_attention(r);
    if (st != QD_OK)
        return st;
    qd_graph_norm(r, s->proj, s->proj, QD_W_ATTN_POST_NORM, QD_W_COUNT, T, n_embd);
    r->nn->add(r->hidden, s->proj, T * n_embd); /* sa_out = attn_post_norm + inpL */

    qd_graph_norm(r, s->cur, r->hidden, QD_W_FFN_NORM, QD_W_COUNT, T, n_embd);
    qd_graph_ffn(r);
    qd_graph_norm(r, s->proj, s->proj, QD_W_FFN_POST_NORM, QD_W_COUNT, T, n_embd);
    r->nn->add(r->hidden, s->proj, T * n_embd); /* l_out = ffn_post_norm + sa_out */
    return QD_OK;
}
