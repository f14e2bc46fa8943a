/* OCP MX (mxfp4, mxfp6_e2m3/e3m2, mxfp8_e4m3/e5m2) and NVFP4 on the GPU: one thread per block
 * (32 or 16 elements), the block arithmetic of kernels/mx.h, scales linear or in the swizzled
 * 128x4 tensor-core tiling (zero padding cleared first, as on the CPU). Hopper has no e2m1/e8m0
 * cvt instructions (sm_100+): the conversions are the exact software ones in fp.h. */
#include "../mx.h"
#include "common.cuh"

struct mx_geom {
    int elem, rceil, unpacked, swizzled, data_bytes;
    int64_t scale_cols;
};

__device__ __forceinline__ int64_t scale_index(const struct mx_geom &g, int64_t block)
{
    return g.swizzled ? qd_swizzle_offset(block / g.scale_cols, block % g.scale_cols, g.scale_cols) : block;
}

template <int DT>
__global__ void mx_quantize_kernel(struct mx_geom g, const void *x, int64_t nblocks, uint8_t *data,
                                   uint8_t *scales, unsigned long long *bad)
{
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float v[QD_MX_BLOCK];
    qd_load_block<DT, QD_MX_BLOCK>(x, b * QD_MX_BLOCK, v);
    if (bad)
        for (int j = 0; j < QD_MX_BLOCK; j++)
            qd_note_nonfinite(bad, v[j], b * QD_MX_BLOCK + j);
    uint8_t packed[32];
    scales[scale_index(g, b)] = qd_mx_quantize_block(g.elem, g.rceil, g.unpacked, v, packed);
    uint8_t *o = data + b * g.data_bytes;
    if (g.data_bytes % 16 == 0)
        for (int k = 0; k < g.data_bytes / 16; k++)
            ((uint4 *)o)[k] = ((const uint4 *)packed)[k];
    else
        for (int j = 0; j < g.data_bytes; j++)
            o[j] = packed[j];
}

template <int DT>
__global__ void mx_dequantize_kernel(struct mx_geom g, const uint8_t *data, const uint8_t *scales,
                                     int64_t nblocks, void *y)
{
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    uint8_t packed[32];
    const uint8_t *p = data + b * g.data_bytes;
    for (int j = 0; j < g.data_bytes; j++)
        packed[j] = p[j];
    float v[QD_MX_BLOCK];
    qd_mx_dequantize_block(g.elem, g.unpacked, scales[scale_index(g, b)], packed, v);
    qd_store_block<DT, QD_MX_BLOCK>(y, b * QD_MX_BLOCK, v);
}

static struct mx_geom mx_setup(const struct qd_format *f, const struct qd_params *p, int64_t cols)
{
    struct mx_geom g;
    g.elem = f->code;
    g.rceil = p->scale_rounding == QD_ROUND_RCEIL;
    g.unpacked = p->fp6_packing == QD_FP6_UNPACKED;
    g.swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    g.data_bytes = qd_mx_block_data_bytes(g.elem, g.unpacked);
    g.scale_cols = cols / QD_MX_BLOCK;
    return g;
}

