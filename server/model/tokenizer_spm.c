/* SentencePiece-style merging (llama-vocab.cpp, llm_tokenizer_spm_session): the text starts as
 * one symbol per UTF-8 character; the adjacent pair whose concatenation is the token of highest
 * score (the leftmost among equals) merges first, until no pair is a token. A symbol that is
 * not a token comes out as its bytes' <0xXX> tokens. */
#include <stdio.h>
#include <stdlib.h>

#include "model/tokenizer_internal.h"
#include "model/tokenizer_unicode.h"

struct sym {
    int32_t prev, next;
    uint32_t off, n; /* bytes of text; n 0 once merged into its left neighbour */
};

struct spm {
    const struct qd_vocab *v;
    const char *text;
    struct sym *s;
    struct qd_heap heap;
};

static int try_pair(struct spm *p, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    uint32_t bytes = p->s[left].n + p->s[right].n;
    int32_t tok = qd_vocab_find(p->v, p->text + p->s[left].off, bytes);
    if (tok < 0)
        return 0;
    return qd_heap_push(&p->heap, (struct qd_merge){qd_merge_key_score(p->v->score[tok], left), right, bytes});
}

/* llama.cpp's merge loop over symbols first..last (linked among themselves only). */
static int merge_stretch(struct spm *p, int32_t first, int32_t last)
{
    p->heap.n = 0;
    for (int32_t i = first + 1; i <= last; i++)
        if (try_pair(p, i - 1, i))
            return -1;
    while (p->heap.n) {
        struct qd_merge m = qd_heap_pop(&p->heap);
        int32_t left = qd_merge_left(&m);
        struct sym *l = &p->s[left], *r = &p->s[m.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != m.bytes)
            continue; /* stale: one side merged since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            p->s[r->next].prev = left;
        if (try_pair(p, l->prev, left) || try_pair(p, left, l->next))
            return -1;
    }
    return 0;
}

/* The tokens of the symbols from `first` on: a symbol that is a token, else its bytes. */
static int emit(struct spm *p, int32_t first, struct qd_ids *out, char *err, size_t errlen, enum qd_status *st)
{
    const struct qd_vocab *v = p->v;
    for (int32_t i = first; i != -1; i = p->s[i].next) {
        const struct sym *s = &p->s[i];
        int32_t tok = qd_vocab_find(v, p->text + s->off, s->n);
        if (tok >= 0) {
            if (qd_ids_push(out, tok))
                return -1;
            continue;
        }
        for (uint32_t b = 0; b < s->n; b++) {
            uint8_t byte = (uint8_t)p->text[s->off + b];
            if (v->byte_token[byte] < 0) {
                snprintf(err, errlen, "the vocabulary has no token for byte 0x%02X (neither <0x%02X> nor the byte "
                         "itself), which the text needs", byte, byte);
                *st = QD_EINVAL;
                return -1;
            }
            if (qd_ids_push(out, v->byte_token[byte]))
                return -1;
        }
    }
    return 0;
}

enum qd_status qd_spm_tokenize(const struct qd_vocab *v, const char *text, size_t len, struct qd_ids *out,
                               char *err, size_t errlen)
{
    if (len == 0)
        return QD_OK;
    if (len > INT32_MAX) {
        snprintf(err, errlen, "a text of %zu bytes is too long for one pass (at most 2 GiB)", len);
        return QD_EINVAL;
    }
    struct spm p = {v, text, malloc(len * sizeof(struct sym)), {0}};
    enum qd_status st = QD_ENOMEM;
    if (!p.s)
        goto done;
    int32_t count = 0;
    for (size_t off = 0; off < len; count++) {
        size_t n = qd_utf8_len((uint8_t)text[off]);
        n = n < len - off ? n : len - off;
        p.s[count] = (struct sym){count - 1, off + n == len ? -1 : count + 1, (uint32_t)off, (uint32_t)n};
        off += n;
    }
    /* merge each stretch between characters that no token holds side by side on its own */
    for (int32_t first = 0; first < count;) {
        int32_t last = first;
        while (last + 1 < count &&
               qd_char_pair_known(v, qd_char_pair_hash(text + p.s[last].off, p.s[last].n, text + p.s[last + 1].off,
                                                        p.s[last + 1].n)))
            last++;
        p.s[first].prev = -1;
        p.s[last].next = -1;
        if (merge_stretch(&p, first, last) || emit(&p, first, out, err, errlen, &st))
            goto done;
        first = last + 1;
    }
    st = QD_OK;
done:
    if (st == QD_ENOMEM)
        snprintf(err, errlen, "no memory to tokenize %zu bytes", len);
    free(p.s);
    free(p.heap.a);
    return st;
}
