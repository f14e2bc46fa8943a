/* MLX's formats on the GPU (kernels/mlx.h, the CPU's arithmetic): one thread per 32 elements,
 * whose codes are `bits` whole words of the row's bit stream. mlx_affine's groups of 64 and 128
 * span 2 and 4 adjacent lanes, which share their minimum and maximum through shuffles; mxfp4 and
 * mxfp8 take one group per thread, nvfp4 two. Packed words and dequantized elements move
 * through shared memory per CTA (tile.cuh). */
#include "../mlx.h"
#include "tile.cuh"

#define MLX_THREADS 128

struct mlx_geom {
    int mode, bits, group, sdt; /* sdt: affine's scale dtype */
    float enc, inv;             /* nvfp4: 2688 / global_scale, global_scale / 2688 (0: none) */
};

template <int DT> __device__ __forceinline__ void store_scalar(void *dst, int64_t i, float v)
{
    if (DT == QD_F32)
        ((float *)dst)[i] = v;
    else
        ((uint16_t *)dst)[i] = DT == QD_F16 ? qd_f32_to_f16(v) : qd_f32_to_bf16(v);
}

__device__ __forceinline__ float load_scalar(const void *src, int64_t i, int dt)
{
    if (dt == QD_F32)
        return ((const float *)src)[i];
    uint16_t h = ((const uint16_t *)src)[i];
    return dt == QD_F16 ? qd_f16_to_f32(h) : qd_bf16_to_f32(h);
}

/* The thread's 32 elements (zeros past the end, so that every lane of a group takes part in
 * its shuffles); the first non-finite one is noted. */
template <int DT>
__device__ __forceinline__ void mlx_load(const void *x, int64_t c, bool live, unsigned long long *bad, float *v)
{
    if (!live) {
        for (int j = 0; j < QD_MLX_CHUNK; j++)
            v[j] = 0.0f;
        return;
    }
    qd_load_block<DT, QD_MLX_CHUNK>(x, c * QD_MLX_CHUNK, v);
    qd_check_block<QD_MLX_CHUNK>(bad, v, c * QD_MLX_CHUNK);
}

/* The CTA's packed words (BITS per thread), written out together. */
template <int BITS>
__device__ __forceinline__ void mlx_store_words(uint32_t *staged, const uint32_t *w, uint32_t *out, int64_t first,
                                                int nvalid)
{
#pragma unroll
    for (int k = 0; k < BITS; k++)
        staged[threadIdx.x * BITS + k] = w[k];
    __syncthreads();
    cta_copy((uint8_t *)(out + first * BITS), (const uint8_t *)staged, nvalid * BITS * 4);
}

/* mlx_affine: lanes of one group (group / 32 of them) fold their min and max together. The
 * quotient (x - bias) / scale is the division's (qd_quotient: exact for |x - bias| >= 2^-90
 * when |scale| is within 2^+-60, the quotients being at most ~2^9; below 2^-90 both round to
 * code 0); other scales (eps-sized groups, an infinite 1-bit range) take the division. */
template <int DT, int BITS>
__global__ void __launch_bounds__(MLX_THREADS) mlx_affine_quantize_kernel(int group, const void *x, int64_t nchunks,
                                                                           uint32_t *words, void *scales, void *biases,
                                                                           unsigned long long *bad)
{
    __shared__ __align__(16) uint32_t staged[MLX_THREADS * BITS];
    int64_t first = blockIdx.x * (int64_t)MLX_THREADS, c = first + threadIdx.x;
    bool live = c < nchunks;
    float v[QD_MLX_CHUNK];
    mlx_load<DT>(x, c, live, bad, v);
    float lo = v[0], hi = v[0];
#pragma unroll
    for (int j = 1; j < QD_MLX_CHUNK; j++) {
        lo = v[j] < lo ? v[j] : lo;
        hi = v[j] > hi ? v[j] : hi;
    }
    for (int o = 1; o < group / QD_MLX_CHUNK; o <<= 1) { /* a group's lanes are adjacent and aligned */
        float l = __shfl_xor_sync(0xffffffffu, lo, o), h = __shfl_xor_sync(0xffffffffu, hi, o);
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
    }
    float scale, bias;
    qd_mlx_affine_params(lo, hi, BITS, &scale, &bias);
    const float nbins = (float)((1 << BITS) - 1);
    float a = qd_absf(scale), y = __frcp_rn(scale);
    bool fast = a >= 0x1p-60f && a <= 0x1p60f;
    uint32_t codes[QD_MLX_CHUNK], w[BITS];
#pragma unroll
    for (int j = 0; j < QD_MLX_CHUNK; j++) {
        float d = v[j] - bias;
        codes[j] = qd_mlx_affine_code(fast ? qd_quotient(d, scale, y) : __fdiv_rn(d, scale), nbins);
    }
    qd_mlx_pack32(codes, BITS, w);
    int per = group / QD_MLX_CHUNK;
    if (live && c % per == 0) {
        store_scalar<DT>(scales, c / per, scale);
        store_scalar<DT>(biases, c / per, bias);
    }
    int nvalid = nchunks - first < MLX_THREADS ? (int)(nchunks - first) : MLX_THREADS;
    mlx_store_words<BITS>(staged, w, words, first, nvalid);
}

template <int DT, int BITS>
__global__ void __launch_bounds__(MLX_THREADS) mlx_affine_dequantize_kernel(int group, int sdt, const uint32_t *words,
                                                                             const void *scales, const void *biases,
                                                                             int64_t nchunks, void *out)
{
    __shared__ __align__(16) uint32_t staged[MLX_THREADS * BITS];
    __shared__ uint4 tile[MLX_THREADS * qd_tile<DT, QD_MLX_CHUNK>::CH];
    int64_t first = blockIdx.x * (int64_t)MLX_THREADS, c = first + threadIdx.x;
    int nvalid = nchunks - first < MLX_THREADS ? (int)(nchunks - first) : MLX_THREADS;
    cta_copy((uint8_t *)staged, (const uint8_t *)(words + first * BITS), nvalid * BITS * 4);
    __syncthreads();
    if (c < nchunks) {
        int64_t g = c / (group / QD_MLX_CHUNK);
        float scale = load_scalar(scales, g, sdt), bias = load_scalar(biases, g, sdt), v[QD_MLX_CHUNK];
        const uint32_t *w = staged + threadIdx.x * BITS;
#pragma unroll
        for (int j = 0; j < QD_MLX_CHUNK; j++)
            v[j] = qd_mlx_affine_value(qd_mlx_unpack(w, BITS, j), scale, bias, sdt);
        tile_put<DT, QD_MLX_CHUNK>(tile, v);
    }
    __syncthreads();
    tile_store<DT, QD_MLX_CHUNK>(tile, (uint8_t *)out + first * QD_MLX_CHUNK * qd_tile<DT, QD_MLX_CHUNK>::esize,
                                 nvalid);
}

/* mxfp4 / mxfp8 (one group of 32 per thread) and nvfp4 (two groups of 16): BITS words of codes
 * and 1 or 2 scale bytes per thread. */
template <int DT, int MODE>
__global__ void __launch_bounds__(MLX_THREADS) mlx_fp_quantize_kernel(float enc, const void *x, int64_t nchunks,
                                                                       uint32_t *words, uint8_t *scales,
                                                                       unsigned long long *bad)
{
    constexpr int BITS = MODE == QD_MLX_MXFP8 ? 8 : 4;
    __shared__ __align__(16) uint32_t staged[MLX_THREADS * BITS];
    int64_t first = blockIdx.x * (int64_t)MLX_THREADS, c = first + threadIdx.x;
    uint32_t w[BITS];
    if (c < nchunks) {
        float v[QD_MLX_CHUNK];
        mlx_load<DT>(x, c, true, bad, v);
        if (MODE == QD_MLX_NVFP4) {
            scales[2 * c] = qd_mlx_nv_group(DT, enc, v, w);
            scales[2 * c + 1] = qd_mlx_nv_group(DT, enc, v + QD_MLX_NV_GROUP, w + 2);
        } else
            scales[c] = qd_mlx_mx_group(DT, MODE == QD_MLX_MXFP8, v, w);
    }
    int nvalid = nchunks - first < MLX_THREADS ? (int)(nchunks - first) : MLX_THREADS;
    mlx_store_words<BITS>(staged, w, words, first, nvalid);
}

/* The values as the CPU computes them (f32, exact products but nvfp4's global scale), rounded
 * once to the output dtype by the tile. */
template <int DT, int MODE>
__global__ void __launch_bounds__(MLX_THREADS) mlx_fp_dequantize_kernel(float inv, const uint32_t *words,
                                                                         const uint8_t *scales, int64_t nchunks,
                                                                         void *out)
{
    constexpr int BITS = MODE == QD_MLX_MXFP8 ? 8 : 4;
    __shared__ __align__(16) uint32_t staged[MLX_THREADS * BITS];
    __shared__ uint4 tile[MLX_THREADS * qd_tile<DT, QD_MLX_CHUNK>::CH];
    int64_t first = blockIdx.x * (int64_t)MLX_THREADS, c = first + threadIdx.x;
    int nvalid = nchunks - first < MLX_THREADS ? (int)(nchunks - first) : MLX_THREADS;
    cta_copy((uint8_t *)staged, (const uint8_t *)(words + first * BITS), nvalid * BITS * 4);
    __syncthreads();
    if (c < nchunks) {
        const uint32_t *w = staged + threadIdx.x * BITS;
        float v[QD_MLX_CHUNK];
        if (MODE == QD_MLX_MXFP8) {
            float s = qd_mlx_mx_scale(scales[c], DT);
#pragma unroll
            for (int j = 0; j < QD_MLX_CHUNK; j++)
                v[j] = qd_e4m3_to_f32((uint8_t)(w[j / 4] >> (8 * (j % 4)))) * s;
        } else {
            float s0 = MODE == QD_MLX_NVFP4 ? qd_mlx_nv_scale(scales[2 * c], inv) : qd_mlx_mx_scale(scales[c], DT);
            float s1 = MODE == QD_MLX_NVFP4 ? qd_mlx_nv_scale(scales[2 * c + 1], inv) : s0;
#pragma unroll
            for (int j = 0; j < QD_MLX_CHUNK; j++)
                v[j] = qd_floatx_to_f32((w[j / 8] >> (4 * (j % 8))) & 15, 2, 1) * (j < QD_MLX_NV_GROUP ? s0 : s1);
        }
        tile_put<DT, QD_MLX_CHUNK>(tile, v);
    }
    __syncthreads();
    tile_store<DT, QD_MLX_CHUNK>(tile, (uint8_t *)out + first * QD_MLX_CHUNK * qd_tile<DT, QD_MLX_CHUNK>::esize,
                                 nvalid);
}

#define MLX_BITS_SWITCH(b, BITS, ...)                                                           \
    switch (b) {                                                                                \
    case 1: { constexpr int BITS = 1; __VA_ARGS__; } break;                                     \
    case 2: { constexpr int BITS = 2; __VA_ARGS__; } break;                                     \
    case 3: { constexpr int BITS = 3; __VA_ARGS__; } break;                                     \
    case 4: { constexpr int BITS = 4; __VA_ARGS__; } break;                                     \
    case 5: { constexpr int BITS = 5; __VA_ARGS__; } break;                                     \
    case 6: { constexpr int BITS = 6; __VA_ARGS__; } break;                                     \
    case 8: { constexpr int BITS = 8; __VA_ARGS__; } break;                                     \
    default: QD_SWITCH_UNKNOWN();                                                               \
    }

