/* Test-only shim: kernels/fp.h conversions over arrays, for ctypes (tests/peers). */
#include <stddef.h>
#include <stdint.h>

#include "../../kernels/fp.h"
#include "../../kernels/mx.h"

/* kind: 0 e2m1, 1 e2m3, 2 e3m2, 3 e4m3fn, 4 e5m2 (enum qd_mx_elem) */
void qd_test_encode(int kind, const float *x, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = qd_mx_encode(kind, x[i]);
}

void qd_test_decode(int kind, const uint8_t *c, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = qd_mx_decode(kind, c[i]);
}

void qd_test_f16(const float *x, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = qd_f32_to_f16(x[i]);
}

void qd_test_bf16(const float *x, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = qd_f32_to_bf16(x[i]);
}

void qd_test_f16_to_f32(const uint16_t *h, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = qd_f16_to_f32(h[i]);
}

void qd_test_e8m0_decode(const uint8_t *c, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = qd_e8m0_to_f32(c[i]);
}

void qd_test_e8m0_rceil(const float *x, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = qd_e8m0_rceil(x[i]);
}
