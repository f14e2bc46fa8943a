/* A leak on purpose, to show that the soak's verdict catches one (make soak-leak-check): loaded
 * into the daemon with LD_PRELOAD, it drops one free() in QD_LEAK_EVERY (default 4) of the
 * blocks under 64 KiB, the size of a request's small allocations; large bodies are freed as
 * usual, so RSS alone would hardly show it. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>

void __libc_free(void *p);

static atomic_ulong small_frees;

void free(void *p)
{
    static unsigned long every;
    if (!every) {
        const char *e = getenv("QD_LEAK_EVERY");
        every = e && atol(e) > 0 ? (unsigned long)atol(e) : 4;
    }
    if (p && malloc_usable_size(p) < (64 << 10) && atomic_fetch_add(&small_frees, 1) % every == every - 1)
        return;
    __libc_free(p);
}
