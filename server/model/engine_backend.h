/* Which backend runs the forward engine (--backend auto|cpu|cuda) and how much device memory it
 * may hold (--max-device-bytes), for every front end (CLI, jobs). */
#ifndef QD_MODEL_ENGINE_BACKEND_H
#define QD_MODEL_ENGINE_BACKEND_H

#include <stddef.h>

#include "../../kernels/nn.h"

/* A byte count: digits with an optional K, M, G or T (powers of 1024; "KiB", "MiB", "GiB",
 * "TiB" the same, and "B"). 0, or -1 when the text is not one. */
int qd_parse_bytes(const char *text, size_t *out);

/* The op table for `name` ("auto": CUDA where this build has it and a device answers, the CPU
 * otherwise; "cpu"; "cuda": refused without one), the device's memory limited to max_bytes
 * (0: none). 0, or -1 with err naming the problem and the fix. */
int qd_engine_backend(const char *name, size_t max_bytes, const struct qd_nn_backend **nn, char *err, size_t errlen);

#endif
