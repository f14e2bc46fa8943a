/* int8 (symmetric) and uint8 (zero point) on the GPU, per tensor (range pass, then codes: two
 * reads of the input) or per row (one CTA per row: range, then codes). */
#include "../int8.h"
#include "common.cuh"

__device__ __forceinline__ uint32_t int8_code(int asym, float v, float sc, uint8_t zp)
{
    return asym ? qd_uint8_code(v, sc, zp) : (uint8_t)qd_int8_code(v, sc);
}

/* The codes of 8 values, byte j = value j. */
__device__ __forceinline__ uint2 int8_codes8(int asym, const float *v, float sc, uint8_t zp)
{
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; j++)
        w[j / 4] |= int8_code(asym, v[j], sc, zp) << (8 * (j % 4));
    return make_uint2(w[0], w[1]);
}

/* Codes for elements [8t, 8t+8) with one scale; the tail of n % 8 elements one by one. The
 * range pass before it has checked the input. */
template <int DT>
__global__ void int8_codes_kernel(int asym, const void *x, int64_t n, const float *scale,
                                  const uint8_t *zero_point, uint8_t *out)
{
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    float s = scale[0];
    uint8_t zp = asym ? zero_point[0] : 0;
    if (8 * t + 8 <= n) {
        float v[8];
        qd_load_block<DT, 8>(x, 8 * t, v);
        ((uint2 *)out)[t] = int8_codes8(asym, v, s, zp);
    } else {
        for (int64_t i = 8 * t; i < n; i++)
            out[i] = (uint8_t)int8_code(asym, qd_load<DT>(x, i), s, zp);
    }
}

#define ROW_THREADS 256

/* The row's range from each thread's share (folded over the CTA), its scale and zero point,
 * stored and returned to every thread. */
__device__ __forceinline__ void row_scale(int asym, struct qd_range r, int64_t row, float *scale, uint8_t *zero_point,
                                          float *sc_out, uint8_t *zp_out)
{
    __shared__ struct qd_range part[ROW_THREADS / 32];
    __shared__ float s_scale;
    __shared__ uint8_t s_zp;
    r = qd_range_warp(r);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = r;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ROW_THREADS / 32; w++)
            qd_range_merge(&r, part[w]);
        float sc = asym ? qd_uint8_scale(r.lo, r.hi) : qd_int8_scale(r.amax);
        s_scale = sc;
        s_zp = asym ? qd_uint8_zero_point(r.lo, sc) : 0;
        scale[row] = sc;
        if (asym)
            zero_point[row] = s_zp;
    }
    __syncthreads();
    *sc_out = s_scale;
    *zp_out = s_zp;
}

/* One CTA per row: the row's range (16-byte loads when the row is 16-byte aligned and a whole
 * number of 8-element groups), its scale and zero point, then its codes (the second read of
 * the row comes from L1/L2). */
template <int DT>
__global__ void __launch_bounds__(ROW_THREADS) int8_row_kernel(int asym, const void *x, int64_t cols,
                                                               float *scale, uint8_t *zero_point, uint8_t *out,
                                                               unsigned long long *bad)
{
    int64_t row = blockIdx.x, base = row * cols;
    bool vec = cols % 8 == 0;
    struct qd_range r = qd_range_empty();
    if (vec) {
#pragma unroll 4
        for (int64_t g = threadIdx.x; g < cols / 8; g += ROW_THREADS) {
            float v[8];
            qd_load_block<DT, 8>(x, base + 8 * g, v);
            if (bad)
                qd_check_block<8>(bad, v, base + 8 * g);
            for (int j = 0; j < 8; j++)
                qd_range_add(&r, v[j]);
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += ROW_THREADS) {
            float v = qd_load<DT>(x, base + i);
            qd_note_nonfinite(bad, v, base + i);
            qd_range_add(&r, v);
        }
    }
    float sc;
    uint8_t zp;
    row_scale(asym, r, row, scale, zero_point, &sc, &zp);
    if (vec) {
#pragma unroll 4
        for (int64_t g = threadIdx.x; g < cols / 8; g += ROW_THREADS) {
            float v[8];
            qd_load_block<DT, 8>(x, base + 8 * g, v);
            uint2 cw = int8_codes8(asym, v, sc, zp);
            uint32_t w[2] = {cw.x, cw.y};
            if ((base % 8) == 0) /* the codes' start is 8-byte aligned too */
                ((uint2 *)(out + base))[g] = cw;
            else
                for (int j = 0; j < 8; j++)
                    out[base + 8 * g + j] = (uint8_t)(w[j / 4] >> (8 * (j % 4)));
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += ROW_THREADS)
            out[base + i] = (uint8_t)int8_code(asym, qd_load<DT>(x, base + i), sc, zp);
    }
}

