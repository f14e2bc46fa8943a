/* The layout table and the dispatch (convert.h): which target writes a format, what it reads,
 * whether a conversion can run (checked before anything is converted), and the run. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "checkpoint/convert.h"
#include "checkpoint/gguf_options.h"
#include "checkpoint/gguf_recipe.h"
#include "checkpoint/hf_layout.h"

const struct qd_format *qd_convert_format(const struct qd_format *f)
{
    return f && f->checkpoint_as ? qd_format_find(f->checkpoint_as) : f;
}

const struct qd_format *qd_convert_format_named(const char *name)
{
    for (int i = 0; name && i < qd_format_count; i++)
        if (!strcasecmp(qd_formats[i].name, name))
            return qd_convert_format(&qd_formats[i]);
    return NULL;
}

const struct qd_gguf_recipe *qd_convert_recipe_named(const char *name)
{
    const struct qd_gguf_recipe *r = qd_gguf_recipe_find(name);
    char upper[16];
    size_t n = name ? strlen(name) : 0;
    if (r || !n || n >= sizeof upper)
        return r;
    for (size_t i = 0; i <= n; i++) /* llama-quantize spells them in capitals, but for the K */
        upper[i] = (char)toupper((unsigned char)name[i]);
    return qd_gguf_recipe_find(upper);
}

/* ---- layouts: what each format writes, and from what ------------------------------------- */

#define TAKES(k) (1u << (k))
#define TAKES_HF (TAKES(QD_INPUT_HF_DIR) | TAKES(QD_INPUT_SAFETENSORS) | TAKES(QD_INPUT_OTHER))

static const char to_float_writes[] = "the unquantized Hugging Face layout, from a FineGrainedFP8, compressed-tensors "
                                      "float-/int-/pack-/fp4-pack-quantized, transformers + bitsandbytes 4-bit or "
                                      "AutoAWQ GEMM directory";

/* The layout table: a format converts through the first entry naming its family (or the format
 * itself). GGUF out needs a llama.cpp file type (q8_1 has none). Another OTHER file goes to the
 * HF reader, whose message names what is wrong with its header; a GGUF reader names a bad magic.
 * Adding a Hugging Face layout: its file (hf_layout.h says what it defines) and one row here
 * naming it in .hf. */
static const struct layout {
    const char *family, *name;
    const char *writes;
    unsigned takes; /* TAKES(input kinds) */
    int (*run)(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status, char *err,
               size_t errlen);
    const struct qd_hf_layout_desc *hf; /* a Hugging Face layout (run NULL) */
    /* what the layout needs of an input beyond its kind (NULL: nothing): 0, or -1 with the reason */
    int (*check)(const char *src, enum qd_convert_input in, char *err, size_t errlen);
    int to_float; /* name is an output dtype (--fmt bf16): a quantized checkpoint back to float */
} layouts[] = {
    {"ggml", NULL, "llama.cpp GGUF (llama-quantize --pure)", TAKES(QD_INPUT_GGUF) | TAKES(QD_INPUT_OTHER),
     qd_convert_gguf, NULL, NULL, 0},
    {"kquant", NULL, "llama.cpp GGUF (llama-quantize --pure)", TAKES(QD_INPUT_GGUF) | TAKES(QD_INPUT_OTHER),
     qd_convert_gguf, NULL, NULL, 0},
    {"iquant", NULL, "llama.cpp GGUF (llama-quantize --pure)", TAKES(QD_INPUT_GGUF) | TAKES(QD_INPUT_OTHER),
     qd_convert_gguf, NULL, NULL, 0},
    {"iq3s", NULL, "llama.cpp GGUF (llama-quantize --pure)", TAKES(QD_INPUT_GGUF) | TAKES(QD_INPUT_OTHER),
     qd_convert_gguf, NULL, NULL, 0},
    {"iqgrid", NULL, "llama.cpp GGUF (llama-quantize --pure)", TAKES(QD_INPUT_GGUF) | TAKES(QD_INPUT_OTHER),
     qd_convert_gguf, NULL, NULL, 0},
    {"iq2", NULL, "llama.cpp GGUF (llama-quantize --pure)", TAKES(QD_INPUT_GGUF) | TAKES(QD_INPUT_OTHER),
     qd_convert_gguf, NULL, NULL, 0},
    {"bnb4", NULL, "transformers + bitsandbytes", TAKES_HF, NULL, &qd_hf_bnb, NULL, 0},
    {"ctint", NULL, "compressed-tensors (llm-compressor W4A16, W8A16; int8 is w8a16)", TAKES_HF, NULL, &qd_hf_ct_int,
     NULL, 0},
    {NULL, "nvfp4", "compressed-tensors NVFP4A16", TAKES_HF, NULL, &qd_hf_ct_nvfp4, NULL, 0},
    {NULL, "mxfp4", "compressed-tensors MXFP4A16", TAKES_HF, NULL, &qd_hf_ct_mxfp4, NULL, 0},
    {"awq", NULL, "AutoAWQ GEMM", TAKES_HF, NULL, &qd_hf_awq, NULL, 0},
    {"fp8", NULL, "compressed-tensors FP8_DYNAMIC, FP8_BLOCK, W8A8; FineGrainedFP8", TAKES_HF, NULL, &qd_hf_ct_fp8,
     NULL, 0},
    /* its own run, not an hf layout: mlx-lm's model classes rename, drop and stack tensors, and
     * its files are not the source's shards (mlx_convert.c) */
    {"mlx", NULL, "MLX (mlx_lm.convert -q; a directory with a tokenizer)", TAKES(QD_INPUT_HF_DIR), qd_convert_mlx,
     NULL, qd_convert_mlx_check, 0},
    /* back to float: not formats of the registry, but the dtype of the unquantized layout */
    {NULL, "bf16", to_float_writes, TAKES(QD_INPUT_HF_DIR), NULL, &qd_hf_dequant_bf16, qd_convert_hf_dequant_check, 1},
    {NULL, "f16", to_float_writes, TAKES(QD_INPUT_HF_DIR), NULL, &qd_hf_dequant_f16, qd_convert_hf_dequant_check, 1},
    {NULL, "f32", to_float_writes, TAKES(QD_INPUT_HF_DIR), NULL, &qd_hf_dequant_f32, qd_convert_hf_dequant_check, 1},
};

const char *qd_convert_to_float_named(const char *name)
{
    for (size_t i = 0; name && i < sizeof layouts / sizeof *layouts; i++)
        if (layouts[i].to_float && !strcasecmp(layouts[i].name, name))
            return layouts[i].name;
    return NULL;
}

static const struct layout *layout_of(const struct qd_format *f)
{
    for (size_t i = 0; f && i < sizeof layouts / sizeof *layouts; i++) {
        const struct layout *l = &layouts[i];
        if (l->to_float)
            continue;
        if (l->name ? !strcmp(l->name, f->name) : !strcmp(l->family, f->family))
            return l->run == qd_convert_gguf && !f->gguf_file_type ? NULL : l;
    }
    return NULL;
}

/* The layout a conversion writes: back to float, GGUF for mix r (not NULL; a float mix or COPY
 * names no format), or f's */
static const struct layout *layout_for(const struct qd_convert_opts *o, const struct qd_gguf_recipe *r,
                                       const struct qd_format *f)
{
    for (size_t i = 0; o->to_float && i < sizeof layouts / sizeof *layouts; i++)
        if (layouts[i].to_float && !strcmp(layouts[i].name, o->to_float))
            return &layouts[i];
    for (size_t i = 0; r && !r->fmt && i < sizeof layouts / sizeof *layouts; i++)
        if (layouts[i].run == qd_convert_gguf)
            return &layouts[i];
    return layout_of(f);
}

/* The names of the formats whose layout takes input kind in (or, with in < 0, writes what l
 * writes), registry order, space-separated. */
static void format_names(int in, const struct layout *l, char *out, size_t len)
{
    size_t n = 0;
    out[0] = 0;
    for (int k = 0; k < qd_format_count && n < len; k++) {
        const struct layout *fl = layout_of(qd_convert_format(&qd_formats[k]));
        if (fl && (in >= 0 ? (fl->takes & TAKES(in)) && in != QD_INPUT_OTHER : fl->writes == l->writes))
            n += (size_t)snprintf(out + n, len - n, "%s%s", n ? " " : "", qd_formats[k].name);
    }
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts && n < len; i++)
        if (layouts[i].to_float && (in >= 0 ? (layouts[i].takes & TAKES(in)) != 0 : layouts[i].writes == l->writes))
            n += (size_t)snprintf(out + n, len - n, "%s%s", n ? " " : "", layouts[i].name);
}

static char formats_from[QD_INPUT_SPECIAL + 1][256], layouts_text[1536];

static void describe_layouts(void)
{
    for (int in = 0; in <= QD_INPUT_SPECIAL; in++)
        format_names(in, NULL, formats_from[in], sizeof formats_from[in]);
    size_t at = 0;
    for (int gguf = 1; gguf >= 0; gguf--) {
        at += (size_t)snprintf(layouts_text + at, sizeof layouts_text - at, "    from %s:\n",
                               gguf ? "a GGUF file (F32, F16 or BF16 weights)"
                                    : "a Hugging Face directory, or one .safetensors file");
        for (size_t i = 0; i < sizeof layouts / sizeof *layouts && at < sizeof layouts_text; i++) {
            const struct layout *l = &layouts[i];
            if (!!(l->takes & TAKES(QD_INPUT_GGUF)) != gguf || (i && l->writes == layouts[i - 1].writes))
                continue; /* (the K-quants write the legacy blocks' file) */
            char names[160];
            format_names(-1, l, names, sizeof names);
            const int w = (int)strlen(names);
            at += w > 20 ? (size_t)snprintf(layouts_text + at, sizeof layouts_text - at, "      %s\n      %20s  %s\n",
                                            names, "", l->writes)
                         : (size_t)snprintf(layouts_text + at, sizeof layouts_text - at, "      %-20s  %s\n", names,
                                            l->writes);
        }
    }
}

static pthread_once_t described = PTHREAD_ONCE_INIT;

const char *qd_convert_formats_from(enum qd_convert_input in)
{
    pthread_once(&described, describe_layouts);
    return in <= QD_INPUT_SPECIAL ? formats_from[in] : "";
}

const char *qd_convert_layouts_text(void)
{
    pthread_once(&described, describe_layouts);
    return layouts_text;
}

/* What the input is, against what the format reads: 0, or -1 with the message. */
static int check_input(const struct qd_convert_opts *o, const struct layout *l, enum qd_convert_input in,
                       enum qd_status *status, char *err, size_t errlen)
{
    const char *fmt = o->recipe ? o->recipe : o->f ? o->f->name : o->to_float, *src = o->src;
    const int gguf_out = l->run == qd_convert_gguf;
    static const char hf_model[] = "a Hugging Face model (a directory with config.json and .safetensors weights, "
                                   "or one .safetensors file)";
    *status = QD_EINVAL;
    switch (in) {
    case QD_INPUT_MISSING:
        snprintf(err, errlen, "%s: %s", src, strerror(errno));
        *status = errno == ENOENT ? QD_ENOTFOUND : QD_EINVAL;
        return -1;
    case QD_INPUT_SPECIAL:
        snprintf(err, errlen, "%s is not a regular file or a directory (a FIFO, device or socket): quantd reads "
                 "model files", src);
        return -1;
    case QD_INPUT_HF_DIR:
        if (!gguf_out) {
            char config[4200];
            struct stat st;
            snprintf(config, sizeof config, "%s/config.json", src);
            if (stat(config, &st) < 0 || !S_ISREG(st.st_mode)) {
                snprintf(err, errlen, "%s has no config.json: a Hugging Face model directory holds config.json beside "
                         "its .safetensors weights (or give one .safetensors file)", src);
                return -1;
            }
            return 0;
        }
        snprintf(err, errlen, "%s is a directory (a Hugging Face model); %s writes a GGUF from a GGUF file: make "
                 "one with llama.cpp's convert_hf_to_gguf.py (python convert_hf_to_gguf.py %s --outtype f16 "
                 "--outfile model-f16.gguf), then convert that. From this directory quantd writes %s", src, fmt, src,
                 qd_convert_formats_from(QD_INPUT_HF_DIR));
        return -1;
    case QD_INPUT_SAFETENSORS:
        if (gguf_out) {
            snprintf(err, errlen, "%s is a safetensors file; %s writes a GGUF from a GGUF file (llama.cpp's "
                     "convert_hf_to_gguf.py makes one from the model's directory). From a safetensors file quantd "
                     "writes %s", src, fmt, qd_convert_formats_from(QD_INPUT_SAFETENSORS));
            return -1;
        }
        return 0;
    case QD_INPUT_GGUF:
        if (!gguf_out) {
            snprintf(err, errlen, "%s is a GGUF file; %s writes %s from %s. From a GGUF quantd writes %s, or a "
                     "llama-quantize mix (recipe: %s)", src, fmt, l->writes, hf_model,
                     qd_convert_formats_from(QD_INPUT_GGUF), qd_gguf_recipe_names());
            return -1;
        }
        return 0;
    case QD_INPUT_OTHER: /* the reader names what is wrong with the header */
        return 0;
    }
    return 0;
}

