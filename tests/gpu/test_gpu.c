/* GPU vs CPU: for every format x input dtype x shape (tiny, odd, up to 256 MiB), the CUDA
 * backend's bytes equal the CPU backend's, resolved params included; dequantize of those bytes
 * equal too, for every output dtype. Fresh random data each run, outputs poisoned before each.
 * Runs through the same worker code the service uses (server/backend_cuda.c). Needs a GPU:
 * make test-gpu. QUANTD_GPU_SMALL=1 leaves out the big shapes (for compute-sanitizer). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../kernels/ctint.h"
#include "../../kernels/cuda/cuda.h"
#include "../../kernels/quantize.h"
#include "../../server/queue/backend.h"

static struct qd_backend cpu, gpu;
static void *cpu_worker, *gpu_worker;
static unsigned seed;

static int setup(void **state)
{
    char err[256];
    if (qd_backend_cuda_open(&gpu, NULL, err, sizeof err))
        fail_msg("no GPU: %s", err);
    qd_backend_cpu_open(&cpu, err, sizeof err);
    char name[32];
    gpu_worker = gpu.worker_open(&gpu, 0, name, sizeof name, err, sizeof err);
    cpu_worker = cpu.worker_open(&cpu, 0, name, sizeof name, err, sizeof err);
    assert_non_null(gpu_worker);
    seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("# random seed %u, device %s\n", seed, gpu.info);
    return 0;
}

static int teardown(void **state)
{
    gpu.worker_close(gpu_worker);
    gpu.close(&gpu);
    return 0;
}

/* Instead of random data: 1 = multiples of 1/2 in [-127, 127] (int8's scale is 1 there, every
 * other value a tie), 2 = in [0, 255] (uint8's), 3 = ((row + col) % 31) / 2 (AWQ's scale is 1
 * in every group-column of 32+ rows), 4 = small values with some columns of one value: 1e30,
 * +-3e38 (f16: +-65504), 1e-38 or 0 (AWQ refuses the first three as f16 overflow: compared
 * with allow_nonfinite, its division path), 5 = tiny values, up to +-2.4e-4 in odd columns
 * and +-4.5e-6 in even ones (AWQ's f16 weights and scales subnormal; in the even columns the
 * halving to f16 changes bf16 and f32 weights), 6 = ggml's hard rows (ggml_hard_value) */
static int pattern;
static int64_t pattern_cols;

/* Row r % 16 of the ggml hard rows, the kind tests/fixtures/make_imatrix_fixtures.py plants
 * for ggml itself, for the types' searches (the IQ grids' neighbour lists above all): zeros, an
 * outlier, subnormals, tiny runs in zeros, a zero super-block beside a plain one, a constant, a
 * loud block, maxima one ulp below a power of two, scales past f16's range, one zero 32-block
 * in each super-block and every other one zero (iq3_s writes the next sub-block's codes in a
 * zero one's place), values near f32's largest (every grid distance overflows), half-integers,
 * all negative, -0.0 with one value; the rest a deterministic spread (k). */
static float ggml_hard_value(int64_t i, int64_t cols)
{
    const int64_t r = i / cols % 16, c = i % cols, k = i * 7919 % 509 - 254;
    const float spread = (float)k * 0.01f;
    switch (r) {
    case 0: return 0.0f;
    case 1: return c == 77 ? 30.0f : spread * 0.01f;
    case 2: return spread * 1e-40f;
    case 3: return c >= 40 && c < 44 ? 1e-6f : c >= 300 && c < 310 ? -3e-7f : 0.0f;
    case 4: return c < 256 ? 0.0f : spread;
    case 5: return 0.01f;
    case 6: return c >= 128 && c < 160 ? spread * -50.0f : spread;
    case 7: return c % 32 == 0 ? ldexpf(2.0f - 0x1p-23f, (int)(c / 32 % 16) - 10) : spread * 1e-3f;
    case 8: return spread * 3e4f;
    case 9: return c % 256 / 32 == 3 ? 0.0f : spread;
    case 10: return c % 2 ? (float)k / 254.0f * 3.4e38f : spread;
    case 11: return c / 32 % 2 ? 0.0f : spread;
    case 12: return (float)(k % 31 - 15) * 0.5f;
    case 13: return -qd_absf(spread) - 1e-3f;
    case 14: return c == 5 ? 0.5f : -0.0f;
    default: return spread;
    }
}

/* Random values with a spread of magnitudes, some zero blocks and outliers (or a pattern). */
static void fill(void *data, enum qd_dtype dt, int64_t n)
{
    float scale = (float)ldexp(1.0, (int)(rand_r(&seed) % 20) - 10);
    for (int64_t i = 0; i < n; i++) {
        float v = 0;
        if (pattern) {
            int64_t k = i * 7919;
            int64_t col = i % pattern_cols;
            v = pattern == 1   ? (float)(i == 0 ? -254 : k % 509 - 254) * 0.5f
                : pattern == 2 ? (float)(i == 0 ? 510 : k % 511) * 0.5f
                : pattern == 3 ? (float)((i / pattern_cols + col) % 31) * 0.5f
                : pattern == 5 ? (float)(k % 509 - 254) * (col % 2 ? 0x1p-20f : 0x1.3p-26f)
                : pattern == 6 ? ggml_hard_value(i, pattern_cols)
                : col % 16 == 3  ? 1e30f
                : col % 16 == 5  ? -3e38f
                : col % 16 == 9  ? 3e38f
                : col % 16 == 12 ? 1e-38f
                : col % 16 == 14 ? 0.0f
                                 : (float)(k % 509 - 254) * 0.01f;
            if (dt == QD_F16 && qd_absf(v) > 65504.0f) /* f16's largest instead: finite */
                v = v < 0 ? -65504.0f : 65504.0f;
            if (dt == QD_BF16 && qd_absf(v) > 0x1.fep127f) /* bf16's largest: 3.4e38 rounds to Inf there */
                v = v < 0 ? -0x1.fep127f : 0x1.fep127f;
            if (dt == QD_F32)
                ((float *)data)[i] = v;
            else
                ((uint16_t *)data)[i] = dt == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
            continue;
        }
        for (int k = 0; k < 3; k++)
            v += (float)rand_r(&seed) / RAND_MAX - 0.5f;
        v *= scale;
        if (rand_r(&seed) % 211 == 0)
            v *= 50;
        if ((i / 64) % 97 == 5) /* a zero block now and then */
            v = 0;
        if ((i / 64) % 89 == 7) /* and a block of subnormals (f32, bf16; zeros in f16) */
            v *= 1e-40f;
        if (dt == QD_F32)
            ((float *)data)[i] = v;
        else if (dt == QD_F16)
            ((uint16_t *)data)[i] = qd_f32_to_f16(v);
        else
            ((uint16_t *)data)[i] = qd_f32_to_bf16(v);
    }
}

struct shape {
    int64_t rows, cols;
    int big; /* 1: f32 only, 2: every dtype; neither under QUANTD_GPU_SMALL */
};
/* 1024 x 8200: more tiles than resident CTAs (kernels that walk tiles), a partial last tile */
static const struct shape shapes[] = {{1, 32, 0},     {3, 96, 0},     {7, 160, 0},     {1, 77777, 0},
                                      {128, 256, 0},  {256, 1024, 0}, {384, 4104, 0},  {1000, 4096, 0},
                                      {1024, 8200, 2}, {8192, 8192, 1}};

static int64_t cases, skipped, nonfinite_mismatches, awq_f16_overflows, nonfinite_variant_cases;

/* 1: quantize with an importance vector (random, a zero column in 7 and a zero 32-block now and
 * then); 2: the same on a [2, rows/2, cols] tensor with one vector per matrix; 3: two vectors on
 * the 2-D tensor (two runs of rows/2 rows). The GPU must run its own weighted kernels (not the
 * CPU fallback). */
static int importance_case;

/* Dequantized outputs: the same bits, or NaN in both (0 * inf from a scale that overflowed to
 * inf is the hardware's NaN: x86 sets the sign, the GPU does not; docs/formats.md). */
static int same_values(const void *a, const void *b, int64_t n, enum qd_dtype dt)
{
    if (!memcmp(a, b, (size_t)n * qd_dtype_size(dt)))
        return 1;
    for (int64_t i = 0; i < n; i++) {
        uint32_t x, y, nan_exp = dt == QD_F32 ? 0x7f800000u : dt == QD_F16 ? 0x7c00u : 0x7f80u;
        uint32_t mask = dt == QD_F32 ? 0x7fffffffu : 0x7fffu;
        if (dt == QD_F32)
            x = ((const uint32_t *)a)[i], y = ((const uint32_t *)b)[i];
        else
            x = ((const uint16_t *)a)[i], y = ((const uint16_t *)b)[i];
        if (x != y && !((x & mask) > nan_exp && (y & mask) > nan_exp))
            return 0;
    }
    return 1;
}

/* The components of a CPU and a GPU run of the same case, and their shared input. */
static void free_pair(struct qd_work *wc, struct qd_work *wg)
{
    for (int i = 0; i < wc->nc; i++) {
        free(wc->comp[i]);
        free(wg->comp[i]);
    }
    free(wc->in.data);
}

/* Whether name is one of the comma-separated list's entries (QUANTD_GPU_ONLY, _FORMATS) */
static int listed(const char *list, const char *name)
{
    const size_t len = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += len)
        if ((p == list || p[-1] == ',') && (p[len] == ',' || p[len] == '\0'))
            return 1;
    return 0;
}

/* QUANTD_GPU_FORMATS=name,name: the cases of those formats alone (a kernel's change checked on
 * the device without the whole suite's time); unset: every format. */
static int format_on(const struct qd_format *f)
{
    const char *only = getenv("QUANTD_GPU_FORMATS");
    return !only || !*only || listed(only, f->name);
}

