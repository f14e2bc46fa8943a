/* An importance matrix being made (imatrix_sums.h): its entries, and earlier files added into it
 * (every count and length checked against what is left of the file before it is used). */
#include "checkpoint/imatrix_sums.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/gguf.h"

static struct qd_imatrix_stat *find(struct qd_imatrix_sums *s, const char *name, size_t name_len)
{
    for (int i = 0; i < s->n; i++)
        if (strlen(s->e[i].name) == name_len && !memcmp(s->e[i].name, name, name_len))
            return &s->e[i];
    return NULL;
}

static struct qd_imatrix_stat *entry_n(struct qd_imatrix_sums *s, const char *name, size_t name_len, int64_t n_vals,
                                       int64_t n_counts, char *err, size_t errlen)
{
    if (n_vals < 1 || n_counts < 1 || n_vals % n_counts || (uint64_t)n_vals > SIZE_MAX / sizeof(float)) {
        snprintf(err, errlen, "%.*s: %lld values do not split into %lld matrices", (int)name_len, name,
                 (long long)n_vals, (long long)n_counts);
        return NULL;
    }
    struct qd_imatrix_stat *e = find(s, name, name_len);
    if (e) {
        if (e->n_vals != n_vals) {
            snprintf(err, errlen, "%.*s: %lld values here, %lld before (an importance matrix of another model?)",
                     (int)name_len, name, (long long)n_vals, (long long)e->n_vals);
            return NULL;
        }
        if (e->n_counts == n_counts)
            return e;
        if (n_counts == 1) { /* a dense weight: one count, if the entry's agree */
            for (int64_t i = 1; i < e->n_counts; i++)
                if (e->counts[i] != e->counts[0]) {
                    snprintf(err, errlen, "%.*s: counts per expert before, a dense weight here", (int)name_len, name);
                    return NULL;
                }
            e->n_counts = 1;
            return e;
        }
        if (e->n_counts == 1) { /* one count (a .dat file) for every expert */
            int64_t *grown = realloc(e->counts, (size_t)n_counts * sizeof *grown);
            if (!grown) {
                snprintf(err, errlen, "no memory for the importance matrix");
                return NULL;
            }
            for (int64_t i = 1; i < n_counts; i++)
                grown[i] = grown[0];
            e->counts = grown;
            e->n_counts = n_counts;
            return e;
        }
        snprintf(err, errlen, "%.*s: %lld experts here, %lld before", (int)name_len, name, (long long)n_counts,
                 (long long)e->n_counts);
        return NULL;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        struct qd_imatrix_stat *grown = realloc(s->e, (size_t)cap * sizeof *grown);
        if (!grown) {
            snprintf(err, errlen, "no memory for the importance matrix");
            return NULL;
        }
        s->e = grown, s->cap = cap;
    }
    e = &s->e[s->n];
    e->name = strndup(name, name_len);
    e->sums = calloc((size_t)n_vals, sizeof *e->sums);
    e->counts = calloc((size_t)n_counts, sizeof *e->counts);
    e->n_vals = n_vals, e->n_counts = n_counts;
    if (!e->name || !e->sums || !e->counts) {
        free(e->name), free(e->sums), free(e->counts);
        snprintf(err, errlen, "no memory for the importance matrix (%lld values)", (long long)n_vals);
        return NULL;
    }
    s->n++;
    return e;
}

struct qd_imatrix_stat *qd_imatrix_sums_entry(struct qd_imatrix_sums *s, const char *name, int64_t n_vals,
                                              int64_t n_counts, char *err, size_t errlen)
{
    return entry_n(s, name, strlen(name), n_vals, n_counts, err, errlen);
}

