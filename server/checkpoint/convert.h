/* Checkpoint conversion: a model file (or directory) in, the file the target runtime loads out,
 * one pass tensor by tensor. A target builds a plan (every output tensor, its source and what
 * to do with it) from the input's headers alone, so the output's header is known before any
 * tensor is quantized and the output is written front to back. Output goes to a temporary name
 * beside the destination, fsynced and renamed when complete; a failure or a cancellation
 * removes it and never touches the input. */
#ifndef QD_CONVERT_H
#define QD_CONVERT_H

#include <stdint.h>

#include "checkpoint/convert_files.h"
#include "queue/backend.h"

struct qd_gguf_recipe;

/* CAST: to another float type (f16, bf16, f32), through f32 as llama-quantize converts */
enum qd_convert_action { QD_CONVERT_COPY, QD_CONVERT_QUANTIZE, QD_CONVERT_CAST };

struct qd_name_filter;
struct qd_gguf_options;

/* One tensor's progress, reported after it is written. */
struct qd_convert_event {
    int index, count;          /* 1-based tensor index, tensors in all */
    const char *name;
    enum qd_convert_action action;
    const char *fmt;           /* the format when quantized, the ggml type when cast */
    int ndim;
    int64_t shape[4];          /* as the source lists it, outermost first */
    double ms;
    const char *rule;          /* Hugging Face layouts: "table" (the architecture table chose),
                                  "generic" (the generic rule did); NULL otherwise */
    int has_nmse;
    double nmse;
    uint64_t in_done, in_total; /* source tensor bytes */
    uint64_t out_done;
    int no_importance;         /* GGUF: an importance matrix was given and has no entry for this
                                  quantized tensor (llama-quantize's "did not find weights") */
};

struct qd_convert_opts {
    const char *src, *dst;
    const struct qd_format *f;
    struct qd_params params;
    const char *to_float;     /* "bf16", "f16" or "f32": a quantized Hugging Face checkpoint back to
                                 the unquantized layout in that dtype (f NULL; hf_dequant.c) */
    const char *skip, *only;  /* POSIX extended regexes over tensor names, or NULL */
    const struct qd_name_filter *filter; /* skip and only compiled already (NULL: compiled here) */
    uint64_t max_header_bytes; /* a safetensors file's header (0: safetensors' own 100 MB) */
    const struct qd_gguf_options *gguf; /* GGUF: llama-quantize's options (gguf_options.h); NULL:
                                 none */
    const char *recipe;       /* GGUF: a llama-quantize mix (Q4_K_M ...) choosing each tensor's
                                 type, f its default type (qd_convert sets f); NULL: f for all */
    int report_error;         /* NMSE per quantized tensor (costs a dequantize on the CPU) */
    uint64_t piece_bytes;     /* GGUF: a processed tensor goes through the pipeline in pieces of
                                 whole rows of at most this many input bytes (0: 32 MiB), so its
                                 buffers do not scale with the largest tensor */
    struct qd_backend *backend;
    void *worker;
    /* Several workers (three streams on each device of --devices): the pipeline quantizes that
     * many tensors at once, lane L through workers[L]; 0 or 1: worker alone. One lane still
     * where a tensor's NMSE is reported or the AutoAWQ layout transposes through its one
     * staging buffer. */
    void *workers[QD_MAX_DEVICES];
    int nworkers;
    void (*progress)(void *ctx, const struct qd_convert_event *ev);
    void *progress_ctx;
    const volatile int *cancel; /* nonzero: stop, remove the partial output */
    int overwrite;            /* an existing destination may be replaced (--force; "overwrite") */
    const char *root;         /* a service's --data-dir (a real path): every input file opened
                                 must lie inside it, whatever links lead there; NULL: anywhere */
    int one_file;             /* the input is one uploaded file (POST /convert): a split model's
                                 first shard is refused (its others cannot come with it) */
};

/* Each pipeline stage's busy time (the stages overlap, so they add up to more than the wall). */
struct qd_stage_seconds {
    double read_s, process_s, write_s;
};

struct qd_convert_summary {
    int quantized, copied, cast;
    int dry_run;         /* GGUF --dry-run: nothing written; bytes_out is what the file would hold */
    uint64_t bytes_in, bytes_out;
    uint64_t params_quantized, params_total;
    double seconds;
    struct qd_stage_seconds stages;
    char *layout_config; /* the runtime's config as JSON text (transformers' quantization_config),
                            or NULL; the caller frees it */
    /* Hugging Face layouts: config.json's model_type ("" without one) and which rule chose the
     * weights to quantize: "table" (server/checkpoint/arch.h), or "generic" with rule_why saying
     * why (a model type the table lacks, no rule for this layout, a single file without
     * config.json; or how many weights the table's entry does not list). NULL rule otherwise. */
    char arch[64];
    const char *rule;
    char rule_why[256];
    /* GGUF with an importance matrix (--imatrix): its name as given (NULL: none), its entries
     * left after --include-weights / --exclude-weights, and of the tensors quantized how many
     * found their entry and how many did not, the first of those named. */
    const char *imatrix;
    int imatrix_entries, imatrix_covered, imatrix_missing;
    char imatrix_first_missing[128];
};

/* ---- the dispatch: the layout table, the check, the run (convert_layouts.c) ----------------- */

/* The format a conversion writes for a format name's entry: f itself, but int8, which as a
 * checkpoint layout names llm-compressor's W8A16 (the w8a16 format, what its preset writes);
 * NULL stays NULL. */
const struct qd_format *qd_convert_format(const struct qd_format *f);

/* Converts o->src into o->dst for o->f; which container and layout follow from the input and
 * the format (GGUF in and a GGML block format: llama.cpp's GGUF). 0, or -1 with a message;
 * *status says which kind of failure (QD_EINVAL bad input/request, QD_ENOMEM, QD_EDEVICE,
 * QD_ECANCELED ...). */
int qd_convert(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status, char *err,
               size_t errlen);

/* ---- names, inputs and destinations: what can be checked before converting anything ------- */

/* A format by name for a conversion, in any case ("Q4_0", "NF4"), int8 as qd_convert_format
 * maps it; NULL when there is none. */
const struct qd_format *qd_convert_format_named(const char *name);
/* "bf16", "f16" or "f32" for that name in any case (back to float: qd_convert_opts.to_float);
 * NULL for another. */
const char *qd_convert_to_float_named(const char *name);
/* The back-to-float row's check of the input's config.json (hf_dequant.c). */
int qd_convert_hf_dequant_check(const char *src, enum qd_convert_input in, char *err, size_t errlen);
/* A llama-quantize mix by name, in any case ("q4_k_m"); NULL when there is none. */
const struct qd_gguf_recipe *qd_convert_recipe_named(const char *name);


/* Decides, before anything is converted, whether o can run: the format has a layout, the input
 * is what that layout reads (with a pointer to what does read it when not: llama.cpp's
 * convert_hf_to_gguf.py, another format), and the destination can take the output: its
 * directory exists, its name fits with the temporary suffix, it is not the input, and what is
 * there is replaced only with o->overwrite (an existing directory, empty or with overwrite,
 * receives the files; a directory is never removed). 0, or -1 with *status (QD_EINVAL,
 * QD_ENOTFOUND) and a message naming o's paths; d->conflict tells a refused overwrite. */
int qd_convert_check(const struct qd_convert_opts *o, struct qd_convert_dest *d, enum qd_status *status, char *err,
                     size_t errlen);
/* The formats a conversion writes from an input kind, space-separated, from the layout table
 * and the registry (GGUF, safetensors/directory). */
const char *qd_convert_formats_from(enum qd_convert_input in);
/* Every layout, one line each: its formats, what it reads and what it writes (--help). */
const char *qd_convert_layouts_text(void);

/* ---- for targets (files: convert_files.h; the pipeline and its lanes: pipeline.h) ----------- */

/* Name selection: whether a tensor the target's rule would quantize stays quantized under
 * --skip / --only. Each pattern at most QD_NAME_FILTER_MAX_BYTES long, at most
 * QD_NAME_FILTER_MAX_SIZE atoms once its repetitions are written out (name_filter.c), without
 * back-references; NULL with the reason in err otherwise. The filter may be shared by threads. */
#define QD_NAME_FILTER_MAX_BYTES 256
#define QD_NAME_FILTER_MAX_SIZE 512
struct qd_name_filter;
struct qd_name_filter *qd_name_filter_new(const char *skip, const char *only, char *err, size_t errlen);
/* A filter keeping the names pattern re matches, bounded as --only is, its refusals naming
 * option (--tensor-type) and the pattern as the user wrote it (shown; NULL: re). */
struct qd_name_filter *qd_name_filter_pattern(const char *option, const char *shown, const char *re, char *err,
                                              size_t errlen);
int qd_name_filter_keeps(const struct qd_name_filter *nf, const char *name);
void qd_name_filter_free(struct qd_name_filter *nf);

/* Spreads a conversion over the backend's devices and streams: workers[0] is o->worker, then a
 * worker on each other healthy device slot, then a second stream's worker on every one (a CPU
 * backend, which has no devices, gets none). Returns how many devices were left out (their
 * first worker would not open; err says why); qd_convert_unspread closes the workers it
 * opened. */
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

/* A Hugging Face model directory -> what mlx_lm.convert -q writes (mlx_convert.c), and the check
 * made before converting: a directory with a tokenizer and a model type mlx_convert.c knows
 * (0, or -1 with the reason). */
int qd_convert_mlx(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status,
                   char *err, size_t errlen);
int qd_convert_mlx_check(const char *src, enum qd_convert_input in, char *err, size_t errlen);

#endif
