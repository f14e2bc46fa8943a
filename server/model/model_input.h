/* What a pass of the model runs over (quantd perplexity, quantd imatrix, quantd convert
 * --calibrate): a text, tokenized with the model's own vocabulary as llama-perplexity and
 * llama-imatrix tokenize their -f file, or the token ids a client made itself (tokens_in.h). */
#ifndef QD_MODEL_INPUT_H
#define QD_MODEL_INPUT_H

#include <stddef.h>
#include <stdint.h>

/* The ids of text_path's text or of tokens_path's ids (exactly one of them non-NULL), malloc'd,
 * *n of them; NULL with err naming the problem. The text is read whole, one trailing newline
 * dropped (common's -f), and tokenized with the vocabulary of the GGUF at model_path, its BOS
 * added where the vocabulary asks for one and the texts of special tokens left as text
 * (common_tokenize(ctx, text, true)); a model without a vocabulary is refused, pointing at
 * --tokens. Token ids are checked against the vocabulary's size where the model has one (the
 * caller checks them against the model's output otherwise). */
int32_t *qd_model_input_tokens(const char *model_path, const char *text_path, const char *tokens_path, int64_t *n,
                               char *err, size_t errlen);

#endif
