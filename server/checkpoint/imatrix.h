/* llama.cpp importance matrices (llama-imatrix's output) as llama-quantize reads them
 * (common/imatrix-loader.cpp and tools/quantize/quantize.cpp load_imatrix, as vendored in
 * llama-cpp-python 0.3.36): per tensor name, one importance value per column (per expert and
 * column for a 3-D MoE tensor), the quant_weights ggml's quantizers take. Two file formats:
 * - GGUF (llama-imatrix's default): tensors "<name>.in_sum2" and "<name>.counts" (F32), keys
 *   imatrix.datasets (array of strings), imatrix.chunk_count, imatrix.chunk_size; each value is
 *   in_sum2 / counts of its expert (1 where the count is 0);
 * - legacy .dat: i32 entry count; per entry i32 name length, the name, i32 ncall, i32 value
 *   count, the f32 values (divided by ncall when it is positive); then optionally the i32 chunk
 *   count and an i32-length dataset name. A file that is not a GGUF is read as one. */
#ifndef QD_IMATRIX_H
#define QD_IMATRIX_H

#include <stddef.h>
#include <stdint.h>

struct qd_imatrix_entry {
    char *name;
    float *values;
    int64_t n;
};

struct qd_imatrix {
    struct qd_imatrix_entry *e;
    int n;
    int legacy;        /* read as the .dat format */
    int chunk_count;   /* imatrix.chunk_count, or the .dat's trailing chunk count (0: none) */
    char *dataset;     /* the first dataset name, or NULL */
};

/* Reads a whole file held in buf into m. 0, or -1 with a message naming the problem (and the
 * entry) in err; values that are not finite once normalized are refused as llama-quantize
 * refuses them. */
int qd_imatrix_parse(const uint8_t *buf, size_t len, struct qd_imatrix *m, char *err, size_t errlen);
/* quantize.cpp prepare_imatrix: drops the entries whose name contains any of exclude[], then
 * (include non-empty) keeps only those whose name contains one of include[]. */
void qd_imatrix_filter(struct qd_imatrix *m, const char *const *include, int n_include, const char *const *exclude,
                       int n_exclude);
/* The entry named name, or NULL. */
const struct qd_imatrix_entry *qd_imatrix_find(const struct qd_imatrix *m, const char *name);
void qd_imatrix_free(struct qd_imatrix *m);

/* ---- the legacy .dat file as it stands, for every reader of it (common_imatrix_load_legacy) */

/* One entry: its name (its bytes up to the first NUL, as std::string of them ends), the call
 * count and the nval f32 values (little-endian, unaligned: qd_imatrix_dat_value reads one). */
struct qd_imatrix_dat_entry {
    const char *name;
    size_t name_len;
    int32_t ncall, nval;
    const uint8_t *values;
};
float qd_imatrix_dat_value(const struct qd_imatrix_dat_entry *e, int32_t k);
/* Walks a .dat file held in b: entry() for each entry in order (a nonzero return stops the walk,
 * with its message in err), then the optional trailer: *chunk_count (0 without one) and the
 * dataset's name (*dataset NULL without one; *dataset_len bytes up to its first NUL). Every
 * count and length is checked against what is left first. 0, or -1 with err. */
int qd_imatrix_dat_walk(const uint8_t *b, size_t len,
                        int (*entry)(void *ctx, const struct qd_imatrix_dat_entry *e, char *err, size_t errlen),
                        void *ctx, int32_t *chunk_count, const char **dataset, size_t *dataset_len, char *err,
                        size_t errlen);

#endif
