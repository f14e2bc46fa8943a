/* Text to token ids as llama.cpp's llama_tokenize does it for a GGUF file's vocabulary
 * (src/llama-vocab.cpp of the llama-cpp-python 0.3.36 sdist): SentencePiece-style vocabularies
 * ("llama": Llama 2, Mistral, Mixtral, Gemma 2/3, Phi-3) and byte-level BPE ones ("gpt2" with
 * the pre-tokenizer named by tokenizer.ggml.pre: Llama 3, Qwen 2/3, DeepSeek, SmolLM, ...; and
 * "gemma4"). The ids equal llama-tokenize's for the same text and flags; the few corners where
 * llama.cpp's own result depends on its hash map's order are named in tokenizer_vocab.c. */
#ifndef QD_TOKENIZER_H
#define QD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/registry.h"
#include "checkpoint/gguf.h"

struct qd_vocab;

/* Builds the vocabulary of a parsed GGUF (tokenizer.ggml.* keys; a file without tensors, like
 * llama.cpp's ggml-vocab-*.gguf, is enough). The vocabulary copies what it needs: g may be
 * freed afterwards. QD_OK, or QD_EINVAL / QD_ENOMEM with a sentence in err. */
enum qd_status qd_vocab_load(const struct qd_gguf *g, struct qd_vocab **out, char *err, size_t errlen);
/* The same from a file path (mapped, parsed, then unmapped; QD_EIO when it cannot be read). */
enum qd_status qd_vocab_open(const char *path, struct qd_vocab **out, char *err, size_t errlen);
void qd_vocab_free(struct qd_vocab *v);

int32_t qd_vocab_size(const struct qd_vocab *v);
/* Whether the model wants a BOS token in front (llama_vocab_get_add_bos). */
int qd_vocab_add_bos(const struct qd_vocab *v);
/* "SPM" or "BPE", and the pre-tokenizer's name ("default" for SPM). */
const char *qd_vocab_type_name(const struct qd_vocab *v);
const char *qd_vocab_pre_name(const struct qd_vocab *v);

/* Tokenizes text[0, len) like llama_tokenize(vocab, text, len, ..., add_special, parse_special)
 * (the vocabulary is only read: threads may tokenize with one vocabulary at once):
 * add_special adds the BOS (and EOS) tokens the vocabulary asks for; parse_special turns the
 * texts of control tokens into those tokens (user-defined tokens always are). *ids is
 * malloc'd (the caller frees it; NULL when *n is 0), *n its length. QD_OK, or QD_EINVAL / QD_ENOMEM with err: text
 * that decodes past U+10FFFF into a BPE vocabulary (llama.cpp stops with an exception there),
 * or a byte that an SPM vocabulary has no token for. */
enum qd_status qd_tokenize(const struct qd_vocab *v, const char *text, size_t len, int add_special,
                           int parse_special, int32_t **ids, size_t *n, char *err, size_t errlen);

/* A token's text as llama_token_to_piece(vocab, id, buf, n, 0, special) writes it: *len bytes
 * (they may hold NUL bytes), owned by the vocabulary. Control and unknown tokens are empty unless
 * special. NULL for an id outside the vocabulary. */
const char *qd_token_piece(const struct qd_vocab *v, int32_t id, int special, size_t *len);

#endif
