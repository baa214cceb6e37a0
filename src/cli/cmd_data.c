// cli/cmd_data.c - `dsc data` (placeholder until the data layer lands).
#include "cli/commands.h" // cmd_data

int cmd_data(int argc, char **argv) { return cmd_not_built("data", argc, argv); }
