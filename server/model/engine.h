/* The forward engine: prefills of whole chunks with causal attention, run LAYER-MAJOR: every
 * chunk passes block L before block L+1 is read, so each weight is read (and dequantized, and on
 * a device copied) once per run, whatever the number of chunks. The chunks' hidden states stay
 * resident ([chunks][n_ctx][n_embd] f32); after the last block the output norm and projection run
 * chunk by chunk and hand each chunk's logits to a callback (perplexity, KL divergence). A second
 * callback sees the activations entering every matmul (the importance-matrix collector).
 *
 * Memory: the hidden states + one block's weights in f32 + one chunk's scratch (q, k, v, the
 * attention's output, the FFN's two intermediates) while the blocks run; then the output weight
 * in f32 + one chunk's logits. qd_engine_stats reports each. A block with experts is read whole:
 * every expert in f32 (Qwen3-30B-A3B's 128 experts of 3 x 2048 x 768: 2.4 GB a block), not only
 * those the tokens route to. */
#ifndef QD_MODEL_ENGINE_H
#define QD_MODEL_ENGINE_H

#include "model/graph.h"

struct qd_engine_opts {
    int n_ctx;            /* tokens per chunk */
    int logits_from;      /* the first position of a chunk whose logits are wanted */
    int threads;          /* 0: every core */
    /* K and V rounded to these types as llama.cpp's KV cache holds them (its default: f16;
     * QD_F32 keeps them exact; f16 and bf16 are the others) */
    enum qd_dtype cache_k, cache_v;
    const struct qd_nn_backend *nn; /* NULL: the CPU; a backend with memory of its own (CUDA) runs
                                       several chunks through a block at once and holds the
                                       largest block's weights, the hidden states where they fit
                                       (the host's memory otherwise) and the activations */
};

struct qd_engine_hooks {
    void *ctx;
    /* Chunk `chunk`'s logits for positions [from, n_ctx): rows x n_vocab f32 in host memory.
     * Chunks come in order. A nonzero return stops the run (QD_ECANCELED). */
    int (*on_logits)(void *ctx, int chunk, int from, int rows, const float *logits, int64_t n_vocab);
    /* The activations entering each matmul (graph.h); layer is n_layer for the output head. */
    qd_matmul_input_fn on_matmul_input;
    /* The activations entering each expert's matmul, by expert (graph.h; NULL: on_matmul_input
     * gets them). */
    qd_matmul_expert_input_fn on_matmul_expert_input;
    /* The activations entering each head's slice of a per-head weight (graph.h; NULL:
     * on_matmul_input gets them). */
    qd_matmul_head_input_fn on_matmul_head_input;
    /* After each block (and the head: done == total). */
    void (*on_progress)(void *ctx, int done, int total);
    const volatile int *cancel; /* nonzero: stop at the next block or chunk */
};

struct qd_engine_stats {
    double seconds, read_seconds; /* the whole run; reading, dequantizing and handing the backend
                                     the weights (on a device backend, behind the blocks' work) */
    double load_wait_seconds;     /* of the run, the blocks waited for their weights */
    size_t hidden_bytes;          /* the chunks' hidden states */
    size_t block_bytes;           /* the largest block's weights in f32 */
    size_t scratch_bytes;         /* one chunk's activations inside a block */
    size_t head_bytes;            /* the output norm and projection in f32 + one chunk's logits */
    size_t peak_bytes;            /* the most of these held at once */
    size_t device_peak_bytes;     /* a backend with memory of its own: the most it held (0: none) */
    int chunks_together;          /* chunks run through a block at once */
};

/* Runs n_chunks chunks of o->n_ctx tokens (tokens: [n_chunks][n_ctx], each chunk as the model
 * sees it: a caller that wants a BOS puts it there). QD_OK, or a status with err: a token outside
 * the vocabulary, no memory (naming what did not fit), NaN/Inf in the hidden states (naming the
 * block and chunk), a stop asked by a callback or the cancel flag. */
enum qd_status qd_engine_run(struct qd_model *m, const int32_t *tokens, int n_chunks, const struct qd_engine_opts *o,
                             const struct qd_engine_hooks *h, struct qd_engine_stats *stats, char *err, size_t errlen);

#endif
