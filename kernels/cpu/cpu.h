/* CPU backend internals: the parallel span drivers and each family's entry points. */
#ifndef QD_CPU_H
#define QD_CPU_H

#include "../registry.h"

#define QD_CPU_MAX_THREADS 64

/* Worker count for the CPU backend (default: online cores). */
void qd_cpu_set_threads(int n);
int qd_cpu_threads(void);

/* fn sees the input as f32: x holds elements [first, first + n) of the flattened tensor. */
typedef void (*qd_span_fn)(void *ctx, int tid, const float *x, int64_t first, int64_t n);
/* fn writes f32 values of elements [first, first + n) into y. */
typedef void (*qd_out_span_fn)(void *ctx, int tid, float *y, int64_t first, int64_t n);

/* Calls fn over consecutive spans of the flattened input, split across threads. Every span
 * starts at a multiple of `align` elements and, but for the last, holds a multiple of it.
 * Returns the number of threads used (tid < that), or -1 on allocation failure. */
int qd_cpu_spans(const struct qd_tensor *in, int64_t align, qd_span_fn fn, void *ctx);
/* The same for a kernel that finds NaN/Inf itself while it reads (saving the driver's scan):
 * it calls qd_cpu_note_nonfinite with the absolute index of each block's first one. */
int qd_cpu_spans_self_checked(const struct qd_tensor *in, int64_t align, qd_span_fn fn, void *ctx);
/* Records a bad index (the least wins) when the pass has a non-finite check armed; a kernel
 * under qd_cpu_spans may add its own (a flagged one: QD_BAD_AWQ_F16_RANGE). */
void qd_cpu_note_nonfinite(int64_t index);
/* Same for writing a tensor: fn produces f32, the driver stores it as out->dtype. */
int qd_cpu_out_spans(struct qd_tensor *out, int64_t align, qd_out_span_fn fn, void *ctx);
/* Threads qd_cpu_spans would use for n elements (to size per-thread partials). */
int qd_cpu_threads_for(int64_t n);

/* Runs fn(ctx, tid, n) for tid in [0, n) on n threads and returns when all are done (the
 * model engine's ops split their own work by tid). */
typedef void (*qd_parallel_fn)(void *ctx, int tid, int n);
void qd_cpu_parallel(int n, qd_parallel_fn fn, void *ctx);

/* Arms a non-finite check on the next input pass this thread drives (qd_cpu_spans): *first_bad
 * becomes the first NaN/Inf index or stays -1. qd_cpu_scan_end returns 1 when a pass took it. */
void qd_cpu_scan_begin(int64_t *first_bad);
int qd_cpu_scan_end(void);

/* First non-finite element index, or -1. */
int64_t qd_cpu_find_nonfinite(const struct qd_tensor *in);
/* max |x|, min, max over the tensor (exact: order does not matter). */
void qd_cpu_minmax(const struct qd_tensor *in, float *amax, float *min, float *max);

/* Per-family entry points, registered in kernels/registry.c. */
enum qd_status qd_cpu_bnb4_quantize(const struct qd_format *, const struct qd_tensor *,
                                    struct qd_params *, void *const *);
enum qd_status qd_cpu_bnb4_dequantize(const struct qd_format *, const void *const *,
                                      const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_ggml_quantize(const struct qd_format *, const struct qd_tensor *,
                                    struct qd_params *, void *const *);
enum qd_status qd_cpu_ggml_dequantize(const struct qd_format *, const void *const *,
                                      const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_kquant_quantize(const struct qd_format *, const struct qd_tensor *,
                                      struct qd_params *, void *const *);
enum qd_status qd_cpu_kquant_dequantize(const struct qd_format *, const void *const *,
                                        const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_iquant_quantize(const struct qd_format *, const struct qd_tensor *,
                                      struct qd_params *, void *const *);
enum qd_status qd_cpu_iquant_dequantize(const struct qd_format *, const void *const *,
                                        const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_iq3s_quantize(const struct qd_format *, const struct qd_tensor *,
                                    struct qd_params *, void *const *);
enum qd_status qd_cpu_iq3s_dequantize(const struct qd_format *, const void *const *,
                                      const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_iqgrid_quantize(const struct qd_format *, const struct qd_tensor *,
                                      struct qd_params *, void *const *);
enum qd_status qd_cpu_iqgrid_dequantize(const struct qd_format *, const void *const *,
                                        const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_iq2_quantize(const struct qd_format *, const struct qd_tensor *,
                                   struct qd_params *, void *const *);
enum qd_status qd_cpu_iq2_dequantize(const struct qd_format *, const void *const *,
                                     const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_ctint_quantize(const struct qd_format *, const struct qd_tensor *,
                                     struct qd_params *, void *const *);
enum qd_status qd_cpu_ctint_dequantize(const struct qd_format *, const void *const *,
                                       const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_awq_quantize(const struct qd_format *, const struct qd_tensor *,
                                   struct qd_params *, void *const *);
enum qd_status qd_cpu_awq_dequantize(const struct qd_format *, const void *const *,
                                     const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_mx_quantize(const struct qd_format *, const struct qd_tensor *,
                                  struct qd_params *, void *const *);
enum qd_status qd_cpu_mx_dequantize(const struct qd_format *, const void *const *,
                                    const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_nvfp4_quantize(const struct qd_format *, const struct qd_tensor *,
                                     struct qd_params *, void *const *);
enum qd_status qd_cpu_nvfp4_dequantize(const struct qd_format *, const void *const *,
                                       const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_int8_quantize(const struct qd_format *, const struct qd_tensor *,
                                    struct qd_params *, void *const *);
enum qd_status qd_cpu_int8_dequantize(const struct qd_format *, const void *const *,
                                      const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_mlx_quantize(const struct qd_format *, const struct qd_tensor *,
                                   struct qd_params *, void *const *);
enum qd_status qd_cpu_mlx_dequantize(const struct qd_format *, const void *const *,
                                     const struct qd_params *, struct qd_tensor *);
enum qd_status qd_cpu_fp8_quantize(const struct qd_format *, const struct qd_tensor *,
                                   struct qd_params *, void *const *);
enum qd_status qd_cpu_fp8_dequantize(const struct qd_format *, const void *const *,
                                     const struct qd_params *, struct qd_tensor *);

#endif
