/* The vocabulary of a GGUF file, read as llama_vocab::impl::load reads it (llama-vocab.cpp):
 * tokens, scores and types, BPE merges, the special ids and the add_* flags, then the
 * attribute fixes llama.cpp applies by token text (end-of-generation and fill-in-the-middle
 * tokens become control tokens, and so on), which decide how special tokens are parsed.
 *
 * Where llama.cpp's result depends on the iteration order of its std::unordered_map, this file
 * takes the lowest id: when several texts of one fill-in-the-middle kind (e.g. "<|fim_prefix|>"
 * and "<PRE>") are present and none is set by a key, llama.cpp marks whichever its map yields
 * first as a control token. No vocabulary of the supported models has two. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/tokenizer_internal.h"
#include "model/tokenizer_unicode.h"

/* ---- GGUF values ---------------------------------------------------------------------------- */

struct loader {
    const struct qd_gguf *g;
    char *err;
    size_t errlen;
};

static enum qd_status bad(struct loader *L, enum qd_status s, const char *fmt, const char *a, const char *b)
{
    char msg[3072];
    snprintf(msg, sizeof msg, fmt, a, b);
    snprintf(L->err, L->errlen, "vocabulary: %s", msg);
    return s;
}

/* An optional integer key: 1 when present (*v set), 0 when absent, -1 when not an integer. */
static int get_int(struct loader *L, const char *key, int64_t *v)
{
    const struct qd_gguf_kv *kv = qd_gguf_find(L->g, key);
    if (!kv)
        return 0;
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; } x;
    static const uint8_t size[] = {[QD_GGUF_U8] = 1, [QD_GGUF_I8] = 1, [QD_GGUF_U16] = 2, [QD_GGUF_I16] = 2,
                                   [QD_GGUF_U32] = 4, [QD_GGUF_I32] = 4, [QD_GGUF_U64] = 8, [QD_GGUF_I64] = 8};
    if (kv->type >= sizeof size || !size[kv->type])
        return -1;
    memcpy(&x, kv->value, size[kv->type]);
    switch (kv->type) {
    case QD_GGUF_U8: *v = x.u8; break;
    case QD_GGUF_I8: *v = x.i8; break;
    case QD_GGUF_U16: *v = x.u16; break;
    case QD_GGUF_I16: *v = x.i16; break;
    case QD_GGUF_U32: *v = x.u32; break;
    case QD_GGUF_I32: *v = x.i32; break;
    case QD_GGUF_U64: *v = x.u64 > INT64_MAX ? INT64_MAX : (int64_t)x.u64; break;
    default: *v = x.i64; break;
    }
    return 1;
}

/* An optional bool key into *v; -1 when it is not a bool. */
static int get_bool(struct loader *L, const char *key, int *v)
{
    const struct qd_gguf_kv *kv = qd_gguf_find(L->g, key);
    if (!kv)
        return 0;
    if (kv->type != QD_GGUF_BOOL)
        return -1;
    *v = kv->value[0] != 0;
    return 1;
}

/* A special token id: the key's value when inside the vocabulary, else the default (itself
 * dropped when outside, as llama.cpp does). *set: whether the key gave it. */
static enum qd_status special_id(struct loader *L, const char *key, int32_t dflt, int32_t n, int32_t *id, int *set)
{
    int64_t x = 0;
    int r = get_int(L, key, &x);
    if (r < 0)
        return bad(L, QD_EINVAL, "%s is not an integer%s", key, "");
    *id = dflt >= n ? -1 : dflt;
    if (set)
        *set = 0;
    if (r == 1 && x >= 0 && x < n) {
        *id = (int32_t)x;
        if (set)
            *set = 1;
    }
    return QD_OK;
}

/* ---- building ------------------------------------------------------------------------------- */

static const char *const fim_texts[6][8] = {
    {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
     "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"},
    {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>",
     "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"},
    {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
     "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"},
    {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
    {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
    {"<|file_sep|>"},
};
static const char *const fim_keys[6][2] = {
    {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
    {"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
    {"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
    {"tokenizer.ggml.fim_pad_token_id", NULL},
    {"tokenizer.ggml.fim_rep_token_id", NULL},
    {"tokenizer.ggml.fim_sep_token_id", NULL},
};
/* the texts llama.cpp takes as ends of generation: each becomes a control token */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "[e~[",
};

static int32_t find_text(const struct qd_vocab *v, const char *s) { return qd_vocab_find(v, s, strlen(s)); }

/* The attribute fixes of impl::load, in its order. */
static enum qd_status fix_attributes(struct loader *L, struct qd_vocab *v)
{
    for (int kind = 0; kind < 6; kind++) {
        int32_t id = -1;
        int set = 0;
        for (int k = 0; k < 2 && fim_keys[kind][k] && !set; k++) {
            enum qd_status s = special_id(L, fim_keys[kind][k], -1, v->n, &id, &set);
            if (s)
                return s;
        }
        if (set)
            continue;
        int32_t best = -1;
        for (int t = 0; t < 8 && fim_texts[kind][t]; t++) {
            int32_t tid = find_text(v, fim_texts[kind][t]);
            if (tid >= 0 && (best < 0 || tid < best))
                best = tid;
        }
        if (best >= 0)
            v->attr[best] |= QD_ATTR_CONTROL;
    }
    for (size_t t = 0; t < sizeof eog_texts / sizeof eog_texts[0]; t++) {
        int32_t tid = find_text(v, eog_texts[t]);
        if (tid >= 0)
            v->attr[tid] |= QD_ATTR_CONTROL;
    }
    /* gpt-oss's channel tokens are always printed */
    static const char *const shown[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (int t = 0; t < 4; t++) {
        int32_t tid = find_text(v, shown[t]);
        if (tid >= 0)
            v->attr[tid] = QD_ATTR_USER_DEFINED;
    }
    /* with "<|return|>" and "<|call|>" (or "<|calls|>" and "<|flush|>"), "<|end|>" is not an end */
    int32_t end = find_text(v, "<|end|>");
    int has_call = find_text(v, "<|call|>") >= 0 || find_text(v, "<|calls|>") >= 0;
    if (end >= 0 && has_call && (find_text(v, "<|return|>") >= 0 || find_text(v, "<|flush|>") >= 0))
        v->attr[end] = QD_ATTR_USER_DEFINED;
    /* Gemma 4 and PLaMo have an ordinary "</s>" */
    int32_t s_end = find_text(v, "</s>");
    if (s_end >= 0 && (find_text(v, "<|tool_response>") >= 0 || find_text(v, "<|plamo:eos|>") >= 0))
        v->attr[s_end] = QD_ATTR_NORMAL;
    return QD_OK;
}

struct len_id {
    uint32_t len;
    int32_t id;
};

/* Longest first; llama.cpp's std::sort leaves ties in no set order, this takes the lower id. */
static int by_length_desc(const void *a, const void *b)
{
    const struct len_id *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Per-token attributes llama.cpp sets by model name (Phi-3's strip spaces after its specials). */
static void name_attributes(struct loader *L, struct qd_vocab *v)
{
    char *name = qd_gguf_string(L->g, "general.name");
    if (!name)
        return;
    for (char *p = name; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    if (strstr(name, "phi-3") || strstr(name, "phi3")) {
        for (uint32_t i = 0; i < v->n_special; i++)
            v->attr[v->special[i]] |= QD_ATTR_RSTRIP;
        int32_t t = find_text(v, "</s>");
        if (t >= 0)
            v->attr[t] |= QD_ATTR_RSTRIP;
        static const char *const plain[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (int k = 0; k < 3; k++)
            if ((t = find_text(v, plain[k])) >= 0)
                v->attr[t] &= ~(uint32_t)QD_ATTR_RSTRIP;
    } else if (strstr(name, "modern-bert")) {
        int32_t t = find_text(v, "[MASK]");
        if (t >= 0)
            v->attr[t] |= QD_ATTR_LSTRIP;
    }
    free(name);
}

/* llama_decode_text: GPT-2's alphabet back to bytes; a character outside it becomes
 * "[UNK_BYTE_0x<its UTF-8 in hex><the whole token text>]". Writes to out unless NULL; returns
 * the length. cpt: scratch for n code points. */
static size_t decode_byte_level(const char *text, size_t n, uint32_t *cpt, char *out)
{
    size_t k = 0, m = qd_utf8_decode((const uint8_t *)text, n, cpt);
    for (size_t i = 0; i < m; i++) {
        int b = qd_cpt_to_byte(cpt[i]);
        if (b >= 0) {
            if (out)
                out[k] = (char)b;
            k++;
            continue;
        }
        uint8_t u[4];
        size_t un = qd_utf8_encode(cpt[i], u);
        char head[24];
        size_t hn = (size_t)snprintf(head, sizeof head, "[UNK_BYTE_0x");
        for (size_t j = 0; j < un; j++)
            hn += (size_t)snprintf(head + hn, sizeof head - hn, "%02x", u[j]);
        if (out) {
            memcpy(out + k, head, hn);
            memcpy(out + k + hn, text, n);
            out[k + hn + n] = ']';
        }
        k += hn + n + 1;
    }
    return k;
}

/* The byte of a <0xXX> token (llama.cpp reads the two characters after "<0x" in base 16). */
static char byte_of(const char *text, size_t n)
{
    char hex[3] = {n > 3 ? text[3] : 0, n > 4 ? text[4] : 0, 0};
    return (char)strtol(hex, NULL, 16);
}

/* U+2581 back to a space, into out unless NULL; returns the length. */
static size_t unescape_spaces(const char *text, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++, k++) {
        int sp = i + 2 < n && !memcmp(text + i, "\xE2\x96\x81", 3);
        if (out)
            out[k] = sp ? ' ' : text[i];
        i += sp ? 2 : 0;
    }
    return k;
}

/* One token's piece as token_to_piece_for_cache makes it (special on); out NULL: its length. */
static size_t piece_of(const struct qd_vocab *v, int32_t i, uint32_t *scratch, char *out)
{
    const char *t = v->text[i];
    size_t n = v->len[i];
    uint32_t a = v->attr[i];
    if (a & (QD_ATTR_UNKNOWN | QD_ATTR_CONTROL | QD_ATTR_USER_DEFINED)) {
        if (out)
            memcpy(out, t, n);
        return n;
    }
    if (a & QD_ATTR_NORMAL) {
        if (v->kind == QD_VOCAB_SPM || (v->pre.row->flags & QD_PRE_SPM_STYLE))
            return unescape_spaces(t, n, out);
        return decode_byte_level(t, n, scratch, out);
    }
    if (a & QD_ATTR_BYTE) {
        if (out)
            out[0] = byte_of(t, n);
        return 1;
    }
    return 0; /* unused and undefined tokens have no piece */
}

static enum qd_status make_pieces(struct qd_vocab *v)
{
    uint32_t longest = 0;
    for (int32_t i = 0; i < v->n; i++)
        longest = v->len[i] > longest ? v->len[i] : longest;
    uint32_t *scratch = malloc(((size_t)longest + 1) * sizeof *scratch);
    v->piece = malloc((size_t)v->n * sizeof *v->piece);
    v->piece_len = malloc((size_t)v->n * sizeof *v->piece_len);
    if (!scratch || !v->piece || !v->piece_len) {
        free(scratch);
        return QD_ENOMEM;
    }
    size_t total = 0;
    for (int32_t i = 0; i < v->n; i++) {
        size_t k = piece_of(v, i, scratch, NULL);
        if (k > UINT32_MAX) {
            free(scratch);
            return QD_EINVAL;
        }
        v->piece_len[i] = (uint32_t)k;
        total += k;
    }
    v->piece_arena = malloc(total + 1);
    if (!v->piece_arena) {
        free(scratch);
        return QD_ENOMEM;
    }
    size_t k = 0;
    for (int32_t i = 0; i < v->n; i++) {
        v->piece[i] = v->piece_arena + k;
        piece_of(v, i, scratch, v->piece_arena + k);
        k += v->piece_len[i];
    }
    free(scratch);
    return QD_OK;
}

static enum qd_status read_tokens(struct loader *L, struct qd_vocab *v)
{
    struct qd_gguf_array toks, scores, types;
    if (qd_gguf_array(L->g, "tokenizer.ggml.tokens", &toks) || toks.type != QD_GGUF_STRING)
        return bad(L, QD_EINVAL, "tokenizer.ggml.tokens is missing or not an array of strings%s%s", "", "");
    if (toks.n == 0 || toks.n > INT32_MAX)
        return bad(L, QD_EINVAL, "tokenizer.ggml.tokens holds no token or too many%s%s", "", "");
    v->n = (int32_t)toks.n;
    int have_scores = !qd_gguf_array(L->g, "tokenizer.ggml.scores", &scores);
    if (have_scores && ((scores.type != QD_GGUF_F32 && scores.type != QD_GGUF_I32) || scores.n < toks.n))
        return bad(L, QD_EINVAL, "tokenizer.ggml.scores must be f32 or i32 values, one per token%s%s", "", "");
    int have_types = !qd_gguf_array(L->g, "tokenizer.ggml.token_type", &types);
    if (have_types && (types.type != QD_GGUF_I32 || types.n < toks.n))
        return bad(L, QD_EINVAL, "tokenizer.ggml.token_type must be i32 values, one per token%s%s", "", "");
    size_t n = (size_t)v->n, bytes = 0;
    const uint8_t *p = toks.data;
    for (size_t i = 0; i < n; i++) {
        uint64_t len;
        if (!qd_gguf_array_string(&toks, &p, &len))
            return bad(L, QD_EINVAL, "tokenizer.ggml.tokens is cut short%s%s", "", "");
        bytes += len + 24; /* room for "[EMPTY_<i>]" and the NUL */
    }
    v->text = malloc(n * sizeof *v->text);
    v->len = malloc(n * sizeof *v->len);
    v->score = malloc(n * sizeof *v->score);
    v->attr = malloc(n * sizeof *v->attr);
    v->arena = malloc(bytes);
    if (!v->text || !v->len || !v->score || !v->attr || !v->arena || qd_strmap_init(&v->by_text, v->n))
        return QD_ENOMEM;
    char *a = v->arena;
    p = toks.data;
    for (size_t i = 0; i < n; i++) {
        uint64_t len;
        const uint8_t *s = qd_gguf_array_string(&toks, &p, &len);
        size_t k = strnlen((const char *)s, len); /* llama.cpp reads each as a C string */
        if (k == 0)
            k = (size_t)sprintf(a, "[EMPTY_%zu]", i);
        else
            memcpy(a, s, k);
        a[k] = 0;
        v->text[i] = a;
        v->len[i] = (uint32_t)k;
        a += k + 1;
        v->score[i] = 0;
        if (have_scores && scores.type == QD_GGUF_F32)
            memcpy(&v->score[i], scores.data + 4 * i, 4);
        else if (have_scores) {
            int32_t x;
            memcpy(&x, scores.data + 4 * i, 4);
            v->score[i] = (float)x;
        }
        v->attr[i] = QD_ATTR_NORMAL;
        if (have_types) {
            int32_t t; /* llama_token_type: 0 undefined, 1 normal, 2 unknown, 3 control, 4 user, 5 unused, 6 byte */
            memcpy(&t, types.data + 4 * i, 4);
            static const uint32_t attr[7] = {0, QD_ATTR_NORMAL, QD_ATTR_UNKNOWN, QD_ATTR_CONTROL,
                                             QD_ATTR_USER_DEFINED, QD_ATTR_UNUSED, QD_ATTR_BYTE};
            v->attr[i] = t >= 0 && t < 7 ? attr[t] : 0;
        }
        int32_t first = qd_strmap_insert(&v->by_text, v->text, v->len, (int32_t)i);
        if (first != (int32_t)i) {
            char a1[24], a2[24];
            snprintf(a1, sizeof a1, "%d", first);
            snprintf(a2, sizeof a2, "%zu", i);
            return bad(L, QD_EINVAL, "tokens %s and %s have the same text (llama.cpp refuses such a vocabulary too)",
                       a1, a2);
        }
    }
    return QD_OK;
}

static enum qd_status read_merges(struct loader *L, struct qd_vocab *v)
{
    struct qd_gguf_array m;
    if (qd_gguf_array(L->g, "tokenizer.ggml.merges", &m) || m.type != QD_GGUF_STRING)
        return bad(L, QD_EINVAL, "a BPE vocabulary needs tokenizer.ggml.merges (an array of strings)%s%s", "", "");
    if (m.n > INT32_MAX)
        return bad(L, QD_EINVAL, "too many merges%s%s", "", "");
    v->n_merges = (uint32_t)m.n;
    size_t bytes = 1;
    const uint8_t *p = m.data;
    for (uint32_t i = 0; i < v->n_merges; i++) {
        uint64_t len;
        if (!qd_gguf_array_string(&m, &p, &len))
            return bad(L, QD_EINVAL, "tokenizer.ggml.merges is cut short%s%s", "", "");
        bytes += len;
    }
    v->merge = malloc((v->n_merges + 1) * sizeof *v->merge);
    v->merge_len = malloc((v->n_merges + 1) * sizeof *v->merge_len);
    v->merge_arena = malloc(bytes);
    if (!v->merge || !v->merge_len || !v->merge_arena || qd_strmap_init(&v->by_merge, v->n_merges))
        return QD_ENOMEM;
    char *a = v->merge_arena;
    p = m.data;
    for (uint32_t i = 0; i < v->n_merges; i++) {
        uint64_t len;
        const uint8_t *s = qd_gguf_array_string(&m, &p, &len);
        size_t k = strnlen((const char *)s, len);
        memcpy(a, s, k);
        v->merge[i] = a;
        v->merge_len[i] = (uint32_t)k;
        a += k;
        qd_strmap_insert(&v->by_merge, v->merge, v->merge_len, (int32_t)i); /* the first rank stays */
    }
    return QD_OK;
}

static void byte_tables(struct qd_vocab *v)
{
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char h[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0}, raw = (char)b;
        v->hex_byte_token[b] = qd_vocab_find(v, h, 6);
        v->raw_byte_token[b] = qd_vocab_find(v, &raw, 1);
        v->byte_token[b] = v->hex_byte_token[b] >= 0 ? v->hex_byte_token[b] : v->raw_byte_token[b];
        uint8_t u[4];
        v->byte_utf8_len[b] = (uint8_t)qd_utf8_encode(qd_byte_to_cpt((uint8_t)b), u);
        memcpy(v->byte_utf8[b], u, 2);
    }
}

enum qd_status qd_vocab_load(const struct qd_gguf *g, struct qd_vocab **out, char *err, size_t errlen)
{
    struct loader L = {g, err, errlen};
    *out = NULL;
    const struct qd_gguf_kv *mkv = qd_gguf_find(g, "tokenizer.ggml.model");
    if (!mkv)
        return bad(&L, QD_EINVAL, "the GGUF has no vocabulary (no tokenizer.ggml.model key): tokenize with a "
                   "model file converted with its tokenizer, or pass token ids%s%s", "", "");
    char *model = qd_gguf_string(g, "tokenizer.ggml.model"), *pre = qd_gguf_string(g, "tokenizer.ggml.pre");
    struct qd_vocab *v = calloc(1, sizeof *v);
    enum qd_status s = QD_OK;
    if (!model || !v) {
        s = !v ? QD_ENOMEM : bad(&L, QD_EINVAL, "tokenizer.ggml.model is not a string%s%s", "", "");
        goto done;
    }
    if (!strcmp(model, "none") || !strcmp(model, "no_vocab")) {
        s = bad(&L, QD_EINVAL, "the GGUF has no vocabulary (tokenizer.ggml.model is '%s'): pass token ids%s", model, "");
        goto done;
    }
    if (strcmp(model, "llama") && strcmp(model, "gpt2") && strcmp(model, "gemma4")) {
        s = bad(&L, QD_EINVAL, "tokenizer '%s' is not supported (quantd reads 'llama' SentencePiece and 'gpt2' "
                "or 'gemma4' BPE vocabularies)%s", model, "");
        goto done;
    }
    v->kind = !strcmp(model, "llama") ? QD_VOCAB_SPM : QD_VOCAB_BPE;
    int32_t bos = 1, eos = 2; /* llama.cpp's defaults for SentencePiece */
    if (v->kind == QD_VOCAB_BPE) {
        const char *name = !strcmp(model, "gemma4") ? "gemma4" : pre;
        const struct qd_pretok *row = qd_pretok_find(name);
        if (!row) {
            char known[1024];
            qd_pretok_names(known, sizeof known);
            s = bad(&L, QD_EINVAL, "pre-tokenizer '%s' (tokenizer.ggml.pre) is not supported; known: %s", name, known);
            goto done;
        }
        if ((s = qd_pretok_prepare(row, &v->pre, err, errlen)))
            goto done;
        bos = eos = !strcmp(model, "gemma4") ? -1 : 11; /* llama.cpp's BPE defaults */
        if (row->flags & QD_PRE_NO_BOS_ID)
            bos = -1;
        v->add_bos = !!(row->flags & QD_PRE_ADD_BOS);
        if ((s = read_merges(&L, v)))
            goto done;
    } else {
        v->add_space_prefix = v->add_bos = 1;
    }
    int r = get_bool(&L, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix);
    if ((s = read_tokens(&L, v)) || (s = special_id(&L, "tokenizer.ggml.bos_token_id", bos, v->n, &v->bos, NULL)) ||
        (s = special_id(&L, "tokenizer.ggml.eos_token_id", eos, v->n, &v->eos, NULL)))
        goto done;
    if (r < 0 || get_bool(&L, "tokenizer.ggml.add_bos_token", &v->add_bos) < 0 ||
        get_bool(&L, "tokenizer.ggml.add_eos_token", &v->add_eos) < 0) {
        s = bad(&L, QD_EINVAL, "tokenizer.ggml.add_bos_token, add_eos_token and add_space_prefix must be bools%s%s",
                "", "");
        goto done;
    }
    if (v->kind == QD_VOCAB_BPE && (v->pre.row->flags & QD_PRE_GEMMA4))
        v->add_bos = 1;
    if ((s = fix_attributes(&L, v)))
        goto done;
    struct len_id *order = malloc((size_t)v->n * sizeof *order);
    if (!order) {
        s = QD_ENOMEM;
        goto done;
    }
    for (int32_t i = 0; i < v->n; i++)
        if (v->attr[i] & (QD_ATTR_CONTROL | QD_ATTR_USER_DEFINED | QD_ATTR_UNKNOWN))
            order[v->n_special++] = (struct len_id){v->len[i], i};
    qsort(order, v->n_special, sizeof *order, by_length_desc);
    v->special = malloc((v->n_special + 1) * sizeof *v->special);
    if (v->special)
        for (uint32_t i = 0; i < v->n_special; i++)
            v->special[i] = order[i].id;
    free(order);
    if (!v->special || (s = make_pieces(v)) || (s = qd_special_index(v, err, errlen)))
        goto done;
    if (v->kind == QD_VOCAB_SPM && (s = qd_char_pairs_build(v)))
        goto done;
    name_attributes(&L, v);
    byte_tables(v);
done:
    free(model);
    free(pre);
    if (s == QD_ENOMEM)
        snprintf(err, errlen, "vocabulary: no memory");
    if (s) {
        qd_vocab_free(v);
        return s;
    }
    *out = v;
    return QD_OK;
}

enum qd_status qd_vocab_open(const char *path, struct qd_vocab **out, char *err, size_t errlen)
{
    *out = NULL;
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "cannot read '%s': %s", path, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return QD_EIO;
    }
    void *map = st.st_size ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "cannot map '%s': %s", path, st.st_size ? strerror(errno) : "the file is empty");
        return QD_EIO;
    }
    struct qd_gguf g;
    char why[512];
    enum qd_status s = QD_OK;
    if (qd_gguf_parse(map, (size_t)st.st_size, &g, NULL, why, sizeof why)) {
        snprintf(err, errlen, "'%s': %s", path, why);
        s = QD_EINVAL;
    } else {
        s = qd_vocab_load(&g, out, err, errlen);
        qd_gguf_free(&g);
    }
    munmap(map, (size_t)st.st_size);
    return s;
}

void qd_vocab_free(struct qd_vocab *v)
{
    if (!v)
        return;
    qd_pretok_release(&v->pre);
    free(v->text), free(v->len), free(v->score), free(v->attr), free(v->arena), free(v->by_text.slots);
    free(v->merge), free(v->merge_len), free(v->merge_arena), free(v->by_merge.slots);
    free(v->piece), free(v->piece_len), free(v->piece_arena);
    free(v->special), free(v->special_rank), free(v->trie), free(v->char_pairs);
    free(v);
}

int32_t qd_vocab_size(const struct qd_vocab *v) { return v->n; }
int qd_vocab_add_bos(const struct qd_vocab *v) { return v->add_bos; }
const char *qd_vocab_type_name(const struct qd_vocab *v) { return v->kind == QD_VOCAB_SPM ? "SPM" : "BPE"; }
const char *qd_vocab_pre_name(const struct qd_vocab *v) { return v->kind == QD_VOCAB_SPM ? "default" : v->pre.row->name; }

const char *qd_token_piece(const struct qd_vocab *v, int32_t id, int special, size_t *len)
{
    if (id < 0 || id >= v->n)
        return NULL;
    *len = !special && (v->attr[id] & (QD_ATTR_UNKNOWN | QD_ATTR_CONTROL)) ? 0 : v->piece_len[id];
    return v->piece[id];
}
