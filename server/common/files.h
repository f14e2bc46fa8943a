/* Whole-file reads and writes, and the process's peak memory the CLI's and the jobs' summaries report. */
#ifndef QD_FILES_H
#define QD_FILES_H

#include <stddef.h>
#include <stdint.h>

/* Reads a file into a malloc'd buffer; NULL with errno set on failure. */
void *qd_file_read(const char *path, size_t *len);
/* Writes len bytes; 0 on success, -1 with errno. */
int qd_file_write(const char *path, const void *data, size_t len);
/* This process's peak resident set (VmHWM: per address space, so a forked parent's pages do
 * not count, unlike getrusage's ru_maxrss); 0 where /proc is missing. */
uint64_t qd_peak_rss_bytes(void);

#endif
