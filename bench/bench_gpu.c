/* GPU benchmark: every format's CUDA quantize and dequantize on 1024^2 to 16384^2 bf16 tensors
 * already on the device (median of several runs, CUDA events), GB/s counting bytes read +
 * written, and % of the device-to-device copy bandwidth measured in the same run; the pinned
 * host<->device copy ceiling the service path is bound by, and a whole 4096^2 request on the
 * device (H2D, kernels, D2H) against its copies alone. BENCH_JSON=FILE: the same as JSON.
 * `bench_gpu [FORMAT,FORMAT...] [SIDE]` runs those formats (every variant of each) at one size.
 * Needs a GPU: make bench-gpu. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cuda/cuda.h"
#include "../kernels/fp.h"
#include "../kernels/quantize.h"

#define RUNS 15

static int cmp(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Whether format name is in the comma-separated list (every format when there is none). */
static int picked(const char *list, const char *name)
{
    if (!list)
        return 1;
    size_t n = strlen(name);
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ',' || !p[n]))
            return 1;
    return 0;
}

static cudaStream_t stream;
static cudaEvent_t e0, e1;

/* Median ms of fn over RUNS (after one warm-up); `after` runs once the stream has. */
#define TIME_MS_THEN(out, after, ...)                                                           \
    do {                                                                                        \
        float t_[RUNS];                                                                         \
        for (int r_ = -1; r_ < RUNS; r_++) {                                                    \
            cudaEventRecord(e0, stream);                                                        \
            __VA_ARGS__;                                                                        \
            cudaEventRecord(e1, stream);                                                        \
            cudaEventSynchronize(e1);                                                           \
            after;                                                                              \
            if (r_ >= 0)                                                                        \
                cudaEventElapsedTime(&t_[r_], e0, e1);                                          \
        }                                                                                       \
        qsort(t_, RUNS, sizeof(float), cmp);                                                    \
        out = t_[RUNS / 2];                                                                     \
    } while (0)
