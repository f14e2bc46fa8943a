/* Runs of the model as service jobs: POST /jobs?op=perplexity (quantd perplexity: perplexity,
 * the base logits file, the KL divergence to it) and POST /jobs?op=imatrix (quantd imatrix). The
 * JSON body takes the command line's options by their long names with '_' (model, text, tokens,
 * ctx_size, chunks, batch_size, threads, cache_type_k/v, backend, max_device_bytes;
 * kl_divergence_base, kl_divergence; output, output_format, in_file, process_output, from_chunk,
 * no_ppl) and overwrite; runs take turns (one at a time in the process); every path
 * is relative to --data-dir and confined to it as a conversion's are (data_path.h). The request is
 * checked whole before the job is accepted (paths, options, the model's architecture and
 * vocabulary); the run (model/perplexity_run.h, model/imatrix_run.h) reports its progress in the
 * job, stops on DELETE, and answers the summary the command line prints (200) or the error. */
#ifndef QD_MODEL_JOB_H
#define QD_MODEL_JOB_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "http/decode.h"
#include "http/reply.h"
#include "queue/jobs.h"

struct qd_model_job_request;

/* op: QD_OP_PERPLEXITY or QD_OP_IMATRIX. The body and the query (which takes only op). NULL
 * with the answer in err: 403 (a path outside --data-dir, or no --data-dir), 404 (a missing
 * input or output directory), 409 (an existing output without "overwrite"), 400 (the rest: an
 * unknown field naming it, a value of the wrong kind, a model the engine cannot run, naming
 * why). No message names a path of the server's. */
struct qd_model_job_request *qd_model_job_parse(int op, const char *data_dir, const struct qd_kv *query, int nquery,
                                                const char *body, size_t len, struct qd_reply *err);
void qd_model_job_free(struct qd_model_job_request *r);

/* The job type (jobs.h): j->payload is the request. */
extern const struct qd_job_type qd_model_job_type;
/* Adds j's "progress" to o when j is a model job (layers and chunks done, the stage). */
void qd_model_job_progress_json(const struct qd_job *j, cJSON *o);

#endif
