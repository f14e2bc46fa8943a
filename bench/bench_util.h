/* What the CPU benchmarks share: a monotonic clock, the median of a run of timings (sorts them
 * in place), and a seeded xorshift64 generator, so every benchmark times the same inputs on
 * every machine. */
#ifndef QD_BENCH_UTIL_H
#define QD_BENCH_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

/* xorshift64 over *state: a uniform double in [0, 1) */
static inline double uniform_from(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (double)(*state >> 11) / 9007199254740992.0;
}

/* N(0, sigma) from two of those (Box-Muller) */
static inline double normal_from(uint64_t *state, double sigma)
{
    double u = uniform_from(state), v = uniform_from(state);
    return sigma * sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

#endif
