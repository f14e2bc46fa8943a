/* NVFP4 on the GPU (OCP MX: mx.cu): one thread per 16-element block, the block arithmetic of
 * kernels/mx.h, scales linear or in the swizzled 128x4 tensor-core tiling (zero padding cleared
 * first, as on the CPU); torchao's arithmetic, and compressed-tensors' (flow=compressed_tensors:
 * the block code of mx.h, shared with the CPU). Packed blocks and dequantized elements move
 * through shared memory per CTA (tile.cuh); the e2m1/e4m3 encoders are those of convert.cuh. */
#include "../mx.h"
#include "convert.cuh"
#include "tile.cuh"

#define NVFP4_THREADS 128

/* What every block of a call shares. The scale byte is cvt(clamp((amax / 6) / pts)) with two
 * IEEE divisions; amax * c with c = 1 / (6 pts) is within 4 ulp of that quotient, so the
 * codes of amax * lo and amax * hi (c widened by 2^-21 each way) agree exactly when no rounding
 * boundary of e4m3 lies between them, and then they are the code of the quotient (cvt and the
 * clamp are monotonic); otherwise, or for a block whose amax / 6 would be subnormal, the two
 * divisions run. The multiplier (1 / pts) / e4m3 takes one of 128 values: a table per CTA. */
struct nvfp4_consts {
    float pts, inv_pts, lo, hi;
    int fast; /* lo and hi are normal floats */
};
static_assert(sizeof(nvfp4_consts) <= sizeof(((struct qd_scratch *)0)->consts), "scratch holds the constants");

/* The constants of a per-tensor scale, on the host (a given scale) or on the device (one
 * computed there): the same IEEE operations either way. */
__host__ __device__ inline nvfp4_consts nvfp4_make_consts(int two_level, float pts)
{
    nvfp4_consts k;
    k.pts = two_level ? pts : 0.0f;
    k.inv_pts = two_level ? 1.0f / pts : 0.0f;
    double c = 1.0 / (6.0 * (k.pts > 0.0f ? (double)k.pts : 1.0)); /* 6 pts is exact in double */
    k.lo = (float)(c * (1.0 - 0x1p-21));
    k.hi = (float)(c * (1.0 + 0x1p-21));
    uint32_t el = qd_f32_bits(k.lo) >> 23 & 0xff, eh = qd_f32_bits(k.hi) >> 23 & 0xff;
    k.fast = el != 0 && el != 0xff && eh != 0 && eh != 0xff; /* both normal */
    return k;
}

/* torchao per_tensor_amax_to_scale: amax / (F8E4M3_MAX * F4_E2M1_MAX), as on the CPU */
#define NVFP4_SCALE_DIVISOR 2688.0f

/* The per-tensor scale from the range the device computed, without a host round trip: torchao's
 * decode scale and the kernels' constants (ct 0), or compressed-tensors' global scale (ct 1);
 * the global_scale component written, the scale left where qd_cuda_finish reads it. */
__global__ void nvfp4_scale_kernel(int ct, int dt, struct qd_scratch *s, float *global_scale)
{
    float amax = s->range[0];
    if (ct) {
        float g = qd_ct_nvfp4_global_scale(amax, dt);
        s->scale = g;
        s->consts[0] = g;
        *global_scale = g;
        return;
    }
    /* an all-zero tensor would give torchao 0/0 = NaN scales; 1 encodes it as zeros */
    float pts = amax > 0.0f ? amax / NVFP4_SCALE_DIVISOR : 1.0f;
    s->scale = pts;
    *global_scale = 1.0f / pts;
    nvfp4_consts k = nvfp4_make_consts(1, pts);
    memcpy(s->consts, &k, sizeof k);
}

__device__ __forceinline__ void nvfp4_table(const nvfp4_consts &k, float *rt)
{
    if (threadIdx.x < 128) /* the division qd_nvfp4_quantize_block makes per block */
        rt[threadIdx.x] = (k.pts > 0.0f ? k.inv_pts : 1.0f) / qd_e4m3_to_f32((uint8_t)threadIdx.x);
    __syncthreads();
}

/* qd_nvfp4_quantize_block with the e2m1 codes of convert.cuh: block b's scale byte and 8 bytes
 * of codes. */
template <int DT>
__device__ __forceinline__ uint8_t nvfp4_block(const nvfp4_consts &k, const float *rt, const void *x, int64_t b,
                                               uint32_t *w, unsigned long long *bad)
{
    float v[QD_NVFP4_BLOCK];
    uint32_t top = qd_load_block_top<DT, QD_NVFP4_BLOCK>(x, b * QD_NVFP4_BLOCK, v);
    uint8_t sc = 0;
    w[0] = w[1] = 0;
    bool reference = top >= 0x7f800000u; /* NaN/Inf in the block */
    if (reference)
        qd_note_first_nonfinite<QD_NVFP4_BLOCK>(bad, v, b * QD_NVFP4_BLOCK);
    else {
        float amax = qd_bits_f32(top); /* finite: the plain max of |x| */
        /* (satfinite clamps from above as the clamp to 448 does) */
        uint32_t c2 = qd_fp8x2_finite<QD_E4M3>(fmaxf(amax * k.lo, QD_E4M3_TINY), fmaxf(amax * k.hi, QD_E4M3_TINY));
        if (k.fast && amax >= 0x1p-123f && (c2 & 0xffu) == (c2 >> 8))
            sc = (uint8_t)c2;
        else {
            float block_scale = amax / 6.0f;
            sc = (uint8_t)qd_fp8x2_finite<QD_E4M3>(
                qd_clamp(k.pts > 0.0f ? block_scale / k.pts : block_scale, QD_E4M3_TINY, 448.0f), 0.0f);
        }
        float r = rt[sc & 0x7f];
        /* torchao clamps v * r to +-6 first; e2m1 saturates at 6 by itself (non-NaN values) */
        reference = !(r <= 3.40282347e38f); /* 1/pts overflowed: 0 * inf would be NaN */
#pragma unroll
        for (int j = 0; j < QD_NVFP4_BLOCK; j++)
            w[j / 8] |= qd_e2m1_finite(v[j] * r) << (4 * (j % 8));
    }
    if (reference) { /* NaN/Inf in the block, or an infinite r: the reference block code */
        uint8_t packed[8];
        sc = qd_nvfp4_quantize_block(k.pts, v, packed);
        w[0] = w[1] = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i / 4] |= (uint32_t)packed[i] << (8 * (i % 4));
    }
    return sc;
}

/* Linear scales: thread per block, in order. */
template <int DT>
__global__ void __launch_bounds__(NVFP4_THREADS) nvfp4_quantize_kernel(nvfp4_consts kv, const nvfp4_consts *kd,
                                                                    const void *x, int64_t nblocks,
                                                                    uint8_t *data, uint8_t *scales,
                                                                    float *gs_out, float gs,
                                                                    unsigned long long *bad)
{
    const nvfp4_consts k = kd ? *kd : kv; /* kd: computed on the device by nvfp4_scale_kernel */
    if (gs_out && blockIdx.x == 0 && threadIdx.x == 0) /* the global_scale component (no copy) */
        *gs_out = gs;
    __shared__ float rt[128];
    nvfp4_table(k, rt);
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    uint32_t w[2];
    scales[b] = nvfp4_block<DT>(k, rt, x, b, w, bad);
    ((uint2 *)data)[b] = make_uint2(w[0], w[1]);
}

/* Swizzled scales: one CTA per 128 x 4 tile of the scale matrix (512 blocks, two per thread),
 * the block of each (thread, pass) chosen so that a warp's 32 scale bytes are consecutive in
 * the tile (qd_swizzle_offset: byte o of a tile is row o/16 + 32 ((o/4) % 4), column o % 4);
 * four threads in a row read 128 contiguous bytes of bf16 input. The tile is written whole by
 * one CTA instead of 4 bytes at a time by 128 CTAs far apart. */
template <int DT>
__global__ void __launch_bounds__(256) nvfp4_quantize_tile_kernel(nvfp4_consts kv, const nvfp4_consts *kd,
                                                                  const void *x, int64_t rows,
                                                                  int64_t scale_cols, uint8_t *data, uint8_t *scales,
                                                                  float *gs_out, float gs,
                                                                  unsigned long long *bad)
{
    const nvfp4_consts k = kd ? *kd : kv;
    if (gs_out && blockIdx.x == 0 && threadIdx.x == 0) /* the global_scale component (no copy) */
        *gs_out = gs;
    __shared__ float rt[128];
    nvfp4_table(k, rt);
    int64_t col_tiles = (scale_cols + 3) / 4, tr = blockIdx.x / col_tiles, tc = blockIdx.x % col_tiles;
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        int o = threadIdx.x + 256 * pass;
        int64_t row = 128 * tr + o / 16 + 32 * ((o / 4) % 4), col = 4 * tc + o % 4;
        if (row >= rows || col >= scale_cols)
            continue; /* padding: the memset's zeros stay */
        int64_t b = row * scale_cols + col;
        uint32_t w[2];
        scales[(int64_t)blockIdx.x * 512 + o] = nvfp4_block<DT>(k, rt, x, b, w, bad);
        ((uint2 *)data)[b] = make_uint2(w[0], w[1]);
    }
}

/* CT: flow=compressed_tensors, whose decompressor multiplies by scale / gs (pts holds gs) */
template <int DT, bool CT>
__global__ void __launch_bounds__(NVFP4_THREADS) nvfp4_dequantize_kernel(float pts, int swizzled, int64_t scale_cols,
                                                                      const uint8_t *data, const uint8_t *scales,
                                                                      int64_t nblocks, void *y)
{
    __shared__ uint4 tile[NVFP4_THREADS * qd_tile<DT, QD_NVFP4_BLOCK>::CH];
    __shared__ float e2m1[16]; /* lanes index it independently: shared, not a local array */
    if (threadIdx.x < 16)
        e2m1[threadIdx.x] = qd_floatx_to_f32((uint8_t)threadIdx.x, 2, 1);
    __syncthreads();
    int64_t first = blockIdx.x * (int64_t)NVFP4_THREADS, b = first + threadIdx.x;
    int nvalid = nblocks - first < NVFP4_THREADS ? (int)(nblocks - first) : NVFP4_THREADS;
    if (b < nblocks && CT) {
        float v[QD_NVFP4_BLOCK];
        qd_ct_nvfp4_dequantize_block(pts, scales[qd_scale_pos(b, scale_cols, swizzled)], data + b * 8, v);
        tile_put<DT, QD_NVFP4_BLOCK>(tile, v);
    } else if (b < nblocks) { /* qd_nvfp4_dequantize_block, the same operations */
        uint2 w = ((const uint2 *)data)[b];
        float s = qd_e4m3_to_f32(scales[qd_scale_pos(b, scale_cols, swizzled)]);
        float v[QD_NVFP4_BLOCK];
#pragma unroll
        for (int j = 0; j < QD_NVFP4_BLOCK; j++) {
            float e = e2m1[((j < 8 ? w.x : w.y) >> (4 * (j % 8))) & 15] * s;
            v[j] = pts > 0.0f ? e * pts : e;
        }
        tile_put<DT, QD_NVFP4_BLOCK>(tile, v);
    }
    __syncthreads();
    tile_store<DT, QD_NVFP4_BLOCK>(tile, (uint8_t *)y + first * QD_NVFP4_BLOCK * qd_tile<DT, QD_NVFP4_BLOCK>::esize,
                                   nvalid);
}

/* flow=compressed_tensors: thread per block, kernels/mx.h's block code (its IEEE divisions
 * as they are), scales linear or swizzled. */
