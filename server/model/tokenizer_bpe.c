/* Byte-level BPE (llama-vocab.cpp, llm_tokenizer_bpe_session): the pre-tokenizer cuts the text
 * into words; each word, re-encoded as UTF-8 from its code points and spelled in GPT-2's byte
 * alphabet, starts as one symbol per character; the adjacent pair with the lowest merge rank (the
 * leftmost among equals) merges first. A final symbol that is not a token comes out as the
 * one-byte tokens of its bytes, where there are such tokens; the rest of it is dropped, as
 * llama.cpp drops it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_internal.h"
#include "model/tokenizer_unicode.h"

struct sym {
    int32_t prev, next;
    uint32_t off, n;
};

struct bpe {
    const struct qd_vocab *v;
    char *word;            /* the word being merged */
    size_t word_cap;
    struct sym *s;
    size_t sym_cap;
    struct qd_heap heap;
};

static int pair(struct bpe *b, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    const struct sym *l = &b->s[left], *r = &b->s[right];
    int32_t rank = qd_vocab_merge_rank(b->v, b->word + l->off, l->n, b->word + r->off, r->n);
    if (rank < 0)
        return 0;
    return qd_heap_push(&b->heap, (struct qd_merge){qd_merge_key_rank(rank, left), right, l->n + r->n});
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Merges b->word[0, len) and appends its tokens. */
static int merge_word(struct bpe *b, size_t len, struct qd_ids *out)
{
    const struct qd_vocab *v = b->v;
    const unsigned flags = v->pre.row->flags;
    if (grow((void **)&b->s, &b->sym_cap, len, sizeof *b->s))
        return -1;
    int32_t count = 0;
    b->heap.n = 0;
    /* a word that is a token stays whole with ignore_merges; with Gemma 4, a run of newlines */
    size_t newlines = 0;
    while (newlines < len && b->word[newlines] == '\n')
        newlines++;
    int whole = ((flags & QD_PRE_IGNORE_MERGES) || ((flags & QD_PRE_GEMMA4) && newlines == len)) &&
                qd_vocab_find(v, b->word, len) >= 0;
    if (whole)
        b->s[count++] = (struct sym){-1, -1, 0, (uint32_t)len};
    for (size_t off = 0; !whole && off < len; count++) {
        size_t n = qd_utf8_len((uint8_t)b->word[off]);
        n = n < len - off ? n : len - off;
        b->s[count] = (struct sym){count - 1, off + n == len ? -1 : count + 1, (uint32_t)off, (uint32_t)n};
        off += n;
    }
    for (int32_t i = 1; i < count; i++)
        if (pair(b, i - 1, i))
            return -1;
    while (b->heap.n) {
        struct qd_merge m = qd_heap_pop(&b->heap);
        int32_t left = qd_merge_left(&m);
        struct sym *l = &b->s[left], *r = &b->s[m.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != m.bytes)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            b->s[r->next].prev = left;
        if (pair(b, l->prev, left) || pair(b, left, l->next))
            return -1;
    }
    const int32_t *fallback = flags & QD_PRE_SPM_STYLE ? v->hex_byte_token : v->raw_byte_token;
    for (int32_t i = 0; i < count; i++) {
        const struct sym *s = &b->s[i];
        if (s->n == 0)
            continue;
        int32_t tok = qd_vocab_find(v, b->word + s->off, s->n);
        if (tok >= 0) {
            if (qd_ids_push(out, tok))
                return -1;
            continue;
        }
        for (uint32_t k = 0; k < s->n; k++) {
            int32_t t = fallback[(uint8_t)b->word[s->off + k]];
            if (t >= 0 && qd_ids_push(out, t))
                return -1;
        }
    }
    return 0;
}

enum qd_status qd_bpe_tokenize(const struct qd_vocab *v, const char *text, size_t len, struct qd_ids *out,
                               char *err, size_t errlen)
{
    const int spm_style = v->pre.row->flags & QD_PRE_SPM_STYLE;
    struct bpe b = {.v = v};
    enum qd_status st = QD_ENOMEM;
    char *escaped = NULL;
    uint32_t *cpt = NULL;
    size_t *lens = NULL;
    if (len > INT32_MAX / 4) {
        snprintf(err, errlen, "a text of %zu bytes is too long for one pass (at most 512 MiB)", len);
        return QD_EINVAL;
    }
    if (spm_style) { /* spaces become U+2581 before anything else */
        size_t spaces = 0;
        for (size_t i = 0; i < len; i++)
            spaces += text[i] == ' ';
        if (!(escaped = malloc(len + 2 * spaces + 1)))
            goto done;
        size_t k = 0;
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') {
                memcpy(escaped + k, "\xE2\x96\x81", 3);
                k += 3;
            } else {
                escaped[k++] = text[i];
            }
        }
        text = escaped;
        len = k;
    }
    cpt = malloc((len + 1) * sizeof *cpt);
    lens = malloc((len + 1) * sizeof *lens);
    if (!cpt || !lens)
        goto done;
    size_t n = qd_utf8_decode((const uint8_t *)text, len, cpt);
    size_t words = qd_pretok_split(&v->pre, cpt, n, lens);
    if (words == (size_t)-1)
        goto done;
    size_t start = 0;
    for (size_t w = 0; w < words; start += lens[w++]) {
        if (grow((void **)&b.word, &b.word_cap, lens[w] * 8, 1))
            goto done;
        size_t k = 0;
        for (size_t i = start; i < start + lens[w]; i++) {
            uint8_t u[4];
            size_t un = qd_utf8_encode(cpt[i], u);
            if (!un) {
                snprintf(err, errlen, "the text holds a 4-byte UTF-8 form of U+%X, past U+10FFFF (llama.cpp stops "
                         "with an error there too); replace it or pass token ids", cpt[i]);
                st = QD_EINVAL;
                goto done;
            }
            for (size_t j = 0; j < un; j++) {
                if (spm_style) {
                    b.word[k++] = (char)u[j];
                } else {
                    memcpy(b.word + k, v->byte_utf8[u[j]], v->byte_utf8_len[u[j]]);
                    k += v->byte_utf8_len[u[j]];
                }
            }
        }
        if (merge_word(&b, k, out))
            goto done;
    }
    st = QD_OK;
done:
    if (st == QD_ENOMEM)
        snprintf(err, errlen, "no memory to tokenize %zu bytes", len);
    free(escaped), free(cpt), free(lens), free(b.word), free(b.s), free(b.heap.a);
    return st;
}
