build/server/cli.o: server/cli.c server/cli.h \
 server/../kernels/quantize.h server/../kernels/registry.h server/files.h
server/cli.h:
server/../kernels/quantize.h:
server/../kernels/registry.h:
server/files.h:
