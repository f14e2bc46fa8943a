/* make bench-iqgrid: the IQ2_XXS, IQ3_XXS and IQ1_S searches with an importance on one core,
 * the scalar block code (kernels/iq2.h, iq3xxs.h, iq1.h) against its AVX2 form
 * (kernels/cpu/iq2_avx2.h, iqgrid_avx2.h) on the same super-blocks of N(0, 0.02) values. The two
 * run interleaved, REPS rounds each; the medians per 256 values and their ratio are printed,
 * and the bytes are compared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "../kernels/cpu/iq2_avx2.h"
#include "../kernels/cpu/iqgrid_avx2.h"

#define REPS 7

static uint64_t rng = 88172645463325252ull;
static double uniform(void) { return uniform_from(&rng); }

static const char *const names[3] = {"iq2_xxs + importance", "iq3_xxs + importance", "iq1_s + importance"};
static const int bytes[3] = {QD_IQ2_BLOCK_BYTES(QD_IQ2_XXS), QD_IQ3XXS_BYTES, QD_IQ1S_BYTES};

static void run(int type, int avx2, const float *x, const float *qw, int64_t n, uint8_t *out)
{
    const struct qd_iq2_tables *t2 = qd_iq2_tables(QD_IQ2_XXS);
    const struct qd_iq_grid *g = type == 1 ? qd_iq3xxs_grid() : qd_iq1_grid();
    for (int64_t b = 0; b < n; b++) {
        const float *xb = x + 256 * b, *wb = qw + 256 * b;
        uint8_t *o = out + bytes[type] * b;
        if (type == 0)
            avx2 ? qd_iq2xxs_quantize_avx2(t2, xb, wb, o) : qd_iq2_quantize_block(t2, QD_IQ2_XXS, xb, wb, o);
        else if (type == 1)
            avx2 ? qd_iq3xxs_quantize_avx2(g, xb, wb, o) : qd_iq3xxs_quantize(g, xb, wb, o);
        else
            avx2 ? qd_iq1s_quantize_avx2(g, xb, wb, o) : qd_iq1s_quantize(g, xb, wb, o);
    }
}

int main(int argc, char **argv)
{
    const int64_t n = argc > 1 ? atoll(argv[1]) : 256; /* super-blocks of 256 values */
    float *x = malloc((size_t)n * 256 * sizeof(float)), *qw = malloc((size_t)n * 256 * sizeof(float));
    uint8_t *a = malloc((size_t)n * 128), *b = malloc((size_t)n * 128);
    for (int64_t i = 0; i < n * 256; i++) {
        x[i] = (float)normal_from(&rng, 0.02);
        qw[i] = (float)(uniform() * uniform() * 10.0);
    }
    if (!QD_IQ2_AVX2 || !QD_IQGRID_AVX2) {
        printf("built without AVX2: nothing to compare\n");
        return 0;
    }
    run(0, 0, x, qw, 1, a); /* the tables built before any timing */
    run(1, 0, x, qw, 1, a);
    run(2, 0, x, qw, 1, a);
    printf("%-22s %14s %14s %8s\n", "one core", "scalar ns/256", "AVX2 ns/256", "ratio");
    int bad = 0;
    for (int type = 0; type < 3; type++) {
        double ts[REPS], tv[REPS];
        for (int r = 0; r < REPS; r++) {
            double t0 = now_s();
            run(type, 0, x, qw, n, a);
            double t1 = now_s();
            run(type, 1, x, qw, n, b);
            double t2 = now_s();
            ts[r] = t1 - t0;
            tv[r] = t2 - t1;
        }
        qsort(ts, REPS, sizeof(double), cmp_double);
        qsort(tv, REPS, sizeof(double), cmp_double);
        const int same = !memcmp(a, b, (size_t)n * (size_t)bytes[type]);
        bad |= !same;
        printf("%-22s %14.0f %14.0f %7.2fx%s\n", names[type], ts[REPS / 2] / (double)n * 1e9,
               tv[REPS / 2] / (double)n * 1e9, ts[REPS / 2] / tv[REPS / 2], same ? "" : "  BYTES DIFFER");
    }
    free(x);
    free(qw);
    free(a);
    free(b);
    return bad;
}
