/* The files a conversion touches (convert_files.h): what the input is, whether the destination
 * can take the output (decided before anything is converted), mapped input, inputs opened without
 * blocking and inside the service's data directory, output files and directories built under a
 * temporary name, and every temporary of this process, for a stop that cannot wait for the
 * pipeline. */
#include "checkpoint/convert_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- temporaries ------------------------------------------------------------------------ */

/* Every temporary file and directory open now, so that a forced stop removes them; the lock
 * also orders a commit's rename against that removal (after it, nothing is renamed into place). */
struct temp {
    char *path;
    int dir;
    struct temp *next;
};
static struct {
    pthread_mutex_t lock;
    struct temp *head;
    int forced;
} temps = {.lock = PTHREAD_MUTEX_INITIALIZER};

void qd_temp_add(const char *path, int dir)
{
    struct temp *t = malloc(sizeof *t);
    char *p = strdup(path);
    if (!t || !p) { /* (a forced stop then misses it: the next start's sweep or the user does) */
        free(t), free(p);
        return;
    }
    pthread_mutex_lock(&temps.lock);
    *t = (struct temp){p, dir, temps.head};
    temps.head = t;
    pthread_mutex_unlock(&temps.lock);
}

/* (lock held) */
static void temp_forget_locked(const char *path)
{
    for (struct temp **l = &temps.head; *l; l = &(*l)->next)
        if (!strcmp((*l)->path, path)) {
            struct temp *t = *l;
            *l = t->next;
            free(t->path);
            free(t);
            return;
        }
}

void qd_temp_forget(const char *path)
{
    pthread_mutex_lock(&temps.lock);
    temp_forget_locked(path);
    pthread_mutex_unlock(&temps.lock);
}

int qd_temp_rename(const char *tmp, const char *path)
{
    pthread_mutex_lock(&temps.lock);
    int rc = -1;
    if (temps.forced)
        errno = ECANCELED;
    else if ((rc = rename(tmp, path)) == 0)
        temp_forget_locked(tmp);
    pthread_mutex_unlock(&temps.lock);
    return rc;
}

/* A directory quantd made, with what it holds (files, and directories it made inside). */
static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno == EISDIR) {
            size_t n = strlen(dir) + strlen(e->d_name) + 2;
            char *p = malloc(n);
            if (p) {
                snprintf(p, n, "%s/%s", dir, e->d_name);
                remove_tree(p);
            }
            free(p);
        }
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

int qd_convert_remove_temporaries(void)
{
    int n = 0;
    pthread_mutex_lock(&temps.lock);
    temps.forced = 1;
    while (temps.head) {
        struct temp *t = temps.head;
        temps.head = t->next;
        if (t->dir)
            remove_tree(t->path);
        else
            unlink(t->path);
        free(t->path);
        free(t);
        n++;
    }
    pthread_mutex_unlock(&temps.lock);
    return n;
}

/* ---- inputs ------------------------------------------------------------------------------ */

/* The data directory the conversion on this thread is confined to (qd_convert sets it for its
 * run): the targets open their inputs by name, and every such open is checked here. */
static __thread const char *confine_root;

void qd_convert_confine(const char *root) { confine_root = root; }

static int under(const char *path, const char *root)
{
    size_t n = strlen(root);
    return !strncmp(path, root, n) && (path[n] == '/' || path[n] == 0 || (n == 1 && root[0] == '/'));
}

int qd_open_input(const char *path, char *err, size_t errlen)
{
    /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        snprintf(err, errlen, "%s: %s", path, errno == EWOULDBLOCK ? "busy (another process holds a lease on it)"
                                                                   : strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: %s", path, S_ISDIR(st.st_mode) ? "is a directory, not a file"
                                              : "not a regular file (a FIFO, device or socket): quantd reads model files");
        close(fd);
        return -1;
    }
    if (confine_root) { /* what was opened, whatever links led there */
        char link[64], real[PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, real, sizeof real - 1);
        if (n > 0)
            real[n] = 0;
        if ((n <= 0 && !realpath(path, real)) || !under(real, confine_root)) {
            snprintf(err, errlen, "%s leads outside --data-dir (a symlink): quantd reads only files inside it", path);
            close(fd);
            errno = EACCES;
            return -1;
        }
    }
    return fd;
}

enum qd_convert_input qd_convert_input_kind(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return QD_INPUT_MISSING;
    if (S_ISDIR(st.st_mode))
        return QD_INPUT_HF_DIR;
    if (!S_ISREG(st.st_mode))
        return QD_INPUT_SPECIAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    uint8_t b[9] = {0};
    ssize_t n = fd >= 0 ? pread(fd, b, sizeof b, 0) : -1;
    if (fd >= 0 && fstat(fd, &st) == 0 && !S_ISREG(st.st_mode))
        n = -2; /* replaced since the stat */
    if (fd >= 0)
        close(fd);
    if (n == -2)
        return QD_INPUT_SPECIAL;
    if (n >= 4 && !memcmp(b, "GGUF", 4))
        return QD_INPUT_GGUF;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | b[i];
    /* safetensors: a little-endian header length, then the JSON header */
    if (n == 9 && b[8] == '{' && hlen >= 2 && hlen <= (uint64_t)st.st_size - 8)
        return QD_INPUT_SAFETENSORS;
    return QD_INPUT_OTHER;
}

/* ---- the destination ----------------------------------------------------------------------- */

/* The temporary names add this much to the destination's own: ".NAME.quantd-XXXXXX". */
#define TEMP_NAME_EXTRA 15

static int dir_is_empty(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int empty = d != NULL;
    while (d && empty && (e = readdir(d)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return empty;
}

static int same_inode(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

int qd_convert_check_dest(const char *src, const char *dst, enum qd_convert_input in, int overwrite,
                          struct qd_convert_dest *d, enum qd_status *status, char *err, size_t errlen)
{
    const int out_dir = in == QD_INPUT_HF_DIR;
    const char *example = in == QD_INPUT_GGUF ? "model.gguf" : "model.safetensors"; /* (a file's name) */
    *status = QD_EINVAL;
    d->out_dir = out_dir;
    d->exists = d->conflict = 0;
    size_t n = strlen(dst);
    if (!n) {
        snprintf(err, errlen, "the destination is empty: name the output %s", out_dir ? "directory" : "file");
        return -1;
    }
    if (n >= sizeof d->path - 32) {
        snprintf(err, errlen, "the destination's path is %zu bytes long, over the limit of %zu", n,
                 sizeof d->path - 32);
        return -1;
    }
    memcpy(d->path, dst, n + 1);
    int slash = 0;
    while (n > 1 && d->path[n - 1] == '/')
        d->path[--n] = 0, slash = 1;
    if (slash && !out_dir) {
        snprintf(err, errlen, "%s ends in '/' (a directory), but this conversion writes one file: name the file "
                 "(for example %s%s)", dst, dst, example);
        return -1;
    }
    char *copy = strdup(d->path), *base = copy ? basename(copy) : NULL;
    size_t blen = base ? strlen(base) : 0;
    free(copy);
    if (!base) {
        snprintf(err, errlen, "no memory");
        *status = QD_ENOMEM;
        return -1;
    }
    if (blen + TEMP_NAME_EXTRA > NAME_MAX) {
        snprintf(err, errlen, "the output's name is %zu bytes long; at most %d (its temporary name adds %d)", blen,
                 NAME_MAX - TEMP_NAME_EXTRA, TEMP_NAME_EXTRA);
        return -1;
    }
    struct stat st, sst;
    int into = 0; /* an existing directory takes the output's files */
    if (lstat(d->path, &st) == 0) {
        if (S_ISLNK(st.st_mode) && stat(d->path, &st) < 0) {
            snprintf(err, errlen, "%s is a symlink to nothing: remove it or give another destination", dst);
            return -1;
        }
        if (stat(src, &sst) == 0 && same_inode(&st, &sst)) {
            snprintf(err, errlen, "the output %s is the input", dst);
            return -1;
        }
        if (out_dir && !S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "%s exists and is not a directory; a Hugging Face model converts into a directory",
                     dst);
            return -1;
        }
        if (!out_dir && S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "%s is a directory, but this conversion writes one file: name the file (for example "
                     "%s/%s)", dst, d->path, example);
            return -1;
        }
        if (!out_dir && !S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "%s exists and is not a regular file", dst);
            return -1;
        }
        into = out_dir;
        d->exists = !(out_dir && dir_is_empty(d->path));
        if (d->exists && !overwrite) {
            d->conflict = 1;
            snprintf(err, errlen, "%s exists%s: quantd replaces an existing output only when asked (--force; "
                     "\"overwrite\": true in a job)", dst, out_dir ? " and is not empty" : "");
            return -1;
        }
    } else if (errno != ENOENT) {
        snprintf(err, errlen, "%s: %s", dst, errno == ENOTDIR ? "a part of the path is a file, not a directory"
                                             : strerror(errno));
        return -1;
    }
    /* where the temporary goes: into the existing directory, else beside the destination */
    char *dcopy = strdup(d->path), *dir = into ? d->path : dcopy ? dirname(dcopy) : NULL;
    int rc = 0;
    if (!dir) {
        snprintf(err, errlen, "no memory");
        *status = QD_ENOMEM;
        return -1;
    }
    int gone = stat(dir, &st) < 0;
    if (gone || !S_ISDIR(st.st_mode)) {
        int missing = gone && errno == ENOENT;
        snprintf(err, errlen, "%s: its directory %s %s", dst, dir, missing ? "does not exist" : "is not a directory");
        *status = missing ? QD_ENOTFOUND : QD_EINVAL;
        rc = -1;
    } else if (access(dir, W_OK | X_OK) < 0) {
        snprintf(err, errlen, "%s: cannot write in %s: %s", dst, dir, strerror(errno));
        rc = -1;
    }
    free(dcopy);
    if (rc == 0)
        *status = QD_OK;
    return rc;
}

/* ---- output directories ------------------------------------------------------------------- */

int qd_outdir_open(struct qd_outdir *d, const char *path, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    struct stat st;
    d->into = stat(path, &st) == 0 && S_ISDIR(st.st_mode); /* (checked usable: empty, or overwrite) */
    size_t n = strlen(path) + 32;
    d->path = strdup(path);
    d->tmp = malloc(n);
    if (!d->path || !d->tmp) {
        snprintf(err, errlen, "no memory");
        qd_outdir_abort(d);
        return -1;
    }
    /* a new directory is built beside its place and renamed there whole; an existing one (a
     * mount point, a directory the user made) is kept and the files are moved into it */
    snprintf(d->tmp, n, d->into ? "%s/.quantd-XXXXXX" : "%s.quantd-XXXXXX", path);
    if (!mkdtemp(d->tmp)) {
        snprintf(err, errlen, "%s: cannot create a directory %s: %s", path, d->into ? "in it" : "beside it",
                 strerror(errno));
        free(d->tmp);
        d->tmp = NULL;
        qd_outdir_abort(d);
        return -1;
    }
    qd_temp_add(d->tmp, 1);
    chmod(d->tmp, 0755); /* mkdtemp's 0700 is for the name race, not the result */
    return 0;
}

/* The files of tmp into dir, config.json last: a loader that finds it finds the rest. */
static int move_into(const char *tmp, const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(tmp);
    int dst = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 0, has_config = 0;
    struct dirent *e;
    if (!d || dst < 0) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        rc = -1;
    }
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (!strcmp(e->d_name, "config.json")) {
            has_config = 1;
            continue;
        }
        if (renameat(dirfd(d), e->d_name, dst, e->d_name) < 0) {
            snprintf(err, errlen, "%s/%s: rename: %s", dir, e->d_name, strerror(errno));
            rc = -1;
        }
    }
    if (!rc && has_config && renameat(dirfd(d), "config.json", dst, "config.json") < 0) {
        snprintf(err, errlen, "%s/config.json: rename: %s", dir, strerror(errno));
        rc = -1;
    }
    if (!rc)
        fsync(dst);
    if (d)
        closedir(d);
    if (dst >= 0)
        close(dst);
    return rc;
}

int qd_outdir_commit(struct qd_outdir *d, char *err, size_t errlen)
{
    int rc;
    if (d->into) {
        pthread_mutex_lock(&temps.lock); /* (a forced stop waits for the moves, or comes first) */
        rc = temps.forced ? (errno = ECANCELED, -1) : move_into(d->tmp, d->path, err, errlen);
        if (temps.forced)
            snprintf(err, errlen, "%s: stopped before it was complete", d->path);
        pthread_mutex_unlock(&temps.lock);
    } else if ((rc = qd_temp_rename(d->tmp, d->path)) < 0)
        snprintf(err, errlen, "%s: rename: %s", d->path, strerror(errno));
    if (rc) {
        qd_outdir_abort(d);
        return -1;
    }
    if (d->into) {
        rmdir(d->tmp);
        qd_temp_forget(d->tmp);
    }
    char *copy = strdup(d->path);
    int dfd = copy ? open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(copy);
    free(d->tmp);
    free(d->path);
    memset(d, 0, sizeof *d);
    return 0;
}

void qd_outdir_abort(struct qd_outdir *d)
{
    if (d->tmp) {
        remove_tree(d->tmp);
        qd_temp_forget(d->tmp);
    }
    free(d->tmp);
    free(d->path);
    memset(d, 0, sizeof *d);
}

/* ---- mapped input and output files ----------------------------------------------------- */

int qd_map_file(const char *path, struct qd_mapped *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int fd = qd_open_input(path, err, errlen);
    struct stat st;
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    m->size = (size_t)st.st_size;
    if (m->size) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            snprintf(err, errlen, "%s: mmap: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        madvise(p, m->size, MADV_SEQUENTIAL); /* one pass, front to back */
        m->data = p;
    }
    close(fd);
    return 0;
}

void qd_unmap_file(struct qd_mapped *m)
{
    if (m->data)
        munmap((void *)m->data, m->size);
    memset(m, 0, sizeof *m);
}

void qd_release_pages(const void *p, size_t n)
{
    if (!n)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p / page * page;
    uintptr_t hi = ((uintptr_t)p + n + page - 1) / page * page; /* (a mapping's last page is whole) */
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

int qd_outfile_open(struct qd_outfile *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    /* the temporary name sits in the destination's directory: the rename stays on one file
     * system, and a crash leaves a name that says what it is */
    char *dir = strdup(path), *base = strdup(path);
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    f->path = strdup(path);
    if (!dir || !base || !tmp || !f->path) {
        snprintf(err, errlen, "no memory");
        free(dir), free(base), free(tmp);
        qd_outfile_abort(f);
        return -1;
    }
    snprintf(tmp, n, "%s/.%s.quantd-XXXXXX", dirname(dir), basename(base));
    free(dir), free(base);
    f->fd = mkstemp(tmp);
    if (f->fd < 0) {
        snprintf(err, errlen, "%s: cannot create a file there: %s", path, strerror(errno));
        free(tmp);
        qd_outfile_abort(f);
        return -1;
    }
    f->tmp = tmp;
    qd_temp_add(tmp, 0);
    fchmod(f->fd, 0644);
    return 0;
}

int qd_outfile_write(struct qd_outfile *f, const void *p, size_t n, char *err, size_t errlen)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(f->fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(err, errlen, "%s: write: %s", f->path, w < 0 ? strerror(errno) : "no progress");
            return -1;
        }
        c += w, n -= (size_t)w;
        f->written += (uint64_t)w;
    }
    return 0;
}

int qd_outfile_pad(struct qd_outfile *f, uint32_t alignment, char *err, size_t errlen)
{
    static const uint8_t zeros[256];
    size_t pad = (alignment - f->written % alignment) % alignment;
    return pad ? qd_outfile_write(f, zeros, pad, err, errlen) : 0;
}

enum qd_status qd_status_of_write(int err_no)
{
    return err_no == ENOSPC || err_no == EDQUOT || err_no == EFBIG ? QD_ENOSPC : QD_EIO;
}

int qd_outfile_commit(struct qd_outfile *f, char *err, size_t errlen)
{
    if (fsync(f->fd) < 0 || close(f->fd) < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", f->path, strerror(e));
        f->fd = -1;
        qd_outfile_abort(f);
        errno = e; /* (for qd_status_of_write) */
        return -1;
    }
    f->fd = -1;
    if (qd_temp_rename(f->tmp, f->path) < 0) {
        snprintf(err, errlen, "%s: rename: %s", f->path, strerror(errno));
        qd_outfile_abort(f);
        return -1;
    }
    /* the directory entry too, so the renamed file survives a crash */
    char *dir = strdup(f->path);
    int dfd = dir ? open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
    free(f->tmp);
    free(f->path);
    f->tmp = f->path = NULL;
    return 0;
}

void qd_outfile_abort(struct qd_outfile *f)
{
    if (f->fd >= 0)
        close(f->fd);
    if (f->tmp) {
        unlink(f->tmp);
        qd_temp_forget(f->tmp);
    }
    free(f->tmp);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

int qd_copy_file(const char *from, const char *to, char *err, size_t errlen)
{
    struct qd_mapped m;
    struct qd_outfile out;
    if (qd_map_file(from, &m, err, errlen))
        return -1;
    int rc = qd_outfile_open(&out, to, err, errlen);
    if (!rc && (qd_outfile_write(&out, m.data, m.size, err, errlen) || qd_outfile_commit(&out, err, errlen)))
        rc = -1, qd_outfile_abort(&out);
    qd_unmap_file(&m);
    return rc;
}
