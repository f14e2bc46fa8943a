/* Checkpoint conversion: a model file (or directory) in, the file the target runtime loads out,
 * one pass tensor by tensor. A target builds a plan (every output tensor, its source and what
 * to do with it) from the input's headers alone, so the output's header is known before any
 * tensor is quantized and the output is written front to back. Output goes to a temporary name
 * beside the destination, fsynced and renamed when complete; a failure or a cancellation
 * removes it and never touches the input. */
#ifndef QD_CONVERT_H
#define QD_CONVERT_H

#include <stdint.h>

#include "queue/backend.h"

enum qd_convert_action { QD_CONVERT_COPY, QD_CONVERT_QUANTIZE, QD_CONVERT_CAST_F16 };

/* One tensor's progress, reported after it is written. */
struct qd_convert_event {
    int index, count;          /* 1-based tensor index, tensors in all */
    const char *name;
    enum qd_convert_action action;
    const char *fmt;           /* the format when quantized */
    int ndim;
    int64_t shape[4];          /* as the source lists it, outermost first */
    double ms;
    int has_nmse;
    double nmse;
    uint64_t in_done, in_total; /* source tensor bytes */
    uint64_t out_done;
};

struct qd_convert_opts {
    const char *src, *dst;
    const struct qd_format *f;
    struct qd_params params;
    const char *skip, *only;  /* POSIX extended regexes over tensor names, or NULL */
    const char *recipe;       /* GGUF: a llama-quantize mix (Q4_K_M ...) choosing each tensor's
                                 type, f its default type (qd_convert sets f); NULL: f for all */
    int report_error;         /* NMSE per quantized tensor (costs a dequantize on the CPU) */
    uint64_t piece_bytes;     /* GGUF: a processed tensor goes through the pipeline in pieces of
                                 whole rows of at most this many input bytes (0: 128 MiB), so its
                                 buffers do not scale with the largest tensor */
    struct qd_backend *backend;
    void *worker;
    /* Several workers (one per device of --devices): the pipeline quantizes that many tensors
     * at once, lane L through workers[L]; 0 or 1: worker alone. One lane still where a tensor's
     * NMSE is reported or the AutoAWQ layout transposes through its one staging buffer. */
    void *workers[QD_MAX_DEVICES];
    int nworkers;
    void (*progress)(void *ctx, const struct qd_convert_event *ev);
    void *progress_ctx;
    const volatile int *cancel; /* nonzero: stop, remove the partial output */
};

/* Each pipeline stage's busy time (the stages overlap, so they add up to more than the wall). */
struct qd_stage_seconds {
    double read_s, process_s, write_s;
};

struct qd_convert_summary {
    int quantized, copied, cast;
    uint64_t bytes_in, bytes_out;
    uint64_t params_quantized, params_total;
    double seconds;
    struct qd_stage_seconds stages;
    char *layout_config; /* the runtime's config as JSON text (transformers' quantization_config),
                            or NULL; the caller frees it */
};

/* Converts o->src into o->dst for o->f; which container and layout follow from the input and
 * the format (GGUF in and a GGML block format: llama.cpp's GGUF). 0, or -1 with a message;
 * *status says which kind of failure (QD_EINVAL bad input/request, QD_ENOMEM, QD_EDEVICE,
 * QD_ECANCELED ...). */
/* The format a conversion writes for a format name's entry: f itself, but int8, which as a
 * checkpoint layout names llm-compressor's W8A16 (the w8a16 format, what its preset writes);
 * NULL stays NULL. */
const struct qd_format *qd_convert_format(const struct qd_format *f);

int qd_convert(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status, char *err,
               size_t errlen);

/* ---- for targets ------------------------------------------------------------------------------ */

/* A read-only mapping of a whole file (for headers: tensor data goes through the pipeline). */
struct qd_mapped {
    const uint8_t *data;
    size_t size;
};
int qd_map_file(const char *path, struct qd_mapped *m, char *err, size_t errlen);
void qd_unmap_file(struct qd_mapped *m);
/* Lets this process's mapping of the pages under [p, p + n) go (the page cache keeps them):
 * what a pass over mapped input has read stops counting as resident. */
void qd_release_pages(const void *p, size_t n);


/* An output file being written under a temporary name in its destination's directory. */
struct qd_outfile {
    int fd;
    char *path, *tmp;
    uint64_t written;
};
int qd_outfile_open(struct qd_outfile *f, const char *path, char *err, size_t errlen);
int qd_outfile_write(struct qd_outfile *f, const void *p, size_t n, char *err, size_t errlen);
int qd_outfile_pad(struct qd_outfile *f, uint32_t alignment, char *err, size_t errlen);
/* fsync and rename into place (commit), or remove (abort). */
int qd_outfile_commit(struct qd_outfile *f, char *err, size_t errlen);
/* The status of a failed write or commit by its errno: QD_ENOSPC when the storage is full (a
 * full disk, a quota, the file-size limit: the service answers 507), else QD_EIO. */
enum qd_status qd_status_of_write(int err_no);
void qd_outfile_abort(struct qd_outfile *f);

/* Name selection: whether a tensor the target's rule would quantize stays quantized under
 * --skip / --only. */
struct qd_name_filter;
struct qd_name_filter *qd_name_filter_new(const char *skip, const char *only, char *err, size_t errlen);
int qd_name_filter_keeps(const struct qd_name_filter *nf, const char *name);
void qd_name_filter_free(struct qd_name_filter *nf);

/* The pipeline lanes o asks for (see workers), and a copy of o made lane L's (its worker). */
int qd_convert_lanes(const struct qd_convert_opts *o);
void qd_convert_use_lane(struct qd_convert_opts *o, int lane);
/* Spreads a conversion over the backend's devices: workers[0] is o->worker, then a worker on
 * each other healthy device slot. Returns how many devices were left out (their worker would
 * not open; err says why); qd_convert_unspread closes the workers it opened. */
int qd_convert_spread(struct qd_convert_opts *o, char *err, size_t errlen);
void qd_convert_unspread(struct qd_convert_opts *o);

/* Quantizes one tensor through the worker: src (dtype, rows x cols) into out (the format's
 * components, back to back, sized by qd_format_layout). */
/* resolved (optional) gets the params as run, computed ones included (the nf4/fp4 offset). */
enum qd_status qd_convert_quantize(const struct qd_convert_opts *o, const void *src, enum qd_dtype dtype,
                                   int64_t rows, int64_t cols, void *out, int64_t out_bytes, double *nmse,
                                   struct qd_params *resolved, char *err, size_t errlen);

int qd_convert_gguf(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status,
                    char *err, size_t errlen);
/* A Hugging Face safetensors model -> transformers + bitsandbytes (nf4/fp4) or
 * compressed-tensors (w4a16) (hf_convert.c). */
int qd_convert_hf(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status,
                  char *err, size_t errlen);

#endif
