/* A GGUF model in one file or in llama-gguf-split's shards (gguf_shards.h). What the loader
 * refuses is refused here too, each message naming the shard by its file name (never the
 * directory: a service's paths are its own) and what to do about it. */
#include "checkpoint/gguf_shards.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/names.h"

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* A u16 key of g: 1 and *v when present as a u16, 0 when absent, -1 when of another type. */
static int key_u16(const struct qd_gguf *g, const char *key, uint16_t *v)
{
    const struct qd_gguf_kv *kv = qd_gguf_find(g, key);
    if (!kv)
        return 0;
    if (kv->type != QD_GGUF_U16)
        return -1;
    memcpy(v, kv->value, 2);
    return 1;
}

/* Maps and parses shard i (m->paths[i]). */
static int read_shard(struct qd_gguf_model *m, int i, const volatile int *cancel, enum qd_status *status, char *err,
                      size_t errlen)
{
    char why[768];
    struct stat st;
    const char *name = base_name(m->paths[i]);
    if (i > 0 && stat(m->paths[i], &st) < 0 && errno == ENOENT) {
        snprintf(err, errlen, "split model: shard %s (%d of %d) is missing: llama.cpp reads a split model's shards "
                 "from beside its first (%s); put it there, or give the model as one file (llama-gguf-split --merge "
                 "%s merged.gguf)", name, i + 1, m->n_files, base_name(m->paths[0]), base_name(m->paths[0]));
        *status = QD_ENOTFOUND;
        return -1;
    }
    if (qd_map_file(m->paths[i], &m->maps[i], why, sizeof why)) {
        snprintf(err, errlen, "%s", why);
        *status = errno == ENOENT ? QD_ENOTFOUND : QD_EINVAL;
        return -1;
    }
    if (qd_gguf_parse(m->maps[i].data, m->maps[i].size, &m->files[i], cancel, why, sizeof why)) {
        if (i == 0)
            snprintf(err, errlen, "%s", why);
        else
            snprintf(err, errlen, "split model: shard %s: %s", name, why);
        *status = cancel && *cancel ? QD_ECANCELED : QD_EINVAL;
        return -1;
    }
    return 0;
}

/* The other shards' paths: the first's name less -00001-of-0000N.gguf, then each one's
 * (llama_split_prefix, llama_split_path). */
static int shard_paths(struct qd_gguf_model *m, char *err, size_t errlen)
{
    const char *first = m->paths[0], *name = base_name(first);
    char postfix[32];
    snprintf(postfix, sizeof postfix, "-%05d-of-%05d.gguf", 1, m->n_files);
    const size_t n = strlen(first), np = strlen(postfix);
    if (n <= np || strcmp(first + n - np, postfix)) {
        snprintf(err, errlen, "split model: %s is the first of %d shards (split.count %d) but is not named "
                 "NAME%s, the name llama.cpp finds the other shards by: rename the shards as llama-gguf-split "
                 "names them (NAME-0000K-of-%05d.gguf)", name, m->n_files, m->n_files, postfix, m->n_files);
        return -1;
    }
    for (int i = 1; i < m->n_files; i++) {
        size_t len = n + 1;
        if (!(m->paths[i] = malloc(len))) {
            snprintf(err, errlen, "no memory");
            return -1;
        }
        snprintf(m->paths[i], len, "%.*s-%05d-of-%05d.gguf", (int)(n - np), first, i + 1, m->n_files);
    }
    return 0;
}

/* The loader's checks of shard i against the first: its split.no, the same split.count; and of
 * the whole: split.tensors.count tensors, no name twice. */
static int check_shard(const struct qd_gguf_model *m, int i, char *err, size_t errlen)
{
    const char *name = base_name(m->paths[i]);
    uint16_t no = 0, count = 0;
    int has_no = key_u16(&m->files[i], "split.no", &no), has_count = key_u16(&m->files[i], "split.count", &count);
    if (has_no <= 0 || no != i || has_count < 0 || (has_count && count != m->n_files)) {
        char says[96];
        if (has_no <= 0)
            snprintf(says, sizeof says, "%s", has_no ? "its split.no is not a u16" : "it has no split.no");
        else if (no != i)
            snprintf(says, sizeof says, "its split.no says shard %d", no + 1);
        else
            snprintf(says, sizeof says, "its split.count is not %d", m->n_files);
        snprintf(err, errlen, "split model: shard %s does not belong with %s (%s): the shards come from different "
                 "splits; split the model again (llama-gguf-split --split) and keep its files together", name,
                 base_name(m->paths[0]), says);
        return -1;
    }
    return 0;
}

static int check_model(struct qd_gguf_model *m, char *err, size_t errlen)
{
    const struct qd_gguf_kv *kv = qd_gguf_find(&m->files[0], "split.tensors.count");
    int32_t expected = -1;
    if (kv && kv->type == QD_GGUF_I32)
        memcpy(&expected, kv->value, 4);
    if (!kv || kv->type != QD_GGUF_I32 || expected != m->g.n_tensors) {
        char says[64];
        if (kv && kv->type == QD_GGUF_I32)
            snprintf(says, sizeof says, "says split.tensors.count %d", expected);
        else
            snprintf(says, sizeof says, "has no i32 split.tensors.count");
        snprintf(err, errlen, "split model: %s %s, but its %d shards hold %" PRId64 " tensors: a shard is incomplete "
                 "or from another split; split the model again (llama-gguf-split --split)", base_name(m->paths[0]),
                 says, m->n_files, m->g.n_tensors);
        return -1;
    }
    const char **names = malloc((size_t)(m->g.n_tensors ? m->g.n_tensors : 1) * sizeof *names), *dup = NULL;
    if (!names) {
        snprintf(err, errlen, "no memory");
        return -1;
    }
    for (int64_t i = 0; i < m->g.n_tensors; i++)
        names[i] = m->g.tensors[i].name;
    qd_names_duplicate(names, (size_t)m->g.n_tensors, &dup);
    if (dup) { /* (within a shard the parser refused it already) */
        int first = -1, second = -1;
        for (int64_t i = 0; i < m->g.n_tensors; i++)
            if (!strcmp(m->g.tensors[i].name, dup))
                first < 0 ? (first = m->g.tensors[i].file) : (second = m->g.tensors[i].file);
        snprintf(err, errlen, "split model: tensor '%s' is in %s and in %s: the shards come from different splits",
                 dup, base_name(m->paths[first]), base_name(m->paths[second > 0 ? second : first]));
    }
    free(names);
    return dup ? -1 : 0;
}

/* The model, *status untouched on success (the caller's stands for failures after). */
static int model_open(const char *path, int one_file, struct qd_gguf_model *m, const volatile int *cancel,
                      enum qd_status *status, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    *status = QD_EINVAL;
    m->n_files = 1;
    m->files = calloc(1, sizeof *m->files);
    m->maps = calloc(1, sizeof *m->maps);
    m->paths = calloc(1, sizeof *m->paths);
    if (!m->files || !m->maps || !m->paths || !(m->paths[0] = strdup(path))) {
        snprintf(err, errlen, "no memory");
        *status = QD_ENOMEM;
        return -1;
    }
    if (read_shard(m, 0, cancel, status, err, errlen))
        return -1;
    uint16_t n = 0, no = 0;
    int has = key_u16(&m->files[0], "split.count", &n);
    if (has < 0) {
        snprintf(err, errlen, "%s: split.count is not a u16 (llama.cpp refuses it too)", base_name(path));
        return -1;
    }
    if (n > 1 && one_file) { /* (its name is a spool file's: not named) */
        key_u16(&m->files[0], "split.no", &no);
        snprintf(err, errlen, "the model is shard %d of a split model of %d files (split.count %d): a conversion "
                 "answered in one request takes one file; merge the shards first (llama-gguf-split --merge "
                 "NAME-00001-of-%05d.gguf merged.gguf), or give the first shard to a conversion job (its shards "
                 "beside it in --data-dir)", no + 1, n, n, n);
        return -1;
    }
    if (n > 1) { /* the loader's: the first shard given, the others found by name */
        if (key_u16(&m->files[0], "split.no", &no) <= 0 || no != 0) {
            char what[48];
            snprintf(what, sizeof what, no ? "shard %d" : "not a shard (no u16 split.no)", no + 1);
            snprintf(err, errlen, "split model: %s is %s of %d: give the first (NAME-00001-of-%05d.gguf), which "
                     "leads to the others", base_name(path), what, n, n);
            return -1;
        }
        struct qd_gguf *files = realloc(m->files, n * sizeof *files);
        struct qd_mapped *maps = files ? realloc(m->maps, n * sizeof *maps) : NULL;
        char **paths = maps ? realloc(m->paths, n * sizeof *paths) : NULL;
        if (files)
            m->files = files;
        if (maps)
            m->maps = maps;
        if (paths)
            m->paths = paths;
        if (!paths) {
            snprintf(err, errlen, "no memory");
            *status = QD_ENOMEM;
            return -1;
        }
        memset(m->files + 1, 0, (n - 1) * sizeof *files);
        memset(m->maps + 1, 0, (n - 1) * sizeof *maps);
        memset(m->paths + 1, 0, (n - 1) * sizeof *paths);
        m->n_files = n;
        if (shard_paths(m, err, errlen))
            return -1;
        for (int i = 1; i < n; i++)
            if (read_shard(m, i, cancel, status, err, errlen) || check_shard(m, i, err, errlen))
                return -1;
    }
    int64_t total = 0;
    for (int i = 0; i < m->n_files; i++)
        total += m->files[i].n_tensors;
    m->g = m->files[0];
    if (!(m->g.tensors = malloc((size_t)(total ? total : 1) * sizeof *m->g.tensors))) {
        snprintf(err, errlen, "no memory for %" PRId64 " tensors", total);
        *status = QD_ENOMEM;
        return -1;
    }
    m->g.n_tensors = 0;
    for (int i = 0; i < m->n_files; i++)
        for (int64_t t = 0; t < m->files[i].n_tensors; t++) {
            m->g.tensors[m->g.n_tensors] = m->files[i].tensors[t];
            m->g.tensors[m->g.n_tensors++].file = i;
        }
    if (m->n_files > 1 && check_model(m, err, errlen))
        return -1;
    return 0;
}

int qd_gguf_model_open(const char *path, int one_file, struct qd_gguf_model *m, const volatile int *cancel,
                       enum qd_status *status, char *err, size_t errlen)
{
    enum qd_status st;
    if (model_open(path, one_file, m, cancel, &st, err, errlen)) {
        *status = st;
        return -1;
    }
    return 0;
}

void qd_gguf_model_close(struct qd_gguf_model *m)
{
    if (m->files) /* (g borrows files[0]'s keys; its tensors are its own) */
        free(m->g.tensors);
    for (int i = 0; i < m->n_files; i++) {
        if (m->files)
            qd_gguf_free(&m->files[i]);
        if (m->maps)
            qd_unmap_file(&m->maps[i]);
        if (m->paths)
            free(m->paths[i]);
    }
    free(m->files);
    free(m->maps);
    free(m->paths);
    memset(m, 0, sizeof *m);
}
