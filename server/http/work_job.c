/* /quantize and /dequantize as queue jobs (jobs.h): the body decoded, run on the worker's
 * backend, the answer encoded into the job; and the job's answer freed or, when the job store
 * cannot keep it, replaced by the error that says so (shared with conversions). */
#include "http/work_job.h"

#include <stdio.h>
#include <string.h>

#include "http/decode.h"
#include "http/encode.h"
#include "http/reply.h"
#include "common/metrics.h"

static void work_run(struct qd_job *j, struct qd_backend *b, void *worker)
{
    struct qd_work w;
    memset(&w, 0, sizeof w);
    snprintf(w.backend, sizeof w.backend, "%s", j->backend);
    if (qd_work_decode(&w, &j->req, j->kind, j->body, j->body_len, &j->reply) == 0) {
        char err[1024] = "";
        j->fmt = w.f;
        enum qd_status s = b->run(worker, &w, err, sizeof err);
        if (s != QD_OK)
            qd_reply_error(&j->reply, qd_status_http(s), qd_status_code(s), "%s", err);
        else {
            w.t.queue_us = j->started_us - j->enqueued_us;
            w.t.total_us = qd_now_us() - j->received_us;
            qd_metrics_kernel(w.f, w.t.kernel_us / 1e6);
            qd_encode_result(&w, &j->reply);
        }
    }
    j->timing = w.t;
    qd_work_free(&w);
}

void qd_job_answer_free(struct qd_job *j) { qd_reply_free(&j->reply); }

void qd_job_answer_too_large(struct qd_job *j, size_t limit)
{
    qd_reply_error(&j->reply, 507, "result_too_large",
                   "the result (%zu bytes) is larger than the job store keeps (%zu); use the synchronous endpoint",
                   j->reply.len, limit);
}

const struct qd_job_type qd_work_job_type = {
    .run = work_run, .free = qd_job_answer_free, .too_large = qd_job_answer_too_large};
