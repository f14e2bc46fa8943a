/* Standard base64 (base64.c). */
#ifndef QD_BASE64_H
#define QD_BASE64_H

#include <stddef.h>

/* Standard base64 with padding. decode returns a malloc'd buffer, NULL on bad input (bad
 * character, bad length or padding) or no memory (*oom set). encode writes 4*ceil(n/3) chars. */
unsigned char *qd_base64_decode(const char *s, size_t n, size_t *out_len, int *oom);
size_t qd_base64_encoded_len(size_t n);
void qd_base64_encode(const unsigned char *in, size_t n, char *out);

#endif
