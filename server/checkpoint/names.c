/* Duplicate names (names.h). */
#include "checkpoint/names.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local unsigned long long compared;

static int cmp_name(const void *a, const void *b)
{
    compared++;
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void qd_names_duplicate(const char **names, size_t n, const char **dup)
{
    *dup = NULL;
    if (n < 2)
        return;
    qsort(names, n, sizeof *names, cmp_name);
    for (size_t i = 1; i < n && !*dup; i++) {
        compared++;
        if (!strcmp(names[i - 1], names[i]))
            *dup = names[i];
    }
}

unsigned long long qd_names_compared(void) { return compared; }
