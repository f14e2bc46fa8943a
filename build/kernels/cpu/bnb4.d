build/kernels/cpu/bnb4.o: kernels/cpu/bnb4.c kernels/cpu/../bnb4.h \
 kernels/cpu/../fp.h kernels/cpu/cpu.h kernels/cpu/../registry.h
kernels/cpu/../bnb4.h:
kernels/cpu/../fp.h:
kernels/cpu/cpu.h:
kernels/cpu/../registry.h:
