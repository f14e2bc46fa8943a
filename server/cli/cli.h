/* The offline subcommands of bin/quantd: formats, quantize, dequantize, convert,
 * perplexity. */
#ifndef QD_CLI_H
#define QD_CLI_H

int qd_cli_formats(int argc, char **argv);
int qd_cli_quantize(int argc, char **argv);
int qd_cli_dequantize(int argc, char **argv);
int qd_cli_convert(int argc, char **argv);
int qd_cli_perplexity(int argc, char **argv);

#endif
