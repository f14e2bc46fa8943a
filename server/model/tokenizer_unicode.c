/* Code point classes and UTF-8 for the tokenizer (see tokenizer_unicode.h). */
#include "model/tokenizer_unicode.h"

static const unsigned cat_flag[8] = {
    [QD_UCAT_UNDEF] = QD_UF_UNDEF, [QD_UCAT_N] = QD_UF_NUMBER, [QD_UCAT_L] = QD_UF_LETTER,
    [QD_UCAT_Z] = QD_UF_SEPARATOR, [QD_UCAT_M] = QD_UF_MARK,   [QD_UCAT_P] = QD_UF_PUNCT,
    [QD_UCAT_S] = QD_UF_SYMBOL,    [QD_UCAT_C] = QD_UF_CONTROL,
};

enum qd_ucat qd_unicode_category(uint32_t cpt)
{
    if (cpt < 128)
        return (enum qd_ucat)qd_ucat_ascii[cpt];
    if (cpt >= QD_UNICODE_MAX)
        return QD_UCAT_UNDEF;
    unsigned lo = 0, hi = qd_ucat_range_count; /* the last range starting at or before cpt */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (qd_ucat_ranges[mid].start <= cpt)
            lo = mid;
        else
            hi = mid;
    }
    return (enum qd_ucat)qd_ucat_ranges[lo].cat;
}

/* Unicode's White_Space property (PropList.txt), the set llama.cpp's \s stands for. */
static int is_white_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

unsigned qd_unicode_flags(uint32_t cpt)
{
    return cat_flag[qd_unicode_category(cpt)] | (is_white_space(cpt) ? QD_UF_SPACE : 0);
}

size_t qd_utf8_decode(const uint8_t *s, size_t n, uint32_t *out)
{
    size_t i = 0, k = 0;
    while (i < n) {
        uint8_t b = s[i];
        size_t len = b < 0x80 ? 1 : !(b & 0x40) ? 0 : !(b & 0x20) ? 2 : !(b & 0x10) ? 3 : !(b & 0x08) ? 4 : 0;
        int ok = len > 0 && len <= n - i;
        for (size_t j = 1; ok && j < len; j++)
            ok = (s[i + j] & 0xC0) == 0x80;
        if (!ok) {
            out[k++] = QD_UNICODE_REPLACEMENT;
            i++;
            continue;
        }
        static const uint8_t lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
        uint32_t c = b & lead_mask[len];
        for (size_t j = 1; j < len; j++)
            c = c << 6 | (s[i + j] & 0x3F);
        out[k++] = c;
        i += len;
    }
    return k;
}

size_t qd_utf8_encode(uint32_t c, uint8_t *o)
{
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | c >> 6);
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12);
        o[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    if (c < QD_UNICODE_MAX) {
        o[0] = (uint8_t)(0xF0 | c >> 18);
        o[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
        o[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
        o[3] = (uint8_t)(0x80 | (c & 0x3F));
        return 4;
    }
    return 0;
}

/* The bytes GPT-2 keeps as themselves: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF. */
static int byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The 68 others, in byte order: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD. */
uint32_t qd_byte_to_cpt(uint8_t b)
{
    if (byte_is_printable(b))
        return b;
    return 0x100 + (b <= 0x20 ? b : b <= 0xA0 ? 33u + (b - 0x7Fu) : 67u);
}

int qd_cpt_to_byte(uint32_t cpt)
{
    if (cpt < 0x100)
        return byte_is_printable(cpt) ? (int)cpt : -1;
    uint32_t n = cpt - 0x100;
    return n < 33 ? (int)n : n < 67 ? (int)(0x7F + n - 33) : n == 67 ? 0xAD : -1;
}
