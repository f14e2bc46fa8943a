/* The plan of an MLX conversion (mlx_convert.c): every tensor mlx_lm.convert writes, from the
 * source's headers and the model class's rules (mlx_arch.h), and how to read each one's source
 * (stacked experts, MLA's split kv_b_proj, a dtype cast) into one buffer. */
#ifndef QD_MLX_PLAN_H
#define QD_MLX_PLAN_H

#include <stdint.h>

#include "checkpoint/convert.h"
#include "checkpoint/mlx_arch.h"
#include "checkpoint/safetensors.h"

struct qd_mlx_source {
    char *path;
    struct qd_mapped m;
    struct qd_st_file st;
};

struct qd_mlx_part {
    const struct qd_st_entry *t;
};

/* One output tensor (copied or cast), or one quantized weight's components back to back. */
struct qd_mlx_entry {
    char *name;           /* the weight's (or copied tensor's) name in mlx-lm's model */
    struct qd_mlx_part *parts;   /* its source: one tensor, or the experts stacked */
    int nparts, quantize;
    enum qd_dtype from, to; /* source and written dtype of a float tensor (to: after the cast) */
    int is_float;
    const char *st_dtype; /* a copied tensor's safetensors dtype */
    int ndim;
    int64_t shape[QD_ST_MAX_DIMS];
    uint64_t in_bytes, bytes; /* the stacked source's bytes, the output's */
    int nc;
    struct qd_component comps[QD_MAX_COMPONENTS];
    int shard;
    int split;                 /* MLA: 1 embed_q, 2 unembed_out of parts[0] (kv_b_proj) */
    int64_t heads, nope, vdim, rank;
    const struct qd_format *f; /* what it is quantized to, with params (the run's, or the */
    struct qd_params params;   /* class's own for this module: own) */
    int own;
};

struct qd_mlx_plan {
    struct qd_mlx_entry *e;
    int n, cap;
};

/* The entries of the model, sorted by name (mla: config.json's num_attention_heads,
 * qk_nope_head_dim, v_head_dim, kv_lora_rank for MLA's split). 0, or -1 with err. */
int qd_mlx_plan_model(const struct qd_convert_opts *o, const struct qd_mlx_arch *a, int tied, int has_cast,
                      enum qd_dtype cast_to, const int64_t mla[4], struct qd_mlx_source *src, int nsrc,
                      const struct qd_name_filter *nf, struct qd_mlx_plan *p, char *err, size_t errlen);
void qd_mlx_plan_free(struct qd_mlx_plan *p);

/* e's source as one buffer of its written dtype: the mapping itself where that is it, else
 * gathered (stacked, split, cast) into dst (big enough: e's elements in its written dtype). */
const void *qd_mlx_gather(const struct qd_mlx_entry *e, void *dst);

/* the safetensors name of a dtype */
const char *qd_mlx_dtype_st(enum qd_dtype d);

#endif