template <int DT>
__global__ void __launch_bounds__(NVFP4_THREADS) nvfp4_ct_quantize_kernel(float gs, const float *gsd, int swizzled,
                                                                       int64_t scale_cols, const void *x,
                                                                       int64_t nblocks, uint8_t *data,
                                                                       uint8_t *scales, float *gs_out,
                                                                       unsigned long long *bad)
{
    if (gsd) /* computed on the device by nvfp4_scale_kernel (which wrote the component) */
        gs = *gsd;
    else if (gs_out && blockIdx.x == 0 && threadIdx.x == 0) /* the global_scale component (no copy) */
        *gs_out = gs;
    int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float v[QD_NVFP4_BLOCK];
    uint32_t top = qd_load_block_top<DT, QD_NVFP4_BLOCK>(x, b * QD_NVFP4_BLOCK, v);
    uint32_t w[2] = {0, 0};
    uint8_t sb;
    if (top >= 0x7f800000u) { /* NaN/Inf: noted (or allowed), the shared block code */
        qd_note_first_nonfinite<QD_NVFP4_BLOCK>(bad, v, b * QD_NVFP4_BLOCK);
        uint8_t packed[8];
        sb = qd_ct_nvfp4_block(gs, DT, v, packed);
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i / 4] |= (uint32_t)packed[i] << (8 * (i % 4));
    } else { /* qd_ct_nvfp4_block with convert.cuh's e2m1 (the same codes for non-NaN values) */
        float eff;
        sb = qd_ct_nvfp4_scale(gs, DT, qd_bits_f32(top), &eff);
#pragma unroll
        for (int j = 0; j < QD_NVFP4_BLOCK; j++) {
            float q = v[j] / eff;
            w[j / 8] |= (q == 0.0f ? 0u : qd_e2m1_finite(q)) << (4 * (j % 8));
        }
    }
    scales[qd_scale_pos(b, scale_cols, swizzled)] = sb;
    ((uint2 *)data)[b] = make_uint2(w[0], w[1]);
}

/* The global scale a stored component holds, read back (dequantizing without the parameter). */
static enum qd_status stored_global_scale(const void *dev, float *gs)
{
    struct qd_scratch *h = qd_scratch_host();
    CUDA_CHECK(cudaMemcpyAsync(h->partial, dev, sizeof(float), cudaMemcpyDeviceToHost, qd_stream()));
    CUDA_CHECK(cudaStreamSynchronize(qd_stream()));
    *gs = h->partial[0];
    return QD_OK;
}

