/* make bench-kquant-imx: the importance-weighted K-quant block code on one core, the scalar
 * path (kernels/imatrix.h qd_imx_quantize_kquant, what the CUDA backend and non-AVX2 builds
 * run) against the AVX2 lanes (kernels/cpu/kquant_imx_avx2.h) on the same super-blocks:
 * N(0, 0.02) weights, a random positive importance per column. Runs are interleaved in
 * alternating order (the host is shared); each type prints the median time per block of
 * either path and the median of the pairs' ratios. Argument: the number of super-blocks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "../kernels/cpu/kquant_imx_avx2.h"

#if !QD_KQUANT_IMX_AVX2
int main(void)
{
    printf("this build has no AVX2 path (built without -march=x86-64-v3)\n");
    return 0;
}
#else
enum { PAIRS = 15, COLS = 4096 };

static uint64_t rng = 0x9E3779B97F4A7C15u;
static double uniform(void) { return uniform_from(&rng); }

static double run(int avx2, int type, const float *x, const float *qw, int64_t blocks, uint8_t *out)
{
    const int bytes = qd_kquant_block_bytes(type);
    const float twice = qd_imx_sigma2_twice(type);
    float sigma2[8] = {0};
    double t0 = now_s();
    for (int64_t b = 0; b < blocks; b++) {
        const float *xb = x + b * QD_QK_K, *qb = qw + b * QD_QK_K % COLS;
        if (avx2) { /* as kernels/cpu/kquant.c runs it: eight blocks' sigma2 at once */
            if (b % 8 == 0 && twice != 0.0f) {
                if (blocks - b >= 8)
                    qd_imx_block_sigma2_8(xb, twice, sigma2);
                else
                    for (int64_t j = b; j < blocks; j++)
                        sigma2[j - b] = qd_imx_block_sigma2(x + j * QD_QK_K, twice);
            }
            qd_imx_quantize_kquant_avx2(type, xb, qb, sigma2[b % 8], out + b * bytes);
        } else
            qd_imx_quantize_kquant(type, xb, qb, out + b * bytes);
    }
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    const int64_t blocks = argc > 1 ? atoll(argv[1]) : 2048;
    float *x = malloc((size_t)blocks * QD_QK_K * sizeof(float)), *qw = malloc(COLS * sizeof(float));
    uint8_t *want = malloc((size_t)blocks * 256), *got = malloc((size_t)blocks * 256);
    for (int64_t i = 0; i < blocks * QD_QK_K; i++) {
        x[i] = (float)normal_from(&rng, 0.02);
    }
    for (int i = 0; i < COLS; i++)
        qw[i] = (float)(uniform() * uniform() * 8.0);
    printf("importance-weighted K-quants, one core, %lld super-blocks, median of %d interleaved pairs\n",
           (long long)blocks, PAIRS);
    printf("%-6s %16s %16s %10s\n", "type", "scalar us/block", "AVX2 us/block", "speedup");
    static const char *const names[] = {"q2_K", "q3_K", "q4_K", "q5_K", "q6_K"};
    for (int type = QD_Q2_K; type <= QD_Q6_K; type++) {
        double ts[PAIRS], tv[PAIRS], ratio[PAIRS];
        for (int r = 0; r < PAIRS; r++) {
            if (r % 2)
                tv[r] = run(1, type, x, qw, blocks, got);
            ts[r] = run(0, type, x, qw, blocks, want);
            if (r % 2 == 0)
                tv[r] = run(1, type, x, qw, blocks, got);
            ratio[r] = ts[r] / tv[r];
        }
        if (memcmp(want, got, (size_t)(blocks * qd_kquant_block_bytes(type)))) {
            fprintf(stderr, "%s: the AVX2 bytes differ from the scalar bytes\n", names[type]);
            return 1;
        }
        printf("%-6s %16.2f %16.2f %9.2fx\n", names[type], median(ts, PAIRS) / blocks * 1e6,
               median(tv, PAIRS) / blocks * 1e6, median(ratio, PAIRS));
    }
    free(x), free(qw), free(want), free(got);
    return 0;
}
#endif
