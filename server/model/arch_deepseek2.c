/* The DeepSeek V2/V3 block (llama.cpp src/models/deepseek2.cpp): multi-head latent attention,
 * then a dense FFN (the leading_dense_block_count first blocks) or experts with shared ones
 * (arch_moe.c):
 *
 *     q      = wq_b . norm_qa(wq_a . x)          (or wq . x without a q LoRA), per head [nope | rope]
 *     c, kpe = wkv_a_mqa . x                     c: the compressed key/value, kpe: one rope key
 *     c      = norm_kva(c)
 *     q_rope, kpe rotated (ggml's normal rope, YaRN where the file scales)
 *
 * Files with the one kv_b expand c to each head's [k_nope | v] and attend as multi-head attention
 * with k = [k_nope | kpe]; files that split it into k_b / v_b (attention.key_length_mla) attend
 * as llama.cpp does then, one shared head: q' = [q_nope . k_b_h | q_rope], k = [c | kpe], v = c,
 * and each head's output times v_b_h. The scores' scale is mscale^2 / sqrt(nope + rope). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/graph.h"

/* rows x n values of src (row stride src_stride) into dst (row stride dst_stride), by the host */
static void copy_rows(const struct qd_block_run *r, float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows, int64_t n)
{
    qd_graph_sync(r);
    for (int64_t t = 0; t < rows; t++)
        memcpy(dst + t * dst_stride, src + t * src_stride, (size_t)n * sizeof *dst);
}

/* out [T][rows] = x [T][cols] . (head h's slice of a [n_head][rows][cols] weight)^T, the hook
 * told with the head's input rows */
static void head_linear(struct qd_block_run *r, float *out, const float *x, enum qd_model_weight role, int h)
{
    const struct qd_model_tensor *w = &r->b->w[role];
    if (r->on_matmul_head_input || r->on_matmul_input)
        qd_graph_sync(r);
    if (r->on_matmul_head_input)
        r->on_matmul_head_input(r->hook_ctx, r->layer, w->name, h, (int)w->experts, x, r->T, w->cols);
    else if (r->on_matmul_input)
        r->on_matmul_input(r->hook_ctx, r->layer, w->name, x, r->T, w->cols);
    r->nn->matmul(out, x, w->data + (int64_t)h * w->rows * w->cols, r->T, w->cols, w->rows);
}

static enum qd_status latent_attention(struct qd_block_run *r, float *arena)
{
    const struct qd_model_hparams *hp = &r->m->hp;
    const int64_t T = r->T, H = hp->n_head, R = hp->rope.n_rot, L = hp->n_lora_kv;
    const int64_t dk = hp->head_dim_k_mla, dv = hp->head_dim_v_mla, nope = dk - R;
    struct qd_block_scratch *s = r->s;
    float *q = arena, *kva = q + T * H * dk, *c = kva + T * (L + R), *attn = c + T * L, *rest = attn + T * H * dv;

    if (r->b->w[QD_W_ATTN_QA].data) {
        qd_graph_linear(r, rest, s->cur, QD_W_ATTN_QA, QD_W_COUNT);
        qd_graph_norm(r, rest, rest, QD_W_ATTN_QA_NORM, QD_W_COUNT, T, hp->n_lora_q);
        qd_graph_linear(r, q, rest, QD_W_ATTN_QB, QD_W_COUNT);
    } else
        qd_graph_linear(r, q, s->cur, QD_W_ATTN_Q, QD_W_COUNT);
    qd_graph_linear(r, kva, s->cur, QD_W_ATTN_KV_A_MQA, QD_W_COUNT);
    enum qd_status st = r->nn->rope(kva + L, T, L + R, 1, (int)R, r->pos, &hp->rope);
    copy_rows(r, c, L, kva, L + R, T, L);
    qd_graph_norm(r, c, c, QD_W_ATTN_KV_A_NORM, QD_W_COUNT, T, L);
    if (st == QD_OK) /* each head's rope part: the last R of its dk */
        st = r->nn->rope(q + nope, T, H * dk, (int)H, (int)dk, r->pos, &hp->rope);
    if (st != QD_OK)
        goto no_memory;

    if (!hp->mla_absorbed) {
        float *kv = rest, *k = kv + T * H * (nope + dv), *v = k + T * H * dk;
        qd_graph_linear(r, kv, c, QD_W_ATTN_KV_B, QD_W_COUNT);
        for (int64_t h = 0; h < H; h++) {
            copy_rows(r, k + h * dk, H * dk, kv + h * (nope + dv), H * (nope + dv), T, nope);
            copy_rows(r, k + h * dk + nope, H * dk, kva + L, L + R, T, R);
            copy_rows(r, v + h * dv, H * dv, kv + h * (nope + dv) + nope, H * (nope + dv), T, dv);
        }
        r->nn->round(k, T * H * dk, r->cache_k);
        r->nn->round(v, T * H * dv, r->cache_v);
        const struct qd_nn_attn a = {.T = T, .n_head = (int)H, .n_head_kv = (int)H, .head_dim_k = (int)dk,
                                     .head_dim_v = (int)dv, .q_stride = H * dk, .k_stride = H * dk,
                                     .v_stride = H * dv, .scale = hp->attn_scale, .seq = r->seq};
        st = r->nn->attention(attn, q, k, v, &a);
    } else {
        const int64_t dq = L + R; /* the shared head: [c | kpe] */
        float *qa = rest, *k = qa + T * H * dq, *v = k + T * dq, *o = v + T * L, *in = o + T * H * L;
        float *out = in + T * (nope > L ? nope : L);
        for (int64_t h = 0; h < H; h++) {
            copy_rows(r, in, nope, q + h * dk, H * dk, T, nope);
            head_linear(r, out, in, QD_W_ATTN_K_B_MLA, (int)h); /* q_nope absorbed: [T][L] */
            copy_rows(r, qa + h * dq, H * dq, out, L, T, L);
            copy_rows(r, qa + h * dq + L, H * dq, q + h * dk + nope, H * dk, T, R);
        }
        copy_rows(r, k, dq, c, L, T, L);
        copy_rows(r, k + L, dq, kva + L, L + R, T, R);
        /* one cache holds k; v is its first L values (llama.cpp's K-only cache for MLA) */
        r->nn->round(k, T * dq, r->cache_k);
        copy_rows(r, v, L, k, dq, T, L);
        const struct qd_nn_attn a = {.T = T, .n_head = (int)H, .n_head_kv = 1, .head_dim_k = (int)dq,
                                     .head_dim_v = (int)L, .q_stride = H * dq, .k_stride = dq, .v_stride = L,
                                     .scale = hp->attn_scale, .seq = r->seq};
        st = r->nn->attention(o, qa, k, v, &a);
        for (int64_t h = 0; st == QD_OK && h < H; h++) {
            copy_rows(r, in, L, o + h * L, H * L, T, L);
            head_linear(r, out, in, QD_W_ATTN_V_B_MLA, (int)h); /* [T][dv] */
            copy_rows(r, attn + h * dv, H * dv, out, dv, T, dv);
        }
    }
    if (st != QD_OK)
        goto no_memory;
    qd_graph_linear(r, s->proj, attn, QD_W_ATTN_OUT, QD_W_COUNT);
    return QD_OK;
no_memory:
    snprintf(r->err, r->errlen, "block %d: no memory for the attention's scratch", r->layer);
    return st;
}

/* floats latent_attention's arena takes for T tokens */
static int64_t arena_floats(const struct qd_model_hparams *hp, int64_t T)
{
    const int64_t H = hp->n_head, R = hp->rope.n_rot, L = hp->n_lora_kv;
    const int64_t dk = hp->head_dim_k_mla, dv = hp->head_dim_v_mla, nope = dk - R;
    const int64_t fixed = H * dk + (L + R) + L + H * dv;
    const int64_t mha = H * (nope + dv) + H * dk + H * dv;
    const int64_t mla = H * (L + R) + (L + R) + L + H * L + (nope > L ? nope : L) + (L > dv ? L : dv);
    int64_t rest = mha > mla ? mha : mla;
    rest = rest > hp->n_lora_q ? rest : hp->n_lora_q;
    return T * (fixed + rest);
}

enum qd_status qd_arch_deepseek2_block(struct qd_block_run *r)
{
    const int64_t T = r->T, n_embd = r->m->hp.n_embd;
    struct qd_block_scratch *s = r->s;
    const size_t arena_bytes = (size_t)arena_floats(&r->m->hp, T) * sizeof(float);
    float *arena = r->nn->alloc ? r->nn->alloc(arena_bytes) : malloc(arena_bytes);
    if (!arena) {
        snprintf(r->err, r->errlen, "block %d: no memory for the latent attention's scratch", r->layer);
        return QD_ENOMEM;
    }
    qd_graph_norm(r, s->cur, r->hidden, QD_W_ATTN_NORM, QD_W_COUNT, T, n_embd);
    enum qd_status st = latent_attention(r, arena);
    if (r->nn->free)
        r->nn->free(arena);
    else
        free(arena);
    if (st != QD_OK)
        return st;
    r->nn->add(r->hidden, s->proj, T * n_embd); /* ffn_inp = attn_out + inpSA */

    qd_graph_ffn_residual(r);
    return QD_OK;
}
