/* An importance matrix being made (llama-imatrix's IMatrixCollector, tools/imatrix/imatrix.cpp in
 * the llama.cpp of llama-cpp-python 0.3.36): per weight, the sum of x^2 of every input column over
 * the tokens seen, and how many tokens were seen, per matrix. A 2-D weight is one matrix; a 3-D
 * expert weight (ffn_*_exps) is n_expert matrices, each with its own count (the tokens routed to
 * that expert). The raw form both of llama-imatrix's files are written from (imatrix_write.c)
 * and that earlier files are added into (--in-file); imatrix.h reads the normalized form
 * llama-quantize uses. */
#ifndef QD_IMATRIX_SUMS_H
#define QD_IMATRIX_SUMS_H

#include <stddef.h>
#include <stdint.h>

struct qd_imatrix_stat {
    char *name;
    int64_t n_vals;   /* n_counts x the input width */
    int64_t n_counts; /* 1 (a 2-D weight, or an old file's expert weight) or n_expert */
    float *sums;      /* [n_counts][n_vals / n_counts], summed in f32 as llama-imatrix sums */
    int64_t *counts;  /* [n_counts] tokens */
};

struct qd_imatrix_sums {
    struct qd_imatrix_stat *e;
    int n, cap;
    char **datasets;    /* the datasets of the files added in (imatrix.datasets), in order */
    int n_datasets;
    int32_t chunk_size; /* tokens per chunk (-c): a .dat file's calls are chunks of this size */
};

/* The entry of weight `name` holding n_vals values over n_counts matrices, added (zeroed) when
 * new. As llama-imatrix: a dense weight (n_counts 1) whose entry holds several equal counts (an
 * older file) takes one; an expert weight whose entry holds one count (a .dat file) takes it
 * for every expert. NULL with err when the sizes disagree or on no memory. */
struct qd_imatrix_stat *qd_imatrix_sums_entry(struct qd_imatrix_sums *s, const char *name, int64_t n_vals,
                                              int64_t n_counts, char *err, size_t errlen);
/* Adds a file of either format (llama-imatrix's load_imatrix: a GGUF's raw sums and counts as
 * they are; a .dat's normalized values times chunk_size, its calls times chunk_size as counts)
 * and its datasets. 0, or -1 with err naming the problem (the file's content is then partly
 * added: callers stop). */
int qd_imatrix_sums_load(struct qd_imatrix_sums *s, const uint8_t *buf, size_t len, char *err, size_t errlen);
/* llama-imatrix's chunk count: the largest count over chunk_size. */
int32_t qd_imatrix_sums_chunks(const struct qd_imatrix_sums *s);
void qd_imatrix_sums_free(struct qd_imatrix_sums *s);

/* Writes s to path, whole or not at all (a temporary beside it, renamed when complete):
 * legacy 0: llama-imatrix's GGUF (general.type imatrix, imatrix.datasets = the files' datasets
 * then `prompt`, imatrix.chunk_count, imatrix.chunk_size; per weight in name order
 * "<name>.in_sum2" [n_vals / n_counts][n_counts] and "<name>.counts" [1][n_counts], F32);
 * legacy 1: the .dat format (save_imatrix_legacy): weights with any data, each value
 * sum / count x ncall (1 where its count is 0), ncall the largest count over chunk_size rounded
 * up; then the chunk count and `prompt` (or the last dataset added). 0, or -1 with err. */
int qd_imatrix_sums_write(const struct qd_imatrix_sums *s, const char *path, int legacy, const char *prompt, char *err,
                          size_t errlen);

#endif
