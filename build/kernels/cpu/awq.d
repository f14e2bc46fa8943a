build/kernels/cpu/awq.o: kernels/cpu/awq.c kernels/cpu/../awq.h \
 kernels/cpu/../fp.h kernels/cpu/cpu.h kernels/cpu/../registry.h
kernels/cpu/../awq.h:
kernels/cpu/../fp.h:
kernels/cpu/cpu.h:
kernels/cpu/../registry.h:
