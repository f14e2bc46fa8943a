/* Mixtures of experts: how the architectures hold them (the rows model_arch.c points at) and
 * the FFN they run in place of the dense one, llama.cpp's build_moe_ffn (src/llama-graph.cpp)
 * as src/models/llama.cpp (Mixtral), qwen2moe.cpp and qwen3moe.cpp call it:
 *
 *     p       = softmax(gate_inp . x)                  over the n_expert experts
 *     chosen  = the n_expert_used largest of p         most probable first
 *     w       = p[chosen]   (/ their sum: norm_w)
 *     y       = sum over slots j of down_j(silu(gate_j . x) * (up_j . x)) * w_j   in slot order
 *     qwen2moe: y += sigmoid(gate_inp_shexp . x) * down_s(silu(gate_s . x) * (up_s . x))
 *
 * The experts run one at a time on the rows routed to them (MUL_MAT_ID's grouping); each
 * token's outputs are kept by slot so that the sum runs in llama.cpp's order. */
#include "model/graph.h"

#define B QD_W_BIT
#define EXPERTS (B(QD_W_FFN_GATE_INP) | B(QD_W_FFN_GATE_EXPS) | B(QD_W_FFN_UP_EXPS) | B(QD_W_FFN_DOWN_EXPS))

/* Mixtral (GGUF "llama" with expert_count > 0): ffn_gate_exps is optional (without it the
 * experts run silu(up . x)), weights renormalised */
const struct qd_model_moe qd_moe_mixtral = {
    .required = B(QD_W_FFN_GATE_INP) | B(QD_W_FFN_UP_EXPS) | B(QD_W_FFN_DOWN_EXPS),
    .optional = B(QD_W_FFN_GATE_EXPS), .norm_w = 1};
/* qwen2moe: a shared expert with its sigmoid gate beside the routed ones, no renormalisation */
const struct qd_model_moe qd_moe_qwen2moe = {
    .required = EXPERTS | B(QD_W_FFN_GATE_INP_SHEXP) | B(QD_W_FFN_GATE_SHEXP) | B(QD_W_FFN_UP_SHEXP) |
                B(QD_W_FFN_DOWN_SHEXP),
    .norm_w = 0, .experts_required = 1};
/* qwen3moe: routed experts only, renormalised */
const struct qd_model_moe qd_moe_qwen3moe = {.required = EXPERTS, .norm_w = 1, .experts_required = 1};
/* deepseek2: shared experts without a gate, the choice bias (DeepSeek V3), the renormalisation,
 * scale and gating function from the file's keys */
const struct qd_model_moe qd_moe_deepseek2 = {
    .required = EXPERTS | B(QD_W_FFN_GATE_SHEXP) | B(QD_W_FFN_UP_SHEXP) | B(QD_W_FFN_DOWN_SHEXP),
    .optional = B(QD_W_FFN_EXP_PROBS_B), .experts_required = 1};
#undef B

/* out [n][rows] = x [n][cols] . (expert e of weight role)^T, the hooks told first. */
static void expert_linear(struct qd_block_run *r, float *out, const float *x, int64_t n, enum qd_model_weight role,
                          int expert)
{
    const struct qd_model_tensor *w = &r->b->w[role];
    if (r->on_matmul_expert_input || r->on_matmul_input)
        qd_graph_sync(r);
    if (r->on_matmul_expert_input)
        r->on_matmul_expert_input(r->hook_ctx, r->layer, w->name, expert, (int)w->experts, x, n, w->cols);
    else if (r->on_matmul_input)
        r->on_matmul_input(r->hook_ctx, r->layer, w->name, x, n, w->cols);
    r->nn->matmul(out, x, w->data + (int64_t)expert * w->rows * w->cols, n, w->cols, w->rows);
}

/* Expert e on its n rows (token x n_used + slot, from the routing): their activations
 * gathered, the expert's FFN, each output moved to its token's slot; on the backend's memory. */
