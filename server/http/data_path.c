/* Paths a job names, confined to the server's --data-dir (conversion jobs, perplexity and
 * imatrix jobs), and the server's own paths taken out of the messages that go back. */
#include "http/data_path.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int qd_data_path_confine(const char *root, const char *what, const char *rel, int must_exist, char **out,
                         struct qd_reply *err)
{
    if (!rel || !*rel) {
        qd_reply_error(err, 400, "bad_request", "%s is missing (a path relative to --data-dir)", what);
        return -1;
    }
    if (rel[0] == '/' || !strcmp(rel, "..") || !strncmp(rel, "../", 3) || strstr(rel, "/../") ||
        (strlen(rel) >= 3 && !strcmp(rel + strlen(rel) - 3, "/.."))) {
        qd_reply_error(err, 403, "forbidden", "%s '%.200s' must be relative to --data-dir, without '..'", what, rel);
        return -1;
    }
    char joined[PATH_MAX], real[PATH_MAX];
    if (snprintf(joined, sizeof joined, "%s/%s", root, rel) >= (int)sizeof joined) {
        qd_reply_error(err, 400, "bad_request", "%s is too long", what);
        return -1;
    }
    char *probe = must_exist ? strdup(joined) : strdup(joined), *dir = must_exist ? probe : dirname(probe);
    if (!probe || !realpath(dir, real)) {
        int e = errno;
        free(probe);
        qd_reply_error(err, e == ENOENT || e == ENOTDIR ? 404 : 400, e == ENOENT ? "not_found" : "bad_request",
                       "%s '%.200s'%s: %s", what, rel, must_exist ? "" : " (its directory)", strerror(e));
        return -1;
    }
    free(probe);
    size_t n = strlen(root);
    if (strncmp(real, root, n) || (real[n] && real[n] != '/')) {
        qd_reply_error(err, 403, "forbidden", "%s '%.200s' leads outside --data-dir", what, rel);
        return -1;
    }
    struct stat rs;
    if (stat(real, &rs) < 0 || (must_exist ? !S_ISREG(rs.st_mode) && !S_ISDIR(rs.st_mode) : !S_ISDIR(rs.st_mode))) {
        qd_reply_error(err, 400, "bad_request", must_exist ? "%s '%.200s' is not a regular file or a directory (a FIFO, "
                       "device or socket): quantd reads model files" : "%s '%.200s': a part of the path is not a "
                       "directory", what, rel);
        return -1;
    }
    if (must_exist) {
        *out = strdup(real);
    } else {
        char *b = strdup(joined), *base = b ? basename(b) : NULL;
        struct stat st;
        char final[PATH_MAX];
        int ok = base && strcmp(base, ".") && strcmp(base, "..") &&
                 snprintf(final, sizeof final, "%s/%s", real, base) < (int)sizeof final;
        if (ok && lstat(final, &st) == 0 && S_ISLNK(st.st_mode)) {
            free(b);
            qd_reply_error(err, 403, "forbidden", "%s '%.200s' is a symlink: quantd does not write through one", what,
                           rel);
            return -1;
        }
        *out = ok ? strdup(final) : NULL;
        free(b);
        if (!ok) {
            qd_reply_error(err, 400, "bad_request", "%s '%.200s' names no file", what, rel);
            return -1;
        }
    }
    if (!*out) {
        qd_reply_error(err, 503, "out_of_memory", "no memory");
        return -1;
    }
    return 0;
}

/* Replaces every from in s (a NUL-terminated message in a buffer of cap bytes) with to: the
 * engine names the paths it was given, which for a job are the server's. */
void qd_data_path_scrub(char *s, size_t cap, const char *from, const char *to)
{
    size_t nf = strlen(from), nt = strlen(to);
    for (char *p = nf ? strstr(s, from) : NULL; p; p = strstr(p + nt, from)) {
        size_t at = (size_t)(p - s), tail = strlen(p + nf);
        if (at + nt >= cap) { /* (no room for the replacement: the message ends here) */
            *p = 0;
            return;
        }
        if (at + nt + tail + 1 > cap)
            tail = cap - 1 - at - nt;
        memmove(p + nt, p + nf, tail);
        memcpy(p, to, nt);
        p[nt + tail] = 0;
    }
}

void qd_data_path_unroot(const char *root, char *msg, size_t cap)
{
    char prefix[PATH_MAX + 2];
    snprintf(prefix, sizeof prefix, "%s/", root);
    qd_data_path_scrub(msg, cap, prefix, "");
    qd_data_path_scrub(msg, cap, root, "--data-dir");
}

int qd_data_path_json_has_nul(const char *body, size_t len)
{
    if (memchr(body, 0, len))
        return 1;
    for (size_t i = 0, in = 0; i < len; i++) {
        if (body[i] == '"')
            in = !in;
        else if (in && body[i] == '\\' && i + 1 < len) {
            if (body[i + 1] == 'u' && i + 5 < len && !strncmp(body + i + 2, "0000", 4))
                return 1;
            i++; /* (the escaped character) */
        }
    }
    return 0;
}
