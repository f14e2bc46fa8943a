/* POST /convert?fmt=F[&param=v...][&skip=RE][&only=RE]: a whole model file in the body (a GGUF
 * for the GGML formats, a safetensors file for nf4/fp4), the converted file as the answer. The
 * body is spooled to a file as it arrives (never held in memory; --max-convert-bytes bounds it),
 * a queue worker converts it, and the answer is sent from the output file. */
#ifndef QD_CONVERT_ROUTE_H
#define QD_CONVERT_ROUTE_H

#include <stddef.h>

#include "http/convert_job.h"
#include "http/decode.h"
#include "http/reply.h"

struct qd_convert_upload;

/* From the query and headers, before the body: the format, its params, skip/only, the size
 * limit, and the spool file (in spool_dir). NULL with the answer (400, 413, 415, 503) in err. */
struct qd_convert_upload *qd_convert_upload_begin(const struct qd_kv *kv, int n, const char *content_type,
                                                  long long length, const char *spool_dir, long long limit,
                                                  struct qd_reply *err);
/* The format asked for (for metrics and logs). */
const struct qd_format *qd_convert_upload_format(const struct qd_convert_upload *u);
/* Appends body bytes; -1 with the answer in err (413 past the limit, 507 when the disk is full). */
int qd_convert_upload_write(struct qd_convert_upload *u, const char *data, size_t n, struct qd_reply *err);
/* The request for a worker (src: the spooled body; dst: a new spool name); frees u. */
struct qd_convert_request *qd_convert_upload_finish(struct qd_convert_upload *u, struct qd_reply *err);
/* Removes the spool file and frees u (a request that ended before its job). */
void qd_convert_upload_abort(struct qd_convert_upload *u);

/* Where POST /convert spools: --data-dir, else $TMPDIR, else /tmp. */
const char *qd_convert_spool_dir(const char *data_dir);
/* Removes the spool files a quantd that is gone left in dir (a SIGKILL, a crash): quantd's own
 * names only, regular files only, and only those no live quantd holds locked. Returns how many. */
int qd_convert_spool_sweep(const char *dir);

#endif
