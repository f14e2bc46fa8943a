/* The transformer ops on the CPU in f32 (kernels/nn.h): the reference the other backends are
 * held against. Each mirrors the ggml CPU op named in its comment, in the order of its roundings
 * where that order shows (sums of squares and of exponentials in double, rope's angles by
 * repeated f32 products); dot products keep 8 f32 lanes with fused multiply-adds and add them
 * up at the end as llamafile's tinyBLAS does (ggml's f32 mul_mat on AVX2). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../fp.h"
#include "../nn.h"
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NN_AVX2 1
#endif

static int nn_threads;

void qd_nn_set_threads(int n) { nn_threads = n > 0 ? n : 0; }

static int threads_for(int64_t work_items)
{
    int n = nn_threads ? nn_threads : qd_cpu_threads();
    if (n > QD_CPU_MAX_THREADS)
        n = QD_CPU_MAX_THREADS;
    return work_items < n ? (int)(work_items < 1 ? 1 : work_items) : n;
}

/* ---- 8-lane dot products ------------------------------------------------------------------- */

#ifdef NN_AVX2
typedef __m256 lanes8;
static inline lanes8 l8_zero(void) { return _mm256_setzero_ps(); }
static inline lanes8 l8_load(const float *p) { return _mm256_loadu_ps(p); }
static inline lanes8 l8_set1(float v) { return _mm256_set1_ps(v); }
static inline lanes8 l8_fma(lanes8 a, lanes8 b, lanes8 acc) { return _mm256_fmadd_ps(a, b, acc); }
static inline void l8_store(float *p, lanes8 v) { _mm256_storeu_ps(p, v); }
/* tinyBLAS's hsum: the two halves, then pairs, then the last two */
static inline float l8_sum(lanes8 v)
{
    __m128 x = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
#else
typedef struct {
    float v[8];
} lanes8;
static inline lanes8 l8_zero(void) { return (lanes8){{0}}; }
static inline lanes8 l8_load(const float *p)
{
    lanes8 r;
    memcpy(r.v, p, sizeof r.v);
    return r;
}
static inline lanes8 l8_set1(float v) { return (lanes8){{v, v, v, v, v, v, v, v}}; }
static inline lanes8 l8_fma(lanes8 a, lanes8 b, lanes8 acc)
{
    for (int i = 0; i < 8; i++)
        acc.v[i] = fmaf(a.v[i], b.v[i], acc.v[i]);
    return acc;
}
static inline void l8_store(float *p, lanes8 v) { memcpy(p, v.v, sizeof v.v); }
static inline float l8_sum(lanes8 v)
{
    float h[4], q[2];
    for (int i = 0; i < 4; i++)
        h[i] = v.v[i + 4] + v.v[i];
    q[0] = h[0] + h[2], q[1] = h[1] + h[3];
    return q[0] + q[1];
}
#endif

/* Weights as the matmul reads them: f32, or a file's f16 / bf16 values widened lane by lane as
 * they load (exact: the same sums as their f32 copy, from half the bytes). */
enum { W_F32, W_F16, W_BF16 };

static inline float w_at(const void *w, int64_t i, int wt)
{
    if (wt == W_F32)
        return ((const float *)w)[i];
    const uint16_t h = ((const uint16_t *)w)[i];
    return wt == W_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
}

#ifdef NN_AVX2
static inline lanes8 w_load(const void *w, int64_t i, int wt)
{
    if (wt == W_F32)
        return _mm256_loadu_ps((const float *)w + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (wt == W_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#else
static inline lanes8 w_load(const void *w, int64_t i, int wt)
{
    lanes8 r;
    for (int l = 0; l < 8; l++)
        r.v[l] = w_at(w, i + l, wt);
    return r;
}
#endif

/* x . y over n: 8 lanes of fused multiply-adds, their sum, then the tail (n % 8) in order. */
static inline float dot8(const float *x, const float *y, int64_t n)
{
    lanes8 acc = l8_zero();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = l8_fma(l8_load(x + i), l8_load(y + i), acc);
    float s = l8_sum(acc);
    for (; i < n; i++)
        s += x[i] * y[i];
    return s;
}

/* ---- matmul: y[T][N] = x[T][K] . w[N][K]^T -------------------------------------------------- */

/* Macro tiles of MM_TB tokens x MM_NB weight rows, K in blocks of MM_KB: the tile's x block
 * (16 KiB) stays in L1 and its w block and lane accumulators (kept across K blocks, so the sum
 * is the plain 8-lane one whatever the tile sizes) in L2. 8 tokens a tile: measured on 2 cores
 * (SmolLM2's blocks, bench/bench_model.py --mode cpu), 1.5x faster than 64, whose x block
 * spilled to L2. Micro tiles of 4 tokens x 3 rows: 12 accumulators, 3 weight vectors and one input
 * vector fill the 16 AVX2 registers. */
#define MM_TB 8
#define MM_NB 48
#define MM_KB 1024
#define MM_RM 4
#define MM_RN 3

/* acc[i][j] += x[i] . w[j] over [k0, k1) (k1 - k0 a multiple of 8) for rm x rn of the tile;
 * rows of x and of w lie ldx and ldw values apart (w's of type wt) */
static inline __attribute__((always_inline)) void mm_micro(int rm, int rn, int wt, const float *x, int64_t ldx,
                                                           const void *w, int64_t ldw, int64_t k0, int64_t k1,
                                                           lanes8 *acc, int acc_stride)
{
    lanes8 a[MM_RM][MM_RN];
    for (int i = 0; i < rm; i++)
        for (int j = 0; j < rn; j++)
            a[i][j] = acc[i * acc_stride + j];
    for (int64_t k = k0; k < k1; k += 8) {
        lanes8 wv[MM_RN];
        for (int j = 0; j < rn; j++)
            wv[j] = w_load(w, j * ldw + k, wt);
        for (int i = 0; i < rm; i++) {
            lanes8 xv = l8_load(x + i * ldx + k);
            for (int j = 0; j < rn; j++)
                a[i][j] = l8_fma(xv, wv[j], a[i][j]);
        }
    }
    for (int i = 0; i < rm; i++)
        for (int j = 0; j < rn; j++)
            acc[i * acc_stride + j] = a[i][j];
}

#define MM_CASE(WT, RM, RN)                                                                                            \
    case (WT) * 16 + RM * 4 + RN:                                                                                      \
        mm_micro(RM, RN, WT, x, ldx, w, ldw, k0, k1, acc, acc_stride);                                                 \
        break;
#define MM_CASES(WT)                                                                                                   \
    MM_CASE(WT, 4, 3) MM_CASE(WT, 4, 2) MM_CASE(WT, 4, 1) MM_CASE(WT, 3, 3) MM_CASE(WT, 3, 2) MM_CASE(WT, 3, 1)        \
    MM_CASE(WT, 2, 3) MM_CASE(WT, 2, 2) MM_CASE(WT, 2, 1) MM_CASE(WT, 1, 3) MM_CASE(WT, 1, 2) MM_CASE(WT, 1, 1)

static void mm_micro_any(int rm, int rn, int wt, const float *x, int64_t ldx, const void *w, int64_t ldw, int64_t k0,
                         int64_t k1, lanes8 *acc, int acc_stride)
{
    switch (wt * 16 + rm * 4 + rn) {
        MM_CASES(W_F32) MM_CASES(W_F16) MM_CASES(W_BF16)
    default:
        break;
    }
}

/* w advanced by n values of type wt */
static inline const void *w_off(const void *w, int64_t n, int wt)
{
    return (const char *)w + n * (wt == W_F32 ? 4 : 2);
}

/* One macro tile: y[i][j] = x[i] . w[j] for i < tb <= MM_TB, j < nb <= MM_NB over K, rows
 * ldx, ldw, ldy apart; acc holds MM_TB * MM_NB lanes (the caller's, 96 KiB). */
static void mm_tile(float *y, int64_t ldy, const float *x, int64_t ldx, const void *w, int wt, int64_t ldw, int tb,
                    int nb, int64_t K, lanes8 *acc)
{
    const int64_t K8 = K / 8 * 8;
    for (int i = 0; i < tb * MM_NB; i++)
        acc[i] = l8_zero();
    for (int64_t k0 = 0; k0 < K8; k0 += MM_KB) {
        const int64_t k1 = k0 + MM_KB < K8 ? k0 + MM_KB : K8;
        for (int jn = 0; jn < nb; jn += MM_RN) {
            const int rn = nb - jn < MM_RN ? nb - jn : MM_RN;
            for (int it = 0; it < tb; it += MM_RM) {
                const int rm = tb - it < MM_RM ? tb - it : MM_RM;
                mm_micro_any(rm, rn, wt, x + it * ldx, ldx, w_off(w, jn * ldw, wt), ldw, k0, k1, acc + it * MM_NB + jn,
                             MM_NB);
            }
        }
    }
    for (int it = 0; it < tb; it++) {
        const float *xr = x + it * ldx;
        for (int jn = 0; jn < nb; jn++) {
            float s = l8_sum(acc[it * MM_NB + jn]);
            for (int64_t k = K8; k < K; k++) /* the tail of a row that is not whole lanes */
                s += xr[k] * w_at(w, jn * ldw + k, wt);
            y[it * ldy + jn] = s;
        }
    }
}

/* y[M][N] (rows ldy apart) = x[M][K] . w[N][K]^T on the calling thread, tile by tile */
static void mm_serial(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, int64_t ldw, int64_t M,
                      int64_t N, int64_t K, lanes8 *acc)
{
    for (int64_t t0 = 0; t0 < M; t0 += MM_TB)
        for (int64_t n0 = 0; n0 < N; n0 += MM_NB)
            mm_tile(y + t0 * ldy + n0, ldy, x + t0 * ldx, ldx, w + n0 * ldw, W_F32, ldw,
                    (int)(M - t0 < MM_TB ? M - t0 : MM_TB), (int)(N - n0 < MM_NB ? N - n0 : MM_NB), K, acc);
}

struct mm_job {
    float *y;
    const float *x;
    const void *w;
    int wt;
    int64_t T, K, N, tiles_t, tiles;
    int64_t next; /* the next macro tile, taken atomically */
};

static void mm_worker(void *ctx, int tid, int n)
{
    struct mm_job *j = ctx;
    (void)tid, (void)n;
    lanes8 acc[MM_TB * MM_NB]; /* 96 KiB of a worker's stack */
    for (int64_t tile; (tile = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->tiles;) {
        const int64_t t0 = tile % j->tiles_t * MM_TB, n0 = tile / j->tiles_t * MM_NB;
        mm_tile(j->y + t0 * j->N + n0, j->N, j->x + t0 * j->K, j->K, w_off(j->w, n0 * j->K, j->wt), j->wt, j->K,
                (int)(j->T - t0 < MM_TB ? j->T - t0 : MM_TB), (int)(j->N - n0 < MM_NB ? j->N - n0 : MM_NB), j->K, acc);
    }
}

static void matmul_typed(float *y, const float *x, const void *w, int wt, int64_t T, int64_t K, int64_t N)
{
    struct mm_job j = {.y = y, .x = x, .w = w, .wt = wt, .T = T, .K = K, .N = N};
    j.tiles_t = (T + MM_TB - 1) / MM_TB;
    j.tiles = j.tiles_t * ((N + MM_NB - 1) / MM_NB);
    qd_cpu_parallel(threads_for(j.tiles), mm_worker, &j);
}

void qd_nn_matmul(float *y, const float *x, const float *w, int64_t T, int64_t K, int64_t N)
{
    matmul_typed(y, x, w, W_F32, T, K, N);
}

/* ---- weights kept as the file stores them -------------------------------------------------- */

/* A matrix bound in f16 / bf16 (qd_nn_cpu.bind): the host address the ops are handed stands
 * for the file's bytes, which the matmul reads as they are. The table is changed between
 * blocks, by the thread that runs them. */
#define CPU_BINDS 64
static struct {
    const float *host;
    int64_t n;
    const void *src;
    int wt;
} cpu_bind[CPU_BINDS];
static int cpu_binds;
static pthread_mutex_t cpu_bind_lock = PTHREAD_MUTEX_INITIALIZER;

static void cpu_unbind(const float *host)
{
    pthread_mutex_lock(&cpu_bind_lock);
    for (int i = 0; i < cpu_binds; i++)
        if (cpu_bind[i].host == host) {
            cpu_bind[i] = cpu_bind[--cpu_binds];
            break;
        }
    pthread_mutex_unlock(&cpu_bind_lock);
}

static enum qd_status cpu_bind_weight(const float *host, int64_t n, enum qd_nn_weight_kind kind, const void *src,
                                      enum qd_dtype dtype)
{
    cpu_unbind(host);
    if (src == (const void *)host) /* widened to f32 at host: read there */
        return QD_OK;
    if (kind != QD_NN_MATRIX || (dtype != QD_F16 && dtype != QD_BF16 && dtype != QD_F32))
        return QD_EINVAL;
    pthread_mutex_lock(&cpu_bind_lock);
    enum qd_status st = QD_ENOMEM;
    if (cpu_binds < CPU_BINDS) {
        cpu_bind[cpu_binds].host = host, cpu_bind[cpu_binds].n = n, cpu_bind[cpu_binds].src = src;
        cpu_bind[cpu_binds++].wt = dtype == QD_F16 ? W_F16 : dtype == QD_BF16 ? W_BF16 : W_F32;
        st = QD_OK;
    }
    pthread_mutex_unlock(&cpu_bind_lock);
    return st;
}

/* the matmul on a bound matrix's own bytes, or on w as it is */
static void cpu_matmul(float *y, const float *x, const float *w, int64_t T, int64_t K, int64_t N)
{
    const void *src = w;
    int wt = W_F32;
    pthread_mutex_lock(&cpu_bind_lock);
    for (int i = 0; i < cpu_binds; i++)
        if (w >= cpu_bind[i].host && w < cpu_bind[i].host + cpu_bind[i].n) {
            wt = cpu_bind[i].wt;
            src = w_off(cpu_bind[i].src, w - cpu_bind[i].host, wt);
            break;
        }
    pthread_mutex_unlock(&cpu_bind_lock);
    matmul_typed(y, x, src, wt, T, K, N);
}

/* ---- elementwise ---------------------------------------------------------------------------- */

/* ggml_add with a broadcast row */
void qd_nn_add_row(float *y, const float *b, int64_t T, int64_t n)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < n; i++)
            y[t * n + i] += b[i];
}

/* ggml_add */
void qd_nn_add(float *y, const float *a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a[i];
}

void qd_nn_scale(float *x, int64_t n, float s)
{
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

void qd_nn_softcap(float *x, int64_t n, float cap)
{
    const float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++)
        x[i] = tanhf(x[i] * inv) * cap;
}

/* ggml_gelu_f32, the tanh approximation in f32, as ggml-cpu.c is compiled (GCC's default
 * contraction fuses 1 + a*x*x into one fused multiply-add): this way every one of the 65536
 * entries of ggml_table_gelu_f16 comes out the same, which the plain expression misses by one. */
static float gelu_tanh(float x)
{
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f, coef_a = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * fmaf(coef_a * x, x, 1.0f)));
}

/* ggml_table_gelu_f16: gelu of every f16 value, rounded to f16 (ggml_cpu_init builds the same) */
static uint16_t gelu_table[1 << 16];
static pthread_once_t gelu_table_once = PTHREAD_ONCE_INIT;

static void gelu_table_build(void)
{
    for (uint32_t i = 0; i < 1u << 16; i++)
        gelu_table[i] = qd_f32_to_f16(gelu_tanh(qd_f16_to_f32((uint16_t)i)));
}

/* ggml_vec_geglu_f32 under GGML_GELU_FP16 (ggml-cpu/vec.h, always defined there): 0 below -10,
 * x itself above 10, else the table's entry at the f16 value of x. */
static inline float gelu_f16_table(float x)
{
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    return qd_f16_to_f32(gelu_table[qd_f32_to_f16(x)]);
}

/* ggml_vec_swiglu_f32: silu(g) = g / (1 + e^-g), times up; ggml_vec_geglu_f32 (gelu_f16_table). */
void qd_nn_glu(float *out, const float *gate, const float *up, int64_t n, enum qd_glu_kind kind)
{
    if (kind == QD_GLU_SILU) {
        for (int64_t i = 0; i < n; i++)
            out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
        return;
    }
    pthread_once(&gelu_table_once, gelu_table_build);
    for (int64_t i = 0; i < n; i++)
        out[i] = gelu_f16_table(gate[i]) * up[i];
}

void qd_nn_round(float *x, int64_t n, enum qd_dtype dtype)
{
    if (dtype == QD_F16)
        for (int64_t i = 0; i < n; i++)
            x[i] = qd_f16_to_f32(qd_f32_to_f16(x[i]));
    else if (dtype == QD_BF16)
        for (int64_t i = 0; i < n; i++)
            x[i] = qd_bf16_to_f32(qd_f32_to_bf16(x[i]));
}

/* ---- norms ---------------------------------------------------------------------------------- */

struct norm_job {
    float *y;
    const float *x, *w, *b;
    int64_t rows, n;
    float eps;
    int layer; /* 0: rms, 1: mean and variance */
};

static void norm_worker(void *ctx, int tid, int nth)
{
    const struct norm_job *j = ctx;
    for (int64_t r = tid; r < j->rows; r += nth) {
        const float *x = j->x + r * j->n;
        float *y = j->y + r * j->n;
        if (!j->layer) { /* ggml_compute_forward_rms_norm_f32 */
            double sum = 0.0;
            for (int64_t i = 0; i < j->n; i++)
                sum += (double)(x[i] * x[i]);
            const float mean = (float)(sum / (double)j->n);
            const float scale = 1.0f / sqrtf(mean + j->eps);
            for (int64_t i = 0; i < j->n; i++)
                y[i] = j->w ? x[i] * scale * j->w[i] : x[i] * scale;
            continue;
        }
        /* ggml_compute_forward_norm_f32: the mean, then the centred values' variance */
        double sum = 0.0;
        for (int64_t i = 0; i < j->n; i++)
            sum += (double)x[i];
        const float mean = (float)(sum / (double)j->n);
        double sum2 = 0.0;
        for (int64_t i = 0; i < j->n; i++) {
            const float v = x[i] - mean;
            y[i] = v;
            sum2 += (double)(v * v);
        }
        const float variance = (float)(sum2 / (double)j->n);
        const float scale = 1.0f / sqrtf(variance + j->eps);
        for (int64_t i = 0; i < j->n; i++) {
            float v = y[i] * scale;
            if (j->w)
                v *= j->w[i];
            if (j->b)
                v += j->b[i];
            y[i] = v;
        }
    }
}

static void norm_run(struct norm_job *j)
{
    qd_cpu_parallel(threads_for(j->rows * j->n / 65536 + 1), norm_worker, j);
}

void qd_nn_rms_norm(float *y, const float *x, const float *w, int64_t rows, int64_t n, float eps)
{
    struct norm_job j = {.y = y, .x = x, .w = w, .rows = rows, .n = n, .eps = eps};
    norm_run(&j);
}

void qd_nn_layer_norm(float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t n, float eps)
{
    struct norm_job j = {.y = y, .x = x, .w = w, .b = b, .rows = rows, .n = n, .eps = eps, .layer = 1};
    norm_run(&j);
}

/* ---- rope ----------------------------------------------------------------------------------- */

/* ggml_rope_yarn_corr_dims: the dims where YaRN's ramp starts and ends */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

static float yarn_ramp(float low, float high, int64_t i0)
{
    const float y = ((float)(i0 / 2) - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

/* ggml_rope_cache_init + rope_yarn: cos and sin of every pair's angle at position p */
static void rope_cache(float *cache, int64_t p, const struct qd_nn_rope *r, const float corr[2], float theta_scale)
{
    float theta = (float)p;
    for (int64_t i0 = 0; i0 < r->n_rot; i0 += 2) {
        const float ff = r->freq_factors ? r->freq_factors[i0 / 2] : 1.0f;
        const float extrap = theta / ff, interp = r->freq_scale * extrap;
        float t = interp, mscale = r->attn_factor;
        if (r->ext_factor != 0.0f) {
            const float mix = yarn_ramp(corr[0], corr[1], i0) * r->ext_factor;
            t = interp * (1 - mix) + extrap * mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / r->freq_scale);
        }
        cache[i0] = cosf(t) * mscale;
        cache[i0 + 1] = sinf(t) * mscale;
        theta *= theta_scale;
    }
}

struct rope_job {
    float *x;
    int64_t T, stride;
    int n_head, head_dim;
    const int32_t *pos;
    const struct qd_nn_rope *r;
    float corr[2], theta_scale;
    float *cache; /* [nth][n_rot] */
};

static void rope_worker(void *ctx, int tid, int nth)
{
    const struct rope_job *j = ctx;
    const struct qd_nn_rope *r = j->r;
    float *cache = j->cache + (int64_t)tid * r->n_rot;
    const int64_t half = r->n_rot / 2;
    for (int64_t t = tid; t < j->T; t += nth) {
        rope_cache(cache, j->pos[t], r, j->corr, j->theta_scale);
        for (int h = 0; h < j->n_head; h++) {
            float *x = j->x + t * j->stride + (int64_t)h * j->head_dim;
            for (int64_t i0 = 0; i0 < r->n_rot; i0 += 2) {
                const float c = cache[i0], s = cache[i0 + 1];
                /* NORMAL: the pair (i0, i0 + 1); NEOX: (i0/2, i0/2 + n_rot/2) */
                float *a = r->kind == QD_ROPE_NEOX ? x + i0 / 2 : x + i0;
                float *b = r->kind == QD_ROPE_NEOX ? a + half : a + 1;
                const float x0 = *a, x1 = *b;
                *a = x0 * c - x1 * s;
                *b = x0 * s + x1 * c;
            }
        }
    }
}

enum qd_status qd_nn_rope(float *x, int64_t T, int64_t stride, int n_head, int head_dim, const int32_t *pos,
                          const struct qd_nn_rope *r)
{
    if (r->kind == QD_ROPE_NONE || r->n_rot <= 0)
        return QD_OK;
    struct rope_job j = {.x = x, .T = T, .stride = stride, .n_head = n_head, .head_dim = head_dim, .pos = pos, .r = r};
    j.theta_scale = powf(r->freq_base, -2.0f / (float)r->n_rot);
    /* ggml_rope_yarn_corr_dims */
    const float start = floorf(yarn_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_fast, r->freq_base));
    const float end = ceilf(yarn_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_slow, r->freq_base));
    j.corr[0] = fmaxf(0.0f, start);
    j.corr[1] = fminf((float)(r->n_rot - 1), end);
    const int nth = threads_for(T * n_head * head_dim / 16384 + 1);
    if (!(j.cache = malloc((size_t)nth * (size_t)r->n_rot * sizeof *j.cache)))
        return QD_ENOMEM;
    qd_cpu_parallel(nth, rope_worker, &j);
    free(j.cache);
    return QD_OK;
}

