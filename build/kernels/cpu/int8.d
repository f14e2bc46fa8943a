build/kernels/cpu/int8.o: kernels/cpu/int8.c kernels/cpu/../int8.h \
 kernels/cpu/../fp.h kernels/cpu/cpu.h kernels/cpu/../registry.h
kernels/cpu/../int8.h:
kernels/cpu/../fp.h:
kernels/cpu/cpu.h:
kernels/cpu/../registry.h:
