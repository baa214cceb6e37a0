#!/usr/bin/env python3
"""DeepSpeed 0.18.4 as the oracle for `dsc config check`.

Builds deepspeed.runtime.config.DeepSpeedConfig for each config file at each world size, the way
the engine does (a file path, a data-parallel world size from the model-parallel unit), and prints
one JSON object per (file, world size) on its own line:

  {"file": F, "world_size": N, "verdict": "ok", "config": {...}}
  {"file": F, "world_size": N, "verdict": "error", "message": "..."}

"config" holds the values DeepSpeed resolved, nested as `dsc config check --json` prints them.
Values DeepSpeed leaves as None (meaning "decided elsewhere") are left out.

usage: ds_oracle.py [--world-size N]... FILE...      (run with the venv's python)
"""
import argparse
import enum
import json
import os
import pathlib
import sys

# Files are decoded as UTF-8 whatever the locale says, as on any machine DeepSpeed runs on.
if not sys.flags.utf8_mode:
    os.execv(sys.executable, [sys.executable, "-X", "utf8"] + sys.argv)

# DeepSpeed's logger writes to stdout; keep stdout for our JSON lines only.
RESULTS = sys.stdout
sys.stdout = sys.stderr
os.environ.pop("DEEPSPEED_ELASTICITY_CONFIG", None)

import torch  # noqa: E402
import deepspeed.comm as ds_comm  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402

# DeepSpeedConfig asks the communication layer for the rank first and falls back to world size 1
# when that fails; the rank is 0 here, and the data-parallel size comes from the unit below.
ORACLE_WORLD = [1]
ds_comm.get_rank = lambda group=None: 0
ds_comm.get_world_size = lambda group=None: ORACLE_WORLD[0]


class DataParallelUnit:
    """The model-parallel unit DeepSpeedConfig reads the data-parallel world size from."""

    def __init__(self, n):
        self.n = n

    def get_data_parallel_world_size(self):
        return self.n


DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def plain(v):
    """A JSON-able copy of a resolved value; None stays None (dropped by prune)."""
    if isinstance(v, enum.Enum):
        v = v.value
    if isinstance(v, torch.dtype):
        return DTYPES.get(v, str(v))
    if isinstance(v, pathlib.PurePath):
        return str(v)
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return repr(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def prune(d):
    """Drop None leaves and empty objects."""
    if not isinstance(d, dict):
        return d
    out = {}
    for k, v in d.items():
        v = prune(v)
        if v is None or v == {}:
            continue
        out[k] = v
    return out


def model(m, drop=()):
    """A pydantic section by the names the config file uses (aliases)."""
    d = m.model_dump(by_alias=True)
    for k in drop:
        d.pop(k, None)
    return plain(d)


def resolved(c):
    """What DeepSpeedConfig resolved, in the nesting of `dsc config check --json`."""
    out = {
        "train_batch_size": c.train_batch_size,
        "train_micro_batch_size_per_gpu": c.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "steps_per_print": c.steps_per_print,
        "wall_clock_breakdown": c.wall_clock_breakdown,
        "memory_breakdown": c.memory_breakdown,
        "dump_state": c.dump_state,
        "gradient_clipping": c.gradient_clipping,
        "prescale_gradients": c.prescale_gradients,
        "gradient_predivide_factor": c.gradient_predivide_factor,
        "sparse_gradients": c.sparse_gradients_enabled,
        "zero_allow_untested_optimizer": c.zero_allow_untested_optimizer,
        "zero_force_ds_cpu_optimizer": c.zero_force_ds_cpu_optimizer,
        "disable_allgather": c.disable_allgather,
        "dataloader_drop_last": c.dataloader_drop_last,
        "communication_data_type": c.communication_data_type,
        "seq_parallel_communication_data_type": c.seq_parallel_communication_data_type,
        "optimizer": {"type": c.optimizer_name, "params": c.optimizer_params},
        "scheduler": {"type": c.scheduler_name, "params": c.scheduler_params},
        "fp16": model(c.float16_config),
        "bf16": model(c.bfloat16_config),
        "zero_optimization": model(c.zero_config, drop=("leaf_module",)),
        "checkpoint": {
            "tag_validation": c.checkpoint_config["tag_validation"],
            "load_universal": c.load_universal_checkpoint,
            "use_node_local_storage": c.use_node_local_storage,
        },
        "flops_profiler": dict(vars(c.flops_profiler_config)),
        "activation_checkpointing": dict(vars(c.activation_checkpointing_config)),
        "hybrid_engine": model(c.hybrid_engine),
        "aio": dict(c.aio_config),
        "elasticity": {"enabled": c.elasticity_enabled},
    }
    mon = c.monitor_config
    for name in ("tensorboard", "csv_monitor", "wandb", "comet"):
        out[name] = model(getattr(mon, name))
    if c.comms_config.comms_logger_enabled:
        out["comms_logger"] = model(c.comms_config.comms_logger)
    return prune(plain(out))


def check(path, world):
    ORACLE_WORLD[0] = world
    try:
        c = DeepSpeedConfig(path, mpu=DataParallelUnit(world))
        return {"verdict": "ok", "config": resolved(c)}
    except BaseException as e:  # DeepSpeed raises many kinds (AssertionError, TypeError, ...)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        msg = f"{type(e).__name__}: {e}".splitlines()
        return {"verdict": "error", "message": " ".join(msg)[:400]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, action="append", help="repeatable; default 1")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    for path in a.files:
        for world in a.world_size or [1]:
            r = {"file": path, "world_size": world}
            r.update(check(path, world))
            RESULTS.write(json.dumps(r, ensure_ascii=True) + "\n")
    RESULTS.flush()


if __name__ == "__main__":
    main()
