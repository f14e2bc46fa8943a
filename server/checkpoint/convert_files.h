/* The files a conversion touches (convert_files.c): what the input is, whether the destination
 * can take the output, mapped input, inputs opened without blocking and inside the service's data
 * directory, output files and directories built under a temporary name, and every temporary of
 * this process. The ground floor of checkpoint conversion: it uses no other part of it. */
#ifndef QD_CONVERT_FILES_H
#define QD_CONVERT_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/registry.h"

/* What a path holds, from its kind and first bytes (a FIFO is never opened). */
enum qd_convert_input {
    QD_INPUT_MISSING,
    QD_INPUT_GGUF,        /* a file starting with the GGUF magic */
    QD_INPUT_SAFETENSORS, /* a file starting with a safetensors header (its length, then '{') */
    QD_INPUT_HF_DIR,      /* a directory: a Hugging Face model (config.json, safetensors weights) */
    QD_INPUT_OTHER,       /* another regular file */
    QD_INPUT_SPECIAL,     /* a FIFO, device or socket */
};
enum qd_convert_input qd_convert_input_kind(const char *path);

/* The destination as checked: usable, or refused with the reason. */
struct qd_convert_dest {
    int out_dir;           /* the output is a directory (a Hugging Face directory in) */
    int exists;            /* something is there that the output replaces; an empty directory
                              does not count */
    int conflict;          /* refused because of it (no overwrite) */
    char path[4096];       /* the destination without trailing slashes */
};
/* The destination part of qd_convert_check, for an input of kind in (a directory: a directory
 * out; else a file). */
int qd_convert_check_dest(const char *src, const char *dst, enum qd_convert_input in, int overwrite,
                          struct qd_convert_dest *d, enum qd_status *status, char *err, size_t errlen);

/* Removes every temporary file and directory this process's conversions have open, and keeps
 * any from being renamed into place after (for a stop that cannot wait for the pipeline: a
 * second signal, the service's drain deadline). Returns how many were removed. */
int qd_convert_remove_temporaries(void);

/* A read-only mapping of a whole file (for headers: tensor data goes through the pipeline). */
struct qd_mapped {
    const uint8_t *data;
    size_t size;
};
int qd_map_file(const char *path, struct qd_mapped *m, char *err, size_t errlen);
/* Opens an input file for reading: without blocking (a FIFO is refused, never waited on), a
 * regular file only, and inside the data directory the conversion is confined to, if any
 * (qd_convert_confine, set by qd_convert from o->root). The fd, or -1 with err. */
int qd_open_input(const char *path, char *err, size_t errlen);
void qd_convert_confine(const char *root);
void qd_unmap_file(struct qd_mapped *m);
/* Lets this process's mapping of the pages under [p, p + n) go (the page cache keeps them):
 * what a pass over mapped input has read stops counting as resident. */
void qd_release_pages(const void *p, size_t n);


/* An output file being written under a temporary name in its destination's directory. */
struct qd_outfile {
    int fd;
    char *path, *tmp;
    uint64_t written;
};
/* A whole file copied through an output file (temporary name, fsync, rename): 0, or -1 with err */
int qd_copy_file(const char *from, const char *to, char *err, size_t errlen);
int qd_outfile_open(struct qd_outfile *f, const char *path, char *err, size_t errlen);
int qd_outfile_write(struct qd_outfile *f, const void *p, size_t n, char *err, size_t errlen);
int qd_outfile_pad(struct qd_outfile *f, uint32_t alignment, char *err, size_t errlen);
/* fsync and rename into place (commit), or remove (abort). */
int qd_outfile_commit(struct qd_outfile *f, char *err, size_t errlen);
/* The status of a failed write or commit by its errno: QD_ENOSPC when the storage is full (a
 * full disk, a quota, the file-size limit: the service answers 507), else QD_EIO. */
enum qd_status qd_status_of_write(int err_no);
void qd_outfile_abort(struct qd_outfile *f);

/* An output directory being built under a temporary name: beside path (then renamed into
 * place), or inside path when it exists (then its files are moved in, config.json last). */
struct qd_outdir {
    char *path, *tmp;
    int into;
};
int qd_outdir_open(struct qd_outdir *d, const char *path, char *err, size_t errlen);
int qd_outdir_commit(struct qd_outdir *d, char *err, size_t errlen);
void qd_outdir_abort(struct qd_outdir *d);

/* The registry of temporaries (qd_convert_remove_temporaries): add and forget a path, and
 * rename one into place unless a forced stop came first (-1, errno ECANCELED). */
void qd_temp_add(const char *path, int dir);
void qd_temp_forget(const char *path);
int qd_temp_rename(const char *tmp, const char *path);

#endif
