#!/usr/bin/python3
"""Writes the PyTorch files tests/unit/test_torchfile.c reads (committed beside this script).

Run with Debian's torch 1.13: /usr/bin/python3 tests/unit/torchfile/make_torch_files.py DIR

good.pt      what torch.save writes for tensors and plain values (views, dtypes, parameters)
ds_state.pt  the plain objects DeepSpeed stores (loss scaler, ZeroStageEnum, fragment_address,
             a set, argparse.Namespace), made with stand-in classes of the same module and name
legacy.pt    the pre-zip format (_use_new_zipfile_serialization=False)
os_system.pt a REDUCE of os.system (must be refused without running anything)
eval.pt      a REDUCE of builtins.eval
foreign.pt   a NEWOBJ of a class outside the allowed set (collections.Counter's module)
lying_numel.pt   a storage that claims more elements than its entry holds
short_storage.pt a storage entry shorter than its elements
short_view.pt    a tensor whose shape reaches past the end of its storage
compressed.pt    good.pt with its entries deflated (torch.save never compresses)
"""
import argparse
import collections
import enum
import io
import os
import re
import sys
import types
import zipfile

import torch


def stand_in(module, name, cls):
    parts = module.split('.')
    for i in range(1, len(parts)):  # the import of a dotted name imports its parents first
        sys.modules.setdefault('.'.join(parts[:i]), types.ModuleType('.'.join(parts[:i])))
    mod = sys.modules.setdefault(module, types.ModuleType(module))
    cls.__module__, cls.__qualname__, cls.__name__ = module, name, name
    setattr(mod, name, cls)
    return cls


def good():
    # Values the C test recomputes: f32[r][c] = 0.5 * (6 r + c) - 3, and so on.
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * 0.5 - 3
    return {
        'f32': base,
        'view_t': base.t(),                     # strided view of the same storage
        'view_slice': base[1:3, 2:5],           # offset and strides
        'bf16': (torch.arange(5, dtype=torch.float32) * 0.25).to(torch.bfloat16),
        'f16': (torch.arange(4, dtype=torch.float32).reshape(2, 2) - 1.5).half(),
        'f64': torch.arange(3, dtype=torch.float64) / 4,
        'i64': torch.arange(-3, 4),
        'scalar': torch.tensor(2.5),
        'empty': torch.zeros(0, 3),
        'param': torch.nn.Parameter(torch.tensor([[1., 2., 3.], [4., 5., 6.]])),
        'od': collections.OrderedDict([('b', torch.Size([2, 3])), ('a', 1)]),
        'plain': [None, True, False, 7, -3, 300, 70000, 2 ** 40, -(2 ** 40), 1.5, 'text',
                  (1, 2), {'k': 'v'}],
        3: 'int key',
    }


def ds_state():
    LossScaler = stand_in('deepspeed.runtime.fp16.loss_scaler', 'LossScaler', type('X', (), {}))
    Dynamic = stand_in('deepspeed.runtime.fp16.loss_scaler', 'DynamicLossScaler',
                       type('Y', (), {}))
    Frag = stand_in('deepspeed.utils.tensor_fragment', 'fragment_address', type('Z', (), {}))

    class ZeroStageEnum(int, enum.Enum):
        disabled = 0
        optimizer_states = 1
        gradients = 2
        weights = 3
    stand_in('deepspeed.runtime.zero.config', 'ZeroStageEnum', ZeroStageEnum)
    ls = LossScaler()
    ls.cur_scale = 1.0
    ls.dynamic = False
    dls = Dynamic()
    dls.__dict__.update(cur_scale=65536.0, cur_iter=10, last_overflow_iter=-1, scale_factor=2.0,
                        scale_window=1000, cur_hysteresis=2)
    fa = Frag()
    fa.numel, fa.start = 12, 4
    return {'loss_scaler': ls, 'dyn_scaler': dls, 'zero_stage': ZeroStageEnum.gradients,
            'fragment': fa, 'names': set(), 'args': argparse.Namespace(lr=0.1, name='run'),
            'flat': torch.arange(8, dtype=torch.float32)}


class Evil:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


def rewrite(src, dst, change):
    """Copy the archive src to dst, entry by entry, through change(name, bytes) -> bytes."""
    zin = zipfile.ZipFile(src)
    with zipfile.ZipFile(dst, 'w', compression=zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, change(info.filename, zin.read(info.filename)))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    p = lambda name: os.path.join(out, name)
    torch.save(good(), p('good.pt'))
    torch.save(ds_state(), p('ds_state.pt'))
    torch.save({'x': torch.ones(2)}, p('legacy.pt'), _use_new_zipfile_serialization=False)
    marker = 'dsc-torchfile-test-ran-code'
    torch.save({'x': Evil(os.system, 'touch ' + marker)}, p('os_system.pt'))
    torch.save({'x': Evil(eval, '1+1')}, p('eval.pt'))
    torch.save({'x': collections.Counter(a=1)}, p('foreign.pt'))
    torch.save({'t': torch.ones(4)}, p('small.pt'))
    # numel 4 -> 9 in the storage reference: K\x04 (BININT1 4) follows the location 'cpu'
    rewrite(p('small.pt'), p('lying_numel.pt'),
            lambda n, b: re.sub(rb'(cpuq.)K\x04', lambda m: m.group(1) + b'K\x09', b)
            if n.endswith('data.pkl') else b)
    rewrite(p('small.pt'), p('short_storage.pt'),
            lambda n, b: b[:8] if '/data/' in n else b)
    # shape (4,) -> (5,): BININT1 4, TUPLE1 is the size; the stride is (1,)
    rewrite(p('small.pt'), p('short_view.pt'),
            lambda n, b: b.replace(b'K\x04\x85', b'K\x05\x85', 1)
            if n.endswith('data.pkl') else b)
    zin = zipfile.ZipFile(p('good.pt'))
    with zipfile.ZipFile(p('compressed.pt'), 'w', compression=zipfile.ZIP_DEFLATED) as z:
        for info in zin.infolist():
            z.writestr(info.filename, zin.read(info.filename))
    os.remove(p('small.pt'))


if __name__ == '__main__':
    main()
