/* libFuzzer over the checkpoint readers (server/checkpoint/gguf.c, safetensors.c, imatrix.c, and
 * imatrix_sums.c's combining loader, twice over the same matrix as --in-file A,A does): any bytes
 * are either a parsed file whose every tensor lies inside the input, or an error message;
 * never a crash, a leak or a read outside the buffer (ASan + UBSan). make fuzz. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/gguf.h"
#include "checkpoint/imatrix.h"
#include "checkpoint/imatrix_sums.h"
#include "checkpoint/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    struct qd_gguf g;
    if (qd_gguf_parse(data, size, &g, NULL, err, sizeof err) == 0) {
        for (int64_t i = 0; i < g.n_tensors; i++) {
            const struct qd_gguf_tensor *t = &g.tensors[i];
            if (t->data < data || t->data + t->bytes > data + size)
                __builtin_trap();
        }
        char *arch = qd_gguf_string(&g, "general.architecture");
        free(arch);
        qd_gguf_free(&g);
    } else if (!err[0])
        __builtin_trap(); /* a failure always says why */
    struct qd_st_file f;
    if (qd_st_parse(data, size, 0, "fuzz", &f, err, sizeof err) == 0) {
        for (int i = 0; i < f.n; i++)
            if (f.t[i].data < data || f.t[i].data + (f.t[i].end - f.t[i].begin) > data + size)
                __builtin_trap();
        qd_st_free(&f);
    }
    struct qd_imatrix m;
    if (qd_imatrix_parse(data, size, &m, err, sizeof err) == 0) {
        for (int i = 0; i < m.n; i++)
            if (!m.e[i].name || m.e[i].n < 1)
                __builtin_trap();
        qd_imatrix_free(&m);
    } else if (!err[0])
        __builtin_trap();
    struct qd_imatrix_sums sums = {.chunk_size = 512};
    for (int pass = 0; pass < 2; pass++) {
        err[0] = 0;
        if (qd_imatrix_sums_load(&sums, data, size, err, sizeof err)) {
            if (!err[0])
                __builtin_trap();
            break;
        }
        for (int i = 0; i < sums.n; i++)
            if (sums.e[i].n_vals < 1 || sums.e[i].n_counts < 1 || sums.e[i].n_vals % sums.e[i].n_counts)
                __builtin_trap();
    }
    qd_imatrix_sums_free(&sums);
    return 0;
}
