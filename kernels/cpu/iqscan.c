/* The scan tables of kernels/cpu/iqscan.h, built once from the host grid tables: every list of
 * the tables' neighbour array (count, then grid indices) becomes ceil(count / 8) blocks of
 * packed slots and grid indices, and every tuple the map sends to a list (map < 0, the list at
 * -map - 1, as the scalar code reads it) points at that list's blocks. */
#include "iqscan.h"

#include <pthread.h>
#include <stdlib.h>

#include "../iq2.h"
#include "../iqgrid.h"

struct scan_store {
    struct qd_iq_scan s;
    pthread_once_t once;
    int ok;
};

/* the slot of row r of grid point p (iqscan.h says what a slot is) */
typedef int (*slot_fn)(const void *tables, int p, int r);

static int iq3xxs_slot(const void *tables, int p, int r)
{
    return qd_iq_point(tables, p)[r]; /* the level: table entry l holds 2 l + 1 */
}

static int iq2xxs_slot(const void *tables, int p, int r)
{
    const struct qd_iq2_tables *t = tables;
    return (t->grid[p][r] - 1) / 2 + 4 * (r % 2); /* coordinates 1, 3, 5; odd rows the upper half */
}

static int build(struct qd_iq_scan *s, int dim, const int32_t *map, int tuples, const uint16_t *nb, size_t nb_len,
                 slot_fn slot, const void *tables)
{
    int32_t *first = malloc(sizeof(int32_t) * (size_t)tuples), *block_at = malloc(sizeof(int32_t) * nb_len);
    uint16_t *count = malloc(sizeof(uint16_t) * (size_t)tuples);
    uint32_t *slots = NULL;
    uint16_t *points = NULL;
    if (!first || !block_at || !count)
        goto fail;
    size_t blocks = 0;
    for (size_t at = 0; at < nb_len; at += 1 + (size_t)nb[at])
        blocks += ((size_t)nb[at] + 7) / 8;
    slots = calloc(blocks * (size_t)dim * 2, sizeof(uint32_t));
    points = malloc(blocks * 8 * sizeof(uint16_t));
    if (!slots || !points)
        goto fail;
    size_t b = 0;
    for (size_t at = 0; at < nb_len; at += 1 + (size_t)nb[at]) {
        const int n = nb[at];
        block_at[at] = (int32_t)b;
        for (int j = 0; j < (n + 7) / 8 * 8; j++) {
            const int p = nb[at + 1 + (j < n ? j : 0)], blk = (int)b + j / 8, c = j % 8;
            points[(size_t)blk * 8 + (size_t)c] = (uint16_t)p;
            for (int r = 0; r < dim; r++)
                slots[((size_t)blk * (size_t)dim / 4 + (size_t)r / 4) * 8 + (size_t)c] |= (uint32_t)slot(tables, p, r)
                                                                                           << 8 * (r % 4);
        }
        b += ((size_t)n + 7) / 8;
    }
    for (int u = 0; u < tuples; u++) {
        first[u] = 0;
        count[u] = 0;
        if (map[u] < 0 && (size_t)(-(int64_t)map[u] - 1) < nb_len) {
            first[u] = block_at[-map[u] - 1];
            count[u] = nb[-map[u] - 1];
        }
    }
    free(block_at);
    *s = (struct qd_iq_scan){.dim = dim, .first = first, .count = count, .slots = slots, .points = points};
    return 1;
fail:
    free(first);
    free(block_at);
    free(count);
    free(slots);
    free(points);
    return 0;
}

static struct scan_store iq3xxs = {.once = PTHREAD_ONCE_INIT}, iq2xxs = {.once = PTHREAD_ONCE_INIT};

static void iq3xxs_init(void)
{
    const struct qd_iq_grid *g = qd_iq3xxs_grid();
    iq3xxs.ok = g && build(&iq3xxs.s, 4, g->map, g->map_size, g->neighbours, g->neighbours_len, iq3xxs_slot, g);
}

static void iq2xxs_init(void)
{
    const struct qd_iq2_tables *t = qd_iq2_tables(QD_IQ2_XXS);
    iq2xxs.ok = t && build(&iq2xxs.s, 8, t->map, QD_IQ2_TUPLES, t->neighbours, (size_t)t->n_neighbours, iq2xxs_slot, t);
}

const struct qd_iq_scan *qd_iq3xxs_scan(void)
{
    pthread_once(&iq3xxs.once, iq3xxs_init);
    return iq3xxs.ok ? &iq3xxs.s : NULL;
}

const struct qd_iq_scan *qd_iq2xxs_scan(void)
{
    pthread_once(&iq2xxs.once, iq2xxs_init);
    return iq2xxs.ok ? &iq2xxs.s : NULL;
}
