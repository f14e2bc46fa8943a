/* AVX2 form of the importance-weighted K-quant searches (kernels/imatrix.h, what llama-quantize
 * runs with --imatrix): the eight (q4_K, q5_K) or sixteen (q2_K, q3_K, q6_K: eight at a time)
 * sub-block fits of a super-block run side by side in AVX2 lanes through kquant_avx2.h's lane
 * searches, each lane doing the scalar code's float operations in the scalar order (a sum over
 * a sub-block stays sequential within its lane, branches become per-lane selects, no FMA), so
 * every scale, minimum, weight sum and code has the scalar code's bits. make_qp_quants over the
 * sub-block scales tries its eight trial scales in lanes, and the codes again from the stored
 * header run eight values at a time (each value on its own: the same bits); the rest (the
 * super-block's sigma2, make_qp_quants' passes, q3_K's fit of its scales, the header, the
 * packing) is the scalar code of kernels/imatrix.h and kquants.h. */
#ifndef QD_CPU_KQUANT_IMX_AVX2_H
#define QD_CPU_KQUANT_IMX_AVX2_H

#include "../imatrix.h"
#include "kquant_avx2.h"

#if QD_KQUANT_AVX2

#define QD_KQUANT_IMX_AVX2 1

/* Eight rows of eight floats (row j at x + stride * j) into out[k], lane j = x[stride * j + k]:
 * the rows' halves paired by 128-bit loads, then 4x4 transposes within the 128-bit lanes (two
 * shuffles per vector, where eight scattered inserts would take about seven). */
static inline __attribute__((always_inline)) void kq_load_transposed_8x8(const float *x, int stride, __m256 *out)
{
    for (int half = 0; half < 2; half++) { /* columns 0..3, then 4..7 */
        __m256 a[4], t[4];
        for (int k = 0; k < 4; k++)
            a[k] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(x + stride * k + 4 * half)),
                                        _mm_loadu_ps(x + stride * (k + 4) + 4 * half), 1);
        t[0] = _mm256_unpacklo_ps(a[0], a[1]);
        t[1] = _mm256_unpackhi_ps(a[0], a[1]);
        t[2] = _mm256_unpacklo_ps(a[2], a[3]);
        t[3] = _mm256_unpackhi_ps(a[2], a[3]);
        out[4 * half] = _mm256_shuffle_ps(t[0], t[2], _MM_SHUFFLE(1, 0, 1, 0));
        out[4 * half + 1] = _mm256_shuffle_ps(t[0], t[2], _MM_SHUFFLE(3, 2, 3, 2));
        out[4 * half + 2] = _mm256_shuffle_ps(t[1], t[3], _MM_SHUFFLE(1, 0, 1, 0));
        out[4 * half + 3] = _mm256_shuffle_ps(t[1], t[3], _MM_SHUFFLE(3, 2, 3, 2));
    }
}

/* qd_imx_block_sigma2 of the eight consecutive super-blocks at x, one per lane (each summed in
 * order, as the scalar code sums it): sigma2[k] for the block at x + 256 * k. */
static inline void qd_imx_block_sigma2_8(const float *x, float twice, float *sigma2)
{
    const __m256i block = _mm256_setr_epi32(0, 256, 512, 768, 1024, 1280, 1536, 1792);
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < QD_QK_K; j++) {
        const __m256 v = _mm256_i32gather_ps(x + j, block, 4);
        sum = _mm256_add_ps(sum, _mm256_mul_ps(v, v));
    }
    _mm256_storeu_ps(sigma2, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(twice), sum), _mm256_set1_ps((float)QD_QK_K)));
}

/* Eight sub-blocks of n values (sub-block j at x + n * j, its importance at qw + n * j) into
 * lanes: xt[i] holds element i of each, w[i] its weight qw * sqrt(sigma2 + x^2) (qd_imx_weights)
 * and sw[j] the weights of sub-block j summed in order from 0. */
static inline __attribute__((always_inline)) void kq_imx_weights_8(const float *x, const float *qw, float sigma2,
                                                                   int n, __m256 *xt, __m256 *w, float *sw)
{
    const __m256 s2 = _mm256_set1_ps(sigma2);
    __m256 sum = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        kq_load_transposed_8x8(x + i, n, xt + i);
        kq_load_transposed_8x8(qw + i, n, w + i);
    }
    for (int i = 0; i < n; i++) {
        w[i] = _mm256_mul_ps(w[i], _mm256_sqrt_ps(_mm256_add_ps(s2, _mm256_mul_ps(xt[i], xt[i]))));
        sum = _mm256_add_ps(sum, w[i]);
    }
    _mm256_storeu_ps(sw, sum);
}

/* qd_imx_quantize_q45's sub-block fits: scales[j], mins[j] (the_min), sw[j] and codes
 * L[32 * j + i], given the super-block's sigma2. */
static inline void qd_imx_search_q45_avx2(int five, const float *x, const float *qw, float sigma2, float *scales,
                                          float *mins, float *sw, uint8_t *L)
{
    __m256 xt[32], w[32];
    __m256i Lv[32];
    kq_imx_weights_8(x, qw, sigma2, 32, xt, w, sw);
    kq_make_qkx2_8(xt, w, 32, five ? 31 : 15, -0.9f, 0.05f, 36, 0, scales, mins, Lv);
    kq_store_codes(Lv, 32, 32, L);
}

/* qd_imx_quantize_q2's fits of eight sub-blocks of 16 (x, qw at their first). */
static inline void qd_imx_search_q2_avx2(const float *x, const float *qw, float sigma2, float *scales, float *mins,
                                         float *sw, uint8_t *L)
{
    __m256 xt[16], w[16];
    __m256i Lv[16];
    kq_imx_weights_8(x, qw, sigma2, 16, xt, w, sw);
    kq_make_qkx2_8(xt, w, 16, 3, -0.9f, 0.05f, 36, 0, scales, mins, Lv);
    kq_store_codes(Lv, 16, 16, L);
}

/* qd_imx_quantize_q3's fits of eight sub-blocks of 16: make_qx_quants, nmax 4 (codes + 4). */
static inline void qd_imx_search_q3_avx2(const float *x, const float *qw, float sigma2, float *scales, float *sw,
                                         int8_t *L)
{
    __m256 xt[16], w[16];
    kq_imx_weights_8(x, qw, sigma2, 16, xt, w, sw);
    kq_make_qx_8(xt, w, 4, scales, L);
}

/* qd_imx_quantize_q6's fits of eight sub-blocks of 16: make_qx_quants, nmax 32, weighted by the
 * importance itself (codes + 32). */
static inline void qd_imx_search_q6_avx2(const float *x, const float *qw, float *scales, int8_t *L)
{
    __m256 xt[16], w[16];
    for (int i = 0; i < 16; i += 8) {
        kq_load_transposed_8x8(x + i, 16, xt + i);
        kq_load_transposed_8x8(qw + i, 16, w + i);
    }
    kq_make_qx_8(xt, w, 32, scales, L);
}

/* qd_imx_make_qp with its eight trial scales in the eight lanes (is = -4..-1, 1..4; each lane's
 * error summed over the values in order), the earliest least error picked in order as the
 * scalar loop picks it; the rest is the scalar code. */
static inline float kq_make_qp_8(int n, int nmax, const float *x, uint8_t *L, const float *qw)
{
    const float max = qd_imx_make_qp_max(n, x, L);
    if (max < QD_KQ_EPS)
        return 0.0f;
    float iscale = (float)nmax / max;
    float best_mse = qd_imx_make_qp_first_error(n, x, qw, iscale);
    const __m256 is = _mm256_setr_ps(-4.0f, -3.0f, -2.0f, -1.0f, 1.0f, 2.0f, 3.0f, 4.0f);
    const __m256 iscale_is = _mm256_div_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(0.1f), is),
                                                         _mm256_set1_ps((float)nmax)),
                                           _mm256_set1_ps(max));
    const __m256 scale_is = _mm256_div_ps(_mm256_set1_ps(1.0f), iscale_is);
    const __m256i top = _mm256_set1_epi32(nmax);
    __m256 mse = _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        const __m256 xi = _mm256_set1_ps(x[i]);
        __m256 l = _mm256_cvtepi32_ps(_mm256_min_epi32(kq_round8(_mm256_mul_ps(iscale_is, xi)), top));
        __m256 diff = _mm256_sub_ps(xi, _mm256_mul_ps(scale_is, l));
        mse = _mm256_add_ps(mse, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(qw[i]), diff), diff));
    }
    float mses[8], iscales[8];
    _mm256_storeu_ps(mses, mse);
    _mm256_storeu_ps(iscales, iscale_is);
    for (int k = 0; k < 8; k++)
        if (mses[k] < best_mse) {
            best_mse = mses[k];
            iscale = iscales[k];
        }
    return qd_imx_make_qp_refine(n, nmax, x, L, qw, iscale);
}

/* Codes again from the stored header, eight values at a time: L[i] = clamp(round((x[i] + dm) / d),
 * lo, hi) + off for i < n (n a multiple of 8), each value the scalar code's operations
 * (qd_kq_codes_*; without dm, x / d alone, as q3_K and q6_K compute it). */
static inline __attribute__((always_inline)) void kq_codes_8(const float *x, int n, float d, const float *dm, int lo,
                                                             int hi, int off, uint8_t *L)
{
    const __m256 dv = _mm256_set1_ps(d);
    const __m256i lov = _mm256_set1_epi32(lo), hiv = _mm256_set1_epi32(hi), offv = _mm256_set1_epi32(off);
    for (int i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (dm)
            v = _mm256_add_ps(v, _mm256_set1_ps(*dm));
        __m256i l = _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(kq_round8(_mm256_div_ps(v, dv)), lov), hiv), offv);
        /* eight int32 in [0, 255] to eight bytes, in order */
        __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1));
        _mm_storel_epi64((__m128i *)(L + i), _mm_packus_epi16(w16, w16));
    }
}

/* qd_kq_codes_q45 for the eight sub-blocks. */
static inline void kq_imx_codes_q45(int five, const float *x, const uint8_t *blk, uint8_t *L)
{
    const float d_all = qd_get_f16(blk), m_all = qd_get_f16(blk + 2);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        qd_kq_scale_min(j, blk + 4, &s, &m);
        const float d = d_all * (float)s, dm = m_all * (float)m;
        if (d != 0.0f)
            kq_codes_8(x + 32 * j, 32, d, &dm, 0, five ? 31 : 15, 0, L + 32 * j);
    }
}

/* qd_kq_codes_q6 for the sixteen sub-blocks. */
static inline void kq_imx_codes_q6(const float *x, const uint8_t *blk, int8_t *L)
{
    const float d_all = qd_get_f16(blk + 208);
    for (int j = 0; j < 16; j++) {
        const float d = d_all * (float)((const int8_t *)blk)[192 + j];
        if (d != 0.0f)
            kq_codes_8(x + 16 * j, 16, d, NULL, -32, 31, 32, (uint8_t *)L + 16 * j);
    }
}

