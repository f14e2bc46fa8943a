/* Plain int8 (symmetric) and uint8 (asymmetric, zero point), shared by the CPU and CUDA
 * backends. Semantics: docs/formats.md. */
#ifndef QD_INT8_H
#define QD_INT8_H

#include "fp.h"

/* scale = amax / 127; an all-zero tensor (or row) gets scale 1 so every code is 0. */
QD_HD float qd_int8_scale(float amax) { return amax > 0.0f ? amax / 127.0f : 1.0f; }

QD_HD int8_t qd_int8_code(float x, float scale)
{
    float q = qd_rint(x / scale);
    return (int8_t)(q < -127.0f ? -127.0f : (q > 127.0f ? 127.0f : q));
}

/* The range is widened to include 0 (torch.ao observers), scale = (max - min) / 255 (1 when
 * the range is empty), zero_point = clamp(round(-min / scale), 0, 255). */
QD_HD float qd_uint8_scale(float min, float max)
{
    min = min < 0.0f ? min : 0.0f;
    max = max > 0.0f ? max : 0.0f;
    float s = (max - min) / 255.0f;
    return s > 0.0f ? s : 1.0f;
}

QD_HD uint8_t qd_uint8_zero_point(float min, float scale)
{
    min = min < 0.0f ? min : 0.0f;
    float z = qd_rint(-min / scale);
    return (uint8_t)(z < 0.0f ? 0.0f : (z > 255.0f ? 255.0f : z));
}

QD_HD uint8_t qd_uint8_code(float x, float scale, uint8_t zero_point)
{
    float q = qd_rint(x / scale) + (float)zero_point;
    return (uint8_t)(q < 0.0f ? 0.0f : (q > 255.0f ? 255.0f : q));
}

#endif
