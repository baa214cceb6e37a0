#!/usr/bin/env python3
"""PEFT (LoRA on top of transformers) as the oracle of dsc's LoRA runs (run with the venv's python
that scripts/install-hf.sh prints; float32 on the CPU).

  peft_ref.py adapter BASE OUT --r R --alpha A --targets LIST|all-linear [--rslora]
                      [--save LIST] [--seed N]
      get_peft_model(BASE, LoraConfig(...)) with every lora_B filled with small random values
      (PEFT starts B at zero, where A's gradient is zero too), saved with save_pretrained.
  peft_ref.py grads BASE ADAPTER DUMP
      Compare a `dsc train --init-adapter ADAPTER --dump-grads DUMP` file (inputs, targets, loss,
      the trainable tensors' gradients under the adapter file's names) with PEFT's loss and
      gradients on the same tokens. Prints "loss <dsc> <peft> <rel>" and "grads <worst rel L2>
      <name>"; a name missing on either side is an error.
  peft_ref.py train BASE ADAPTER DUMP STEPS WEIGHTS --lr LR --wd W --clip C
      STEPS AdamW steps (betas 0.9, 0.999, eps 1e-8) on DUMP's batch every step, clipping the
      trainable parameters' norm to C, then compare the trained tensors with a `dsc train
      --dump-weights WEIGHTS` file of the same run. Prints "loss <first> <last>" and "weights
      <worst rel L2> <name>".
  peft_ref.py export BASE PEFT_DIR MERGED_DIR WEIGHTS
      Check `dsc ckpt export --peft PEFT_DIR` and `--hf MERGED_DIR` of a LoRA checkpoint:
      PeftModel.from_pretrained(BASE, PEFT_DIR) finds exactly the keys it expects ("keys 1|0"),
      its tensors equal WEIGHTS (a --dump-weights file of the same state: "tensors <worst>"), and
      on a few token rows transformers' logits of MERGED_DIR equal PEFT's unmerged logits and
      those of its merge_and_unload() ("logits <worst rel L2 unmerged> <merged>").
"""
import sys

import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import safe_open


def opts(argv):
    return dict(zip(argv[0::2], argv[1::2]))


def names(s):
    return None if s is None else (s if s == "all-linear" else s.split(","))


def adapter(argv):
    base, out, rest = argv[0], argv[1], argv[2:]
    flags = [a for a in rest if a == "--rslora"]
    o = opts([a for a in rest if a != "--rslora"])
    torch.manual_seed(int(o.get("--seed", "0")))
    model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    conv1d = model.config.model_type == "gpt2"  # Conv1D weights are (in, out)
    cfg = LoraConfig(r=int(o["--r"]), lora_alpha=float(o["--alpha"]), fan_in_fan_out=conv1d,
                     target_modules=names(o["--targets"]), lora_dropout=0.0, bias="none",
                     use_rslora=bool(flags), modules_to_save=names(o.get("--save")),
                     task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.02)
    pm.save_pretrained(out)


def load(base, ad):
    model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    return PeftModel.from_pretrained(model, ad, is_trainable=True)


def file_name(n):
    # in memory "...q_proj.lora_A.default.weight" / "...lm_head.modules_to_save.default.weight"
    return n.replace(".default", "").replace(".modules_to_save", "")


def batch(dump):
    with safe_open(dump, "pt") as f:
        meta = f.metadata()
        return (f.get_tensor("inputs").long(), f.get_tensor("targets").long(), float(meta["loss"]),
                {k: f.get_tensor(k) for k in f.keys() if k not in ("inputs", "targets")})


def loss_of(model, ids, tg):
    logits = model(input_ids=ids).logits
    tg = tg.clone()
    tg[tg < 0] = -100
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             tg.reshape(-1), ignore_index=-100, reduction="mean")


def rel(a, b):
    return (float((a - b).norm()) / max(float(b.norm()), 1e-30))


def compare(got, model, what):
    mine = {file_name(n): getattr(p, what) for n, p in model.named_parameters() if p.requires_grad}
    missing, extra = set(mine) - set(got), set(got) - set(mine)
    if missing or extra:
        print(f"names differ: missing {sorted(missing)} extra {sorted(extra)}")
        sys.exit(1)
    worst = max(((rel(got[k].float(), mine[k].detach()), k) for k in mine), key=lambda x: x[0])
    return worst


def grads(argv):
    model = load(argv[0], argv[1])
    ids, tg, dloss, got = batch(argv[2])
    loss = loss_of(model, ids, tg)
    loss.backward()
    print(f"loss {dloss:.9g} {float(loss):.9g} {abs(dloss - float(loss)) / abs(float(loss)):.3g}")
    worst, name = compare(got, model, "grad")
    print(f"grads {worst:.3g} {name}")


def train(argv):
    base, ad, dump, steps, weights = argv[0], argv[1], argv[2], int(argv[3]), argv[4]
    o = opts(argv[5:])
    model = load(base, ad)
    ids, tg, _, _ = batch(dump)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=float(o["--lr"]), betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=float(o["--wd"]))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(model, ids, tg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, float(o["--clip"]))
        opt.step()
        losses.append(float(loss))
    print(f"loss {losses[0]:.9g} {losses[-1]:.9g}")
    with safe_open(weights, "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
    worst, name = compare(got, model, "data")
    print(f"weights {worst:.3g} {name}")


def export(argv):
    base, peft_dir, merged, weights = argv
    from safetensors.torch import load_file
    got = load_file(f"{peft_dir}/adapter_model.safetensors")
    model = load(base, peft_dir)
    want = {file_name(n) for n, p in model.named_parameters() if p.requires_grad}
    print(f"keys {int(want == set(got))}")
    if want != set(got):
        print(f"missing {sorted(want - set(got))} extra {sorted(set(got) - want)}")
    with safe_open(weights, "pt") as f:
        ref = {k: f.get_tensor(k) for k in f.keys()}
    print(f"tensors {max(rel(got[k], ref[k]) for k in ref):.3g}")
    ids = torch.arange(0, 64).reshape(2, 32) % model.config.vocab_size
    model.train(False)
    with torch.no_grad():
        unmerged = model(input_ids=ids).logits
        merged_peft = model.merge_and_unload()(input_ids=ids).logits
        mine = transformers.AutoModelForCausalLM.from_pretrained(
            merged, torch_dtype=torch.float32)(input_ids=ids).logits
    print(f"logits {rel(mine, unmerged):.3g} {rel(mine, merged_peft):.3g}")


if __name__ == "__main__":
    cmds = {"adapter": adapter, "grads": grads, "train": train, "export": export}
    if len(sys.argv) < 3 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])
