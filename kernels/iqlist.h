/* Where the IQ grids' neighbour lists lie in their tables (kernels/iq2.c, iqgrid.c, iq3s.c): a
 * list is its count, then its candidates. The GPU searches load a list's candidates' codes four
 * at a time, aligned 8-byte loads (kernels/cuda/iqlist.cuh), up to QD_IQ_LIST_LOAD codes a step
 * from its first candidate on, so each list's candidates start on a multiple of
 * QD_IQ_LIST_ALIGN entries: its count's slot is the one before. The slots skipped between
 * lists hold zeros (a walk over the lists sees empty ones), and zeros after the last list keep
 * its last loads inside the table. */
#ifndef QD_IQLIST_H
#define QD_IQLIST_H

#include <stdint.h>

#define QD_IQ_LIST_ALIGN 4
#define QD_IQ_LIST_LOAD 8 /* the most codes a search reads from one candidate on */

/* the count's slot of a list placed at or after slot at, with its candidates aligned by align
 * (1: packed, as ggml packs them) */
static inline int64_t qd_iq_list_slot(int64_t at, int64_t align)
{
    return at + (align - 1 - at % align);
}

/* the table's length with its lists ending at slot end (excluded), placed at align (1: none) */
static inline int64_t qd_iq_lists_end(int64_t end, int64_t align)
{
    /* a list's candidates start on a multiple of align: QD_IQ_LIST_LOAD codes a load from
     * there read at most QD_IQ_LIST_LOAD - align past the last candidate's aligned end */
    return align == 1 ? end : (end + align - 1) / align * align + QD_IQ_LIST_LOAD - align;
}

#endif
