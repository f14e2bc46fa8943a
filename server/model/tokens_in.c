/* Token ids from a client: raw int32 or a JSON array (see tokens_in.h). */
#include "model/tokens_in.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static enum qd_status out_of_range(int64_t id, size_t index, int32_t n_vocab, char *err, size_t errlen)
{
    snprintf(err, errlen, "token id %lld at index %zu is outside the vocabulary (0..%d)", (long long)id, index,
             n_vocab - 1);
    return QD_EINVAL;
}

static enum qd_status parse_int32(const uint8_t *b, size_t len, int32_t n_vocab, int32_t *ids, char *err,
                                  size_t errlen)
{
    for (size_t i = 0; i < len / 4; i++) {
        uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
                     (uint32_t)b[4 * i + 3] << 24;
        int32_t id = (int32_t)u;
        if (id < 0 || id >= n_vocab)
            return out_of_range(id, i, n_vocab, err, errlen);
        ids[i] = id;
    }
    return QD_OK;
}

static int json_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* At most one id per two bytes ("1,"), so len / 2 + 1 entries hold them all. */
static enum qd_status parse_json(const uint8_t *b, size_t len, int32_t n_vocab, int32_t *ids, size_t *n, char *err,
                                 size_t errlen)
{
    size_t i = 0, count = 0;
    while (i < len && json_space(b[i]))
        i++;
    if (i >= len || b[i] != '[') {
        snprintf(err, errlen, "token ids in JSON are one array of integers, like [1, 2, 3]: byte %zu is not '['", i);
        return QD_EINVAL;
    }
    i++;
    for (;;) {
        while (i < len && json_space(b[i]))
            i++;
        if (i < len && b[i] == ']' && count == 0)
            break;
        size_t start = i;
        int neg = i < len && b[i] == '-';
        i += (size_t)neg;
        int64_t v = 0;
        size_t digits = 0;
        while (i < len && b[i] >= '0' && b[i] <= '9') {
            if (v <= INT32_MAX)
                v = v * 10 + (b[i] - '0');
            i++;
            digits++;
        }
        if (!digits) {
            snprintf(err, errlen, "JSON token ids: byte %zu: expected an integer%s", start,
                     i >= len ? " (the array is cut short)" : "");
            return QD_EINVAL;
        }
        if (digits > 1 && b[start + (size_t)neg] == '0') {
            snprintf(err, errlen, "JSON token ids: byte %zu: a number cannot start with 0", start);
            return QD_EINVAL;
        }
        if (i < len && (b[i] == '.' || b[i] == 'e' || b[i] == 'E')) {
            snprintf(err, errlen, "JSON token ids: byte %zu: token ids are whole numbers (no fraction or exponent)",
                     start);
            return QD_EINVAL;
        }
        if (neg || v >= n_vocab)
            return out_of_range(neg ? -v : v, count, n_vocab, err, errlen);
        ids[count++] = (int32_t)v;
        while (i < len && json_space(b[i]))
            i++;
        if (i < len && b[i] == ',') {
            i++;
            continue;
        }
        if (i < len && b[i] == ']')
            break;
        snprintf(err, errlen, "JSON token ids: byte %zu: expected ',' or ']'%s", i,
                 i >= len ? " (the array is cut short)" : "");
        return QD_EINVAL;
    }
    for (i++; i < len && json_space(b[i]);)
        i++;
    if (i < len) {
        snprintf(err, errlen, "JSON token ids: byte %zu: nothing may follow the array", i);
        return QD_EINVAL;
    }
    *n = count;
    return QD_OK;
}

enum qd_status qd_tokens_parse(const void *buf, size_t len, enum qd_tokens_format fmt, int32_t n_vocab,
                               int32_t **ids, size_t *n, char *err, size_t errlen)
{
    *ids = NULL;
    *n = 0;
    if (n_vocab <= 0) {
        snprintf(err, errlen, "token ids: the vocabulary is empty");
        return QD_EINVAL;
    }
    if (fmt == QD_TOKENS_INT32 && len % 4) {
        snprintf(err, errlen, "raw token ids are little-endian int32, 4 bytes each: %zu bytes is not a whole number "
                 "of them (nor a JSON array: one starts with '[' and ends with ']')", len);
        return QD_EINVAL;
    }
    size_t cap = fmt == QD_TOKENS_INT32 ? len / 4 : len / 2 + 1;
    int32_t *out = malloc((cap ? cap : 1) * sizeof *out);
    if (!out) {
        snprintf(err, errlen, "no memory for %zu token ids", cap);
        return QD_ENOMEM;
    }
    size_t count = cap;
    enum qd_status s = fmt == QD_TOKENS_INT32 ? parse_int32(buf, len, n_vocab, out, err, errlen)
                                              : parse_json(buf, len, n_vocab, out, &count, err, errlen);
    if (s == QD_OK && count == 0) {
        snprintf(err, errlen, "the token ids hold no id");
        s = QD_EINVAL;
    }
    if (s != QD_OK) {
        free(out);
        return s;
    }
    *ids = out;
    *n = count;
    return QD_OK;
}

enum qd_tokens_format qd_tokens_detect(const void *buf, size_t len)
{
    const uint8_t *b = buf;
    size_t first = 0, last = len;
    while (first < len && json_space(b[first]))
        first++;
    while (last > first && json_space(b[last - 1]))
        last--;
    return last - first >= 2 && b[first] == '[' && b[last - 1] == ']' ? QD_TOKENS_JSON : QD_TOKENS_INT32;
}

enum qd_status qd_tokens_load(const char *path, int32_t n_vocab, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    *ids = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "cannot read token ids from '%s': %s", path, f ? "not a regular file" : strerror(errno));
        if (f)
            fclose(f);
        return QD_EIO;
    }
    size_t len = (size_t)st.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf || fread(buf, 1, len, f) != len) {
        snprintf(err, errlen, buf ? "cannot read token ids from '%s': short read" : "no memory to read '%s'", path);
        free(buf);
        fclose(f);
        return buf ? QD_EIO : QD_ENOMEM;
    }
    fclose(f);
    char why[512];
    enum qd_status s = qd_tokens_parse(buf, len, qd_tokens_detect(buf, len), n_vocab, ids, n, why, sizeof why);
    free(buf);
    if (s != QD_OK)
        snprintf(err, errlen, "'%s': %s", path, why);
    return s;
}
