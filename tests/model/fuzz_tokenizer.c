/* libFuzzer over the tokenizer's inputs (server/model/tokenizer*.c) and the token-id readers
 * (server/model/tokens_in.c): any bytes are ids inside the vocabulary or a sentence, never a
 * crash, a leak or a read outside the buffer (ASan + UBSan). make fuzz.
 *
 * The first byte picks what the rest is: text for one of five vocabularies (SentencePiece; Llama
 * 3's BPE, split by hand-written code; DeepSeek's and the default BPE pre-tokenizers, split by
 * regular expressions over code points and over collapsed text; Gemma 4's SentencePiece-style
 * BPE), with or without BOS and special tokens; raw int32 or JSON token ids; or a regular
 * expression and a text to split (short: a backtracking matcher may take exponential time on
 * nested quantifiers, which no pre-tokenizer has). The vocabularies come from QD_VOCAB_DIR
 * (default build/vocab; make build/vocab/ok). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"
#include "model/tokenizer_regex.h"
#include "model/tokenizer_unicode.h"
#include "model/tokens_in.h"

static const char *const names[] = {"llama-spm", "llama-bpe", "deepseek-llm", "aquila", "gemma-4"};
#define N_VOCABS (sizeof names / sizeof names[0])
static struct qd_vocab *vocabs[N_VOCABS];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *dir = getenv("QD_VOCAB_DIR");
    for (size_t i = 0; i < N_VOCABS; i++) {
        char path[1024], err[1024];
        snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", dir && *dir ? dir : "build/vocab", names[i]);
        if (qd_vocab_open(path, &vocabs[i], err, sizeof err) != QD_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s (make build/vocab/ok)\n", err);
            abort();
        }
    }
    return 0;
}

static void tokenize(const uint8_t *data, size_t size, unsigned mode)
{
    const struct qd_vocab *v = vocabs[(mode >> 2) % N_VOCABS];
    int32_t *ids = NULL;
    size_t n = 0;
    char err[512] = "";
    enum qd_status s = qd_tokenize(v, (const char *)data, size, mode & 1, (mode >> 1) & 1, &ids, &n, err, sizeof err);
    if (s == QD_OK) {
        for (size_t i = 0; i < n; i++) {
            size_t len;
            if (ids[i] < 0 || ids[i] >= qd_vocab_size(v) || !qd_token_piece(v, ids[i], 1, &len))
                __builtin_trap();
        }
    } else if (!err[0] || ids) {
        __builtin_trap();
    }
    free(ids);
}

static void token_ids(const uint8_t *data, size_t size, enum qd_tokens_format fmt)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char err[512] = "";
    if (qd_tokens_parse(data, size, fmt, 50000, &ids, &n, err, sizeof err) == QD_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= 50000)
                __builtin_trap();
    } else if (!err[0] || ids) {
        __builtin_trap();
    }
    free(ids);
}

/* pattern, a NUL byte, then the text (both as UTF-8) */
static void regex(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t pn = nul ? (size_t)(nul - data) : size, tn = nul ? size - pn - 1 : 0;
    uint32_t *p = malloc((pn + 1) * sizeof *p), *t = malloc((tn + 1) * sizeof *t);
    size_t *lens = malloc((tn + 1) * sizeof *lens);
    char err[160];
    struct qd_regex *re = qd_regex_compile(p, qd_utf8_decode(data, pn, p), err, sizeof err);
    if (re) {
        size_t n = qd_utf8_decode(nul ? nul + 1 : data, tn, t), total = 0;
        size_t k = qd_regex_split(re, t, n, lens);
        for (size_t i = 0; i < k; i++)
            total += lens[i];
        if (total != n)
            __builtin_trap(); /* the pieces cover the text exactly */
        qd_regex_free(re);
    }
    free(p), free(t), free(lens);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned mode = data[0];
    data++, size--;
    switch (mode >> 6) {
    case 0: case 1: tokenize(data, size, mode); break;
    case 2: token_ids(data, size, mode & 1 ? QD_TOKENS_JSON : QD_TOKENS_INT32); break;
    default: if (size <= 48) regex(data, size); break;
    }
    return 0;
}
