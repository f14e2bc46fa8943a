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
    return qd_heap_push(&p->heap, (struct qd_merge){-(double)p->v->score[tok], left, right, bytes});
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
    for (int32_t i = 1; i < count; i++)
        if (try_pair(&p, i - 1, i))
            goto done;
    while (p.heap.n) {
        struct qd_merge m = qd_heap_pop(&p.heap);
        struct sym *l = &p.s[m.left], *r = &p.s[m.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != m.bytes)
            continue; /* stale: one side merged since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            p.s[r->next].prev = m.left;
        if (try_pair(&p, l->prev, m.left) || try_pair(&p, m.left, l->next))
            goto done;
    }
    for (int32_t i = 0; i != -1; i = p.s[i].next) {
        const struct sym *s = &p.s[i];
        int32_t tok = qd_vocab_find(v, text + s->off, s->n);
        if (tok >= 0) {
            if (qd_ids_push(out, tok))
                goto done;
            continue;
        }
        for (uint32_t b = 0; b < s->n; b++) {
            uint8_t byte = (uint8_t)text[s->off + b];
            if (v->byte_token[byte] < 0) {
                snprintf(err, errlen, "the vocabulary has no token for byte 0x%02X (neither <0x%02X> nor the byte "
                         "itself), which the text needs", byte, byte);
                st = QD_EINVAL;
                goto done;
            }
            if (qd_ids_push(out, v->byte_token[byte]))
                goto done;
        }
    }
    st = QD_OK;
done:
    if (st == QD_ENOMEM)
        snprintf(err, errlen, "no memory to tokenize %zu bytes", len);
    free(p.s);
    free(p.heap.a);
    return st;
}
