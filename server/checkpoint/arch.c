/* The architecture table's lookups (arch.h); the table itself is arch_table.c, generated. */
#include <stdio.h>
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

/* A module matching an indexed pattern of the ignore list: its layer, the pattern's index and its
 * name (a tensor name without ".weight"), to sort by. */
struct ignored {
    long layer;
    int pattern;
    const char *name;
    size_t len;
};

static int cmp_ignored(const void *a, const void *b)
{
    const struct ignored *x = a, *y = b;
    return x->layer != y->layer ? (x->layer < y->layer ? -1 : 1) : x->pattern - y->pattern;
}

cJSON *qd_arch_ignore_list(const struct qd_arch_rules *r, const char *const *names, size_t n)
{
    static const char *const generic[] = {"lm_head", NULL};
    const char *const *pats = r && r->ignore ? r->ignore : generic;
    cJSON *list = cJSON_CreateArray();
    size_t found_n = 0, cap = 0;
    struct ignored *found = NULL;
    char module[512];
    for (size_t i = 0; list && i < n; i++) {
        size_t len = strlen(names[i]);
        if (len < 8 || len - 7 >= sizeof module || strcmp(names[i] + len - 7, ".weight"))
            continue;
        snprintf(module, sizeof module, "%.*s", (int)(len - 7), names[i]);
        for (int p = 0; pats[p]; p++) {
            if (!strchr(pats[p], '*') || !qd_arch_match(pats[p], module))
                continue;
            if (found_n == cap) {
                struct ignored *more = realloc(found, (cap = cap ? 2 * cap : 64) * sizeof *found);
                if (!more) {
                    free(found);
                    cJSON_Delete(list);
                    return NULL;
                }
                found = more;
            }
            found[found_n++] = (struct ignored){.layer = qd_arch_layer(module), .pattern = p, .name = names[i],
                                                .len = len - 7};
            break;
        }
    }
    if (found_n)
        qsort(found, found_n, sizeof *found, cmp_ignored);
    for (size_t i = 0; list && i < found_n; i++) {
        snprintf(module, sizeof module, "%.*s", (int)found[i].len, found[i].name);
        cJSON_AddItemToArray(list, cJSON_CreateString(module));
    }
    for (int p = 0; list && pats[p]; p++)
        if (!strchr(pats[p], '*'))
            cJSON_AddItemToArray(list, cJSON_CreateString(pats[p]));
    free(found);
    return list;
}
