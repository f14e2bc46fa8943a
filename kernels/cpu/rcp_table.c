/* The measured approximate-reciprocal table (kernels/data/rcp_approx.bin, see kernels/bnb4.h),
 * embedded as read-only data. */
#include <stdint.h>

__asm__(".section .rodata\n"
        ".global qd_rcp_approx_delta\n"
        ".type qd_rcp_approx_delta, @object\n"
        ".size qd_rcp_approx_delta, 2097152\n"
        ".balign 64\n"
        "qd_rcp_approx_delta:\n"
        ".incbin \"kernels/data/rcp_approx.bin\"\n"
        ".previous\n");
