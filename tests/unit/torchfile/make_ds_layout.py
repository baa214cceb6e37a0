#!/usr/bin/python3
"""DeepSpeed-0.18-layout checkpoints for tests/unit/test_ds_layout.c and tests/ckpt/
test_ds_resume.sh, written by torch 1.13 from the structure DeepSpeed's engine.py,
stage_1_and_2.py and stage3.py save (keys, file names, partitioning), NOT by DeepSpeed's engine
itself (that needs torch >= 2).

ds_z2, ds_z3: a made-up table of four parameters; weights w[k] = 0.01 * k + p, Adam's exp_avg
    m[k] = 0.001 * k - p and exp_avg_sq v[k] = 0.0001 * k + p + 1 (p the parameter's index), so
    that the C test recomputes them.
ds_gpt2_z2 (ZeRO-2, bf16), ds_gpt2_z3 (ZeRO-3 in two sub-groups, fp16 with a dynamic loss scaler
    that skipped one step): a GPT2LMHeadModel of the Hugging Face folder tiny_gpt2/ (its names,
    shapes and flat order), with a ds_config.json dsc trains with; expect.txt lists the SHA-256
    (first 16 hex digits) of every parameter's whole fp32 master weights and moments, the bits
    the partitions hold, for the resume and export tests.

/usr/bin/python3 tests/unit/torchfile/make_ds_layout.py tests/unit/torchfile
/usr/bin/python3 tests/unit/torchfile/make_ds_layout.py OUT --gpt2-124m   (GPT-2 124M, ZeRO-3:
    a checkpoint of 1.5 GB and its tiny_gpt2/config.json, for measuring export's memory)
"""
import collections
import hashlib
import json
import math
import os
import sys

import torch

SHAPES = [('wte.weight', (5, 3)), ('h.0.ln.weight', (3,)), ('h.0.mlp.weight', (4, 3)),
          ('ln_f.bias', (3,))]
WORLD = 2


class Run:
    """One checkpoint's contents: the parameter table and the state DeepSpeed saves."""

    def __init__(self, shapes, state, config, steps=10, skipped=0, scaler=None):
        self.shapes, self.state, self.config = shapes, state, config  # state: [w, m, v] lists
        self.steps, self.skipped, self.scaler = steps, skipped, scaler
        self.applied = steps - skipped


def layout_state():
    w, m, v = [], [], []
    for i, (_, s) in enumerate(SHAPES):
        k = torch.arange(math.prod(s), dtype=torch.float32)
        w.append(k * 0.01 + i)
        m.append(k * 0.001 - i)
        v.append(k * 0.0001 + i + 1)
    return [w, m, v]


def adam_state(m, v, applied):
    return {'step': torch.tensor(float(applied)), 'exp_avg': m, 'exp_avg_sq': v}


def model_states(run, stage, module):
    cfg = dict(run.config, zero_optimization={'stage': stage})
    return dict(module=module, buffer_names=[], optimizer=None,
                param_shapes=[collections.OrderedDict((n, torch.Size(s)) for n, s in run.shapes)],
                lr_scheduler={'last_batch_iteration': run.applied - 1},
                sparse_tensor_module_names=set(), skipped_steps=run.skipped,
                global_steps=run.steps, global_samples=run.steps * 8, dp_world_size=WORLD,
                mp_world_size=1, ds_config=cfg, ds_version='0.18.4', frozen_param_shapes=None,
                shared_params={}, frozen_param_fragments=None, data_sampler=None,
                random_ltd=None)


def prefix(run):
    return 'bf16_' if run.config.get('bf16', {}).get('enabled') else ''


def save_optim(run, out, r, osd):
    torch.save({'optimizer_state_dict': osd, 'ds_version': '0.18.4'},
               os.path.join(out, f'{prefix(run)}zero_pp_rank_{r}_mp_rank_00_optim_states.pt'))


def z2(run, out, module):
    flats = [torch.cat(kind) for kind in run.state]
    pad = (-flats[0].numel()) % (2 * WORLD)
    parts = [torch.cat([f, torch.zeros(pad)]).chunk(WORLD) for f in flats]
    os.makedirs(out, exist_ok=True)
    torch.save(model_states(run, 2, module), os.path.join(out, 'mp_rank_00_model_states.pt'))
    for r in range(WORLD):
        # The fp32 partition without padding; the optimizer's state keeps it (not elastic).
        lean = parts[0][r][:parts[0][r].numel() - (pad if r == WORLD - 1 else 0)].clone()
        base = {'state': {0: adam_state(parts[1][r].clone(), parts[2][r].clone(), run.applied)},
                'param_groups': [{'lr': 1e-3, 'params': [0]}]}
        osd = {'zero_stage': 2, 'partition_count': WORLD, 'loss_scaler': run.scaler,
               'single_partition_of_fp32_groups': [lean], 'group_paddings': [0, pad][r:r + 1],
               'base_optimizer_state': base}
        save_optim(run, out, r, osd)


def z3(run, out, module, split):
    ranks = [[[] for _ in range(WORLD)] for _ in run.state]
    for kind, tensors in enumerate(run.state):
        for w in tensors:
            piece = math.ceil(w.numel() / WORLD)
            w = torch.cat([w, torch.zeros(piece * WORLD - w.numel())])
            for r in range(WORLD):
                ranks[kind][r].append(w[r * piece:(r + 1) * piece])
    os.makedirs(out, exist_ok=True)
    for r in range(WORLD):
        torch.save(model_states(run, 3, module),
                   os.path.join(out, f'zero_pp_rank_{r}_mp_rank_00_model_states.pt'))
        w, m, v = (torch.cat(ranks[kind][r]) for kind in range(3))
        cut = [(0, split), (split, w.numel())]  # two sub-groups
        inner = {'state': {g: adam_state(m[a:b].clone(), v[a:b].clone(), run.applied)
                           for g, (a, b) in enumerate(cut)},
                 'param_groups': [{'lr': 1e-3, 'params': [0, 1]}]}
        osd = {'zero_stage': 3, 'partition_count': WORLD, 'loss_scaler': run.scaler,
               'optimizer_state_dict': inner,
               'fp32_flat_groups': [w[a:b].clone() for a, b in cut]}
        save_optim(run, out, r, osd)


# ---- a tiny GPT2LMHeadModel ----

GPT2 = dict(n_layer=2, n_embd=16, n_head=2, vocab_size=256, n_positions=32)


def gpt2_shapes():
    C, L = GPT2['n_embd'], GPT2['n_layer']
    t = [('transformer.wte.weight', (GPT2['vocab_size'], C)),
         ('transformer.wpe.weight', (GPT2['n_positions'], C))]
    for i in range(L):
        h = f'transformer.h.{i}.'
        t += [(h + 'ln_1.weight', (C,)), (h + 'ln_1.bias', (C,)),
              (h + 'attn.c_attn.weight', (C, 3 * C)), (h + 'attn.c_attn.bias', (3 * C,)),
              (h + 'attn.c_proj.weight', (C, C)), (h + 'attn.c_proj.bias', (C,)),
              (h + 'ln_2.weight', (C,)), (h + 'ln_2.bias', (C,)),
              (h + 'mlp.c_fc.weight', (C, 4 * C)), (h + 'mlp.c_fc.bias', (4 * C,)),
              (h + 'mlp.c_proj.weight', (4 * C, C)), (h + 'mlp.c_proj.bias', (C,))]
    return t + [('transformer.ln_f.weight', (C,)), ('transformer.ln_f.bias', (C,))]


def unit(n, p):
    """n values in [-1, 1], exact in float64 (integers and one division), so reproducible."""
    k = torch.arange(n, dtype=torch.float64)
    return (((k * 7919 + p * 104729) % 2003) - 1001) / 1001


def gpt2_state(shapes):
    w, m, v = [], [], []
    for p, (name, s) in enumerate(shapes):
        n = math.prod(s)
        u = unit(n, p)
        if name.endswith(('ln_1.weight', 'ln_2.weight', 'ln_f.weight')):
            x = 1 + 0.1 * u
        else:
            x = (0.01 if name.endswith('bias') else 0.02) * u
        w.append(x.float().reshape(-1))
        m.append((1e-3 * unit(n, p + 50)).float())
        v.append((1e-6 * (1.0001 + unit(n, p + 100))).float())
    return [w, m, v]


def gpt2_config(precision):
    cfg = {'train_batch_size': 4, 'train_micro_batch_size_per_gpu': 1, 'steps_per_print': 1000,
           'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3, 'weight_decay': 0.01}},
           'scheduler': {'type': 'WarmupLR',
                         'params': {'warmup_min_lr': 0, 'warmup_max_lr': 1e-3,
                                    'warmup_num_steps': 20, 'warmup_type': 'linear'}},
           'gradient_clipping': 1.0}
    if precision == 'fp16':
        cfg['fp16'] = {'enabled': True, 'initial_scale_power': 12, 'loss_scale_window': 1000,
                       'hysteresis': 2, 'min_loss_scale': 1}
    else:
        cfg['bf16'] = {'enabled': True}
    return cfg


