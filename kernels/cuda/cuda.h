/* The CUDA backend's entry points (one kernels/cuda file per family), registered in the same registry entries
 * as the CPU ones. They take DEVICE pointers (the tensor's data, the component buffers) and run
 * on the calling thread's context: its stream and scratch memory (set by the worker with
 * qd_cuda_ctx_set). They return with the work queued on that stream (the caller copies the
 * results back in stream order); a quantize's non-finite check and device-computed params
 * (the nf4/fp4 offset) are settled by qd_cuda_finish once the stream has run, so a call adds
 * no synchronization of its own except where the host needs a value mid-call (a tensor scale). */
#ifndef QD_CUDA_H
#define QD_CUDA_H

#include <stdint.h>

#include "../registry.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qd_cuda_ctx {
    void *stream;       /* cudaStream_t */
    void *scratch;      /* device: flags and reduction partials, QD_CUDA_SCRATCH_BYTES */
    void *host_scratch; /* pinned host mirror of the same size */
    void *host_scratch_dev; /* the mirror's address for kernels (mapped), NULL where not mapped */
    int64_t bad_index;  /* out: first non-finite input element, when a quantize says so */
    /* what qd_cuda_finish settles for the last quantize (private to context.cu and the kernels) */
    int pending_bad;                   /* the non-finite flag is on its way to host scratch */
    int pending_offset;                /* the nf4/fp4 offset is on its way to host scratch */
    int pending_scale;                 /* nvfp4's per-tensor scale is (1: torchao's decode scale,
                                          2: compressed-tensors' global scale) */
    int bad_dirty;                     /* the flag may hold a note (clean: ~0, as the publish kernel
                                          leaves it); a check then sets it first */
    int bins_dirty;                    /* the offset bins may hold a sum (clean: the offset kernel
                                        * zeroes them as it reads them) */
    void *iq3s_tables;                 /* device: IQ3_S's grid tables, copied on first use (iq3s.cu) */
    void *iqgrid_tables[2];            /* device: IQ3_XXS's and the IQ1 grid's tables, the same way
                                          (iqgrid.cu) */
};

#define QD_CUDA_SCRATCH_BYTES (64 * 1024)

/* Creates a stream and scratch on the current device; QD_EDEVICE/QD_ENOMEM on failure. */
enum qd_status qd_cuda_ctx_init(struct qd_cuda_ctx *c);
void qd_cuda_ctx_free(struct qd_cuda_ctx *c);
void qd_cuda_ctx_set(struct qd_cuda_ctx *c); /* this thread's context */
struct qd_cuda_ctx *qd_cuda_ctx_get(void);
/* After a quantize: waits for the stream, writes the device-computed params to p (the params
 * of that quantize), then QD_ENONFINITE (bad_index set) if the check found NaN/Inf. */
enum qd_status qd_cuda_finish(struct qd_params *p);
/* The last CUDA error as text (thread's last failed call), for messages. */
const char *qd_cuda_last_error(void);

/* Self-check: f32 bit patterns (all 2^32) whose device encoding for MX element type `elem`
 * (0-4; 5 = bf16, 6 = f16 output packing; 7 = NF4, 8 = FP4 codes on the table's domain;
 * 9, 10 = e4m3, e5m2 decoding, on all 2^16 code pairs; 11 = qd_quotient on 2^32 f32 x scale
 * pairs; 12 = the dynamic map's code by table against its search) differs from the software
 * one; the lowest in *first_bad. -1 on a CUDA failure. */
long long qd_cuda_conversion_mismatches(int elem, uint32_t *first_bad);

/* Fault injection (kernels/cuda/fault.cu): a launch the runtime refuses (not sticky), and a
 * kernel that traps (sticky: the device is lost to this process). Return the cudaError_t. */
int qd_cuda_fault_launch(void);
int qd_cuda_fault_trap(void);

#define QD_CUDA_FAMILY(fam)                                                                     \
    enum qd_status qd_cuda_##fam##_quantize(const struct qd_format *, const struct qd_tensor *, \
                                            struct qd_params *, void *const *);                 \
    enum qd_status qd_cuda_##fam##_dequantize(const struct qd_format *, const void *const *,    \
                                              const struct qd_params *, struct qd_tensor *);
QD_CUDA_FAMILY(bnb4)
QD_CUDA_FAMILY(ggml)
QD_CUDA_FAMILY(awq)
QD_CUDA_FAMILY(mx)
QD_CUDA_FAMILY(nvfp4)
QD_CUDA_FAMILY(int8)
QD_CUDA_FAMILY(kquant)
QD_CUDA_FAMILY(iquant)
QD_CUDA_FAMILY(iq3s)
QD_CUDA_FAMILY(iqgrid)
QD_CUDA_FAMILY(iq2)
QD_CUDA_FAMILY(ctint)
QD_CUDA_FAMILY(mlx)
QD_CUDA_FAMILY(fp8)
#undef QD_CUDA_FAMILY

#ifdef __cplusplus
}
#endif

#endif
