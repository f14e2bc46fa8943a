/* llama-quantize's per-tensor and file options for a GGUF conversion, under its own names and
 * with its semantics (llama.cpp tools/quantize/quantize.cpp and src/llama-quant.cpp, as vendored
 * in llama-cpp-python 0.3.36). One table of options serves the CLI (--NAME VALUE), the /convert
 * query (NAME=VALUE, '-' or '_') and conversion jobs (a JSON member): each caller hands the
 * option's name and text to qd_gguf_option_set. */
#ifndef QD_GGUF_OPTIONS_H
#define QD_GGUF_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/gguf.h"

#define QD_GGUF_TYPE_NONE QD_GGML_TYPE_COUNT /* an option left unset */
#define QD_GGUF_MAX_TENSOR_TYPES 256
#define QD_GGUF_MAX_KV_OVERRIDES 64
#define QD_GGUF_MAX_PRUNE 512
#define QD_GGUF_MAX_WEIGHT_NAMES 64

struct qd_name_filter;

/* --tensor-type PATTERN=TYPE: the first pattern (in the order given) that a name matches
 * anywhere sets its type. */
struct qd_gguf_tensor_type {
    char *pattern;                /* as given, lowercased as llama-quantize lowercases it */
    struct qd_name_filter *match; /* the pattern compiled */
    uint32_t type;                /* ggml type id */
};

/* --override-kv KEY=TYPE:VALUE (llama.cpp common's string_parse_kv_override). */
enum qd_gguf_kv_tag { QD_KVO_INT, QD_KVO_FLOAT, QD_KVO_BOOL, QD_KVO_STR };
struct qd_gguf_kv_override {
    char key[128];
    enum qd_gguf_kv_tag tag;
    int64_t i;
    double f;
    int b;
    char s[128];
};

struct qd_gguf_options {
    int pure;                 /* --pure: the mix's default type for every tensor */
    int leave_output_tensor;  /* --leave-output-tensor: output.weight copied as it is */
    int allow_requantize;     /* --allow-requantize */
    int dry_run;              /* --dry-run: each tensor's type and the sizes, no file */
    uint32_t output_tensor_type, token_embedding_type; /* QD_GGUF_TYPE_NONE: the mix decides */
    struct qd_gguf_tensor_type tensor_types[QD_GGUF_MAX_TENSOR_TYPES];
    int n_tensor_types;
    struct qd_gguf_kv_override kv_overrides[QD_GGUF_MAX_KV_OVERRIDES];
    int n_kv_overrides;
    int prune[QD_GGUF_MAX_PRUNE]; /* --prune-layers, sorted, unique */
    int n_prune;
    char *imatrix;                /* --imatrix FILE, as given (general metadata records it so) */
    char *imatrix_path;           /* where to open it (a job's: resolved in its data directory);
                                     NULL: imatrix */
    char *include_weights[QD_GGUF_MAX_WEIGHT_NAMES], *exclude_weights[QD_GGUF_MAX_WEIGHT_NAMES];
    int n_include, n_exclude;     /* --include-weights / --exclude-weights NAME: substrings */
    int split_max_tensors;        /* gguf-split --split-max-tensors N (0: no split by count) */
    uint64_t split_max_bytes;     /* gguf-split --split-max-size N(M|G), decimal units (0: none) */
    int keep_split;               /* --keep-split: a split input's shards, each its own file */
    int imatrix_uncovered_ok;     /* not an option: an importance matrix with no entry for any
                                     tensor quantized is converted without it, as llama-quantize
                                     does (quantd llama-quantize), not refused (quantd convert) */
    int n_set;                    /* options given: any says the output is a GGUF */
};

void qd_gguf_options_init(struct qd_gguf_options *o);
void qd_gguf_options_free(struct qd_gguf_options *o);

/* Whether name (without "--"; '_' stands for '-') is one of these options, and whether it
 * takes a value (the flags do not on the command line; over HTTP they take true/false). */
int qd_gguf_option_known(const char *name, int *takes_value);
/* Sets option name from text (NULL for a flag on the command line). Repeatable options
 * (tensor-type, tensor-type-file, override-kv) append. 0, or -1 with a message naming the
 * option, the value and what it takes. */
int qd_gguf_option_set(struct qd_gguf_options *o, const char *name, const char *value, char *err, size_t errlen);
/* The option names, space-separated, as --NAME (for messages and help). */
const char *qd_gguf_option_names(void);

/* A ggml type by name as llama-quantize's parse_ggml_type takes it (any case: "q8_0", "Q6_K",
 * "f16"); QD_GGUF_TYPE_NONE when there is none. */
uint32_t qd_gguf_type_parse(const char *name);

#endif
