"""Shared by the schedule and loss-scale parity tests (run with the DeepSpeed venv's python).

DeepSpeed 0.18.4 imported quietly with a rank-0, one-rank communication layer (nothing here starts
torch.distributed), its config reader as the engine uses it, and `dsc train` runs read back from
their metrics.jsonl.
"""
import contextlib
import importlib
import io
import json
import logging
import os
import subprocess
import sys


def import_deepspeed():
    """Import DeepSpeed's config reader; its import-time chatter is shown only if it fails."""
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            import deepspeed.comm as ds_comm
            importlib.import_module("deepspeed.runtime.config")
            from deepspeed.utils import logger
    except BaseException:
        sys.stderr.write(chatter.getvalue())
        raise
    # The scaler and the schedulers ask for the rank to decide who logs; they run as rank 0 of 1.
    ds_comm.get_rank = lambda group=None: 0
    ds_comm.get_world_size = lambda group=None: 1
    # Warnings such as "getting the learning rate before the scheduler started" are expected here.
    logger.setLevel(logging.ERROR)


class DataParallelUnit:
    """The model-parallel unit DeepSpeedConfig reads the data-parallel world size from."""

    def get_data_parallel_world_size(self):
        return 1


def ds_config(path):
    """DeepSpeedConfig of a config file at world size 1, as the engine builds it."""
    from deepspeed.runtime.config import DeepSpeedConfig
    return DeepSpeedConfig(path, mpu=DataParallelUnit())


def step_set(spec):
    """The optimizer steps named by a DSC_INJECT_OVERFLOW value ("2,5-7") as a set."""
    steps = set()
    for part in filter(None, (spec or "").split(",")):
        a, _, b = part.partition("-")
        steps.update(range(int(a), int(b or a) + 1))
    return steps


def write_config(work, name, cfg):
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path


class Run:
    """One `dsc train` run: exit code, output, and metrics.jsonl's rows."""

    def __init__(self, rc, output, rows):
        self.rc, self.output, self.rows = rc, output, rows


def run_dsc(dsc, config, run_dir, steps, inject=None):
    """`dsc train` on the smallest model with CONFIG for STEPS optimizer steps."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DSC_INJECT_OVERFLOW", None)
    if inject:
        env["DSC_INJECT_OVERFLOW"] = inject
    cmd = [dsc, "train", "--config", config, "--model", "d1", "--seq-len", "8",
           "--max-steps", str(steps), "--sample-tokens", "0", "--eval-every", "0",
           "--eval-batches", "1", "--threads", "1", "--out", run_dir]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                       universal_newlines=True, timeout=120)
    rows = []
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return Run(p.returncode, p.stdout, rows)


def tail(text, n=8):
    return "\n".join("    " + line for line in text.rstrip().splitlines()[-n:])
