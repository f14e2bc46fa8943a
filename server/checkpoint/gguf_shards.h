/* A GGUF model as llama.cpp's loader reads it (llama_model_loader): one file, or the shards
 * llama-gguf-split writes, given by the first (NAME-00001-of-0000N.gguf with split.count N > 1,
 * split.no 0): the first file's keys and every shard's tensors, shard after shard in each
 * file's order, as one model. The other shards are found by name beside the first
 * (llama_split_prefix / llama_split_path) and checked as the loader checks them. */
#ifndef QD_GGUF_SHARDS_H
#define QD_GGUF_SHARDS_H

#include "checkpoint/convert_files.h"
#include "checkpoint/gguf.h"

struct qd_gguf_model {
    struct qd_gguf g;       /* the model: files[0]'s keys (borrowed), every shard's tensors in
                               order, each with its shard in .file */
    int n_files;
    struct qd_gguf *files;  /* each shard, parsed */
    struct qd_mapped *maps; /* each shard, mapped (its tensors point into it) */
    char **paths;           /* each shard's path; paths[0] the one given */
};

/* Reads the model at path (its first shard). one_file: the input is one uploaded file, so a
 * shard of a split model is refused with what to do instead. 0, or -1 with *status
 * (QD_ENOTFOUND for a missing file, QD_EINVAL, QD_ECANCELED) and err naming the shard by its
 * file name (*status is left as it was on success). qd_gguf_model_close frees m either way. */
int qd_gguf_model_open(const char *path, int one_file, struct qd_gguf_model *m, const volatile int *cancel,
                       enum qd_status *status, char *err, size_t errlen);
void qd_gguf_model_close(struct qd_gguf_model *m);

#endif
