/* The builders a block's graph composes (graph.h), each the counterpart of one of llama.cpp's
 * llm_graph_context builders (src/llama-graph.cpp), over the backend's op table. */
#include <stdio.h>

#include "model/graph.h"

_Static_assert(sizeof(int32_t) == sizeof(float), "the expert ids share the float scratch");

/* The FFN scratch's width: the dense FFN's, an expert's or the shared expert's, the widest. */
static int64_t ffn_width(const struct qd_model_hparams *hp)
{
    int64_t n = hp->n_ff;
    if (hp->n_expert) {
        n = hp->n_ff_exp > n ? hp->n_ff_exp : n;
        n = hp->n_ff_shexp > n ? hp->n_ff_shexp : n;
    }
    return n;
}

/* floats of the mixture of experts' scratch (int32 ids and rows take a float's room each) */
static int64_t moe_floats(const struct qd_model_hparams *hp, int64_t T)
{
    const int64_t k = hp->n_expert_used;
    return hp->n_expert ? T * (hp->n_expert + 3 * k + 2 * hp->n_embd + k * hp->n_embd) : 0;
}

int64_t qd_block_scratch_floats(const struct qd_model_hparams *hp, int64_t T)
{
    const int64_t q = (int64_t)hp->n_head * hp->head_dim_k, k = (int64_t)hp->n_head_kv * hp->head_dim_k;
    const int64_t v = (int64_t)hp->n_head_kv * hp->head_dim_v, attn = (int64_t)hp->n_head * hp->head_dim_v;
    return T * (2 * hp->n_embd + q + k + v + attn + 2 * ffn_width(hp)) + moe_floats(hp, T);
}

void qd_block_scratch_init(struct qd_block_scratch *s, float *buf, const struct qd_model_hparams *hp, int64_t T)
{
    const int64_t q = (int64_t)hp->n_head * hp->head_dim_k, k = (int64_t)hp->n_head_kv * hp->head_dim_k;
    const int64_t v = (int64_t)hp->n_head_kv * hp->head_dim_v, attn = (int64_t)hp->n_head * hp->head_dim_v;
    s->cur = buf;
    s->q = s->cur + T * hp->n_embd;
    s->k = s->q + T * q;
    s->v = s->k + T * k;
    s->attn = s->v + T * v;
    s->proj = s->attn + T * attn;
    s->gate = s->proj + T * hp->n_embd;
    s->up = s->gate + T * ffn_width(hp);
    float *next = s->up + T * ffn_width(hp);
    if (!hp->n_expert) {
        s->router = s->expert_w = s->expert_x = s->expert_y = s->expert_out = NULL;
        s->expert_ids = s->expert_rows = NULL;
        return;
    }
    const int64_t used = hp->n_expert_used;
    s->router = next;
    s->expert_w = s->router + T * hp->n_expert;
    s->expert_ids = (int32_t *)(s->expert_w + T * used); /* int32 and float are both 4 bytes */
    s->expert_rows = s->expert_ids + T * used;
    s->expert_x = (float *)(s->expert_rows + T * used);
    s->expert_y = s->expert_x + T * hp->n_embd;
    s->expert_out = s->expert_y + T * hp->n_embd;
}

static const struct qd_model_tensor *weight(const struct qd_block_run *r, enum qd_model_weight w)
{
    return w < QD_W_COUNT && r->b->w[w].data ? &r->b->w[w] : NULL;
}

void qd_graph_norm(struct qd_block_run *r, float *out, const float *x, enum qd_model_weight role,
                   enum qd_model_weight bias, int64_t rows, int64_t n)
{
    const struct qd_model_tensor *w = weight(r, role), *b = weight(r, bias);
    const struct qd_model_hparams *hp = &r->m->hp;
    if (r->m->arch->norm == QD_NORM_LAYER)
        r->nn->layer_norm(out, x, w ? w->data : NULL, b ? b->data : NULL, rows, n, hp->norm_eps);
    else {
        r->nn->rms_norm(out, x, w ? w->data : NULL, rows, n, hp->norm_eps);
        if (b)
            r->nn->add_row(out, b->data, rows, n);
    }
}

void qd_graph_linear(struct qd_block_run *r, float *out, const float *x, enum qd_model_weight role,
                     enum qd_model_weight bias)
{
    const struct qd_model_tensor *w = weight(r, role), *b = weight(r, bias);
    if (r->on_matmul_input) {
        qd_graph_sync(r);
        r->on_matmul_input(r->hook_ctx, r->layer, w->name, x, r->T, w->cols);
    }
    r->nn->matmul(out, x, w->data, r->T, w->cols, w->rows);
    if (b)
        r->nn->add_row(out, b->data, r->T, w->rows);
}

/* build_qkv: q, k and v of r->s->cur, from one fused matrix (phi3's attn_qkv: its rows q, then
 * k, then v; one matmul in ggml, here three over its row ranges, which gives the same sums) or
 * three. */
