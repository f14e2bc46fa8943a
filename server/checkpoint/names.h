/* Duplicate names in a container's listing (GGUF keys and tensors, safetensors tensors): the
 * names sorted, then neighbours compared. O(n log n) comparisons whatever the names are (a file
 * may list a million of them, and its writer picks them: a hash table's worst case is not an
 * attacker's choice only when it is keyed, sorting has none). */
#ifndef QD_NAMES_H
#define QD_NAMES_H

#include <stddef.h>

/* Sorts names (the array of pointers, not the strings) and sets *dup to one that appears twice,
 * or NULL. */
void qd_names_duplicate(const char **names, size_t n, const char **dup);

/* Name comparisons made on this thread so far (tests bound the work of a parse with it). */
unsigned long long qd_names_compared(void);

#endif
