/* The tokens a pass of the model runs over (model_input.h). */
#include "model/model_input.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"
#include "model/tokens_in.h"

/* The whole file at path, malloc'd (NULL with errno set). */
static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;
    while (f) {
        if (n == cap) {
            char *grown = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap = cap ? 2 * cap : 1 << 16);
            if (!grown) {
                errno = ENOMEM;
                break;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                break;
            fclose(f);
            *len = n;
            return buf;
        }
    }
    int e = errno;
    if (f)
        fclose(f);
    free(buf);
    errno = e ? e : EIO;
    return NULL;
}

int32_t *qd_model_input_tokens(const char *model_path, const char *text_path, const char *tokens_path, int64_t *n,
                               char *err, size_t errlen)
{
    struct qd_vocab *v = NULL;
    char why[768];
    int32_t *ids = NULL;
    size_t count = 0;
    /* the vocabulary: the text's tokenizer, and the bound on a client's ids */
    enum qd_status st = qd_vocab_open(model_path, &v, why, sizeof why);
    if (st != QD_OK && text_path) {
        snprintf(err, errlen, "-f %s: the model's vocabulary: %s (a GGUF without tokenizer.ggml.* keys has none: "
                 "give the text's token ids with --tokens FILE)", text_path, why);
        return NULL;
    }
    if (tokens_path) {
        st = qd_tokens_load(tokens_path, v ? qd_vocab_size(v) : INT32_MAX, &ids, &count, err, errlen);
    } else {
        size_t len = 0;
        char *text = read_text(text_path, &len);
        if (!text) {
            snprintf(err, errlen, "-f %s: %s", text_path, strerror(errno));
            st = QD_EIO;
        } else {
            if (len && text[len - 1] == '\n') /* common's -f drops one */
                len--;
            st = qd_tokenize(v, text, len, 1, 0, &ids, &count, why, sizeof why);
            if (st != QD_OK)
                snprintf(err, errlen, "-f %s: %s", text_path, why);
            free(text);
        }
    }
    qd_vocab_free(v);
    if (st != QD_OK) {
        free(ids);
        return NULL;
    }
    *n = (int64_t)count;
    return ids;
}
