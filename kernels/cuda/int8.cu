/* int8 (symmetric) and uint8 (zero point) on the GPU, per tensor (range pass, then codes: two
 * reads of the input) or per row (one warp per row: range by shuffles, then codes). */
#include "../int8.h"
#include "common.cuh"

/* Codes for elements [8t, 8t+8) with one scale; the tail of n % 8 elements one by one. */
template <int DT>
__global__ void int8_codes_kernel(int asym, const void *x, int64_t n, const float *scale,
                                  const uint8_t *zero_point, uint8_t *out, unsigned long long *bad)
{
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    float s = scale[0];
    uint8_t zp = asym ? zero_point[0] : 0;
    if (8 * t + 8 <= n) {
        float v[8];
        qd_load_block<DT, 8>(x, 8 * t, v);
        uint32_t w[2] = {0, 0};
        for (int j = 0; j < 8; j++) {
            qd_note_nonfinite(bad, v[j], 8 * t + j);
            uint32_t c = asym ? qd_uint8_code(v[j], s, zp) : (uint8_t)qd_int8_code(v[j], s);
            w[j / 4] |= c << (8 * (j % 4));
        }
        ((uint2 *)out)[t] = make_uint2(w[0], w[1]);
    } else {
        for (int64_t i = 8 * t; i < n; i++) {
            float v = qd_load<DT>(x, i);
            qd_note_nonfinite(bad, v, i);
            out[i] = asym ? qd_uint8_code(v, s, zp) : (uint8_t)qd_int8_code(v, s);
        }
    }
}

/* One warp per row: the row's range, its scale (and zero point), then its codes. */
template <int DT>
__global__ void int8_row_kernel(int asym, const void *x, int64_t rows, int64_t cols, float *scale,
                                uint8_t *zero_point, uint8_t *out, unsigned long long *bad)
{
    int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    int64_t base = row * cols;
    struct qd_range r = qd_range_empty();
    for (int64_t i = lane; i < cols; i += 32) {
        float v = qd_load<DT>(x, base + i);
        qd_note_nonfinite(bad, v, base + i);
        qd_range_add(&r, v);
    }
    r = qd_range_warp(r);
    float s = asym ? qd_uint8_scale(r.lo, r.hi) : qd_int8_scale(r.amax);
    uint8_t zp = asym ? qd_uint8_zero_point(r.lo, s) : 0;
    if (lane == 0) {
        scale[row] = s;
        if (asym)
            zero_point[row] = zp;
    }
    for (int64_t i = lane; i < cols; i += 32) {
        float v = qd_load<DT>(x, base + i);
        out[base + i] = asym ? qd_uint8_code(v, s, zp) : (uint8_t)qd_int8_code(v, s);
    }
}

template <int DT>
__global__ void int8_dequantize_kernel(int asym, int per_row, int64_t cols, const uint8_t *data,
                                       const float *scale, const uint8_t *zero_point, int64_t n, void *y)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = per_row ? i / cols : 0;
        float v = asym ? (float)((int)data[i] - (int)zero_point[row]) * scale[row]
                       : (float)(int8_t)data[i] * scale[row];
        qd_store<DT>(y, i, v);
    }
}

extern "C" enum qd_status qd_cuda_int8_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                struct qd_params *p, void *const *out)
{
    int asym = f->code;
    int64_t n = qd_tensor_numel(in);
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    uint8_t *zp = asym ? (uint8_t *)out[2] : NULL;
    if (p->granularity == QD_GRAN_ROW) {
        unsigned rows_per_cta = 8;
        QD_DTYPE_SWITCH(in->dtype, DT,
                        int8_row_kernel<DT><<<qd_grid(in->rows, rows_per_cta), 32 * rows_per_cta, 0, qd_stream()>>>(
                            asym, in->data, in->rows, in->cols, (float *)out[1], zp, (uint8_t *)out[0], bad));
        CUDA_LAUNCHED();
        return qd_cuda_bad_end(bad);
    }
    float amax, lo, hi;
    if ((s = qd_cuda_range(in, bad, &amax, &lo, &hi)) != QD_OK || (s = qd_cuda_bad_end(bad)) != QD_OK)
        return s;
    /* the scale and zero point, computed on the host exactly as the CPU does, staged pinned */
    struct qd_scratch *h = qd_scratch_host();
    h->partial[0] = asym ? qd_uint8_scale(lo, hi) : qd_int8_scale(amax);
    ((uint8_t *)&h->partial[1])[0] = asym ? qd_uint8_zero_point(lo, h->partial[0]) : 0;
    CUDA_CHECK(cudaMemcpyAsync(out[1], &h->partial[0], sizeof(float), cudaMemcpyHostToDevice, qd_stream()));
    if (asym)
        CUDA_CHECK(cudaMemcpyAsync(zp, &h->partial[1], 1, cudaMemcpyHostToDevice, qd_stream()));
    QD_DTYPE_SWITCH(in->dtype, DT,
                    int8_codes_kernel<DT><<<qd_grid((n + 7) / 8, 256), 256, 0, qd_stream()>>>(
                        asym, in->data, n, (const float *)out[1], zp, (uint8_t *)out[0], NULL));
    CUDA_LAUNCHED();
    return QD_OK;
}

extern "C" enum qd_status qd_cuda_int8_dequantize(const struct qd_format *f, const void *const *in,
                                                  const struct qd_params *p, struct qd_tensor *out)
{
    int64_t n = qd_tensor_numel(out);
    unsigned grid = qd_grid(n, 256);
    grid = grid < 65535u * 16 ? grid : 65535u * 16;
    QD_DTYPE_SWITCH(out->dtype, DT,
                    int8_dequantize_kernel<DT><<<grid, 256, 0, qd_stream()>>>(
                        f->code, p->granularity == QD_GRAN_ROW, out->cols, (const uint8_t *)in[0],
                        (const float *)in[1], f->code ? (const uint8_t *)in[2] : NULL, n, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
