build/kernels/tensor.o: kernels/tensor.c kernels/registry.h
kernels/registry.h:
