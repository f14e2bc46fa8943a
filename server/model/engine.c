/* The layer-major driver (engine.h). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../kernels/cpu/cpu.h"
#include "model/engine.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static float *alloc_floats(int64_t n, const char *what, char *err, size_t errlen)
{
    float *p = n > 0 && (uint64_t)n <= SIZE_MAX / sizeof(float) ? malloc((size_t)n * sizeof(float)) : NULL;
    if (!p)
        snprintf(err, errlen, "no memory for %s (%.1f MiB)", what, (double)n * sizeof(float) / 1048576.0);
    return p;
}

/* The first non-finite value of x [n], or -1. */
static int64_t first_nonfinite(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return -1;
}

static int stopped(const struct qd_engine_hooks *h) { return h && h->cancel && *h->cancel; }

/* The output norm and projection, chunk by chunk, each chunk's logits to the callback. */
static enum qd_status run_head(struct qd_model *m, float *hidden, int n_chunks, const struct qd_engine_opts *o,
                               const struct qd_engine_hooks *h, const struct qd_nn_backend *nn,
                               struct qd_engine_stats *stats, char *err, size_t errlen)
{
    const struct qd_model_hparams *hp = &m->hp;
    const int rows = o->n_ctx - o->logits_from;
    const int64_t n_vocab = hp->n_vocab, n_embd = hp->n_embd;
    enum qd_status st = QD_ENOMEM;
    float *norm = alloc_floats(n_embd, "the output norm", err, errlen);
    float *bias = m->output_b ? alloc_floats(n_vocab, "the output bias", err, errlen) : NULL;
    float *out = alloc_floats(n_vocab * n_embd, "the output projection in f32", err, errlen);
    float *cur = alloc_floats((int64_t)rows * n_embd, "the output norm's activations", err, errlen);
    float *logits = alloc_floats((int64_t)rows * n_vocab, "one chunk's logits", err, errlen);
    if (!norm || !out || !cur || !logits || (m->output_b && !bias))
        goto done;
    stats->head_bytes = (size_t)(n_embd + (m->output_b ? n_vocab : 0) + n_vocab * n_embd + (int64_t)rows * n_embd +
                                 (int64_t)rows * n_vocab) * sizeof(float);
    double t0 = now_s();
    if ((st = qd_model_tensor_f32(m, m->output_norm, norm, err, errlen)) != QD_OK ||
        (st = qd_model_tensor_f32(m, m->output, out, err, errlen)) != QD_OK ||
        (bias && (st = qd_model_tensor_f32(m, m->output_b, bias, err, errlen)) != QD_OK))
        goto done;
    qd_model_release(m, m->output);
    stats->read_seconds += now_s() - t0;
    for (int c = 0; c < n_chunks; c++) {
        if (stopped(h)) {
            snprintf(err, errlen, "cancelled");
            st = QD_ECANCELED;
            goto done;
        }
        const float *x = hidden + ((int64_t)c * o->n_ctx + o->logits_from) * n_embd;
        if (m->arch->norm == QD_NORM_LAYER)
            nn->layer_norm(cur, x, norm, NULL, rows, n_embd, hp->norm_eps);
        else
            nn->rms_norm(cur, x, norm, rows, n_embd, hp->norm_eps);
        if (h && h->on_matmul_input)
            h->on_matmul_input(h->ctx, (int)hp->n_layer, m->output->name, cur, rows, n_embd);
        nn->matmul(logits, cur, out, rows, n_embd, n_vocab);
        if (bias)
            nn->add_row(logits, bias, rows, n_vocab);
        if (hp->final_softcap > 0.0f)
            nn->softcap(logits, (int64_t)rows * n_vocab, hp->final_softcap);
        int64_t bad = first_nonfinite(logits, (int64_t)rows * n_vocab);
        if (bad >= 0) {
            snprintf(err, errlen, "the output head gave NaN/Inf in chunk %d at position %" PRId64
                     " (the weights or the hidden states overflow f32)", c + 1, o->logits_from + bad / n_vocab);
            st = QD_ENONFINITE;
            goto done;
        }
        if (h && h->on_logits && h->on_logits(h->ctx, c, o->logits_from, rows, logits, n_vocab)) {
            snprintf(err, errlen, "stopped by the logits consumer");
            st = QD_ECANCELED;
            goto done;
        }
    }
    st = QD_OK;
done:
    free(norm), free(bias), free(out), free(cur), free(logits);
    return st;
}

