/* Conversions as service jobs (POST /jobs?op=convert): the request, checked and its paths
 * confined to --data-dir before the job is accepted, and the run on a queue worker with its
 * progress in the job (GET /jobs/{id}) and cancellation by DELETE. */
#ifndef QD_CONVERT_JOB_H
#define QD_CONVERT_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "http/reply.h"
#include "queue/jobs.h"

struct qd_convert_request {
    char *src, *dst; /* real paths inside the data directory, or POST /convert's spool files */
    const struct qd_format *f;
    struct qd_params params;
    char *skip, *only;
    struct qd_name_filter *filter; /* skip and only, compiled once when the request is checked */
    char *recipe;    /* a llama-quantize mix name (GGUF), f then its default type */
    int spooled;     /* POST /convert: src and dst are temporary; the answer is dst's bytes */
    uint64_t max_header_bytes; /* a safetensors model's header (--max-safetensors-header-bytes) */
};

/* The JSON body {"source", "destination", "fmt" or "recipe", "params", "skip", "only"} (fmt and
 * params may be in the query instead). Paths are relative to data_dir: absolute ones, "..", and symlinks
 * that lead outside are refused (403), a missing source or destination directory is 404, the
 * rest 400. NULL with the error in err. */
struct qd_convert_request *qd_convert_request_parse(const char *data_dir, const struct qd_req *q, const char *body,
                                                    size_t len, struct qd_reply *err);
void qd_convert_request_free(struct qd_convert_request *r);

/* Runs j's conversion on a worker of b; the summary (200) or the error lands in j->reply. */
void qd_convert_job_run(struct qd_job *j, struct qd_backend *b, void *worker);

#endif
