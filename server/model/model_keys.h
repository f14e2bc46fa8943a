/* What model_load.c's metadata reader lends the readers of the architectures' own keys
 * (model_keys.c): "<arch>.<suffix>" as a number, and those readers. Internal to server/model. */
#ifndef QD_MODEL_KEYS_H
#define QD_MODEL_KEYS_H

#include "model/model.h"

struct qd_model_keys {
    const struct qd_gguf *g;
    const char *arch;
    char *err;
    size_t errlen;
};

/* 1 found (*out set), 0 absent, -1 with err: not a number, required and absent, or a per-layer
 * array whose values differ. */
int qd_model_key(struct qd_model_keys *k, const char *suffix, int required, double *out);

/* Each 0, or -1 with k->err. experts: expert_count and the rest (every architecture; deepseek2's
 * own keys too); mla: deepseek2's latent attention sizes; yarn: its YaRN, after the rope's
 * freq_scale is read. */
int qd_model_read_experts(struct qd_model_keys *k, struct qd_model *m);
int qd_model_read_mla(struct qd_model_keys *k, struct qd_model *m);
int qd_model_read_yarn(struct qd_model_keys *k, struct qd_model *m);

#endif
