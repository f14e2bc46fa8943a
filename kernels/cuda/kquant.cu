/* llama.cpp K-quants (q2_K q3_K q4_K q5_K q6_K) on the GPU, with the CPU's block code
 * (kernels/kquants.h, built without FMA contraction like the rest of the CUDA sources).
 *
 * Quantize: the expensive part of a super-block is the search for each sub-block's scale (and
 * minimum), and the sub-blocks are independent, so a CTA of 128 threads takes 128 sub-blocks
 * (16 super-blocks of q4_K/q5_K, 8 of the others), one search per thread over the elements
 * staged in shared memory. What is left (quantizing the sub-block scales against the largest
 * into the header, the codes again from the stored scales, the packing) runs in the CPU's own
 * three steps: the header on one thread per super-block, the codes again on one thread per
 * sub-block, the packing on one thread per super-block, into shared memory; the whole CTA
 * writes the packed blocks out.
 *
 * Dequantize: each thread 8 consecutive elements of one super-block (one sub-block scale), the
 * same products as dequantize_row_<type> in the same order. */
#include "../kquants.h"
#include "tile.cuh"

#define KQ_THREADS 128

template <int TYPE> struct kq {
    static constexpr int NS = (TYPE == QD_Q4_K || TYPE == QD_Q5_K) ? 8 : 16; /* sub-blocks */
    static constexpr int S = QD_QK_K / NS;                                    /* their size */
    static constexpr int SB = KQ_THREADS / NS;                                /* super-blocks per CTA */
    static constexpr int BYTES = TYPE == QD_Q2_K ? sizeof(qd_block_q2_K) : TYPE == QD_Q3_K ? sizeof(qd_block_q3_K)
                                 : TYPE == QD_Q4_K ? sizeof(qd_block_q4_K) : TYPE == QD_Q5_K ? sizeof(qd_block_q5_K)
                                                   : sizeof(qd_block_q6_K);
};

/* Sub-block j's search over x[0, S), as qd_kq_search_q45 / qd_kq_quantize_q2 / _q3 / _q6 run it
 * for that j: its scale, its minimum (the affine types) and codes into L. */
template <int TYPE> __device__ __forceinline__ void kq_search(const float *x, uint8_t *L, float *scale, float *min)
{
    if (TYPE == QD_Q4_K || TYPE == QD_Q5_K) {
        constexpr int five = TYPE == QD_Q5_K;
        uint8_t Laux[32];
        float weights[32];
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[l] * x[l];
        float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++)
            weights[l] = av_x + qd_absf(x[l]);
        *scale = qd_kq_make_qkx2(32, five ? 31 : 15, x, weights, L, min, Laux, five ? -0.5f : -1.0f, 0.1f,
                                 five ? 15 : 20, 0);
    } else if (TYPE == QD_Q2_K) {
        uint8_t Laux[16];
        float weights[16];
        for (int l = 0; l < 16; l++)
            weights[l] = qd_absf(x[l]);
        *scale = qd_kq_make_qkx2(16, 3, x, weights, L, min, Laux, -0.5f, 0.1f, 15, 1);
    } else if (TYPE == QD_Q3_K)
        *scale = qd_kq_make_q3(16, 4, x, (int8_t *)L);
    else
        *scale = qd_kq_make_qx(16, 32, x, (int8_t *)L, NULL);
}

