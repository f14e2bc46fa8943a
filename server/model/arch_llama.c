/* The Llama block (llama.cpp src/models/llama.cpp, and qwen2.cpp / qwen3.cpp, which differ from
 * it only in what the table row gives: biases on q/k/v, per-head q/k norms, the rope kind):
 *
 *     h = h + wo . attn(rope(wq . norm(h)), rope(wk . norm(h)), wv . norm(h))
 *     h = h + down(silu(gate . norm(h)) * (up . norm(h)))
 *
 * with a mixture of experts in place of the FFN where the block has a router (Mixtral's
 * "llama" files, qwen2moe, qwen3moe: arch_moe.c).
 */
#include "model/graph.h"

enum qd_status qd_arch_llama_block(struct qd_block_run *r)
{
    const int64_t T = r->T, n_embd = r->m->hp.n_embd;
    struct qd_block_scratch *s = r->s;

    qd_graph_norm(r, s->cur, r->hidden, QD_W_ATTN_NORM, QD_W_COUNT, T, n_embd);
    enum qd_status st = qd_graph_attention(r);
    if (st != QD_OK)
        return st;
    r->nn->add(r->hidden, s->proj, T * n_embd); /* ffn_inp = attn_out + inpSA */

    qd_graph_ffn_residual(r);
    return QD_OK;
}
