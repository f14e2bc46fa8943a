/* Every ggml block type as model files hold it (ggml/src/ggml-common.h's block_* structs, f16
 * scales as their bits): the one place for their sizes. The registry, the GGUF reader's type
 * table (server/checkpoint/gguf.c) and each family's size function read sizeof of these; each
 * size is asserted against ggml's. The code reads and writes blocks as bytes, in this order;
 * no struct here has padding (every size below is the sum of its fields, as ggml asserts).
 * Plain C that nvcc takes too: the kernels/ headers are shared by the CPU and CUDA backends. */
#ifndef QD_GGML_BLOCKS_H
#define QD_GGML_BLOCKS_H

#include "fp.h"

#define QD_GGML_QK 32 /* elements of the 32-element blocks (QK4_0 ... QK8_1, QK4_NL, QK_MXFP4) */
#define QD_QK_K 256   /* elements of a K-quant, IQ or ternary super-block (QK_K) */
/* the types quantd reads the size of but does not write */
#define QD_GGML_NVFP4_QK 64
#define QD_GGML_Q1_0_QK 128
#define QD_GGML_Q2_0_QK 64

/* ---- 32-element blocks: an f16 scale (and minimum), then the codes ----------------------- */
struct qd_block_q4_0 { uint16_t d; uint8_t qs[QD_GGML_QK / 2]; };
struct qd_block_q4_1 { uint16_t d, m; uint8_t qs[QD_GGML_QK / 2]; };
struct qd_block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QD_GGML_QK / 2]; };
struct qd_block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QD_GGML_QK / 2]; };
struct qd_block_q8_0 { uint16_t d; int8_t qs[QD_GGML_QK]; };
struct qd_block_q8_1 { uint16_t d, s; int8_t qs[QD_GGML_QK]; };
QD_STATIC_ASSERT(sizeof(struct qd_block_q4_0) == 18, "block_q4_0: f16 d, 16 bytes of nibbles");
QD_STATIC_ASSERT(sizeof(struct qd_block_q4_1) == 20, "block_q4_1: f16 d and m, 16 bytes of nibbles");
QD_STATIC_ASSERT(sizeof(struct qd_block_q5_0) == 22, "block_q5_0: f16 d, 4 bytes of high bits, 16 of nibbles");
QD_STATIC_ASSERT(sizeof(struct qd_block_q5_1) == 24, "block_q5_1: f16 d and m, 4 + 16 bytes");
QD_STATIC_ASSERT(sizeof(struct qd_block_q8_0) == 34, "block_q8_0: f16 d, 32 int8");
QD_STATIC_ASSERT(sizeof(struct qd_block_q8_1) == 36, "block_q8_1: f16 d and s, 32 int8");

/* iq4_nl: f16 d, 32 4-bit indices into the non-linear grid */
struct qd_block_iq4_nl { uint16_t d; uint8_t qs[QD_GGML_QK / 2]; };
/* ggml's own MXFP4 (block_mxfp4): an E8M0 exponent, 32 E2M1 codes */
struct qd_block_mxfp4_ggml { uint8_t e; uint8_t qs[QD_GGML_QK / 2]; };
QD_STATIC_ASSERT(sizeof(struct qd_block_iq4_nl) == 18, "block_iq4_nl: f16 d, 16 bytes of nibbles");
QD_STATIC_ASSERT(sizeof(struct qd_block_mxfp4_ggml) == 17, "block_mxfp4: an E8M0 byte, 16 bytes of E2M1 pairs");

/* ---- K-quant super-blocks (256 elements) ------------------------------------------------- */
struct qd_block_q2_K { uint8_t scales[QD_QK_K / 16]; uint8_t qs[QD_QK_K / 4]; uint16_t d, dmin; };
struct qd_block_q3_K { uint8_t hmask[QD_QK_K / 8]; uint8_t qs[QD_QK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct qd_block_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QD_QK_K / 2]; };
struct qd_block_q5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QD_QK_K / 8]; uint8_t qs[QD_QK_K / 2]; };
struct qd_block_q6_K { uint8_t ql[QD_QK_K / 2]; uint8_t qh[QD_QK_K / 4]; int8_t scales[QD_QK_K / 16]; uint16_t d; };
/* ggml's dot-product intermediate (an f32 d and the sums of 16): read, never written */
struct qd_block_q8_K { float d; int8_t qs[QD_QK_K]; int16_t bsums[QD_QK_K / 16]; };
QD_STATIC_ASSERT(sizeof(struct qd_block_q2_K) == 84, "block_q2_K: 16 + 64 bytes, f16 d and dmin");
QD_STATIC_ASSERT(sizeof(struct qd_block_q3_K) == 110, "block_q3_K: 32 + 64 + 12 bytes, f16 d");
QD_STATIC_ASSERT(sizeof(struct qd_block_q4_K) == 144, "block_q4_K: f16 d and dmin, 12 + 128 bytes");
QD_STATIC_ASSERT(sizeof(struct qd_block_q5_K) == 176, "block_q5_K: f16 d and dmin, 12 + 32 + 128 bytes");
QD_STATIC_ASSERT(sizeof(struct qd_block_q6_K) == 210, "block_q6_K: 128 + 64 + 16 bytes, f16 d");
QD_STATIC_ASSERT(sizeof(struct qd_block_q8_K) == 292, "block_q8_K: f32 d, 256 int8, 16 int16 sums");

