/* One unit of work as the service sees it: what the client asked (struct qd_req, decoded from
 * the URL), the tensors decoded from the body, the outputs, and the timing. decode.c fills it,
 * a backend runs it, encode.c turns it into the answer. */
#ifndef QD_WORK_H
#define QD_WORK_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/quantize.h"

/* /jobs only: QD_OP_CONVERT converts a whole model; QD_OP_PERPLEXITY and QD_OP_IMATRIX run one
 * (quantd perplexity, quantd imatrix). Their query is their request's (a JSON body of files). */
enum qd_op { QD_OP_QUANTIZE, QD_OP_DEQUANTIZE, QD_OP_CONVERT, QD_OP_PERPLEXITY, QD_OP_IMATRIX };

/* An op's name as the API spells it (/jobs?op=, a job's "op"; api/openapi.yaml's JobOp is made
 * from these), NULL past the last. */
static inline const char *qd_op_name(int op)
{
    static const char *const names[] = {[QD_OP_QUANTIZE] = "quantize", [QD_OP_DEQUANTIZE] = "dequantize",
                                        [QD_OP_CONVERT] = "convert", [QD_OP_PERPLEXITY] = "perplexity",
                                        [QD_OP_IMATRIX] = "imatrix"};
    return op >= 0 && op < (int)(sizeof names / sizeof *names) ? names[op] : NULL;
}

/* Whether an op's request is a JSON body naming files under --data-dir (a whole-model job). */
static inline int qd_op_names_files(int op)
{
    return op == QD_OP_CONVERT || op == QD_OP_PERPLEXITY || op == QD_OP_IMATRIX;
}

#define QD_REQ_MAX_PARAMS 16

/* The request as named by the URL query and headers: cheap to decode, checked before the body
 * is queued. Query params are kept as text and applied after any params in a JSON body, so the
 * URL wins. */
struct qd_req {
    enum qd_op op;
    const struct qd_format *f; /* NULL: not in the query (dequantize reads it from the body) */
    int has_dtype;
    enum qd_dtype dtype;       /* quantize: input dtype; dequantize: output dtype */
    int has_shape;
    int ndim;
    int64_t shape[QD_MAX_DIMS];
    int report_error;          /* report=error */
    int binary_out;            /* Accept: application/octet-stream */
    int nparams;
    char param_key[QD_REQ_MAX_PARAMS][32];
    char param_value[QD_REQ_MAX_PARAMS][64];
    long long json_limit;      /* --max-json-bytes: a JSON body apart from its base64 data, and a
                                  safetensors body's header (0: QD_JSON_LIMIT_DEFAULT) */
};

/* How a request's body carries its tensor. */
enum qd_body_kind { QD_BODY_RAW, QD_BODY_JSON, QD_BODY_SAFETENSORS };

struct qd_timing {
    double queue_us, h2d_us, kernel_us, d2h_us, total_us;
};

struct qd_work {
    struct qd_req req;
    const struct qd_format *f;
    struct qd_params p;
    struct qd_tensor in;  /* quantize input; in.data may point into the request body */
    void *in_owned;       /* decoded input to free, or NULL */
    float *importance_owned; /* the decoded "importance" (p.importance points at it), or NULL */
    int nc;
    struct qd_component comps[QD_MAX_COMPONENTS];
    void *comp[QD_MAX_COMPONENTS]; /* quantize outputs, dequantize inputs */
    unsigned comp_owned;           /* bit i: comp[i] is malloc'd here */
    struct qd_tensor out;          /* dequantize output (out.data malloc'd) */
    int has_report;
    struct qd_error_report report;
    struct qd_timing t;
    char backend[32];              /* "cpu", "cuda:0" */
};

void qd_work_free(struct qd_work *w);

#endif