static void run_expert(struct qd_block_run *r, int e, const int32_t *rows, int64_t n)
{
    const struct qd_model_hparams *hp = &r->m->hp;
    struct qd_block_scratch *s = r->s;
    const int64_t n_embd = hp->n_embd, n_ff = r->b->w[QD_W_FFN_UP_EXPS].rows;
    r->nn->gather_rows(s->expert_x, s->cur, rows, n, n_embd, hp->n_expert_used);
    expert_linear(r, s->up, s->expert_x, n, QD_W_FFN_UP_EXPS, e);
    if (r->b->w[QD_W_FFN_GATE_EXPS].data) {
        expert_linear(r, s->gate, s->expert_x, n, QD_W_FFN_GATE_EXPS, e);
        r->nn->glu(s->gate, s->gate, s->up, n * n_ff, r->m->arch->act);
    } else { /* no gate: act(up), as act(up) * 1.0 (exact) */
        qd_graph_sync(r);
        for (int64_t i = 0; i < n * n_ff; i++)
            s->gate[i] = s->up[i];
        for (int64_t i = 0; i < n * n_ff; i++)
            s->up[i] = 1.0f;
        r->nn->glu(s->gate, s->gate, s->up, n * n_ff, r->m->arch->act);
    }
    expert_linear(r, s->expert_y, s->gate, n, QD_W_FFN_DOWN_EXPS, e);
    r->nn->scatter_rows(s->expert_out, s->expert_y, rows, n, n_embd);
}

/* The shared expert (qwen2moe: gated by sigmoid(gate_inp_shexp . x)), added to r->s->proj */
static void shared_expert(struct qd_block_run *r)
{
    struct qd_block_scratch *s = r->s;
    const int64_t n_embd = r->m->hp.n_embd, n_ff = r->b->w[QD_W_FFN_UP_SHEXP].rows;
    const int gated = r->b->w[QD_W_FFN_GATE_INP_SHEXP].data != NULL;
    if (gated)
        qd_graph_linear(r, s->router, s->cur, QD_W_FFN_GATE_INP_SHEXP, QD_W_COUNT); /* [T][1] */
    qd_graph_linear(r, s->up, s->cur, QD_W_FFN_UP_SHEXP, QD_W_COUNT);
    qd_graph_linear(r, s->gate, s->cur, QD_W_FFN_GATE_SHEXP, QD_W_COUNT);
    r->nn->glu(s->gate, s->gate, s->up, r->T * n_ff, r->m->arch->act);
    qd_graph_linear(r, s->expert_x, s->gate, QD_W_FFN_DOWN_SHEXP, QD_W_COUNT);
    if (gated)
        r->nn->sigmoid_gate(s->expert_x, s->router, r->T, n_embd);
    r->nn->add(s->proj, s->expert_x, r->T * n_embd); /* moe_out + ffn_shexp_out */
}

void qd_graph_moe(struct qd_block_run *r)
{
    const struct qd_model_hparams *hp = &r->m->hp;
    struct qd_block_scratch *s = r->s;
    qd_graph_linear(r, s->router, s->cur, QD_W_FFN_GATE_INP, QD_W_COUNT);
    struct qd_nn_moe_gating gating = hp->gating;
    if (r->b->w[QD_W_FFN_EXP_PROBS_B].data)
        gating.bias = r->b->w[QD_W_FFN_EXP_PROBS_B].data;
    r->nn->moe_route(s->expert_ids, s->expert_w, s->router, r->T, hp->n_expert, hp->n_expert_used, &gating);
    /* every expert's rows listed first (the host reads the ids once), each expert's in a range
     * of its own: the experts then run one after another with no wait between them */
    int64_t start[QD_NN_MAX_EXPERTS + 1], n = 0;
    const int64_t slots = r->T * hp->n_expert_used;
    qd_graph_sync(r);
    for (int e = 0; e < hp->n_expert; e++) {
        start[e] = n;
        for (int64_t i = 0; i < slots; i++)
            if (s->expert_ids[i] == e)
                s->expert_rows[n++] = (int32_t)i;
    }
    start[hp->n_expert] = n;
    for (int e = 0; e < hp->n_expert; e++)
        if (start[e + 1] > start[e])
            run_expert(r, e, s->expert_rows + start[e], start[e + 1] - start[e]);
    r->nn->moe_sum(s->proj, s->expert_out, s->expert_w, r->T, hp->n_expert_used, hp->n_embd);
    if (r->b->w[QD_W_FFN_UP_SHEXP].data)
        shared_expert(r);
}
