/* make bench-iq4: the iq4_nl / iq4_xs search on one core, the scalar block code
 * (kernels/iquants.h) against its AVX2 form (kernels/cpu/iquant_avx2.h) on the same blocks of
 * N(0, 0.02) values, with and without an importance. The two run interleaved, REPS rounds each;
 * the medians per 256 values and their ratio are printed, and the bytes are compared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "../kernels/cpu/iquant_avx2.h"

#define REPS 9

static uint64_t rng = 88172645463325252ull;
static double uniform(void) { return uniform_from(&rng); }

/* n values of 256 (super-blocks), scalar or AVX2, with or without the importance qw. */
static void run(int xs, int avx2, const float *x, const float *qw, int64_t n, uint8_t *out)
{
    for (int64_t b = 0; b < n; b++) {
        const float *xb = x + 256 * b, *wb = qw ? qw + 256 * b : NULL;
        if (xs) {
            if (avx2)
                qd_iq4_xs_quantize_avx2(xb, wb, out + 136 * b);
            else
                qd_iq4_quantize(1, xb, wb, out + 136 * b);
        } else if (avx2) {
            const float *w8[8];
            for (int j = 0; j < 8; j++)
                w8[j] = wb ? wb + 32 * j : NULL;
            qd_iq4_nl_quantize8_avx2(xb, wb ? w8 : NULL, out + 144 * b);
        } else
            for (int j = 0; j < 8; j++)
                qd_iq4_quantize(0, xb + 32 * j, wb ? wb + 32 * j : NULL, out + 144 * b + 18 * j);
    }
}

int main(int argc, char **argv)
{
    const int64_t n = argc > 1 ? atoll(argv[1]) : 2048; /* super-blocks of 256 values */
    float *x = malloc((size_t)n * 256 * sizeof(float)), *qw = malloc((size_t)n * 256 * sizeof(float));
    uint8_t *a = malloc((size_t)n * 144), *b = malloc((size_t)n * 144);
    for (int64_t i = 0; i < n * 256; i++) {
        x[i] = (float)normal_from(&rng, 0.02);
        qw[i] = (float)(uniform() * uniform() * 10.0);
    }
    if (!QD_IQUANT_AVX2) {
        printf("built without AVX2: nothing to compare\n");
        return 0;
    }
    printf("%-22s %14s %14s %8s\n", "one core", "scalar ns/256", "AVX2 ns/256", "ratio");
    int bad = 0;
    for (int xs = 1; xs >= 0; xs--)
        for (int imp = 0; imp < 2; imp++) {
            double ts[REPS], tv[REPS];
            for (int r = 0; r < REPS; r++) {
                double t0 = now_s();
                run(xs, 0, x, imp ? qw : NULL, n, a);
                double t1 = now_s();
                run(xs, 1, x, imp ? qw : NULL, n, b);
                double t2 = now_s();
                ts[r] = t1 - t0;
                tv[r] = t2 - t1;
            }
            qsort(ts, REPS, sizeof(double), cmp_double);
            qsort(tv, REPS, sizeof(double), cmp_double);
            const int same = !memcmp(a, b, (size_t)n * (xs ? 136 : 144));
            bad |= !same;
            printf("%-22s %14.0f %14.0f %7.2fx%s\n", xs ? (imp ? "iq4_xs + importance" : "iq4_xs")
                                                          : (imp ? "iq4_nl + importance" : "iq4_nl"),
                   ts[REPS / 2] / (double)n * 1e9, tv[REPS / 2] / (double)n * 1e9, ts[REPS / 2] / tv[REPS / 2],
                   same ? "" : "  BYTES DIFFER");
        }
    free(x);
    free(qw);
    free(a);
    free(b);
    return bad;
}