template <int DT, int TYPE>
__global__ void __launch_bounds__(KQ_THREADS) kquant_quantize_kernel(const void *x, int64_t nblocks, uint8_t *out,
                                                                   unsigned long long *bad)
{
    using K = kq<TYPE>;
    __shared__ float xs[K::SB * QD_QK_K];
    __shared__ uint8_t L[K::SB * QD_QK_K];
    __shared__ float scales[KQ_THREADS], mins[KQ_THREADS];
    __shared__ __align__(16) uint8_t staged[K::SB * K::BYTES];
    const int t = threadIdx.x, sb = t / K::NS;
    const int64_t first = blockIdx.x * (int64_t)K::SB;
    const int nvalid = nblocks - first < K::SB ? (int)(nblocks - first) : K::SB;

    if (sb < nvalid) {
        float v[K::S];
        const int64_t e0 = first * QD_QK_K + (int64_t)t * K::S;
        if (qd_load_block_top<DT, K::S>(x, e0, v) >= 0x7f800000u)
            qd_note_first_nonfinite<K::S>(bad, v, e0);
#pragma unroll
        for (int l = 0; l < K::S; l++)
            xs[t * K::S + l] = v[l];
        kq_search<TYPE>(xs + t * K::S, L + t * K::S, &scales[t], &mins[t]);
    }
    __syncthreads();
    /* the header of each super-block (its thread), then every sub-block's codes (its thread),
     * then the packing (the super-block's thread), as qd_kq_finish_<type> runs them */
    __shared__ int complete[K::SB]; /* q6_K: an all-zero block is done after its header */
    if (t < nvalid) {
        uint8_t *blk = staged + t * K::BYTES;
        const float *sc = scales + t * K::NS, *mn = mins + t * K::NS;
        complete[t] = 0;
        if (TYPE == QD_Q4_K || TYPE == QD_Q5_K)
            qd_kq_header_q45(sc, mn, blk);
        else if (TYPE == QD_Q2_K)
            qd_kq_header_q2(sc, mn, blk);
        else if (TYPE == QD_Q3_K)
            qd_kq_header_q3(sc, blk);
        else
            complete[t] = qd_kq_header_q6(sc, blk);
    }
    __syncthreads();
    if (sb < nvalid && !complete[sb]) {
        const int j = t % K::NS, o = sb * QD_QK_K;
        const uint8_t *blk = staged + sb * K::BYTES;
        if (TYPE == QD_Q4_K || TYPE == QD_Q5_K)
            qd_kq_codes_q45(TYPE == QD_Q5_K, j, xs + o, blk, L + o);
        else if (TYPE == QD_Q2_K)
            qd_kq_codes_q2(j, xs + o, blk, L + o);
        else if (TYPE == QD_Q3_K)
            qd_kq_codes_q3(j, xs + o, blk, (int8_t *)L + o);
        else
            qd_kq_codes_q6(j, xs + o, blk, (int8_t *)L + o);
    }
    __syncthreads();
    if (t < nvalid && !complete[t]) {
        uint8_t *blk = staged + t * K::BYTES;
        const int o = t * QD_QK_K;
        if (TYPE == QD_Q4_K || TYPE == QD_Q5_K)
            qd_kq_pack_q45(TYPE == QD_Q5_K, L + o, blk);
        else if (TYPE == QD_Q2_K)
            qd_kq_pack_q2(L + o, blk);
        else if (TYPE == QD_Q3_K)
            qd_kq_pack_q3((int8_t *)L + o, blk);
        else
            qd_kq_pack_q6((int8_t *)L + o, blk);
    }
    __syncthreads();
    cta_copy(out + first * K::BYTES, staged, nvalid * K::BYTES);
}

/* 8 bytes from p, which is aligned to A (8, 4 or 2: what the type's block size allows), in as
 * few loads as that allows: one 64-bit word, low byte first. */
template <int A> __device__ __forceinline__ uint64_t kq_load8(const uint8_t *p)
{
    if (A == 8)
        return *(const uint64_t *)p;
    /* a warp reads one super-block: the branch on its alignment is the same in every lane */
    if (A == 4 || ((uintptr_t)p & 3) == 0)
        return ((const uint32_t *)p)[0] | (uint64_t)((const uint32_t *)p)[1] << 32;
    const uint16_t *h = (const uint16_t *)p;
    return h[0] | (uint64_t)h[1] << 16 | (uint64_t)h[2] << 32 | (uint64_t)h[3] << 48;
}

/* The 8 byte-sized codes of a word (low byte first) as floats less `bias`, without the
 * int-to-float unit (a quarter of the FP32 rate): each byte put into the mantissa of 1.5 * 2^23
 * by one byte permute, then 1.5 * 2^23 + bias taken away (exact).
 * The codes are made four at a time in 32-bit lanes (SWAR) by the callers. */
__device__ __forceinline__ void kq_bytes_f(uint64_t codes, int bias, float *v)
{
    const float off = 12582912.0f + (float)bias;
    const uint32_t lo = (uint32_t)codes, hi = (uint32_t)(codes >> 32);
#pragma unroll
    for (int k = 0; k < 8; k++)
        v[k] = __int_as_float(__byte_perm(k < 4 ? lo : hi, 0x4B400000u, 0x7640u | (k % 4))) - off;
}

#define KQ_BYTES(b) (0x0101010101010101ull * (b))

/* Alignment of every super-block (and so of the 8-byte groups read) of a type. */
template <int TYPE> struct kq_align {
    enum { A = (kq<TYPE>::BYTES % 8 == 0) ? 8 : (kq<TYPE>::BYTES % 4 == 0) ? 4 : 2 };
};

/* Elements i0..i0+7 (i0 a multiple of 8: one sub-block, one scale) of a super-block, as
 * dequantize_row_<type> computes them: the same products in the same order. */
template <int TYPE> __device__ __forceinline__ void kq_eight(const uint8_t *blk, int i0, float *v)
{
    constexpr int A = kq_align<TYPE>::A;
    const int n = i0 / 128, r = i0 % 128, j = r / 32, half = (r % 32) / 16, l0 = r % 16;
    if (TYPE == QD_Q4_K || TYPE == QD_Q5_K) {
        const int c = i0 / 64, hi = (i0 % 64) >= 32, l = i0 % 32, is = 2 * c + hi;
        uint8_t s, m;
        qd_kq_scale_min(is, blk + 4, &s, &m);
        const float d1 = qd_get_f16(blk) * (float)s, m1 = qd_get_f16(blk + 2) * (float)m;
        uint64_t code = kq_load8<A>(blk + (TYPE == QD_Q5_K ? 48 : 16) + 32 * c + l) >> (4 * hi) & KQ_BYTES(0xF);
        if (TYPE == QD_Q5_K)
            code |= (kq_load8<A>(blk + 16 + l) >> is & KQ_BYTES(1)) << 4;
        kq_bytes_f(code, 0, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = d1 * v[k] - m1;
        return;
    }
    if (TYPE == QD_Q6_K) {
        const int l = r % 32, is = l / 16;
        const uint64_t ql = kq_load8<A>(blk + 64 * n + (j & 1) * 32 + l), qh = kq_load8<A>(blk + 128 + 32 * n + l);
        const float ds = qd_get_f16(blk + 208) * (float)((const int8_t *)blk)[192 + 8 * n + is + 2 * j];
        kq_bytes_f((ql >> (j & 2 ? 4 : 0) & KQ_BYTES(0xF)) | (qh >> (2 * j) & KQ_BYTES(3)) << 4, 32, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = ds * v[k];
        return;
    }
    const int is = 8 * n + 2 * j + half, lq = l0 + 16 * half;
    if (TYPE == QD_Q3_K) {
        const uint8_t *s = blk + 96;
        const int lo = s[is & 7] >> (4 * (is >> 3)) & 0xF; /* low nibbles, then high: no branch */
        const int hs = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
        const float dl = qd_get_f16(blk + 108) * (float)(int8_t)((lo | hs << 4) - 32);
        /* code - (high bit clear ? 4 : 0) = (code | high bit << 2) - 4 */
        const uint64_t q = kq_load8<A>(blk + 32 + 32 * n + lq) >> (2 * j) & KQ_BYTES(3);
        kq_bytes_f(q | (kq_load8<A>(blk + lq) >> (4 * n + j) & KQ_BYTES(1)) << 2, 4, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = dl * v[k];
        return;
    }
    const uint8_t sc = blk[is];
    const float dl = qd_get_f16(blk + 80) * (float)(sc & 0xF), ml = qd_get_f16(blk + 82) * (float)(sc >> 4);
    kq_bytes_f(kq_load8<A>(blk + 16 + 32 * n + lq) >> (2 * j) & KQ_BYTES(3), 0, v);
#pragma unroll
    for (int k = 0; k < 8; k++)
        v[k] = dl * v[k] - ml;
}

/* Each thread: 8 consecutive elements of one super-block, stored with one 16-byte (bf16/f16)
 * or two 16-byte (f32) accesses. */
template <int DT, int TYPE> __global__ void kquant_dequantize_kernel(const uint8_t *in, int64_t nblocks, void *y)
{
    const int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (g >= nblocks * (QD_QK_K / 8))
        return;
    const int64_t b = g / (QD_QK_K / 8);
    const int i0 = (int)(g % (QD_QK_K / 8)) * 8;
    float v[8];
    kq_eight<TYPE>(in + b * kq<TYPE>::BYTES, i0, v);
    qd_store_block<DT, 8>(y, b * QD_QK_K + i0, v);
}

#define KQUANT_TYPE_SWITCH(t, TYPE, ...)                                                        \
    switch (t) {                                                                                \
    case QD_Q2_K: { constexpr int TYPE = QD_Q2_K; __VA_ARGS__; } break;                         \
    case QD_Q3_K: { constexpr int TYPE = QD_Q3_K; __VA_ARGS__; } break;                         \
    case QD_Q4_K: { constexpr int TYPE = QD_Q4_K; __VA_ARGS__; } break;                         \
    case QD_Q5_K: { constexpr int TYPE = QD_Q5_K; __VA_ARGS__; } break;                         \
    case QD_Q6_K: { constexpr int TYPE = QD_Q6_K; __VA_ARGS__; } break;                         \
    default: QD_SWITCH_UNKNOWN();                                                               \
    }

extern "C" enum qd_status qd_cuda_kquant_quantize(const struct qd_format *f, const struct qd_tensor *in,
                                                  struct qd_params *p, void *const *out)
{
    if (p->importance)
        return qd_cuda_kquant_importance_quantize(f, in, p, out);
    int64_t nblocks = qd_tensor_numel(in) / QD_QK_K;
    unsigned long long *bad;
    enum qd_status s = qd_cuda_bad_begin(!p->allow_nonfinite, &bad);
    if (s != QD_OK)
        return s;
    QD_DTYPE_SWITCH(in->dtype, DT, KQUANT_TYPE_SWITCH(f->code, TYPE,
                    kquant_quantize_kernel<DT, TYPE><<<qd_grid(nblocks, kq<TYPE>::SB), KQ_THREADS, 0, qd_stream()>>>(
                        in->data, nblocks, (uint8_t *)out[0], bad)));
    CUDA_LAUNCHED();
    return qd_cuda_bad_end(bad);
}

extern "C" enum qd_status qd_cuda_kquant_dequantize(const struct qd_format *f, const void *const *in,
                                                    const struct qd_params *p, struct qd_tensor *out)
{
    (void)p;
    int64_t nblocks = qd_tensor_numel(out) / QD_QK_K;
    QD_DTYPE_SWITCH(out->dtype, DT, KQUANT_TYPE_SWITCH(f->code, TYPE,
                    kquant_dequantize_kernel<DT, TYPE><<<qd_grid(nblocks * (QD_QK_K / 8), 256), 256, 0, qd_stream()>>>(
                        (const uint8_t *)in[0], nblocks, out->data)));
    CUDA_LAUNCHED();
    return QD_OK;
}
