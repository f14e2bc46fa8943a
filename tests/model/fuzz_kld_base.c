/* libFuzzer over the base logits reader (server/model/kld_file.c) and the statistics that read
 * its rows (kld.c): any bytes are either a base file whose header, tokens and rows agree with
 * its size, or an error message; never a crash, a leak or a read outside the buffer (ASan +
 * UBSan). make fuzz. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kld.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512] = "";
    FILE *f = fmemopen((void *)data, size ? size : 1, "rb");
    if (!f || !size) {
        if (f)
            fclose(f);
        return 0;
    }
    struct qd_kld_base b;
    if (qd_kld_base_open_stream(f, "fuzz", (int64_t)size, &b, err, sizeof err)) {
        if (!err[0])
            __builtin_trap(); /* a failure always says why */
        qd_kld_base_close(&b);
        return 0;
    }
    /* a header that passed promises no more than the input holds */
    const int rows = qd_kld_rows(b.n_ctx);
    const int64_t words = qd_kld_row_words(b.n_vocab);
    if ((uint64_t)b.n_chunk * ((uint64_t)b.n_ctx * 4 + (uint64_t)rows * (uint64_t)words * 2) + QD_KLD_HEADER_BYTES != size)
        __builtin_trap();
    uint16_t *buf = malloc((size_t)rows * (size_t)words * 2);
    float *logits = calloc((size_t)b.n_vocab, sizeof *logits);
    struct qd_kld_stats s;
    if (buf && logits && qd_kld_stats_init(&s, (int64_t)b.n_chunk * rows) == QD_OK) {
        for (int c = 0; c < b.n_chunk; c++) {
            err[0] = 0;
            if (qd_kld_base_read_chunk(&b, buf, err, sizeof err)) {
                if (!err[0])
                    __builtin_trap();
                break;
            }
            for (int r = 0; r < rows; r++)
                qd_kld_stats_add(&s, logits, b.n_vocab, buf + (int64_t)r * words,
                                 b.tokens[(int64_t)c * b.n_ctx + b.n_ctx / 2 + r + 1]);
        }
        FILE *null = fopen("/dev/null", "w");
        cJSON *j = cJSON_CreateObject();
        if (null)
            qd_kld_report(&s, null, j);
        cJSON_Delete(j);
        if (null)
            fclose(null);
        qd_kld_stats_free(&s);
    }
    free(buf);
    free(logits);
    qd_kld_base_close(&b);
    return 0;
}
