/* llama-imatrix's two files from an importance matrix being made (imatrix_sums.h): the GGUF
 * (save_imatrix) and the legacy .dat (save_imatrix_legacy), each written to a temporary beside
 * its path and renamed once complete. */
#include "checkpoint/imatrix_sums.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/gguf.h"

/* A growing byte buffer. */
struct bytes {
    uint8_t *p;
    size_t len, cap;
    int bad;
};

static void put(struct bytes *b, const void *src, size_t n)
{
    if (b->bad)
        return;
    if (b->len + n > b->cap) {
        size_t cap = (b->cap ? 2 * b->cap : 4096) + n;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->bad = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_i32(struct bytes *b, int32_t v) { put(b, &v, 4); }
static void put_u32(struct bytes *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct bytes *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct bytes *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const struct qd_imatrix_stat *const *)a)->name, (*(const struct qd_imatrix_stat *const *)b)->name);
}

/* The entries in name order (llama-imatrix sorts them: a deterministic file). */
static const struct qd_imatrix_stat **sorted(const struct qd_imatrix_sums *s)
{
    const struct qd_imatrix_stat **v = malloc((size_t)(s->n ? s->n : 1) * sizeof *v);
    if (!v)
        return NULL;
    for (int i = 0; i < s->n; i++)
        v[i] = &s->e[i];
    qsort(v, (size_t)s->n, sizeof *v, by_name);
    return v;
}

static int64_t most(const struct qd_imatrix_stat *e)
{
    int64_t m = 0;
    for (int64_t k = 0; k < e->n_counts; k++)
        m = e->counts[k] > m ? e->counts[k] : m;
    return m;
}

/* save_imatrix_legacy */
static void dat_bytes(const struct qd_imatrix_sums *s, const struct qd_imatrix_stat **v, const char *prompt,
                      struct bytes *b)
{
    int32_t n_entries = 0;
    for (int i = 0; i < s->n; i++)
        n_entries += most(v[i]) > 0; /* entries without data are left out */
    put_i32(b, n_entries);
    for (int i = 0; i < s->n; i++) {
        const struct qd_imatrix_stat *e = v[i];
        if (most(e) == 0)
            continue;
        put_i32(b, (int32_t)strlen(e->name));
        put(b, e->name, strlen(e->name));
        /* ceiling division: no entry gets 0 calls */
        const int32_t ncall = (int32_t)((most(e) + s->chunk_size - 1) / s->chunk_size);
        put_i32(b, ncall);
        put_i32(b, (int32_t)e->n_vals);
        const int64_t cols = e->n_vals / e->n_counts;
        for (int64_t k = 0; k < e->n_vals; k++) {
            float count = (float)e->counts[k / cols], value = e->sums[k];
            if (count == 0.0f) /* an expert without data: 1 */
                value = 1.0f, count = 1.0f;
            const float out = (value / count) * (float)ncall;
            put(b, &out, 4);
        }
    }
    put_i32(b, qd_imatrix_sums_chunks(s));
    if (!prompt || !*prompt)
        prompt = s->n_datasets ? s->datasets[s->n_datasets - 1] : "";
    put_i32(b, (int32_t)strlen(prompt));
    put(b, prompt, strlen(prompt));
}

/* save_imatrix: the key/values as gguf_set_val_* / gguf_set_arr_str write them, then the
 * tensor infos and data through the GGUF writer's layout (32-byte alignment). */
static int gguf_bytes(const struct qd_imatrix_sums *s, const struct qd_imatrix_stat **v, const char *prompt,
                      struct bytes *b, char *err, size_t errlen)
{
    struct bytes kv[4] = {{0}};
    put_str(&kv[0], "general.type");
    put_u32(&kv[0], QD_GGUF_STRING);
    put_str(&kv[0], "imatrix");
    const int with_prompt = prompt && *prompt;
    put_str(&kv[1], "imatrix.datasets");
    put_u32(&kv[1], QD_GGUF_ARRAY);
    put_u32(&kv[1], QD_GGUF_STRING);
    put_u64(&kv[1], (uint64_t)(s->n_datasets + with_prompt));
    for (int i = 0; i < s->n_datasets; i++)
        put_str(&kv[1], s->datasets[i]);
    if (with_prompt)
        put_str(&kv[1], prompt);
    put_str(&kv[2], "imatrix.chunk_count");
    put_u32(&kv[2], QD_GGUF_U32);
    put_u32(&kv[2], (uint32_t)qd_imatrix_sums_chunks(s));
    put_str(&kv[3], "imatrix.chunk_size");
    put_u32(&kv[3], QD_GGUF_U32);
    put_u32(&kv[3], (uint32_t)s->chunk_size);

    int rc = -1;
    struct qd_gguf_kv kvs[4];
    const struct qd_gguf_kv *kvp[4];
    struct qd_gguf_tensor *t = calloc((size_t)2 * (size_t)s->n, sizeof *t);
    uint8_t *meta = NULL;
    size_t meta_len = 0;
    for (int i = 0; i < 4; i++) {
        kvs[i] = (struct qd_gguf_kv){.entry = kv[i].p, .entry_bytes = kv[i].len};
        kvp[i] = &kvs[i];
        if (kv[i].bad)
            t = (free(t), NULL);
    }
    if (!t) {
        snprintf(err, errlen, "no memory");
        goto done;
    }
    for (int i = 0; i < s->n; i++) {
        const struct qd_imatrix_stat *e = v[i];
        struct qd_gguf_tensor *sums = &t[2 * i], *counts = &t[2 * i + 1];
        if ((size_t)snprintf(sums->name, sizeof sums->name, "%s.in_sum2", e->name) >= sizeof sums->name ||
            (size_t)snprintf(counts->name, sizeof counts->name, "%s.counts", e->name) >= sizeof counts->name) {
            snprintf(err, errlen, "weight %s: its name is too long for a GGUF tensor name with .in_sum2 (%d bytes at "
                     "most)", e->name, QD_GGUF_MAX_NAME - 1);
            goto done;
        }
        sums->ne[0] = e->n_vals / e->n_counts, sums->ne[1] = e->n_counts, sums->ne[2] = sums->ne[3] = 1;
        counts->ne[0] = 1, counts->ne[1] = e->n_counts, counts->ne[2] = counts->ne[3] = 1;
        sums->type = counts->type = QD_GGML_F32;
        sums->bytes = (uint64_t)e->n_vals * 4, counts->bytes = (uint64_t)e->n_counts * 4;
    }
    if (!(meta = qd_gguf_write_meta(kvp, 4, NULL, 0, t, 2 * s->n, QD_GGUF_DEFAULT_ALIGNMENT, &meta_len))) {
        snprintf(err, errlen, "no memory");
        goto done;
    }
    put(b, meta, meta_len);
    static const uint8_t zeros[QD_GGUF_DEFAULT_ALIGNMENT];
    for (int i = 0; i < s->n; i++) {
        const struct qd_imatrix_stat *e = v[i];
        put(b, e->sums, (size_t)e->n_vals * 4);
        put(b, zeros, (QD_GGUF_DEFAULT_ALIGNMENT - b->len % QD_GGUF_DEFAULT_ALIGNMENT) % QD_GGUF_DEFAULT_ALIGNMENT);
        for (int64_t k = 0; k < e->n_counts; k++) {
            const float c = (float)e->counts[k];
            put(b, &c, 4);
        }
        put(b, zeros, (QD_GGUF_DEFAULT_ALIGNMENT - b->len % QD_GGUF_DEFAULT_ALIGNMENT) % QD_GGUF_DEFAULT_ALIGNMENT);
    }
    rc = 0;
done:
    for (int i = 0; i < 4; i++)
        free(kv[i].p);
    free(meta);
    free(t);
    return rc;
}

int qd_imatrix_sums_write(const struct qd_imatrix_sums *s, const char *path, int legacy, const char *prompt, char *err,
                          size_t errlen)
{
    if (s->n < 1) {
        /* llama-imatrix leaves out the matmuls of fewer than 16 tokens */
        snprintf(err, errlen, "the importance matrix has no entries: no matmul took 16 or more tokens at once "
                 "(give -c 16 or more)");
        return -1;
    }
    if (s->chunk_size < 1) {
        snprintf(err, errlen, "a chunk size of %d", s->chunk_size);
        return -1;
    }
    const struct qd_imatrix_stat **v = sorted(s);
    struct bytes b = {0};
    int rc = -1;
    if (!v) {
        snprintf(err, errlen, "no memory");
        return -1;
    }
    if (legacy)
        dat_bytes(s, v, prompt, &b);
    else if (gguf_bytes(s, v, prompt, &b, err, errlen))
        goto done;
    if (b.bad) {
        snprintf(err, errlen, "no memory for the file (%zu bytes so far)", b.len);
        goto done;
    }
    /* a temporary in the same directory, renamed over path once whole */
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp) {
        snprintf(err, errlen, "no memory");
        goto done;
    }
    snprintf(tmp, n, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create a file beside it: %s", path, strerror(errno));
        free(tmp);
        goto done;
    }
    const mode_t mask = umask(0); /* mkstemp's 0600: the mode a plain fopen would give */
    umask(mask);
    fchmod(fd, 0666 & ~mask);
    FILE *f = fdopen(fd, "wb");
    int ok = f && fwrite(b.p, 1, b.len, f) == b.len;
    int saved = errno;
    if (f ? fclose(f) : close(fd))
        ok = 0, saved = saved ? saved : errno;
    if (!ok || rename(tmp, path)) {
        snprintf(err, errlen, "%s: %s", path, strerror(ok ? errno : saved));
        unlink(tmp);
    } else
        rc = 0;
    free(tmp);
done:
    free(b.p);
    free(v);
    return rc;
}
