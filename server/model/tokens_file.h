/* Token files: the ids a model pass reads when it is given no text (quantd perplexity and
 * quantd imatrix --tokens): a JSON array of integers, or raw little-endian int32 (what
 * llama-tokenize --ids prints, and its ids as bytes). */
#ifndef QD_MODEL_TOKENS_FILE_H
#define QD_MODEL_TOKENS_FILE_H

#include <stddef.h>
#include <stdint.h>

/* The ids of the file at path (malloc'd, *n of them), or NULL with err naming the problem: not
 * readable, neither format, an element that is not a non-negative integer. */
int32_t *qd_tokens_file_read(const char *path, int64_t *n, char *err, size_t errlen);

#endif
