/* ggml's IQ3_S on the CPU: 256-element super-blocks of eight 32-element sub-blocks, each value
 * |x| coded as one coordinate of a point of a 512-point grid in 4 dimensions (odd values 1..15),
 * signs apart, a 4-bit scale per sub-block and an f16 d. The contract is quantize_iq3_s (what
 * ggml_quantize_chunk and llama-quantize run, with or without an importance) and
 * dequantize_row_iq3_s; the same float operations in the same order. The grid's off-grid
 * neighbour lists are built once, as ggml's iq3xs_init_impl builds them (every 4-tuple of 3-bit
 * values not on the grid lists the grid points at its three smallest squared distances, ordered
 * by distance then index). docs/formats.md says what it stores. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../kquants.h"
#include "cpu.h"

/* The grid: point i has coordinates 2 * ((p >> 3k) & 7) + 1, k = 0..3, p = qd_iq3s_points[i]
 * (ggml's kgrid_512, the format's definition). */
static const uint16_t qd_iq3s_points[512] = {
    0x000, 0x001, 0x002, 0x005, 0x007, 0x008, 0x009, 0x00a, 0x00c, 0x00e, 0x010, 0x011, 0x015, 0x01b, 0x020, 0x022,
    0x025, 0x027, 0x029, 0x02b, 0x030, 0x032, 0x039, 0x03c, 0x03f, 0x040, 0x041, 0x042, 0x044, 0x048, 0x049, 0x04d,
    0x050, 0x053, 0x057, 0x059, 0x05d, 0x064, 0x071, 0x075, 0x07a, 0x080, 0x081, 0x085, 0x087, 0x088, 0x08b, 0x08e,
    0x091, 0x095, 0x098, 0x09c, 0x0a2, 0x0a5, 0x0a7, 0x0a9, 0x0ab, 0x0b8, 0x0bb, 0x0c3, 0x0c9, 0x0cd, 0x0d0, 0x0d2,
    0x0d9, 0x0db, 0x0de, 0x0e4, 0x0e8, 0x0ea, 0x0f7, 0x0f9, 0x0fd, 0x100, 0x10b, 0x10f, 0x111, 0x114, 0x11a, 0x120,
    0x123, 0x129, 0x138, 0x142, 0x144, 0x150, 0x152, 0x156, 0x15b, 0x161, 0x165, 0x167, 0x176, 0x17b, 0x186, 0x189,
    0x18b, 0x199, 0x1aa, 0x1b9, 0x1c0, 0x1c2, 0x1c4, 0x1d0, 0x1d2, 0x1d6, 0x1db, 0x1e8, 0x1ec, 0x200, 0x201, 0x202,
    0x204, 0x208, 0x209, 0x20b, 0x20d, 0x20f, 0x210, 0x212, 0x219, 0x21c, 0x21e, 0x22c, 0x22e, 0x231, 0x23a, 0x240,
    0x241, 0x243, 0x246, 0x248, 0x24c, 0x251, 0x258, 0x25b, 0x261, 0x268, 0x26a, 0x278, 0x27e, 0x280, 0x28a, 0x28d,
    0x28f, 0x290, 0x294, 0x29a, 0x2a0, 0x2a3, 0x2ad, 0x2b0, 0x2ba, 0x2c1, 0x2c4, 0x2c7, 0x2c8, 0x2cb, 0x2d1, 0x2d7,
    0x2d8, 0x2dc, 0x2e1, 0x2f2, 0x2f8, 0x303, 0x305, 0x30a, 0x30c, 0x319, 0x31b, 0x322, 0x326, 0x328, 0x32c, 0x341,
    0x348, 0x34b, 0x351, 0x358, 0x35a, 0x369, 0x390, 0x394, 0x397, 0x3a4, 0x3a6, 0x3c1, 0x3c3, 0x3c8, 0x3ca, 0x3d1,
    0x3dd, 0x3e1, 0x3f2, 0x3f8, 0x400, 0x401, 0x403, 0x405, 0x407, 0x408, 0x40a, 0x40c, 0x40e, 0x411, 0x413, 0x417,
    0x418, 0x41a, 0x421, 0x423, 0x425, 0x428, 0x42a, 0x437, 0x438, 0x43b, 0x43d, 0x440, 0x442, 0x448, 0x44b, 0x44f,
    0x452, 0x455, 0x459, 0x45c, 0x462, 0x469, 0x481, 0x484, 0x487, 0x491, 0x493, 0x498, 0x49f, 0x4a1, 0x4ab, 0x4af,
    0x4b9, 0x4bc, 0x4c0, 0x4c2, 0x4c5, 0x4c9, 0x4d2, 0x4d4, 0x4d9, 0x4db, 0x4e2, 0x4e8, 0x4f6, 0x501, 0x507, 0x510,
    0x513, 0x51a, 0x51d, 0x521, 0x53a, 0x53d, 0x544, 0x549, 0x552, 0x55f, 0x560, 0x56b, 0x578, 0x580, 0x582, 0x587,
    0x591, 0x5ad, 0x5b1, 0x5c5, 0x5c9, 0x5d6, 0x5d8, 0x5e3, 0x5e8, 0x602, 0x609, 0x60b, 0x60d, 0x60f, 0x612, 0x619,
    0x61b, 0x61d, 0x622, 0x624, 0x627, 0x629, 0x633, 0x639, 0x641, 0x643, 0x645, 0x64c, 0x651, 0x653, 0x660, 0x670,
    0x67a, 0x67e, 0x680, 0x68a, 0x690, 0x69a, 0x69c, 0x6a8, 0x6c1, 0x6c8, 0x6cc, 0x6d1, 0x6d3, 0x6d7, 0x6d8, 0x6e1,
    0x6e3, 0x6e7, 0x6ed, 0x6fb, 0x703, 0x709, 0x70e, 0x712, 0x719, 0x72a, 0x730, 0x734, 0x741, 0x748, 0x74a, 0x755,
    0x75a, 0x764, 0x76e, 0x77b, 0x78e, 0x7a1, 0x7c1, 0x7c3, 0x7d0, 0x7d2, 0x7dd, 0x800, 0x804, 0x80a, 0x810, 0x814,
    0x817, 0x81a, 0x821, 0x828, 0x838, 0x842, 0x847, 0x849, 0x84b, 0x852, 0x858, 0x85d, 0x863, 0x869, 0x86d, 0x881,
    0x883, 0x888, 0x88d, 0x891, 0x89b, 0x8a0, 0x8af, 0x8b2, 0x8b8, 0x8c4, 0x8c9, 0x8cb, 0x8d0, 0x8d2, 0x8d9, 0x8dd,
    0x900, 0x902, 0x914, 0x91f, 0x920, 0x939, 0x945, 0x947, 0x951, 0x972, 0x98b, 0x99c, 0x9b0, 0x9c8, 0x9cd, 0x9d8,
    0x9e3, 0x9e9, 0xa02, 0xa08, 0xa0c, 0xa12, 0xa20, 0xa24, 0xa27, 0xa2a, 0xa36, 0xa3c, 0xa41, 0xa43, 0xa45, 0xa4a,
    0xa51, 0xa5a, 0xa7a, 0xa80, 0xa89, 0xa93, 0xa98, 0xa9e, 0xaab, 0xac2, 0xac7, 0xac8, 0xad7, 0xae4, 0xae9, 0xaf5,
    0xafb, 0xb01, 0xb04, 0xb10, 0xb1a, 0xb26, 0xb4a, 0xb56, 0xb69, 0xb6b, 0xba2, 0xbc2, 0xbc4, 0xbd2, 0xc09, 0xc0b,
    0xc0d, 0xc19, 0xc1b, 0xc30, 0xc40, 0xc50, 0xc57, 0xc74, 0xc8a, 0xc9c, 0xca2, 0xcad, 0xcb2, 0xcb8, 0xcc0, 0xccc,
    0xcd1, 0xce0, 0xd15, 0xd23, 0xd32, 0xd40, 0xd43, 0xd5c, 0xd70, 0xd85, 0xda0, 0xdc9, 0xdcb, 0xe00, 0xe04, 0xe07,
    0xe10, 0xe12, 0xe1e, 0xe20, 0xe2c, 0xe32, 0xe42, 0xe49, 0xe54, 0xe63, 0xe65, 0xe81, 0xe84, 0xe88, 0xe8e, 0xe91,
    0xe98, 0xea9, 0xec2, 0xeda, 0xedd, 0xeeb, 0xf01, 0xf05, 0xf0b, 0xf10, 0xf28, 0xf52, 0xf62, 0xf82, 0xf99, 0xfc0,
};

