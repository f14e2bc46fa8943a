/* An importance-matrix run (llama-imatrix, tools/imatrix/imatrix.cpp) over the layer-major
 * engine (engine.h), for `quantd imatrix`, imatrix jobs (POST /jobs?op=imatrix) and `quantd
 * convert --calibrate`: the matrix of a GGUF model over a text's tokens, cut into chunks of n_ctx
 * tokens (each chunk's first token replaced by BOS when the vocabulary adds one), collected by
 * imatrix_collect.c, with the perplexity over each chunk's second half alongside; earlier files
 * (in_files) added in first, or only combined when no tokens are given. The file is written once,
 * whole, at the end (a temporary beside it, renamed): the layer-major order has no partial matrix
 * to save before. llama-imatrix's lines go out through the run's text callback (run_io.h). */
#ifndef QD_MODEL_IMATRIX_RUN_H
#define QD_MODEL_IMATRIX_RUN_H

#include <cjson/cJSON.h>

#include "checkpoint/imatrix_sums.h"
#include "model/engine.h"
#include "model/run_io.h"

struct qd_imatrix_opts {
    const char *model;          /* a GGUF (a split model: its first shard); needed with tokens */
    const char *text, *tokens;  /* the text, or its token ids (tokens wins; text then only names the dataset) */
    const char *dataset;        /* the text's name recorded in the file (NULL: text, else tokens) */
    const char *output;         /* NULL: imatrix.gguf */
    int format;                 /* 0: unsaid (GGUF, with llama-imatrix's note when the name is not .gguf),
                                   1: gguf, 2: dat (the legacy format) */
    const char *const *in_files; /* earlier matrices added in (each may list several, comma separated) */
    int n_in_files;
    int n_ctx;                  /* tokens per chunk; 0: 512 */
    int max_chunks;             /* -1: all that fit */
    int from_chunk;             /* the first chunk used */
    int n_batch;                /* llama-imatrix's -b (its chunks per pass; only its lines depend on it); 0: 2048 */
    int threads;                /* 0: every core */
    int process_output;         /* collect output.weight's input too */
    int no_ppl;                 /* skip the perplexity */
    enum qd_dtype cache_k, cache_v; /* the KV cache's types (llama.cpp's default: f16) */
    const struct qd_nn_backend *nn; /* the engine's backend (engine_backend.h; NULL: the CPU) */
    struct qd_run_io io;
};

/* What a computation found beside the sums. */
struct qd_imatrix_result {
    int chunks;                 /* chunks run */
    int ppl_ok;                 /* the perplexity's figures are set */
    double ln_ppl, ln_ppl_error;
    struct qd_engine_stats stats;
};

/* Runs the model over tokens ([n_tokens], the text's own) into s (s->chunk_size set by the
 * caller), printing llama-imatrix's lines. QD_OK, or a status with err: a text shorter than two
 * chunks, an architecture the engine lacks, a token outside the vocabulary, NaN/Inf (naming the
 * block), QD_ECANCELED. */
enum qd_status qd_imatrix_compute(const struct qd_imatrix_opts *o, struct qd_imatrix_sums *s, const int32_t *tokens,
                                  int64_t n_tokens, struct qd_imatrix_result *res, char *err, size_t errlen);

/* The whole run: in_files added, the text's tokens computed (when given), the file written.
 * QD_OK with *summary (output, format, entries, chunks, the perplexity, the run's time and
 * memory; the caller frees it), or a status with err naming the problem; no file is left behind
 * on any failure (an existing output stays as it was). */
enum qd_status qd_imatrix_run(const struct qd_imatrix_opts *o, cJSON **summary, char *err, size_t errlen);

#endif
