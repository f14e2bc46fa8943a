build/kernels/cpu/mx.o: kernels/cpu/mx.c kernels/cpu/../mx.h \
 kernels/cpu/../fp.h kernels/cpu/cpu.h kernels/cpu/../registry.h
kernels/cpu/../mx.h:
kernels/cpu/../fp.h:
kernels/cpu/cpu.h:
kernels/cpu/../registry.h:
