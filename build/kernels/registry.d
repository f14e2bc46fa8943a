build/kernels/registry.o: kernels/registry.c kernels/registry.h \
 kernels/bnb4.h kernels/fp.h kernels/cpu/cpu.h kernels/cpu/../registry.h \
 kernels/ggml.h kernels/mx.h
kernels/registry.h:
kernels/bnb4.h:
kernels/fp.h:
kernels/cpu/cpu.h:
kernels/cpu/../registry.h:
kernels/ggml.h:
kernels/mx.h:
