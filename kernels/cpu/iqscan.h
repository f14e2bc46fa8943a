/* The neighbour lists of the IQ3_XXS and IQ2_XXS grids laid out for an AVX2 scan of one list
 * eight candidates at a time (kernels/cpu/iqgrid_avx2.h, iq2_avx2.h), built once on the host
 * from the lists kernels/iqgrid.c and kernels/iq2.c build (the same candidates in the same
 * order).
 *
 * A list is cut into blocks of 8 candidates. For each row r (a coordinate of the candidates) a
 * block holds each candidate's slot: the index into an 8-entry table of that coordinate's
 * weighted squared differences, which the scan computes once per list (vpermps reads it). Slots
 * are packed four rows to a 32-bit word, row r in byte r % 4 of word group r / 4 (vpermps reads
 * the low 3 bits of each word, so row r is the word shifted right by 8 (r % 4): one load serves
 * four rows and no widening is needed). IQ3_XXS: the slot of row r is the level (table = the 8
 * values 2 l + 1). IQ2_XXS: coordinates take 3 values, so two rows share a table: slot = level +
 * 4 (r % 2), table r / 2. */
#ifndef QD_CPU_IQSCAN_H
#define QD_CPU_IQSCAN_H

#include <stdint.h>

struct qd_iq_scan {
    int dim;                /* rows per candidate: 4 (IQ3_XXS) or 8 (IQ2_XXS) */
    const int32_t *first;   /* per tuple with a list: the index of the list's first block */
    const uint16_t *count;  /* per tuple with a list: its length (as the list's own count) */
    const uint32_t *slots;  /* per block: dim / 4 groups of 8 words, word s the slots of candidate s */
    const uint16_t *points; /* per block: the 8 candidates' grid indices; past a list's end its first */
};

/* The scan tables, built on first use (thread-safe); NULL where memory ran out (the callers
 * then take the scalar code). */
const struct qd_iq_scan *qd_iq3xxs_scan(void);
const struct qd_iq_scan *qd_iq2xxs_scan(void);

#ifdef __AVX2__
#include <immintrin.h>

/* The candidate of tuple u's list that the scalar scan picks: the first (lowest position) of
 * those whose distance is the smallest below FLT_MAX, or the list's first when none is (every
 * distance Inf, NaN or FLT_MAX). table[r >> tshift] holds row r's 8 slot terms w (s q - x)^2 as
 * the scalar code computes them; a candidate's distance is summed over rows 0..dim-1 in order
 * from +0, the scalar order, so each is the scalar's float. Each of the 8 slots keeps the
 * earliest strictly smaller distance over the blocks (the scalar '<' within the slot's
 * subsequence); the ordered pick is then the lowest position among the slots at the minimum. */
static inline __attribute__((always_inline)) int qd_iq_scan_pick(const struct qd_iq_scan *s, int u,
                                                                 const __m256 *table, int dim, int tshift)
{
    const int n = s->count[u];
    const int32_t block0 = s->first[u];
    const __m256i *w = (const __m256i *)(const void *)(s->slots + (int64_t)block0 * dim * 2);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 flt_max = _mm256_set1_ps(3.40282347e38f);
    __m256 best = flt_max;
    __m256i at = iota;
    for (int b = 0; b < n; b += 8, w += dim / 4) {
        __m256 d2 = _mm256_setzero_ps();
        for (int g = 0; g < dim / 4; g++) {
            const __m256i words = _mm256_loadu_si256(w + g);
            for (int r = 0; r < 4; r++)
                d2 = _mm256_add_ps(d2, _mm256_permutevar8x32_ps(table[(4 * g + r) >> tshift],
                                                                _mm256_srli_epi32(words, 8 * r)));
        }
        __m256i take = _mm256_castps_si256(_mm256_cmp_ps(d2, best, _CMP_LT_OQ));
        if (n - b < 8) /* the block's slots past the list's end */
            take = _mm256_and_si256(take, _mm256_cmpgt_epi32(_mm256_set1_epi32(n - b), iota));
        best = _mm256_blendv_ps(best, d2, _mm256_castsi256_ps(take));
        at = _mm256_blendv_epi8(at, _mm256_add_epi32(iota, _mm256_set1_epi32(b)), take);
    }
    /* the minimum over the slots (no NaN is ever kept, so min_ps is exact) */
    __m256 m = _mm256_min_ps(best, _mm256_permute2f128_ps(best, best, 1));
    m = _mm256_min_ps(m, _mm256_permute_ps(m, 0x4e));
    m = _mm256_min_ps(m, _mm256_permute_ps(m, 0xb1));
    const uint16_t *points = s->points + (int64_t)block0 * 8;
    if (!(_mm256_cvtss_f32(m) < 3.40282347e38f))
        return points[0];
    const __m256i eq = _mm256_castps_si256(_mm256_cmp_ps(best, m, _CMP_EQ_OQ));
    __m256i j = _mm256_blendv_epi8(_mm256_set1_epi32(0x7fffffff), at, eq);
    j = _mm256_min_epi32(j, _mm256_permute2x128_si256(j, j, 1));
    j = _mm256_min_epi32(j, _mm256_shuffle_epi32(j, 0x4e));
    j = _mm256_min_epi32(j, _mm256_shuffle_epi32(j, 0xb1));
    return points[_mm256_cvtsi256_si32(j)];
}
#endif

#endif
