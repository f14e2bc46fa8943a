/* kernels/iq3s.h and the tables kernels/iq3s.c builds (what the CPU reads and the CUDA backend
 * copies to each device): the neighbour lists follow ggml's rule, and the super-block code
 * keeps ggml's layout quirks. Bytes against ggml itself: tests/peers/test_imatrix.py. */
#include "helpers.h"
#include "iqlists.h"

#include "../../kernels/iq3s.h"

static int dist2(const struct qd_iq3s_tables *t, int u, int g)
{
    int d = 0;
    for (int k = 0; k < 4; k++) {
        int diff = t->grid[g][k] - (2 * ((u >> 3 * k) & 7) + 1);
        d += diff * diff;
    }
    return d;
}

/* Every tuple on the grid maps to its point; every other lists exactly the points at its three
 * smallest squared distances, by distance then index, and the lists fill the table. */
static void neighbour_lists_follow_ggml(void **state)
{
    (void)state;
    const struct qd_iq3s_tables *t = qd_iq3s_tables();
    assert_non_null(t);
    assert_ptr_equal(t, qd_iq3s_tables()); /* built once */
    int on_grid = 0;
    int64_t used = 0;
    for (int u = 0; u < QD_IQ3S_MAP; u++) {
        if (t->map[u] >= 0) {
            assert_int_equal(dist2(t, u, t->map[u]), 0);
            on_grid++;
            continue;
        }
        int d[3] = {1 << 30, 1 << 30, 1 << 30}; /* the three smallest distinct distances */
        for (int g = 0; g < QD_IQ3S_GRID; g++) {
            int x = dist2(t, u, g);
            assert_true(x > 0);
            if (x == d[0] || x == d[1] || x == d[2])
                continue;
            if (x < d[0])
                d[2] = d[1], d[1] = d[0], d[0] = x;
            else if (x < d[1])
                d[2] = d[1], d[1] = x;
            else if (x < d[2])
                d[2] = x;
        }
        const uint16_t *nb = t->neighbours + (-t->map[u] - 1);
        int want = 0;
        for (int g = 0; g < QD_IQ3S_GRID; g++)
            want += dist2(t, u, g) <= d[2];
        assert_int_equal(nb[0], want);
        const uint16_t *codes = t->codes + (nb - t->neighbours); /* beside it: the count, the points' levels */
        assert_int_equal(codes[0], nb[0]);
        for (int j = 1; j <= nb[0]; j++) {
            for (int k = 0; k < 4; k++)
                assert_int_equal(2 * (codes[j] >> 3 * k & 7) + 1, t->grid[nb[j]][k]);
            assert_true(dist2(t, u, nb[j]) <= d[2]);
            if (j > 1) {
                int a = dist2(t, u, nb[j - 1]), b = dist2(t, u, nb[j]);
                assert_true(a < b || (a == b && nb[j - 1] < nb[j]));
            }
        }
        used += 1 + nb[0];
    }
    assert_int_equal(on_grid, QD_IQ3S_GRID);
    assert_int_equal(used, 28317); /* the lists' entries, packed (ggml's length) */
    test_lists_placed(t->map, QD_IQ3S_MAP, t->neighbours, QD_IQ3S_NEIGHBOURS);
}

/* A zero sub-block does not advance ggml's code and sign pointers: the next sub-block's codes
 * and signs take its place and the last slots stay zero; its scale nibble is the lowest. An
 * all-zero super-block is all-zero bytes. */
static void zero_sub_block_shifts_the_codes(void **state)
{
    (void)state;
    const struct qd_iq3s_tables *t = qd_iq3s_tables();
    float x[QD_QK_K], y[QD_QK_K];
    uint8_t shifted[QD_IQ3S_BLOCK_BYTES], plain[QD_IQ3S_BLOCK_BYTES];
    for (int i = 0; i < QD_QK_K; i++)
        x[i] = (float)((i * 37) % 19 - 9) * 0.1f + 0.05f;
    qd_iq3s_quantize(t, x, NULL, plain);
    for (int i = 32; i < 64; i++)
        x[i] = 0.0f; /* sub-block 1 */
    qd_iq3s_quantize(t, x, NULL, shifted);
    /* sub-block 0 alike; sub-block 2's codes (and signs) in slot 1; the last slot empty */
    assert_memory_equal(shifted + 2, plain + 2, 8);
    assert_memory_equal(shifted + 2 + 8, plain + 2 + 16, 8);
    assert_memory_equal(shifted + 74 + 4, plain + 74 + 8, 4);
    for (int i = 2 + 56; i < 2 + 64; i++)
        assert_int_equal(shifted[i], 0);
    for (int i = 74 + 28; i < 74 + 32; i++)
        assert_int_equal(shifted[i], 0);
    /* decoding reads sub-block 1 from slot 1 at the lowest scale: not zeros, ggml's quirk */
    qd_iq3s_dequantize(t, shifted, y);
    int nonzero = 0;
    for (int i = 32; i < 64; i++)
        nonzero += y[i] != 0.0f;
    assert_true(nonzero > 0);
    for (int i = 0; i < QD_QK_K; i++)
        x[i] = 0.0f;
    qd_iq3s_quantize(t, x, NULL, shifted);
    for (int i = 0; i < QD_IQ3S_BLOCK_BYTES; i++)
        assert_int_equal(shifted[i], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(neighbour_lists_follow_ggml),
        cmocka_unit_test(zero_sub_block_shifts_the_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
