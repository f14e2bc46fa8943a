/* The layer-major driver (engine.h). */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
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
    /* 64-byte aligned, as the block's weights (model_load.c) */
    float *p = n > 0 && (uint64_t)n <= SIZE_MAX / sizeof(float) - 16
                   ? aligned_alloc(64, ((size_t)n * sizeof(float) + 63) / 64 * 64)
                   : NULL;
    if (!p)
        snprintf(err, errlen, "no memory for %s (%.1f MiB)", what, (double)n * sizeof(float) / 1048576.0);
    return p;
}

/* Activations in the backend's memory (kernels/nn.h: the host's where it has none of its own). */
static float *nn_floats(const struct qd_nn_backend *nn, int64_t n, const char *what, char *err, size_t errlen)
{
    if (!nn->alloc)
        return alloc_floats(n, what, err, errlen);
    float *p = n > 0 && (uint64_t)n <= SIZE_MAX / sizeof(float) ? nn->alloc((size_t)n * sizeof(float)) : NULL;
    if (!p)
        snprintf(err, errlen, "no %s memory for %s (%.1f MiB)", nn->name, what, (double)n * sizeof(float) / 1048576.0);
    return p;
}

static void nn_release(const struct qd_nn_backend *nn, void *p)
{
    if (nn->free)
        nn->free(p);
    else
        free(p);
}

static void nn_sync(const struct qd_nn_backend *nn)
{
    if (nn->sync)
        nn->sync();
}

static enum qd_status nn_bind_from(const struct qd_nn_backend *nn, const float *host, int64_t n,
                                   enum qd_nn_weight_kind kind, const void *src, enum qd_dtype dtype, const char *what,
                                   char *err, size_t errlen)
{
    enum qd_status st = nn->bind && host ? nn->bind(host, n, kind, src, dtype) : QD_OK;
    if (st != QD_OK)
        snprintf(err, errlen, "%s: no %s memory for %s (%.1f MiB)", st == QD_ENOMEM ? "out of memory" : "device error",
                 nn->name, what, (double)n * (kind == QD_NN_MATRIX ? 2 : 4) / 1048576.0);
    return st;
}

static enum qd_status nn_bind(const struct qd_nn_backend *nn, const float *host, int64_t n, enum qd_nn_weight_kind kind,
                              const char *what, char *err, size_t errlen)
{
    return nn_bind_from(nn, host, n, kind, host, QD_F32, what, err, errlen);
}

static void nn_unbind(const struct qd_nn_backend *nn, const float *host)
{
    if (nn->unbind && host)
        nn->unbind(host);
}

/* The block's weights handed to the backend (the matrices the matmuls read, the norms and
 * biases the other ops do), or taken back. */
#define V QD_W_BIT
static const uint64_t vector_roles =
    V(QD_W_ATTN_NORM) | V(QD_W_ATTN_Q_NORM) | V(QD_W_ATTN_K_NORM) | V(QD_W_FFN_NORM) | V(QD_W_ATTN_QA_NORM) |
    V(QD_W_ATTN_KV_A_NORM) | V(QD_W_ATTN_POST_NORM) | V(QD_W_FFN_POST_NORM) | V(QD_W_ATTN_Q_B) | V(QD_W_ATTN_K_B) |
    V(QD_W_ATTN_V_B) | V(QD_W_ATTN_OUT_B) | V(QD_W_FFN_GATE_B) | V(QD_W_FFN_UP_B) | V(QD_W_FFN_DOWN_B) |
    V(QD_W_FFN_EXP_PROBS_B);
#undef V

