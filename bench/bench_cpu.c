/* make bench: CPU backend throughput for every format, quantize and dequantize, against a
 * memcpy of the same size measured in the same run; median of repeated runs. With
 * GGML_CPU_LIB=/path/libggml-cpu.so it also times ggml's own optimized CPU quantizers
 * (quantize_row_q4_0 / quantize_row_q8_0, split over the same threads) on the same tensor. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "../kernels/cpu/cpu.h"
#include "../kernels/fp.h"
#include "../kernels/quantize.h"

#define REPS 7


typedef void (*ggml_row_fn)(const float *x, void *y, int64_t k);
struct ggml_job {
    ggml_row_fn fn;
    const float *x;
    uint8_t *y;
    int64_t k, block_bytes;
};

static void *ggml_thread(void *arg)
{
    struct ggml_job *j = arg;
    j->fn(j->x, j->y, j->k);
    return NULL;
}

/* One run of ggml's row quantizer over halves (or n_threads parts) of the tensor. */
static double run_ggml(ggml_row_fn fn, const float *x, uint8_t *y, int64_t rows, int64_t cols,
                       int block_bytes, int threads)
{
    pthread_t th[QD_CPU_MAX_THREADS];
    struct ggml_job jobs[QD_CPU_MAX_THREADS];
    double t0 = now_s();
    for (int i = 0; i < threads; i++) {
        int64_t r0 = rows * i / threads, r1 = rows * (i + 1) / threads;
        jobs[i] = (struct ggml_job){fn, x + r0 * cols, y + r0 * cols / 32 * block_bytes,
                                    (r1 - r0) * cols, block_bytes};
        pthread_create(&th[i], NULL, ggml_thread, &jobs[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    int64_t rows = 4096, cols = 4096;
    if (argc > 1)
        rows = cols = atoll(argv[1]);
    int64_t n = rows * cols;
    int threads = qd_cpu_threads();
    float *x = malloc((size_t)n * 4);
    uint16_t *xb = malloc((size_t)n * 2);
    float *back = malloc((size_t)n * 4);
    uint8_t *copy = malloc((size_t)n * 4);
    uint64_t s = (uint64_t)time(NULL) | 1;
    for (int64_t i = 0; i < n; i++) { /* fresh non-zero data each run */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 4.0f;
        xb[i] = qd_f32_to_bf16(x[i]);
    }
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        memcpy(copy, x, (size_t)n * 4);
        t[r] = now_s() - t0;
    }
    double memcpy_gbs = n * 4 / median(t, REPS) / 1e9;
    printf("quantd CPU backend: %lld x %lld, %d threads, median of %d\n", (long long)rows,
           (long long)cols, threads, REPS);
    printf("memcpy of the f32 input (%lld MiB): %.2f GB/s\n\n", (long long)(n * 4 >> 20), memcpy_gbs);
    printf("%-12s %6s %12s %12s %14s %8s\n", "format", "input", "quant GB/s", "% memcpy",
           "dequant GB/s", "(out f32)");
    /* BENCH_JSON=FILE: the same figures for bench/plot_cpu.py */
    FILE *js = getenv("BENCH_JSON") ? fopen(getenv("BENCH_JSON"), "w") : NULL;
    if (js)
        fprintf(js, "{\"rows_cols\": [%lld, %lld], \"threads\": %d, \"reps\": %d, \"memcpy_gbs\": %.3f, \"rows\": [",
                (long long)rows, (long long)cols, threads, REPS, memcpy_gbs);
    int first_row = 1;
    for (int i = 0; i < qd_format_count; i++) {
        const struct qd_format *f = &qd_formats[i];
        for (int d = 0; d < 2; d++) {
            struct qd_tensor in = {.data = d ? (void *)xb : (void *)x, .dtype = d ? QD_BF16 : QD_F32};
            int64_t shape[2] = {rows, cols};
            qd_tensor_set_shape(&in, 2, shape);
            struct qd_params p;
            qd_params_default(f, &p);
            struct qd_component c[QD_MAX_COMPONENTS];
            char err[256];
            int nc = qd_format_layout(f, &p, &in, c, err, sizeof err);
            void *bufs[QD_MAX_COMPONENTS];
            for (int k = 0; k < nc; k++)
                bufs[k] = malloc((size_t)c[k].bytes);
            for (int r = 0; r < REPS; r++) {
                struct qd_params pr = p;
                double t0 = now_s();
                if (qd_quantize(QD_BACKEND_CPU, f, &in, &pr, bufs, err, sizeof err) != QD_OK) {
                    fprintf(stderr, "%s: %s\n", f->name, err);
                    return 1;
                }
                t[r] = now_s() - t0;
                if (r == REPS - 1)
                    p = pr;
            }
            double q = qd_tensor_numel(&in) * qd_dtype_size(in.dtype) / median(t, REPS) / 1e9;
            struct qd_tensor out = in;
            out.dtype = QD_F32;
            out.data = back;
            for (int r = 0; r < REPS; r++) {
                double t0 = now_s();
                qd_dequantize(QD_BACKEND_CPU, f, (const void *const *)bufs, &p, &out, err, sizeof err);
                t[r] = now_s() - t0;
            }
            double dq = n * 4 / median(t, REPS) / 1e9;
            printf("%-12s %6s %12.2f %11.0f%% %14.2f\n", f->name, qd_dtype_name(in.dtype), q,
                   100 * q / memcpy_gbs, dq);
            if (js)
                fprintf(js, "%s\n {\"fmt\": \"%s\", \"input\": \"%s\", \"quant_gbs\": %.3f, \"dequant_gbs\": %.3f}",
                        first_row ? "" : ",", f->name, qd_dtype_name(in.dtype), q, dq);
            first_row = 0;
            for (int k = 0; k < nc; k++)
                free(bufs[k]);
        }
    }
    if (js) {
        fprintf(js, "\n]}\n");
        fclose(js);
    }
    const char *lib = getenv("GGML_CPU_LIB");
    if (lib) {
        void *h = dlopen(lib, RTLD_NOW);
        if (!h) {
            fprintf(stderr, "cannot load %s: %s\n", lib, dlerror());
            return 1;
        }
        void (*init)(void) = (void (*)(void))dlsym(h, "ggml_cpu_init");
        if (init)
            init();
        printf("\nggml's optimized CPU quantizers (%s), f32 input, %d threads:\n", lib, threads);
        const char *names[] = {"quantize_row_q4_0", "quantize_row_q8_0"};
        const char *fmts[] = {"q4_0", "q8_0"};
        const int bytes[] = {18, 34};
        for (int i = 0; i < 2; i++) {
            ggml_row_fn fn = (ggml_row_fn)dlsym(h, names[i]);
            if (!fn)
                continue;
            struct qd_tensor in = {.data = x, .dtype = QD_F32};
            int64_t shape[2] = {rows, cols};
            qd_tensor_set_shape(&in, 2, shape);
            struct qd_params p;
            const struct qd_format *f = qd_format_find(fmts[i]);
            qd_params_default(f, &p);
            void *bufs[1] = {copy};
            char err[128];
            /* interleaved pairs, so both see the same machine state (this host is shared), in
             * alternating order (whichever runs second finds the other's output in cache); the
             * ratio is the median of the pairs' ratios, which drift on the host cancels */
            enum { PAIRS = 31 };
            double tgs[PAIRS], tqs[PAIRS], ratio[PAIRS];
            for (int r = 0; r < PAIRS; r++) {
                if (r % 2)
                    tgs[r] = run_ggml(fn, x, copy, rows, cols, bytes[i], threads);
                double t0 = now_s();
                qd_quantize(QD_BACKEND_CPU, f, &in, &p, bufs, err, sizeof err);
                tqs[r] = now_s() - t0;
                if (r % 2 == 0)
                    tgs[r] = run_ggml(fn, x, copy, rows, cols, bytes[i], threads);
                ratio[r] = tgs[r] / tqs[r];
            }
            double tg = median(tgs, PAIRS), tq = median(tqs, PAIRS), rq = median(ratio, PAIRS);
            printf("%-12s ggml %8.2f GB/s   quantd %8.2f GB/s   quantd/ggml %.2fx (median of %d pairs)\n",
                   fmts[i], n * 4 / tg / 1e9, n * 4 / tq / 1e9, rq, PAIRS);
        }
    }
    free(x);
    free(xb);
    free(back);
    free(copy);
    return 0;
}