enum qd_status qd_engine_run(struct qd_model *m, const int32_t *tokens, int n_chunks, const struct qd_engine_opts *o,
                             const struct qd_engine_hooks *h, struct qd_engine_stats *stats, char *err, size_t errlen)
{
    const struct qd_model_hparams *hp = &m->hp;
    const struct qd_nn_backend *nn = o->nn ? o->nn : &qd_nn_cpu;
    const double t_start = now_s();
    memset(stats, 0, sizeof *stats);
    if (o->n_ctx < 1 || n_chunks < 1 || o->logits_from < 0 || o->logits_from >= o->n_ctx) {
        snprintf(err, errlen, "a run needs at least one chunk of at least one token, logits from inside it");
        return QD_EINVAL;
    }
    if (o->threads > 0) {
        qd_cpu_set_threads(o->threads);
        qd_nn_set_threads(o->threads);
    }
    /* LongRoPE (llama_model::get_rope_factors): the long factors once a sequence outgrows the
     * original context, the short ones within it */
    if (m->rope_short || m->rope_long) {
        const float *f = o->n_ctx > hp->rope.n_ctx_orig && m->rope_long ? m->rope_long : m->rope_short;
        m->hp.rope.freq_factors = m->hp.rope_swa.freq_factors = f;
    }
    const int64_t T = o->n_ctx, n_embd = hp->n_embd, all = (int64_t)n_chunks * T;
    enum qd_status st = QD_ENOMEM;
    struct qd_model_block block = {0};
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    float *hidden = alloc_floats(all * n_embd, "the chunks' hidden states", err, errlen);
    const int64_t scratch_floats = qd_block_scratch_floats(hp, T);
    float *scratch = hidden ? alloc_floats(scratch_floats, "one chunk's activations", err, errlen) : NULL;
    if (!pos || !hidden || !scratch) {
        if (!pos)
            snprintf(err, errlen, "no memory");
        goto done;
    }
    stats->hidden_bytes = (size_t)(all * n_embd) * sizeof(float);
    stats->scratch_bytes = (size_t)scratch_floats * sizeof(float);
    stats->block_bytes = qd_model_block_bytes(m);
    for (int64_t t = 0; t < T; t++)
        pos[t] = (int32_t)t;

    double t0 = now_s();
    if ((st = qd_model_rows(m, m->token_embd, tokens, all, hidden, err, errlen)) != QD_OK)
        goto done;
    if (hp->embd_scale != 1.0f) /* gemma: ggml_scale(inpL, sqrtf(n_embd)) */
        nn->scale(hidden, all * n_embd, hp->embd_scale);
    qd_model_release(m, m->token_embd);
    stats->read_seconds += now_s() - t0;

    struct qd_block_scratch s;
    qd_block_scratch_init(&s, scratch, hp, T);
    for (int layer = 0; layer < hp->n_layer; layer++) {
        t0 = now_s();
        if ((st = qd_model_block_load(m, layer, &block, err, errlen)) != QD_OK)
            goto done;
        stats->read_seconds += now_s() - t0;
        for (int c = 0; c < n_chunks; c++) {
            if (stopped(h)) {
                snprintf(err, errlen, "cancelled");
                st = QD_ECANCELED;
                goto done;
            }
            struct qd_block_run r = {.m = m, .b = &block, .nn = nn, .layer = layer,
                                     .hidden = hidden + (int64_t)c * T * n_embd, .T = T, .pos = pos, .s = &s,
                                     .on_matmul_input = h ? h->on_matmul_input : NULL,
                                     .on_matmul_expert_input = h ? h->on_matmul_expert_input : NULL,
                                     .on_matmul_head_input = h ? h->on_matmul_head_input : NULL,
                                     .hook_ctx = h ? h->ctx : NULL,
                                     .cache_k = o->cache_k, .cache_v = o->cache_v, .err = err,
                                     .errlen = errlen};
            if ((st = m->arch->block(&r)) != QD_OK)
                goto done;
            int64_t bad = first_nonfinite(r.hidden, T * n_embd);
            if (bad >= 0) {
                snprintf(err, errlen, "block %d gave NaN/Inf in chunk %d at position %" PRId64 " (value %" PRId64
                         " of the hidden state): the weights or the activations overflow f32", layer, c + 1,
                         bad / n_embd, bad % n_embd);
                st = QD_ENONFINITE;
                goto done;
            }
        }
        if (h && h->on_progress)
            h->on_progress(h->ctx, layer + 1, (int)hp->n_layer + 1);
    }
    /* the blocks' memory goes before the head's comes */
    qd_model_block_free(&block);
    free(scratch);
    scratch = NULL;
    st = run_head(m, hidden, n_chunks, o, h, nn, stats, err, errlen);
    if (st == QD_OK && h && h->on_progress)
        h->on_progress(h->ctx, (int)hp->n_layer + 1, (int)hp->n_layer + 1);
done:
    {
        const size_t blocks = stats->block_bytes + stats->scratch_bytes;
        stats->peak_bytes = stats->hidden_bytes + (blocks > stats->head_bytes ? blocks : stats->head_bytes);
    }
    qd_model_block_free(&block);
    free(scratch);
    free(hidden);
    free(pos);
    stats->seconds = now_s() - t_start;
    return st;
}
