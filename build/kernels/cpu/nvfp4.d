build/kernels/cpu/nvfp4.o: kernels/cpu/nvfp4.c kernels/cpu/../mx.h \
 kernels/cpu/../fp.h kernels/cpu/cpu.h kernels/cpu/../registry.h
kernels/cpu/../mx.h:
kernels/cpu/../fp.h:
kernels/cpu/cpu.h:
kernels/cpu/../registry.h:
