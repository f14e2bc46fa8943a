/* The format registry: one table entry per quantization format (kernels/registry.c).
 *
 * Everything that dispatches on a format — the CLI, the service, /formats, the tests — reads
 * this table; nothing else holds a switch over formats. A format entry names its geometry,
 * its parameters, a function that lays out its output components for an input shape, and its
 * backend entry points. */
#ifndef QD_REGISTRY_H
#define QD_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA files include this too */
extern "C" {
#endif

enum qd_status {
    QD_OK = 0,
    QD_EINVAL,     /* bad argument: unknown name, bad value */
    QD_ESHAPE,     /* shape the format cannot take */
    QD_ENONFINITE, /* NaN/Inf in the input */
    QD_ENOMEM,
    QD_EBUSY,      /* queue full */
    QD_EDEVICE,    /* accelerator error */
    QD_EIO,        /* file or stream error */
    QD_ENOTFOUND,
    QD_ECANCELED,  /* stopped on request (a cancelled conversion) */
    QD_EFORBIDDEN, /* a path outside what the service may touch (--data-dir) */
    QD_ENOSPC,     /* the disk, a quota or the file-size limit takes no more bytes */
};

const char *qd_strerror(enum qd_status s);

enum qd_dtype { QD_F32, QD_F16, QD_BF16, QD_U8, QD_I8, QD_I32, QD_U32, QD_DTYPE_COUNT };

const char *qd_dtype_name(enum qd_dtype t);
int qd_dtype_parse(const char *name, enum qd_dtype *out); /* 0 on success */
size_t qd_dtype_size(enum qd_dtype t);
static inline int qd_dtype_is_float_input(enum qd_dtype t) { return t <= QD_BF16; }

#define QD_MAX_DIMS 8

/* A dense row-major tensor seen as rows x cols (N-D flattened to rows x last dim). */
struct qd_tensor {
    void *data;
    enum qd_dtype dtype;
    int ndim;
    int64_t shape[QD_MAX_DIMS];
    int64_t rows, cols; /* derived: rows = prod(shape[:-1]) (1 for 1-D), cols = shape[-1] */
};

int64_t qd_tensor_numel(const struct qd_tensor *t);
/* Sets ndim/shape and the derived rows/cols; QD_ESHAPE if a dim is < 1 or the count overflows. */
enum qd_status qd_tensor_set_shape(struct qd_tensor *t, int ndim, const int64_t *shape);
/* Parses "R,C" or "N" or "A,B,C"; returns QD_ESHAPE with a message in err. */
enum qd_status qd_shape_parse(const char *text, int *ndim, int64_t *shape, char *err, size_t errlen);

/* All parameters of all formats, resolved. A format lists the ones it accepts in its entry;
 * the rest keep their defaults and are ignored. */
enum qd_scale_layout { QD_LAYOUT_LINEAR, QD_LAYOUT_SWIZZLED };
enum qd_scale_rounding { QD_ROUND_FLOOR, QD_ROUND_RCEIL, QD_ROUND_EVEN };
/* Whose arithmetic: nvfp4 takes torchao's nvfp4_quantize or llm-compressor's NVFP4A16 observer
 * and compressed-tensors' compressor (kernels/mx.h); fp8_e4m3 takes compressed-tensors' (the
 * weight's dtype) or transformers' FineGrainedFP8 (f32, inverse scales: kernels/fp8.h). */
enum qd_nvfp4_flow { QD_FLOW_TORCHAO, QD_FLOW_COMPRESSED_TENSORS, QD_FLOW_TRANSFORMERS };
/* int8/uint8 take tensor or row; fp8_e4m3 tensor, channel (one scale per row) or block */
enum qd_granularity { QD_GRAN_TENSOR, QD_GRAN_ROW, QD_GRAN_CHANNEL, QD_GRAN_BLOCK };
enum qd_fp6_packing { QD_FP6_PACKED, QD_FP6_UNPACKED };
/* w4a16: the dtype its scales (and arithmetic) take; AUTO resolves to the weight's at quantize */
enum qd_scale_dtype { QD_SCALE_AUTO, QD_SCALE_F32, QD_SCALE_F16, QD_SCALE_BF16 };

struct qd_params {
    int blocksize;        /* bnb */
    int double_quant;     /* bnb */
    int has_offset;       /* bnb: offset given or computed */
    float offset;
    int group_size;       /* awq, w4a16, mlx_affine */
    int bits;             /* mlx_affine */
    int symmetric;        /* w4a16: no zero point */
    int scale_dtype;      /* w4a16, mlx_affine: enum qd_scale_dtype */
    int has_global_scale; /* nvfp4: given or computed */
    float global_scale;   /* encode scale, TensorRT-LLM convention: 448*6/amax = 1/per_tensor_scale */
    int has_per_tensor_scale;
    float per_tensor_scale; /* torchao's decode scale: amax/(448*6) */
    int two_level;          /* nvfp4 */
    int flow;               /* nvfp4: enum qd_nvfp4_flow */
    int scale_layout;       /* enum qd_scale_layout */
    int scale_rounding;     /* enum qd_scale_rounding */
    int granularity;        /* enum qd_granularity */
    int fp6_packing;        /* enum qd_fp6_packing */
    int block_rows, block_cols; /* fp8_e4m3 granularity=block: rows x cols of one scale's block */
    int allow_nonfinite;
    /* Not parameters: qd_format_layout sets these in the copy it hands a layout function (they
     * stay 0 elsewhere): the laid-out tensor's dtype (the weight's, or the output's when
     * dequantizing: scale_dtype=auto follows it) and the rows of one of its matrices (shape[-2],
     * 1 for 1-D; fp8 blocks do not cross matrices). */
    int layout_dtype;
    int64_t layout_matrix_rows;
    /* Not a parameter either: an importance vector, ggml's quant_weights (llama.cpp's importance
     * matrix, one entry of an imatrix file): importance_n f32 values in host memory on every
     * backend, NULL for none. cols x k values: k vectors of one per column, for k equal runs of
     * consecutive rows (k divides rows). k = 1: one vector shared by every row; k = the experts
     * of a MoE tensor ([E, R, C], or flattened to [E*R, C]): one per expert, as llama-quantize
     * hands them out. Values finite and >= 0. Only formats whose entry sets importance for the
     * backend read it; qd_quantize refuses it elsewhere (qd_importance_check). */
    const float *importance;
    int64_t importance_n;
};

/* The rows that share one importance vector (rows / k; rows when there is one vector). */
static inline int64_t qd_importance_run(const struct qd_params *p, const struct qd_tensor *in)
{
    return in->rows / (p->importance_n / in->cols);
}

/* The importance vector of row `row` of in (cols values), or NULL when p has none. */
static inline const float *qd_importance_row(const struct qd_params *p, const struct qd_tensor *in, int64_t row)
{
    if (!p->importance)
        return NULL;
    return p->importance + row / qd_importance_run(p, in) * in->cols;
}

/* QD_PARAM_BLOCK: "RxC", two ints (rows, then cols at the next int) in [min, max] */
enum qd_param_kind { QD_PARAM_INT, QD_PARAM_BOOL, QD_PARAM_FLOAT, QD_PARAM_ENUM, QD_PARAM_BLOCK };

struct qd_param_desc {
    const char *name;
    enum qd_param_kind kind;
    size_t offset;         /* into struct qd_params */
    size_t has_offset;     /* QD_PARAM_FLOAT: the has_ flag (optional value), else 0 */
    const char *deflt;     /* default as text, NULL for "computed when absent" */
    int64_t min, max;      /* QD_PARAM_INT */
    int pow2;              /* QD_PARAM_INT: must be a power of two */
    const char *const *choices; /* QD_PARAM_ENUM: NULL-terminated names, index = value */
    const char *doc;
};

#define QD_MAX_COMPONENTS 6
#define QD_MAX_PARAMS 8

struct qd_component {
    const char *name;
    enum qd_dtype dtype;
    int ndim;
    int64_t shape[2];
    int64_t bytes;
    int in_scale_dtype; /* its dtype is the resolved scale_dtype (the input's when auto):
                           qd_format_layout sets dtype and bytes */
};

struct qd_format;

/* Backend entry points. quantize reads `in` and writes each component into out[i], buffers of
 * the sizes qd_format_layout gave; it may resolve computed params (offset, global scale).
 * dequantize reads the components and writes `out` (rows x cols of out->dtype). */
typedef enum qd_status (*qd_quantize_fn)(const struct qd_format *f, const struct qd_tensor *in,
                                         struct qd_params *p, void *const *out);
typedef enum qd_status (*qd_dequantize_fn)(const struct qd_format *f, const void *const *in,
                                           const struct qd_params *p, struct qd_tensor *out);

struct qd_backend_fns {
    qd_quantize_fn quantize;
    qd_dequantize_fn dequantize;
};

enum qd_backend_kind { QD_BACKEND_CPU, QD_BACKEND_CUDA, QD_BACKEND_COUNT };

struct qd_format {
    const char *name;
    const char *family;      /* source file family: bnb4, ggml, awq, mx, nvfp4, int8, fp8, ... */
    const char *doc;
    int block_elems;         /* elements per block along the blocked dim (0: whole tensor/row) */
    int block_bytes;         /* packed bytes per block where fixed (ggml structs), else 0 */
    int gguf_type;           /* ggml type id in GGUF files (ggml.h enum ggml_type), 0: none */
    int gguf_file_type;      /* llama.cpp general.file_type (llama_ftype MOSTLY_*), 0: none */
    const char *block_axis;  /* "flat", "last", "rows" */
    double bits_per_weight;  /* at default params */
    int code;                /* format-specific selector (element type, ggml type, ...) */
    const char *const *params; /* NULL-terminated names of accepted params */
    const char *const *param_defaults; /* NULL-terminated "name=value": the format's own defaults */
    /* Fills comps for an input of rows x cols (cols = last dim; flat formats use rows*cols);
     * returns the count, or -1 with err set when the shape or params do not fit. */
    int (*layout)(const struct qd_format *f, const struct qd_params *p, int64_t rows, int64_t cols,
                  struct qd_component *comps, char *err, size_t errlen);
    struct qd_backend_fns backend[QD_BACKEND_COUNT];
    /* The dtype dequantize gives when the caller names none, from the input's (NULL: that one). */
    enum qd_dtype (*dequant_dtype)(const struct qd_params *p, enum qd_dtype in);
    /* Backends whose quantizer reads p->importance, a bit (QD_IMPORTANCE_ON) per backend; 0: the
     * format takes no importance. */
    unsigned importance;
    /* quantizing needs an importance (ggml_quantize_requires_imatrix: ggml asserts without one) */
    int importance_required;
    int matrix_only;         /* takes a 2-D weight only (awq: its layout is of W [K, N]) */
    /* The format a checkpoint conversion writes when asked for this one (NULL: itself): int8
     * names llm-compressor's W8A16 layout there. */
    const char *checkpoint_as;
};

#define QD_IMPORTANCE_ON(b) (1u << (b))

extern const struct qd_format qd_formats[];
extern const int qd_format_count;
extern const struct qd_param_desc qd_param_descs[];
extern const int qd_param_desc_count;

const struct qd_format *qd_format_find(const char *name);
const struct qd_param_desc *qd_param_find(const char *name);
int qd_format_accepts(const struct qd_format *f, const char *param);

/* Defaults for every parameter, with the format's own where it has them. */
void qd_params_default(const struct qd_format *f, struct qd_params *p);
/* Sets one parameter from text ("true", "64", "swizzled"); QD_EINVAL with a message naming the
 * parameter and what it accepts. */
enum qd_status qd_params_set(const struct qd_format *f, struct qd_params *p, const char *key,
                             const char *value, char *err, size_t errlen);
/* Writes the resolved value of a parameter as text; returns 0 when it is unset (optional). */
int qd_params_get(const struct qd_params *p, const struct qd_param_desc *d, char *buf, size_t len);

/* A format's own default for a parameter, or NULL to use the parameter's. */
const char *qd_format_param_default(const struct qd_format *f, const char *param);

/* The output dtype of a dequantize that names none (the input's, unless the format says). */
enum qd_dtype qd_format_dequant_dtype(const struct qd_format *f, const struct qd_params *p, enum qd_dtype in);

/* Layout for an input shape; returns the component count or -1 with err. */
int qd_format_layout(const struct qd_format *f, const struct qd_params *p,
                     const struct qd_tensor *in, struct qd_component *comps, char *err,
                     size_t errlen);

/* The registry as JSON text (malloc'd, caller frees). */
char *qd_registry_json(void);

#ifdef __cplusplus
}
#endif

#endif
