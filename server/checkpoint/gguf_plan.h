/* The plan of a GGUF conversion (gguf_convert.c): every output tensor, from the input's headers
 * alone, with llama-quantize's rules for which tensors are quantized (tensor_allows_quantization),
 * the loader's order, --prune-layers' renumbering, what becomes of each tensor (copied, cast to
 * F16, quantized, requantized) and its importance; the keys llama-quantize adds; the files
 * gguf-split cuts the output into. */
#ifndef QD_GGUF_PLAN_H
#define QD_GGUF_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/convert.h"
#include "checkpoint/gguf.h"
#include "checkpoint/gguf_arch.h"
#include "checkpoint/gguf_options.h"
#include "checkpoint/imatrix.h"

struct qd_gguf_plan {
    const struct qd_gguf_tensor *src;
    struct qd_gguf_tensor out;
    enum qd_convert_action action;
    const struct qd_format *f; /* QD_CONVERT_QUANTIZE: the format (the target's, or its fallback) */
    const float *importance;   /* its imatrix entry (ne[0] values per matrix), or NULL */
    const struct qd_format *requant; /* --allow-requantize: the source's format, dequantized to f32
                                        first (ggml's to_float), or NULL */
};

/* tensor_allows_quantization for tensor t of a model of architecture arch (qd_gguf_arch_find),
 * with --leave-output-tensor from opt (NULL: none). */
int qd_gguf_allows_quantization(const struct qd_gguf_tensor *t, const struct qd_gguf_arch *arch,
                                const struct qd_gguf_options *opt);
/* llama_model_loader's weights_map order, a qsort comparator over const struct qd_gguf_tensor
 * pointers: by the layer number of "blk.%d." (-1 for others), then by name. */
int qd_gguf_loader_order(const void *a, const void *b);
/* Fills plan[] (src, out) from order[0..n) without the tensors of opt's pruned layers, the later
 * blocks renumbered as remap_layer does; *kept tensors, *n_blocks the block count after. */
int qd_gguf_plan_prune(const struct qd_gguf_tensor *const *order, int n, const struct qd_gguf_options *opt,
                       struct qd_gguf_plan *plan, int *kept, int *n_blocks, char *err, size_t errlen);
/* What the plan does with a tensor of ggml type target: copy (its own type), cast to F16,
 * quantize, or requantize (opt's --allow-requantize). -1 with err when quantd does not write
 * the type or the tensor cannot become it. */
int qd_gguf_plan_target(struct qd_gguf_plan *p, uint32_t target, const struct qd_gguf_options *opt, char *err,
                        size_t errlen);
/* The tensor's entry of im (NULL: none) as llama-quantize picks it; -1 with err for an entry of
 * another size, or none where the type requires one. */
int qd_gguf_plan_importance(struct qd_gguf_plan *p, const struct qd_imatrix *im, int requires, char *err,
                            size_t errlen);
/* What the importance matrix im (opt's --imatrix, filtered) covered of the tensors plan[0..n)
 * quantizes: s's imatrix counts. One that covers none of them is refused (-1 with err: made for
 * another model), but with opt->imatrix_uncovered_ok (llama-quantize's way: it warns). */
int qd_gguf_plan_coverage(const struct qd_gguf_plan *plan, int n, const struct qd_imatrix *im,
                          const struct qd_gguf_options *opt, struct qd_convert_summary *s, char *err, size_t errlen);
/* gguf-split's cut of plan[0..n) (opt's split size or count): split_of[i] per tensor; the
 * number of files, or -1 with err. */
int qd_gguf_plan_splits(const struct qd_gguf_plan *plan, int n, const struct qd_gguf_options *opt, int *split_of,
                        char *err, size_t errlen);
/* --keep-split: split_of[i] the shard plan[i] came from (plan in qd_gguf_shard_order); the
 * number of files, or -1 with err where a shard has no tensor left. */
int qd_gguf_plan_keep_split(const struct qd_gguf_plan *plan, int n, int *split_of, char *err, size_t errlen);
/* A qsort comparator over struct qd_gguf_plan: by the source's shard, then its offset in it. */
int qd_gguf_shard_order(const void *a, const void *b);
/* File k of n: dst without ".gguf" and -0000K-of-0000N.gguf. */
void qd_gguf_split_path(const char *dst, int k, int n, char *out, size_t len);
/* Reads the importance matrix at path (opened as every input is: confined to a job's data
 * directory) into m; -1 with err naming the file. */
int qd_gguf_imatrix_load(const char *path, struct qd_imatrix *m, char *err, size_t errlen);
/* An --override-kv as gguf_set_val_* writes it (an int as u32 of its magnitude). */
struct qd_gguf_new_kv qd_gguf_kv_of_override(const struct qd_gguf_kv_override *k);
/* Appends e to extra[0..n), first removing an earlier one of its key; the new count. */
int qd_gguf_kv_append(struct qd_gguf_new_kv *extra, int n, struct qd_gguf_new_kv e);

#endif
