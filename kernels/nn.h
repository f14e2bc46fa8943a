/* The ops a transformer's forward pass is made of, once per backend (kernels/cpu/nn.c: plain f32,
 * the reference). A model's graph (server/model/arch_*.c) composes them; the layer-major driver
 * (server/model/engine.c) owns the order. Every tensor is row-major f32 in the backend's memory:
 * activations [T][width] with T tokens of one chunk, weights [N][K] as GGUF stores them (a row per
 * output, K contiguous).
 *
 * The arithmetic follows ggml's CPU f32 path (ggml-cpu/ops.cpp, vec.cpp) where the order of its
 * roundings shows in the result: norms sum squares in double, softmax sums its exponentials in
 * double, rope builds its angles by repeated f32 products; dot products run in 8 f32 lanes with
 * fused multiply-adds, as llamafile's sgemm does for f32 on AVX2. */
#ifndef QD_NN_H
#define QD_NN_H

#include <stddef.h>
#include <stdint.h>

#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ggml's rope modes: NORMAL rotates adjacent pairs (x[2i], x[2i+1]), NEOX the two halves
 * (x[i], x[i + n_rot/2]) (ggml.h GGML_ROPE_TYPE_*). */
enum qd_rope_kind { QD_ROPE_NONE, QD_ROPE_NORMAL, QD_ROPE_NEOX };

/* The rotary embedding's parameters, as ggml_rope_ext takes them. freq_factors (n_rot/2 values,
 * NULL for none) divide each pair's angle: Llama 3's rope_freqs.weight. ext_factor != 0 is YaRN
 * (its ramp between beta_fast and beta_slow over n_ctx_orig), attn_factor scales cos and sin. */
struct qd_nn_rope {
    enum qd_rope_kind kind;
    int n_rot;
    float freq_base, freq_scale;
    float ext_factor, attn_factor, beta_fast, beta_slow;
    int n_ctx_orig;
    const float *freq_factors;
};

/* Causal self-attention over one chunk: q [T][q_stride] holding n_head heads of head_dim_k,
 * k [T][k_stride] and v [T][v_stride] holding n_head_kv heads (head h reads kv head
 * h / (n_head / n_head_kv), ggml's broadcast), out [T][n_head * head_dim_v]. Scores are
 * q.k * scale, then softmax over positions 0..t. */
struct qd_nn_attn {
    int64_t T;
    int n_head, n_head_kv, head_dim_k, head_dim_v;
    int64_t q_stride, k_stride, v_stride;
    float scale;
    float softcap;  /* > 0: each raw score q.k becomes softcap * tanh(q.k / softcap) before the
                       scale (Gemma 2's attention logit soft-capping); 0: none */
    int64_t window; /* > 0: query t sees positions t - window + 1 .. t only (llama.cpp's standard
                       sliding window, is_masked_swa); 0: all of 0..t */
    int64_t seq;    /* > 0: the T rows are independent sequences of seq tokens each (chunks run
                       together), each attending within itself only; 0: one sequence of T */
};

enum qd_glu_kind { QD_GLU_SILU, QD_GLU_GELU };

/* A mixture of experts' routing, as llama.cpp's build_moe_ffn takes it: the router's logits to
 * probabilities (softmax over the experts, or each one's sigmoid), bias (NULL: none; DeepSeek V3's
 * exp_probs_b) added for the choice of experts only, the n_used largest chosen, their
 * probabilities the weights, renormalised to sum 1 when norm_w, then times w_scale (0 or 1:
 * left as they are). */
enum qd_moe_gate { QD_MOE_SOFTMAX, QD_MOE_SIGMOID };
#define QD_NN_MAX_EXPERTS 512 /* llama.cpp's LLAMA_MAX_EXPERTS */
/* With n_group > 1 the experts form n_group groups of n_expert / n_group; a group's score is
 * the sum of its two best choice scores, and only the n_group_used best groups' experts may be
 * chosen (DeepSeek V3's group-limited routing). */
struct qd_nn_moe_gating {
    enum qd_moe_gate func;
    int norm_w;
    float w_scale;
    const float *bias;
    int n_group, n_group_used;
};

/* y[T][N] = x[T][K] . w[N][K]^T */
void qd_nn_matmul(float *y, const float *x, const float *w, int64_t T, int64_t K, int64_t N);
/* y[t][i] += b[i] for every row t (a bias) */
void qd_nn_add_row(float *y, const float *b, int64_t T, int64_t n);
/* x[i] *= s (ggml_scale) */
void qd_nn_scale(float *x, int64_t n, float s);
/* x[i] = cap * tanh(x[i] * (1/cap)) (ggml_scale, ggml_tanh, ggml_scale: Gemma's final logit
 * soft-capping) */
void qd_nn_softcap(float *x, int64_t n, float cap);
/* y[i] += a[i] (a residual) */
void qd_nn_add(float *y, const float *a, int64_t n);
/* Each of the rows of x [rows][n] divided by its root mean square (eps inside the root), times
 * w (n values; NULL: none): ggml_rms_norm then ggml_mul. y may be x. */
void qd_nn_rms_norm(float *y, const float *x, const float *w, int64_t rows, int64_t n, float eps);
/* ggml_norm (mean and variance) times w plus b (either NULL: none). y may be x. */
void qd_nn_layer_norm(float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t n, float eps);
/* Rotates the first r->n_rot values of each head of x [T][stride] (n_head heads of head_dim at
 * the row's start) in place, token t at position pos[t]. QD_ENOMEM without memory for its
 * angles. */
enum qd_status qd_nn_rope(float *x, int64_t T, int64_t stride, int n_head, int head_dim, const int32_t *pos,
                          const struct qd_nn_rope *r);
/* Causal attention (struct qd_nn_attn). QD_ENOMEM when its per-thread row of scores cannot be
 * had. */
enum qd_status qd_nn_attention(float *out, const float *q, const float *k, const float *v, const struct qd_nn_attn *a);
/* out[i] = act(gate[i]) * up[i] over T rows of n (ggml_swiglu_split / ggml_geglu_split); out
 * may be gate. GELU is the tanh approximation read as ggml's CPU backend reads it: from a table
 * of f16 results indexed by the f16 input (GGML_GELU_FP16), exact beyond +-10. */
void qd_nn_glu(float *out, const float *gate, const float *up, int64_t n, enum qd_glu_kind kind);

/* Routes T tokens among n_expert experts (struct qd_nn_moe_gating): logits [T][n_expert] is
 * replaced by the probabilities; ids [T][n_used] gets each token's experts, most probable first
 * (ggml_argsort_top_k), weights [T][n_used] their weights. */
void qd_nn_moe_route(int32_t *ids, float *weights, float *logits, int64_t T, int n_expert, int n_used,
                     const struct qd_nn_moe_gating *g);
/* out[t] = experts[t][0] * weights[t][0] + experts[t][1] * weights[t][1] + ..., each product
 * rounded to f32 and the sum taken in slot order (ggml_mul, then build_moe_ffn's chain of
 * ggml_add); experts [T][n_used][n], weights [T][n_used], out [T][n]. */
void qd_nn_moe_sum(float *out, const float *experts, const float *weights, int64_t T, int n_used, int64_t n);
/* y[t][i] *= sigmoid(g[t]), the sigmoid taken as silu(g) / g (qwen2moe's shared-expert gate,
 * as llama.cpp computes it); y [T][n], g [T]. */
void qd_nn_sigmoid_gate(float *y, const float *g, int64_t T, int64_t n);
/* The rows an expert runs on, moved as they are: dst[i] = src[rows[i] / div] (gather: the
 * tokens routed to it, rows being token x n_used + slot), and dst[rows[i]] = src[i] (scatter:
 * its outputs to their slots); rows of n values, i < count. */
void qd_nn_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n, int64_t div);
void qd_nn_scatter_rows(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n);

/* x[i] rounded to dtype (QD_F16 or QD_BF16, nearest even as ggml converts) and back: what a KV
 * cache of that type holds. QD_F32 leaves x as it is. */
void qd_nn_round(float *x, int64_t n, enum qd_dtype dtype);

/* acc[j] += x[t][j] * x[t][j] for t = 0..T-1 in order, f32 (the CPU's add_squares) */
void qd_nn_add_squares(float *acc, const float *x, int64_t T, int64_t K);
/* The first non-finite value of x [n], or -1. */
int64_t qd_nn_first_nonfinite(const float *x, int64_t n);

/* Threads the ops use (0: the CPU backend's count, kernels/cpu/parallel.c). */
void qd_nn_set_threads(int n);

