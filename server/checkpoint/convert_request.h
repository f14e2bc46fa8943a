/* One conversion request, whatever carried it: `quantd convert`'s and `quantd llama-quantize`'s
 * command lines, POST /convert's query and a conversion job's JSON body each hand over the same
 * (key, value) texts, and qd_convert_resolve turns them into the conversion's options under one
 * set of rules with one set of messages: names in any case, llama-quantize's numeric ids for
 * its mixes, the format's parameters, --skip / --only and llama-quantize's options
 * (gguf_options.h). Paths (the input, the output, confinement to a data directory) stay with
 * the callers. And the summary a finished conversion reports, as JSON, for all of them. */
#ifndef QD_CONVERT_REQUEST_H
#define QD_CONVERT_REQUEST_H

#include <stddef.h>

#include "checkpoint/convert.h"
#include "checkpoint/gguf_options.h"

struct cJSON;

/* One item of a request. key: "fmt", "recipe", "skip", "only", "param" (value "k=v", the
 * command line's --param), one of llama-quantize's options (without "--"; '-' or '_'), or else
 * a format parameter's name (value its text: the query's k=v). value NULL: a flag given bare
 * (--pure, ?pure), or a value missing. Later items win over earlier ones (the repeatable
 * llama-quantize options append). */
struct qd_convert_arg {
    const char *key, *value;
};

/* What a request resolves to. */
struct qd_convert_spec {
    const struct qd_format *f; /* the format quantized to (a mix's default type); NULL when
                                  nothing is quantized (back to float, a float mix, COPY) */
    const char *to_float;      /* "bf16", "f16" or "f32": a quantized Hugging Face model back to float */
    const char *recipe;        /* a llama-quantize mix as llama-quantize spells it, or NULL */
    struct qd_params params;   /* f's, the defaults and the request's */
    char *skip, *only;         /* the name filters' patterns, or NULL */
    struct qd_name_filter *filter; /* skip and only compiled */
    struct qd_gguf_options gguf;   /* llama-quantize's options (n_set 0: none given) */
    const char *code;          /* after a refusal: what was wrong, in the words of the API's error
                                  codes (unknown_format, unknown_recipe, missing_format,
                                  unknown_param, bad_param, bad_request, out_of_memory) */
};

/* A new, empty spec (large: llama-quantize's option tables), or NULL without memory. */
struct qd_convert_spec *qd_convert_spec_new(void);
void qd_convert_spec_free(struct qd_convert_spec *s);

/* Resolves args[0..n) into s (new, resolved once). QD_OK, or QD_EINVAL (QD_ENOMEM) with s->code
 * and one message in err naming the item, the value and what it takes, with the options spelled
 * as the command line spells them (--fmt, --recipe, --param, --tensor-type ...); a name of the
 * other kind (a mix given as a format, a format as a mix) says which to use. */
enum qd_status qd_convert_resolve(struct qd_convert_spec *s, const struct qd_convert_arg *args, int n, char *err,
                                  size_t errlen);

/* Sets o's request fields from s (f, to_float, params, skip, only, filter, recipe, gguf): the
 * spec must outlive the conversion. */
void qd_convert_spec_opts(const struct qd_convert_spec *s, struct qd_convert_opts *o);

/* What the conversion writes, as its summary's fmt names it: the format, the dtype back to
 * float, or the mix that quantizes nothing (F16, BF16, F32, COPY). */
const char *qd_convert_spec_fmt(const struct qd_convert_spec *s);

/* The summary of a finished conversion of s on backend ("cpu", "cuda:0"), as every caller
 * reports it: recipe, pure, dry_run, fmt, backend, quantized, copied, cast_f16, bytes_in,
 * bytes_out, bits_per_weight, seconds, gb_per_s, read_s, quantize_s, write_s, the Hugging Face
 * layouts' arch, rule and rule_why, and with an importance matrix imatrix, imatrix_entries and
 * imatrix_covered. The caller adds what only it has and frees the object. */
struct cJSON *qd_convert_summary_json(const struct qd_convert_spec *s, const struct qd_convert_summary *sum,
                                      const char *backend);

/* The line that says how much of the quantized tensors an importance matrix covered, when it
 * left some without an entry: "the importance matrix m.imatrix covered 154 of the 155 quantized
 * tensors (none for token_embd.weight): ..."; "" when none was given or it covered all. */
void qd_convert_imatrix_note(const struct qd_convert_summary *sum, char *out, size_t len);

#endif
