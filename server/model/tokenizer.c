/* llama_tokenize (llama-vocab.cpp, impl::tokenize): special tokens are cut out of the text
 * first (tokenizer_st_partition), then each stretch of plain text between them goes through the
 * vocabulary's merging, with the BOS/EOS tokens around the whole when asked.
 *
 * llama.cpp cuts special tokens one token at a time, longest text first, each at every place
 * it still occurs in the uncut text, leftmost first. This does the same from one scan: a trie
 * over the special texts finds every occurrence, and occurrences are then taken in that order,
 * each only where all its bytes are still uncut. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_internal.h"

int qd_ids_push(struct qd_ids *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        int32_t *p = realloc(o->id, cap * sizeof *p);
        if (!p)
            return -1;
        o->id = p;
        o->cap = cap;
    }
    o->id[o->n++] = id;
    return 0;
}

/* A four-way heap: half the depth of a binary one, and a node's children share a cache line. */
int qd_heap_push(struct qd_heap *h, struct qd_merge m)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        struct qd_merge *p = realloc(h->a, cap * sizeof *p);
        if (!p)
            return -1;
        h->a = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && m.key < h->a[(i - 1) / 4].key) {
        h->a[i] = h->a[(i - 1) / 4];
        i = (i - 1) / 4;
    }
    h->a[i] = m;
    return 0;
}

struct qd_merge qd_heap_pop(struct qd_heap *h)
{
    struct qd_merge top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 4 * i + 1, best = c;
        if (c >= h->n)
            break;
        for (size_t k = c + 1; k < c + 4 && k < h->n; k++)
            if (h->a[k].key < h->a[best].key)
                best = k;
        if (h->a[best].key >= last.key)
            break;
        h->a[i] = h->a[best];
        i = best;
    }
    if (h->n)
        h->a[i] = last;
    return top;
}

/* ---- special tokens ------------------------------------------------------------------------- */

enum qd_status qd_special_index(struct qd_vocab *v, char *err, size_t errlen)
{
    size_t bytes = 0;
    for (uint32_t i = 0; i < v->n_special; i++)
        bytes += v->len[v->special[i]];
    v->trie = malloc((bytes + 1) * sizeof *v->trie);
    v->special_rank = malloc((size_t)v->n * sizeof *v->special_rank);
    if (!v->trie || !v->special_rank) {
        snprintf(err, errlen, "vocabulary: no memory");
        return QD_ENOMEM;
    }
    memset(v->trie_root, 0xff, sizeof v->trie_root);
    for (uint32_t i = 0; i < v->n_special; i++) {
        int32_t id = v->special[i];
        const uint8_t *t = (const uint8_t *)v->text[id];
        v->special_rank[id] = i;
        int32_t *link = &v->trie_root[t[0]], node = -1;
        for (uint32_t k = 0; k < v->len[id]; k++) {
            node = *link;
            while (node >= 0 && v->trie[node].byte != t[k])
                node = v->trie[node].sibling;
            if (node < 0) { /* a new child, in front of its siblings */
                node = (int32_t)v->n_trie++;
                v->trie[node] = (struct qd_trie_node){-1, *link, -1, t[k]};
                *link = node;
            }
            link = &v->trie[node].child;
        }
        v->trie[node].token = id;
    }
    return QD_OK;
}

struct hit {
    uint32_t rank; /* the token's place in llama.cpp's order */
    int32_t token;
    size_t pos;
};

static int by_rank_then_pos(const void *a, const void *b)
{
    const struct hit *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int by_pos(const void *a, const void *b)
{
    const struct hit *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); } /* isspace in the "C" locale */

/* A piece of the text: plain (token < 0) or a special token. */
struct frag {
    size_t off, len;
    int32_t token;
};

/* tokenizer_st_partition: *frags (malloc'd) in text order. */
static enum qd_status partition(const struct qd_vocab *v, const char *text, size_t len, int parse_special,
                                struct frag **frags, size_t *n_frags)
{
    struct hit *hits = NULL, *nh;
    size_t n_hits = 0, cap = 0, n_taken = 0;
    uint8_t *cut = NULL; /* bytes no longer plain text: taken by a token, or stripped */
    *frags = NULL;
    *n_frags = 0;
    for (size_t pos = 0; pos < len; pos++) {
        int32_t node = v->trie_root[(uint8_t)text[pos]];
        for (size_t k = pos; node >= 0;) {
            int32_t tok = v->trie[node].token;
            if (tok >= 0 && (parse_special || !(v->attr[tok] & (QD_ATTR_CONTROL | QD_ATTR_UNKNOWN)))) {
                if (n_hits == cap) {
                    cap = cap ? cap * 2 : 64;
                    if (!(nh = realloc(hits, cap * sizeof *hits)))
                        goto oom;
                    hits = nh;
                }
                hits[n_hits++] = (struct hit){v->special_rank[tok], tok, pos};
            }
            if (++k >= len)
                break;
            for (node = v->trie[node].child; node >= 0 && v->trie[node].byte != (uint8_t)text[k];)
                node = v->trie[node].sibling;
        }
    }
    if (n_hits) {
        if (!(cut = calloc(len, 1)))
            goto oom;
        qsort(hits, n_hits, sizeof *hits, by_rank_then_pos);
        for (size_t h = 0; h < n_hits; h++) {
            size_t p = hits[h].pos, tl = v->len[hits[h].token];
            if (memchr(cut + p, 1, tl))
                continue;
            memset(cut + p, 1, tl);
            hits[n_taken++] = hits[h];
            uint32_t attr = v->attr[hits[h].token];
            for (size_t q = p; (attr & QD_ATTR_LSTRIP) && q > 0 && !cut[q - 1] && c_space(text[q - 1]); q--)
                cut[q - 1] = 1;
            for (size_t q = p + tl; (attr & QD_ATTR_RSTRIP) && q < len && !cut[q] && c_space(text[q]); q++)
                cut[q] = 1;
        }
        qsort(hits, n_taken, sizeof *hits, by_pos);
    }
    struct frag *f = malloc((2 * n_taken + 1) * sizeof *f);
    if (!f)
        goto oom;
    size_t nf = 0, pos = 0;
    for (size_t h = 0; h <= n_taken; h++) {
        size_t stop = h < n_taken ? hits[h].pos : len;
        while (pos < stop) { /* the plain runs before the next token (stripped bytes are skipped) */
            while (pos < stop && cut && cut[pos])
                pos++;
            size_t start = pos;
            while (pos < stop && !(cut && cut[pos]))
                pos++;
            if (pos > start)
                f[nf++] = (struct frag){start, pos - start, -1};
        }
        if (h < n_taken) {
            f[nf++] = (struct frag){hits[h].pos, v->len[hits[h].token], hits[h].token};
            pos = hits[h].pos + v->len[hits[h].token];
        }
    }
    free(hits);
    free(cut);
    *frags = f;
    *n_frags = nf;
    return QD_OK;
oom:
    free(hits);
    free(cut);
    return QD_ENOMEM;
}

/* ---- tokenize ------------------------------------------------------------------------------- */

static enum qd_status add_id(struct qd_ids *o, int32_t id, const char *what, char *err, size_t errlen)
{
    if (id < 0) {
        snprintf(err, errlen, "the vocabulary asks for a %s token but names none", what);
        return QD_EINVAL;
    }
    return qd_ids_push(o, id) ? QD_ENOMEM : QD_OK;
}

/* One plain stretch of an SPM text: a space in front after a special token (or at the start)
 * when add_space_prefix, and every space as U+2581. */
static enum qd_status spm_fragment(const struct qd_vocab *v, const char *text, size_t len, int prefix,
                                   struct qd_ids *out, char *err, size_t errlen)
{
    size_t spaces = prefix;
    for (size_t i = 0; i < len; i++)
        spaces += text[i] == ' ';
    char *s = malloc(len + prefix + 2 * spaces + 1);
    if (!s)
        return QD_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < len + (size_t)prefix; i++) {
        char c = i < (size_t)prefix ? ' ' : text[i - (size_t)prefix];
        if (c == ' ') {
            memcpy(s + k, "\xE2\x96\x81", 3);
            k += 3;
        } else {
            s[k++] = c;
        }
    }
    enum qd_status st = qd_spm_tokenize(v, s, k, out, err, errlen);
    free(s);
    return st;
}

enum qd_status qd_tokenize(const struct qd_vocab *v, const char *text, size_t len, int add_special,
                           int parse_special, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    struct qd_ids out = {0};
    struct frag *f = NULL;
    size_t nf = 0;
    *ids = NULL;
    *n = 0;
    enum qd_status st = partition(v, text, len, parse_special, &f, &nf);
    if (!st && add_special && v->add_bos)
        st = add_id(&out, v->bos, "BOS", err, errlen);
    int prev_special = 1; /* SPM: the first stretch gets the space prefix too */
    for (size_t i = 0; i < nf && !st; i++) {
        if (f[i].token >= 0) {
            st = qd_ids_push(&out, f[i].token) ? QD_ENOMEM : QD_OK;
            prev_special = 1;
        } else if (v->kind == QD_VOCAB_SPM) {
            st = spm_fragment(v, text + f[i].off, f[i].len, v->add_space_prefix && prev_special, &out, err, errlen);
            prev_special = 0;
        } else {
            st = qd_bpe_tokenize(v, text + f[i].off, f[i].len, &out, err, errlen);
        }
    }
    if (!st && add_special && v->add_eos)
        st = add_id(&out, v->eos, "EOS", err, errlen);
    free(f);
    if (st) {
        if (st == QD_ENOMEM)
            snprintf(err, errlen, "no memory to tokenize %zu bytes", len);
        free(out.id);
        return st;
    }
    *ids = out.id;
    *n = out.n;
    return QD_OK;
}
