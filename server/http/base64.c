/* Standard base64 (RFC 4648 §4, with padding), both ways. Tensors of hundreds of MB pass through
 * here, so both loops work on whole 3-byte/4-char groups with table lookups. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "http/decode.h"

static const char enc_table[64] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t qd_base64_encoded_len(size_t n) { return (n + 2) / 3 * 4; }

void qd_base64_encode(const unsigned char *in, size_t n, char *out)
{
    size_t i = 0;
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
