build/kernels/params.o: kernels/params.c kernels/registry.h
kernels/registry.h:
