/* Whole-file reads and writes for the CLI. */
#ifndef QD_FILES_H
#define QD_FILES_H

#include <stddef.h>

/* Reads a file into a malloc'd buffer; NULL with errno set on failure. */
void *qd_file_read(const char *path, size_t *len);
/* Writes len bytes; 0 on success, -1 with errno. */
int qd_file_write(const char *path, const void *data, size_t len);

#endif
