#!/usr/bin/python3
"""DeepSpeed-0.18-layout checkpoints for tests/unit/test_ds_layout.c, written by torch 1.13 from
the structure DeepSpeed's engine.py, stage_1_and_2.py and stage3.py save (keys, file names,
partitioning), NOT by DeepSpeed's engine itself (that needs torch >= 2). Weights are
w[k] = 0.01 * k + p (p the parameter's index), so that the C test recomputes them.

/usr/bin/python3 tests/unit/torchfile/make_ds_layout.py tests/unit/torchfile
"""
import collections
import math
import os
import sys

import torch

SHAPES = [('wte.weight', (5, 3)), ('h.0.ln.weight', (3,)), ('h.0.mlp.weight', (4, 3)),
          ('ln_f.bias', (3,))]
WORLD = 2


def weights():
    return [torch.arange(math.prod(s), dtype=torch.float32) * 0.01 + i
            for i, (_, s) in enumerate(SHAPES)]


def model_states(stage, extra):
    return dict(module=collections.OrderedDict(), buffer_names=[], optimizer=None,
                param_shapes=[collections.OrderedDict((n, torch.Size(s)) for n, s in SHAPES)],
                lr_scheduler={'last_batch_iteration': 9}, sparse_tensor_module_names=set(),
                skipped_steps=0, global_steps=10, global_samples=80, dp_world_size=WORLD,
                mp_world_size=1, ds_config={'zero_optimization': {'stage': stage},
                                            'bf16': {'enabled': True}},
                ds_version='0.18.4', **extra)


def z2(out):
    flat = torch.cat(weights())
    pad = (-flat.numel()) % (2 * WORLD)
    flat = torch.cat([flat, torch.zeros(pad)])
    parts = flat.chunk(WORLD)
    os.makedirs(out, exist_ok=True)
    torch.save(model_states(2, {}), os.path.join(out, 'mp_rank_00_model_states.pt'))
    for r in range(WORLD):
        lean = parts[r][:parts[r].numel() - (pad if r == WORLD - 1 else 0)].clone()
        osd = {'zero_stage': 2, 'partition_count': WORLD, 'loss_scaler': None,
               'single_partition_of_fp32_groups': [lean], 'group_paddings': [0, pad][r:r + 1],
               'base_optimizer_state': {'state': {}, 'param_groups': []}}
        torch.save({'optimizer_state_dict': osd, 'ds_version': '0.18.4'},
                   os.path.join(out, f'bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt'))


def z3(out):
    ranks = [[] for _ in range(WORLD)]
    for w in weights():
        piece = math.ceil(w.numel() / WORLD)
        w = torch.cat([w, torch.zeros(piece * WORLD - w.numel())])
        for r in range(WORLD):
            ranks[r].append(w[r * piece:(r + 1) * piece])
    os.makedirs(out, exist_ok=True)
    for r in range(WORLD):
        torch.save(model_states(3, {}),
                   os.path.join(out, f'zero_pp_rank_{r}_mp_rank_00_model_states.pt'))
        flat = torch.cat(ranks[r])
        osd = {'zero_stage': 3, 'partition_count': WORLD, 'loss_scaler': None,
               'fp32_flat_groups': [flat[:7].clone(), flat[7:].clone()]}  # two sub-groups
        torch.save({'optimizer_state_dict': osd, 'ds_version': '0.18.4'},
                   os.path.join(out, f'bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt'))


def main():
    base = sys.argv[1]
    for name, fn in (('ds_z2', z2), ('ds_z3', z3)):
        d = os.path.join(base, name)
        fn(os.path.join(d, 'global_step10'))
        with open(os.path.join(d, 'latest'), 'w') as f:
            f.write('global_step10')


if __name__ == '__main__':
    main()
