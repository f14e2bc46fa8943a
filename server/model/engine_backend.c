/* The forward engine's backend choice (engine_backend.h). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "model/engine_backend.h"

int qd_parse_bytes(const char *text, size_t *out)
{
    static const struct {
        const char *suffix;
        int shift;
    } units[] = {{"", 0}, {"B", 0}, {"K", 10}, {"KiB", 10}, {"M", 20}, {"MiB", 20},
                 {"G", 30}, {"GiB", 30}, {"T", 40}, {"TiB", 40}};
    if (!text || !isdigit((unsigned char)*text))
        return -1;
    errno = 0;
    char *end;
    unsigned long long n = strtoull(text, &end, 10);
    if (errno)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcasecmp(end, units[i].suffix)) {
            if (units[i].shift && n > (~0ull >> units[i].shift))
                return -1;
            *out = (size_t)(n << units[i].shift);
            return 0;
        }
    return -1;
}

int qd_engine_backend(const char *name, size_t max_bytes, const struct qd_nn_backend **nn, char *err, size_t errlen)
{
    const int want_cuda = !strcmp(name, "cuda"), want_auto = !strcmp(name, "auto");
    if (!want_cuda && !want_auto && strcmp(name, "cpu")) {
        snprintf(err, errlen, "--backend takes auto, cpu or cuda, not '%s'", name);
        return -1;
    }
    *nn = &qd_nn_cpu;
    if (!want_cuda && !want_auto)
        return 0;
#ifdef QD_WITH_CUDA
    char why[256];
    if (qd_nn_cuda_open(0, max_bytes, why, sizeof why) == QD_OK) {
        *nn = &qd_nn_cuda;
        return 0;
    }
    if (want_cuda) {
        snprintf(err, errlen, "--backend cuda: %s", why);
        return -1;
    }
#else
    if (want_cuda) {
        snprintf(err, errlen, "--backend cuda: this quantd was built without CUDA (build it where nvcc is found, "
                 "or use --backend cpu)");
        return -1;
    }
#endif
    return 0;
}
