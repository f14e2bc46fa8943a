/* compressed-tensors int4 (w4a16, kernels/ctint.h) on the GPU, the CPU's group arithmetic.
 * Quantize: one thread per (row, group); the eight threads of a row octet are eight
 * consecutive lanes of a warp, so the asymmetric zero points (eight rows per int32 word, packed
 * along the output dimension) are gathered with shuffles, no second pass. Dequantize: one
 * thread per packed word (eight elements of one group). */
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

template <int DT>
__global__ void ctint_quantize_kernel(const void *x, int64_t rows, int64_t cols, int gs, int sym, uint32_t *packed,
                                      void *scales, uint32_t *zps, unsigned long long *bad)
{
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t groups = cols / gs, octets = (rows + 7) / 8;
    const int i = (int)(t % 8);
    const int64_t g = (t / 8) % groups, w = t / 8 / groups, r = 8 * w + i;
    const int dt = DT == QD_BF16 ? 2 : DT == QD_F16 ? 1 : 0;
    uint32_t nibble = 0;
    if (w < octets && r < rows) {
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
        const float scale = qd_ct_int4_qparams_mm(mn, mx, sym, dt, &zp);
        ct_put_scale(scales, r * groups + g, scale, dt);
        nibble = (uint32_t)((zp + 8) & 15) << (4 * i);
        for (int j = 0; j < gs; j += 8) {
            float v[8];
            qd_load_block<DT, 8>(x, first + j, v);
            uint32_t word = 0;
#pragma unroll
            for (int k = 0; k < 8; k++)
                word |= (uint32_t)((qd_ct_int4_code(v[k], scale, zp, dt) + 8) & 15) << (4 * k);
            packed[(first + j) / 8] = word;
        }
    }
    if (!sym) { /* every lane takes part in the shuffles, in range or not */
        nibble |= __shfl_xor_sync(0xffffffffu, nibble, 1);
        nibble |= __shfl_xor_sync(0xffffffffu, nibble, 2);
        nibble |= __shfl_xor_sync(0xffffffffu, nibble, 4);
        if (i == 0 && w < octets)
            zps[w * groups + g] = nibble;
    }
}

template <int DT>
__global__ void ctint_dequantize_kernel(const uint32_t *packed, const void *scales, const uint32_t *zps, int64_t rows,
                                        int64_t cols, int gs, int sym, int dt, void *y)
{
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, e0 = 8 * t;
    if (e0 >= rows * cols)
        return;
    const int64_t groups = cols / gs, r = e0 / cols, g = (e0 % cols) / gs;
    const float scale = ct_get_scale(scales, r * groups + g, dt);
    const int zp = sym ? 0 : (int)((zps[(r / 8) * groups + g] >> (4 * (r % 8))) & 15) - 8;
    const uint32_t word = packed[t];
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        v[k] = qd_ct_int4_value((int)((word >> (4 * k)) & 15) - 8, zp, scale, dt);
    qd_store_block<DT, 8>(y, e0, v);
}

extern "C" enum qd_status qd_cuda_ctint_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                 struct qd_params *p, void *const *out)
{
    (void)f;
    static const int resolved[] = {[QD_F32] = QD_SCALE_F32, [QD_F16] = QD_SCALE_F16, [QD_BF16] = QD_SCALE_BF16};
    if (p->scale_dtype != QD_SCALE_AUTO && p->scale_dtype != resolved[in->dtype])
        return QD_EINVAL; /* compressed-tensors computes in, and keeps, the weight's dtype */
    p->scale_dtype = resolved[in->dtype];
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(1, &bad);
    if (s != QD_OK)
        return s;
    const int64_t groups = in->cols / p->group_size, threads = (in->rows + 7) / 8 * groups * 8;
    QD_DTYPE_SWITCH(in->dtype, DT,
                    ctint_quantize_kernel<DT><<<qd_grid(threads, CT_THREADS), CT_THREADS, 0, qd_stream()>>>(
                        in->data, in->rows, in->cols, p->group_size, p->symmetric, (uint32_t *)out[0], out[1],
                        p->symmetric ? NULL : (uint32_t *)out[2], bad));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_ctint_dequantize(const struct qd_format *f, const void *const *in,
                                                   const struct qd_params *p, struct qd_tensor *out)
{
    (void)f;
    const int dt = p->scale_dtype == QD_SCALE_AUTO ? ct_code(out->dtype)
                   : p->scale_dtype == QD_SCALE_BF16 ? 2
                   : p->scale_dtype == QD_SCALE_F16  ? 1
                                                     : 0;
    const int64_t words = qd_tensor_numel(out) / 8;
    QD_DTYPE_SWITCH(out->dtype, DT,
                    ctint_dequantize_kernel<DT><<<qd_grid(words, CT_THREADS), CT_THREADS, 0, qd_stream()>>>(
                        (const uint32_t *)in[0], in[1], p->symmetric ? NULL : (const uint32_t *)in[2], out->rows,
                        out->cols, p->group_size, p->symmetric, dt, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
