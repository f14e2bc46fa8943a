/* kernels/cpu/parallel.c qd_cpu_minmax (the pass int8/uint8 and NVFP4 take their ranges from):
 * its vector loop gives what one sequential scalar loop gives (a NaN never wins a comparison;
 * the sign of a zero minimum or maximum is the first one met) on f32, f16 and bf16 tensors of
 * odd lengths, on one thread and on two, with NaNs, infinities and signed zeros mixed in. */
#include <stdio.h>

#include "../../kernels/cpu/cpu.h"
#include "helpers.h"

static void reference(const float *x, int64_t n, float *a, float *lo, float *hi)
{
    *a = 0.0f, *lo = 3.40282347e38f, *hi = -3.40282347e38f;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], m = fabsf(v);
        *a = m > *a ? m : *a;
        *lo = v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
    }
}

static int same(float p, float q) { return memcmp(&p, &q, sizeof p) == 0; }

static void minmax_equals_the_sequential_loop(void **state)
{
    (void)state;
    test_seed();
    const enum qd_dtype dts[] = {QD_F32, QD_F16, QD_BF16};
    for (int it = 0; it < 3000; it++) {
        int64_t n = 1 + (int64_t)(test_uniform() * (it % 10 == 0 ? 600000 : 3000));
        int kind = it % 6;
        float *x = malloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++) {
            float u = (float)(test_uniform() * 2.0 - 1.0);
            x[i] = kind == 0 ? (test_uniform() < 0.5 ? 0.0f : -0.0f) /* only zeros: the sign counts */
                 : kind == 1 ? fabsf(u) + 1.0f                          /* positive */
                 : kind == 2 ? -fabsf(u) - 1.0f                         /* negative */
                             : u * 1000.0f;
        }
        if (kind == 1 || kind == 2) /* zeros of both signs among one-signed values: a zero extreme */
            for (int k = 0; k < 1 + (int)(n / 300); k++)
                x[(int64_t)(test_uniform() * (double)n)] = test_uniform() < 0.5 ? 0.0f : -0.0f;
        if (kind >= 3) /* NaNs, infinities, zeros of both signs in places */
            for (int k = 0; k < 1 + (int)(n / 500); k++) {
                int64_t at = (int64_t)(test_uniform() * (double)n);
                int what = (int)(test_uniform() * 4);
                x[at] = what == 0 ? NAN : what == 1 ? -NAN : what == 2 ? (kind == 4 ? INFINITY : -0.0f) : 0.0f;
            }
        enum qd_dtype dt = dts[it % 3];
        struct qd_tensor t = {.dtype = dt};
        int64_t shape[1] = {n};
        qd_tensor_set_shape(&t, 1, shape);
        uint16_t *h = malloc((size_t)n * 2);
        if (dt == QD_F32)
            t.data = x;
        else { /* the values the 16-bit tensor holds are the reference's input */
            for (int64_t i = 0; i < n; i++) {
                h[i] = dt == QD_F16 ? qd_f32_to_f16(x[i]) : qd_f32_to_bf16(x[i]);
                x[i] = dt == QD_F16 ? qd_f16_to_f32(h[i]) : qd_bf16_to_f32(h[i]);
            }
            t.data = h;
        }
        float ra, rlo, rhi, ga, glo, ghi;
        reference(x, n, &ra, &rlo, &rhi);
        for (int threads = 1; threads <= 2; threads++) {
            qd_cpu_set_threads(threads);
            qd_cpu_minmax(&t, &ga, &glo, &ghi);
            if (!same(ga, ra) || !same(glo, rlo) || !same(ghi, rhi))
                fail_msg("n %lld dtype %d kind %d threads %d: got %a %a %a, want %a %a %a", (long long)n, dt, kind,
                         threads, ga, glo, ghi, ra, rlo, rhi);
        }
        free(h);
        free(x);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(minmax_equals_the_sequential_loop)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