def dynamic_scaler():
    class Dynamic:
        pass
    Dynamic.__module__ = 'deepspeed.runtime.fp16.loss_scaler'
    Dynamic.__name__ = Dynamic.__qualname__ = 'DynamicLossScaler'
    mod = type(sys)('deepspeed.runtime.fp16.loss_scaler')
    mod.DynamicLossScaler = Dynamic
    for name in ('deepspeed', 'deepspeed.runtime', 'deepspeed.runtime.fp16'):
        sys.modules.setdefault(name, type(sys)(name))
    sys.modules['deepspeed.runtime.fp16.loss_scaler'] = mod
    s = Dynamic()
    # one overflow at iteration 3 halved 4096: what DeepSpeed's scaler holds after 10 steps
    s.__dict__.update(cur_scale=2048.0, cur_iter=10, last_overflow_iter=3, scale_factor=2.0,
                      scale_window=1000, min_scale=1, delayed_shift=2, cur_hysteresis=2,
                      consecutive_hysteresis=False, raise_error_at_min_scale=True,
                      dynamic=True, dtype=torch.float16)
    return s


def digest(x):
    return hashlib.sha256(x.contiguous().numpy().tobytes()).hexdigest()[:16]


def gpt2_fixture(base, name, stage, precision):
    shapes = gpt2_shapes()
    cfg = gpt2_config(precision)
    fp16 = precision == 'fp16'
    run = Run(shapes, gpt2_state(shapes), cfg, skipped=1 if fp16 else 0,
              scaler=dynamic_scaler() if fp16 else None)
    d = os.path.join(base, name)
    half = torch.float16 if fp16 else torch.bfloat16
    module = collections.OrderedDict(
        (n, w.reshape(s).to(half) if stage < 3 else torch.empty(0, dtype=half))
        for (n, s), w in zip(shapes, run.state[0]))
    if stage == 3:
        z3(run, os.path.join(d, 'global_step10'), module, split=3000)
    else:
        z2(run, os.path.join(d, 'global_step10'), module)
    with open(os.path.join(d, 'latest'), 'w') as f:
        f.write('global_step10')
    with open(os.path.join(d, 'ds_config.json'), 'w') as f:
        json.dump(dict(cfg, zero_optimization={'stage': stage}), f, indent=1)
    with open(os.path.join(d, 'expect.txt'), 'w') as f:
        f.write(f'# step {run.steps} skipped {run.skipped} applied {run.applied} '
                f'last_batch_iteration {run.applied - 1}\n')
        for (n, _), *kinds in zip(shapes, *run.state):
            for kind, x in zip(('master', 'exp_avg', 'exp_avg_sq'), kinds):
                f.write(f'{n} {kind} {digest(x)}\n')


def tiny_gpt2_folder(base):
    d = os.path.join(base, 'tiny_gpt2')
    os.makedirs(d, exist_ok=True)
    cfg = {'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2',
           'activation_function': 'gelu_new', 'layer_norm_epsilon': 1e-5,
           'n_ctx': GPT2['n_positions'], 'n_inner': None, 'tie_word_embeddings': True,
           'bos_token_id': 0, 'eos_token_id': 0, **GPT2}
    with open(os.path.join(d, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=1)


def main():
    base = sys.argv[1]
    if sys.argv[2:] == ['--gpt2-124m']:  # a large one for measurements, not committed
        GPT2.update(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        tiny_gpt2_folder(base)
        gpt2_fixture(base, 'ds_gpt2_124m', 3, 'bf16')
        return
    layout = Run(SHAPES, layout_state(), {'bf16': {'enabled': True}})
    for name, fn in (('ds_z2', z2), ('ds_z3', lambda run, out, mod: z3(run, out, mod, 7))):
        d = os.path.join(base, name)
        fn(layout, os.path.join(d, 'global_step10'), collections.OrderedDict())
        with open(os.path.join(d, 'latest'), 'w') as f:
            f.write('global_step10')
    tiny_gpt2_folder(base)
    gpt2_fixture(base, 'ds_gpt2_z2', 2, 'bf16')
    gpt2_fixture(base, 'ds_gpt2_z3', 3, 'fp16')


if __name__ == '__main__':
    main()
