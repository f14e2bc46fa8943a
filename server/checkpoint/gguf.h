/* GGUF v3 (ggml's model container, ggml/docs/gguf.md): a header, typed metadata key/values,
 * tensor infos, then the data section, each tensor at an aligned offset. quantd reads it from
 * memory (a mapped file) with every field checked against what is left, the way ggml's own
 * gguf.cpp does, and writes the metadata part of a new file; tensor data is streamed by the
 * caller. */
#ifndef QD_GGUF_H
#define QD_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define QD_GGUF_DEFAULT_ALIGNMENT 32
#define QD_GGUF_MAX_DIMS 4
#define QD_GGUF_MAX_NAME 64 /* ggml's GGML_MAX_NAME, terminator included */
/* Key/values and tensors a file may list (ggml's reader bounds neither; real models have tens
 * of keys and up to a few thousand tensors): what a file names is held in memory. */
#define QD_GGUF_MAX_KV 65536
#define QD_GGUF_MAX_TENSORS 65536

/* ggml tensor types that GGUF files carry (ggml.h enum ggml_type). */
enum {
    QD_GGML_F32 = 0, QD_GGML_F16 = 1, QD_GGML_Q4_0 = 2, QD_GGML_Q4_1 = 3, QD_GGML_Q5_0 = 6,
    QD_GGML_Q5_1 = 7, QD_GGML_Q8_0 = 8, QD_GGML_Q8_1 = 9, QD_GGML_Q2_K = 10, QD_GGML_Q3_K = 11,
    QD_GGML_Q4_K = 12, QD_GGML_Q5_K = 13, QD_GGML_Q6_K = 14, QD_GGML_IQ4_NL = 20, QD_GGML_BF16 = 30, QD_GGML_TYPE_COUNT = 43
};

/* A ggml type's name and block geometry; NULL for ids that are not (or no longer) types.
 * fallback: the 32-block type llama-quantize writes instead where a row does not split into
 * this type's 256-blocks (llama-quant.cpp tensor_type_fallback); 0 where it names none (f32 is
 * never a fallback). */
struct qd_ggml_type {
    const char *name;
    int block_elems, block_bytes;
    uint32_t fallback;
    int ftype; /* the llama_ftype llama_model_loader guesses for a file mostly of this type (0, ALL_F32,
                  where it knows none) */
};
const struct qd_ggml_type *qd_ggml_type(uint32_t type);

enum qd_gguf_value_type {
    QD_GGUF_U8, QD_GGUF_I8, QD_GGUF_U16, QD_GGUF_I16, QD_GGUF_U32, QD_GGUF_I32, QD_GGUF_F32,
    QD_GGUF_BOOL, QD_GGUF_STRING, QD_GGUF_ARRAY, QD_GGUF_U64, QD_GGUF_I64, QD_GGUF_F64,
    QD_GGUF_VALUE_TYPE_COUNT
};

struct qd_gguf_kv {
    char *key;
    uint32_t type;          /* enum qd_gguf_value_type */
    const uint8_t *entry;   /* the whole serialized entry (key, type, value): copied verbatim */
    size_t entry_bytes;
    const uint8_t *value;   /* the value's bytes (an array: its element type and count first) */
};

struct qd_gguf_tensor {
    char name[QD_GGUF_MAX_NAME];
    uint32_t n_dims;
    int64_t ne[QD_GGUF_MAX_DIMS]; /* ne[0] is the row length; absent dims are 1 */
    uint32_t type;
    uint64_t offset;              /* within the data section */
    uint64_t bytes;
    const uint8_t *data;
    int file;                     /* the shard holding it in a split model (gguf_shards.h); 0 */
};

struct qd_gguf {
    uint32_t version, alignment;
    int64_t n_kv, n_tensors;
    struct qd_gguf_kv *kv;
    struct qd_gguf_tensor *tensors;
    uint64_t data_offset; /* of the data section in the file */
};

/* Parses a whole GGUF file held in buf (its tensors point into buf). 0, or -1 with a message
 * naming the field (and tensor or key) in err. cancel (NULL: none) nonzero stops it ("cancelled"):
 * a file's header may be large. */
int qd_gguf_parse(const uint8_t *buf, size_t len, struct qd_gguf *g, const volatile int *cancel, char *err,
                  size_t errlen);
void qd_gguf_free(struct qd_gguf *g);

const struct qd_gguf_kv *qd_gguf_find(const struct qd_gguf *g, const char *key);
/* A string value (malloc'd copy) or NULL when absent or not a string. */
char *qd_gguf_string(const struct qd_gguf *g, const char *key);
/* An array value: its element type (enum qd_gguf_value_type), element count, and its elements'
 * bytes [data, end) (a string array: each a u64 length, then the bytes). qd_gguf_parse checked
 * the whole value against the file, and qd_gguf_array_string checks again as it walks.
 * 0, or -1 when the key is absent or not an array. */
struct qd_gguf_array {
    uint32_t type;
    uint64_t n;
    const uint8_t *data, *end;
};
int qd_gguf_array(const struct qd_gguf *g, const char *key, struct qd_gguf_array *a);
/* The string at *p of a string array (its bytes, not NUL-terminated; *len set), *p moved past
 * it; NULL when *p is at or past the end or the length overruns it. */
const uint8_t *qd_gguf_array_string(const struct qd_gguf_array *a, const uint8_t **p, uint64_t *len);
/* ggml_n_dims: the dims up to the last one above 1 (at least 1). */
uint32_t qd_gguf_n_dims(const int64_t *ne);
/* Bytes of a tensor of this type and shape (ne[0] a multiple of the block). */
uint64_t qd_ggml_nbytes(uint32_t type, const int64_t *ne);

/* The metadata part of a new GGUF file (header, key/values, tensor infos, padding to the
 * alignment) as gguf_write lays it out: kv entries verbatim, then extra scalar or string keys;
 * tensor offsets follow from sizes, each padded to `alignment`. malloc'd, *len set; NULL on no
 * memory. */
struct qd_gguf_new_kv {
    const char *key;
    uint32_t type;  /* QD_GGUF_U16, U32, I32, F32, BOOL or STRING */
    int64_t i;      /* the integer types and BOOL */
    double f;       /* F32 */
    const char *s;  /* STRING */
};
uint8_t *qd_gguf_write_meta(const struct qd_gguf_kv *const *kv, int n_kv, const struct qd_gguf_new_kv *extra,
                            int n_extra, const struct qd_gguf_tensor *t, int n_tensors, uint32_t alignment,
                            size_t *len);

#endif
