/* Paths a job names, confined to the server's --data-dir (conversion jobs, perplexity and
 * imatrix jobs): one checker for every job that reads or writes files, and the server's own
 * paths taken out of the messages that go back to clients. */
#ifndef QD_DATA_PATH_H
#define QD_DATA_PATH_H

#include <stddef.h>

#include "http/reply.h"

/* rel resolved under root (the data directory's real path): no absolute path, no "..", and after
 * following symlinks still inside root (403 otherwise). must_exist: the path itself, a file or a
 * directory (an input; missing: 404); else its directory must exist (an output; 404), and the last
 * component must not be a symlink (403). *out: the resolved path, malloc'd. 0, or -1 with the
 * answer in err (what names the field in it). */
int qd_data_path_confine(const char *root, const char *what, const char *rel, int must_exist, char **out,
                         struct qd_reply *err);
/* Replaces every `from` in msg (NUL-terminated, in a buffer of cap bytes) with `to`. */
void qd_data_path_scrub(char *msg, size_t cap, const char *from, const char *to);
/* The data directory's paths in msg made relative to it ("root/x" -> "x", root -> "--data-dir"). */
void qd_data_path_unroot(const char *root, char *msg, size_t cap);
/* Whether a JSON text holds a NUL, raw or as \u0000 in a string (cJSON's string would end
 * there: a path silently cut short). */
int qd_data_path_json_has_nul(const char *body, size_t len);

#endif
