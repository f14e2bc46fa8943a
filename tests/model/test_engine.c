/* server/model: the loader and the layer-major driver on a tiny Llama built byte by byte here
 * (its accuracy against llama.cpp is tests/peers/test_model_engine.py's). What is proven:
 * - the order is layer-major: every chunk passes block L before block L+1 (the matmul hook sees
 *   blocks in order, each with every chunk), and a chunk's logits do not depend on the chunks run
 *   beside it (bit for bit, alone or with others);
 * - the matmul-input hook sees every matmul of every block with its weight's name and width
 *   (q, k and v the same input), then the output head;
 * - the logits callback gets the chunks in order, the rows from logits_from on;
 * - NaN/Inf in the hidden states stops the run naming the block and the chunk;
 * - with experts (Mixtral's layout), the expert hook sees each expert's rows: every token at
 *   n_expert_used experts, the same rows entering an expert's gate, up and down; without it the
 *   plain hook gets those rows under the tensor's name;
 * - the loader refuses an architecture it lacks (listing those it runs), a missing block tensor,
 *   a tensor of the wrong shape, a model without a vocabulary, a mixture of experts without
 *   experts;
 * - on a backend with memory of its own (emul_backend.h: bf16 matrices and matmul inputs, on
 *   the CPU), every weight an op reads was handed over (none read from host memory), chunks run
 *   together, the logits within bf16's reach of the CPU's (plain and with experts); under a
 *   limit the hidden states stay in host memory and give the same logits bit for bit, a limit
 *   below a block's weights is refused naming --max-device-bytes, and everything the backend
 *   gave is given back. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

#include <cmocka.h>

#include "../checkpoint/gguf_bytes.h"
#include "emul_backend.h"
#include "model/engine.h"

enum { EMBD = 16, FF = 24, HEADS = 4, KV_HEADS = 2, HD = 4, LAYERS = 2, VOCAB = 40, CTX = 8 };
enum { EXPERTS = 6, EXPERTS_USED = 2 };

struct tiny {
    int drop_tensor;       /* index into the tensor list to leave out, -1: none */
    int bad_shape;         /* give attn_k the q's shape */
    int no_vocab;
    const char *arch;
    float poison;          /* a value planted in blk.1.ffn_down (0: none) */
    int experts;           /* Mixtral's layout: EXPERTS experts, EXPERTS_USED a token */
};

struct tensor_spec {
    char name[64];
    int64_t cols, rows, experts; /* experts 0: a 2-D (or 1-D) tensor */
};

static int specs(struct tensor_spec *t, const struct tiny *o)
{
    int n = 0;
    snprintf(t[n].name, 64, "token_embd.weight"), t[n].cols = EMBD, t[n].experts = 0, t[n++].rows = VOCAB;
    for (int l = 0; l < LAYERS; l++) {
        static const struct {
            const char *name;
            int64_t cols, rows;
        } blk[] = {{"attn_norm.weight", EMBD, 1}, {"attn_q.weight", EMBD, HEADS * HD},
                   {"attn_k.weight", EMBD, KV_HEADS * HD}, {"attn_v.weight", EMBD, KV_HEADS * HD},
                   {"attn_output.weight", HEADS * HD, EMBD}, {"ffn_norm.weight", EMBD, 1},
                   {"ffn_gate.weight", EMBD, FF}, {"ffn_up.weight", EMBD, FF}, {"ffn_down.weight", FF, EMBD}};
        for (size_t i = 0; i < sizeof blk / sizeof *blk - (o->experts ? 3 : 0); i++) {
            snprintf(t[n].name, 64, "blk.%d.%s", l, blk[i].name);
            t[n].cols = blk[i].cols, t[n].rows = blk[i].rows, t[n].experts = 0;
            if (o->bad_shape && l == 1 && i == 2)
                t[n].rows = HEADS * HD;
            n++;
        }
        if (o->experts) {
            static const struct {
                const char *name;
                int64_t cols, rows, experts;
            } moe[] = {{"ffn_gate_inp.weight", EMBD, EXPERTS, 0}, {"ffn_gate_exps.weight", EMBD, FF, EXPERTS},
                       {"ffn_up_exps.weight", EMBD, FF, EXPERTS}, {"ffn_down_exps.weight", FF, EMBD, EXPERTS}};
            for (size_t i = 0; i < sizeof moe / sizeof *moe; i++, n++) {
                snprintf(t[n].name, 64, "blk.%d.%s", l, moe[i].name);
                t[n].cols = moe[i].cols, t[n].rows = moe[i].rows, t[n].experts = moe[i].experts;
            }
        }
    }
    snprintf(t[n].name, 64, "output_norm.weight"), t[n].cols = EMBD, t[n].experts = 0, t[n++].rows = 1;
    snprintf(t[n].name, 64, "output.weight"), t[n].cols = EMBD, t[n].experts = 0, t[n++].rows = VOCAB;
    if (o->drop_tensor >= 0) {
        memmove(&t[o->drop_tensor], &t[o->drop_tensor + 1], (size_t)(n - o->drop_tensor - 1) * sizeof *t);
        n--;
    }
    return n;
}

static void kv_u32(struct buf *b, const char *key, uint32_t v)
{
    put_str(b, key);
    put_u32(b, 4); /* GGUF_TYPE_UINT32 */
    put_u32(b, v);
}

static void kv_f32(struct buf *b, const char *key, float v)
{
    put_str(b, key);
    put_u32(b, 6);
    put(b, &v, 4);
}

static void kv_str(struct buf *b, const char *key, const char *v)
{
    put_str(b, key);
    put_u32(b, 8);
    put_str(b, v);
}

/* A tiny Llama in a temporary file (its path in `path`): weights from a fixed integer generator. */
static void write_tiny(const struct tiny *o, char *path)
{
    struct tensor_spec t[64];
    const int nt = specs(t, o);
    const char *arch = o->arch ? o->arch : "llama";
    struct buf b = {0};
    gguf_header(&b, (uint64_t)nt, (o->no_vocab ? 9 : 11) + (o->experts ? 2 : 0));
    char key[96];
    kv_str(&b, "general.architecture", arch);
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    kv_u32(&b, KEY("context_length"), 64);
    kv_u32(&b, KEY("embedding_length"), EMBD);
    kv_u32(&b, KEY("block_count"), LAYERS);
    kv_u32(&b, KEY("feed_forward_length"), FF);
    kv_u32(&b, KEY("attention.head_count"), HEADS);
    kv_u32(&b, KEY("attention.head_count_kv"), KV_HEADS);
    kv_f32(&b, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    kv_f32(&b, KEY("rope.freq_base"), 10000.0f);
    if (o->experts) {
        kv_u32(&b, KEY("expert_count"), EXPERTS);
        kv_u32(&b, KEY("expert_used_count"), EXPERTS_USED);
    }
#undef KEY
    if (!o->no_vocab) {
        kv_str(&b, "tokenizer.ggml.model", "llama");
        put_str(&b, "tokenizer.ggml.tokens");
        put_u32(&b, 9); /* array */
        put_u32(&b, 8); /* of strings */
        put_u64(&b, VOCAB);
        for (int i = 0; i < VOCAB; i++) {
            char s[16];
            snprintf(s, sizeof s, "t%d", i);
            put_str(&b, s);
        }
    }
    uint64_t offset = 0;
    for (int i = 0; i < nt; i++) {
        put_str(&b, t[i].name);
        const int64_t experts = t[i].experts ? t[i].experts : 1;
        put_u32(&b, t[i].experts ? 3 : t[i].rows > 1 ? 2 : 1);
        put_u64(&b, (uint64_t)t[i].cols);
        if (t[i].rows > 1 || t[i].experts)
            put_u64(&b, (uint64_t)t[i].rows);
        if (t[i].experts)
            put_u64(&b, (uint64_t)t[i].experts);
        put_u32(&b, 0); /* f32 */
        put_u64(&b, offset);
        offset += (uint64_t)(t[i].cols * t[i].rows * experts * 4 + 31) / 32 * 32;
    }
    while (b.n % 32)
        put(&b, "", 1);
    uint32_t state = 12345;
    for (int i = 0; i < nt; i++) {
        const int norm = strstr(t[i].name, "norm") != NULL;
        const int64_t n = t[i].cols * t[i].rows * (t[i].experts ? t[i].experts : 1);
        for (int64_t k = 0; k < n; k++) {
            state = state * 1664525u + 1013904223u;
            float v = ((float)(state >> 8) / 16777216.0f - 0.5f) * (norm ? 0.2f : 0.6f) + (norm ? 1.0f : 0.0f);
            if (o->poison != 0.0f && !strcmp(t[i].name, "blk.1.ffn_down.weight") && k == 7)
                v = o->poison;
            put(&b, &v, 4);
        }
        while (b.n % 32)
            put(&b, "", 1);
    }
    strcpy(path, "/tmp/qd_test_engine_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    free(b.p);
}

static const struct tiny plain = {.drop_tensor = -1};

/* ---- hooks ------------------------------------------------------------------------------------ */

struct record {
    int calls, last_layer, layer_major_ok;
    int calls_per_layer[LAYERS + 1];
    char names[LAYERS + 1][8][64];
    int64_t widths[LAYERS + 1][8];
    int n_names[LAYERS + 1];
    float qkv_first[3];
    int chunks_seen, rows_seen, from_seen, in_order;
    int64_t block_rows; /* the rows a block's matmul saw last */
    float *logits; /* [chunks][rows][VOCAB] */
};

static void on_matmul(void *ctx, int layer, const char *weight, const float *x, int64_t T, int64_t K)
{
    struct record *r = ctx;
    r->calls++;
    if (layer < r->last_layer)
        r->layer_major_ok = 0;
    r->last_layer = layer;
    r->calls_per_layer[layer]++;
    int seen = 0;
    for (int i = 0; i < r->n_names[layer]; i++)
        seen |= !strcmp(r->names[layer][i], weight);
    if (!seen && r->n_names[layer] < 8) {
        snprintf(r->names[layer][r->n_names[layer]], 64, "%s", weight);
        r->widths[layer][r->n_names[layer]++] = K;
    }
    if (layer == 0) { /* q, k and v see one input */
        const char *qkv[3] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"};
        for (int i = 0; i < 3; i++)
            if (!strcmp(weight, qkv[i]))
                r->qkv_first[i] = x[5 * K + 3];
    }
    if (layer < LAYERS)
        r->block_rows = T;
}

static int on_logits(void *ctx, int chunk, int from, int rows, const float *logits, int64_t n_vocab)
{
    struct record *r = ctx;
    r->in_order &= chunk == r->chunks_seen;
    r->chunks_seen++;
    r->rows_seen = rows, r->from_seen = from;
    memcpy(r->logits + (size_t)chunk * (size_t)rows * (size_t)n_vocab, logits,
           (size_t)rows * (size_t)n_vocab * sizeof *logits);
    return 0;
}

static enum qd_status run(const char *path, const int32_t *tokens, int chunks, struct record *r, char *err)
{
    struct qd_model m;
    enum qd_status st;
    if (qd_model_open(path, &m, &st, err, 512)) {
        qd_model_close(&m);
        return st;
    }
    struct qd_engine_opts o = {.n_ctx = CTX, .logits_from = 3, .threads = 2, .cache_k = QD_F32, .cache_v = QD_F32};
    struct qd_engine_hooks h = {.ctx = r, .on_logits = on_logits, .on_matmul_input = on_matmul};
    struct qd_engine_stats stats;
    st = qd_engine_run(&m, tokens, chunks, &o, &h, &stats, err, 512);
    if (st == QD_OK) {
        assert_true(stats.hidden_bytes == (size_t)chunks * CTX * EMBD * 4);
        assert_true(stats.peak_bytes >= stats.hidden_bytes + stats.block_bytes);
    }
    qd_model_close(&m);
    return st;
}

static void fresh(struct record *r, int chunks)
{
    memset(r, 0, sizeof *r);
    r->layer_major_ok = r->in_order = 1;
    r->logits = calloc((size_t)chunks * (CTX - 3) * VOCAB, sizeof *r->logits);
}

static void engine_is_layer_major_and_hooks_see_every_matmul(void **state)
{
    (void)state;
    char path[64], err[512];
    write_tiny(&plain, path);
    int32_t tokens[3 * CTX];
    for (int i = 0; i < 3 * CTX; i++)
        tokens[i] = (i * 7 + 3) % VOCAB;
    struct record r;
    fresh(&r, 3);
    assert_int_equal(run(path, tokens, 3, &r, err), QD_OK);
    assert_true(r.layer_major_ok);
    /* 7 matmuls per block, the 3 chunks together (2048 tokens a pass on the CPU), then the head
     * once per chunk */
    assert_int_equal(r.calls_per_layer[0], 7);
    assert_int_equal(r.calls_per_layer[1], 7);
    assert_int_equal(r.block_rows, 3 * CTX);
    assert_int_equal(r.calls_per_layer[LAYERS], 3);
    assert_int_equal(r.n_names[1], 7);
    const char *want[7] = {"blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight",
                           "blk.1.attn_output.weight", "blk.1.ffn_up.weight", "blk.1.ffn_gate.weight",
                           "blk.1.ffn_down.weight"};
    const int64_t widths[7] = {EMBD, EMBD, EMBD, HEADS * HD, EMBD, EMBD, FF};
    for (int i = 0; i < 7; i++) {
        assert_string_equal(r.names[1][i], want[i]);
        assert_int_equal(r.widths[1][i], widths[i]);
    }
    assert_string_equal(r.names[LAYERS][0], "output.weight");
    assert_true(r.qkv_first[0] == r.qkv_first[1] && r.qkv_first[1] == r.qkv_first[2]);
    assert_true(r.in_order && r.chunks_seen == 3 && r.rows_seen == CTX - 3 && r.from_seen == 3);

    /* chunk 2 alone gives the same logits, bit for bit */
    struct record alone;
    fresh(&alone, 1);
    assert_int_equal(run(path, tokens + 2 * CTX, 1, &alone, err), QD_OK);
    assert_memory_equal(alone.logits, r.logits + 2 * (CTX - 3) * VOCAB, (size_t)(CTX - 3) * VOCAB * sizeof(float));
    for (int i = 0; i < (CTX - 3) * VOCAB; i++)
        assert_true(isfinite(alone.logits[i]));
    free(alone.logits);
    free(r.logits);
    unlink(path);
}

static void nonfinite_hidden_state_names_the_block(void **state)
{
    (void)state;
    char path[64], err[512];
    struct tiny o = plain;
    o.poison = INFINITY;
    write_tiny(&o, path);
    int32_t tokens[2 * CTX];
    for (int i = 0; i < 2 * CTX; i++)
        tokens[i] = (i * 5 + 1) % VOCAB;
    struct record r;
    fresh(&r, 2);
    assert_int_equal(run(path, tokens, 2, &r, err), QD_ENONFINITE);
    assert_non_null(strstr(err, "block 1 gave NaN/Inf in chunk 1"));
    free(r.logits);
    unlink(path);
}

static void token_outside_the_vocabulary_is_refused(void **state)
{
    (void)state;
    char path[64], err[512];
    write_tiny(&plain, path);
    int32_t tokens[CTX] = {1, 2, VOCAB + 5};
    struct record r;
    fresh(&r, 1);
    assert_int_equal(run(path, tokens, 1, &r, err), QD_EINVAL);
    assert_non_null(strstr(err, "token id 45 is outside the vocabulary's 40 tokens"));
    free(r.logits);
    unlink(path);
}

/* ---- experts ---------------------------------------------------------------------------------- */

struct expert_record {
    int64_t rows[LAYERS][3][EXPERTS]; /* gate, up, down */
    int64_t plain_rows[LAYERS][3];    /* the same tensors through the plain hook */
    int bad;
};

static int exps_role(const char *weight)
{
    return strstr(weight, "ffn_gate_exps") ? 0 : strstr(weight, "ffn_up_exps") ? 1 : strstr(weight, "ffn_down_exps") ? 2 : -1;
}

static void on_expert(void *ctx, int layer, const char *weight, int expert, int n_expert, const float *x, int64_t rows,
                      int64_t K)
{
    struct expert_record *r = ctx;
    const int role = exps_role(weight);
    if (role < 0 || layer < 0 || layer >= LAYERS || expert < 0 || expert >= n_expert || n_expert != EXPERTS || rows < 1 ||
        K != (role == 2 ? FF : EMBD) || !isfinite(x[rows * K - 1])) {
        r->bad++;
        return;
    }
    r->rows[layer][role][expert] += rows;
}

static void on_plain(void *ctx, int layer, const char *weight, const float *x, int64_t T, int64_t K)
{
    struct expert_record *r = ctx;
    const int role = exps_role(weight);
    if (role >= 0 && layer < LAYERS)
        r->plain_rows[layer][role] += T;
    (void)x, (void)K;
}

static void expert_hook_tells_each_expert_its_rows(void **state)
{
    (void)state;
    char path[64], err[512];
    struct tiny o = plain;
    o.experts = 1;
    write_tiny(&o, path);
    int32_t tokens[2 * CTX];
    for (int i = 0; i < 2 * CTX; i++)
        tokens[i] = (i * 11 + 2) % VOCAB;
    struct qd_model m;
    enum qd_status st;
    assert_int_equal(qd_model_open(path, &m, &st, err, sizeof err), 0);
    assert_int_equal(m.hp.n_expert, EXPERTS);
    const struct qd_engine_opts opts = {.n_ctx = CTX, .logits_from = 3, .threads = 2, .cache_k = QD_F32,
                                        .cache_v = QD_F32};
    struct qd_engine_stats stats;
    for (int with_expert_hook = 0; with_expert_hook < 2; with_expert_hook++) {
        struct expert_record r = {0};
        struct qd_engine_hooks h = {.ctx = &r, .on_matmul_input = on_plain,
                                    .on_matmul_expert_input = with_expert_hook ? on_expert : NULL};
        assert_int_equal(qd_engine_run(&m, tokens, 2, &opts, &h, &stats, err, sizeof err), QD_OK);
        assert_int_equal(r.bad, 0);
        for (int l = 0; l < LAYERS; l++) {
            int64_t total = 0, used = 0;
            for (int e = 0; e < EXPERTS; e++) {
                /* an expert's gate, up and down see the same rows */
                assert_int_equal(r.rows[l][0][e], r.rows[l][1][e]);
                assert_int_equal(r.rows[l][1][e], r.rows[l][2][e]);
                total += r.rows[l][1][e];
                used += r.rows[l][1][e] > 0;
            }
            if (with_expert_hook) {
                assert_int_equal(total, 2 * CTX * EXPERTS_USED); /* every token at EXPERTS_USED experts */
                assert_true(used >= EXPERTS_USED);
                assert_int_equal(r.plain_rows[l][1], 0);
            } else
                for (int role = 0; role < 3; role++)
                    assert_int_equal(r.plain_rows[l][role], 2 * CTX * EXPERTS_USED);
        }
    }
    qd_model_close(&m);
    unlink(path);
}

static void loader_refusals_name_the_problem(void **state)
{
    (void)state;
    static const struct {
        struct tiny o;
        const char *msg;
    } cases[] = {
        {{.drop_tensor = -1, .arch = "mamba"}, "does not run architecture 'mamba' yet: it runs llama qwen2 qwen3"},
        /* a llama block's tensors under gemma2: its post-norms are missing */
        {{.drop_tensor = -1, .arch = "gemma2"}, "no tensor blk.0.post_attention_norm.weight, which a gemma2 block needs"},
        /* under phi3: neither its fused attn_qkv nor q/k/v apart is wanting, its ffn_up is half its size */
        {{.drop_tensor = -1, .arch = "phi3"}, "tensor blk.0.ffn_up.weight is [16, "},
        {{.drop_tensor = 12}, "no tensor blk.1.attn_k.weight, which a llama block needs"},
        {{.drop_tensor = -1, .bad_shape = 1}, "tensor blk.1.attn_k.weight is [16, 16, 1], the model's sizes say [16, 8]"},
        {{.drop_tensor = -1, .no_vocab = 1}, "has no vocabulary"},
        {{.drop_tensor = -1, .arch = "qwen3moe"}, "a qwen3moe model needs qwen3moe.expert_count > 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[64], err[512] = "";
        write_tiny(&cases[i].o, path);
        struct qd_model m;
        enum qd_status st;
        assert_int_equal(qd_model_open(path, &m, &st, err, sizeof err), -1);
        qd_model_close(&m);
        if (!strstr(err, cases[i].msg))
            fail_msg("case %zu: '%s' does not say '%s'", i, err, cases[i].msg);
        unlink(path);
    }
}

/* ---- a backend with memory of its own ------------------------------------------------------ */

static enum qd_status run_on(const char *path, const int32_t *tokens, int chunks, const struct qd_nn_backend *nn,
                             float *logits, struct qd_engine_stats *stats, char *err)
{
    struct qd_model m;
    enum qd_status st;
    if (qd_model_open(path, &m, &st, err, 512)) {
        qd_model_close(&m);
        return st;
    }
    struct record r;
    fresh(&r, chunks);
    struct qd_engine_opts o = {.n_ctx = CTX, .logits_from = 3, .threads = 2, .cache_k = QD_F32, .cache_v = QD_F32,
                               .nn = nn};
    struct qd_engine_hooks h = {.ctx = &r, .on_logits = on_logits};
    st = qd_engine_run(&m, tokens, chunks, &o, &h, stats, err, 512);
    memcpy(logits, r.logits, (size_t)chunks * (CTX - 3) * VOCAB * sizeof *logits);
    free(r.logits);
    qd_model_close(&m);
    return st;
}

/* the worst row's largest difference over its largest logit */
static double worst_row(const float *a, const float *b, int rows)
{
    double worst = 0;
    for (int i = 0; i < rows; i++) {
        double d = 0, top = 0;
        for (int j = 0; j < VOCAB; j++) {
            d = fmax(d, fabs((double)a[i * VOCAB + j] - b[i * VOCAB + j]));
            top = fmax(top, fabs((double)a[i * VOCAB + j]));
        }
        worst = fmax(worst, d / top);
    }
    return worst;
}

static void device_backend_gets_every_weight_and_runs_chunks_together(void **state)
{
    (void)state;
    enum { CHUNKS = 64 };
    const struct tiny cases[2] = {{.drop_tensor = -1}, {.drop_tensor = -1, .experts = 1}};
    static int32_t tokens[CHUNKS * CTX];
    for (int i = 0; i < CHUNKS * CTX; i++)
        tokens[i] = (i * 7 + 3) % VOCAB;
    const int rows = CHUNKS * (CTX - 3);
    float *cpu = malloc((size_t)rows * VOCAB * sizeof *cpu), *dev = malloc((size_t)rows * VOCAB * sizeof *dev);
    float *capped = malloc((size_t)rows * VOCAB * sizeof *capped);
    for (int c = 0; c < 2; c++) {
        char path[64], err[512];
        write_tiny(&cases[c], path);
        struct qd_engine_stats stats;
        assert_int_equal(run_on(path, tokens, CHUNKS, NULL, cpu, &stats, err), QD_OK);
        emu_reset(0);
        assert_int_equal(run_on(path, tokens, CHUNKS, &emu_backend, dev, &stats, err), QD_OK);
        assert_null(emu.error[0] ? emu.error : NULL);
        assert_int_equal(stats.chunks_together, CHUNKS); /* 64 x 8 tokens: one group */
        assert_true(stats.device_peak_bytes > 0 && emu.binds > 0);
        assert_int_equal(emu.n_bind, 0); /* everything handed back */
        assert_int_equal(emu.n_own, 0);
        const double worst = worst_row(cpu, dev, rows);
        print_message("emulated bf16 device vs the CPU (%s): worst row %.2e\n", c ? "experts" : "dense", worst);
        assert_true(worst > 0 && worst < 3e-2); /* bf16 inputs move the logits, within its rounding's reach */

        /* a limit that holds one chunk's activations beside the weights but not the hidden states:
         * they stay in host memory, the chunks go one at a time, the same logits bit for bit */
        struct qd_model m;
        enum qd_status st;
        assert_int_equal(qd_model_open(path, &m, &st, err, 512), 0);
        const size_t weights = qd_model_block_bytes(&m) / 2 * 2 + ((size_t)1 << 20);
        const size_t one = (size_t)(qd_block_scratch_floats(&m.hp, CTX) + CTX * EMBD) * sizeof(float);
        qd_model_close(&m);
        const size_t head = (size_t)VOCAB * EMBD * 2 + (size_t)EMBD * 4 + (size_t)(CTX - 3) * (EMBD + VOCAB) * 4;
        emu_reset(weights + (one > head ? one : head) + (size_t)CTX * 4 + 1024);
        assert_int_equal(run_on(path, tokens, CHUNKS, &emu_backend, capped, &stats, err), QD_OK);
        assert_int_equal(stats.chunks_together, 1);
        assert_true(stats.device_peak_bytes <= emu.limit);
        assert_memory_equal(capped, dev, (size_t)rows * VOCAB * sizeof *dev);

        /* a limit below the blocks' weights is refused, naming the flag */
        emu_reset(4096);
        assert_int_equal(run_on(path, tokens, CHUNKS, &emu_backend, capped, &stats, err), QD_ENOMEM);
        assert_non_null(strstr(err, "--max-device-bytes"));
        assert_int_equal(emu.n_bind, 0);
        assert_int_equal(emu.n_own, 0);
        unlink(path);
    }
    emu_reset(0);
    free(cpu), free(dev), free(capped);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(engine_is_layer_major_and_hooks_see_every_matmul),
        cmocka_unit_test(nonfinite_hidden_state_names_the_block),
        cmocka_unit_test(token_outside_the_vocabulary_is_refused),
        cmocka_unit_test(expert_hook_tells_each_expert_its_rows),
        cmocka_unit_test(loader_refusals_name_the_problem),
        cmocka_unit_test(device_backend_gets_every_weight_and_runs_chunks_together),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
