/* A Hugging Face output layout (hf_convert.c runs them): what one tool's saved checkpoint looks
 * like, as data and a few hooks. hf_convert.c plans every shard from its header, asks the layout
 * how to name and shape each quantized weight's tensors and what follows them, writes the shards
 * through the pipeline, then config.json with the layout's quantization_config and keys.
 *
 * Adding a layout: one file (hf_<tool>.c) defining a `const struct qd_hf_layout_desc` with these
 * fields (declared on the extern line below), and one row naming it in the layout table (layouts[]
 * in convert_layouts.c), which says which formats it writes. A layout that needs what no field
 * says adds an optional field or hook here, NULL/0 for the others. */
#ifndef QD_HF_LAYOUT_H
#define QD_HF_LAYOUT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "checkpoint/arch.h"
#include "checkpoint/convert.h"
#include "checkpoint/safetensors.h"

/* What a tool does to a float tensor it does not quantize, element by element (through the
 * pipeline in pieces): */
enum qd_hf_elementwise {
    QD_EW_NONE,
    QD_EW_F16,         /* AutoAWQ's half model: torch's .half() */
    QD_EW_F32,         /* transformers' _keep_in_fp32_modules: .float() (exact) */
    QD_EW_OFFSET_NORM, /* llm-compressor's offset-norm round trip (Gemma's 1 + w norms, which its
                          oneshot turns into w' = dtype(1 + w) and back): dtype(dtype(1 + w) - 1) */
};

/* One tensor of the output. */
struct qd_hf_out {
    char *name;
    const char *dtype;
    int ndim;
    int64_t shape[2];
    uint64_t bytes;
    const struct qd_st_entry *src;
    int quantize;      /* 1: the first of a quantized weight's tensors (the rest follow it) */
    int trailer;       /* 1: the tensor after a weight's components (bnb's quant_state JSON,
                          compressed-tensors' weight_shape), written with them */
    enum qd_hf_elementwise ew; /* a tensor not quantized, transformed element by element */
    int generic;       /* 1: the generic rule decided this tensor */
    int has_gs;        /* nvfp4: the global scale its fused group (q/k/v, gate/up) shares */
    float gs;
    int has_amax;      /* nvfp4: a fused group member's largest |x|, read before the pass */
    float amax;
    const struct qd_st_entry *scale; /* back to float (hf_dequant.c): the weight's scale tensor */
    int block[2];      /* back to float: rows and columns one scale covers */
    int scale_cast;    /* back to float: the scale is cast to the output dtype before the product
                          (compressed-tensors' decompress in a model of that dtype) */
    int packed_bits;   /* back to float: codes packed densely in int32 words (pack-quantized: 4, 8);
                          -1 NVFP4, -2 MXFP4 (two e2m1 a byte; gs: NVFP4's global scale); 0: one
                          byte each */
    const struct qd_st_entry *zero; /* back to float: the zero points (compressed-tensors'
                          weight_zero_point, packed along rows; AutoAWQ's qzeros) */
    const struct qd_st_entry *nested[2]; /* back to float, bitsandbytes double quant: nested_absmax,
                          nested_quant_map (the absmax codes' own scale and map) */
    float offset;      /* back to float, bitsandbytes double quant: nested_offset */
    int blocksize;     /* back to float, bitsandbytes: elements per absmax (of the flat weight) */
    int nf4;           /* back to float, bitsandbytes: nf4 (1) or fp4 (0) codes */
    enum qd_dtype mid; /* back to float: the dtype the peer dequantizes into before the cast to
                          dtype (bitsandbytes' quant_state dtype, AutoAWQ's f16) */
    /* back to float: the source family's arithmetic (NULL: hf_dequant.c's own), from the
       weight's source bytes in into rows [r0, r1) of out (dtype, shape); called for spans of
       rows on several threads at once; 0, or -1 */
    int (*dequant)(const struct qd_hf_out *t, const void *in, void *out, int64_t r0, int64_t r1);
    uint64_t qbytes;   /* that weight's components, back to back */
};

/* One input shard and its plan. */
struct qd_hf_shard {
    char *in_path, *out_name;
    struct qd_mapped m;
    struct qd_st_file st;
    struct qd_hf_out *t;
    int n;
    int dropped;            /* back to float: input tensors read with their weight (scales, zero
                               points), which have no output and no progress event of their own */
    uint64_t dropped_bytes;
};

/* A top-level key of config.json the layout's tool sets. */
struct qd_hf_config_key {
    const char *key, *json;
    int if_present; /* set only where the source has the key */
};
#define QD_HF_MAX_CONFIG_KEYS 3

struct qd_hf_layout_desc {
    const char *tool;          /* the tool, as the summary names it ("AutoAWQ") */
    enum qd_hf_layout arch;    /* its column of the architecture table (arch.h) */
    /* How a tool treats what it does not quantize: cast every float tensor to f16 (AutoAWQ saves
     * its half model). */
    int cast_f16;
    /* The tool quantizes W^T ([in, out], AutoAWQ): the weight is transposed through one staging
     * buffer before the kernel, so the pipeline runs one lane. */
    int transpose;
    /* config.json: ends with a newline (transformers' save_pretrained; not json.dump), and the
     * keys the tool sets beside quantization_config. */
    int config_newline;
    const struct qd_hf_config_key *config_keys;
    int nconfig_keys;
    /* Fixes the params the layout's arithmetic requires (NULL: none). */
    void (*prepare)(struct qd_convert_opts *o);
    /* Names, dtype and shape of a quantized weight t's component k (c, as qd_format_layout gave
     * it; *out has src, bytes and quantize set already): out->name a new string. */
    void (*component)(const struct qd_convert_opts *o, const struct qd_st_entry *t, const struct qd_component *c,
                      int k, struct qd_hf_out *out);
    /* The tensor after a weight's components (p: the params as planned), or NULL: fills *out
     * (name a new string, bytes) and returns 1, or 0 for none. */
    int (*trailer)(const struct qd_convert_opts *o, const struct qd_st_entry *t, const struct qd_params *p,
                   struct qd_hf_out *out);
    /* Writes the trailer's bytes (`bytes` of them) at out after the weight is quantized with p. */
    enum qd_status (*fill_trailer)(const struct qd_convert_opts *o, const struct qd_st_entry *t,
                                   const struct qd_params *p, void *out, uint64_t bytes, char *err, size_t errlen);
    /* A pass over the plan before any tensor is written (NULL: none); -1 without memory. */
    int (*prepass)(struct qd_hf_shard *sh, int nshards);
    /* The tool does not touch Gemma's offset norms (the architecture column's offset_norm is
     * llm-compressor's round trip). */
    int plain_norms;
    /* One more top-level key of config.json the tool sets from the source's (NULL, or NULL
     * returned: none): a new cJSON value, its name in *key. */
    cJSON *(*config_extra)(const cJSON *config, const char **key);
    /* The layout the format's params choose among the table row's (NULL: this one), or NULL with
     * why: a scheme quantd cannot write, refused before anything is converted. */
    const struct qd_hf_layout_desc *(*pick)(const struct qd_format *f, const struct qd_params *p, char *err,
                                            size_t errlen);
    /* quantization_config (a new cJSON object, NULL without memory); compute_dtype is the torch
     * name of the first quantized weight's dtype. */
    cJSON *(*quantization_config)(const struct qd_convert_opts *o, const struct qd_arch_rules *rules,
                                  const struct qd_hf_shard *sh, int nshards, const char *compute_dtype);
    /* Back to float (hf_dequant.c): the input is a quantized checkpoint, and the layout decides
     * each tensor itself instead of the architecture table and the format. plan_tensor says what
     * becomes of sh->st.t[i]: 0 copied, 1 converted (*out filled: name a new string, dtype, shape,
     * bytes, and what process needs), 2 dropped (a scale), -1 refused with err. process turns
     * that tensor's source bytes into out. config.json loses quantization_config. */
    int (*plan_tensor)(const struct qd_convert_opts *o, const cJSON *config, const struct qd_hf_shard *sh, int i,
                       struct qd_hf_out *out, char *err, size_t errlen);
    enum qd_status (*process)(const struct qd_hf_out *t, const void *in, void *out, char *err, size_t errlen);
};

extern const struct qd_hf_layout_desc qd_hf_bnb, qd_hf_ct_int, qd_hf_ct_nvfp4, qd_hf_ct_mxfp4, qd_hf_awq;
extern const struct qd_hf_layout_desc qd_hf_ct_fp8, qd_hf_fp8_transformers;
extern const struct qd_hf_layout_desc qd_hf_dequant_bf16, qd_hf_dequant_f16, qd_hf_dequant_f32;

/* Runs the conversion into layout l (hf_convert.c). */
int qd_convert_hf(const struct qd_hf_layout_desc *l, const struct qd_convert_opts *o, struct qd_convert_summary *s,
                  enum qd_status *status, char *err, size_t errlen);

/* ---- for layouts --------------------------------------------------------------------------- */

/* str(torch dtype) less "torch." for a safetensors float dtype name */
const char *qd_hf_torch_dtype(const char *st);
enum qd_dtype qd_hf_st_to_dtype(const char *st);
const char *qd_hf_dtype_to_st(enum qd_dtype d);
/* a, sep and b in a new string */
char *qd_hf_concat(const char *a, const char *sep, const char *b);
/* <m>.weight -> <m><suffix> (the names that replace the weight) */
char *qd_hf_module_name(const char *weight, const char *suffix);
/* A component named <m>.<quantd's name> in place of <m>.weight, 2-D as quantd lays it out
 * (AutoAWQ's qweight/qzeros/scales, compressed-tensors' integer weight_packed/...). */
void qd_hf_module_component(const struct qd_convert_opts *o, const struct qd_st_entry *t,
                            const struct qd_component *c, int k, struct qd_hf_out *out);
/* compressed-tensors' "ignore" for the model's tensors (qd_arch_ignore_list) */
cJSON *qd_hf_ct_ignore(const struct qd_arch_rules *rules, const struct qd_hf_shard *sh, int nshards);
/* quantization_config's closing members, after config_groups (hf_ct.c) */
cJSON *qd_hf_ct_config_close(cJSON *q, const char *format, cJSON *ignore);

#endif