/* ---- IQ super-blocks (256 elements) ------------------------------------------------------ */
/* iq4_xs: f16 d, the high 2 bits of eight 6-bit scales, their low 4 bits, 4-bit grid indices */
struct qd_block_iq4_xs { uint16_t d; uint16_t scales_h; uint8_t scales_l[QD_QK_K / 64]; uint8_t qs[QD_QK_K / 2]; };
/* iq3_s: f16 d, low 8 bits of 64 grid indices, their ninth bits, sign bits, 4-bit scales */
struct qd_block_iq3_s {
    uint16_t d;
    uint8_t qs[QD_QK_K / 4];
    uint8_t qh[QD_QK_K / 32];
    uint8_t signs[QD_QK_K / 8];
    uint8_t scales[QD_QK_K / 64];
};
/* iq3_xxs: f16 d, 64 grid indices, then 8 x u32 of 4 x 7 sign bits and a 4-bit scale */
struct qd_block_iq3_xxs { uint16_t d; uint8_t qs[3 * QD_QK_K / 8]; };
/* iq2_xxs: f16 d, per 32 elements two u32 words (four grid indices; 4 x 7 sign bits and a scale) */
struct qd_block_iq2_xxs { uint16_t d; uint16_t qs[QD_QK_K / 8]; };
/* iq2_xs: f16 d, 32 u16 of a 9-bit grid index and 7 sign bits, two 4-bit scales per byte */
struct qd_block_iq2_xs { uint16_t d; uint16_t qs[QD_QK_K / 8]; uint8_t scales[QD_QK_K / 32]; };
/* iq2_s: f16 d, low 8 bits of 32 grid indices, then 32 sign bytes, their high 2 bits, 4-bit scales */
struct qd_block_iq2_s { uint16_t d; uint8_t qs[QD_QK_K / 4]; uint8_t qh[QD_QK_K / 32]; uint8_t scales[QD_QK_K / 32]; };
/* iq1_s: f16 d, low 8 bits of 32 grid indices, per 32 elements a u16 of 4 x 3 high bits, a 3-bit
 * scale and the shift's sign */
struct qd_block_iq1_s { uint16_t d; uint8_t qs[QD_QK_K / 8]; uint16_t qh[QD_QK_K / 32]; };
/* iq1_m: low 8 bits of 32 grid indices, 16 bytes of 2 x (3 high bits, shift sign), 3-bit scales
 * with the f16 d spread over their top bits (no d of its own) */
struct qd_block_iq1_m { uint8_t qs[QD_QK_K / 8]; uint8_t qh[QD_QK_K / 16]; uint8_t scales[QD_QK_K / 32]; };
QD_STATIC_ASSERT(sizeof(struct qd_block_iq4_xs) == 136, "block_iq4_xs: f16 d, u16 scales_h, 4 + 128 bytes");
QD_STATIC_ASSERT(sizeof(struct qd_block_iq3_s) == 110, "block_iq3_s: f16 d, 64 + 8 + 32 + 4 bytes");
QD_STATIC_ASSERT(sizeof(struct qd_block_iq3_xxs) == 98, "block_iq3_xxs: f16 d, 96 bytes");
QD_STATIC_ASSERT(sizeof(struct qd_block_iq2_xxs) == 66, "block_iq2_xxs: f16 d, 32 u16");
QD_STATIC_ASSERT(sizeof(struct qd_block_iq2_xs) == 74, "block_iq2_xs: f16 d, 32 u16, 8 bytes of scales");
QD_STATIC_ASSERT(sizeof(struct qd_block_iq2_s) == 82, "block_iq2_s: f16 d, 64 + 8 + 8 bytes");
QD_STATIC_ASSERT(sizeof(struct qd_block_iq1_s) == 50, "block_iq1_s: f16 d, 32 bytes, 8 u16");
QD_STATIC_ASSERT(sizeof(struct qd_block_iq1_m) == 56, "block_iq1_m: 32 + 16 + 8 bytes");

/* ---- ternary super-blocks (256 elements) -------------------------------------------------- */
/* tq1_0: 240 codes five per byte (3^5 < 256), 16 four per byte, f16 d last */
struct qd_block_tq1_0 { uint8_t qs[(QD_QK_K - 4 * QD_QK_K / 64) / 5]; uint8_t qh[QD_QK_K / 64]; uint16_t d; };
/* tq2_0: 2 bits per code, f16 d last */
struct qd_block_tq2_0 { uint8_t qs[QD_QK_K / 4]; uint16_t d; };
QD_STATIC_ASSERT(sizeof(struct qd_block_tq1_0) == 54, "block_tq1_0: 48 + 4 bytes, f16 d");
QD_STATIC_ASSERT(sizeof(struct qd_block_tq2_0) == 66, "block_tq2_0: 64 bytes, f16 d");

/* ---- the other GGUF block types (read, never written) ------------------------------------- */
/* ggml's NVFP4 (block_nvfp4): four UE4M3 scales, one per 16 elements, 64 E2M1 codes */
struct qd_block_nvfp4_ggml { uint8_t d[QD_GGML_NVFP4_QK / 16]; uint8_t qs[QD_GGML_NVFP4_QK / 2]; };
/* q1_0: f16 d, one bit per element */
struct qd_block_q1_0 { uint16_t d; uint8_t qs[QD_GGML_Q1_0_QK / 8]; };
/* q2_0: f16 d, two bits per element */
struct qd_block_q2_0 { uint16_t d; uint8_t qs[QD_GGML_Q2_0_QK / 4]; };
QD_STATIC_ASSERT(sizeof(struct qd_block_nvfp4_ggml) == 36, "block_nvfp4: 4 scale bytes, 32 bytes of E2M1 pairs");
QD_STATIC_ASSERT(sizeof(struct qd_block_q1_0) == 18, "block_q1_0: f16 d, 16 bytes of bits");
QD_STATIC_ASSERT(sizeof(struct qd_block_q2_0) == 18, "block_q2_0: f16 d, 16 bytes of 2-bit codes");

#endif
