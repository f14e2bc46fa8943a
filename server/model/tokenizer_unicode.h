/* Unicode as llama.cpp's tokenizer sees it (src/unicode.cpp): its lenient UTF-8 decoding, each
 * code point's general category class and white space, and GPT-2's byte-to-character map. */
#ifndef QD_TOKENIZER_UNICODE_H
#define QD_TOKENIZER_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* General category classes, by the category's first letter; unassigned (Cn) is UNDEF. */
enum qd_ucat { QD_UCAT_UNDEF, QD_UCAT_N, QD_UCAT_L, QD_UCAT_Z, QD_UCAT_M, QD_UCAT_P, QD_UCAT_S, QD_UCAT_C };

struct qd_ucat_range {
    uint32_t start; /* the range runs to the next entry's start */
    uint8_t cat;    /* enum qd_ucat */
};
extern const struct qd_ucat_range qd_ucat_ranges[]; /* tokenizer_unicode_data.c (generated) */
extern const unsigned qd_ucat_range_count;
extern const uint8_t qd_ucat_ascii[128];

#define QD_UNICODE_MAX 0x110000u /* one past the last code point */
#define QD_UNICODE_REPLACEMENT 0xFFFDu

/* Flags of one code point. Positions outside a piece of text have none (0) in the splitters,
 * which is how they tell "past the end" from any code point. */
enum {
    QD_UF_UNDEF = 1 << 0, /* unassigned, or past U+10FFFF */
    QD_UF_NUMBER = 1 << 1,
    QD_UF_LETTER = 1 << 2,
    QD_UF_SEPARATOR = 1 << 3,
    QD_UF_MARK = 1 << 4,
    QD_UF_PUNCT = 1 << 5,
    QD_UF_SYMBOL = 1 << 6,
    QD_UF_CONTROL = 1 << 7,
    QD_UF_SPACE = 1 << 8, /* Unicode's White_Space property */
};
unsigned qd_unicode_flags(uint32_t cpt);
enum qd_ucat qd_unicode_category(uint32_t cpt);

/* Bytes of the UTF-8 sequence a lead byte announces, by its high nibble (1 for continuation
 * bytes); the SPM and BPE symbol splitters cut raw bytes this way. */
static inline size_t qd_utf8_len(uint8_t lead)
{
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[lead >> 4];
}

/* Decodes s[0, n) into code points the way llama.cpp does: a sequence is taken when its lead
 * byte's form and its continuation bytes fit (overlong forms and surrogates are kept, and a
 * four-byte form may exceed U+10FFFF); anything else is U+FFFD for one byte. out holds n
 * entries; returns how many were written. */
size_t qd_utf8_decode(const uint8_t *s, size_t n, uint32_t *out);

/* UTF-8 of one code point into out (4 bytes); the byte count, 0 past U+10FFFF. */
size_t qd_utf8_encode(uint32_t cpt, uint8_t *out);

/* GPT-2's byte-level alphabet: the printable bytes stand for themselves, the others for
 * U+0100 onwards in byte order. */
uint32_t qd_byte_to_cpt(uint8_t byte);
/* The byte a code point of that alphabet stands for, or -1. */
int qd_cpt_to_byte(uint32_t cpt);

#endif