static enum qd_status nvfp4_ct_quantize(const struct qd_tensor *in, struct qd_params *p, void *const *out,
                                        unsigned long long *bad)
{
    enum qd_status s;
    const float *gsd = NULL;
    struct qd_scratch *d = qd_scratch_dev();
    if (!p->has_global_scale) { /* the tensor's range first (and the non-finite check), no round trip */
        if ((s = qd_cuda_range_async(in, bad)) != QD_OK)
            return s;
        nvfp4_scale_kernel<<<1, 1, 0, qd_stream()>>>(1, in->dtype, d, (float *)out[2]);
        CUDA_LAUNCHED();
        gsd = d->consts;
        qd_cuda_ctx_get()->pending_scale = 2; /* back beside the flag: qd_cuda_finish sets p's */
    }
    int swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    int64_t scale_cols = in->cols / QD_NVFP4_BLOCK, nblocks = qd_tensor_numel(in) / QD_NVFP4_BLOCK;
    if (swizzled && qd_swizzle_padded(in->rows, scale_cols))
        CUDA_CHECK(cudaMemsetAsync(out[1], 0, (size_t)qd_swizzle_bytes(in->rows, scale_cols), qd_stream()));
    QD_DTYPE_SWITCH(in->dtype, DT,
                    nvfp4_ct_quantize_kernel<DT><<<qd_grid(nblocks, NVFP4_THREADS), NVFP4_THREADS, 0, qd_stream()>>>(
                        p->global_scale, gsd, swizzled, scale_cols, in->data, nblocks, (uint8_t *)out[0],
                        (uint8_t *)out[1], (float *)out[2], bad));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_nvfp4_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                 struct qd_params *p, void *const *out)
{
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    if (p->flow == QD_FLOW_COMPRESSED_TENSORS)
        return nvfp4_ct_quantize(in, p, out, bad);
    const nvfp4_consts *kd = NULL;
    struct qd_scratch *d = qd_scratch_dev();
    if (p->two_level && !p->has_per_tensor_scale && !p->has_global_scale) {
        /* the two-pass case: the tensor's range (and the non-finite check), then the scale and
         * the constants from it on the device: no host round trip between the passes */
        if ((s = qd_cuda_range_async(in, bad)) != QD_OK)
            return s;
        nvfp4_scale_kernel<<<1, 1, 0, qd_stream()>>>(0, in->dtype, d, (float *)out[2]);
        CUDA_LAUNCHED();
        kd = (const nvfp4_consts *)d->consts;
        qd_cuda_ctx_get()->pending_scale = 1; /* back beside the flag: qd_cuda_finish sets p's */
    } else {
        if (p->two_level && !p->has_per_tensor_scale) {
            p->per_tensor_scale = 1.0f / p->global_scale;
            p->has_per_tensor_scale = 1;
        }
        if (p->two_level && !p->has_global_scale) {
            p->global_scale = 1.0f / p->per_tensor_scale;
            p->has_global_scale = 1;
        }
    }
    int swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    int64_t scale_cols = in->cols / QD_NVFP4_BLOCK, nblocks = qd_tensor_numel(in) / QD_NVFP4_BLOCK;
    if (swizzled && qd_swizzle_padded(in->rows, scale_cols)) /* else the kernel writes every byte */
        CUDA_CHECK(cudaMemsetAsync(out[1], 0, (size_t)qd_swizzle_bytes(in->rows, scale_cols), qd_stream()));
    const nvfp4_consts k = nvfp4_make_consts(p->two_level, kd ? 1.0f : p->per_tensor_scale); /* unused with kd */
    if (swizzled) {
        int64_t tiles = (in->rows + 127) / 128 * ((scale_cols + 3) / 4);
        QD_DTYPE_SWITCH(in->dtype, DT,
                        nvfp4_quantize_tile_kernel<DT><<<qd_grid(tiles, 1), 256, 0, qd_stream()>>>(
                            k, kd, in->data, in->rows, scale_cols, (uint8_t *)out[0], (uint8_t *)out[1],
                            kd ? NULL : (float *)out[2], p->two_level ? p->global_scale : 1.0f, bad));
    } else {
        QD_DTYPE_SWITCH(in->dtype, DT,
                        nvfp4_quantize_kernel<DT><<<qd_grid(nblocks, NVFP4_THREADS), NVFP4_THREADS, 0, qd_stream()>>>(
                            k, kd, in->data, nblocks, (uint8_t *)out[0], (uint8_t *)out[1],
                            kd ? NULL : (float *)out[2], p->two_level ? p->global_scale : 1.0f, bad));
    }
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_nvfp4_dequantize(const struct qd_format *f, const void *const *in,
                                                   const struct qd_params *p, struct qd_tensor *out)
{
    float pts = 0.0f;
    int swizzled = p->scale_layout == QD_LAYOUT_SWIZZLED;
    int64_t scale_cols = out->cols / QD_NVFP4_BLOCK, nblocks = qd_tensor_numel(out) / QD_NVFP4_BLOCK;
    if (p->flow == QD_FLOW_COMPRESSED_TENSORS) {
        float gs = p->global_scale;
        enum qd_status s;
        if (!p->has_global_scale && (s = stored_global_scale(in[2], &gs)) != QD_OK)
            return s;
        QD_DTYPE_SWITCH(out->dtype, DT,
                        nvfp4_dequantize_kernel<DT, true><<<qd_grid(nblocks, NVFP4_THREADS), NVFP4_THREADS, 0, qd_stream()>>>(
                            gs, swizzled, scale_cols, (const uint8_t *)in[0], (const uint8_t *)in[1], nblocks,
                            out->data));
        CUDA_LAUNCHED();
        return QD_OK;
    }
    if (p->two_level) {
        pts = p->per_tensor_scale;
        enum qd_status s;
        if (!p->has_per_tensor_scale) { /* 1 / the stored global scale */
            if ((s = stored_global_scale(in[2], &pts)) != QD_OK)
                return s;
            pts = 1.0f / pts;
        }
    }
    QD_DTYPE_SWITCH(out->dtype, DT,
                    nvfp4_dequantize_kernel<DT, false><<<qd_grid(nblocks, NVFP4_THREADS), NVFP4_THREADS, 0, qd_stream()>>>(
                        pts, swizzled, scale_cols, (const uint8_t *)in[0], (const uint8_t *)in[1], nblocks,
                        out->data));
    CUDA_LAUNCHED();
    return QD_OK;
}
