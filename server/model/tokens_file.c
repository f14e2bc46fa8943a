/* Token files (tokens_file.h). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/tokens_file.h"

/* The whole file in a malloc'd buffer (NULL with errno set). */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap) {
            char *grown = realloc(buf, cap = cap ? 2 * cap : 65536);
            if (!grown) {
                free(buf), fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = grown;
        }
        n += got = fread(buf + n, 1, cap - n, f);
    } while (got);
    if (ferror(f)) {
        int e = errno;
        free(buf), fclose(f);
        errno = e ? e : EIO;
        return NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

int32_t *qd_tokens_file_read(const char *path, int64_t *n, char *err, size_t errlen)
{
    size_t len;
    char *buf = read_all(path, &len);
    if (!buf) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t at = 0;
    while (at < len && isspace((unsigned char)buf[at]))
        at++;
    int32_t *ids = NULL;
    if (at < len && buf[at] == '[') {
        cJSON *arr = cJSON_ParseWithLength(buf, len);
        int count = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
        if (count < 0)
            snprintf(err, errlen, "%s: not a JSON array of token ids", path);
        else if ((ids = malloc((size_t)(count ? count : 1) * sizeof *ids))) {
            int i = 0;
            for (cJSON *e = arr->child; e; e = e->next, i++) {
                if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
                    e->valuedouble > INT32_MAX) {
                    snprintf(err, errlen, "%s: element %d is not a token id (a non-negative integer)", path, i);
                    free(ids);
                    ids = NULL;
                    break;
                }
                ids[i] = (int32_t)e->valuedouble;
            }
            *n = count;
        } else
            snprintf(err, errlen, "no memory");
        cJSON_Delete(arr);
    } else if (len % 4) {
        snprintf(err, errlen, "%s: %zu bytes is not a whole number of little-endian int32 token ids (nor a JSON "
                 "array)", path, len);
    } else if ((ids = malloc(len ? len : 1))) {
        memcpy(ids, buf, len);
        *n = (int64_t)(len / 4);
        for (int64_t i = 0; i < *n; i++)
            if (ids[i] < 0) {
                snprintf(err, errlen, "%s: token %" PRId64 " is negative (%" PRId32 "): not an int32 token file", path,
                         i, ids[i]);
                free(ids);
                ids = NULL;
                break;
            }
    } else
        snprintf(err, errlen, "no memory");
    free(buf);
    return ids;
}
