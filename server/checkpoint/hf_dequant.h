/* Back to float, shared by its source families: hf_dequant.c holds the table of sources (by
 * config.json's quantization_config) and the FineGrainedFP8 / compressed-tensors rows;
 * hf_dequant_bnb.c (transformers + bitsandbytes 4-bit) and hf_dequant_awq.c (AutoAWQ GEMM) plan
 * and turn back their own tensors. */
#ifndef QD_HF_DEQUANT_H
#define QD_HF_DEQUANT_H

#include "checkpoint/hf_layout.h"

/* A family's hooks. plan: what becomes of sh->st.t[i], as hf_layout.h's plan_tensor says (0
 * copied, 1 a weight back to float: *out's name (a new string), shape, dequant and what it needs;
 * the caller sets dtype and bytes; 2 dropped, -1 refused with err); q is quantization_config. */
struct qd_hf_dequant_family {
    int (*plan)(const cJSON *q, const struct qd_hf_shard *sh, int i, struct qd_hf_out *out, char *err, size_t errlen);
};
extern const struct qd_hf_dequant_family qd_hf_dequant_bnb, qd_hf_dequant_awq;

/* s ends with ".<end>" (or is end) */
int qd_hf_ends_with(const char *s, const char *end);
/* the shard's tensor named exactly name, or NULL */
const struct qd_st_entry *qd_hf_tensor_named(const struct qd_hf_shard *sh, const char *name);
/* element k of out, whose dtype is odt, set to v rounded to nearest even */
void qd_hf_store(void *out, size_t k, float v, enum qd_dtype odt);

#endif
