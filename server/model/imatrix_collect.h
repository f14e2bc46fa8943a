/* The importance-matrix collector: llama-imatrix's collect_imatrix (tools/imatrix/imatrix.cpp)
 * over the engine's matmul inputs (engine.h on_matmul_input). For each weight "blk.*" (and
 * "output.weight" with process_output) whose matmul takes 16 or more tokens at once, the sum of
 * x^2 per input column and the tokens seen, per weight: q, k and v take the same input and
 * each gets its own entry. An expert weight (a 3-D ffn_*_exps of n_expert matrices) is counted
 * per expert (the routed tokens' rows), as MUL_MAT_ID is: by the engine's expert hook
 * (qd_imatrix_collect_expert_matmul), or given the routing (qd_imatrix_collect_experts). */
#ifndef QD_MODEL_IMATRIX_COLLECT_H
#define QD_MODEL_IMATRIX_COLLECT_H

#include <stdint.h>

#include "checkpoint/imatrix_sums.h"
#include "../../kernels/nn.h"
#include "../../kernels/registry.h"

struct qd_imatrix_collector {
    struct qd_imatrix_sums *sums;
    int process_output; /* collect the output head (--process-output) */
    int min_tokens;     /* the fewest tokens of a matmul collected (0: llama-imatrix's 16; a caller
                           whose chunks run several to a batch there, as short ones do, sets 1) */
    const struct qd_nn_backend *nn; /* the engine's backend, whose memory the rows are in (NULL:
                                       the host's) */
    int last;           /* the entry the last call used (the next is usually the one after) */
    volatile int stop;  /* set on a failure: the engine's cancel flag */
    enum qd_status status;
    char err[512];      /* the first failure */
};

/* The engine's on_matmul_input hook (ctx: a struct qd_imatrix_collector): x [T][K] adds into
 * weight's entry. A failure (a width that disagrees with the entry, a sum that overflows f32)
 * sets status, err and stop. */
void qd_imatrix_collect_matmul(void *ctx, int layer, const char *weight, const float *x, int64_t T, int64_t K);

/* An expert weight's matmul: n_expert matrices of K columns, each of T tokens routed to n_used
 * of them (ids [T][n_used]); x [T][x_rows][K], x_rows 1 (every expert takes the token's row) or
 * n_used (a row per routed expert). Each routed (token, expert) adds x^2 to that expert's sums
 * and 1 to its count. QD_OK, or a status with c->err. */
enum qd_status qd_imatrix_collect_experts(struct qd_imatrix_collector *c, const char *weight, int64_t n_expert,
                                          const int32_t *ids, int64_t n_used, const float *x, int64_t x_rows,
                                          int64_t T, int64_t K);

/* The engine's on_matmul_expert_input hook (graph.h; ctx: a struct qd_imatrix_collector): x
 * [rows][K], the rows routed to expert `expert` of weight's n_expert, add to that expert's sums
 * and count, whatever their number (llama-imatrix's MUL_MAT_ID). A failure sets status, err and
 * stop. */
void qd_imatrix_collect_expert_matmul(void *ctx, int layer, const char *weight, int expert, int n_expert,
                                      const float *x, int64_t rows, int64_t K);

/* The engine's on_matmul_head_input hook (graph.h): x [T][K] into slice `head` of weight's
 * n_head, under the 16-token rule of on_matmul_input; one count for the weight, taken with head
 * 0 (llama-imatrix's MUL_MAT over a 3-D weight). A failure sets status, err and stop. */
void qd_imatrix_collect_head_matmul(void *ctx, int layer, const char *weight, int head, int n_head, const float *x,
                                    int64_t T, int64_t K);

#endif
