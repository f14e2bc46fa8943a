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
    char *root;      /* the data directory's real path (NULL for POST /convert) */
    const struct qd_format *f; /* NULL: nothing quantized (to_float, or a float mix) */
    const char *to_float;      /* "bf16", "f16", "f32": a quantized Hugging Face model back to float */
    struct qd_params params;
    char *skip, *only;
    struct qd_name_filter *filter; /* skip and only, compiled once when the request is checked */
    char *recipe;    /* a llama-quantize mix name (GGUF), f then its default type */
    struct qd_gguf_options *gguf; /* llama-quantize's options (GGUF), or NULL when none is given */
    int overwrite;   /* "overwrite": true: an existing destination may be replaced */
    int spooled;     /* POST /convert: src and dst are temporary; the answer is dst's bytes */
    int spool_fd[2]; /* POST /convert: src's and dst's spool files, held open and locked while
                        they are in use (qd_convert_spool_sweep leaves locked ones) */
    uint64_t max_header_bytes; /* a safetensors model's header (--max-safetensors-header-bytes) */
};

/* The JSON body {"source", "destination", "fmt" or "recipe", "params", "skip", "only",
 * "overwrite"} (fmt and params may be in the query instead), checked whole before the job is
 * accepted. Paths are relative to data_dir: absolute ones, "..", and symlinks that lead outside
 * (the source's own, or any file in a source directory) are refused (403); a missing source or
 * destination directory is 404; an existing destination without "overwrite" 409; a NUL in the
 * body, a source that is not a file or a directory, a format that does not read the source, a
 * destination under a file or with a name too long, the rest 400. No message names a path of
 * the server's. NULL with the error in err. */
struct qd_convert_request *qd_convert_request_parse(const char *data_dir, const struct qd_req *q, const char *body,
                                                    size_t len, struct qd_reply *err);
void qd_convert_request_free(struct qd_convert_request *r);
/* One of llama-quantize's options (gguf_options.h) given over HTTP as text: a query parameter
 * of POST /convert (repeated for the repeatable ones) or a member of a job's body. Its name is
 * spelled with '_' or '-'; tensor_type_file is refused (it would read a file of the server's).
 * 1 when key is not such an option, 0 when set, -1 with a 400 in err. */
int qd_convert_gguf_option(struct qd_convert_request *r, const char *key, const char *value, struct qd_reply *err);
/* The 400 for a format (or, as_recipe, a mix) name quantd does not know, with a hint where the
 * name is the other kind or differs only in case. */
void qd_convert_name_error(struct qd_reply *err, const char *name, int as_recipe);

/* A conversion's job type (jobs.h): j->payload is its request; run puts the summary (200) or
 * the error in j->reply. */
extern const struct qd_job_type qd_convert_job_type;
/* What a conversion writes, as its summary's fmt says: the format, the dtype back to float, or
 * the llama-quantize mix that quantizes nothing (F16, BF16, F32, COPY). */
const char *qd_convert_request_fmt(const struct qd_convert_request *r);
/* j's conversion request, or NULL when j is not a conversion. */
const struct qd_convert_request *qd_convert_job_request(const struct qd_job *j);

#endif
