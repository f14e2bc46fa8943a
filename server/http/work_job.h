/* The job types the HTTP layer makes (jobs.h): /quantize and /dequantize here, conversions in
 * convert_job.h; and the answer handling both share. */
#ifndef QD_WORK_JOB_H
#define QD_WORK_JOB_H

#include <stddef.h>

#include "queue/jobs.h"

extern const struct qd_job_type qd_work_job_type;

/* A job type's free and too_large for an answer built by reply.c. */
void qd_job_answer_free(struct qd_job *j);
void qd_job_answer_too_large(struct qd_job *j, size_t limit);

#endif
