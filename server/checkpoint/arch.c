/* The architecture table's lookups (arch.h); the table itself is arch_table.c, generated. */
#include <stdlib.h>
#include <string.h>

#include "checkpoint/arch.h"

const struct qd_arch *qd_arch_find(const char *model_type)
{
    for (const struct qd_arch *a = qd_arch_table; model_type && a->model_type; a++)
        if (!strcmp(a->model_type, model_type))
            return a;
    return NULL;
}

int qd_arch_match(const char *pattern, const char *name)
{
    for (; *pattern; pattern++) {
        if (*pattern == '*') {
            if (*name < '0' || *name > '9')
                return 0;
            while (*name >= '0' && *name <= '9')
                name++;
        } else if (*pattern != *name++)
            return 0;
    }
    return *name == 0;
}

int qd_arch_find_pattern(const char *const *patterns, const char *name)
{
    for (int i = 0; patterns && patterns[i]; i++)
        if (qd_arch_match(patterns[i], name))
            return i;
    return -1;
}

enum qd_arch_decision qd_arch_decide(const struct qd_arch_rules *r, const char *name)
{
    if (qd_arch_find_pattern(r->quantize, name) >= 0)
        return QD_ARCH_QUANTIZE;
    if (qd_arch_find_pattern(r->keep, name) >= 0)
        return QD_ARCH_KEEP;
    return QD_ARCH_UNLISTED;
}

int qd_arch_generic(const char *name, int ndim, const char *dtype)
{
    size_t n = strlen(name);
    if (ndim != 2 || n < 8 || strcmp(name + n - 7, ".weight") ||
        (strcmp(dtype, "F32") && strcmp(dtype, "F16") && strcmp(dtype, "BF16")))
        return 0;
    const char *end = name + n - 7, *last = end;
    while (last > name && last[-1] != '.')
        last--;
    size_t len = (size_t)(end - last);
    if ((len == 3 && (!strncmp(last, "wte", 3) || !strncmp(last, "wpe", 3))) ||
        (len == 7 && !strncmp(last, "lm_head", 7)))
        return 0;
    for (const char *c = last; c + 5 <= end; c++)
        if (!strncmp(c, "embed", 5))
            return 0;
    return 1;
}

long qd_arch_layer(const char *name)
{
    for (const char *c = name; *c; c++)
        if ((c == name || c[-1] == '.') && *c >= '0' && *c <= '9') {
            const char *d = c;
            while (*d >= '0' && *d <= '9')
                d++;
            if (*d == '.' || *d == 0)
                return strtol(c, NULL, 10);
        }
    return -1;
}
