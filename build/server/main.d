build/server/main.o: server/main.c server/cli.h
server/cli.h:
