/* The serve and healthcheck subcommands of bin/quantd. */
#ifndef QD_SERVE_H
#define QD_SERVE_H

int qd_serve_main(int argc, char **argv);
/* Probes http://ADDR:PORT/healthz (default from QUANTD_LISTEN); 0 when it answers 200. Needs no
 * curl in the image: a container HEALTHCHECK runs it. */
int qd_healthcheck_main(int argc, char **argv);

#endif
