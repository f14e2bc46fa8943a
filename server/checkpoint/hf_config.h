/* config.json of a converted Hugging Face model, written the way transformers' save_pretrained
 * writes it: json.dumps(indent=2, sort_keys=True) plus a newline. Every key of the source
 * config keeps its value's exact text (so 0.0 stays a float and 50.0 stays 50.0: transformers
 * 5.17 checks config field types when it loads); only the keys the peer's tool sets change. */
#ifndef QD_HF_CONFIG_H
#define QD_HF_CONFIG_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* A top-level key the conversion sets: its value replaces the source's (added when absent). A
 * NULL value removes the key. */
struct qd_config_set {
    const char *key;
    const cJSON *value;
};

/* The source config's text (src, n bytes: one JSON object) with sets[0..nsets) applied, as
 * save_pretrained writes it; without the final newline when `newline` is 0 (json.dump, as
 * compressed-tensors rewrites the file). A new string the caller frees, or NULL with a message
 * in err. */
char *qd_hf_config_rewrite(const char *src, size_t n, const struct qd_config_set *sets, int nsets, int newline,
                           char *err, size_t errlen);

/* json.dumps(v, indent=2, sort_keys=True) at nesting depth `depth` (its lines indented
 * 2*depth spaces): numbers with an integral value as integers, others as Python's repr; raw
 * items as their text (a float that must stay one: cJSON_CreateRaw("6.0")). Appends to *buf. */
int qd_json_py_dump(const cJSON *v, int depth, char **buf, size_t *len, size_t *cap);

/* json.dumps(v, indent=2, sort_keys=True) + "\n" (how transformers writes its JSON files) in
 * a new string, or NULL (no memory). */
char *qd_json_py_text(const cJSON *v);

/* A JSON object as Python's json.load reads it (numbers as raw items holding what json.dump
 * writes for them: a float stays a float), or NULL with a message naming `what` in err. */
cJSON *qd_json_py_read(const char *src, size_t n, const char *what, char *err, size_t errlen);

/* json.dump(v, indent=width) without a final newline, objects nested less than sort_depth deep
 * sorted by key (1: the top level only, as mlx-lm sorts its config), the others in their order. */
char *qd_json_py_text_styled(const cJSON *v, int width, int sort_depth);

/* Python's repr of a float: the shortest digits that read back to it, fixed notation for
 * decimal exponents in [-4, 16), else d.ddde+XX. */
void qd_py_float_repr(double v, char *out, size_t len);

#endif
