// cli/commands.h - one entry point per verb: int cmd_X(int argc, char **argv) returns the exit code.
#ifndef DSC_CLI_COMMANDS_H
#define DSC_CLI_COMMANDS_H

int cmd_train(int argc, char **argv);
int cmd_config(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_ckpt(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
