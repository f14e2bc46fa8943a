/* A check of where an IQ table's neighbour lists lie (kernels/iqlist.h), for the tests of each
 * table: the GPU's searches load a list's codes four at a time from its first candidate on. */
#ifndef QD_TEST_IQLISTS_H
#define QD_TEST_IQLISTS_H

#include "../../kernels/iqlist.h"

/* Every list the map sends a tuple to (map < 0: at -map - 1) starts its candidates on a
 * multiple of QD_IQ_LIST_ALIGN, and loads of QD_IQ_LIST_LOAD codes from there on end inside
 * the table of len entries. -1 is no list here (no count sits in slot 0): kernels/iqgrid.c
 * leaves the tuples no search reaches at -1. */
static inline void test_lists_placed(const int32_t *map, int tuples, const uint16_t *nb, int64_t len)
{
    int lists = 0;
    assert_int_equal(len % QD_IQ_LIST_ALIGN, 0);
    for (int u = 0; u < tuples; u++)
        if (map[u] < -1) {
            const int64_t at = -(int64_t)map[u] - 1;
            assert_int_equal((at + 1) % QD_IQ_LIST_ALIGN, 0);
            assert_true(at + 1 + (nb[at] + QD_IQ_LIST_LOAD - 1) / QD_IQ_LIST_LOAD * QD_IQ_LIST_LOAD <= len);
            lists++;
        }
    assert_true(lists > 0);
}

#endif