static void one_case(const struct qd_format *f, enum qd_dtype dt, const struct shape *sh, int nonfinite)
{
    if (!format_on(f))
        return;
    struct qd_work wc, wg;
    memset(&wc, 0, sizeof wc);
    wc.req.op = QD_OP_QUANTIZE;
    wc.f = f;
    qd_params_default(f, &wc.p);
    if (nonfinite == 2) { /* NaN/Inf allowed: the kernels' non-finite block paths */
        int offered = 0;  /* (a format without the parameter, the K-quants, always refuses) */
        for (const char *const *q = f->params; *q; q++)
            offered |= !strcmp(*q, "allow_nonfinite");
        if (!offered)
            return;
        wc.p.allow_nonfinite = 1;
    }
    int64_t dims[2] = {sh->rows, sh->cols}, dims3[3] = {2, sh->rows / 2, sh->cols};
    wc.in.dtype = dt;
    /* a format that quantizes only with an importance (iq2_xxs, iq2_xs) gets one vector always */
    const int imp = importance_case ? importance_case : f->importance_required;
    if (imp == 2)
        qd_tensor_set_shape(&wc.in, 3, dims3);
    else
        qd_tensor_set_shape(&wc.in, sh->rows == 1 ? 1 : 2, sh->rows == 1 ? dims + 1 : dims);
    float *importance = NULL;
    if (imp) {
        wc.p.importance_n = sh->cols * (imp >= 2 ? 2 : 1);
        wc.p.importance = importance = malloc((size_t)wc.p.importance_n * sizeof(float));
        for (int64_t i = 0; i < wc.p.importance_n; i++)
            importance[i] = rand_r(&seed) % 7 == 0 || (i / 32) % 13 == 4 ? 0.0f
                                                                          : (float)(rand_r(&seed) % 4096) / 256.0f;
    }
    char err[512], err2[512];
    wc.nc = qd_format_layout(f, &wc.p, &wc.in, wc.comps, err, sizeof err);
    if (wc.nc < 0) {
        skipped++;
        return;
    }
    int64_t n = qd_tensor_numel(&wc.in);
    wc.in.data = malloc((size_t)n * qd_dtype_size(dt));
    fill(wc.in.data, dt, n);
    if (nonfinite) { /* bad elements: both backends name the first (or, allowed, agree) */
        int64_t at[4] = {n / 3, n - 1, n / 5, n / 2};
        for (int k = 0; k < (nonfinite == 2 ? 4 : 2); k++) {
            int kind = k % 3; /* NaN, +Inf, -Inf */
            if (dt == QD_F32)
                ((float *)wc.in.data)[at[k]] = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
            else
                ((uint16_t *)wc.in.data)[at[k]] = dt == QD_F16 ? (kind == 0 ? 0x7e00 : kind == 1 ? 0x7c00 : 0xfc00)
                                                               : (kind == 0 ? 0x7fc0 : kind == 1 ? 0x7f80 : 0xff80);
        }
    }
    wg = wc;
    for (int i = 0; i < wc.nc; i++) {
        wc.comp[i] = malloc((size_t)wc.comps[i].bytes + 1);
        wg.comp[i] = malloc((size_t)wc.comps[i].bytes + 1);
        memset(wc.comp[i], 0x5a, (size_t)wc.comps[i].bytes);
        memset(wg.comp[i], 0xa5, (size_t)wc.comps[i].bytes);
    }
    enum qd_status sc = cpu.run(cpu_worker, &wc, err, sizeof err);
    enum qd_status sg = gpu.run(gpu_worker, &wg, err2, sizeof err2);
    if (sc != sg || (sc != QD_OK && strcmp(err, err2)))
        fail_msg("%s %s %lldx%lld: cpu %d '%s' vs gpu %d '%s'", f->name, qd_dtype_name(dt), (long long)sh->rows,
                 (long long)sh->cols, sc, err, sg, err2);
    if (sc == QD_ENONFINITE && !nonfinite && (strstr(err, "overflows f16") || strstr(err, "overflows the weight's"))) {
        /* AWQ's f16 overflow (a huge column), or an infinite compressed-tensors MX scale, named
         * alike: then the bytes with it allowed */
        wc.p.allow_nonfinite = wg.p.allow_nonfinite = 1;
        sc = cpu.run(cpu_worker, &wc, err, sizeof err);
        sg = gpu.run(gpu_worker, &wg, err2, sizeof err2);
        if (sc != QD_OK || sg != QD_OK)
            fail_msg("%s allowed: cpu '%s' gpu '%s'", f->name, err, err2);
        awq_f16_overflows++;
    }
    cases++;
    /* the worker's fallback names itself: a format with CUDA kernels must run them */
    if ((importance_case || f->backend[QD_BACKEND_CUDA].quantize) && !strcmp(wg.backend, "cpu"))
        fail_msg("%s%s ran on the CPU, not the GPU's kernels", f->name, importance_case ? " with importance" : "");
    if (nonfinite == 1) {
        assert_int_equal(sc, QD_ENONFINITE);
        goto done;
    }
    assert_int_equal(sc, QD_OK);
    assert_memory_equal(&wc.p, &wg.p, sizeof wc.p);
    for (int i = 0; i < wc.nc; i++)
        if (memcmp(wc.comp[i], wg.comp[i], (size_t)wc.comps[i].bytes)) {
            size_t k = 0;
            while (((uint8_t *)wc.comp[i])[k] == ((uint8_t *)wg.comp[i])[k])
                k++;
            if (nonfinite) { /* report every format before failing */
                printf("# DIFFERS: %s %s component %s at byte %zu (cpu %02x gpu %02x)\n", f->name, qd_dtype_name(dt),
                       wc.comps[i].name, k, ((uint8_t *)wc.comp[i])[k], ((uint8_t *)wg.comp[i])[k]);
                nonfinite_mismatches++;
                continue;
            }
            fail_msg("%s %s %lldx%lld: component %s differs first at byte %zu (cpu %02x gpu %02x)", f->name,
                     qd_dtype_name(dt), (long long)sh->rows, (long long)sh->cols, wc.comps[i].name, k,
                     ((uint8_t *)wc.comp[i])[k], ((uint8_t *)wg.comp[i])[k]);
        }
    if (nonfinite)
        goto done; /* NaN components dequantize to NaNs whose payloads the two hardwares pick */
    /* dequantize the CPU's components on both, for each output dtype */
    for (int od = QD_F32; od <= QD_BF16; od++) {
        struct qd_work dc = wc, dg;
        dc.req.op = QD_OP_DEQUANTIZE;
        dc.in_owned = NULL;
        dc.out = wc.in;
        dc.out.dtype = (enum qd_dtype)od;
        size_t ob = (size_t)n * qd_dtype_size((enum qd_dtype)od);
        dc.out.data = malloc(ob);
        memset(dc.out.data, 0x5a, ob);
        dg = dc;
        dg.out.data = malloc(ob);
        memset(dg.out.data, 0xa5, ob);
        assert_int_equal(cpu.run(cpu_worker, &dc, err, sizeof err), QD_OK);
        if (gpu.run(gpu_worker, &dg, err2, sizeof err2) != QD_OK)
            fail_msg("gpu dequantize %s: %s", f->name, err2);
        if (!same_values(dc.out.data, dg.out.data, n, (enum qd_dtype)od))
            fail_msg("%s %s %lldx%lld: dequantize to %s differs", f->name, qd_dtype_name(dt), (long long)sh->rows,
                     (long long)sh->cols, qd_dtype_name((enum qd_dtype)od));
        free(dc.out.data);
        free(dg.out.data);
    }
done:
    free_pair(&wc, &wg);
    free(importance);
}