#define IQ3S_MAP 4096 /* 4 x 3 bits */

static struct {
    uint8_t grid[512][4];
    int map[IQ3S_MAP];     /* 4-tuple -> its grid index, or -(offset + 1) of its neighbour list */
    uint16_t *neighbours;  /* per off-grid tuple: the count, then the grid indices */
} iq3s;
static pthread_once_t iq3s_once = PTHREAD_ONCE_INIT;

static int by_distance_then_index(const void *a, const void *b)
{
    const int *l = a, *r = b;
    return l[0] != r[0] ? (l[0] < r[0] ? -1 : 1) : (l[1] < r[1] ? -1 : l[1] > r[1]);
}

/* Sorted (squared distance, index) pairs of every grid point from tuple u; returns how many
 * lie within its three smallest distances. */
static int iq3s_nearest(int u, int *dist)
{
    for (int j = 0; j < 512; j++) {
        int d2 = 0;
        for (int k = 0; k < 4; k++) {
            int diff = iq3s.grid[j][k] - (2 * ((u >> 3 * k) & 7) + 1);
            d2 += diff * diff;
        }
        dist[2 * j] = d2;
        dist[2 * j + 1] = j;
    }
    qsort(dist, 512, 2 * sizeof(int), by_distance_then_index);
    int n = 0, distinct = 1, d2 = dist[0];
    for (int j = 0; j < 512; j++, n++)
        if (dist[2 * j] > d2) {
            if (distinct == 3)
                break;
            d2 = dist[2 * j];
            distinct++;
        }
    return n;
}

