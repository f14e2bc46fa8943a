/* Token ids that a client made itself (its own tokenizer), instead of text: for runs of the
 * model over exactly the ids it gives.
 *
 * Two forms:
 *   - raw: little-endian int32 ids back to back (numpy: ids.astype('<i4').tofile(path));
 *   - JSON: one array of integers, e.g. [1, 15043, 3186] (whitespace anywhere between tokens;
 *     no fractions, exponents, signs other than '-', or leading zeros).
 * Every id must lie in [0, n_vocab): the vocabulary of the model the ids are for. An input
 * with no id is refused too (nothing could be run over it). */
#ifndef QD_TOKENS_IN_H
#define QD_TOKENS_IN_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/registry.h"

enum qd_tokens_format { QD_TOKENS_INT32, QD_TOKENS_JSON };

/* Parses buf[0, len) in the given form. On QD_OK, *ids (malloc'd; the caller frees it) holds *n
 * ids. Otherwise QD_EINVAL with a sentence in err naming the problem and where (the id's index,
 * or the byte offset in the JSON), or QD_ENOMEM; *ids is NULL. */
enum qd_status qd_tokens_parse(const void *buf, size_t len, enum qd_tokens_format fmt, int32_t n_vocab,
                               int32_t **ids, size_t *n, char *err, size_t errlen);

/* The form of buf[0, len): JSON when its first and last bytes other than JSON white space are
 * '[' and ']', raw int32 otherwise. (Raw ids below 2^24 end in a 0 byte, so a raw file is never
 * taken for JSON; `llama-tokenize --ids` output is JSON.) */
enum qd_tokens_format qd_tokens_detect(const void *buf, size_t len);

/* Reads a whole file, in the form qd_tokens_detect finds, and parses it as qd_tokens_parse does;
 * QD_EIO when it cannot be read. err names the file. */
enum qd_status qd_tokens_load(const char *path, int32_t n_vocab, int32_t **ids, size_t *n, char *err, size_t errlen);

#endif