/* What a weight is to a backend that keeps its own copy (qd_nn_backend.bind): a matrix the
 * matmuls read (a device keeps it in bf16) or a vector the other ops read (kept in f32). */
enum qd_nn_weight_kind { QD_NN_MATRIX, QD_NN_VECTOR };

/* The op table the engine calls through: one per backend, so that a second backend is a second
 * table, not a second engine.
 *
 * Memory: activations live in what alloc gives (the CPU: malloc; CUDA: managed memory, which
 * the host may also read and write once sync has returned, so that rare host-side steps such as
 * gathering an expert's rows need no op of their own). Weights stay in host f32 where the model
 * loader put them; bind hands one to the backend (CUDA copies it to the device, a matrix in
 * bf16, and from then on maps the host address and any address inside it to its copy: the ops
 * are called with the host pointers either way); unbind forgets it. A NULL memory op means the
 * host's (malloc, free, nothing to bind, nothing to wait for). */
struct qd_nn_backend {
    const char *name;
    void *(*alloc)(size_t bytes);        /* NULL: no memory (or over the backend's limit) */
    void (*free)(void *p);
    void (*sync)(void);                  /* the ops so far are done; the host may read their output */
    /* host: the weight's f32 address the ops are handed; src, dtype: where its n values are
     * (src == host, QD_F32; or a file's f16 / bf16 / f32 bytes, host then an address standing
     * for them, never read) */
    enum qd_status (*bind)(const float *host, int64_t n, enum qd_nn_weight_kind kind, const void *src,
                           enum qd_dtype dtype);
    void (*unbind)(const float *host);
    int64_t (*first_nonfinite)(const float *x, int64_t n);
    size_t (*peak_bytes)(void);          /* the most of its own memory held so far (NULL: none) */
    /* bytes of the backend's memory at src copied into host memory at dst (NULL: the host's own) */
    void (*to_host)(void *dst, const void *src, size_t bytes);
    /* acc [K] (host memory) += x[t][j]^2 over the rows, in f32: the importance matrix's sums,
     * without the rows leaving the backend (the CPU row by row, llama-imatrix's order; a device
     * may add parts of the rows side by side first) */
    void (*add_squares)(float *acc, const float *x, int64_t T, int64_t K);
    const char *(*error)(void);          /* NULL, or what failed (the ops return nothing: a device
                                            backend keeps its first failure; NULL op: never fails) */
    void (*matmul)(float *y, const float *x, const float *w, int64_t T, int64_t K, int64_t N);
    void (*add_row)(float *y, const float *b, int64_t T, int64_t n);
    void (*add)(float *y, const float *a, int64_t n);
    void (*scale)(float *x, int64_t n, float s);
    void (*softcap)(float *x, int64_t n, float cap);
    void (*rms_norm)(float *y, const float *x, const float *w, int64_t rows, int64_t n, float eps);
    void (*layer_norm)(float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t n, float eps);
    enum qd_status (*rope)(float *x, int64_t T, int64_t stride, int n_head, int head_dim, const int32_t *pos,
                 const struct qd_nn_rope *r);
    enum qd_status (*attention)(float *out, const float *q, const float *k, const float *v, const struct qd_nn_attn *a);
    void (*glu)(float *out, const float *gate, const float *up, int64_t n, enum qd_glu_kind kind);
    void (*round)(float *x, int64_t n, enum qd_dtype dtype);
    void (*moe_route)(int32_t *ids, float *weights, float *logits, int64_t T, int n_expert, int n_used,
                      const struct qd_nn_moe_gating *g);
    void (*moe_sum)(float *out, const float *experts, const float *weights, int64_t T, int n_used, int64_t n);
    void (*sigmoid_gate)(float *y, const float *g, int64_t T, int64_t n);
    void (*gather_rows)(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n, int64_t div);
    void (*scatter_rows)(float *dst, const float *src, const int32_t *rows, int64_t count, int64_t n);
};

extern const struct qd_nn_backend qd_nn_cpu;

/* The CUDA backend (kernels/cuda/nn.cu; only in builds with CUDA, QD_WITH_CUDA): opens `device`
 * with `limit` bytes of device memory at most (0: no limit but the device's own), counting every
 * allocation the backend makes; QD_OK, or a status with err. Called again, it sets the limit. */
extern const struct qd_nn_backend qd_nn_cuda;
enum qd_status qd_nn_cuda_open(int device, size_t limit, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