static void iq3s_init(void)
{
    for (int i = 0; i < 512; i++)
        for (int k = 0; k < 4; k++)
            iq3s.grid[i][k] = (uint8_t)(2 * ((qd_iq3s_points[i] >> 3 * k) & 7) + 1);
    for (int u = 0; u < IQ3S_MAP; u++)
        iq3s.map[u] = -1;
    for (int i = 0; i < 512; i++)
        iq3s.map[qd_iq3s_points[i] & 0xfff] = i;
    static int dist[2 * 512];
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        size_t at = 0;
        for (int u = 0; u < IQ3S_MAP; u++) {
            if (iq3s.map[u] >= 0) /* on the grid (off-grid tuples stay -1 until filled) */
                continue;
            int n = iq3s_nearest(u, dist);
            if (pass == 1) {
                iq3s.neighbours[at] = (uint16_t)n;
                for (int j = 0; j < n; j++)
                    iq3s.neighbours[at + 1 + j] = (uint16_t)dist[2 * j + 1];
                iq3s.map[u] = -(int)(at + 1);
            }
            at += 1 + (size_t)n;
        }
        if (pass == 0 && !(iq3s.neighbours = malloc(at * sizeof(uint16_t))))
            abort(); /* some 40 KiB, once */
    }
}

/* The neighbour of tuple u (off the grid) nearest xval at this scale, weighted (the first of
 * equals); its coordinates' 3-bit values into L, and its index. */
static int iq3s_best_neighbour(int u, const float *xval, const float *w, float scale, int8_t *L)
{
    const uint16_t *nb = iq3s.neighbours + (-iq3s.map[u] - 1);
    float best_d2 = 3.40282347e38f;
    int best = -1;
    for (int j = 1; j <= nb[0]; j++) {
        float d2 = 0.0f;
        for (int i = 0; i < 4; i++) {
            float diff = scale * (float)iq3s.grid[nb[j]][i] - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    if (best < 0) /* every distance overflowed (values near f32's range): ggml aborts; the first */
        best = nb[1];
    for (int i = 0; i < 4; i++)
        L[i] = (int8_t)((iq3s.grid[best][i] - 1) / 2);
    return best;
}

static int iq3s_tuple(const int8_t *L) { return L[0] | L[1] << 3 | L[2] << 6 | L[3] << 9; }

/* 3-bit value of x at inverse scale id: round((id x - 1) / 2) in [0, 7] */
static int iq3s_level(float id, float x) { return qd_kq_clampi(qd_kq_round(0.5f * (id * x - 1.0f)), 0, 7); }

/* quantize_row_iq3_s_impl for one super-block. blk: d, qs[64], qh[8], signs[32], scales[4]. */
static void iq3s_quantize(const float *x, const float *qw, uint8_t *blk)
{
    memset(blk, 0, 110);
    qd_put_f16(blk, 0.0f);
    uint8_t *qs = blk + 2, *qh = blk + 66, *signs = blk + 74, *sc = blk + 106;
    float scales[8], weight[32], waux[32], xval[32];
    int8_t L[32], Laux[32];
    int on_grid[8], on_grid_aux[8];
    uint8_t bsigns[4];
    float sumx2 = 0.0f;
    for (int i = 0; i < QD_QK_K; i++)
        sumx2 += x[i] * x[i];
    const float sigma2 = 2.0f * sumx2 / (float)QD_QK_K;
    float max_scale = 0.0f;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        for (int i = 0; i < 32; i++)
            weight[i] = qw ? qw[32 * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
        for (int i = 0; i < 32; i++)
            waux[i] = sqrtf(weight[i]);
        for (int k = 0; k < 4; k++) {
            uint8_t s = 0;
            for (int i = 0; i < 8; i++) {
                const float v = xb[8 * k + i];
                xval[8 * k + i] = v >= 0.0f ? v : -v;
                if (!(v >= 0.0f))
                    s |= (uint8_t)(1 << i);
            }
            bsigns[k] = s;
        }
        float max = xval[0];
        for (int i = 1; i < 32; i++)
            max = max > xval[i] ? max : xval[i];
        memset(L, 0, sizeof L);
        if (max == 0.0f) {
            /* ggml moves on without advancing its code and sign pointers: the next sub-block's
             * land here */
            scales[ib] = 0.0f;
            continue;
        }
        float best = 0.0f, scale = max / 15.0f;
        for (int k = 0; k < 8; k++)
            on_grid[k] = 0;
        for (int is = -9; is <= 9; is++) {
            const float id = (15.0f + (float)is * 0.2f) / max, this_scale = 1.0f / id;
            for (int k = 0; k < 8; k++) {
                for (int i = 0; i < 4; i++)
                    Laux[4 * k + i] = (int8_t)iq3s_level(id, xval[4 * k + i]);
                const int u = iq3s_tuple(Laux + 4 * k);
                on_grid_aux[k] = iq3s.map[u] >= 0;
                if (!on_grid_aux[k])
                    iq3s_best_neighbour(u, xval + 4 * k, waux + 4 * k, this_scale, Laux + 4 * k);
            }
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int i = 0; i < 32; i++) {
                const float w = weight[i], q = (float)(2 * Laux[i] + 1);
                sumqx += w * xval[i] * q;
                sumq2 += w * q * q;
            }
            if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                memcpy(L, Laux, sizeof L);
                memcpy(on_grid, on_grid_aux, sizeof on_grid);
            }
        }
        int off_grid = 0;
        for (int k = 0; k < 8; k++)
            off_grid += !on_grid[k];
        if (off_grid > 0 && scale > 0.0f) {
            const float id = 1.0f / scale;
            for (int k = 0; k < 8; k++) {
                int8_t l[4];
                for (int i = 0; i < 4; i++)
                    l[i] = (int8_t)iq3s_level(id, xval[4 * k + i]);
                const int u = iq3s_tuple(l);
                const int g = iq3s.map[u] >= 0 ? iq3s.map[u] : iq3s_best_neighbour(u, xval + 4 * k, waux + 4 * k,
                                                                                   scale, L + 4 * k);
                for (int i = 0; i < 4; i++)
                    L[4 * k + i] = (int8_t)((iq3s.grid[g][i] - 1) / 2);
            }
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int i = 0; i < 32; i++) {
                const float w = weight[i], q = (float)(2 * L[i] + 1);
                sumqx += w * xval[i] * q;
                sumq2 += w * q * q;
            }
            if (sumq2 > 0.0f)
                scale = sumqx / sumq2;
        }
        if (scale < 0.0f) { /* ggml's guard: a positive scale, the signs flipped */
            scale = -scale;
            for (int k = 0; k < 4; k++)
                bsigns[k] = (uint8_t)~bsigns[k];
        }
        for (int k = 0; k < 8; k++) {
            const int g = iq3s.map[iq3s_tuple(L + 4 * k)]; /* on the grid by construction */
            qs[k] = (uint8_t)(g & 255);
            qh[(ib * 8 + k) / 8] |= (uint8_t)((g >> 8) << ((ib * 8 + k) % 8));
        }
        qs += 8;
        memcpy(signs, bsigns, 4);
        signs += 4;
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (max_scale == 0.0f)
        return;
    const float d = max_scale / 31.0f;
    qd_put_f16(blk, d * 1.033f);
    const float id = 1.0f / d;
    for (int ib = 0; ib < 8; ib += 2) {
        int l1 = qd_kq_clampi(qd_kq_round(0.5f * (id * scales[ib] - 1.0f)), 0, 15);
        int l2 = qd_kq_clampi(qd_kq_round(0.5f * (id * scales[ib + 1] - 1.0f)), 0, 15);
        sc[ib / 2] = (uint8_t)(l1 | l2 << 4);
    }
}

/* dequantize_row_iq3_s for one super-block */
static void iq3s_dequantize(const uint8_t *blk, float *y)
{
    const float d = qd_get_f16(blk);
    const uint8_t *qs = blk + 2, *qh = blk + 66, *signs = blk + 74;
    for (int ib = 0; ib < 8; ib++, qs += 8, signs += 4) {
        const int s = blk[106 + ib / 2] >> 4 * (ib % 2) & 0xf;
        const float db = d * (float)(1 + 2 * s);
        for (int l = 0; l < 4; l++, y += 8) {
            const int h = qh[ib / 2 * 2 + ib % 2];
            const uint8_t *g1 = iq3s.grid[qs[2 * l] | ((h << (8 - 2 * l)) & 256)];
            const uint8_t *g2 = iq3s.grid[qs[2 * l + 1] | ((h << (7 - 2 * l)) & 256)];
            for (int j = 0; j < 4; j++) {
                y[j] = db * (float)g1[j] * (signs[l] & (1 << j) ? -1.0f : 1.0f);
                y[j + 4] = db * (float)g2[j] * (signs[l] & (1 << (j + 4)) ? -1.0f : 1.0f);
            }
        }
    }
}

struct iq3s_ctx {
    uint8_t *data;
    const uint8_t *cdata;
    const struct qd_params *p;
    const struct qd_tensor *in;
};

static void iq3s_quantize_span(void *c, int tid, const float *x, int64_t first, int64_t n)
{
    struct iq3s_ctx *k = c;
    (void)tid;
    const int64_t cols = k->in->cols;
    for (int64_t b = 0; b < n / QD_QK_K; b++) {
        const int64_t e = first + b * QD_QK_K;
        const float *qw = k->p->importance ? qd_importance_row(k->p, k->in, e / cols) + e % cols : NULL;
        iq3s_quantize(x + b * QD_QK_K, qw, k->data + e / QD_QK_K * 110);
    }
}

static void iq3s_dequantize_span(void *c, int tid, float *y, int64_t first, int64_t n)
{
    struct iq3s_ctx *k = c;
    (void)tid;
    for (int64_t b = 0; b < n / QD_QK_K; b++)
        iq3s_dequantize(k->cdata + (first / QD_QK_K + b) * 110, y + b * QD_QK_K);
}

enum qd_status qd_cpu_iq3s_quantize(const struct qd_format *f, const struct qd_tensor *in, struct qd_params *p,
                                    void *const *out)
{
    (void)f;
    pthread_once(&iq3s_once, iq3s_init);
    struct iq3s_ctx k = {.data = out[0], .p = p, .in = in};
    return qd_cpu_spans(in, QD_QK_K, iq3s_quantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}

enum qd_status qd_cpu_iq3s_dequantize(const struct qd_format *f, const void *const *in, const struct qd_params *p,
                                      struct qd_tensor *out)
{
    (void)f, (void)p;
    pthread_once(&iq3s_once, iq3s_init);
    struct iq3s_ctx k = {.cdata = in[0]};
    return qd_cpu_out_spans(out, QD_QK_K, iq3s_dequantize_span, &k) < 0 ? QD_ENOMEM : QD_OK;
}