/* Per row for 16-bit rows of up to 2048 K elements (a multiple of 8): one CTA per row, the
 * row held in registers (K 16-byte chunks per thread, 2048 elements apart: coalesced), so it
 * is read once. The range from packed pair min/max (NaN ignored); a row with NaN/Inf takes the
 * element-wise fold of the reference instead. */
template <int DT, int K>
__global__ void __launch_bounds__(ROW_THREADS) int8_row_reg_kernel(int asym, const void *x, int64_t cols,
                                                                   float *scale, uint8_t *zero_point, uint8_t *out,
                                                                   unsigned long long *bad)
{
    int64_t row = blockIdx.x, base = row * cols, chunks = cols / 8;
    const uint4 *src = (const uint4 *)((const uint16_t *)x + base);
    uint4 q[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        int64_t c = threadIdx.x + (int64_t)k * ROW_THREADS;
        q[k] = c < chunks ? __ldg(src + c) : make_uint4(0, 0, 0, 0); /* zeros: inside any range with 0 */
    }
    uint32_t top = 0, lo = 0, hi = 0; /* pairs; the zero padding cannot change a range widened to 0 */
#pragma unroll
    for (int k = 0; k < K; k++) {
        uint32_t w[4] = {q[k].x, q[k].y, q[k].z, q[k].w};
#pragma unroll
        for (int h = 0; h < 4; h++) {
            top = __vmaxu2(top, w[h] & 0x7fff7fffu);
            lo = qd_pair_min<DT>(lo, w[h]);
            hi = qd_pair_max<DT>(hi, w[h]);
        }
    }
    uint32_t inf = DT == QD_F16 ? 0x7c00u : 0x7f80u;
    bool finite = (top & 0xffff) < inf && (top >> 16) < inf;
    struct qd_range r;
    if (finite) { /* the packed fold started from 0: harmless, both scales widen the range to 0 */
        float l = fminf(qd_half_f32<DT>(lo, 0), qd_half_f32<DT>(lo, 1));
        float h = fmaxf(qd_half_f32<DT>(hi, 0), qd_half_f32<DT>(hi, 1));
        r = {fmaxf(-l, h), l, h};
    } else { /* rare: the reference fold, and the first bad element */
        r = qd_range_empty();
#pragma unroll
        for (int k = 0; k < K; k++) {
            int64_t c = threadIdx.x + (int64_t)k * ROW_THREADS;
            uint32_t w[4] = {q[k].x, q[k].y, q[k].z, q[k].w};
            for (int j = 0; j < 8 && c < chunks; j++) {
                float v = qd_half_f32<DT>(w[j / 2], j % 2);
                qd_note_nonfinite(bad, v, base + 8 * c + j);
                qd_range_add(&r, v);
            }
        }
    }
    float sc;
    uint8_t zp;
    row_scale(asym, r, row, scale, zero_point, &sc, &zp);
#pragma unroll
    for (int k = 0; k < K; k++) {
        int64_t c = threadIdx.x + (int64_t)k * ROW_THREADS;
        if (c >= chunks)
            break;
        uint32_t w[4] = {q[k].x, q[k].y, q[k].z, q[k].w};
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = qd_half_f32<DT>(w[j / 2], j % 2);
        ((uint2 *)(out + base))[c] = int8_codes8(asym, v, sc, zp);
    }
}

/* One thread per 8 elements: an 8-byte load of codes, a 16-byte (bf16/f16) or two (f32)
 * stores; the n % 8 tail one by one. */
