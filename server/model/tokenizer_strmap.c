/* The tokenizer's hash maps (tokenizer_internal.h): token texts and merges to their ids and
 * ranks, and the set of character pairs found inside tokens (SPM's independent stretches). */
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_internal.h"
#include "model/tokenizer_unicode.h"

/* FNV-1a over up to three byte strings, as if they were one. */
static uint64_t hash3(const char *a, size_t an, const char *b, size_t bn, const char *c, size_t cn)
{
    uint64_t h = 1469598103934665603ull;
    const char *p[3] = {a, b, c};
    size_t n[3] = {an, bn, cn};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < n[k]; i++)
            h = (h ^ (uint8_t)p[k][i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

int qd_strmap_init(struct qd_strmap *m, uint32_t n)
{
    if (n > 1u << 30) /* (a slot per two keys must fit 32-bit indices) */
        return -1;
    uint32_t cap = 16;
    while (cap < 2 * (uint64_t)n + 1)
        cap *= 2;
    m->slots = calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    return m->slots ? 0 : -1;
}

/* Finds a token text (l, ln) or a merge "l r" (r != NULL). */
int32_t qd_strmap_find(const struct qd_strmap *m, const char *const *keys, const uint32_t *key_len, const char *l,
                        size_t ln, const char *r, size_t rn)
{
    size_t total = r ? ln + 1 + rn : ln;
    uint64_t h = r ? hash3(l, ln, " ", 1, r, rn) : hash3(l, ln, NULL, 0, NULL, 0), tag = h >> 32 << 32;
    for (uint32_t i = (uint32_t)h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t s = m->slots[i];
        if (!s)
            return -1;
        if ((s & ~0xFFFFFFFFull) != tag)
            continue;
        uint32_t id = (uint32_t)s - 1;
        const char *k = keys[id];
        if (key_len[id] == total && !memcmp(k, l, ln) && (!r || (k[ln] == ' ' && !memcmp(k + ln + 1, r, rn))))
            return (int32_t)id;
    }
}

/* Inserts key `id`; when an equal key is there already, keeps it and returns its id. */
int32_t qd_strmap_insert(struct qd_strmap *m, const char *const *keys, const uint32_t *key_len, int32_t id)
{
    const char *k = keys[id];
    uint32_t kn = key_len[id];
    uint64_t h = hash3(k, kn, NULL, 0, NULL, 0), tag = h >> 32 << 32;
    for (uint32_t i = (uint32_t)h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t s = m->slots[i];
        if (!s) {
            m->slots[i] = tag | ((uint32_t)id + 1);
            return id;
        }
        uint32_t other = (uint32_t)s - 1;
        if ((s & ~0xFFFFFFFFull) == tag && key_len[other] == kn && !memcmp(keys[other], k, kn))
            return (int32_t)other;
    }
}

uint64_t qd_char_pair_hash(const char *a, size_t an, const char *b, size_t bn)
{
    return hash3(&(char){(char)an}, 1, a, an, b, bn) | 1;
}

int qd_char_pair_known(const struct qd_vocab *v, uint64_t h)
{
    for (uint32_t i = (uint32_t)h & v->char_pairs_mask;; i = (i + 1) & v->char_pairs_mask) {
        if (v->char_pairs[i] == h)
            return 1;
        if (!v->char_pairs[i])
            return 0;
    }
}

/* Every pair of adjacent characters inside the tokens' texts (characters cut as the SPM merge
 * cuts its text: by the lead byte). */
/* Adds h to a set of cap slots (a power of two); whether it was new. */
static int pair_add(uint64_t *slots, uint32_t mask, uint64_t h)
{
    uint32_t k = (uint32_t)h & mask;
    while (slots[k] && slots[k] != h)
        k = (k + 1) & mask;
    int fresh = !slots[k];
    slots[k] = h;
    return fresh;
}

enum qd_status qd_char_pairs_build(struct qd_vocab *v)
{
    uint32_t cap = 1 << 16, count = 0; /* grows: far fewer pairs differ than tokens hold */
    if (!(v->char_pairs = calloc(cap, sizeof *v->char_pairs)))
        return QD_ENOMEM;
    v->char_pairs_mask = cap - 1;
    for (int32_t i = 0; i < v->n; i++) {
        const char *t = v->text[i];
        size_t n = v->len[i], prev = 0, prev_n = 0;
        for (size_t off = 0; off < n;) {
            size_t c = qd_utf8_len((uint8_t)t[off]);
            c = c < n - off ? c : n - off;
            if (off && pair_add(v->char_pairs, v->char_pairs_mask, qd_char_pair_hash(t + prev, prev_n, t + off, c)) &&
                ++count > cap / 2) {
                if (cap > 1u << 30)
                    return QD_ENOMEM;
                uint64_t *bigger = calloc((size_t)cap * 2, sizeof *bigger);
                if (!bigger)
                    return QD_ENOMEM;
                for (uint32_t k = 0; k < cap; k++)
                    if (v->char_pairs[k])
                        pair_add(bigger, cap * 2 - 1, v->char_pairs[k]);
                free(v->char_pairs);
                v->char_pairs = bigger;
                cap *= 2;
                v->char_pairs_mask = cap - 1;
            }
            prev = off;
            prev_n = c;
            off += c;
        }
    }
    return QD_OK;
}

int32_t qd_vocab_find(const struct qd_vocab *v, const char *s, size_t n)
{
    return qd_strmap_find(&v->by_text, v->text, v->len, s, n, NULL, 0);
}

int32_t qd_vocab_merge_rank(const struct qd_vocab *v, const char *l, size_t ln, const char *r, size_t rn)
{
    return v->n_merges ? qd_strmap_find(&v->by_merge, v->merge, v->merge_len, l, ln, r, rn) : -1;
}