#define TIME_MS(out, ...) TIME_MS_THEN(out, (void)0, __VA_ARGS__)

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL; /* some formats, comma-separated */
    int64_t only_side = argc > 2 ? atoll(argv[2]) : 0; /* one shape (for profilers) */
    struct qd_cuda_ctx ctx;
    if (qd_cuda_ctx_init(&ctx) != QD_OK) {
        fprintf(stderr, "no GPU: %s\n", qd_cuda_last_error());
        return 1;
    }
    qd_cuda_ctx_set(&ctx);
    stream = (cudaStream_t)ctx.stream;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    enum { NSIDES = 5 };
    const int64_t sides[NSIDES] = {1024, 2048, 4096, 8192, 16384};
    size_t max_in = (size_t)16384 * 16384 * 2;
    void *d_in, *d_out, *d_back, *h_pinned;
    if (cudaMalloc(&d_in, max_in) || cudaMalloc(&d_out, max_in) || cudaMalloc(&d_back, max_in) ||
        cudaMallocHost(&h_pinned, (size_t)64 << 20)) {
        fprintf(stderr, "out of device memory\n");
        return 1;
    }
    /* random bf16 input, made on the host once */
    uint16_t *h = malloc(max_in);
    unsigned seed = 12345;
    for (size_t i = 0; i < max_in / 2; i++)
        h[i] = qd_f32_to_bf16(((float)rand_r(&seed) / RAND_MAX - 0.5f) * 4.0f);
    cudaMemcpy(d_in, h, max_in, cudaMemcpyHostToDevice);
    free(h);

    printf("# %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    /* BENCH_JSON=FILE: the same figures as JSON, for bench/plot_gpu.py */
    FILE *js = getenv("BENCH_JSON") ? fopen(getenv("BENCH_JSON"), "w") : NULL;
    if (js)
        fprintf(js, "{\"device\": \"%s\", \"sms\": %d, \"copy_gbs\": {", prop.name, prop.multiProcessorCount);
    float ms;
    double copy_gbs[NSIDES];
    for (int s = 0; s < NSIDES; s++) {
        if (only_side && sides[s] != only_side)
            continue;
        size_t bytes = (size_t)sides[s] * sides[s] * 2;
        TIME_MS(ms, cudaMemcpyAsync(d_out, d_in, bytes, cudaMemcpyDeviceToDevice, stream));
        copy_gbs[s] = 2.0 * bytes / (ms * 1e6);
        printf("# device-to-device copy %lldx%lld bf16: %.3f ms, %.0f GB/s (read + write)\n",
               (long long)sides[s], (long long)sides[s], ms, copy_gbs[s]);
        if (js)
            fprintf(js, "%s\"%lld\": %.1f", s && !only_side ? ", " : "", (long long)sides[s], copy_gbs[s]);
    }
    if (js)
        fprintf(js, "}, ");
    int nrows = 0;
    size_t pb = (size_t)64 << 20;
    /* (the copies below land in d_back, a scratch buffer: the random input stays as made) */
    TIME_MS(ms, cudaMemcpyAsync(d_back, h_pinned, pb, cudaMemcpyHostToDevice, stream));
    double h2d = pb / (ms * 1e6);
    TIME_MS(ms, cudaMemcpyAsync(h_pinned, d_out, pb, cudaMemcpyDeviceToHost, stream));
    printf("# pinned 64 MiB copies: H2D %.1f GB/s, D2H %.1f GB/s\n", h2d, pb / (ms * 1e6));

    /* A request as the service runs it on the device: a 4096^2 bf16 tensor from pinned memory,
     * H2D, the kernels, the components back (D2H), against those two copies alone. */
    if (js)
        fprintf(js, "\"request_4096\": [");
    for (int r = 0, written = 0; r < 3 && !only_side; r++) {
        const char *rf[3] = {"q8_0", "nvfp4", "nf4"};
        const struct qd_format *f = qd_format_find(rf[r]);
        if (!picked(only, f->name))
            continue;
        /* the pinned bytes copied in are the tensor: random ones, the input's first 32 MiB */
        struct qd_tensor in = {.data = d_back, .dtype = QD_BF16};
        int64_t dims[2] = {4096, 4096};
        qd_tensor_set_shape(&in, 2, dims);
        size_t in_bytes = (size_t)4096 * 4096 * 2, out_bytes = 0, off = 0;
        struct qd_params p0, p;
        char err[512];
        qd_params_default(f, &p0);
        struct qd_component comps[QD_MAX_COMPONENTS];
        int nc = qd_format_layout(f, &p0, &in, comps, err, sizeof err);
        void *out[QD_MAX_COMPONENTS];
        for (int i = 0; i < nc; i++) {
            out[i] = (char *)d_out + off;
            off += ((size_t)comps[i].bytes + 255) & ~(size_t)255;
            out_bytes += (size_t)comps[i].bytes;
        }
        char *hin = h_pinned, *hout = (char *)h_pinned + in_bytes;
        cudaMemcpy(hin, d_in, in_bytes, cudaMemcpyDeviceToHost);
        float copies_ms, req_ms;
        enum qd_status st = QD_OK;
        TIME_MS(copies_ms, cudaMemcpyAsync(d_back, hin, in_bytes, cudaMemcpyHostToDevice, stream);
                cudaMemcpyAsync(hout, d_out, out_bytes, cudaMemcpyDeviceToHost, stream));
        TIME_MS_THEN(req_ms, st = st ? st : qd_quantize_finish(QD_BACKEND_CUDA, &p, err, sizeof err),
                     p = p0; cudaMemcpyAsync(d_back, hin, in_bytes, cudaMemcpyHostToDevice, stream);
                     st = qd_quantize(QD_BACKEND_CUDA, f, &in, &p, out, err, sizeof err);
                     cudaMemcpyAsync(hout, d_out, out_bytes, cudaMemcpyDeviceToHost, stream));
        printf("# request on the device, %s 4096x4096 bf16 from pinned memory: %.3f ms (H2D + D2H alone %.3f ms: "
               "%.0f %%)%s\n", f->name, req_ms, copies_ms, 100.0 * copies_ms / req_ms, st ? " error" : "");
        if (js)
            fprintf(js, "%s{\"fmt\": \"%s\", \"ms\": %.4f, \"copies_ms\": %.4f}", written++ ? ", " : "", f->name,
                    req_ms, copies_ms);
    }
    if (js)
        fprintf(js, "], \"rows\": [");

    printf("\n| format | params | shape | quantize ms | GB/s | %% copy | dequantize ms | GB/s | %% copy |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    struct variant {
        const char *fmt, *key, *value, *label;
        int passes; /* reads of the input the arithmetic needs */
    } variants[] = { /* key and value may list several parameters, comma-separated */
        {"nf4", NULL, NULL, "bs64 dq", 1}, {"fp4", NULL, NULL, "bs64 dq", 1},
        /* where nf4's time goes: the double quant given its offset (no mean over the tensor), and none */
        {"nf4", "offset", "0.01", "bs64 dq, offset given", 1}, {"nf4", "double_quant", "false", "bs64", 1},
        {"q4_0", NULL, NULL, "", 1},
        {"q4_1", NULL, NULL, "", 1}, {"q5_0", NULL, NULL, "", 1}, {"q5_1", NULL, NULL, "", 1},
        {"q8_0", NULL, NULL, "", 1}, {"q8_1", NULL, NULL, "", 1}, {"q2_K", NULL, NULL, "", 1},
        {"q3_K", NULL, NULL, "", 1}, {"q4_K", NULL, NULL, "", 1}, {"q5_K", NULL, NULL, "", 1},
        {"q6_K", NULL, NULL, "", 1}, {"iq3_s", NULL, NULL, "", 1}, {"awq", NULL, NULL, "g128", 1},
        {"w4a16", NULL, NULL, "g128", 1}, {"w4a16", "symmetric", "false", "g128 asym", 1}, {"w8a16", NULL, NULL, "g128", 1},
        {"nvfp4", NULL, NULL, "swizzled, amax pass", 2}, {"nvfp4", "global_scale", "500", "global_scale given", 1},
        {"nvfp4", "scale_layout", "linear", "linear, amax pass", 2}, {"nvfp4", "flow", "compressed_tensors",
        "llm-compressor, amax pass", 2}, {"mxfp4", NULL, NULL, "", 1}, {"mxfp4", "scale_rounding", "even", "llm-compressor", 1},
        {"mxfp6_e2m3", NULL, NULL, "", 1}, {"mxfp6_e3m2", NULL, NULL, "", 1}, {"mxfp8_e4m3", NULL, NULL, "", 1},
        {"mxfp8_e5m2", NULL, NULL, "", 1}, {"int8", NULL, NULL, "per tensor", 2}, {"int8", "granularity", "row", "per row", 1},
        {"uint8", NULL, NULL, "per tensor", 2}, {"uint8", "granularity", "row", "per row", 1},
        {"mlx_affine", NULL, NULL, "4-bit g64", 1}, {"mlx_affine", "bits", "3", "3-bit g64", 1},
        {"mlx_affine", "bits", "8", "8-bit g64", 1}, {"mlx_mxfp4", NULL, NULL, "", 1},
        {"mlx_nvfp4", NULL, NULL, "", 1}, {"mlx_nvfp4", "global_scale", "2.5", "global_scale given", 1},
        {"mlx_mxfp8", NULL, NULL, "", 1},
        {"fp8_e4m3", NULL, NULL, "channel, llm-compressor", 1},
        {"fp8_e4m3", "granularity", "block", "block 128x128, llm-compressor", 1},
        {"fp8_e4m3", "granularity", "tensor", "tensor, llm-compressor, amax pass", 2},
        {"fp8_e4m3", "flow,granularity", "transformers,block", "block 128x128, transformers", 1},
        {"w8a8", NULL, NULL, "channel", 1},
        /* ggml's importance-weighted searches, as llama-quantize --imatrix runs them (key
         * "importance": a vector of cols values, made here) */
        {"q2_K", "importance", "", "importance", 1}, {"q3_K", "importance", "", "importance", 1},
        {"q4_K", "importance", "", "importance", 1}, {"q5_K", "importance", "", "importance", 1},
        {"q6_K", "importance", "", "importance", 1}, {"iq4_nl", "importance", "", "importance", 1},
        {"iq4_xs", "importance", "", "importance", 1}, {"iq3_s", "importance", "", "importance", 1},
        {"iq3_xxs", "importance", "", "importance", 1}, {"iq2_s", "importance", "", "importance", 1},
        {"iq2_xs", "importance", "", "importance", 1}, {"iq2_xxs", "importance", "", "importance", 1},
        {"iq1_s", "importance", "", "importance", 1}, {"iq1_m", "importance", "", "importance", 1},
    };
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const struct qd_format *f = qd_format_find(variants[v].fmt);
        if (!picked(only, f->name))
            continue;
        for (int s = 0; s < NSIDES; s++) {
            if (only_side && sides[s] != only_side)
                continue;
            struct qd_tensor in = {.data = d_in, .dtype = QD_BF16};
            int64_t dims[2] = {sides[s], sides[s]};
            qd_tensor_set_shape(&in, 2, dims);
            struct qd_params p0;
            char err[512];
            qd_params_default(f, &p0);
            float *imp = NULL;
            if (variants[v].key && !strcmp(variants[v].key, "importance")) {
                /* positive weights that vary along the row, as an imatrix's mean x^2 does */
                imp = malloc((size_t)sides[s] * sizeof(float));
                unsigned iseed = 777;
                for (int64_t c = 0; c < sides[s]; c++)
                    imp[c] = 0.05f + (float)rand_r(&iseed) / RAND_MAX;
                p0.importance = imp;
                p0.importance_n = sides[s];
            } else if (variants[v].key) {
                char keys[128], values[128], *ks, *vs;
                snprintf(keys, sizeof keys, "%s", variants[v].key);
                snprintf(values, sizeof values, "%s", variants[v].value);
                for (char *k = strtok_r(keys, ",", &ks), *val = strtok_r(values, ",", &vs); k && val;
                     k = strtok_r(NULL, ",", &ks), val = strtok_r(NULL, ",", &vs))
                    qd_params_set(f, &p0, k, val, err, sizeof err);
            }
            struct qd_component comps[QD_MAX_COMPONENTS];
            int nc = qd_format_layout(f, &p0, &in, comps, err, sizeof err);
            void *out[QD_MAX_COMPONENTS];
            size_t off = 0, out_bytes = 0;
            for (int i = 0; i < nc; i++) {
                out[i] = (char *)d_out + off;
                off += ((size_t)comps[i].bytes + 255) & ~(size_t)255;
                out_bytes += (size_t)comps[i].bytes;
            }
            struct qd_params p = p0;
            enum qd_status st = QD_OK;
            float q_ms, d_ms;
            /* the quantize's result check (qd_quantize_finish) after the stream has run, as the
             * service's worker makes it: the timed span is the device's */
            TIME_MS_THEN(q_ms, st = st ? st : qd_quantize_finish(QD_BACKEND_CUDA, &p, err, sizeof err),
                         p = p0; st = qd_quantize(QD_BACKEND_CUDA, f, &in, &p, out, err, sizeof err));
            if (st != QD_OK) {
                printf("| %s | %s | error: %s |\n", f->name, variants[v].label, err);
                free(imp);
                continue;
            }
            struct qd_tensor back = in;
            back.data = d_back;
            TIME_MS(d_ms, st = qd_dequantize(QD_BACKEND_CUDA, f, (const void *const *)out, &p, &back, err, sizeof err));
            size_t in_bytes = (size_t)qd_tensor_numel(&in) * 2;
            double qgbs = (variants[v].passes * in_bytes + out_bytes) / (q_ms * 1e6),
                   dgbs = (in_bytes + out_bytes) / (d_ms * 1e6);
            printf("| %s | %s | %lldx%lld | %.3f | %.0f | %.0f %% | %.3f | %.0f | %.0f %% |\n", f->name,
                   variants[v].label, (long long)sides[s], (long long)sides[s], q_ms, qgbs,
                   100 * qgbs / copy_gbs[s], d_ms, dgbs, 100 * dgbs / copy_gbs[s]);
            fflush(stdout);
            if (js)
                fprintf(js, "%s\n {\"fmt\": \"%s\", \"params\": \"%s\", \"side\": %lld, \"quantize_ms\": %.4f, "
                        "\"quantize_gbs\": %.1f, \"quantize_pct\": %.1f, \"dequantize_ms\": %.4f, "
                        "\"dequantize_gbs\": %.1f, \"dequantize_pct\": %.1f}",
                        nrows++ ? "," : "", f->name, variants[v].label, (long long)sides[s], q_ms, qgbs,
                        100 * qgbs / copy_gbs[s], d_ms, dgbs, 100 * dgbs / copy_gbs[s]);
            free(imp);
        }
    }
    if (js) {
        fprintf(js, "\n]}\n");
        fclose(js);
    }
    return 0;
}