template <int DT>
__global__ void int8_dequantize_kernel(int asym, int per_row, int64_t cols, const uint8_t *data,
                                       const float *scale, const uint8_t *zero_point, int64_t n, void *y)
{
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (8 * t + 8 <= n) {
        uint2 w = ((const uint2 *)data)[t];
        float v[8];
        int64_t row = per_row ? 8 * t / cols : 0;
        int64_t row_end = per_row ? (row + 1) * cols : n;
        float sc = scale[row];
        int zp = asym ? zero_point[row] : 0;
        for (int j = 0; j < 8; j++) {
            if (8 * t + j == row_end) { /* the group crosses into the next row */
                row++, row_end += cols;
                sc = scale[row];
                zp = asym ? zero_point[row] : 0;
            }
            uint32_t c = ((j < 4 ? w.x : w.y) >> (8 * (j % 4))) & 0xff;
            v[j] = qd_small_int_f32(asym ? (int)c - zp : (int)(int8_t)c) * sc;
        }
        qd_store_block<DT, 8>(y, 8 * t, v);
    } else {
        for (int64_t i = 8 * t; i < n; i++) {
            int64_t row = per_row ? i / cols : 0;
            float v = asym ? (float)((int)data[i] - (int)zero_point[row]) * scale[row]
                           : (float)(int8_t)data[i] * scale[row];
            qd_store<DT>(y, i, v);
        }
    }
}

/* The per-tensor scale (and zero point) from the range the device computed, exactly as the CPU
 * computes them (the same IEEE operations in f32). */
__global__ void int8_scale_kernel(int asym, const struct qd_scratch *s, float *scale, uint8_t *zp)
{
    float sc = asym ? qd_uint8_scale(s->range[1], s->range[2]) : qd_int8_scale(s->range[0]);
    *scale = sc;
    if (asym)
        *zp = qd_uint8_zero_point(s->range[1], sc);
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
        int64_t cols = in->cols, k = (cols + 8 * ROW_THREADS - 1) / (8 * ROW_THREADS);
        if (in->dtype != QD_F32 && cols % 8 == 0 && k <= 8) {
            const void *x = in->data;
            float *sc = (float *)out[1];
            uint8_t *codes = (uint8_t *)out[0];
            unsigned rows = (unsigned)in->rows;
#define ROW_REG(DT, K) int8_row_reg_kernel<DT, K><<<rows, ROW_THREADS, 0, qd_stream()>>>(asym, x, cols, sc, zp, codes, bad)
#define ROW_REG_K(DT) (k <= 1 ? ROW_REG(DT, 1) : k <= 2 ? ROW_REG(DT, 2) : k <= 4 ? ROW_REG(DT, 4) : ROW_REG(DT, 8))
            if (in->dtype == QD_F16)
                ROW_REG_K(QD_F16);
            else
                ROW_REG_K(QD_BF16);
#undef ROW_REG_K
#undef ROW_REG
            CUDA_LAUNCHED();
            return qd_cuda_bad_end(bad);
        }
        QD_DTYPE_SWITCH(in->dtype, DT,
                        int8_row_kernel<DT><<<(unsigned)in->rows, ROW_THREADS, 0, qd_stream()>>>(
                            asym, in->data, in->cols, (float *)out[1], zp, (uint8_t *)out[0], bad));
        CUDA_LAUNCHED();
        return qd_cuda_bad_end(bad);
    }
    /* the range, then the scale (and zero point) from it on the device, then the codes: three
     * kernels in stream order and no host round trip (a small tensor's time was mostly that) */
    if ((s = qd_cuda_range_async(in, bad)) != QD_OK)
        return s;
    int8_scale_kernel<<<1, 1, 0, qd_stream()>>>(asym, qd_scratch_dev(), (float *)out[1], zp);
    CUDA_LAUNCHED();
    QD_DTYPE_SWITCH(in->dtype, DT,
                    int8_codes_kernel<DT><<<qd_grid((n + 7) / 8, 256), 256, 0, qd_stream()>>>(
                        asym, in->data, n, (const float *)out[1], zp, (uint8_t *)out[0]));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_int8_dequantize(const struct qd_format *f, const void *const *in,
                                                  const struct qd_params *p, struct qd_tensor *out)
{
    int64_t n = qd_tensor_numel(out);
    QD_DTYPE_SWITCH(out->dtype, DT,
                    int8_dequantize_kernel<DT><<<qd_grid((n + 7) / 8, 256), 256, 0, qd_stream()>>>(
                        f->code, p->granularity == QD_GRAN_ROW, out->cols, (const uint8_t *)in[0],
                        (const float *)in[1], f->code ? (const uint8_t *)in[2] : NULL, n, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