static void graph_qkv(struct qd_block_run *r)
{
    const struct qd_model_tensor *qkv = weight(r, QD_W_ATTN_QKV);
    struct qd_block_scratch *s = r->s;
    if (!qkv) {
        qd_graph_linear(r, s->q, s->cur, QD_W_ATTN_Q, QD_W_ATTN_Q_B);
        qd_graph_linear(r, s->k, s->cur, QD_W_ATTN_K, QD_W_ATTN_K_B);
        qd_graph_linear(r, s->v, s->cur, QD_W_ATTN_V, QD_W_ATTN_V_B);
        return;
    }
    const struct qd_model_hparams *hp = &r->m->hp;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim_k, k = (int64_t)hp->n_head_kv * hp->head_dim_k;
    const int64_t v = (int64_t)hp->n_head_kv * hp->head_dim_v;
    if (r->on_matmul_input) {
        qd_graph_sync(r);
        r->on_matmul_input(r->hook_ctx, r->layer, qkv->name, s->cur, r->T, qkv->cols);
    }
    r->nn->matmul(s->q, s->cur, qkv->data, r->T, qkv->cols, q);
    r->nn->matmul(s->k, s->cur, qkv->data + q * qkv->cols, r->T, qkv->cols, k);
    r->nn->matmul(s->v, s->cur, qkv->data + (q + k) * qkv->cols, r->T, qkv->cols, v);
    /* separate q/k/v biases beside a fused matrix (create_tensor_qkv allows them) */
    const enum qd_model_weight bias[3] = {QD_W_ATTN_Q_B, QD_W_ATTN_K_B, QD_W_ATTN_V_B};
    float *out[3] = {s->q, s->k, s->v};
    const int64_t width[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        if (weight(r, bias[i]))
            r->nn->add_row(out[i], weight(r, bias[i])->data, r->T, width[i]);
}

enum qd_status qd_graph_attention(struct qd_block_run *r)
{
    const struct qd_model_hparams *hp = &r->m->hp;
    struct qd_block_scratch *s = r->s;
    const int64_t q_width = (int64_t)hp->n_head * hp->head_dim_k, k_width = (int64_t)hp->n_head_kv * hp->head_dim_k;
    const int64_t v_width = (int64_t)hp->n_head_kv * hp->head_dim_v;
    const int swa = hp->n_swa > 0 && hp->swa[r->layer];
    const struct qd_nn_rope *rope = swa ? &hp->rope_swa : &hp->rope;
    graph_qkv(r);
    /* Qwen3's and Gemma 3's per-head norms come before rope */
    if (weight(r, QD_W_ATTN_Q_NORM))
        qd_graph_norm(r, s->q, s->q, QD_W_ATTN_Q_NORM, QD_W_COUNT, r->T * hp->n_head, hp->head_dim_k);
    if (weight(r, QD_W_ATTN_K_NORM))
        qd_graph_norm(r, s->k, s->k, QD_W_ATTN_K_NORM, QD_W_COUNT, r->T * hp->n_head_kv, hp->head_dim_k);
    enum qd_status st = r->nn->rope(s->q, r->T, q_width, hp->n_head, hp->head_dim_k, r->pos, rope);
    if (st == QD_OK)
        st = r->nn->rope(s->k, r->T, k_width, hp->n_head_kv, hp->head_dim_k, r->pos, rope);
    /* gemma and phi3 scale q (ggml_scale after rope) and give build_attn a scale of 1 */
    if (r->m->arch->q_prescale)
        r->nn->scale(s->q, r->T * q_width, hp->attn_scale);
    r->nn->round(s->k, r->T * k_width, r->cache_k);
    r->nn->round(s->v, r->T * v_width, r->cache_v);
    const struct qd_nn_attn a = {.T = r->T, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
                                 .head_dim_k = hp->head_dim_k, .head_dim_v = hp->head_dim_v, .q_stride = q_width,
                                 .k_stride = k_width, .v_stride = v_width,
                                 .scale = r->m->arch->q_prescale ? 1.0f : hp->attn_scale,
                                 .softcap = hp->attn_softcap, .window = swa ? hp->n_swa : 0, .seq = r->seq};
    if (st == QD_OK)
        st = r->nn->attention(s->attn, s->q, s->k, s->v, &a);
    if (st != QD_OK) {
        snprintf(r->err, r->errlen, "block %d: no memory for the attention's scratch", r->layer);
        return st;
    }
    qd_graph_linear(r, s->proj, s->attn, QD_W_ATTN_OUT, QD_W_ATTN_OUT_B);
    return QD_OK;
}

void qd_graph_ffn(struct qd_block_run *r)
{
    struct qd_block_scratch *s = r->s;
    const int64_t n_ff = r->m->hp.n_ff;
    const struct qd_model_tensor *up = weight(r, QD_W_FFN_UP);
    if (r->m->arch->ffn_up_fused) {
        /* phi3 (LLM_FFN_SWIGLU, LLM_FFN_SEQ): one matmul to [2 n_ff], ggml_swiglu of its halves,
         * the first the gate */
        if (r->on_matmul_input) {
            qd_graph_sync(r);
            r->on_matmul_input(r->hook_ctx, r->layer, up->name, s->cur, r->T, up->cols);
        }
        r->nn->matmul(s->gate, s->cur, up->data, r->T, up->cols, n_ff);
        r->nn->matmul(s->up, s->cur, up->data + n_ff * up->cols, r->T, up->cols, n_ff);
    } else {
        qd_graph_linear(r, s->up, s->cur, QD_W_FFN_UP, QD_W_FFN_UP_B);
        qd_graph_linear(r, s->gate, s->cur, QD_W_FFN_GATE, QD_W_FFN_GATE_B);
    }
    r->nn->glu(s->gate, s->gate, s->up, r->T * n_ff, r->m->arch->act);
    qd_graph_linear(r, s->proj, s->gate, QD_W_FFN_DOWN, QD_W_FFN_DOWN_B);
}

void qd_graph_ffn_residual(struct qd_block_run *r)
{
    const int64_t T = r->T, n_embd = r->m->hp.n_embd;
    struct qd_block_scratch *s = r->s;
    qd_graph_norm(r, s->cur, r->hidden, QD_W_FFN_NORM, QD_W_COUNT, T, n_embd);
    if (r->b->w[QD_W_FFN_GATE_INP].data)
        qd_graph_moe(r);
    else
        qd_graph_ffn(r);
    r->nn->add(r->hidden, s->proj, T * n_embd); /* l_out = ffn_out + ffn_inp */
}
