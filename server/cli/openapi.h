/* bin/quantd openapi: api/openapi.yaml with every enum that mirrors a table of the code made from
 * that table (formats, recipes, components, dtypes, job ops and states). */
#ifndef QD_CLI_OPENAPI_H
#define QD_CLI_OPENAPI_H

#include <stddef.h>

/* The spec text (len bytes) with the enum after each "# quantd openapi: LIST" line rewritten
 * from LIST's table; the rest is copied as it is. Returns a malloc'd NUL-terminated text (the
 * caller frees it), or NULL with err naming the line and what is wrong: an unknown LIST, a
 * marker not followed by an enum, or a LIST no marker names. */
char *qd_openapi_generate(const char *spec, size_t len, char *err, size_t errlen);

/* quantd openapi [SPEC]: prints SPEC (api/openapi.yaml) as qd_openapi_generate makes it. */
int qd_cli_openapi(int argc, char **argv);

#endif