/* qd_kq_codes_q3 for the sixteen sub-blocks. */
static inline void kq_imx_codes_q3(const float *x, const uint8_t *blk, int8_t *L)
{
    const uint8_t *sc = blk + 96;
    const float d_all = qd_get_f16(blk + 108);
    for (int j = 0; j < 16; j++) {
        int8_t s = (int8_t)(j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4);
        s = (int8_t)((s | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
        const float d = d_all * (float)s;
        if (d != 0.0f)
            kq_codes_8(x + 16 * j, 16, d, NULL, -4, 3, 4, (uint8_t *)L + 16 * j);
    }
}

/* qd_kq_codes_q2 for the sixteen sub-blocks. */
static inline void kq_imx_codes_q2(const float *x, const uint8_t *blk, uint8_t *L)
{
    const float d_all = qd_get_f16(blk + 80), m_all = qd_get_f16(blk + 82);
    for (int j = 0; j < 16; j++) {
        const float d = d_all * (float)(blk[j] & 0xF), dm = m_all * (float)(blk[j] >> 4);
        if (d != 0.0f)
            kq_codes_8(x + 16 * j, 16, d, &dm, 0, 3, 0, L + 16 * j);
    }
}

/* The factor qd_imx_block_sigma2 takes for a type (q6_K has no sigma2: 0). */
static inline float qd_imx_sigma2_twice(int type)
{
    return type == QD_Q2_K ? 1.0f : type == QD_Q6_K ? 0.0f : 2.0f;
}

/* qd_imx_quantize_kquant with the sub-block fits in lanes: the same bytes. sigma2 is the
 * block's qd_imx_block_sigma2(x, qd_imx_sigma2_twice(type)) (ignored for q6_K). */
static inline void qd_imx_quantize_kquant_avx2(int type, const float *QD_RESTRICT x, const float *QD_RESTRICT qw,
                                               float sigma2, uint8_t *QD_RESTRICT blk)
{
    if (type == QD_Q4_K || type == QD_Q5_K) {
        const int five = type == QD_Q5_K;
        uint8_t L[QD_QK_K];
        float scales[8], mins[8], sw[8];
        qd_imx_search_q45_avx2(five, x, qw, sigma2, scales, mins, sw, L);
        uint8_t Ls[8], Lm[8];
        const float d_block = kq_make_qp_8(8, 63, scales, Ls, sw), m_block = kq_make_qp_8(8, 63, mins, Lm, sw);
        qd_imx_header_q45(five, Ls, Lm, d_block, m_block, blk);
        kq_imx_codes_q45(five, x, blk, L);
        qd_kq_pack_q45(five, L, blk);
    } else if (type == QD_Q6_K) {
        int8_t L[QD_QK_K];
        float scales[16];
        qd_imx_search_q6_avx2(x, qw, scales, L);
        qd_imx_search_q6_avx2(x + 128, qw + 128, scales + 8, L + 128);
        if (!qd_kq_header_q6(scales, blk)) {
            kq_imx_codes_q6(x, blk, L);
            qd_kq_pack_q6(L, blk);
        }
    } else if (type == QD_Q3_K) {
        int8_t L[QD_QK_K];
        float scales[16], sw[16];
        qd_imx_search_q3_avx2(x, qw, sigma2, scales, sw, L);
        qd_imx_search_q3_avx2(x + 128, qw + 128, sigma2, scales + 8, sw + 8, L + 128);
        qd_imx_header_q3(scales, sw, blk);
        kq_imx_codes_q3(x, blk, L);
        qd_kq_pack_q3(L, blk);
    } else {
        uint8_t L[QD_QK_K];
        float scales[16], mins[16], sw[16];
        qd_imx_search_q2_avx2(x, qw, sigma2, scales, mins, sw, L);
        qd_imx_search_q2_avx2(x + 128, qw + 128, sigma2, scales + 8, mins + 8, sw + 8, L + 128);
        uint8_t Ls[16], Lm[16];
        const float dm = kq_make_qp_8(16, 15, scales, Ls, sw), mm = kq_make_qp_8(16, 15, mins, Lm, sw);
        qd_imx_header_q2(Ls, Lm, dm, mm, blk);
        kq_imx_codes_q2(x, blk, L);
        qd_kq_pack_q2(L, blk);
    }
}

#else
#define QD_KQUANT_IMX_AVX2 0
static inline float qd_imx_sigma2_twice(int type)
{
    (void)type;
    return 0.0f;
}
static inline void qd_imx_block_sigma2_8(const float *x, float twice, float *sigma2)
{
    (void)x, (void)twice, (void)sigma2;
}
static inline void qd_imx_quantize_kquant_avx2(int type, const float *x, const float *qw, float sigma2, uint8_t *blk)
{
    (void)type, (void)x, (void)qw, (void)sigma2, (void)blk;
}
#endif

#endif
