/* The transformers + bitsandbytes layout: what `from_pretrained(..., BitsAndBytesConfig(
 * load_in_4bit=True, ...))` then `save_pretrained` writes (transformers 5.17, bitsandbytes 0.50).
 * Per weight, Params4bit's state dict: <m>.weight (u8 [n/2, 1], bitsandbytes' nibble order),
 * .absmax, .nested_absmax, .nested_quant_map, .quant_map, and
 * .quant_state.bitsandbytes__<nf4|fp4>: QuantState.as_dict(packed=True)'s JSON (json.dumps of
 * quant_type, blocksize, dtype, shape, nested_*; the offset as Python prints a float), padded
 * with trailing spaces to a fixed length so every header is known before any tensor is quantized
 * (json.loads reads it the same). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "checkpoint/hf_config.h"
#include "checkpoint/hf_layout.h"

#define QSTATE_OFFSET_WIDTH 24 /* the longest Python repr of a float */

/* QuantState.as_dict(packed=True)'s non-tensor items as json.dumps writes them. */
static int quant_state_json(char *out, size_t len, const struct qd_convert_opts *o, const struct qd_st_entry *t,
                            const struct qd_params *p, int pad)
{
    char shape[64], offset[40];
    snprintf(shape, sizeof shape, "[%" PRId64 ", %" PRId64 "]", t->shape[0], t->shape[1]);
    int n = snprintf(out, len, "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": %s", o->f->name,
                     p->blocksize, qd_hf_torch_dtype(t->dtype), shape);
    if (p->double_quant) {
        if (pad)
            memset(offset, '0', QSTATE_OFFSET_WIDTH), offset[QSTATE_OFFSET_WIDTH] = 0;
        else
            qd_py_float_repr((double)p->offset, offset, sizeof offset);
        n += snprintf(out + n, len - (size_t)n, ", \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", "
                      "\"nested_offset\": %s", offset);
    }
    n += snprintf(out + n, len - (size_t)n, "}");
    return n;
}

/* <m>.weight, then <m>.weight.<component> */
static void component(const struct qd_convert_opts *o, const struct qd_st_entry *t, const struct qd_component *c,
                      int k, struct qd_hf_out *out)
{
    const char *suffix = !strcmp(c->name, "data") ? "" : c->name;
    char sfx[64];
    snprintf(sfx, sizeof sfx, "%s%s", *suffix ? "." : "", suffix);
    out->name = qd_hf_concat(t->name, "", sfx);
    out->dtype = qd_hf_dtype_to_st(c->dtype);
    out->ndim = k == 0 ? 2 : 1;
    out->shape[0] = c->shape[0], out->shape[1] = 1;
}

static int trailer(const struct qd_convert_opts *o, const struct qd_st_entry *t, const struct qd_params *p,
                   struct qd_hf_out *out)
{
    char js[512], sfx[64];
    snprintf(sfx, sizeof sfx, ".quant_state.bitsandbytes__%s", o->f->name);
    *out = (struct qd_hf_out){.name = qd_hf_concat(t->name, "", sfx), .dtype = "U8", .ndim = 1,
                              .shape = {quant_state_json(js, sizeof js, o, t, p, 1), 1}};
    out->bytes = (uint64_t)out->shape[0];
    return 1;
}

static enum qd_status fill_trailer(const struct qd_convert_opts *o, const struct qd_st_entry *t,
                                   const struct qd_params *p, void *out, uint64_t bytes, char *err, size_t errlen)
{
    char text[512];
    int n = quant_state_json(text, sizeof text, o, t, p, 0);
    if ((uint64_t)n > bytes) {
        snprintf(err, errlen, "internal: quant_state of %s longer than planned", t->name);
        return QD_EINVAL;
    }
    memcpy(out, text, (size_t)n);
    memset((char *)out + n, ' ', bytes - (uint64_t)n);
    return QD_OK;
}

/* BitsAndBytesConfig's keys as transformers writes them (sorted) */
static cJSON *quantization_config(const struct qd_convert_opts *o, const struct qd_arch_rules *rules,
                                  const struct qd_hf_shard *sh, int nshards, const char *compute_dtype)
{
    cJSON *q = cJSON_CreateObject();
    cJSON_AddBoolToObject(q, "_load_in_4bit", 1);
    cJSON_AddBoolToObject(q, "_load_in_8bit", 0);
    cJSON_AddStringToObject(q, "bnb_4bit_compute_dtype", compute_dtype);
    cJSON_AddStringToObject(q, "bnb_4bit_quant_storage", "uint8");
    cJSON_AddStringToObject(q, "bnb_4bit_quant_type", o->f->name);
    cJSON_AddBoolToObject(q, "bnb_4bit_use_double_quant", o->params.double_quant);
    cJSON_AddBoolToObject(q, "llm_int8_enable_fp32_cpu_offload", 0);
    cJSON_AddBoolToObject(q, "llm_int8_has_fp16_weight", 0);
    cJSON_AddNullToObject(q, "llm_int8_skip_modules");
    cJSON_AddRawToObject(q, "llm_int8_threshold", "6.0"); /* transformers checks for a float: not 6 */
    cJSON_AddBoolToObject(q, "load_in_4bit", 1);
    cJSON_AddBoolToObject(q, "load_in_8bit", 0);
    cJSON_AddStringToObject(q, "quant_method", "bitsandbytes");
    return q;
}

const struct qd_hf_layout_desc qd_hf_bnb = {
    .tool = "transformers + bitsandbytes",
    .arch = QD_HF_BNB,
    .config_newline = 1, /* save_pretrained */
    .component = component,
    .trailer = trailer,
    .fill_trailer = fill_trailer,
    .quantization_config = quantization_config,
};
