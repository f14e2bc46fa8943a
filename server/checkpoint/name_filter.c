/* Name filters (convert.h): --skip / --only, POSIX extended regexes over tensor names, bounded
 * before they are compiled. glibc's regcomp writes a counted repetition out in full, a copy of
 * the repeated part per count, so nested counts multiply: ((((a{1,50}){1,50}){1,50}){1,50}) is
 * 6.25 million copies, 27 s and 8.9 GB to compile, and matching costs grow with the same size.
 * Before regcomp, the pattern's expanded size is counted the way regcomp builds it (an atom 1, a
 * group its contents + 1, x* and x? the size of x + 1, x+ twice x + 1, x{m,n} n copies and n
 * optional markers, x{m,} m + 1 copies) and refused beyond QD_NAME_FILTER_MAX_SIZE; at that
 * size a pattern compiles in under a millisecond and 2 MB, and matches a 4 KiB name in well
 * under 0.1 s (measured with glibc 2.36). Back-references are refused: matching them is
 * exponential, and a name filter has no use for them. */
#include "checkpoint/convert.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct qd_name_filter {
    int has_skip, has_only;
    regex_t skip, only;
};

/* The walk over a pattern: sizes saturate at the bound (so that no count overflows). */
struct cost {
    const char *p;
    int depth, backref;
};

static long sat(long v) { return v > QD_NAME_FILTER_MAX_SIZE + 1 ? QD_NAME_FILTER_MAX_SIZE + 1 : v; }

static long cost_alternation(struct cost *c);

/* A bracket expression from its '[' to past its ']' (a ']' first is a member; [:class:], [.x.]
 * and [=x=] hold brackets of their own). */
static void skip_bracket(struct cost *c)
{
    const char *p = c->p + 1;
    if (*p == '^')
        p++;
    if (*p == ']')
        p++;
    while (*p && *p != ']') {
        if (*p == '[' && (p[1] == ':' || p[1] == '.' || p[1] == '=')) {
            const char close[3] = {p[1], ']', 0}, *e = strstr(p + 2, close);
            p = e ? e + 2 : p + 1;
        } else
            p++;
    }
    c->p = *p ? p + 1 : p; /* (unterminated: regcomp refuses it) */
}

/* An interval {m}, {m,}, {m,n} or {,n} at c->p: sets m and n (-1: no upper bound) and steps past
 * it, or returns -1 leaving c->p (not an interval: regcomp decides). */
static int interval(struct cost *c, long *m, long *n)
{
    const char *p = c->p + 1;
    char *end;
    *m = 0;
    if (*p >= '0' && *p <= '9') {
        *m = strtol(p, &end, 10);
        p = end;
    } else if (*p != ',')
        return -1;
    *n = *m;
    if (*p == ',') {
        p++;
        *n = -1;
        if (*p >= '0' && *p <= '9') {
            *n = strtol(p, &end, 10);
            p = end;
        }
    }
    if (*p != '}')
        return -1;
    c->p = p + 1;
    *m = sat(*m), *n = *n < 0 ? -1 : sat(*n);
    return 0;
}

/* One atom and its repetition operators. */
static long cost_piece(struct cost *c)
{
    long size = 1;
    switch (*c->p) {
    case '(':
        c->p++;
        c->depth++;
        size = sat(cost_alternation(c) + 1);
        c->depth--;
        if (*c->p == ')')
            c->p++;
        break;
    case '[':
        skip_bracket(c);
        break;
    case '\\':
        if (c->p[1] >= '1' && c->p[1] <= '9')
            c->backref = 1;
        c->p += c->p[1] ? 2 : 1;
        break;
    default:
        c->p++;
    }
    for (;;) {
        long m, n;
        if (*c->p == '*' || *c->p == '?')
            size = sat(size + 1), c->p++;
        else if (*c->p == '+')
            size = sat(2 * size + 1), c->p++;
        else if (*c->p == '{' && !interval(c, &m, &n))
            size = n < 0 ? sat(sat((m + 1) * size) + 1) : n == 0 ? 1 : sat(sat(n * size) + n);
        else
            return size;
    }
}

static long cost_alternation(struct cost *c)
{
    long size = 0;
    for (;;) {
        while (*c->p && *c->p != '|' && !(*c->p == ')' && c->depth))
            size = sat(size + cost_piece(c));
        if (*c->p != '|')
            return size;
        c->p++;
        size = sat(size + 1);
    }
}

/* Compiles re into slot after the bounds; 0, or -1 with the reason in err, naming the option
 * (flag) and the pattern as its user wrote it (shown). */
static int filter_compile(regex_t *slot, const char *re, const char *flag, const char *shown, char *err,
                          size_t errlen)
{
    size_t len = strlen(re);
    if (len > QD_NAME_FILTER_MAX_BYTES) {
        snprintf(err, errlen, "%s: the pattern takes %zu bytes, over the limit of %d", flag, len,
                 QD_NAME_FILTER_MAX_BYTES);
        return -1;
    }
    struct cost c = {.p = re}; /* (at depth 0 a ')' is a plain character, as in glibc's EREs) */
    long size = cost_alternation(&c);
    if (c.backref) {
        snprintf(err, errlen, "%s '%.64s': back-references (\\1 ... \\9) are not taken in a name filter", flag,
                 shown);
        return -1;
    }
    if (size > QD_NAME_FILTER_MAX_SIZE) {
        snprintf(err, errlen, "%s '%.64s': its repetitions written out make it over %d atoms long (nested counts "
                 "multiply: (a{1,50}){1,50} counts 5,100); the limit is %d", flag, shown, QD_NAME_FILTER_MAX_SIZE,
                 QD_NAME_FILTER_MAX_SIZE);
        return -1;
    }
    int rc = regcomp(slot, re, REG_EXTENDED | REG_NOSUB);
    if (rc) {
        char msg[128];
        regerror(rc, slot, msg, sizeof msg);
        snprintf(err, errlen, "%s '%.64s': %s", flag, shown, msg);
        return -1;
    }
    return 0;
}

struct qd_name_filter *qd_name_filter_new(const char *skip, const char *only, char *err, size_t errlen)
{
    struct qd_name_filter *nf = calloc(1, sizeof *nf);
    if (!nf) {
        snprintf(err, errlen, "no memory");
        return NULL;
    }
    if (skip) {
        if (filter_compile(&nf->skip, skip, "--skip", skip, err, errlen)) {
            qd_name_filter_free(nf);
            return NULL;
        }
        nf->has_skip = 1;
    }
    if (only) {
        if (filter_compile(&nf->only, only, "--only", only, err, errlen)) {
            qd_name_filter_free(nf);
            return NULL;
        }
        nf->has_only = 1;
    }
    return nf;
}

struct qd_name_filter *qd_name_filter_pattern(const char *option, const char *shown, const char *re, char *err,
                                              size_t errlen)
{
    struct qd_name_filter *nf = calloc(1, sizeof *nf);
    if (!nf) {
        snprintf(err, errlen, "no memory");
        return NULL;
    }
    if (filter_compile(&nf->only, re, option, shown ? shown : re, err, errlen)) {
        free(nf);
        return NULL;
    }
    nf->has_only = 1;
    return nf;
}

int qd_name_filter_keeps(const struct qd_name_filter *nf, const char *name)
{
    if (nf->has_skip && !regexec(&nf->skip, name, 0, NULL, 0))
        return 0;
    return !nf->has_only || !regexec(&nf->only, name, 0, NULL, 0);
}

void qd_name_filter_free(struct qd_name_filter *nf)
{
    if (!nf)
        return;
    if (nf->has_skip)
        regfree(&nf->skip);
    if (nf->has_only)
        regfree(&nf->only);
    free(nf);
}
