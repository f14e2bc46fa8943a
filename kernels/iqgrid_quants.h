/* The grid-searched ggml types one super-block at a time, by type, for the backends' drivers:
 * iq3_xxs (kernels/iq3xxs.h), iq1_s and iq1_m (kernels/iq1.h), each over its grid tables
 * (kernels/iqgrid.h). */
#ifndef QD_IQGRID_QUANTS_H
#define QD_IQGRID_QUANTS_H

#include "iq1.h"
#include "iq3xxs.h"

enum qd_iqgrid_type { QD_IQ3_XXS, QD_IQ1_S, QD_IQ1_M };

QD_HD int qd_iqgrid_block_bytes(int type)
{
    return type == QD_IQ3_XXS ? QD_IQ3XXS_BYTES : type == QD_IQ1_S ? QD_IQ1S_BYTES : QD_IQ1M_BYTES;
}

/* qw: the super-block's importance, or NULL (iq1_s requires one: its format entry says so) */
QD_HD void qd_iqgrid_quantize_block(int type, const struct qd_iq_grid *g, const float *x, const float *qw,
                                    uint8_t *blk)
{
    if (type == QD_IQ3_XXS)
        qd_iq3xxs_quantize(g, x, qw, blk);
    else if (type == QD_IQ1_S)
        qd_iq1s_quantize(g, x, qw, blk);
    else
        qd_iq1m_quantize(g, x, qw, blk);
}

QD_HD void qd_iqgrid_dequantize_block(int type, const struct qd_iq_grid *g, const uint8_t *blk, float *y)
{
    if (type == QD_IQ3_XXS)
        qd_iq3xxs_dequantize(g, blk, y);
    else if (type == QD_IQ1_S)
        qd_iq1s_dequantize(g, blk, y);
    else
        qd_iq1m_dequantize(g, blk, y);
}

/* the block's group k of 8 values (0..31), as the block's dequantize makes them */
QD_HD void qd_iqgrid_dequantize_eight(int type, const struct qd_iq_grid *g, const uint8_t *blk, int k, float *y)
{
    if (type == QD_IQ3_XXS)
        qd_iq3xxs_dequantize_eight(g, blk, k, y);
    else if (type == QD_IQ1_S)
        qd_iq1s_dequantize_eight(g, blk, k, y);
    else
        qd_iq1m_dequantize_eight(g, blk, k, y);
}

/* the host tables of a type, built on first use; NULL when memory ran out */
static inline const struct qd_iq_grid *qd_iqgrid_tables(int type)
{
    return type == QD_IQ3_XXS ? qd_iq3xxs_grid() : qd_iq1_grid();
}

#endif