#define MLX_MODE_SWITCH(m, MODE, ...)                                                           \
    switch (m) {                                                                                \
    case QD_MLX_MXFP4: { constexpr int MODE = QD_MLX_MXFP4; __VA_ARGS__; } break;               \
    case QD_MLX_NVFP4: { constexpr int MODE = QD_MLX_NVFP4; __VA_ARGS__; } break;               \
    case QD_MLX_MXFP8: { constexpr int MODE = QD_MLX_MXFP8; __VA_ARGS__; } break;               \
    default: QD_SWITCH_UNKNOWN();                                                               \
    }

static struct mlx_geom mlx_setup(const struct qd_format *f, const struct qd_params *p)
{
    struct mlx_geom g;
    g.mode = f->code;
    g.group = g.mode == QD_MLX_AFFINE ? p->group_size : g.mode == QD_MLX_NVFP4 ? QD_MLX_NV_GROUP : QD_MLX_MX_GROUP;
    g.bits = g.mode == QD_MLX_AFFINE ? p->bits : g.mode == QD_MLX_MXFP8 ? 8 : 4;
    g.sdt = QD_F32;
    int gs = g.mode == QD_MLX_NVFP4 && p->has_global_scale;
    g.enc = gs ? QD_MLX_NV_ENCODE / p->global_scale : 1.0f;
    g.inv = gs ? p->global_scale / QD_MLX_NV_ENCODE : 0.0f;
    return g;
}

extern "C" enum qd_status qd_cuda_mlx_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                               struct qd_params *p, void *const *out)
{
    struct mlx_geom g = mlx_setup(f, p);
    int64_t nchunks = qd_tensor_numel(in) / QD_MLX_CHUNK;
    if (g.mode == QD_MLX_AFFINE) {
        int own = qd_mlx_scale_dtype_of(in->dtype);
        if (p->scale_dtype != QD_SCALE_AUTO && p->scale_dtype != own)
            return QD_EINVAL; /* mlx keeps the scales and biases in the input's dtype */
        p->scale_dtype = own;
    }
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    unsigned grid = qd_grid(nchunks, MLX_THREADS);
    if (g.mode == QD_MLX_AFFINE) {
        QD_DTYPE_SWITCH(in->dtype, DT, MLX_BITS_SWITCH(g.bits, BITS,
                        mlx_affine_quantize_kernel<DT, BITS><<<grid, MLX_THREADS, 0, qd_stream()>>>(
                            g.group, in->data, nchunks, (uint32_t *)out[0], out[1], out[2], bad)));
    } else {
        QD_DTYPE_SWITCH(in->dtype, DT, MLX_MODE_SWITCH(g.mode, MODE,
                        mlx_fp_quantize_kernel<DT, MODE><<<grid, MLX_THREADS, 0, qd_stream()>>>(
                            g.enc, in->data, nchunks, (uint32_t *)out[0], (uint8_t *)out[1], bad)));
    }
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_mlx_dequantize(const struct qd_format *f, const void *const *in,
                                                 const struct qd_params *p, struct qd_tensor *out)
{
    struct mlx_geom g = mlx_setup(f, p);
    int64_t nchunks = qd_tensor_numel(out) / QD_MLX_CHUNK;
    unsigned grid = qd_grid(nchunks, MLX_THREADS);
    if (g.mode == QD_MLX_AFFINE) {
        int sdt = qd_mlx_scale_dtype_to(p->scale_dtype, out->dtype);
        QD_DTYPE_SWITCH(out->dtype, DT, MLX_BITS_SWITCH(g.bits, BITS,
                        mlx_affine_dequantize_kernel<DT, BITS><<<grid, MLX_THREADS, 0, qd_stream()>>>(
                            g.group, sdt, (const uint32_t *)in[0], in[1], in[2], nchunks, out->data)));
    } else {
        QD_DTYPE_SWITCH(out->dtype, DT, MLX_MODE_SWITCH(g.mode, MODE,
                        mlx_fp_dequantize_kernel<DT, MODE><<<grid, MLX_THREADS, 0, qd_stream()>>>(
                            g.inv, (const uint32_t *)in[0], (const uint8_t *)in[1], nchunks, out->data)));
    }
    CUDA_LAUNCHED();
    return QD_OK;
}