static enum qd_status bind_block(const struct qd_nn_backend *nn, const struct qd_model_block *b, char *err,
                                 size_t errlen)
{
    for (int i = 0; i < QD_W_COUNT; i++) {
        const struct qd_model_tensor *w = &b->w[i];
        const void *src = b->raw[i] ? b->raw[i] : w->data;
        enum qd_status st = w->data ? nn_bind_from(nn, w->data, w->rows * w->cols * w->experts,
                                                   vector_roles & QD_W_BIT(i) ? QD_NN_VECTOR : QD_NN_MATRIX, src,
                                                   b->raw[i] ? b->raw_type[i] : QD_F32, w->name, err, errlen)
                                    : QD_OK;
        if (st != QD_OK)
            return st;
    }
    return QD_OK;
}

/* (the file's pages of the weights taken as stored go then: the CPU reads them until here) */
static void unbind_block(const struct qd_model *m, const struct qd_nn_backend *nn, struct qd_model_block *b)
{
    for (int i = 0; i < QD_W_COUNT; i++) {
        nn_unbind(nn, b->w[i].data);
        if (b->raw_tensor[i])
            qd_model_release(m, b->raw_tensor[i]);
        b->raw_tensor[i] = NULL, b->raw[i] = NULL;
    }
}

static int stopped(const struct qd_engine_hooks *h) { return h && h->cancel && *h->cancel; }

/* The output norm and projection, chunk by chunk, each chunk's logits to the callback. */
static enum qd_status run_head(struct qd_model *m, float *hidden, int hidden_host, int n_chunks, const struct qd_engine_opts *o,
                               const struct qd_engine_hooks *h, const struct qd_nn_backend *nn,
                               struct qd_engine_stats *stats, char *err, size_t errlen)
{
    const struct qd_model_hparams *hp = &m->hp;
    const int rows = o->n_ctx - o->logits_from;
    const int64_t n_vocab = hp->n_vocab, n_embd = hp->n_embd;
    enum qd_status st = QD_ENOMEM;
    const int gt = m->output->type;
    const int as_stored = nn->bind && (gt == QD_GGML_F32 || gt == QD_GGML_F16 || gt == QD_GGML_BF16);
    float *norm = alloc_floats(n_embd, "the output norm", err, errlen);
    float *bias = m->output_b ? alloc_floats(n_vocab, "the output bias", err, errlen) : NULL;
    float *out = alloc_floats(n_vocab * n_embd, "the output projection in f32", err, errlen);
    float *cur = NULL, *logits = NULL, *host_logits = NULL;
    if (!norm || !out || (m->output_b && !bias))
        goto done;
    stats->head_bytes = (size_t)(n_embd + (m->output_b ? n_vocab : 0) + n_vocab * n_embd + (int64_t)rows * n_embd +
                                 (int64_t)rows * n_vocab) * sizeof(float);
    double t0 = now_s();
    /* a 16-bit or f32 projection is handed over as stored, as the blocks' matrices are: `out`
     * is then an address left unwritten that stands for it (no f32 copy of the vocabulary) */
    if (as_stored)
        stats->head_bytes -= (size_t)(n_vocab * n_embd) * sizeof(float);
    if ((st = qd_model_tensor_f32(m, m->output_norm, norm, err, errlen)) != QD_OK ||
        (!as_stored && (st = qd_model_tensor_f32(m, m->output, out, err, errlen)) != QD_OK) ||
        (bias && (st = qd_model_tensor_f32(m, m->output_b, bias, err, errlen)) != QD_OK))
        goto done;
    if (!as_stored)
        qd_model_release(m, m->output);
    if ((st = nn_bind(nn, norm, n_embd, QD_NN_VECTOR, "the output norm", err, errlen)) != QD_OK ||
        (st = nn_bind_from(nn, out, n_vocab * n_embd, QD_NN_MATRIX, as_stored ? (const void *)m->output->data : (const void *)out,
                           gt == QD_GGML_F16 && as_stored ? QD_F16 : gt == QD_GGML_BF16 && as_stored ? QD_BF16 : QD_F32,
                           "the output projection", err, errlen)) != QD_OK ||
        (st = nn_bind(nn, bias, n_vocab, QD_NN_VECTOR, "the output bias", err, errlen)) != QD_OK)
        goto done;
    stats->read_seconds += now_s() - t0;
    st = QD_ENOMEM;
    if (!(cur = nn_floats(nn, (int64_t)rows * n_embd, "the output norm's activations", err, errlen)) ||
        !(logits = nn_floats(nn, (int64_t)rows * n_vocab, "one chunk's logits", err, errlen)) ||
        (nn->to_host && !(host_logits = alloc_floats((int64_t)rows * n_vocab, "one chunk's logits", err, errlen))))
        goto done;
    for (int c = 0; c < n_chunks; c++) {
        if (stopped(h)) {
            snprintf(err, errlen, "cancelled");
            st = QD_ECANCELED;
            goto done;
        }
        const float *x = hidden + ((int64_t)c * o->n_ctx + o->logits_from) * n_embd;
        if (hidden_host) { /* the hidden states stayed in host memory: this chunk's rows to the backend */
            nn_sync(nn);
            memcpy(cur, x, (size_t)rows * (size_t)n_embd * sizeof *cur);
            x = cur;
        }
        if (m->arch->norm == QD_NORM_LAYER)
            nn->layer_norm(cur, x, norm, NULL, rows, n_embd, hp->norm_eps);
        else
            nn->rms_norm(cur, x, norm, rows, n_embd, hp->norm_eps);
        if (h && h->on_matmul_input) {
            nn_sync(nn);
            h->on_matmul_input(h->ctx, (int)hp->n_layer, m->output->name, cur, rows, n_embd);
        }
        nn->matmul(logits, cur, out, rows, n_embd, n_vocab);
        if (bias)
            nn->add_row(logits, bias, rows, n_vocab);
        if (hp->final_softcap > 0.0f)
            nn->softcap(logits, (int64_t)rows * n_vocab, hp->final_softcap);
        int64_t bad = nn->first_nonfinite(logits, (int64_t)rows * n_vocab);
        if (nn->error && nn->error()) {
            snprintf(err, errlen, "the output head on %s: %s", nn->name, nn->error());
            st = QD_EDEVICE;
            goto done;
        }
        if (bad >= 0) {
            snprintf(err, errlen, "the output head gave NaN/Inf in chunk %d at position %" PRId64
                     " (the weights or the hidden states overflow f32)", c + 1, o->logits_from + bad / n_vocab);
            st = QD_ENONFINITE;
            goto done;
        }
        const float *seen = logits;
        if (host_logits) { /* one copy, not the pages' migration */
            nn->to_host(host_logits, logits, (size_t)rows * (size_t)n_vocab * sizeof *logits);
            seen = host_logits;
        } else
            nn_sync(nn);
        if (h && h->on_logits && h->on_logits(h->ctx, c, o->logits_from, rows, seen, n_vocab)) {
            snprintf(err, errlen, "stopped by the logits consumer");
            st = QD_ECANCELED;
            goto done;
        }
    }
    st = QD_OK;
done:
    nn_sync(nn);
    nn_unbind(nn, norm), nn_unbind(nn, out), nn_unbind(nn, bias);
    if (as_stored) /* (read until here) */
        qd_model_release(m, m->output);
    free(norm), free(bias), free(out), free(host_logits);
    if (cur)
        nn_release(nn, cur);
    if (logits)
        nn_release(nn, logits);
    return st;
}

/* The next block read (and handed to the backend) on a thread of its own while the chunks run
 * through this one: on a backend with memory of its own the disk, the host's conversions and
 * the copies overlap the device's work. */
struct loader {
    pthread_t thread;
    int running;
    struct qd_model *m;
    const struct qd_nn_backend *nn;
    struct qd_model_block *b;
    int layer;
    enum qd_status st;
    double seconds;
    char err[512];
};

static void *loader_main(void *arg)
{
    struct loader *l = arg;
    const double t0 = now_s();
    l->st = qd_model_block_load(l->m, l->layer, l->b, l->err, sizeof l->err);
    if (l->st == QD_OK)
        l->st = bind_block(l->nn, l->b, l->err, sizeof l->err);
    l->seconds = now_s() - t0;
    return NULL;
}

/* On its own thread when `behind` (the ops of the block before still to run), else here and now */
static void loader_start(struct loader *l, int layer, struct qd_model_block *b, int behind)
{
    l->layer = layer, l->b = b, l->st = QD_OK, l->err[0] = 0;
    l->running = behind && pthread_create(&l->thread, NULL, loader_main, l) == 0;
    if (!l->running)
        loader_main(l);
}

/* Waits for the loader; its status (and message in err). */
static enum qd_status loader_wait(struct loader *l, struct qd_engine_stats *stats, char *err, size_t errlen)
{
    const double t0 = now_s();
    if (l->running)
        pthread_join(l->thread, NULL);
    l->running = 0;
    stats->load_wait_seconds += now_s() - t0;
    stats->read_seconds += l->seconds;
    if (l->st != QD_OK)
        snprintf(err, errlen, "%s", l->err);
    return l->st;
}

/* Chunks run together through a block (fewer, larger matmuls, each weight's tiles used by more
 * rows while they are in cache; the attention still keeps to each chunk): as many as make about
 * GROUP_TOKENS tokens on a backend with memory of its own, CPU_GROUP_TOKENS on the CPU
 * (llama.cpp's default batch; measured 10 % faster than one chunk at a time on 2 cores). A
 * chunk's results do not depend on the chunks beside it. */
#define GROUP_TOKENS 8192
#define CPU_GROUP_TOKENS 2048

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
    int group = (int)((nn->alloc ? GROUP_TOKENS : CPU_GROUP_TOKENS) / T);
    group = group < 1 ? 1 : group > n_chunks ? n_chunks : group;
    enum qd_status st = QD_ENOMEM;
    struct qd_model_block blocks[2] = {{0}};
    struct qd_model_block *block = &blocks[0];
    /* a device backend reads the next block while this one runs (two blocks' weights held) */
    const int prefetch = nn->alloc != NULL;
    struct loader loader = {.m = m, .nn = nn};
    if (nn->bind) /* a backend with its own copies takes 16-bit and f32 matrices as stored */
        blocks[0].keep_raw = blocks[1].keep_raw = ~vector_roles & (QD_W_BIT(QD_W_COUNT) - 1);
    int32_t *pos = NULL;
    float *hidden = NULL, *scratch = NULL, *stage = NULL;
    int hidden_host = 0;
    const float *bound_freqs[2] = {hp->rope.freq_factors, hp->rope_swa.freq_factors};
    const int rot_half[2] = {hp->rope.n_rot / 2, hp->rope_swa.n_rot / 2};
    stats->block_bytes = qd_model_block_bytes(m);

    /* on a backend of its own: the rope factors, the largest block's weights first (so that the
     * activations take what is left), then the hidden states where they fit (the host's memory
     * otherwise, a group's rows staged through the backend's), then the largest group whose
     * scratch fits */
    for (int i = 0; i < 2; i++)
        if (bound_freqs[i] && (i == 0 || bound_freqs[1] != bound_freqs[0]) &&
            (st = nn_bind(nn, bound_freqs[i], rot_half[i], QD_NN_VECTOR, "the rope factors", err, errlen)) != QD_OK)
            goto done;
    if (nn->alloc) {
        /* a reservation the size of the largest block in the backend's form (matrices in bf16) */
        const size_t weights = stats->block_bytes / 2 * (prefetch ? 2 : 1) + ((size_t)1 << 20);
        void *reserve = nn->alloc(weights);
        if (!reserve) {
            snprintf(err, errlen, "this model's blocks need %.0f MiB of %s memory for their weights (bf16, the one "
                     "running and the next) and more for one chunk's activations; allow more device memory "
                     "(--max-device-bytes) or use --backend cpu", (double)weights / 1048576.0, nn->name);
            st = QD_ENOMEM;
            goto done;
        }
        char ignored[8];
        if (!(hidden = nn_floats(nn, all * n_embd, "the chunks' hidden states", ignored, sizeof ignored)))
            hidden_host = 1;
        for (; group >= 1; group /= 2) {
            const int64_t floats = qd_block_scratch_floats(hp, group * T) + (hidden_host ? group * T * n_embd : 0);
            if ((scratch = nn_floats(nn, floats, "one group of chunks' activations", err, errlen)))
                break;
        }
        nn->free(reserve);
        if (!scratch) {
            snprintf(err, errlen, "the blocks' weights (%.0f MiB in bf16) and one chunk's activations do not fit the "
                     "%s memory allowed; allow more (--max-device-bytes) or use --backend cpu",
                     (double)weights / 1048576.0, nn->name);
            st = QD_ENOMEM;
            goto done;
        }
        if (hidden_host)
            stage = scratch + qd_block_scratch_floats(hp, group * T);
    }
    if (!hidden && !(hidden = alloc_floats(all * n_embd, "the chunks' hidden states", err, errlen)))
        goto done;
    if (!scratch && !(scratch = alloc_floats(qd_block_scratch_floats(hp, group * T), "one chunk's activations", err,
                                             errlen)))
        goto done;
    if (!(pos = malloc((size_t)(group * T) * sizeof *pos))) {
        snprintf(err, errlen, "no memory");
        goto done;
    }
    stats->hidden_bytes = (size_t)(all * n_embd) * sizeof(float);
    stats->scratch_bytes = (size_t)qd_block_scratch_floats(hp, group * T) * sizeof(float);
    stats->chunks_together = group;
    for (int64_t t = 0; t < group * T; t++)
        pos[t] = (int32_t)(t % T);
    if ((st = nn_bind(nn, (const float *)pos, group * T, QD_NN_VECTOR, "the positions", err, errlen)) != QD_OK)
        goto done;

    double t0 = now_s();
    if ((st = qd_model_rows(m, m->token_embd, tokens, all, hidden, err, errlen)) != QD_OK)
        goto done;
    if (hp->embd_scale != 1.0f) { /* gemma: ggml_scale(inpL, sqrtf(n_embd)) */
        if (hidden_host) { /* (the CPU's op on host memory, as the backend's would give) */
            for (int64_t i = 0; i < all * n_embd; i++)
                hidden[i] *= hp->embd_scale;
        } else
            nn->scale(hidden, all * n_embd, hp->embd_scale);
    }
    qd_model_release(m, m->token_embd);
    stats->read_seconds += now_s() - t0;

    struct qd_block_scratch s;
    qd_block_scratch_init(&s, scratch, hp, group * T);
    if (hp->n_layer > 0) {
        loader_start(&loader, 0, &blocks[0], 0);
        if ((st = loader_wait(&loader, stats, err, errlen)) != QD_OK)
            goto done;
    }
    for (int layer = 0; layer < hp->n_layer; layer++) {
        block = &blocks[prefetch ? layer % 2 : 0];
        struct qd_model_block *next = &blocks[(layer + 1) % 2];
        if (!prefetch && layer > 0) { /* one block's buffers, the last block's ops done with them */
            nn_sync(nn);
            unbind_block(m, nn, block);
            loader_start(&loader, layer, block, 0);
            if ((st = loader_wait(&loader, stats, err, errlen)) != QD_OK)
                goto done;
        }
        if (prefetch && layer + 1 < hp->n_layer)
            loader_start(&loader, layer + 1, next, 1);
        for (int c0 = 0; c0 < n_chunks; c0 += group) {
            if (stopped(h)) {
                snprintf(err, errlen, "cancelled");
                st = QD_ECANCELED;
                goto done;
            }
            const int n = n_chunks - c0 < group ? n_chunks - c0 : group;
            float *x = hidden + (int64_t)c0 * T * n_embd;
            const size_t bytes = (size_t)(n * T * n_embd) * sizeof(float);
            if (stage) {
                nn_sync(nn);
                memcpy(stage, x, bytes);
            }
            struct qd_block_run r = {.m = m, .b = block, .nn = nn, .layer = layer, .hidden = stage ? stage : x,
                                     .T = n * T, .seq = T, .pos = pos, .s = &s,
                                     .on_matmul_input = h ? h->on_matmul_input : NULL,
                                     .on_matmul_expert_input = h ? h->on_matmul_expert_input : NULL,
                                     .on_matmul_head_input = h ? h->on_matmul_head_input : NULL,
                                     .hook_ctx = h ? h->ctx : NULL,
                                     .cache_k = o->cache_k, .cache_v = o->cache_v, .err = err,
                                     .errlen = errlen};
            if ((st = m->arch->block(&r)) != QD_OK)
                goto done;
            int64_t bad = nn->first_nonfinite(r.hidden, n * T * n_embd);
            if (nn->error && nn->error()) {
                snprintf(err, errlen, "block %d on %s: %s", layer, nn->name, nn->error());
                st = QD_EDEVICE;
                goto done;
            }
            if (bad >= 0) {
                snprintf(err, errlen, "block %d gave NaN/Inf in chunk %d at position %" PRId64 " (value %" PRId64
                         " of the hidden state): the weights or the activations overflow f32", layer,
                         c0 + (int)(bad / (T * n_embd)) + 1, bad / n_embd % T, bad % n_embd);
                st = QD_ENONFINITE;
                goto done;
            }
            if (stage) {
                nn_sync(nn);
                memcpy(x, stage, bytes);
            }
        }
        if (prefetch) { /* this block's weights go; the next one's are there */
            nn_sync(nn);
            unbind_block(m, nn, block);
            if (layer + 1 < hp->n_layer && (st = loader_wait(&loader, stats, err, errlen)) != QD_OK)
                goto done;
        }
        if (h && h->on_progress)
            h->on_progress(h->ctx, layer + 1, (int)hp->n_layer + 1);
    }
    /* the blocks' memory goes before the head's comes */
    nn_sync(nn);
    for (int i = 0; i < 2; i++) {
        unbind_block(m, nn, &blocks[i]);
        qd_model_block_free(&blocks[i]);
    }
    nn_release(nn, scratch);
    scratch = NULL;
    st = run_head(m, hidden, hidden_host, n_chunks, o, h, nn, stats, err, errlen);
    if (st == QD_OK && h && h->on_progress)
        h->on_progress(h->ctx, (int)hp->n_layer + 1, (int)hp->n_layer + 1);
done:
    {
        const size_t blocks = stats->block_bytes + stats->scratch_bytes;
        stats->peak_bytes = stats->hidden_bytes + (blocks > stats->head_bytes ? blocks : stats->head_bytes);
    }
    if (loader.running) /* a failure while the next block loads: it finishes first */
        loader_wait(&loader, stats, NULL, 0);
    nn_sync(nn);
    for (int i = 0; i < 2; i++) {
        unbind_block(m, nn, &blocks[i]);
        qd_model_block_free(&blocks[i]);
    }
    if (pos)
        nn_unbind(nn, (const float *)pos);
    for (int i = 0; i < 2; i++)
        if (bound_freqs[i] && (i == 0 || bound_freqs[1] != bound_freqs[0]))
            nn_unbind(nn, bound_freqs[i]);
    if (scratch)
        nn_release(nn, scratch);
    if (hidden) {
        if (hidden_host)
            free(hidden);
        else
            nn_release(nn, hidden);
    }
    free(pos);
    if (nn->peak_bytes)
        stats->device_peak_bytes = nn->peak_bytes();
    stats->seconds = now_s() - t_start;
    return st;
}
