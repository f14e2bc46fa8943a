/* The entry points the CLI and the service call: validation, the non-finite check, dispatch to
 * a backend through the registry, and the error report. */
#ifndef QD_QUANTIZE_H
#define QD_QUANTIZE_H

#include "registry.h"

struct cJSON;

/* Quantizes `in` with format f on backend b into out[i] (sized by qd_format_layout). Computed
 * params (offset, global scale) are written back to p. p->importance, when set, weights the
 * search of the formats that take it (struct qd_params). err gets a message on failure. */
enum qd_status qd_quantize(enum qd_backend_kind b, const struct qd_format *f,
                           const struct qd_tensor *in, struct qd_params *p, void *const *out,
                           char *err, size_t errlen);

/* Checks p->importance against the format, the backend and the input: QD_OK when there is none
 * or when it fits (importance_n = cols x k, k dividing rows; finite values >= 0),
 * QD_EINVAL with a message otherwise. qd_quantize calls it; a caller may call it earlier. */
enum qd_status qd_importance_check(enum qd_backend_kind b, const struct qd_format *f,
                                   const struct qd_tensor *in, const struct qd_params *p,
                                   char *err, size_t errlen);

/* On the CUDA backend qd_quantize returns with the work queued on the thread's stream; after
 * the caller has queued its copies, this waits for the stream and reports what the device
 * found (the non-finite check, as qd_quantize would) and writes device-computed params (the
 * nf4/fp4 offset) to p. It must follow every successful CUDA quantize; on the CPU it does
 * nothing. */
enum qd_status qd_quantize_finish(enum qd_backend_kind b, struct qd_params *p, char *err, size_t errlen);

/* Dequantizes components in[i] into out (its shape and dtype set by the caller). */
enum qd_status qd_dequantize(enum qd_backend_kind b, const struct qd_format *f,
                             const void *const *in, const struct qd_params *p,
                             struct qd_tensor *out, char *err, size_t errlen);

struct qd_error_report {
    double nmse;    /* sum((x - y)^2) / sum(x^2) */
    double sqnr_db; /* -10 log10(nmse); +inf when exact */
    double max_abs; /* max |x - y| */
};

/* Compares an input tensor with its dequantized f32 values (same element count). */
void qd_error_report(const struct qd_tensor *ref, const float *deq, struct qd_error_report *r);

/* Parameters as a JSON object of typed values (unset optional ones left out), and back. */
struct cJSON *qd_params_to_json(const struct qd_format *f, const struct qd_params *p);
enum qd_status qd_params_from_json(const struct qd_format *f, struct qd_params *p,
                                   const struct cJSON *obj, char *err, size_t errlen);

#endif
