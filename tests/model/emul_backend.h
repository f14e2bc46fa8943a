/* A stand-in for a device backend, on the CPU (tests only): memory of its own, counted against a
 * limit; weights bound to copies of their own (from the file's f16 / bf16 / f32 bytes where the
 * engine hands those over), matrices rounded to bf16 and the matmuls' inputs too, as
 * kernels/cuda/nn.cu takes them; every op the CPU's, on those copies. An op handed a weight the
 * engine did not bind fails the run (the device would read host memory it cannot see). With it
 * the engine's device path runs in CI: weights handed over and taken back, chunks run together,
 * the hidden states kept in host memory under a limit, the next block read while one runs. */
#ifndef QD_TESTS_EMUL_BACKEND_H
#define QD_TESTS_EMUL_BACKEND_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/fp.h"
#include "../../kernels/nn.h"

static struct {
    size_t limit, used, peak;
    struct {
        const float *host;
        int64_t n;
        enum qd_nn_weight_kind kind;
        float *copy;
    } bind[128];
    int n_bind;
    struct {
        void *p;
        size_t bytes;
    } own[64];
    int n_own;
    int binds;      /* bind calls so far */
    char error[256];
} emu;

/* the table is changed from the engine's loading thread while the ops read it */
static pthread_mutex_t emu_lock = PTHREAD_MUTEX_INITIALIZER;

static void emu_fail(const char *what)
{
    if (!emu.error[0])
        snprintf(emu.error, sizeof emu.error, "%s", what);
}

static int emu_take(size_t bytes)
{
    if (emu.limit && emu.used + bytes > emu.limit)
        return 0;
    emu.used += bytes;
    emu.peak = emu.used > emu.peak ? emu.used : emu.peak;
    return 1;
}

static void *emu_alloc(size_t bytes)
{
    pthread_mutex_lock(&emu_lock);
    void *p = NULL;
    if (emu.n_own < 64 && emu_take(bytes) && !(p = malloc(bytes)))
        emu.used -= bytes;
    if (p)
        emu.own[emu.n_own].p = p, emu.own[emu.n_own++].bytes = bytes;
    pthread_mutex_unlock(&emu_lock);
    return p;
}

static void emu_free(void *p)
{
    pthread_mutex_lock(&emu_lock);
    int found = 0;
    for (int i = 0; i < emu.n_own && !found; i++)
        if (emu.own[i].p == p) {
            emu.used -= emu.own[i].bytes;
            emu.own[i] = emu.own[--emu.n_own];
            free(p);
            found = 1;
        }
    pthread_mutex_unlock(&emu_lock);
    if (!found)
        emu_fail("a free of memory the backend did not give");
}

static void emu_sync(void) {}

static void emu_unbind_locked(const float *host)
{
    for (int i = 0; i < emu.n_bind; i++)
        if (emu.bind[i].host == host) {
            emu.used -= (size_t)emu.bind[i].n * (emu.bind[i].kind == QD_NN_MATRIX ? 2 : 4);
            free(emu.bind[i].copy);
            emu.bind[i] = emu.bind[--emu.n_bind];
            return;
        }
}

static void emu_unbind(const float *host)
{
    pthread_mutex_lock(&emu_lock);
    emu_unbind_locked(host);
    pthread_mutex_unlock(&emu_lock);
}

static enum qd_status emu_bind(const float *host, int64_t n, enum qd_nn_weight_kind kind, const void *src,
                               enum qd_dtype dtype)
{
    pthread_mutex_lock(&emu_lock);
    emu_unbind_locked(host);
    emu.binds++;
    float *c = NULL;
    if (emu.n_bind == 128 || !emu_take((size_t)n * (kind == QD_NN_MATRIX ? 2 : 4)) ||
        !(c = malloc((size_t)n * sizeof *c))) {
        pthread_mutex_unlock(&emu_lock);
        return QD_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
        float v;
        if (dtype == QD_F32)
            memcpy(&v, (const char *)src + 4 * i, 4); /* (bits as they are: the positions are int32) */
        else {
            uint16_t h;
            memcpy(&h, (const char *)src + 2 * i, 2);
            v = dtype == QD_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
        }
        c[i] = kind == QD_NN_MATRIX ? qd_bf16_to_f32(qd_f32_to_bf16(v)) : v;
    }
    emu.bind[emu.n_bind].host = host, emu.bind[emu.n_bind].n = n, emu.bind[emu.n_bind].kind = kind;
    emu.bind[emu.n_bind++].copy = c;
    pthread_mutex_unlock(&emu_lock);
    return QD_OK;
}

/* the copy standing for host address p (inside a binding of this kind), or NULL */
static const float *emu_copy(const void *p, enum qd_nn_weight_kind kind)
{
    const float *c = NULL;
    pthread_mutex_lock(&emu_lock);
    for (int i = 0; i < emu.n_bind && !c; i++)
        if (emu.bind[i].kind == kind && (const float *)p >= emu.bind[i].host &&
            (const float *)p < emu.bind[i].host + emu.bind[i].n)
            c = emu.bind[i].copy + ((const float *)p - emu.bind[i].host);
    pthread_mutex_unlock(&emu_lock);
    return c;
}

static const float *emu_vec(const float *p)
{
    if (!p)
        return NULL;
    const float *c = emu_copy(p, QD_NN_VECTOR);
    if (!c)
        emu_fail("an op was handed a vector weight that was not bound");
    return c ? c : p;
}

static void emu_matmul(float *y, const float *x, const float *w, int64_t T, int64_t K, int64_t N)
{
    const float *wc = emu_copy(w, QD_NN_MATRIX);
    float *xb = malloc((size_t)(T * K) * sizeof *xb);
    if (!wc || !xb) {
        emu_fail(wc ? "no memory" : "a matmul was handed a weight that was not bound");
        free(xb);
        return;
    }
    for (int64_t i = 0; i < T * K; i++)
        xb[i] = qd_bf16_to_f32(qd_f32_to_bf16(x[i]));
    qd_nn_matmul(y, xb, wc, T, K, N);
    free(xb);
}

static void emu_add_row(float *y, const float *b, int64_t T, int64_t n) { qd_nn_add_row(y, emu_vec(b), T, n); }
static void emu_rms_norm(float *y, const float *x, const float *w, int64_t rows, int64_t n, float eps)
{
    qd_nn_rms_norm(y, x, emu_vec(w), rows, n, eps);
}
static void emu_layer_norm(float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t n, float eps)
{
    qd_nn_layer_norm(y, x, emu_vec(w), emu_vec(b), rows, n, eps);
}
static enum qd_status emu_rope(float *x, int64_t T, int64_t stride, int n_head, int head_dim, const int32_t *pos,
                               const struct qd_nn_rope *r)
{
    struct qd_nn_rope copy = *r;
    copy.freq_factors = emu_vec(r->freq_factors);
    return qd_nn_rope(x, T, stride, n_head, head_dim, (const int32_t *)emu_vec((const float *)pos), &copy);
}
static int64_t emu_first_nonfinite(const float *x, int64_t n) { return qd_nn_first_nonfinite(x, n); }
static size_t emu_peak(void) { return emu.peak; }
static void emu_to_host(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static const char *emu_error(void) { return emu.error[0] ? emu.error : NULL; }

static const struct qd_nn_backend emu_backend = {
    .name = "emulated device",
    .alloc = emu_alloc, .free = emu_free, .sync = emu_sync, .bind = emu_bind, .unbind = emu_unbind,
    .first_nonfinite = emu_first_nonfinite, .peak_bytes = emu_peak, .to_host = emu_to_host,
    .add_squares = qd_nn_add_squares, .error = emu_error,
    .matmul = emu_matmul, .add_row = emu_add_row, .add = qd_nn_add, .scale = qd_nn_scale, .softcap = qd_nn_softcap,
    .rms_norm = emu_rms_norm, .layer_norm = emu_layer_norm, .rope = emu_rope, .attention = qd_nn_attention,
    .glu = qd_nn_glu, .round = qd_nn_round, .moe_route = qd_nn_moe_route, .moe_sum = qd_nn_moe_sum,
    .sigmoid_gate = qd_nn_sigmoid_gate, .gather_rows = qd_nn_gather_rows, .scatter_rows = qd_nn_scatter_rows,
};

/* A fresh emulated device with `limit` bytes (0: none). */
static void emu_reset(size_t limit)
{
    for (int i = 0; i < emu.n_bind; i++)
        free(emu.bind[i].copy);
    for (int i = 0; i < emu.n_own; i++)
        free(emu.own[i].p);
    memset(&emu, 0, sizeof emu);
    emu.limit = limit;
}

#endif
