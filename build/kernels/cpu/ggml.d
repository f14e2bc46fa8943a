build/kernels/cpu/ggml.o: kernels/cpu/ggml.c kernels/cpu/../ggml.h \
 kernels/cpu/../fp.h kernels/cpu/cpu.h kernels/cpu/../registry.h
kernels/cpu/../ggml.h:
kernels/cpu/../fp.h:
kernels/cpu/cpu.h:
kernels/cpu/../registry.h:
