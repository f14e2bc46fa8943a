/* A perplexity run (llama-perplexity's perplexity(), tools/perplexity/perplexity.cpp) and its
 * KL divergence (kl_divergence()) over the layer-major engine (engine.h), for `quantd
 * perplexity` and for perplexity jobs (POST /jobs?op=perplexity): the options in, llama-
 * perplexity's lines out through the run's text callback (run_io.h) and a JSON summary back.
 *
 * The tokens are cut into chunks of n_ctx tokens, each chunk's first token replaced by BOS when
 * the vocabulary adds one; each chunk is scored over its second half (positions n_ctx/2 ..
 * n_ctx-2 predicting the next token), the statistics summed in double as llama-perplexity sums
 * them. Its lines come out as it prints them ("[1]x.xxxx,[2]..." on QD_RUN_OUT, "Final
 * estimate: PPL = X +/- Y" on QD_RUN_LOG). kld_base alone also writes llama-perplexity's base
 * logits file (a temporary beside it, renamed when whole); with kl_divergence it reads one
 * instead and prints its KL divergence table and statistics (kld.h). */
#ifndef QD_MODEL_PERPLEXITY_RUN_H
#define QD_MODEL_PERPLEXITY_RUN_H

#include <cjson/cJSON.h>

#include "model/run_io.h"
#include "../../kernels/nn.h"
#include "../../kernels/registry.h"

struct qd_perplexity_opts {
    const char *model;       /* a GGUF (a split model: its first shard) */
    const char *text;        /* a text, tokenized with the model's vocabulary ... */
    const char *tokens;      /* ... or its token ids (either wins over text; optional with kl_divergence) */
    const char *kld_base;    /* --kl-divergence-base: written, or read with kl_divergence */
    int kl_divergence;
    const char *dump_logits; /* each chunk's logits from n_ctx/2 on, raw f32 (NULL: none) */
    int n_ctx;               /* tokens per chunk; 0: 512, or with kl_divergence the base's */
    int max_chunks;          /* at most this many chunks; -1: all that fit */
    int n_batch;             /* llama-perplexity's -b (only its lines depend on it; whole chunks run at once) */
    int threads;             /* 0: every core */
    enum qd_dtype cache_k, cache_v; /* the KV cache's types (llama.cpp's default: f16) */
    const struct qd_nn_backend *nn; /* the engine's backend (engine_backend.h; NULL: the CPU) */
    struct qd_run_io io;
};

/* Runs it. QD_OK with *summary (the JSON line `quantd perplexity` prints last; the caller frees
 * it), or a status with err naming the problem and its fix: a text shorter than two chunks, an
 * architecture the engine lacks, a model without a vocabulary (for a text), a base file of
 * another vocabulary or text, a token outside the vocabulary, NaN/Inf (naming the block),
 * QD_ECANCELED. Nothing half-written is left on failure: the base file and the logits dump are
 * written beside their names and renamed when whole. */
enum qd_status qd_perplexity_run(const struct qd_perplexity_opts *o, cJSON **summary, char *err, size_t errlen);

#endif