/* ---- attention ------------------------------------------------------------------------------ */

/* ggml's path without flash attention, as two matmuls around a softmax: kq = mul_mat(k, q)
 * (8-lane dots over the head), soft_max_ext with the causal mask and the scale (exponentials
 * summed in double, then times 1/sum), kqv = mul_mat(v^T, kq) (8-lane dots over the positions,
 * position t in lane t % 8, the masked ones adding exact zeros). A task is one head over a block
 * of ATTN_ROWS query rows: its scores against the positions up to the block's last. */
#define ATTN_ROWS 32

struct attn_job {
    float *out;
    const float *q, *k;
    const float *vt; /* [n_head_kv][head_dim_v][len8]: V transposed, zero past T */
    const struct qd_nn_attn *a;
    int64_t tasks, row_blocks, len8;
    int64_t next;
    float *scores; /* per thread: [ATTN_ROWS][len8] */
};

static void attn_worker(void *ctx, int tid, int nth)
{
    struct attn_job *j = ctx;
    const struct qd_nn_attn *a = j->a;
    (void)nth;
    lanes8 acc[MM_TB * MM_NB]; /* 96 KiB of a worker's stack */
    float *s = j->scores + tid * ATTN_ROWS * j->len8;
    const int group = a->n_head / a->n_head_kv;
    const int64_t dk = a->head_dim_k, dv = a->head_dim_v, out_stride = (int64_t)a->n_head * dv;
    for (int64_t task; (task = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->tasks;) {
        const int h = (int)(task / j->row_blocks), hk = h / group;
        const int64_t r0 = task % j->row_blocks * ATTN_ROWS;
        const int64_t rows = r0 + ATTN_ROWS < a->T ? ATTN_ROWS : a->T - r0;
        const int64_t keys = r0 + rows, keys8 = (keys + 7) / 8 * 8;
        mm_serial(s, j->len8, j->q + r0 * a->q_stride + (int64_t)h * dk, a->q_stride, j->k + (int64_t)hk * dk,
                  a->k_stride, rows, keys, dk, acc);
        for (int64_t i = 0; i < rows; i++) {
            float *p = s + i * j->len8;
            const int64_t last = r0 + i; /* the causal mask: positions first..last */
            const int64_t first = a->window > 0 && last - a->window + 1 > 0 ? last - a->window + 1 : 0;
            float max = -INFINITY;
            if (a->softcap > 0.0f) { /* build_attn_mha: scale by 1/cap, tanh, scale by cap, then softmax */
                const float inv = 1.0f / a->softcap;
                for (int64_t t = first; t <= last; t++)
                    p[t] = tanhf(p[t] * inv) * a->softcap;
            }
            for (int64_t t = first; t <= last; t++) {
                p[t] *= a->scale;
                max = p[t] > max ? p[t] : max;
            }
            double sum = 0.0;
            for (int64_t t = first; t <= last; t++) {
                p[t] = expf(p[t] - max);
                sum += (double)p[t];
            }
            const float inv = (float)(1.0 / sum);
            for (int64_t t = 0; t < first; t++)
                p[t] = 0.0f;
            for (int64_t t = first; t <= last; t++)
                p[t] *= inv;
            for (int64_t t = last + 1; t < keys8; t++)
                p[t] = 0.0f;
        }
        mm_serial(j->out + r0 * out_stride + (int64_t)h * dv, out_stride, s, j->len8,
                  j->vt + (int64_t)hk * dv * j->len8, j->len8, rows, dv, keys8, acc);
    }
}

static enum qd_status attention_one(float *out, const float *q, const float *k, const float *v,
                                    const struct qd_nn_attn *a)
{
    struct attn_job j = {.out = out, .q = q, .k = k, .a = a};
    j.row_blocks = (a->T + ATTN_ROWS - 1) / ATTN_ROWS;
    j.tasks = j.row_blocks * a->n_head;
    j.len8 = (a->T + 7) / 8 * 8;
    const int nth = threads_for(j.tasks);
    const int64_t dv = a->head_dim_v;
    float *vt = aligned_alloc(64, ((size_t)((int64_t)a->n_head_kv * dv * j.len8) * sizeof *vt + 63) / 64 * 64);
    j.scores = aligned_alloc(64, ((size_t)(nth * ATTN_ROWS * j.len8) * sizeof *j.scores + 63) / 64 * 64);
    if (!vt || !j.scores) {
        free(vt), free(j.scores);
        return QD_ENOMEM;
    }
    for (int hk = 0; hk < a->n_head_kv; hk++)
        for (int64_t d = 0; d < dv; d++) {
            float *row = vt + ((int64_t)hk * dv + d) * j.len8;
            for (int64_t t = 0; t < a->T; t++)
                row[t] = v[t * a->v_stride + hk * dv + d];
            for (int64_t t = a->T; t < j.len8; t++)
                row[t] = 0.0f;
        }
    j.vt = vt;
    qd_cpu_parallel(nth, attn_worker, &j);
    free(vt);
    free(j.scores);
    return QD_OK;
}

enum qd_status qd_nn_attention(float *out, const float *q, const float *k, const float *v, const struct qd_nn_attn *a)
{
    if (a->seq <= 0 || a->seq >= a->T)
        return attention_one(out, q, k, v, a);
    /* sequences one after another, each its own causal attention */
    struct qd_nn_attn one = *a;
    const int64_t out_stride = (int64_t)a->n_head * a->head_dim_v;
    for (int64_t t0 = 0; t0 < a->T; t0 += a->seq) {
        one.T = a->T - t0 < a->seq ? a->T - t0 : a->seq;
        one.seq = 0;
        enum qd_status st = attention_one(out + t0 * out_stride, q + t0 * a->q_stride, k + t0 * a->k_stride,
                                          v + t0 * a->v_stride, &one);
        if (st != QD_OK)
            return st;
    }
    return QD_OK;
}

void qd_nn_add_squares(float *acc, const float *x, int64_t T, int64_t K)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < K; j++)
            acc[j] += x[t * K + j] * x[t * K + j];
}

int64_t qd_nn_first_nonfinite(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return -1;
}

const struct qd_nn_backend qd_nn_cpu = {
    .name = "cpu",
    .bind = cpu_bind_weight,
    .unbind = cpu_unbind,
    .first_nonfinite = qd_nn_first_nonfinite,
    .add_squares = qd_nn_add_squares,
    .matmul = cpu_matmul,
    .add_row = qd_nn_add_row,
    .add = qd_nn_add,
    .scale = qd_nn_scale,
    .softcap = qd_nn_softcap,
    .rms_norm = qd_nn_rms_norm,
    .layer_norm = qd_nn_layer_norm,
    .rope = qd_nn_rope,
    .attention = qd_nn_attention,
    .glu = qd_nn_glu,
    .round = qd_nn_round,
    .moe_route = qd_nn_moe_route,
    .moe_sum = qd_nn_moe_sum,
    .sigmoid_gate = qd_nn_sigmoid_gate,
    .gather_rows = qd_nn_gather_rows,
    .scatter_rows = qd_nn_scatter_rows,
};
