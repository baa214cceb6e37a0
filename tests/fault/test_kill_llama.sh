#!/usr/bin/env bash
# Fault tolerance with a Llama-family model (llama-d2: grouped-query attention, RMSNorm, SwiGLU):
# SIGKILL one of 4 ranks in the backward of step 5 at ZeRO stages 1 and 3 (policy degrade). The
# survivors must finish every step and end with the weights of a reference run that continued on
# 3 ranks from the restored step's state, as test_kill.sh checks for GPT-2.
set -u
. "$(dirname "$0")/lib.sh"
export MODEL=llama-d2

extra_checks() {
  check "$2: the survivors trained the Llama model" -- grep -q "llama-d2" "$T/kill$1/log.0"
}

kill_in_backward "llama-d2" 10
finish
