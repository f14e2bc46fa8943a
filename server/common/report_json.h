/* The small JSON pieces that both the HTTP answers and the CLI's meta.json carry. */
#ifndef QD_REPORT_JSON_H
#define QD_REPORT_JSON_H

#include <stdint.h>

#include "../../kernels/quantize.h"

struct cJSON;

/* [d0, d1, ...] */
struct cJSON *qd_shape_json(int ndim, const int64_t *shape);
/* {"nmse", "sqnr_db" (null when exact), "max_abs"} */
struct cJSON *qd_report_json(const struct qd_error_report *r);

#endif
