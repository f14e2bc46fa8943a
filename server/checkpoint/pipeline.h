/* The conversion pipeline: one output file written from a list of items whose sizes, and so
 * whose places in the file, are known before anything runs. Three stages overlap: reader
 * threads read the items' source ranges into host buffers (pinned when the backend offers them,
 * so the GPU copies from them directly), the calling thread turns each into its output
 * (quantizes it through the worker) in order, and writer threads write outputs at their
 * offsets. Items copied unchanged go from file to file in the kernel (copy_file_range). Memory:
 * a few buffers of the largest processed item (struct qd_pipe_pool), whatever the model. */
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

#define QD_PIPE_MAX_LANES 16

struct qd_pipe_item {
    enum qd_pipe_kind kind;
    const void *bytes;
    uint64_t src_offset, src_bytes, out_bytes;
    uint32_t pad_to;  /* zeros after the item up to this alignment (0: none) */
    int src;          /* COPY, PROCESS: the source file the range is in (qd_pipe.src_fds[src]) */
};

/* Host buffers for one conversion (all its files): allocated once, reused. */
struct qd_pipe_pool;
/* lanes: how many items may be processed at once (qd_pipe.lanes), for the slots they hold. */
struct qd_pipe_pool *qd_pipe_pool_new(struct qd_backend *backend, uint64_t in_cap, uint64_t out_cap, int lanes);
void qd_pipe_pool_free(struct qd_pipe_pool *pool);
/* Turns off what a pool would use where it can: reading the input through a mapping (pools
 * without pinned buffers) and writing the output with O_DIRECT. Tests run every mode; 0, or
 * -1 when the input buffers cannot be had. */
int qd_pipe_pool_modes(struct qd_pipe_pool *pool, int mapped_input, int direct_output);

struct qd_pipe {
    int src_fd;
    /* Several source files (a model in shards): items name theirs by index; NULL: src_fd alone. */
    const int *src_fds;
    int n_src;
    struct qd_outfile *out; /* written at offsets from 0; out->written is the file size after */
    const struct qd_pipe_item *items;
    int n;
    /* PROCESS: fills out (items[i].out_bytes) from in (items[i].src_bytes); a status and err
     * on failure. With one lane it runs on the calling thread in item order; with several,
     * lane L's thread calls it for the items it takes (each lane one item at a time, items
     * taken in order, finishing in any order). in may be the page cache of the source itself
     * (read-only); out has no particular alignment. */
    enum qd_status (*process)(void *ctx, int lane, int i, const void *in, void *out, char *err, size_t errlen);
    int lanes; /* items processed at once (0 or 1: one, on the calling thread; at most QD_PIPE_MAX_LANES) */
    /* After item i is handed to the writers (progress), on the calling thread. */
    void (*handed)(void *ctx, int i);
    void *ctx;
    struct qd_pipe_pool *pool;
    const volatile int *cancel;
    struct qd_stage_seconds *stats; /* optional: each stage's busy seconds are added here */
};

/* Runs the items; 0, or -1 with *status and err. The output file stays open (commit or abort
 * it after). */
int qd_pipe_run(const struct qd_pipe *p, enum qd_status *status, char *err, size_t errlen);

/* With QUANTD_PIPE_TRACE set, one stage's span on stderr ("pipe STAGE ITEM T0 T1 BYTES", seconds
 * from the first span traced): where a conversion's wall time goes. */
void qd_pipe_trace(const char *stage, int item, double t0, double t1, uint64_t bytes);

/* Runs fn over [0, rows) in consecutive spans on up to one thread per online core (spans of at
 * least min_rows; fewer rows run on the calling thread): for host-side work on one item that is
 * worth spreading, such as turning a quantized weight back into floats. fn returns 0 or -1;
 * the first failure's -1 is returned (every span runs to its end either way). */
int qd_pipe_rows(int64_t rows, int64_t min_rows, int (*fn)(void *ctx, int64_t r0, int64_t r1), void *ctx);

/* A monotonic clock in seconds: the converters' and the pipeline's timings. */
double qd_pipe_clock_s(void);

/* The pipeline lanes o asks for (see workers), and a copy of o made lane L's (its worker). */
int qd_convert_lanes(const struct qd_convert_opts *o);
void qd_convert_use_lane(struct qd_convert_opts *o, int lane);

#endif
