build/kernels/cpu/parallel.o: kernels/cpu/parallel.c kernels/cpu/../fp.h \
 kernels/cpu/cpu.h kernels/cpu/../registry.h
kernels/cpu/../fp.h:
kernels/cpu/cpu.h:
kernels/cpu/../registry.h:
