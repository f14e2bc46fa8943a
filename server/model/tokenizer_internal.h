/* What the tokenizer's files share: the loaded vocabulary, its hash maps, the pre-tokenizer table
 * and the two merge algorithms. Not for use outside server/model/tokenizer*.c. */
#ifndef QD_TOKENIZER_INTERNAL_H
#define QD_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"
#include "model/tokenizer_regex.h"

/* llama_token_attr (llama.h) */
enum {
    QD_ATTR_UNKNOWN = 1 << 0,
    QD_ATTR_UNUSED = 1 << 1,
    QD_ATTR_NORMAL = 1 << 2,
    QD_ATTR_CONTROL = 1 << 3,
    QD_ATTR_USER_DEFINED = 1 << 4,
    QD_ATTR_BYTE = 1 << 5,
    QD_ATTR_LSTRIP = 1 << 7,
    QD_ATTR_RSTRIP = 1 << 8,
};

/* An open-addressing map from byte strings to int32 values (token ids, merge ranks). A slot
 * holds the value + 1 (0: empty) and, above it, 32 bits of the key's hash, so that most
 * mismatches are told without reading the key. */
struct qd_strmap {
    uint64_t *slots;
    uint32_t mask;
};

/* ---- pre-tokenizers (tokenizer_pretok.c) ---------------------------------------------------- */

/* How one split step cuts text: by a regular expression, or by one of llama.cpp's hand-written
 * splitters for the common expressions (which it uses in their place, and whose results differ
 * from the expressions' in corners: those corners are kept). */
enum qd_split_kind { QD_SPLIT_END, QD_SPLIT_REGEX, QD_SPLIT_GPT2, QD_SPLIT_LLAMA3, QD_SPLIT_QWEN2, QD_SPLIT_QWEN35,
                     QD_SPLIT_NEWLINES };

struct qd_split {
    enum qd_split_kind kind;
    const char *regex; /* QD_SPLIT_REGEX: UTF-8, with \p{L} \p{N} \p{P} \p{S} \p{M} classes */
};

enum {
    QD_PRE_IGNORE_MERGES = 1, /* a word that is a token is taken whole */
    QD_PRE_ADD_BOS = 2,       /* BOS by default (the GGUF's add_bos_token still decides) */
    QD_PRE_SPM_STYLE = 4,     /* spaces become U+2581 and words stay raw UTF-8 (no byte alphabet) */
    QD_PRE_NO_BOS_ID = 8,     /* no default BOS id */
    QD_PRE_GEMMA4 = 16,       /* BOS always; a word of newlines only that is a token is taken whole */
};

#define QD_MAX_SPLITS 6
struct qd_pretok {
    const char *name;
    const char *aliases; /* the tokenizer.ggml.pre values that select it, space-separated */
    unsigned flags;
    struct qd_split split[QD_MAX_SPLITS + 1];
};

/* The row for a tokenizer.ggml.pre value ("" and "default": the default row), or NULL. */
const struct qd_pretok *qd_pretok_find(const char *pre);
/* The names it knows, for an error message. */
void qd_pretok_names(char *out, size_t outlen);

/* A pre-tokenizer made ready for one vocabulary: its expressions compiled. */
struct qd_pretok_run {
    const struct qd_pretok *row;
    struct qd_regex *re[QD_MAX_SPLITS];
    int collapsed[QD_MAX_SPLITS]; /* the expression runs over category bytes (it names \p{..}) */
};
enum qd_status qd_pretok_prepare(const struct qd_pretok *row, struct qd_pretok_run *run, char *err, size_t errlen);
void qd_pretok_release(struct qd_pretok_run *run);

/* Cuts cpts[0, n) into words: lens[] (n entries at most, caller's) gets their lengths in code
 * points; returns the count, or (size_t)-1 when out of memory. */
size_t qd_pretok_split(const struct qd_pretok_run *run, const uint32_t *cpts, size_t n, size_t *lens);

/* ---- the vocabulary (tokenizer_vocab.c) ----------------------------------------------------- */

enum qd_vocab_kind { QD_VOCAB_SPM, QD_VOCAB_BPE };

struct qd_vocab {
    enum qd_vocab_kind kind;
    struct qd_pretok_run pre; /* BPE */
    int32_t n;                /* tokens */
    const char **text;        /* each token's text (into arena), NUL-terminated */
    uint32_t *len;
    float *score;
    uint32_t *attr;
    struct qd_strmap by_text;
    /* SPM: hashes of the pairs of adjacent characters found inside some token's text. Where two
     * neighbouring characters of a text make no such pair, no merge can ever join them, so the
     * text is merged in independent stretches (the result is the same, and the work local). */
    uint64_t *char_pairs;
    uint32_t char_pairs_mask;
    /* BPE merges: "left right" strings and their ranks (the first of equal strings counts) */
    uint32_t n_merges;
    const char **merge;
    uint32_t *merge_len;
    char *merge_arena;
    struct qd_strmap by_merge;
    /* token pieces (llama_token_to_piece with special) */
    const char **piece;
    uint32_t *piece_len;
    char *piece_arena;
    /* control, user-defined and unknown tokens, longest text first: tokenizer_st_partition's order,
     * and a trie over their texts to find them in text */
    int32_t *special;
    uint32_t n_special;
    uint32_t *special_rank; /* by token id: its place in `special` */
    struct qd_trie_node *trie;
    uint32_t n_trie;
    int32_t trie_root[256];
    int32_t bos, eos;
    int add_bos, add_eos, add_space_prefix;
    int32_t byte_token[256];  /* SPM byte fallback: <0xXX>, else the byte itself; -1 when neither */
    int32_t raw_byte_token[256]; /* BPE's last resort: the one-byte token text; -1 when none */
    int32_t hex_byte_token[256]; /* the same for SPM-style BPE: <0xXX> */
    uint8_t byte_utf8[256][2];   /* GPT-2's alphabet: a byte's character in UTF-8 (below U+0800) */
    uint8_t byte_utf8_len[256];
    char *arena;
};

struct qd_trie_node {
    int32_t child, sibling; /* -1: none */
    int32_t token;          /* the special token whose text ends here, or -1 */
    uint8_t byte;
};

/* Builds v->trie and v->special_rank from v->special (tokenizer.c). */
enum qd_status qd_special_index(struct qd_vocab *v, char *err, size_t errlen);

/* tokenizer_strmap.c: a map for n keys (0, or -1 without memory); a key's value or -1 (a token
 * text l, or a merge "l r" when r is not NULL); inserting key `id` of keys[] (an equal key there
 * already stays, and its id is returned). */
int qd_strmap_init(struct qd_strmap *m, uint32_t n);
int32_t qd_strmap_find(const struct qd_strmap *m, const char *const *keys, const uint32_t *key_len, const char *l,
                       size_t ln, const char *r, size_t rn);
int32_t qd_strmap_insert(struct qd_strmap *m, const char *const *keys, const uint32_t *key_len, int32_t id);
/* Fills v->char_pairs from the token texts. */
enum qd_status qd_char_pairs_build(struct qd_vocab *v);
/* The hash of two adjacent characters (their bytes), for char_pairs; never 0. */
uint64_t qd_char_pair_hash(const char *a, size_t an, const char *b, size_t bn);
int qd_char_pair_known(const struct qd_vocab *v, uint64_t h);

/* The id of a token's text, or -1. */
int32_t qd_vocab_find(const struct qd_vocab *v, const char *s, size_t n);
/* The rank of merging left and right, or -1. */
int32_t qd_vocab_merge_rank(const struct qd_vocab *v, const char *l, size_t ln, const char *r, size_t rn);

/* ---- the merge algorithms (tokenizer_spm.c, tokenizer_bpe.c) ------------------------------- */

/* A growing list of token ids. */
struct qd_ids {
    int32_t *id;
    size_t n, cap;
};
int qd_ids_push(struct qd_ids *o, int32_t id);

/* llm_tokenizer_spm_session::tokenize over text (spaces already U+2581). */
enum qd_status qd_spm_tokenize(const struct qd_vocab *v, const char *text, size_t len, struct qd_ids *out,
                               char *err, size_t errlen);
/* llm_tokenizer_bpe_session::tokenize over one fragment of raw text. */
enum qd_status qd_bpe_tokenize(const struct qd_vocab *v, const char *text, size_t len, struct qd_ids *out,
                               char *err, size_t errlen);

/* A heap of candidate merges, smallest key first: the key orders by the merge's priority, then
 * by its left symbol (the leftmost first among equals, as llama.cpp's queues order them). */
struct qd_merge {
    uint64_t key;   /* priority << 32 | left */
    int32_t right;
    uint32_t bytes; /* left's and right's bytes when pushed: stale once either changed */
};
static inline int32_t qd_merge_left(const struct qd_merge *m) { return (int32_t)(uint32_t)m->key; }
/* SPM: the highest score first (-0 and +0 equal, as float comparison has them) */
static inline uint64_t qd_merge_key_score(float score, int32_t left)
{
    union { float f; uint32_t u; } x = {score == 0 ? 0.0f : score};
    uint32_t ordered = x.u & 0x80000000u ? ~x.u : x.u | 0x80000000u; /* grows with the float */
    return (uint64_t)~ordered << 32 | (uint32_t)left;
}
/* BPE: the lowest rank first */
static inline uint64_t qd_merge_key_rank(int32_t rank, int32_t left) { return (uint64_t)(uint32_t)rank << 32 | (uint32_t)left; }
struct qd_heap {
    struct qd_merge *a;
    size_t n, cap;
};
int qd_heap_push(struct qd_heap *h, struct qd_merge m);
struct qd_merge qd_heap_pop(struct qd_heap *h);

#endif