static void gpu_bytes_equal_cpu_bytes_for_every_format(void **state)
{
    int small = getenv("QUANTD_GPU_SMALL") != NULL;
    for (int fi = 0; fi < qd_format_count; fi++) {
        const struct qd_format *f = &qd_formats[fi];
        if (!format_on(f))
            continue;
        int64_t before = cases;
        for (int dt = QD_F32; dt <= QD_BF16; dt++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                if (!(shapes[s].big && (small || (shapes[s].big == 1 && dt != QD_F32))))
                    one_case(f, (enum qd_dtype)dt, &shapes[s], 0);
        printf("# %-12s %lld cases equal\n", f->name, (long long)(cases - before));
        fflush(stdout);
    }
}

/* ggml's importance-weighted searches (q4_0 .. q5_1, the K-quants, iq4_nl/iq4_xs, iq2_*) and the types
 * that read and ignore it: GPU bytes equal CPU bytes, with one vector and one per matrix of a 3-D
 * tensor (and two runs of a 2-D one), on every input dtype, and NaN/Inf named alike. */
static void gpu_equals_cpu_with_importance(void **state)
{
    int small = getenv("QUANTD_GPU_SMALL") != NULL;
    for (int fi = 0; fi < qd_format_count; fi++) {
        const struct qd_format *f = &qd_formats[fi];
        if (!(f->importance & QD_IMPORTANCE_ON(QD_BACKEND_CUDA)) || !format_on(f))
            continue;
        int64_t before = cases;
        for (importance_case = 1; importance_case <= 3; importance_case++)
            for (int dt = QD_F32; dt <= QD_BF16; dt++)
                for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                    if (!shapes[s].big || (!small && dt == QD_F32 && shapes[s].big == 2))
                        if (importance_case == 1 || shapes[s].rows % 2 == 0)
                            one_case(f, (enum qd_dtype)dt, &shapes[s], 0);
        importance_case = 1;
        one_case(f, QD_F32, &shapes[5], 1);
        importance_case = 0;
        printf("# %-12s %lld cases equal with importance\n", f->name, (long long)(cases - before));
        fflush(stdout);
    }
}

/* Values on the half-integers of the scale (ties of round half to even) for every format, so
 * the kernels' fast rounding of quotients meets the cases it hands to the division; then
 * columns of one huge, tiny or zero value (pattern 4). */
static void gpu_equals_cpu_on_ties(void **state)
{
    const struct shape sh = {256, 1024, 0};
    pattern_cols = sh.cols;
    for (pattern = 1; pattern <= 5; pattern++)
        for (int fi = 0; fi < qd_format_count; fi++)
            for (int dt = QD_F32; dt <= QD_BF16; dt++)
                one_case(&qd_formats[fi], (enum qd_dtype)dt, &sh, 0);
    pattern = 0;
}

/* ggml's hard rows (pattern 6) for every format that reads an importance on the GPU (the legacy,
 * K and IQ types), with none, one vector and one per matrix: GPU bytes equal CPU bytes. */
static void gpu_equals_cpu_on_ggml_hard_rows(void **state)
{
    const struct shape sh = {32, 1024, 0};
    pattern_cols = sh.cols;
    pattern = 6;
    for (int fi = 0; fi < qd_format_count; fi++) {
        const struct qd_format *f = &qd_formats[fi];
        if (!(f->importance & QD_IMPORTANCE_ON(QD_BACKEND_CUDA)) || !format_on(f))
            continue;
        int64_t before = cases;
        for (importance_case = 0; importance_case <= 2; importance_case++)
            for (int dt = QD_F32; dt <= QD_BF16; dt++)
                one_case(f, (enum qd_dtype)dt, &sh, 0);
        printf("# %-12s %lld cases equal on ggml's hard rows\n", f->name, (long long)(cases - before));
        fflush(stdout);
    }
    importance_case = 0;
    pattern = 0;
}

/* After a failed pattern test too: the tests after it use random data. */
static int random_data_again(void **state)
{
    pattern = 0;
    importance_case = 0;
    return 0;
}

static void gpu_names_the_first_nonfinite_element_like_the_cpu(void **state)
{
    for (int fi = 0; fi < qd_format_count; fi++)
        for (int dt = QD_F32; dt <= QD_BF16; dt++)
            one_case(&qd_formats[fi], (enum qd_dtype)dt, &shapes[5], 1);
}

/* With allow_nonfinite the blocks holding NaN/Inf take the kernels' reference paths: the
 * bytes still equal the CPU's. */
static void gpu_equals_cpu_on_allowed_nonfinite_input(void **state)
{
    for (int fi = 0; fi < qd_format_count; fi++)
        for (int dt = QD_F32; dt <= QD_BF16; dt++)
            one_case(&qd_formats[fi], (enum qd_dtype)dt, &shapes[5], 2);
    assert_int_equal(nonfinite_mismatches, 0);
}

static void gpu_params_variants(void **state)
{
    /* the non-default parameter paths: linear scales, rceil, unpacked fp6, given scales, rows */
    const char *variants[][3] = {{"nvfp4", "scale_layout", "linear"}, {"nvfp4", "two_level", "false"},
                                 {"nvfp4", "global_scale", "123.5"}, {"mxfp4", "scale_rounding", "rceil"},
                                 {"mxfp6_e3m2", "fp6_packing", "unpacked"}, {"mxfp8_e5m2", "scale_layout", "linear"},
                                 {"int8", "granularity", "row"}, {"uint8", "granularity", "row"},
                                 {"nf4", "double_quant", "false"}, {"fp4", "blocksize", "4096"},
                                 {"nf4", "offset", "0.25"}, {"awq", "group_size", "64"},
                                 {"awq", "group_size", "32"}, {"awq", "group_size", "256"},
                                 {"w4a16", "symmetric", "false"}, {"w4a16", "group_size", "32"},
                                 {"w8a16", "symmetric", "false"},
                                 {"nf4", "blocksize", "32"}, {"fp4", "blocksize", "512"},
                                 /* scale 1: bf16 block maxima land on e4m3 ties of amax / 6 (the
                                  * kernel's division path); 2e-38: 1 / (6 pts) is subnormal (the
                                  * multiply path is off); 3e38: amax / 6 / pts overflows */
                                 {"nvfp4", "global_scale", "1"}, {"nvfp4", "global_scale", "2e-38"},
                                 {"nvfp4", "global_scale", "3e38"},
                                 /* llm-compressor's NVFP4A16 / MXFP4A16 arithmetic (kernels/mx.h) */
                                 {"nvfp4", "flow", "compressed_tensors"}, {"mxfp4", "scale_rounding", "even"},
                                 /* MLX: every code width (groups of 64, the default), the other group
                                  * sizes (4-bit), nvfp4 global scales: mlx-lm's kind, one that saturates
                                  * the E4M3 scales, one that empties them */
                                 {"mlx_affine", "bits", "1"}, {"mlx_affine", "bits", "2"}, {"mlx_affine", "bits", "3"},
                                 {"mlx_affine", "bits", "5"}, {"mlx_affine", "bits", "6"}, {"mlx_affine", "bits", "8"},
                                 {"mlx_affine", "group_size", "32"}, {"mlx_affine", "group_size", "128"},
                                 {"mlx_nvfp4", "global_scale", "2.5"}, {"mlx_nvfp4", "global_scale", "1e-30"},
                                 {"mlx_nvfp4", "global_scale", "3e38"}};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const struct qd_format *f = qd_format_find(variants[v][0]);
        /* per-row int8: rows the kernel keeps in registers (up to 16384 16-bit values, whole
         * 8-element chunks) and others; then, where the format offers allow_nonfinite, the last
         * shape again with a NaN and an Inf allowed (the variant's non-finite block path) */
        static const struct shape row_shapes[] = {{16, 20480, 0}, {256, 1024, 0}, {7, 4104, 0}, {5, 96, 0},
                                                  {3, 16384, 0}, {2, 100, 0}, {9, 2056, 0}};
        int row = !strcmp(variants[v][2], "row"), nshapes = row ? 7 : 1, offered = 0;
        for (const char *const *q = f->params; *q; q++)
            offered |= !strcmp(*q, "allow_nonfinite");
        nshapes += offered;
        for (int dt = QD_F32; dt <= QD_BF16; dt++)
            for (int si = 0; si < nshapes; si++) {
                struct shape sh = row ? row_shapes[si < 7 ? si : 6] : (struct shape){256, 1024, 0};
                int nonfinite = offered && si == nshapes - 1;
                nonfinite_variant_cases += nonfinite;
                struct qd_work probe;
                char err[256];
                memset(&probe, 0, sizeof probe);
                qd_params_default(f, &probe.p);
                assert_int_equal(qd_params_set(f, &probe.p, variants[v][1], variants[v][2], err, sizeof err), QD_OK);
                /* AWQ: random columns may overflow f16 (refused alike in one_case) */
                probe.p.allow_nonfinite = nonfinite || !strcmp(f->family, "awq");
                /* one_case takes defaults: run it with the variant through a patched default */
                struct qd_work wc;
                memset(&wc, 0, sizeof wc);
                wc.req.op = QD_OP_QUANTIZE;
                wc.f = f;
                wc.p = probe.p;
                int64_t dims[2] = {sh.rows, sh.cols};
                wc.in.dtype = (enum qd_dtype)dt;
                qd_tensor_set_shape(&wc.in, 2, dims);
                wc.nc = qd_format_layout(f, &wc.p, &wc.in, wc.comps, err, sizeof err);
                assert_true(wc.nc > 0);
                int64_t n = qd_tensor_numel(&wc.in);
                wc.in.data = malloc((size_t)n * 4);
                fill(wc.in.data, (enum qd_dtype)dt, n);
                if (nonfinite) /* a NaN in row 1, an Inf in row 4 */
                    for (int k = 0; k < 2; k++) {
                        int64_t at = (k ? 4 : 1) * sh.cols + 37 * (k + 1);
                        if (dt == QD_F32)
                            ((float *)wc.in.data)[at] = k ? INFINITY : NAN;
                        else
                            ((uint16_t *)wc.in.data)[at] = dt == QD_F16 ? (k ? 0x7c00 : 0x7e00) : (k ? 0x7f80 : 0x7fc0);
                    }
                struct qd_work wg = wc;
                for (int i = 0; i < wc.nc; i++) {
                    wc.comp[i] = calloc(1, (size_t)wc.comps[i].bytes + 1);
                    wg.comp[i] = malloc((size_t)wc.comps[i].bytes + 1);
                    memset(wg.comp[i], 0xa5, (size_t)wc.comps[i].bytes);
                }
                assert_int_equal(cpu.run(cpu_worker, &wc, err, sizeof err), QD_OK);
                if (gpu.run(gpu_worker, &wg, err, sizeof err) != QD_OK)
                    fail_msg("%s: %s", f->name, err);
                assert_memory_equal(&wc.p, &wg.p, sizeof wc.p);
                for (int i = 0; i < wc.nc; i++) {
                    if (memcmp(wc.comp[i], wg.comp[i], (size_t)wc.comps[i].bytes))
                        fail_msg("%s %s=%s %s: component %s differs", f->name, variants[v][1], variants[v][2],
                                 qd_dtype_name((enum qd_dtype)dt), wc.comps[i].name);
                    free(wc.comp[i]);
                    free(wg.comp[i]);
                }
                free(wc.in.data);
                cases++;
            }
    }
    printf("# %lld cases in all, %lld format x shape pairs the layout refuses (skipped), %lld AWQ f16 "
           "overflows refused alike (then compared allowed), %lld parameter variants' cases with NaN/Inf "
           "allowed\n", (long long)cases, (long long)skipped, (long long)awq_f16_overflows,
           (long long)nonfinite_variant_cases);
}

