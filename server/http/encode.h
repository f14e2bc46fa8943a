/* Response encoders: a finished qd_work as JSON (base64 tensors), as a safetensors container, or
 * as raw bytes; and the small JSON documents the service answers with. */
#ifndef QD_ENCODE_H
#define QD_ENCODE_H

#include "common/report_json.h"
#include "http/decode.h"
#include "http/safetensors.h"
#include "http/reply.h"
#include "queue/work.h"

struct cJSON;

/* The answer to a finished /quantize or /dequantize, in the form w->req asked for. */
void qd_encode_result(struct qd_work *w, struct qd_reply *r); /* may take w->out.data */

/* {"queue_us":..} */
struct cJSON *qd_timing_json(const struct qd_timing *t);

#endif