static int add_dataset(struct qd_imatrix_sums *s, const char *name, size_t len)
{
    char **grown = realloc(s->datasets, (size_t)(s->n_datasets + 1) * sizeof *grown);
    if (!grown)
        return -1;
    s->datasets = grown;
    if (!(s->datasets[s->n_datasets] = strndup(name, len)))
        return -1;
    s->n_datasets++;
    return 0;
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

/* common_imatrix_load_legacy, then load_imatrix's legacy branch */
static int load_legacy(struct qd_imatrix_sums *s, const uint8_t *b, size_t len, char *err, size_t errlen)
{
    size_t at = 0;
#define NEED(n, what)                                                                                             \
    if ((n) > len - at) {                                                                                         \
        snprintf(err, errlen, "the file ends inside %s (it is neither a GGUF imatrix nor a complete .dat one)", what); \
        return -1;                                                                                                \
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
        const char *name = (const char *)b + at;
        at += (size_t)name_len;
        NEED(8, "an entry's call and value counts");
        const int32_t ncall = i32_at(b + at), nval = i32_at(b + at + 4);
        at += 8;
        if (nval < 1) {
            snprintf(err, errlen, "entry %d: %d values", i + 1, nval);
            return -1;
        }
        NEED((size_t)nval * 4, "an entry's values");
        /* the name ends at its first NUL, as std::string of its bytes does; an entry met before
         * keeps its number of counts */
        const size_t n = strnlen(name, (size_t)name_len);
        struct qd_imatrix_stat *old = find(s, name, n);
        struct qd_imatrix_stat *e = entry_n(s, name, n, nval, old ? old->n_counts : 1, err, errlen);
        if (!e)
            return -1;
        for (int32_t k = 0; k < nval; k++)
            e->sums[k] += f32_at(b + at + 4 * (size_t)k) * (float)s->chunk_size;
        for (int64_t k = 0; k < e->n_counts; k++)
            e->counts[k] += (int64_t)ncall * s->chunk_size;
        at += (size_t)nval * 4;
    }
    /* the chunk count and the dataset's name follow, when the file has them */
    if (len - at >= 8) {
        const int32_t n = i32_at(b + at + 4);
        at += 8;
        if (n > 0 && (size_t)n <= len - at && add_dataset(s, (const char *)b + at, strnlen((const char *)b + at, (size_t)n))) {
            snprintf(err, errlen, "no memory");
            return -1;
        }
    }
    return 0;
#undef NEED
}

static const struct qd_gguf_tensor *tensor_named(const struct qd_gguf *g, const char *stem, size_t n, const char *suffix)
{
    for (int64_t k = 0; k < g->n_tensors; k++)
        if (!strncmp(g->tensors[k].name, stem, n) && !strcmp(g->tensors[k].name + n, suffix))
            return &g->tensors[k];
    return NULL;
}

static int has_suffix(const char *s, const char *suffix, size_t *stem)
{
    size_t n = strlen(s), k = strlen(suffix);
    *stem = n - k;
    return n > k && !strcmp(s + n - k, suffix);
}

/* common_imatrix_load (GGUF), then load_imatrix's GGUF branch: raw sums and counts added */
static int load_gguf(struct qd_imatrix_sums *s, const uint8_t *b, size_t len, char *err, size_t errlen)
{
    struct qd_gguf g;
    char why[512];
    if (qd_gguf_parse(b, len, &g, NULL, why, sizeof why)) {
        snprintf(err, errlen, "a GGUF imatrix that does not read: %s", why);
        return -1;
    }
    int rc = -1;
    if (g.n_tensors < 1) {
        snprintf(err, errlen, "no entries (a GGUF imatrix without tensors)");
        goto done;
    }
    for (int64_t i = 0; i < g.n_tensors; i++) {
        const struct qd_gguf_tensor *t = &g.tensors[i];
        size_t stem;
        if (has_suffix(t->name, ".counts", &stem) && !tensor_named(&g, t->name, stem, ".in_sum2")) {
            snprintf(err, errlen, "mismatched sums and counts for %.*s (no .in_sum2)", (int)stem, t->name);
            goto done;
        }
        if (!has_suffix(t->name, ".in_sum2", &stem))
            continue;
        const struct qd_gguf_tensor *counts = tensor_named(&g, t->name, stem, ".counts");
        if (!counts) {
            snprintf(err, errlen, "mismatched sums and counts for %.*s (no .counts)", (int)stem, t->name);
            goto done;
        }
        if (t->type != QD_GGML_F32 || counts->type != QD_GGML_F32) {
            snprintf(err, errlen, "sums and counts for %.*s must be F32", (int)stem, t->name);
            goto done;
        }
        const int64_t nval = (int64_t)(t->bytes / 4), ncounts = (int64_t)(counts->bytes / 4);
        struct qd_imatrix_stat *e = entry_n(s, t->name, stem, nval, ncounts, err, errlen);
        if (!e)
            goto done;
        for (int64_t k = 0; k < nval; k++)
            e->sums[k] += f32_at(t->data + 4 * k);
        for (int64_t k = 0; k < ncounts; k++) {
            const float c = f32_at(counts->data + 4 * k);
            if (!(c >= 0.0f && c < 1e15f)) { /* tokens: far more than any text has */
                snprintf(err, errlen, "%.*s: a count of %g", (int)stem, t->name, c);
                goto done;
            }
            e->counts[k] += lroundf(c);
        }
    }
    const struct qd_gguf_kv *datasets = qd_gguf_find(&g, "imatrix.datasets");
    if (datasets && datasets->type == QD_GGUF_ARRAY && i32_at(datasets->value) == QD_GGUF_STRING) {
        uint64_t n, slen;
        const uint8_t *p = datasets->value + 12; /* (the parser checked the array's strings) */
        memcpy(&n, datasets->value + 4, 8);
        for (uint64_t k = 0; k < n; k++) {
            memcpy(&slen, p, 8);
            if (add_dataset(s, (const char *)p + 8, (size_t)slen)) {
                snprintf(err, errlen, "no memory");
                goto done;
            }
            p += 8 + slen;
        }
    }
    rc = 0;
done:
    qd_gguf_free(&g);
    return rc;
}

int qd_imatrix_sums_load(struct qd_imatrix_sums *s, const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    return len >= 4 && !memcmp(buf, "GGUF", 4) ? load_gguf(s, buf, len, err, errlen) : load_legacy(s, buf, len, err, errlen);
}

int32_t qd_imatrix_sums_chunks(const struct qd_imatrix_sums *s)
{
    int64_t most = 0;
    for (int i = 0; i < s->n; i++)
        for (int64_t k = 0; k < s->e[i].n_counts; k++)
            most = s->e[i].counts[k] > most ? s->e[i].counts[k] : most;
    return s->chunk_size > 0 ? (int32_t)(most / s->chunk_size) : 0;
}

void qd_imatrix_sums_free(struct qd_imatrix_sums *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->e[i].name);
        free(s->e[i].sums);
        free(s->e[i].counts);
    }
    for (int i = 0; i < s->n_datasets; i++)
        free(s->datasets[i]);
    free(s->datasets);
    free(s->e);
    memset(s, 0, sizeof *s);
}