extern "C" enum qd_status qd_cuda_mx_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                              struct qd_params *p, void *const *out)
{
    struct mx_geom g = mx_setup(f, p, in->cols);
    int64_t nblocks = qd_tensor_numel(in) / QD_MX_BLOCK;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    if (g.swizzled)
        CUDA_CHECK(cudaMemsetAsync(out[1], 0, (size_t)qd_swizzle_bytes(in->rows, g.scale_cols), qd_stream()));
    QD_DTYPE_SWITCH(in->dtype, DT,
                    mx_quantize_kernel<DT><<<qd_grid(nblocks, 128), 128, 0, qd_stream()>>>(
                        g, in->data, nblocks, (uint8_t *)out[0], (uint8_t *)out[1], bad));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_mx_dequantize(const struct qd_format *f, const void *const *in,
                                                const struct qd_params *p, struct qd_tensor *out)
{
    struct mx_geom g = mx_setup(f, p, out->cols);
    int64_t nblocks = qd_tensor_numel(out) / QD_MX_BLOCK;
    QD_DTYPE_SWITCH(out->dtype, DT,
                    mx_dequantize_kernel<DT><<<qd_grid(nblocks, 128), 128, 0, qd_stream()>>>(
                        g, (const uint8_t *)in[0], (const uint8_t *)in[1], nblocks, out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}

/* ---- NVFP4 ---------------------------------------------------------------------------------- */

/* torchao per_tensor_amax_to_scale: amax / (F8E4M3_MAX * F4_E2M1_MAX), as on the CPU */
#define NVFP4_SCALE_DIVISOR 2688.0f

template <int DT>
__global__ void nvfp4_quantize_kernel(float pts, int swizzled, int64_t scale_cols, const void *x,
                                      int64_t nblocks, uint8_t *data, uint8_t *scales,
                                      unsigned long long *bad)
{
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float v[QD_NVFP4_BLOCK];
    qd_load_block<DT, QD_NVFP4_BLOCK>(x, b * QD_NVFP4_BLOCK, v);
    if (bad)
        for (int j = 0; j < QD_NVFP4_BLOCK; j++)
            qd_note_nonfinite(bad, v[j], b * QD_NVFP4_BLOCK + j);
    uint8_t packed[8];
    uint8_t sc = qd_nvfp4_quantize_block(pts, v, packed);
    scales[swizzled ? qd_swizzle_offset(b / scale_cols, b % scale_cols, scale_cols) : b] = sc;
    uint2 w;
    w.x = packed[0] | packed[1] << 8 | packed[2] << 16 | (uint32_t)packed[3] << 24;
    w.y = packed[4] | packed[5] << 8 | packed[6] << 16 | (uint32_t)packed[7] << 24;
    ((uint2 *)data)[b] = w;
}

template <int DT>
__global__ void nvfp4_dequantize_kernel(float pts, int swizzled, int64_t scale_cols, const uint8_t *data,
                                        const uint8_t *scales, int64_t nblocks, void *y)
{
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    uint2 w = ((const uint2 *)data)[b];
    uint8_t packed[8] = {(uint8_t)w.x, (uint8_t)(w.x >> 8), (uint8_t)(w.x >> 16), (uint8_t)(w.x >> 24),
                         (uint8_t)w.y, (uint8_t)(w.y >> 8), (uint8_t)(w.y >> 16), (uint8_t)(w.y >> 24)};
    float v[QD_NVFP4_BLOCK];
    uint8_t sc = scales[swizzled ? qd_swizzle_offset(b / scale_cols, b % scale_cols, scale_cols) : b];
    qd_nvfp4_dequantize_block(pts, sc, packed, v);
    qd_store_block<DT, QD_NVFP4_BLOCK>(y, b * QD_NVFP4_BLOCK, v);
}

extern "C" enum qd_status qd_cuda_nvfp4_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                 struct qd_params *p, void *const *out)
{
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    if (p->two_level && !p->has_per_tensor_scale) {
        if (p->has_global_scale)
            p->per_tensor_scale = 1.0f / p->global_scale;
        else { /* the two-pass case: the tensor's amax first (and the non-finite check) */
            float amax, lo, hi;
            if ((s = qd_cuda_range(in, bad, &amax, &lo, &hi)) != QD_OK || (s = qd_cuda_bad_end(bad)) != QD_OK)
                return s;
            bad = NULL; /* checked */
            p->per_tensor_scale = amax > 0.0f ? amax / NVFP4_SCALE_DIVISOR : 1.0f;
        }
        p->has_per_tensor_scale = 1;
    }
    if (p->two_level && !p->has_global_scale) {
        p->global_scale = 1.0f / p->per_tensor_scale;
        p->has_global_scale = 1;
    }
    int swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    int64_t scale_cols = in->cols / QD_NVFP4_BLOCK, nblocks = qd_tensor_numel(in) / QD_NVFP4_BLOCK;
    if (swizzled)
        CUDA_CHECK(cudaMemsetAsync(out[1], 0, (size_t)qd_swizzle_bytes(in->rows, scale_cols), qd_stream()));
    float gs = p->two_level ? p->global_scale : 1.0f;
    struct qd_scratch *h = qd_scratch_host();
    h->partial[0] = gs; /* staged in pinned memory: the copy runs in stream order */
    CUDA_CHECK(cudaMemcpyAsync(out[2], h->partial, sizeof(float), cudaMemcpyHostToDevice, qd_stream()));
    QD_DTYPE_SWITCH(in->dtype, DT,
                    nvfp4_quantize_kernel<DT><<<qd_grid(nblocks, 128), 128, 0, qd_stream()>>>(
                        p->two_level ? p->per_tensor_scale : 0.0f, swizzled, scale_cols, in->data,
                        nblocks, (uint8_t *)out[0], (uint8_t *)out[1], bad));
    CUDA_LAUNCHED();
    if (bad)
        return qd_cuda_bad_end(bad);
    return QD_OK;
}

extern "C" enum qd_status qd_cuda_nvfp4_dequantize(const struct qd_format *f, const void *const *in,
                                                   const struct qd_params *p, struct qd_tensor *out)
{
    float pts = 0.0f;
    if (p->two_level) {
        if (p->has_per_tensor_scale)
            pts = p->per_tensor_scale;
        else { /* 1 / the stored global scale, read back */
            struct qd_scratch *h = qd_scratch_host();
            CUDA_CHECK(cudaMemcpyAsync(h->partial, in[2], sizeof(float), cudaMemcpyDeviceToHost, qd_stream()));
            CUDA_CHECK(cudaStreamSynchronize(qd_stream()));
            pts = 1.0f / h->partial[0];
        }
    }
    int swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    int64_t scale_cols = out->cols / QD_NVFP4_BLOCK, nblocks = qd_tensor_numel(out) / QD_NVFP4_BLOCK;
    QD_DTYPE_SWITCH(out->dtype, DT,
                    nvfp4_dequantize_kernel<DT><<<qd_grid(nblocks, 128), 128, 0, qd_stream()>>>(
                        pts, swizzled, scale_cols, (const uint8_t *)in[0], (const uint8_t *)in[1], nblocks,
                        out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
