// cli/cmd_train.c - `dsc train` (placeholder until the engine lands).
#include "cli/commands.h" // cmd_train

int cmd_train(int argc, char **argv) { return cmd_not_built("train", argc, argv); }
