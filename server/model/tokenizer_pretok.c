/* BPE pre-tokenizers: how text is cut into words before merges, one table row per
 * tokenizer.ggml.pre family (llama-vocab.cpp, llm_tokenizer_bpe's constructor, and unicode.cpp's
 * unicode_regex_split). Each step cuts every piece the previous steps left.
 *
 * A step is either an expression run as llama.cpp runs it through std::regex, or one of the four
 * splitters llama.cpp hand-wrote for the most common expressions (GPT-2's, Llama 3's, Qwen 2's and
 * Qwen 3.5's) and uses in their place. Expressions naming \p{..} classes run as llama.cpp runs
 * them: over "collapsed" text, where each code point above U+007F becomes one byte standing for
 * its category (white space: 0x0B, \p{N}: 0xD1, \p{L}: 0xD2, \p{P}: 0xD3, \p{M}: 0xD4, \p{S}: 0xD5,
 * anything else: 0xD0), and with each class rewritten as that byte plus its ASCII members. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_internal.h"
#include "model/tokenizer_unicode.h"

/* Expressions shared by several rows. */
#define RE_DIGIT "\\p{N}"
#define RE_TEKKEN_LETTERS                                                                                         \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
#define RE_TEKKEN_LETTERS2                                                                                        \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_CJK_DEEPSEEK "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+"

#define REGEX(s) {QD_SPLIT_REGEX, s}
#define CUSTOM(k) {k, NULL}

static const struct qd_pretok rows[] = {
    {"default", "default", 0,
     {REGEX("[\\p{P}\\$\\+<=>\\^~\\|]+"), CUSTOM(QD_SPLIT_GPT2), REGEX("\\p{N}+"), REGEX("[0-9][0-9][0-9]")}},
    {"llama3", "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
     QD_PRE_IGNORE_MERGES | QD_PRE_ADD_BOS, {CUSTOM(QD_SPLIT_LLAMA3)}},
    {"dbrx", "dbrx smaug-bpe", 0, {CUSTOM(QD_SPLIT_LLAMA3)}},
    {"chatglm4", "chatglm-bpe", QD_PRE_NO_BOS_ID, {CUSTOM(QD_SPLIT_LLAMA3)}},
    {"glm4", "glm4 glm5", QD_PRE_NO_BOS_ID | QD_PRE_IGNORE_MERGES, {CUSTOM(QD_SPLIT_LLAMA3)}},
    {"deepseek-llm", "deepseek-llm", 0,
     {REGEX("[\r\n]"),
      REGEX("\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF"
            "\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5"
            "\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA"
            "\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45"
            "\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE"
            "\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC"
            "\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139"
            "\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3"
            "\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06"
            "\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3"
            "\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF"
            "\U0001E900-\U0001E943]+"),
      REGEX("\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+"), REGEX("\\s+$"),
      REGEX(RE_CJK_DEEPSEEK), REGEX("\\p{N}+")}},
    {"deepseek-coder", "deepseek-coder", 0,
     {REGEX("[\r\n]"), REGEX("\\s?\\p{L}+"), REGEX("\\s?\\p{P}+"), REGEX(RE_CJK_DEEPSEEK), REGEX(RE_DIGIT)}},
    {"deepseek-v3", "deepseek-v3 hunyuan-dense joyai-llm hy_v4", 0,
     {REGEX("\\p{N}{1,3}"), REGEX("[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+"),
      REGEX("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
            " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")}},
    {"falcon", "falcon", 0,
     {REGEX("[\\p{P}\\$\\+<=>\\^~\\|`]+"), CUSTOM(QD_SPLIT_GPT2), REGEX("[0-9][0-9][0-9]")}},
    {"starcoder", "starcoder refact command-r smollm codeshell exaone minerva-7b mellum2", 0,
     {REGEX(RE_DIGIT), CUSTOM(QD_SPLIT_GPT2)}},
    {"gpt-2", "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert mpt olmo "
              "jais trillion granite-docling exaone4", 0, {CUSTOM(QD_SPLIT_GPT2)}},
    {"qwen2", "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open", 0,
     {CUSTOM(QD_SPLIT_QWEN2)}},
    {"qwen35", "qwen35", 0, {CUSTOM(QD_SPLIT_QWEN35)}},
    {"tekken", "tekken", QD_PRE_IGNORE_MERGES | QD_PRE_ADD_BOS,
     {REGEX(RE_TEKKEN_LETTERS "|" RE_TEKKEN_LETTERS2 "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|"
            "\\s+(?!\\S)|\\s+")}},
    {"gpt-4o", "gpt-4o llama4 kanana2 talkie minimax-m2", 0,
     {REGEX(RE_TEKKEN_LETTERS RE_CONTRACTIONS "?|" RE_TEKKEN_LETTERS2 RE_CONTRACTIONS "?|\\p{N}{1,3}|"
            " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")}},
    /* Gemma 4: SentencePiece-style text (spaces as U+2581, raw UTF-8) merged per line */
    {"gemma4", "gemma4 granite-embed-multi-311m", QD_PRE_SPM_STYLE | QD_PRE_GEMMA4, {CUSTOM(QD_SPLIT_NEWLINES)}},
    {"sarvam-moe", "sarvam-moe", QD_PRE_SPM_STYLE, {CUSTOM(QD_SPLIT_NEWLINES)}},
};

static int has_word(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ' ');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == n && !memcmp(p, w, n))
            return 1;
        p += k + (e != NULL);
    }
    return 0;
}

const struct qd_pretok *qd_pretok_find(const char *pre)
{
    if (!pre || !*pre)
        return &rows[0];
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (has_word(rows[i].aliases, pre))
            return &rows[i];
    return NULL;
}

void qd_pretok_names(char *out, size_t outlen)
{
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0] && k < outlen; i++) {
        int w = snprintf(out + k, outlen - k, "%s%s", i ? " " : "", rows[i].aliases);
        if (w < 0)
            break;
        k += (size_t)w;
    }
}

/* ---- expressions ---------------------------------------------------------------------------- */

enum { COLLAPSED_SPACE = 0x0B, COLLAPSED_OTHER = 0xD0 };

/* The byte standing for a category in collapsed text, and the ASCII members of its class. */
static const struct {
    const char *name;
    unsigned flag;
    uint8_t byte;
    const char *ascii;
} classes[] = {
    {"\\p{N}", QD_UF_NUMBER, 0xD1, "0-9"},
    {"\\p{L}", QD_UF_LETTER, 0xD2, "A-Za-z"},
    {"\\p{P}", QD_UF_PUNCT, 0xD3, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"},
    {"\\p{M}", QD_UF_MARK, 0xD4, ""},
    {"\\p{S}", QD_UF_SYMBOL, 0xD5, "\\$\\+<->^`\\|\\~"},
    /* llama.cpp does not tell the letter kinds apart */
    {"\\p{Lu}", QD_UF_LETTER, 0xD2, "A-Za-z"},
    {"\\p{Ll}", QD_UF_LETTER, 0xD2, "A-Za-z"},
    {"\\p{Lt}", QD_UF_LETTER, 0xD2, "A-Za-z"},
    {"\\p{Lm}", QD_UF_LETTER, 0xD2, "A-Za-z"},
    {"\\p{Lo}", QD_UF_LETTER, 0xD2, "A-Za-z"},
};
#define N_CLASSES (sizeof classes / sizeof classes[0])

static int names_class(const char *re)
{
    for (size_t c = 0; c < N_CLASSES; c++)
        if (strstr(re, classes[c].name))
            return 1;
    return 0;
}

/* The expression with each \p{..} rewritten for collapsed text (unicode_regex_split's rule: a class
 * outside brackets gets brackets of its own; a '[' or ']' after a backslash is not a bracket). */
static size_t collapse_regex(const char *re, uint32_t *out)
{
    size_t n = strlen(re), k = 0;
    int inside = 0;
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
            out[k++] = '[';
            inside = 1;
            continue;
        }
        if (inside && re[i] == ']' && re[i - 1] != '\\') {
            out[k++] = ']';
            inside = 0;
            continue;
        }
        if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
            const char *close = strchr(re + i + 3, '}');
            size_t c = N_CLASSES;
            if (close && (size_t)(close - re) <= i + 10)
                for (c = 0; c < N_CLASSES; c++)
                    if (strlen(classes[c].name) == (size_t)(close - re) - i + 1 &&
                        !memcmp(re + i, classes[c].name, (size_t)(close - re) - i + 1))
                        break;
            if (c < N_CLASSES) {
                if (!inside)
                    out[k++] = '[';
                out[k++] = classes[c].byte;
                for (const char *a = classes[c].ascii; *a; a++)
                    out[k++] = (uint8_t)*a;
                if (!inside)
                    out[k++] = ']';
                i = (size_t)(close - re);
                continue;
            }
        }
        out[k++] = (uint8_t)re[i];
    }
    return k;
}

enum qd_status qd_pretok_prepare(const struct qd_pretok *row, struct qd_pretok_run *run, char *err, size_t errlen)
{
    memset(run, 0, sizeof *run);
    run->row = row;
    for (int s = 0; s < QD_MAX_SPLITS && row->split[s].kind != QD_SPLIT_END; s++) {
        if (row->split[s].kind != QD_SPLIT_REGEX)
            continue;
        const char *re = row->split[s].regex;
        size_t n = strlen(re), k;
        uint32_t *pat = malloc((n * 16 + 1) * sizeof *pat); /* a class grows to at most 13 entries */
        if (!pat) {
            qd_pretok_release(run);
            snprintf(err, errlen, "no memory");
            return QD_ENOMEM;
        }
        run->collapsed[s] = names_class(re);
        k = run->collapsed[s] ? collapse_regex(re, pat) : qd_utf8_decode((const uint8_t *)re, n, pat);
        char why[160];
        run->re[s] = qd_regex_compile(pat, k, why, sizeof why);
        free(pat);
        if (!run->re[s]) {
            snprintf(err, errlen, "pre-tokenizer '%s': expression %d does not compile: %s", row->name, s + 1, why);
            qd_pretok_release(run);
            return QD_EINVAL;
        }
    }
    return QD_OK;
}

void qd_pretok_release(struct qd_pretok_run *run)
{
    for (int s = 0; s < QD_MAX_SPLITS; s++)
        qd_regex_free(run->re[s]);
    memset(run->re, 0, sizeof run->re);
}

/* ---- llama.cpp's hand-written splitters ----------------------------------------------------- */

#define OUT_OF_RANGE 0xFFFFFFFFu

/* One piece [ini, end) of the text being cut; words are appended to lens. */
struct cut {
    const uint32_t *cpt;
    const uint16_t *flags;
    size_t ini, end, prev; /* prev: where the word being built starts */
    size_t *lens, n_lens;
};

static uint32_t cpt_at(const struct cut *c, size_t pos) { return pos >= c->ini && pos < c->end ? c->cpt[pos] : OUT_OF_RANGE; }
/* 0 outside the piece: every code point inside has a category bit */
static unsigned flags_at(const struct cut *c, size_t pos) { return pos >= c->ini && pos < c->end ? c->flags[pos] : 0; }

/* Ends a word at `end`; returns its length (0: nothing was added). */
static size_t word(struct cut *c, size_t end)
{
    size_t len = end - c->prev;
    if (len)
        c->lens[c->n_lens++] = len;
    c->prev = end;
    return len;
}

/* 's 't 're 've 'm 'll 'd at pos (any case when fold): the word's length, or 0. Only ASCII
 * capitals lower to these letters in Unicode's simple case mapping. */
static size_t contraction(const struct cut *c, size_t pos, int fold)
{
    if (cpt_at(c, pos) != '\'' || pos + 1 >= c->end)
        return 0;
    uint32_t a = cpt_at(c, pos + 1), b = pos + 2 < c->end ? cpt_at(c, pos + 2) : 0;
    if (fold) {
        a = a >= 'A' && a <= 'Z' ? a + 32 : a;
        b = b >= 'A' && b <= 'Z' ? b + 32 : b;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (pos + 2 < c->end && ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')))
        return 3;
    return 0;
}

/* The white-space tail shared by the splitters: \s*[\r\n]+ (with_newlines), \s+(?!\S), \s+,
 * else one code point alone. */
static void space_or_single(struct cut *c, size_t *pos, int with_newlines)
{
    size_t n = 0, last_newline = 0;
    while (flags_at(c, *pos + n) & QD_UF_SPACE) {
        uint32_t ch = cpt_at(c, *pos + n);
        if (ch == '\r' || ch == '\n')
            last_newline = *pos + n + 1;
        n++;
    }
    if (with_newlines && last_newline > 0)
        *pos = last_newline;
    else if (n > 1 && cpt_at(c, *pos + n) != OUT_OF_RANGE)
        *pos += n - 1;
    else if (n > 0)
        *pos += n;
    else
        ++*pos;
    word(c, *pos);
}

/* GPT-2's 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static void cut_gpt2(struct cut *c)
{
    for (size_t pos = c->ini; pos < c->end;) {
        uint32_t ch = cpt_at(c, pos);
        size_t k = contraction(c, pos, 0);
        if (k) {
            pos += word(c, pos + k);
            continue;
        }
        unsigned f2 = ch == ' ' ? flags_at(c, pos + 1) : flags_at(c, pos);
        unsigned runs[2] = {QD_UF_LETTER, QD_UF_NUMBER};
        int done = 0;
        for (int r = 0; r < 2 && !done; r++)
            if (f2 & runs[r]) {
                pos += ch == ' ';
                while (f2 & runs[r])
                    f2 = flags_at(c, ++pos);
                word(c, pos);
                done = 1;
            }
        if (done)
            continue;
        const unsigned wln = QD_UF_SPACE | QD_UF_LETTER | QD_UF_NUMBER;
        if (!(f2 & wln) && f2) {
            pos += ch == ' ';
            while (!(f2 & wln) && f2)
                f2 = flags_at(c, ++pos);
            word(c, pos);
            continue;
        }
        space_or_single(c, &pos, 0);
    }
}

/* Llama 3's (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+, and Qwen 2's (\p{N} one digit at a time) and Qwen 3.5's (marks go
 * with letters). */
static void cut_llama3(struct cut *c, int digits, int marks)
{
    const unsigned letter = QD_UF_LETTER | (marks ? QD_UF_MARK : 0);
    const unsigned punct_not = QD_UF_SPACE | QD_UF_LETTER | QD_UF_NUMBER | (marks ? QD_UF_MARK : 0);
    for (size_t pos = c->ini; pos < c->end;) {
        uint32_t ch = cpt_at(c, pos);
        unsigned f = flags_at(c, pos);
        size_t k = contraction(c, pos, 1);
        if (k) {
            pos += word(c, pos + k);
            continue;
        }
        if (!(ch == '\r' || ch == '\n' || (f & QD_UF_NUMBER)) && ((f & letter) || (flags_at(c, pos + 1) & letter))) {
            pos++;
            while (flags_at(c, pos) & letter)
                pos++;
            word(c, pos);
            continue;
        }
        if (f & QD_UF_NUMBER) {
            size_t start = pos;
            while (flags_at(c, pos) & QD_UF_NUMBER)
                if (++pos - start >= (size_t)digits) {
                    word(c, pos);
                    start = pos;
                }
            word(c, pos);
            continue;
        }
        unsigned f2 = ch == ' ' ? flags_at(c, pos + 1) : f;
        if (!(f2 & punct_not) && f) {
            pos += ch == ' ';
            while (!(f2 & punct_not) && f2)
                f2 = flags_at(c, ++pos);
            for (uint32_t c2 = cpt_at(c, pos); c2 == '\r' || c2 == '\n';)
                c2 = cpt_at(c, ++pos);
            word(c, pos);
            continue;
        }
        space_or_single(c, &pos, 1);
    }
}

/* [^\n]+|[\n]+ */
static void cut_newlines(struct cut *c)
{
    for (size_t pos = c->ini; pos < c->end;) {
        int nl = c->cpt[pos] == '\n';
        while (pos < c->end && (c->cpt[pos] == '\n') == nl)
            pos++;
        word(c, pos);
    }
}

size_t qd_pretok_split(const struct qd_pretok_run *run, const uint32_t *cpts, size_t n, size_t *lens)
{
    size_t *tmp = malloc((n + 1) * sizeof *tmp);
    uint16_t *flags = malloc((n + 1) * sizeof *flags);
    uint32_t *alt = malloc((n + 1) * sizeof *alt);
    if (!tmp || !flags || !alt) {
        free(tmp), free(flags), free(alt);
        return (size_t)-1;
    }
    for (size_t i = 0; i < n; i++)
        flags[i] = (uint16_t)qd_unicode_flags(cpts[i]);
    size_t count = n ? 1 : 0;
    lens[0] = n;
    int have_alt = -1; /* what alt holds: -1 nothing, 0 white-space-folded text, 1 collapsed text */
    for (int s = 0; s < QD_MAX_SPLITS && run->row->split[s].kind != QD_SPLIT_END; s++) {
        enum qd_split_kind kind = run->row->split[s].kind;
        if (kind == QD_SPLIT_REGEX && have_alt != run->collapsed[s]) {
            have_alt = run->collapsed[s];
            for (size_t i = 0; i < n; i++) {
                uint32_t cp = cpts[i];
                if (cp < 0x80)
                    alt[i] = cp;
                else if (flags[i] & QD_UF_SPACE) /* std::regex's \s is ASCII only */
                    alt[i] = COLLAPSED_SPACE;
                else if (!have_alt)
                    alt[i] = cp;
                else {
                    alt[i] = COLLAPSED_OTHER;
                    for (size_t c = 0; c < 5; c++)
                        if (flags[i] & classes[c].flag)
                            alt[i] = classes[c].byte;
                }
            }
        }
        size_t m = 0, start = 0;
        for (size_t p = 0; p < count; start += lens[p++]) {
            struct cut c = {cpts, flags, start, start + lens[p], start, tmp + m, 0};
            switch (kind) {
            case QD_SPLIT_REGEX:
                c.n_lens = qd_regex_split(run->re[s], alt + start, lens[p], tmp + m);
                break;
            case QD_SPLIT_GPT2: cut_gpt2(&c); break;
            case QD_SPLIT_LLAMA3: cut_llama3(&c, 3, 0); break;
            case QD_SPLIT_QWEN2: cut_llama3(&c, 1, 0); break;
            case QD_SPLIT_QWEN35: cut_llama3(&c, 1, 1); break;
            case QD_SPLIT_NEWLINES: cut_newlines(&c); break;
            case QD_SPLIT_END: break;
            }
            m += c.n_lens;
        }
        memcpy(lens, tmp, m * sizeof *lens);
        count = m;
    }
    free(tmp), free(flags), free(alt);
    return count;
}