int qd_convert_check(const struct qd_convert_opts *o, struct qd_convert_dest *d, enum qd_status *status, char *err,
                     size_t errlen)
{
    memset(d, 0, sizeof *d);
    *status = QD_EINVAL;
    const struct qd_gguf_recipe *r = o->recipe ? qd_gguf_recipe_find(o->recipe) : NULL;
    if (o->recipe && !r) {
        snprintf(err, errlen, "convert: unknown recipe '%.40s' (quantd writes %s)", o->recipe, qd_gguf_recipe_names());
        return -1;
    }
    const struct qd_format *f = r ? (r->fmt ? qd_format_find(r->fmt) : NULL) : o->f;
    const struct layout *l = layout_for(o, r, f);
    if (!l && f && f->gguf_type) {
        snprintf(err, errlen, "convert: %s has no llama.cpp file type (llama-quantize does not write it); use %s",
                 f->name, qd_convert_formats_from(QD_INPUT_GGUF));
        return -1;
    }
    if (!l) {
        snprintf(err, errlen, "convert: no checkpoint layout for format %s; quantd convert writes:\n%s",
                 f ? f->name : "(none)", qd_convert_layouts_text());
        return -1;
    }
    if (l->hf && l->hf->pick && !l->hf->pick(f, &o->params, err, errlen))
        return -1;
    if (o->to_float && (o->skip || o->only || o->filter)) { /* a weight left quantized would keep its scale */
        snprintf(err, errlen, "convert: --skip and --only choose weights to quantize; back to float (%s) turns every "
                 "quantized weight back", o->to_float);
        return -1;
    }
    if (o->gguf && o->gguf->n_set && l->run != qd_convert_gguf) {
        snprintf(err, errlen, "convert: llama-quantize's options (%s) apply to GGUF output; %s writes %s",
                 qd_gguf_option_names(), f ? f->name : o->to_float, l->writes);
        return -1;
    }
    const enum qd_convert_input in = qd_convert_input_kind(o->src);
    if (check_input(o, l, in, status, err, errlen))
        return -1;
    if (l->check && l->check(o->src, in, err, errlen)) {
        *status = QD_EINVAL;
        return -1;
    }
    if (o->gguf && o->gguf->dry_run) { /* nothing is written: no destination to check */
        snprintf(d->path, sizeof d->path, "%s", o->dst ? o->dst : "");
        return 0;
    }
    return qd_convert_check_dest(o->src, o->dst, in, o->overwrite, d, status, err, errlen);
}

int qd_convert(const struct qd_convert_opts *o, struct qd_convert_summary *s, enum qd_status *status, char *err,
               size_t errlen)
{
    memset(s, 0, sizeof *s);
    *status = QD_EINVAL;
    struct qd_convert_dest d;
    if (qd_convert_check(o, &d, status, err, errlen))
        return -1;
    *status = QD_EINVAL; /* (a target's failure that sets none is the input's) */
    if (o->cancel && *o->cancel) {
        snprintf(err, errlen, "convert: cancelled before it started");
        *status = QD_ECANCELED;
        return -1;
    }
    struct qd_convert_opts run = *o;
    run.dst = d.path;
    const struct qd_gguf_recipe *r = o->recipe ? qd_gguf_recipe_find(o->recipe) : NULL;
    if (r) { /* a llama-quantize mix: GGUF out, its default type as the format (none: a float mix) */
        run.f = r->fmt ? qd_format_find(r->fmt) : NULL;
        if (run.f)
            qd_params_default(run.f, &run.params);
    }
    qd_convert_confine(o->root);
    const struct layout *l = layout_for(&run, r, run.f);
    const struct qd_hf_layout_desc *hf = l->hf && l->hf->pick ? l->hf->pick(run.f, &run.params, err, errlen) : l->hf;
    int rc = hf ? qd_convert_hf(hf, &run, s, status, err, errlen) : l->run(&run, s, status, err, errlen);
    qd_convert_confine(NULL);
    return rc;
}
