/* Standard base64 (RFC 4648 §4, with padding), both ways. Tensors of hundreds of MB pass through
 * here, so both loops work on whole 3-byte/4-char groups with table lookups. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "http/base64.h"

static const char enc_table[64] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t qd_base64_encoded_len(size_t n) { return (n + 2) / 3 * 4; }

#ifdef __AVX2__
/* 24 bytes to 32 characters, eight 3-byte groups at a time (12 per 128-bit lane): each group
 * spread over a 32-bit word as bytes (b, a, c, b), its four 6-bit fields moved into the four
 * bytes by two 16-bit multiplies, then each field turned into its character by adding an offset
 * chosen by its range (A-Z, a-z, 0-9, +, /) with one byte shuffle. */
static size_t encode_avx2(const unsigned char *in, size_t n, char *out)
{
    const __m256i spread = _mm256_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10,
                                            1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
    const __m256i offsets = _mm256_setr_epi8('a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
                                             '0' - 52, '0' - 52, '0' - 52, '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0,
                                             'a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
                                             '0' - 52, '0' - 52, '0' - 52, '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0);
    size_t i = 0;
    for (; i + 28 <= n; i += 24, out += 32) { /* the loads read 28 bytes, 24 are used */
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(in + i))),
                                            _mm_loadu_si128((const __m128i *)(in + i + 12)), 1);
        v = _mm256_shuffle_epi8(v, spread);
        /* fields 0 and 2 (a >> 2, the middle of b:c) by a high multiply, 1 and 3 by a low one */
        __m256i hi = _mm256_mulhi_epu16(_mm256_and_si256(v, _mm256_set1_epi32(0x0fc0fc00)), _mm256_set1_epi32(0x04000040));
        __m256i lo = _mm256_mullo_epi16(_mm256_and_si256(v, _mm256_set1_epi32(0x003f03f0)), _mm256_set1_epi32(0x01000010));
        __m256i idx = _mm256_or_si256(hi, lo);
        /* range: 0 for 26-51, 1-10 for 52-61, 11 for 62, 12 for 63, 13 for 0-25 */
        __m256i range = _mm256_subs_epu8(idx, _mm256_set1_epi8(51));
        range = _mm256_or_si256(range, _mm256_and_si256(_mm256_cmpgt_epi8(_mm256_set1_epi8(26), idx), _mm256_set1_epi8(13)));
        _mm256_storeu_si256((__m256i *)out, _mm256_add_epi8(idx, _mm256_shuffle_epi8(offsets, range)));
    }
    return i;
}
#endif

void qd_base64_encode(const unsigned char *in, size_t n, char *out)
{
    size_t i = 0;
#ifdef __AVX2__
    i = encode_avx2(in, n, out);
    out += i / 3 * 4;
#endif
    for (; i + 3 <= n; i += 3, out += 4) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[0] = enc_table[v >> 18];
        out[1] = enc_table[(v >> 12) & 63];
        out[2] = enc_table[(v >> 6) & 63];
        out[3] = enc_table[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
        out[0] = enc_table[v >> 18];
        out[1] = enc_table[(v >> 12) & 63];
        out[2] = i + 1 < n ? enc_table[(v >> 6) & 63] : '=';
        out[3] = '=';
    }
}

/* 0..63 for alphabet characters, 64 for anything else */
static unsigned char dec_table[256];

static void dec_table_init(void)
{
    for (int i = 0; i < 256; i++)
        dec_table[i] = 64;
    for (int i = 0; i < 64; i++)
        dec_table[(unsigned char)enc_table[i]] = (unsigned char)i;
}

unsigned char *qd_base64_decode(const char *s, size_t n, size_t *out_len, int *oom)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, dec_table_init);
    *oom = 0;
    if (n % 4)
        return NULL;
    size_t pad = n && s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    size_t len = n / 4 * 3 - pad;
    unsigned char *out = malloc(len ? len : 1), *o = out;
    if (!out) {
        *oom = 1;
        return NULL;
    }
    size_t full = pad ? n - 4 : n; /* the last group, when padded, is decoded apart */
    for (size_t i = 0; i < full; i += 4, o += 3) {
        unsigned a = dec_table[(unsigned char)s[i]], b = dec_table[(unsigned char)s[i + 1]],
                 c = dec_table[(unsigned char)s[i + 2]], d = dec_table[(unsigned char)s[i + 3]];
        if ((a | b | c | d) & 64)
            goto bad;
        uint32_t v = a << 18 | b << 12 | c << 6 | d;
        o[0] = (unsigned char)(v >> 16);
        o[1] = (unsigned char)(v >> 8);
        o[2] = (unsigned char)v;
    }
    if (pad) {
        const char *g = s + n - 4;
        unsigned a = dec_table[(unsigned char)g[0]], b = dec_table[(unsigned char)g[1]],
                 c = pad == 1 ? dec_table[(unsigned char)g[2]] : 0;
        /* the bits below the last full byte must be zero (canonical encoding) */
        if ((a | b | c) & 64 || (pad == 2 && (b & 15)) || (pad == 1 && (c & 3)))
            goto bad;
        uint32_t v = a << 18 | b << 12 | c << 6;
        o[0] = (unsigned char)(v >> 16);
        if (pad == 1)
            o[1] = (unsigned char)(v >> 8);
    }
    *out_len = len;
    return out;
bad:
    free(out);
    return NULL;
}
