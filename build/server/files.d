build/server/files.o: server/files.c server/files.h
server/files.h:
