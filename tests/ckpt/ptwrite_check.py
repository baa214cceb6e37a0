#!/usr/bin/python3
"""Checks the torch.save files tests/ckpt/ptwrite_emit.c wrote with dsc's writer, in DIR.

Run by tests/ckpt/test_ptwrite_torch.sh: /usr/bin/python3 ptwrite_check.py DIR

For each file, the values ptwrite_emit.c wrote are built here again, and
  - torch.load(path), with weights_only=True and (torch >= 2.1) mmap=True too, must give them
    back bit for bit (types, dict order, float bits, tensor dtype, shape, strides and bytes);
  - the pickle must be, opcode for opcode, the one torch.save writes for the same values once
    its memo is expanded (torch's pickler memoizes, dsc's writer does not);
  - the zip archive must hold torch's entries in torch's order, stored, with right CRCs and each
    entry's data on a 64-byte boundary.
"""
import argparse
import collections
import inspect
import io
import math
import pickletools
import struct
import sys
import types
import zipfile

import torch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]  # dsc_pt_dtype's order
NAMES = ['F32', 'F64', 'F16', 'BF16', 'I64', 'I32', 'I16', 'I8', 'U8', 'BOOL']
SHAPES = [(), (5,), (3, 4), (2, 1, 3), (2, 3, 1, 2), (0, 3), (3, 0, 2)]


def stand_in(module, name):
    """A plain class of that module and name, importable by pickle (DeepSpeed is not here)."""
    parts = module.split('.')
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault('.'.join(parts[:i]), types.ModuleType('.'.join(parts[:i])))
    cls = type(name, (), {'__module__': module})
    cls.__qualname__ = name
    setattr(sys.modules[module], name, cls)
    return cls


DynamicLossScaler = stand_in('deepspeed.runtime.fp16.loss_scaler', 'DynamicLossScaler')


def tensor(dtype, seed, shape):
    """ptwrite_emit.c's tensor(): byte j is (j * 131 + seed * 71 + 7) & 0xff, bools & 1."""
    t = torch.empty(shape, dtype=dtype)
    n = t.numel() * t.element_size()
    mask = 1 if dtype == torch.bool else 0xff
    if n:
        raw = [((j * 131 + seed * 71 + 7) & 0xff) & mask for j in range(n)]
        t.reshape(-1).view(torch.uint8).copy_(torch.tensor(raw, dtype=torch.uint8))
    return t


def all_tensors(first_seed):
    return {f'{NAMES[d]}_{c}': tensor(DTYPES[d], first_seed + 7 * d + c, SHAPES[c])
            for d in range(len(DTYPES)) for c in range(len(SHAPES))}


def values():
    return {
        'ints': [0, 1, 255, 256, 65535, 65536, -1, -128, -129, 2**31 - 1, -2**31, 2**31,
                 -2**31 - 1, 2**39, -2**39, -2**39 - 1, 2**63 - 1, -2**63],
        'floats': (0.0, -0.0, 1.5, -2.25e300, math.inf, -math.inf, math.nan, 4.9e-324, 0.1),
        'strs': ['', 'ünïcödé 日本語 😀', 'quotes " \' and a\nnewline'],
        'flags': (True, False, None),
        'tuples': [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
        'nested': {'a': [{'b': ({},)}, [], collections.OrderedDict()]},
        'keys': {7: 'int', (1, 'x'): 'tuple', None: 'none', True: 'bool'},
    }


def ordered():
    return collections.OrderedDict([
        ('weight', tensor(torch.float32, 1, (4, 3))), ('bias', tensor(torch.bfloat16, 2, (4,))),
        ('step', 7), ('name', 'layer.0'), ('empty', collections.OrderedDict()), ('shape', [4, 3])])


def batches():
    return {'list': list(range(1001)), 'dict': {f'k{i}': i for i in range(2000)},
            'od': collections.OrderedDict((f'k{i}', -i) for i in range(1001))}


def objects():
    scaler = DynamicLossScaler()
    scaler.cur_scale, scaler.cur_iter, scaler.scale_window, scaler.dynamic = 65536.0, 10, 1000, True
    return {'scaler': scaler, 'args': argparse.Namespace(lr=0.001, name='x')}


# file, archive folder, values, whether torch's weights-only loader may read it
FILES = [
    ('tensors.pt', 'tensors', lambda: all_tensors(0), True),
    ('zip64.pt', 'zip64', lambda: all_tensors(100), True),
    ('values.pt', 'values', values, True),
    ('ordered.pt', 'archive', ordered, True),
    ('scalar.pt', 'scalar', lambda: tensor(torch.float32, 5, ()), True),
    ('batches.pt', 'batches', batches, True),
    ('objects.pt', 'objects', objects, False),  # classes the weights-only loader refuses
]


MMAP = 'mmap' in inspect.signature(torch.load).parameters


class Mismatch(Exception):
    pass


def raw(t):
    return bytes(t.detach().reshape(-1).view(torch.uint8).tolist())


def same(got, want, at):
    if type(got) is not type(want):
        raise Mismatch(f'{at}: {type(got).__name__}, expected {type(want).__name__}')
    if isinstance(want, torch.Tensor):
        meta = lambda t: (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(),
                          t.requires_grad, t.device.type)
        if meta(got) != meta(want) or raw(got) != raw(want):
            raise Mismatch(f'{at}: tensor {meta(got)}, expected {meta(want)} (or other bytes)')
    elif isinstance(want, float):
        if struct.pack('<d', got) != struct.pack('<d', want):
            raise Mismatch(f'{at}: {got!r}, expected {want!r} (bit for bit)')
    elif isinstance(want, dict):
        if len(got) != len(want):
            raise Mismatch(f'{at}: {len(got)} items, expected {len(want)}')
        for i, ((gk, gv), (wk, wv)) in enumerate(zip(got.items(), want.items())):
            same(gk, wk, f'{at} key {i}')
            same(gv, wv, f'{at}[{wk!r}]')
    elif isinstance(want, (list, tuple)):
        if len(got) != len(want):
            raise Mismatch(f'{at}: {len(got)} items, expected {len(want)}')
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f'{at}[{i}]')
    elif hasattr(want, '__dict__'):
        same(vars(got), vars(want), f'{at}.__dict__')
    elif got != want:
        raise Mismatch(f'{at}: {got!r}, expected {want!r}')


class Mark:
    def __init__(self, start):
        self.start = start


def canonical(pickle_bytes):
    """The pickle's opcodes with the memo expanded: PUTs dropped, each GET replaced by the
    opcodes that built the value it names; PROTO, FRAME and STOP are kept."""
    out, stack, memo = [], [], {}
    for op, arg, _ in pickletools.genops(pickle_bytes):
        name = op.name
        if name in ('PUT', 'BINPUT', 'LONG_BINPUT', 'MEMOIZE'):
            memo[len(memo) if name == 'MEMOIZE' else arg] = out[stack[-1]:]
            continue
        if name in ('GET', 'BINGET', 'LONG_BINGET'):
            stack.append(len(out))
            out.extend(memo[arg])
            continue
        start = len(out)
        before = op.stack_before
        if pickletools.markobject in before:
            while not isinstance(stack[-1], Mark):
                start = min(start, stack.pop())
            start = min(start, stack.pop().start)
            for _ in range(before.index(pickletools.markobject)):
                start = min(start, stack.pop())
        else:
            for _ in before:
                start = min(start, stack.pop())
        if isinstance(arg, float):  # by its bits: NaN == NaN, -0.0 != 0.0
            arg = struct.pack('>d', arg)
        out.append((name, arg))
        for item in op.stack_after:
            stack.append(Mark(start) if item is pickletools.markobject else start)
    return out


def torch_pickle(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(buf) as z:
        return z.read([n for n in z.namelist() if n.endswith('/data.pkl')][0])


def check_zip(path, archive, nstorages):
    want = ([f'{archive}/data.pkl', f'{archive}/byteorder'] +
            [f'{archive}/data/{k}' for k in range(nstorages)] +
            [f'{archive}/version', f'{archive}/.data/serialization_id'])
    with zipfile.ZipFile(path) as z, open(path, 'rb') as f:
        names = z.namelist()
        if names != want:
            raise Mismatch(f'entries {names}, expected {want}')
        bad = z.testzip()  # reads every entry, checking its CRC
        if bad is not None:
            raise Mismatch(f'entry {bad}: CRC mismatch')
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise Mismatch(f'{info.filename}: compressed')
            f.seek(info.header_offset)
            head = f.read(30)
            start = info.header_offset + 30 + struct.unpack('<H', head[26:28])[0] + \
                struct.unpack('<H', head[28:30])[0]
            if start % 64:
                raise Mismatch(f'{info.filename}: data at offset {start}, not 64-byte aligned')
        if z.read(f'{archive}/byteorder') != b'little' or z.read(f'{archive}/version') != b'3\n':
            raise Mismatch('byteorder or version record')
        return z.read(f'{archive}/data.pkl')


def weights_only_reads_floats():
    """torch 1.13's weights-only unpickler lacks BINFLOAT (later versions read it)."""
    buf = io.BytesIO()
    torch.save({'f': 1.5}, buf)
    buf.seek(0)
    try:
        torch.load(buf, weights_only=True)
        return True
    except Exception:
        return False


def count_tensors(obj):
    if isinstance(obj, torch.Tensor):
        return 1
    if isinstance(obj, dict):
        return sum(count_tensors(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(count_tensors(v) for v in obj)
    return 0


def has_float(obj):
    if isinstance(obj, float):
        return True
    if isinstance(obj, dict):
        return any(has_float(k) or has_float(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return any(has_float(v) for v in obj)
    return hasattr(obj, '__dict__') and not isinstance(obj, torch.Tensor) and has_float(vars(obj))


def main():
    d = sys.argv[1]
    floats_ok = weights_only_reads_floats()
    failed = 0
    for name, archive, make, weights_only in FILES:
        path = f'{d}/{name}'
        want = make()
        try:
            ours = check_zip(path, archive, count_tensors(want))
            if canonical(ours) != canonical(torch_pickle(want)):
                a, b = canonical(ours), canonical(torch_pickle(want))
                i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                raise Mismatch(f'pickle differs from torch.save\'s at opcode {i}: '
                               f'{a[i:i + 3]} vs {b[i:i + 3]}')
            same(torch.load(path, weights_only=False), want, name)
            checked = 'torch.load'
            if MMAP:  # torch >= 2.1: storages read in place, at the offsets the zip gives
                same(torch.load(path, weights_only=False, mmap=True), want, name + ' (mmap)')
                checked += ', mmap=True'
            if weights_only and (floats_ok or not has_float(want)):
                same(torch.load(path, weights_only=True), want, name + ' (weights_only)')
                checked += ', weights_only=True'
            elif weights_only:
                checked += f' (weights_only=True skipped: torch {torch.__version__} cannot ' \
                           'read floats with it)'
            print(f'ok: {name}: {checked}, same pickle as torch.save, zip layout')
        except Exception as e:
            print(f'FAIL: {name}: {type(e).__name__}: {e}')
            failed += 1
    print(f'torch {torch.__version__}: {len(FILES) - failed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
