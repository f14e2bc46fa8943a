/* compressed-tensors integers (w4a16, w8a16: kernels/ctint.h) on the GPU, the CPU's group
 * arithmetic. Quantize: one thread per (row, group); the threads of the 32 / BITS rows that share
 * a zero-point word (packed along the output dimension) are consecutive lanes of a warp, so the
 * asymmetric zero points are gathered with shuffles, no second pass (group_size 128, the
 * schemes' own, has a faster kernel below). Dequantize: one thread per
 * 8 elements of one group (one packed word of int4, two of int8). */
#include "../ctint.h"
#include "common.cuh"

#define CT_THREADS 256

/* the arithmetic's dtype code (ctint.h): 0 f32, 1 f16, 2 bf16 */
static int ct_code(int dtype) { return dtype == QD_BF16 ? 2 : dtype == QD_F16 ? 1 : 0; }

__device__ __forceinline__ void ct_put_scale(void *s, int64_t i, float v, int dt)
{
    if (dt == 0)
        ((float *)s)[i] = v;
    else
        ((uint16_t *)s)[i] = dt == 2 ? qd_f32_to_bf16(v) : qd_f32_to_f16(v);
}

__device__ __forceinline__ float ct_get_scale(const void *s, int64_t i, int dt)
{
    if (dt == 0)
        return ((const float *)s)[i];
    uint16_t h = ((const uint16_t *)s)[i];
    return dt == 2 ? qd_bf16_to_f32(h) : qd_f16_to_f32(h);
}

template <int DT, int BITS>
__global__ void ctint_quantize_kernel(const void *x, int64_t rows, int64_t cols, int gs, int sym, uint32_t *packed,
                                      void *scales, uint32_t *zps, unsigned long long *bad)
{
    constexpr int PER = 32 / BITS, OFF = 1 << (BITS - 1); /* codes (and zero-point rows) per word */
    constexpr uint32_t MASK = (1u << BITS) - 1;
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t groups = cols / gs, words = (rows + PER - 1) / PER;
    const int i = (int)(t % PER);
    const int64_t g = (t / PER) % groups, w = t / PER / groups, r = PER * w + i;
    const int dt = DT == QD_BF16 ? 2 : DT == QD_F16 ? 1 : 0;
    uint32_t zbits = 0;
    if (w < words && r < rows) {
        const int64_t first = r * cols + g * gs;
        float mn = 0.0f, mx = 0.0f;
        for (int j = 0; j < gs; j += 8) {
            float v[8];
            if (qd_load_block_top<DT, 8>(x, first + j, v) >= 0x7f800000u)
                qd_note_first_nonfinite<8>(bad, v, first + j);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                mn = (j | k) == 0 || v[k] < mn ? v[k] : mn;
                mx = (j | k) == 0 || v[k] > mx ? v[k] : mx;
            }
        }
        int zp;
        const float scale = qd_ct_int_qparams_mm(mn, mx, BITS, sym, dt, &zp);
        ct_put_scale(scales, r * groups + g, scale, dt);
        zbits = ((uint32_t)(zp + OFF) & MASK) << (BITS * i);
        for (int j = 0; j < gs; j += 8) {
            float v[8];
            qd_load_block<DT, 8>(x, first + j, v);
            uint32_t word[8 / PER > 0 ? 8 / PER : 1] = {0};
#pragma unroll
            for (int k = 0; k < 8; k++)
                word[k / PER] |= ((uint32_t)(qd_ct_int_code(v[k], scale, zp, BITS) + OFF) & MASK)
                                 << (BITS * (k % PER));
#pragma unroll
            for (int q = 0; q < 8 / PER; q++)
                packed[(first + j) / PER + q] = word[q];
        }
    }
    if (!sym) { /* every lane takes part in the shuffles, in range or not */
#pragma unroll
        for (int m = 1; m < PER; m <<= 1)
            zbits |= __shfl_xor_sync(0xffffffffu, zbits, m);
        if (i == 0 && w < words)
            zps[w * groups + g] = zbits;
    }
}

template <int DT, int BITS>
__global__ void ctint_dequantize_kernel(const uint32_t *packed, const void *scales, const uint32_t *zps, int64_t rows,
                                        int64_t cols, int gs, int sym, int dt, void *y)
{
    constexpr int PER = 32 / BITS, OFF = 1 << (BITS - 1);
    constexpr uint32_t MASK = (1u << BITS) - 1;
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, e0 = 8 * t;
    if (e0 >= rows * cols)
        return;
    const int64_t groups = cols / gs, r = e0 / cols, g = (e0 % cols) / gs;
    const float scale = ct_get_scale(scales, r * groups + g, dt);
    const int zp = sym ? 0 : (int)((zps[(r / PER) * groups + g] >> (BITS * (r % PER))) & MASK) - OFF;
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t word = packed[e0 / PER + k / PER];
        v[k] = qd_ct_int_value((int)((word >> (BITS * (k % PER))) & MASK) - OFF, zp, scale, dt);
    }
    qd_store_block<DT, 8>(y, e0, v);
}

/* group_size 128 (the schemes' own): a warp per (row, group), 4 elements per lane, loaded
 * coalesced in one pass; the group's min and max by shuffles; a CTA of 8 warps takes 8 rows of
 * one group, so the zero-point words of those rows are put together in shared memory. */