static float stored(float v, enum qd_dtype dt) { return qd_ct_round(v, dt == QD_BF16 ? 2 : dt == QD_F16 ? 1 : 0); }

static void put_value(void *data, int64_t i, float v, enum qd_dtype dt)
{
    if (dt == QD_F32)
        ((float *)data)[i] = v;
    else
        ((uint16_t *)data)[i] = dt == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
}

/* The value k steps of the dtype's grid away from v (same sign, v not 0). */
static float grid_step(float v, int k, enum qd_dtype dt)
{
    if (dt == QD_F32)
        return qd_bits_f32(qd_f32_bits(v) + (uint32_t)k);
    if (dt == QD_F16)
        return qd_f16_to_f32((uint16_t)(qd_f32_to_f16(v) + k));
    return qd_bf16_to_f32((uint16_t)(qd_f32_to_bf16(v) + k));
}

/* One compressed-tensors integer group of g values at data[at]: its extremes, then values whose
 * quotient x / scale (plus the zero point) is .5 once rounded to the weight's dtype but not in
 * f32 (the codes of the two differ: kernels/ctint.h computes in f32), alternating with values
 * whose f32 quotient is .5 exactly (ties to even; only those in f32), from a random k on; zeros
 * where no such value is left. Returns how many are of the first kind. */
