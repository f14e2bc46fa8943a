build/kernels/quantize.o: kernels/quantize.c kernels/quantize.h \
 kernels/registry.h kernels/cpu/cpu.h kernels/cpu/../registry.h \
 kernels/fp.h
kernels/quantize.h:
kernels/registry.h:
kernels/cpu/cpu.h:
kernels/cpu/../registry.h:
kernels/fp.h:
