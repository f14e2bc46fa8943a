/* The ECMAScript regular expressions llama.cpp's pre-tokenizers run through std::regex (libstdc++'s
 * backtracking executor): alternation tried left to right, greedy and lazy quantifiers ?, *, +,
 * {n}, {n,}, {n,m}, groups (...) and (?:...), lookahead (?=...) and (?!...), ^, $, \b, '.',
 * bracket classes with ranges, and \s \S \d \D \w \W as the "C" locale classifies them (ASCII
 * only). Patterns and text are arrays of code points (llama.cpp's std::wregex), or of bytes widened
 * to code points (its std::regex over "collapsed" text). */
#ifndef QD_TOKENIZER_REGEX_H
#define QD_TOKENIZER_REGEX_H

#include <stddef.h>
#include <stdint.h>

struct qd_regex;

/* Compiles pattern[0, n); NULL with a message in err when the pattern is outside the subset
 * above (or no memory). */
struct qd_regex *qd_regex_compile(const uint32_t *pattern, size_t n, char *err, size_t errlen);
void qd_regex_free(struct qd_regex *re);

/* Splits text[0, n) as llama.cpp's regex splitter does with std::regex_iterator: each match
 * becomes a piece, and so does each stretch of text between matches. lens[] receives the piece
 * lengths (at most n entries); returns their count. */
size_t qd_regex_split(const struct qd_regex *re, const uint32_t *text, size_t n, size_t *lens);

#endif