static int64_t half_quotient_group(void *data, int64_t at, int g, enum qd_dtype dt, int bits, int sym)
{
    const int dc = dt == QD_BF16 ? 2 : dt == QD_F16 ? 1 : 0, lo = qd_ct_qmin(bits), hi = qd_ct_qmax(bits);
    const float mx = stored(0.02f * (2.0f + 3.0f * (float)rand_r(&seed) / RAND_MAX), dt);
    const float mn = stored(-mx * (sym ? 0.9f : 0.3f), dt);
    int zp, filled = 2;
    const float scale = qd_ct_int_qparams_mm(mn, mx, bits, sym, dc, &zp);
    int64_t hits = 0;
    put_value(data, at, mx, dt);
    put_value(data, at + 1, mn, dt);
    const int start = (int)(rand_r(&seed) % (unsigned)(hi - lo)); /* the ks a group has room for */
    for (int pass = 0; filled < g && pass < 64; pass++)
        for (int i = 0; i < hi - lo && filled < g; i++) {
            const int k = lo + (start + i) % (hi - lo), want_tie = dc == 0 || filled % 2;
            const float x0 = stored(((float)k + 0.5f - (float)zp) * scale, dt);
            for (int j = -6; j <= 6 && x0 != 0.0f; j++) {
                const float x = grid_step(x0, j, dt), q32 = x / scale + (float)zp;
                const float qdt = qd_ct_round(qd_ct_round(x / scale, dc) + (float)zp, dc);
                const int on_dt = qdt - floorf(qdt) == 0.5f && q32 - floorf(q32) != 0.5f;
                const int tie = q32 - floorf(q32) == 0.5f;
                if (x < mn || x > mx || !(want_tie ? tie : on_dt))
                    continue;
                put_value(data, at + filled++, x, dt);
                hits += on_dt;
                break;
            }
        }
    while (filled < g)
        put_value(data, at + filled++, 0.0f, dt);
    return hits;
}

/* compressed-tensors' integers (w4a16, w8a16; symmetric or not; group 128, which has its own
 * kernel, and 32) on groups whose quotients sit on .5 in the weight's dtype but not in f32, and
 * on exact f32 ties: the GPU's codes, scales and zero points equal the CPU's, and so do the
 * dequantized values. */
static void gpu_equals_cpu_on_ctint_half_quotients(void **state)
{
    (void)state;
    const char *fmts[] = {"w4a16", "w8a16"};
    const int64_t rows = 64, cols = 512;
    int64_t hits = 0, compared = 0;
    for (int fi = 0; fi < 2; fi++)
        for (int sym = 0; sym < 2; sym++)
            for (int gs = 32; gs <= 128; gs *= 4)
                for (int dt = QD_F32; dt <= QD_BF16; dt++) {
                    const struct qd_format *f = qd_format_find(fmts[fi]);
                    struct qd_work wc;
                    char err[256], v[16];
                    memset(&wc, 0, sizeof wc);
                    wc.req.op = QD_OP_QUANTIZE;
                    wc.f = f;
                    qd_params_default(f, &wc.p);
                    snprintf(v, sizeof v, "%d", gs);
                    assert_int_equal(qd_params_set(f, &wc.p, "group_size", v, err, sizeof err), QD_OK);
                    assert_int_equal(qd_params_set(f, &wc.p, "symmetric", sym ? "true" : "false", err, sizeof err),
                                     QD_OK);
                    int64_t dims[2] = {rows, cols};
                    wc.in.dtype = (enum qd_dtype)dt;
                    qd_tensor_set_shape(&wc.in, 2, dims);
                    wc.nc = qd_format_layout(f, &wc.p, &wc.in, wc.comps, err, sizeof err);
                    assert_true(wc.nc > 0);
                    const int64_t n = rows * cols;
                    wc.in.data = malloc((size_t)n * 4);
                    int64_t h = 0;
                    for (int64_t at = 0; at < n; at += gs)
                        h += half_quotient_group(wc.in.data, at, gs, (enum qd_dtype)dt, f->code, sym);
                    if (dt != QD_F32 && h == 0)
                        fail_msg("%s %s: no quotient lands on .5 in the dtype only", f->name, qd_dtype_name(dt));
                    hits += h;
                    struct qd_work wg = wc;
                    for (int i = 0; i < wc.nc; i++) {
                        wc.comp[i] = calloc(1, (size_t)wc.comps[i].bytes + 1);
                        wg.comp[i] = malloc((size_t)wc.comps[i].bytes + 1);
                        memset(wg.comp[i], 0xa5, (size_t)wc.comps[i].bytes);
                    }
                    assert_int_equal(cpu.run(cpu_worker, &wc, err, sizeof err), QD_OK);
                    if (gpu.run(gpu_worker, &wg, err, sizeof err) != QD_OK)
                        fail_msg("%s: %s", f->name, err);
                    for (int i = 0; i < wc.nc; i++)
                        if (memcmp(wc.comp[i], wg.comp[i], (size_t)wc.comps[i].bytes))
                            fail_msg("%s symmetric=%d group_size=%d %s: component %s differs", f->name, sym, gs,
                                     qd_dtype_name((enum qd_dtype)dt), wc.comps[i].name);
                    for (int od = QD_F32; od <= QD_BF16; od++) { /* the CPU's components, both ways */
                        struct qd_work dc = wc, dg;
                        dc.req.op = QD_OP_DEQUANTIZE;
                        dc.out = wc.in;
                        dc.out.dtype = (enum qd_dtype)od;
                        const size_t ob = (size_t)n * qd_dtype_size((enum qd_dtype)od);
                        dc.out.data = malloc(ob);
                        dg = dc;
                        dg.out.data = malloc(ob);
                        memset(dg.out.data, 0xa5, ob);
                        assert_int_equal(cpu.run(cpu_worker, &dc, err, sizeof err), QD_OK);
                        assert_int_equal(gpu.run(gpu_worker, &dg, err, sizeof err), QD_OK);
                        if (memcmp(dc.out.data, dg.out.data, ob))
                            fail_msg("%s symmetric=%d group_size=%d %s: dequantize to %s differs", f->name, sym, gs,
                                     qd_dtype_name((enum qd_dtype)dt), qd_dtype_name((enum qd_dtype)od));
                        free(dc.out.data);
                        free(dg.out.data);
                    }
                    free_pair(&wc, &wg);
                    compared++;
                }
    printf("# ctint: %lld cases equal, %lld values whose quotient is .5 in bf16/f16 only\n", (long long)compared,
           (long long)hits);
}

