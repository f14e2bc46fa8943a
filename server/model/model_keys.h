/* The model's metadata reader (model_keys.c) that model_load.c and the readers of the
 * architectures' own keys share: "<arch>.<suffix>" as a number or a string, and those readers.
 * Internal to server/model. */
#ifndef QD_MODEL_KEYS_H
#define QD_MODEL_KEYS_H

#include "model/model.h"

struct qd_model_keys {
    const struct qd_gguf *g;
    const char *arch;
    char *err;
    size_t errlen;
};

/* "<arch>.<suffix>" as a number (an array's first element): 1 found (*out set), 0 absent, -1 with
 * err: not a number, required and absent, or a per-layer array whose values differ. */
int qd_model_keys_number(struct qd_model_keys *k, const char *suffix, int required, double *out);
/* "<arch>.<suffix>" as a string (malloc'd), or NULL when absent. */
char *qd_model_keys_string(struct qd_model_keys *k, const char *suffix);
/* Any numeric key's value (an array's first element) as double: 1 present, 0 absent, -1 not
 * numeric; *n_elems (may be NULL) gets an array's length (1 for a scalar). */
int qd_model_kv_number(const struct qd_gguf *g, const char *key, double *out, uint64_t *n_elems);

/* Each 0, or -1 with k->err. experts: expert_count and the rest (every architecture; deepseek2's
 * own keys too); mla: deepseek2's latent attention sizes; yarn: its YaRN, after the rope's
 * freq_scale is read. */
int qd_model_read_experts(struct qd_model_keys *k, struct qd_model *m);
int qd_model_read_mla(struct qd_model_keys *k, struct qd_model *m);
int qd_model_read_yarn(struct qd_model_keys *k, struct qd_model *m);

#endif
