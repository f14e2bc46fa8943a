/* Conversions as service jobs (POST /jobs?op=convert): the request, checked and its paths
 * confined to --data-dir before the job is accepted, and the run on a queue worker with its
 * progress in the job (GET /jobs/{id}) and cancellation by DELETE. */
#ifndef QD_CONVERT_JOB_H
#define QD_CONVERT_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "http/decode.h"
#include "http/reply.h"
#include "queue/jobs.h"

struct qd_convert_spec;

struct qd_convert_request {
    char *src, *dst; /* real paths inside the data directory, or POST /convert's spool files */
    char *root;      /* the data directory's real path (NULL for POST /convert) */
    struct qd_convert_spec *spec; /* what to write: the request's names and options, resolved
                                     (checkpoint/convert_request.h) */
    int overwrite;   /* "overwrite": true: an existing destination may be replaced */
    int spooled;     /* POST /convert: src and dst are temporary; the answer is dst's bytes */
    int spool_fd[2]; /* POST /convert: src's and dst's spool files, held open and locked while
                        they are in use (qd_convert_spool_sweep leaves locked ones) */
    uint64_t max_header_bytes; /* a safetensors model's header (--max-safetensors-header-bytes) */
};

/* The JSON body {"source", "destination", "fmt" or "recipe", "params", "skip", "only",
 * "overwrite", llama-quantize's options} and the query (what POST /convert's query takes;
 * later, so it wins over the body), resolved as every conversion is (convert_request.h) and
 * checked whole before the job is accepted. Paths are relative to data_dir: absolute ones,
 * "..", and symlinks that lead outside (the source's own, or any file in a source directory)
 * are refused (403); a missing source or destination directory is 404; an existing destination
 * without "overwrite" 409; a NUL in the body, a source that is not a file or a directory, a
 * format that does not read the source, a destination under a file or with a name too long,
 * the rest 400. No message names a path of the server's. NULL with the error in err. */
struct qd_convert_request *qd_convert_request_parse(const char *data_dir, const struct qd_kv *query, int nquery,
                                                    const char *body, size_t len, struct qd_reply *err);
void qd_convert_request_free(struct qd_convert_request *r);
/* The answer to a request qd_convert_resolve refused (st, and spec's code) with its message. */
void qd_convert_resolve_error(const struct qd_convert_spec *spec, enum qd_status st, const char *msg,
                              struct qd_reply *err);

/* A conversion's job type (jobs.h): j->payload is its request; run puts the summary (200) or
 * the error in j->reply. */
extern const struct qd_job_type qd_convert_job_type;
/* What a conversion writes, as its summary's fmt says: the format, the dtype back to float, or
 * the llama-quantize mix that quantizes nothing (F16, BF16, F32, COPY). */
const char *qd_convert_request_fmt(const struct qd_convert_request *r);
/* j's conversion request, or NULL when j is not a conversion. */
const struct qd_convert_request *qd_convert_job_request(const struct qd_job *j);

#endif