#define CT_WARPS 8
template <int DT, int BITS>
__global__ void __launch_bounds__(32 * CT_WARPS)
    ctint_quantize_g128_kernel(const void *x, int64_t rows, int64_t cols, int sym, uint32_t *packed, void *scales,
                               uint32_t *zps, unsigned long long *bad)
{
    constexpr int PER = 32 / BITS, OFF = 1 << (BITS - 1);
    constexpr uint32_t MASK = (1u << BITS) - 1;
    __shared__ uint32_t zrow[CT_WARPS];
    const int64_t groups = cols / 128, g = blockIdx.x % groups, rb = blockIdx.x / groups;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r = rb * CT_WARPS + warp;
    const int dt = DT == QD_BF16 ? 2 : DT == QD_F16 ? 1 : 0;
    uint32_t zr = 0; /* lane 0: this row's zero point in its word */
    if (r < rows) { /* whole warps in or out: the shuffles below see all 32 lanes */
        const int64_t first = r * cols + g * 128 + 4 * lane;
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = qd_load<DT>(x, first + k);
        qd_note_first_nonfinite<4>(bad, v, first);
        float mn = fminf(fminf(v[0], v[1]), fminf(v[2], v[3])), mx = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, m));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
        }
        int zp;
        const float scale = qd_ct_int_qparams_mm(mn, mx, BITS, sym, dt, &zp);
        uint32_t bits = 0; /* this lane's four codes, BITS each */
#pragma unroll
        for (int k = 0; k < 4; k++)
            bits |= ((uint32_t)(qd_ct_int_code(v[k], scale, zp, BITS) + OFF) & MASK) << (BITS * k);
        if (BITS == 4) { /* a word is two lanes' codes */
            const uint32_t hi = __shfl_down_sync(0xffffffffu, bits, 1);
            if (lane % 2 == 0)
                packed[first / 8] = bits | hi << 16;
        } else
            packed[first / 4] = bits;
        if (lane == 0) {
            ct_put_scale(scales, r * groups + g, scale, dt);
            zr = ((uint32_t)(zp + OFF) & MASK) << (BITS * (r % PER));
        }
    }
    if (lane == 0)
        zrow[warp] = zr;
    __syncthreads();
    if (!sym && threadIdx.x < CT_WARPS / PER) { /* the zero-point words of these rows */
        const int64_t w = rb * (CT_WARPS / PER) + threadIdx.x;
        if (w * PER < rows) {
            uint32_t word = 0;
            for (int k = 0; k < PER; k++)
                word |= zrow[threadIdx.x * PER + k];
            zps[w * groups + g] = word;
        }
    }
}

#define CT_BITS_SWITCH(bits, BITS, ...)                                                         \
    switch (bits) {                                                                             \
    case 4: { constexpr int BITS = 4; __VA_ARGS__; } break;                                     \
    case 8: { constexpr int BITS = 8; __VA_ARGS__; } break;                                     \
    default: QD_SWITCH_UNKNOWN();                                                               \
    }

extern "C" enum qd_status qd_cuda_ctint_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                 struct qd_params *p, void *const *out)
{
    static const int resolved[] = {[QD_F32] = QD_SCALE_F32, [QD_F16] = QD_SCALE_F16, [QD_BF16] = QD_SCALE_BF16};
    if (p->scale_dtype != QD_SCALE_AUTO && p->scale_dtype != resolved[in->dtype])
        return QD_EINVAL; /* compressed-tensors computes in, and keeps, the weight's dtype */
    p->scale_dtype = resolved[in->dtype];
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK)
        return s;
    const int per = 32 / f->code;
    const int64_t groups = in->cols / p->group_size, threads = (in->rows + per - 1) / per * groups * per;
    if (p->group_size == 128) {
        const int64_t ctas = (in->rows + CT_WARPS - 1) / CT_WARPS * groups;
        QD_DTYPE_SWITCH(in->dtype, DT, CT_BITS_SWITCH(f->code, BITS,
                        ctint_quantize_g128_kernel<DT, BITS><<<qd_grid(ctas, 1), 32 * CT_WARPS, 0, qd_stream()>>>(
                            in->data, in->rows, in->cols, p->symmetric, (uint32_t *)out[0], out[1],
                            p->symmetric ? NULL : (uint32_t *)out[2], bad)));
    } else
    QD_DTYPE_SWITCH(in->dtype, DT, CT_BITS_SWITCH(f->code, BITS,
                    ctint_quantize_kernel<DT, BITS><<<qd_grid(threads, CT_THREADS), CT_THREADS, 0, qd_stream()>>>(
                        in->data, in->rows, in->cols, p->group_size, p->symmetric, (uint32_t *)out[0], out[1],
                        p->symmetric ? NULL : (uint32_t *)out[2], bad)));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_ctint_dequantize(const struct qd_format *f, const void *const *in,
                                                   const struct qd_params *p, struct qd_tensor *out)
{
    const int dt = p->scale_dtype == QD_SCALE_AUTO ? ct_code(out->dtype)
                   : p->scale_dtype == QD_SCALE_BF16 ? 2
                   : p->scale_dtype == QD_SCALE_F16  ? 1
                                                     : 0;
    const int64_t words = qd_tensor_numel(out) / 8; /* threads: 8 elements each */
    QD_DTYPE_SWITCH(out->dtype, DT, CT_BITS_SWITCH(f->code, BITS,
                    ctint_dequantize_kernel<DT, BITS><<<qd_grid(words, CT_THREADS), CT_THREADS, 0, qd_stream()>>>(
                        (const uint32_t *)in[0], in[1], p->symmetric ? NULL : (const uint32_t *)in[2], out->rows,
                        out->cols, p->group_size, p->symmetric, dt, out->data)));
    CUDA_LAUNCHED();
    return QD_OK;
}
