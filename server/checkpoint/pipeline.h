/* The conversion pipeline: one output file written front to back from a list of items, in
 * three stages that overlap. A reader thread reads each item's source range into a host buffer
 * (pinned when the backend offers it, so the GPU copies from it directly), the calling thread
 * turns it into the item's output (quantizes it through the worker), and a writer thread writes
 * the outputs in order. Items copied unchanged go from file to file in the kernel
 * (copy_file_range). Memory: a few buffers of the largest processed item, whatever the model. */
#ifndef QD_PIPELINE_H
#define QD_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/convert.h"

enum qd_pipe_kind {
    QD_PIPE_BYTES,   /* bytes held in memory (a header), written as they are */
    QD_PIPE_COPY,    /* a range of the source file, copied unchanged */
    QD_PIPE_PROCESS  /* a range of the source file, turned into out_bytes by the callback */
};

struct qd_pipe_item {
    enum qd_pipe_kind kind;
    const void *bytes;
    uint64_t src_offset, src_bytes, out_bytes;
    uint32_t pad_to;  /* zeros after the item up to this alignment (0: none) */
};

struct qd_pipe {
    int src_fd;
    struct qd_outfile *out;
    const struct qd_pipe_item *items;
    int n;
    /* PROCESS: fills out (items[i].out_bytes) from in (items[i].src_bytes); a status and err
     * on failure. Runs on the calling thread, in item order. */
    enum qd_status (*process)(void *ctx, int i, const void *in, void *out, char *err, size_t errlen);
    /* After item i is handed to the writer (progress), on the calling thread. */
    void (*handed)(void *ctx, int i);
    void *ctx;
    struct qd_backend *backend; /* its host_alloc, when it has one, for the buffers */
    const volatile int *cancel;
    struct qd_stage_seconds *stats; /* optional: each stage's busy seconds are added here */
};

/* Runs the items; 0, or -1 with *status and err. The output file stays open (commit or abort
 * it after). */
int qd_pipe_run(const struct qd_pipe *p, enum qd_status *status, char *err, size_t errlen);

#endif