/* The device element encoders (fp8 cvt, fp6 through fp8, e2m1 per binade), the f16/bf16
 * output packers and the bnb4 code tables against the software ones, on all 2^32 f32 inputs;
 * the reciprocal-based quotient against the division on 2^32 (f32, scale) pairs and its one-
 * correction form on every bf16 and every f16 pair; the dynamic
 * map's bucket table against its binary search. */
static void device_encoders_equal_software_on_every_f32(void **state)
{
    (void)state;
    const char *names[] = {"e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "bf16 pairs", "f16 pairs", "nf4 codes",
                           "fp4 codes", "e4m3 decode", "e5m2 decode", "quotients", "bf16 quotients",
                           "f16 quotients", "dynamic map codes"};
    for (int e = 0; e < 15; e++) {
        uint32_t first = 0;
        long long bad = qd_cuda_conversion_mismatches(e, &first);
        printf("# %s: %lld of 2^32 inputs differ%s\n", names[e], bad, bad > 0 ? " (first below)" : "");
        if (bad > 0)
            printf("# first: 0x%08x\n", first);
        assert_int_equal(bad, 0);
    }
}

/* fp8_e4m3 / w8a8 hard rows (tests/fixtures/make_fp8_fixtures.py plants the same): zeros, an
 * outlier, the dtype's subnormals, quotients on e4m3 and int8 ties, -0.0, negatives whose
 * quotient underflows in the dtype, a subnormal scale whose quotients pass 448; the other rows
 * random. Every value exact in the dtype. */
static void fill_fp8_hard(void *data, enum qd_dtype dt, int64_t rows, int64_t cols)
{
    const float tiny = dt == QD_F16 ? 0x1p-24f : dt == QD_BF16 ? 0x1p-133f : 0x1p-149f;
    const float ties[] = {448, 1.0625f, 1.1875f, 1.3125f, 2.125f, 248, 3 * 0x1p-10f, 0x1p-10f, 5 * 0x1p-10f, 0};
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int k = (int)((r * 7919 + c * 104729) % 1021) - 510;
            float v;
            switch (r % 10) {
            case 0: v = 0.0f; break;
            case 1: v = c == 5 ? 40.0f : (float)k * 1e-4f; break;
            case 2: v = (float)(k % 100) * tiny; break;
            case 3: v = (c % 2 ? -1.0f : 1.0f) * ties[c % 10] * 0x1p-10f; break;
            case 4: v = c == 0 ? -127.5f * 0x1p-7f : ((float)((c + r) % 256) - 127.5f) * 0x1p-7f; break;
            case 5: v = c == 7 ? 0.3f : c == 9 ? -1e-6f : -0.0f; break;
            case 6: v = c == 0 ? 896.0f : -tiny; break;
            case 7: v = (float)(c == 3 ? 627 : (k % 627 ? k % 627 : 1)) * tiny; break;
            /* a scale of about 2^18 beside the dtype's smallest values: quotients at f32's
             * underflow, where the sign of a zero code depends on dividing in full */
            case 8: v = c == 1 ? (dt == QD_F16 ? 60000.0f : 1e8f) : (c % 2 ? -1.0f : 1.0f) * tiny * (float)(1 + c % 3); break;
            default: v = (float)k * 0x1p-12f;
            }
            int64_t i = r * cols + c;
            if (dt == QD_F32)
                ((float *)data)[i] = v;
            else
                ((uint16_t *)data)[i] = dt == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
        }
}

/* fp8_e4m3 (both flows, every granularity, blocks of several shapes) and w8a8: GPU bytes and
 * dequantized values equal the CPU's, on random data and on the hard rows, for shapes that are
 * not multiples of the block, rows past the register kernels' 32768, columns not a multiple
 * of 8 (the element-wise kernels) and a stacked [2, R, C] tensor (blocks per matrix). */
