/* Importance matrices (imatrix.h): both formats, every count and length checked against what
 * is left of the file before it is used. */
#include "checkpoint/imatrix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/gguf.h"

/* Adds (or, for a name met again, replaces: llama.cpp keeps them in a map) an entry of n
 * values; its values are left for the caller. NULL on no memory. */
static struct qd_imatrix_entry *entry_for(struct qd_imatrix *m, const char *name, size_t name_len, int64_t n)
{
    struct qd_imatrix_entry *e = NULL;
    for (int i = 0; i < m->n && !e; i++)
        if (strlen(m->e[i].name) == name_len && !memcmp(m->e[i].name, name, name_len))
            e = &m->e[i];
    if (!e) {
        struct qd_imatrix_entry *grown = realloc(m->e, sizeof *m->e * (size_t)(m->n + 1));
        if (!grown)
            return NULL;
        m->e = grown;
        e = &m->e[m->n];
        if (!(e->name = strndup(name, name_len)))
            return NULL;
        e->values = NULL;
        m->n++;
    }
    free(e->values);
    e->values = calloc((size_t)(n ? n : 1), sizeof *e->values);
    e->n = n;
    return e->values ? e : NULL;
}

static int32_t i32_at(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static float f32_at(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

float qd_imatrix_dat_value(const struct qd_imatrix_dat_entry *e, int32_t k) { return f32_at(e->values + 4 * (size_t)k); }

int qd_imatrix_dat_walk(const uint8_t *b, size_t len,
                        int (*entry)(void *ctx, const struct qd_imatrix_dat_entry *e, char *err, size_t errlen),
                        void *ctx, int32_t *chunk_count, const char **dataset, size_t *dataset_len, char *err,
                        size_t errlen)
{
    size_t at = 0;
    *chunk_count = 0, *dataset = NULL, *dataset_len = 0;
#define NEED(n, what)                                                                                         \
    if ((n) > len - at) {                                                                                     \
        snprintf(err, errlen, "the file ends inside %s (it is neither a GGUF imatrix nor a complete .dat one)", \
                 what);                                                                                       \
        return -1;                                                                                            \
    }
    NEED(4, "the entry count");
    const int32_t n_entries = i32_at(b);
    at = 4;
    if (n_entries < 1) {
        snprintf(err, errlen, "no entries (the .dat header says %d)", n_entries);
        return -1;
    }
    for (int32_t i = 0; i < n_entries; i++) {
        NEED(4, "an entry's name length");
        const int32_t name_len = i32_at(b + at);
        at += 4;
        if (name_len < 0) {
            snprintf(err, errlen, "entry %d: a name length of %d", i + 1, name_len);
            return -1;
        }
        NEED((size_t)name_len, "an entry's name");
        struct qd_imatrix_dat_entry e = {.name = (const char *)b + at, .name_len = strnlen((const char *)b + at,
                                                                                             (size_t)name_len)};
        at += (size_t)name_len;
        NEED(8, "an entry's call and value counts");
        e.ncall = i32_at(b + at), e.nval = i32_at(b + at + 4);
        at += 8;
        if (e.nval < 1) {
            snprintf(err, errlen, "entry %d: %d values", i + 1, e.nval);
            return -1;
        }
        NEED((size_t)e.nval * 4, "an entry's values");
        e.values = b + at;
        at += (size_t)e.nval * 4;
        if (entry(ctx, &e, err, errlen))
            return -1;
    }
    /* the chunk count and the dataset's name follow, when the file has them */
    if (len - at >= 4) {
        *chunk_count = i32_at(b + at);
        at += 4;
        if (len - at >= 4) {
            const int32_t n = i32_at(b + at);
            at += 4;
            if (n > 0 && (size_t)n <= len - at) {
                *dataset = (const char *)b + at;
                *dataset_len = strnlen(*dataset, (size_t)n);
            }
        }
    }
    return 0;
#undef NEED
}

/* load_legacy's entry: the values divided by ncall when it is positive (sums hold
 * (raw / count) * ncall) */
static int legacy_entry(void *ctx, const struct qd_imatrix_dat_entry *d, char *err, size_t errlen)
{
    struct qd_imatrix *m = ctx;
    struct qd_imatrix_entry *e = entry_for(m, d->name, d->name_len, d->nval);
    if (!e) {
        snprintf(err, errlen, "no memory for the importance matrix");
        return -1;
    }
    for (int32_t k = 0; k < d->nval; k++) {
        const float sum = qd_imatrix_dat_value(d, k);
        e->values[k] = d->ncall > 0 ? sum / (float)(int64_t)d->ncall : sum;
    }
    return 0;
}

/* common_imatrix_load_legacy */
static int load_legacy(const uint8_t *b, size_t len, struct qd_imatrix *m, char *err, size_t errlen)
{
    const char *dataset;
    size_t dataset_len;
    m->legacy = 1;
    if (qd_imatrix_dat_walk(b, len, legacy_entry, m, &m->chunk_count, &dataset, &dataset_len, err, errlen))
        return -1;
    if (dataset && !(m->dataset = strndup(dataset, dataset_len))) {
        snprintf(err, errlen, "no memory");
        return -1;
    }
    return 0;
}

static int has_suffix(const char *s, const char *suffix, size_t *stem)
{
    size_t n = strlen(s), k = strlen(suffix);
    *stem = n - k;
    return n > k && !strcmp(s + n - k, suffix);
}

/* common_imatrix_load, GGUF: "<name>.in_sum2" over "<name>.counts", expert by expert */
static int load_gguf(const uint8_t *b, size_t len, struct qd_imatrix *m, char *err, size_t errlen)
{
    struct qd_gguf g;
    char why[512];
    if (qd_gguf_parse(b, len, &g, NULL, why, sizeof why)) {
        snprintf(err, errlen, "a GGUF imatrix that does not read: %s", why);
        return -1;
    }
    int rc = -1;
    const struct qd_gguf_kv *datasets = qd_gguf_find(&g, "imatrix.datasets");
    const struct qd_gguf_kv *chunk_count = qd_gguf_find(&g, "imatrix.chunk_count");
    if (g.n_tensors < 1) {
        snprintf(err, errlen, "no entries (a GGUF imatrix without tensors)");
        goto done;
    }
    if (!datasets || !chunk_count || !qd_gguf_find(&g, "imatrix.chunk_size")) {
        snprintf(err, errlen, "missing imatrix metadata (imatrix.datasets, imatrix.chunk_count and "
                 "imatrix.chunk_size, which llama-imatrix writes; llama-quantize refuses the file too)");
        goto done;
    }
    if (chunk_count->type == QD_GGUF_U32)
        m->chunk_count = i32_at(chunk_count->value);
    if (datasets->type == QD_GGUF_ARRAY && i32_at(datasets->value) == QD_GGUF_STRING) {
        uint64_t n, slen;
        memcpy(&n, datasets->value + 4, 8);
        if (n) {
            memcpy(&slen, datasets->value + 12, 8); /* (the parser checked the array's strings) */
            if (!(m->dataset = strndup((const char *)datasets->value + 20, (size_t)slen))) {
                snprintf(err, errlen, "no memory");
                goto done;
            }
        }
    }
    for (int64_t i = 0; i < g.n_tensors; i++) {
        const struct qd_gguf_tensor *sums = &g.tensors[i], *counts = NULL;
        size_t stem;
        if (!has_suffix(sums->name, ".in_sum2", &stem)) {
            if (has_suffix(sums->name, ".counts", &stem)) { /* its sums must be there too */
                int found = 0;
                for (int64_t k = 0; k < g.n_tensors && !found; k++)
                    found = !strncmp(g.tensors[k].name, sums->name, stem) && !strcmp(g.tensors[k].name + stem, ".in_sum2");
                if (!found) {
                    snprintf(err, errlen, "mismatched sums and counts for %.*s (no .in_sum2)", (int)stem, sums->name);
                    goto done;
                }
            }
            continue;
        }
        for (int64_t k = 0; k < g.n_tensors && !counts; k++)
            if (!strncmp(g.tensors[k].name, sums->name, stem) && !strcmp(g.tensors[k].name + stem, ".counts"))
                counts = &g.tensors[k];
        if (!counts) {
            snprintf(err, errlen, "mismatched sums and counts for %.*s (no .counts)", (int)stem, sums->name);
            goto done;
        }
        if (sums->type != QD_GGML_F32 || counts->type != QD_GGML_F32) {
            snprintf(err, errlen, "sums and counts for %.*s must be F32", (int)stem, sums->name);
            goto done;
        }
        const int64_t nval = (int64_t)(sums->bytes / 4), ncounts = (int64_t)(counts->bytes / 4);
        if (ncounts < 1 || nval < ncounts) {
            snprintf(err, errlen, "%.*s: %lld sums for %lld counts", (int)stem, sums->name, (long long)nval,
                     (long long)ncounts);
            goto done;
        }
        struct qd_imatrix_entry *e = entry_for(m, sums->name, stem, nval);
        if (!e) {
            snprintf(err, errlen, "no memory for the importance matrix");
            goto done;
        }
        /* quantize.cpp load_imatrix: each expert's sums over its count (1 where it is 0) */
        const int64_t ne0 = nval / ncounts;
        for (int64_t j = 0; j < ncounts; j++) {
            const float count = (float)lroundf(f32_at(counts->data + 4 * j));
            for (int64_t k = 0; k < ne0; k++)
                e->values[j * ne0 + k] = count > 0.0f ? f32_at(sums->data + 4 * (j * ne0 + k)) / count : 1.0f;
        }
    }
    rc = 0;
done:
    qd_gguf_free(&g);
    return rc;
}

int qd_imatrix_parse(const uint8_t *buf, size_t len, struct qd_imatrix *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int rc = len >= 4 && !memcmp(buf, "GGUF", 4) ? load_gguf(buf, len, m, err, errlen)
                                                  : load_legacy(buf, len, m, err, errlen);
    for (int i = 0; !rc && i < m->n; i++)
        for (int64_t k = 0; k < m->e[i].n; k++)
            if (!isfinite(m->e[i].values[k])) {
                snprintf(err, errlen, "entry %.64s holds a value that is not finite (%g at %lld): llama-quantize "
                         "refuses it too", m->e[i].name, m->e[i].values[k], (long long)k);
                rc = -1;
                break;
            }
    if (rc)
        qd_imatrix_free(m);
    return rc;
}

static int contains_any(const char *name, const char *const *list, int n)
{
    for (int i = 0; i < n; i++)
        if (strstr(name, list[i]))
            return 1;
    return 0;
}

void qd_imatrix_filter(struct qd_imatrix *m, const char *const *include, int n_include, const char *const *exclude,
                       int n_exclude)
{
    int k = 0;
    for (int i = 0; i < m->n; i++) {
        if (contains_any(m->e[i].name, exclude, n_exclude) || (n_include && !contains_any(m->e[i].name, include, n_include))) {
            free(m->e[i].name);
            free(m->e[i].values);
            continue;
        }
        m->e[k++] = m->e[i];
    }
    m->n = k;
}

const struct qd_imatrix_entry *qd_imatrix_find(const struct qd_imatrix *m, const char *name)
{
    for (int i = 0; m && i < m->n; i++)
        if (!strcmp(m->e[i].name, name))
            return &m->e[i];
    return NULL;
}

void qd_imatrix_free(struct qd_imatrix *m)
{
    for (int i = 0; i < m->n; i++) {
        free(m->e[i].name);
        free(m->e[i].values);
    }
    free(m->e);
    free(m->dataset);
    memset(m, 0, sizeof *m);
}