static void gpu_fp8_variants(void **state)
{
    static const char *const sets[][4] = {
        {"fp8_e4m3", NULL}, {"fp8_e4m3", "granularity=tensor", NULL}, {"fp8_e4m3", "granularity=block", NULL},
        {"fp8_e4m3", "granularity=block", "block=32x64", NULL}, {"fp8_e4m3", "granularity=block", "block=3x40", NULL},
        {"fp8_e4m3", "granularity=block", "block=5x12", NULL},
        {"fp8_e4m3", "granularity=block", "block=1x16384", NULL}, {"fp8_e4m3", "flow=transformers", NULL},
        {"fp8_e4m3", "flow=transformers", "granularity=tensor", NULL},
        {"fp8_e4m3", "flow=transformers", "granularity=block", NULL}, {"w8a8", NULL}};
    /* {700, 2056} and the two big ones: more blocks (channels) than the GPU holds CTAs at once,
     * blocks of 257 .. 2048 chunks, partial 128 x 128 blocks at both edges; rows of 2048 or
     * more (the dequantize's scale indices stepped along a row), a stack of matrices among them */
    static const int64_t shapes[][3] = {{0, 200, 300}, {0, 256, 1024}, {0, 7, 40000}, {0, 130, 101}, {0, 1, 77777},
                                        {2, 100, 264}, {3, 130, 2056}, {0, 700, 2056}, {0, 3000, 4104}, {0, 384, 16384}};
    const size_t nshapes = sizeof shapes / sizeof shapes[0] - 2 * (getenv("QUANTD_GPU_SMALL") != NULL); /* the last two are big */
    int64_t n_cases = 0;
    for (size_t v = 0; v < sizeof sets / sizeof sets[0]; v++) {
        const struct qd_format *f = qd_format_find(sets[v][0]);
        for (int dt = QD_F32; dt <= QD_BF16; dt++)
            for (size_t si = 0; si < nshapes; si++)
                for (int hard = 0; hard < 2; hard++) {
                    struct qd_work wc;
                    char err[512], err2[512];
                    memset(&wc, 0, sizeof wc);
                    wc.req.op = QD_OP_QUANTIZE;
                    wc.f = f;
                    qd_params_default(f, &wc.p);
                    for (int k = 1; k < 4 && sets[v][k]; k++) {
                        char key[64];
                        const char *eq = strchr(sets[v][k], '=');
                        snprintf(key, sizeof key, "%.*s", (int)(eq - sets[v][k]), sets[v][k]);
                        assert_int_equal(qd_params_set(f, &wc.p, key, eq + 1, err, sizeof err), QD_OK);
                    }
                    const int64_t *sh = shapes[si];
                    int64_t dims[3] = {sh[0], sh[1], sh[2]};
                    wc.in.dtype = (enum qd_dtype)dt;
                    qd_tensor_set_shape(&wc.in, sh[0] ? 3 : sh[1] == 1 ? 1 : 2, sh[0] ? dims : sh[1] == 1 ? dims + 2 : dims + 1);
                    wc.nc = qd_format_layout(f, &wc.p, &wc.in, wc.comps, err, sizeof err);
                    assert_true(wc.nc > 0);
                    const int64_t n = qd_tensor_numel(&wc.in);
                    wc.in.data = malloc((size_t)n * 4);
                    if (hard)
                        fill_fp8_hard(wc.in.data, (enum qd_dtype)dt, wc.in.rows, wc.in.cols);
                    else
                        fill(wc.in.data, (enum qd_dtype)dt, n);
                    struct qd_work wg = wc;
                    for (int i = 0; i < wc.nc; i++) {
                        wc.comp[i] = malloc((size_t)wc.comps[i].bytes + 1);
                        wg.comp[i] = malloc((size_t)wc.comps[i].bytes + 1);
                        memset(wc.comp[i], 0x5a, (size_t)wc.comps[i].bytes);
                        memset(wg.comp[i], 0xa5, (size_t)wc.comps[i].bytes);
                    }
                    assert_int_equal(cpu.run(cpu_worker, &wc, err, sizeof err), QD_OK);
                    if (gpu.run(gpu_worker, &wg, err2, sizeof err2) != QD_OK)
                        fail_msg("%s: %s", f->name, err2);
                    assert_memory_equal(&wc.p, &wg.p, sizeof wc.p);
                    for (int i = 0; i < wc.nc; i++)
                        if (memcmp(wc.comp[i], wg.comp[i], (size_t)wc.comps[i].bytes)) {
                            size_t b = 0;
                            while (((uint8_t *)wc.comp[i])[b] == ((uint8_t *)wg.comp[i])[b])
                                b++;
                            fail_msg("%s %s %s %s %s %lldx%lldx%lld%s: component %s differs first at byte %zu (cpu %02x "
                                     "gpu %02x)", f->name, sets[v][1] ? sets[v][1] : "", sets[v][1] && sets[v][2] ? sets[v][2] : "",
                                     sets[v][1] && sets[v][2] && sets[v][3] ? sets[v][3] : "", qd_dtype_name((enum qd_dtype)dt),
                                     (long long)sh[0], (long long)sh[1], (long long)sh[2], hard ? " hard rows" : "",
                                     wc.comps[i].name, b, ((uint8_t *)wc.comp[i])[b], ((uint8_t *)wg.comp[i])[b]);
                        }
                    for (int od = QD_F32; od <= QD_BF16; od++) {
                        struct qd_work dc = wc, dg;
                        dc.req.op = QD_OP_DEQUANTIZE;
                        dc.out = wc.in;
                        dc.out.dtype = (enum qd_dtype)od;
                        const size_t ob = (size_t)n * qd_dtype_size((enum qd_dtype)od);
                        dc.out.data = malloc(ob);
                        memset(dc.out.data, 0x5a, ob);
                        dg = dc;
                        dg.out.data = malloc(ob);
                        memset(dg.out.data, 0xa5, ob);
                        assert_int_equal(cpu.run(cpu_worker, &dc, err, sizeof err), QD_OK);
                        if (gpu.run(gpu_worker, &dg, err2, sizeof err2) != QD_OK)
                            fail_msg("gpu dequantize %s: %s", f->name, err2);
                        if (!same_values(dc.out.data, dg.out.data, n, (enum qd_dtype)od))
                            fail_msg("%s %s %s: dequantize to %s differs", f->name, sets[v][1] ? sets[v][1] : "",
                                     qd_dtype_name((enum qd_dtype)dt), qd_dtype_name((enum qd_dtype)od));
                        free(dc.out.data);
                        free(dg.out.data);
                    }
                    free_pair(&wc, &wg);
                    n_cases++;
                }
    }
    printf("# fp8_e4m3 / w8a8 variants: %lld cases equal\n", (long long)n_cases);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_encoders_equal_software_on_every_f32),
        cmocka_unit_test(gpu_bytes_equal_cpu_bytes_for_every_format),
        cmocka_unit_test(gpu_names_the_first_nonfinite_element_like_the_cpu),
        cmocka_unit_test(gpu_equals_cpu_with_importance),
        cmocka_unit_test_teardown(gpu_equals_cpu_on_ties, random_data_again),
        cmocka_unit_test_teardown(gpu_equals_cpu_on_ggml_hard_rows, random_data_again),
        cmocka_unit_test(gpu_equals_cpu_on_allowed_nonfinite_input),
        cmocka_unit_test(gpu_params_variants),
        cmocka_unit_test(gpu_equals_cpu_on_ctint_half_quotients),
        cmocka_unit_test(gpu_fp8_variants),
    };
    /* QUANTD_GPU_ONLY=name,name: those tests alone (memcheck runs the suite in parts) */
    const char *only = getenv("QUANTD_GPU_ONLY");
    if (!only || !*only)
        return cmocka_run_group_tests(tests, setup, teardown);
    struct CMUnitTest picked[sizeof tests / sizeof tests[0]];
    size_t n = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (listed(only, tests[i].name))
            picked[n++] = tests[i];
    if (n == 0) {
        fprintf(stderr, "QUANTD_GPU_ONLY names no test of this suite: %s\n", only);
        return 2;
    }
    return _cmocka_run_group_tests("test_gpu", picked, n, setup, teardown);
}
