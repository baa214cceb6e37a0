#!/usr/bin/env python3
"""Hugging Face transformers as the oracle of dsc's model folders (run with the venv's python
that scripts/install-hf.sh prints).

  hf_ref.py make ARCH OUT [--config JSON] [--seed N] [--shard-size SIZE] [--dtype float32|bfloat16]
      A randomly initialised GPT2LMHeadModel / LlamaForCausalLM / Qwen2ForCausalLM /
      MistralForCausalLM (ARCH gpt2, llama, qwen2, mistral) of a small default shape, updated
      with the JSON object's fields, saved with save_pretrained (safetensors; sharded when
      --shard-size is given).
  hf_ref.py loss MODEL IDS LABELS
      The mean cross-entropy of the model on (B, T) token ids, labels -100 ignored, as transformers
      computes it (labels shifted inside the model, so LABELS here are the ids themselves with
      -100 where the loss is masked). IDS and LABELS: files of whitespace-separated integers, one
      sequence per line. Prints the loss with 9 significant digits.
  hf_ref.py logits MODEL IDS OUT
      Logits (float32, row-major (B, T, V)) of the model on the sequences, written raw to OUT.
  hf_ref.py greedy MODEL IDS N
      N greedy tokens after each sequence (one line per sequence).
  hf_ref.py grads MODEL DUMP [--restart-after ID]
      Compare a `dsc train --dump-grads` file (inputs, targets, loss, every gradient under its
      Hugging Face name) with the model's loss and gradients on the same tokens (targets < 0 are
      ignored, as labels -100). Prints "loss <dsc> <hf> <rel>" and "grads <worst rel L2> <name>".
      --restart-after ID: position ids restart at 0 after each token ID (the end of a packed
      document), as `dsc train --restart-positions` gives them.
  hf_ref.py trace MODEL TRACE PROMPT
      Compare the logits `dsc generate --trace` recorded (greedy, one prompt of ids PROMPT) with
      the model's own at the same positions; prints "trace <tokens equal 0|1> <worst rel error>".

  hf_ref.py info MODEL
      What transformers makes of the folder's config.json: "version <transformers> dtype <config
      dtype> rope <type> <theta>" (the config's own dtype, not a load's).

Float32 on the CPU throughout. Runs under transformers 4.44 (the suite's venv) and 5.x.
"""
import json
import sys

import torch
import transformers

SMALL = {
    "gpt2": dict(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=300),
    "llama": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, vocab_size=300,
                  rms_norm_eps=1e-5, tie_word_embeddings=False),
    "qwen2": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, vocab_size=300,
                  rms_norm_eps=1e-6, tie_word_embeddings=True),
    "mistral": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                    vocab_size=300, sliding_window=None),
}
CLASSES = {
    "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}


def read_ids(path):
    with open(path) as f:
        rows = [[int(x) for x in line.split()] for line in f if line.strip()]
    if len({len(r) for r in rows}) != 1:
        sys.exit(f"{path}: every sequence must have the same length")
    return torch.tensor(rows, dtype=torch.long)


MAJOR = int(transformers.__version__.split(".")[0])
# transformers 5 renamed from_pretrained's torch_dtype to dtype and always writes safetensors.
DTYPE_KW = "dtype" if MAJOR >= 5 else "torch_dtype"


def load(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, **{DTYPE_KW: torch.float32})
    model.eval()
    return model


def make(argv):
    arch, out = argv[0], argv[1]
    opts = dict(zip(argv[2::2], argv[3::2]))
    fields = dict(SMALL[arch])
    fields.update(json.loads(opts.get("--config", "{}")))
    torch.manual_seed(int(opts.get("--seed", "0")))
    cfg_cls, model_cls = CLASSES[arch]
    model = model_cls(cfg_cls(**fields))
    dtype = opts.get("--dtype", "float32")
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    kw = {} if MAJOR >= 5 else {"safe_serialization": True}
    if "--shard-size" in opts:
        kw["max_shard_size"] = opts["--shard-size"]
    model.save_pretrained(out, **kw)


def loss(argv):
    model = load(argv[0])
    ids, labels = read_ids(argv[1]), read_ids(argv[2])
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    print(f"{out.loss.item():.9g}")


def logits(argv):
    model = load(argv[0])
    with torch.no_grad():
        out = model(input_ids=read_ids(argv[1]))
    out.logits.to(torch.float32).contiguous().numpy().tofile(argv[2])


def greedy(argv):
    model = load(argv[0])
    ids = read_ids(argv[1])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=int(argv[2]), do_sample=False,
                             pad_token_id=0, attention_mask=torch.ones_like(ids))
    for row in out[:, ids.shape[1]:].tolist():
        print(" ".join(str(x) for x in row))


def grads(argv):
    from safetensors import safe_open
    model = load(argv[0])
    with safe_open(argv[1], "pt") as f:
        dump = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata() or {}
    inputs, targets = dump["inputs"].long(), dump["targets"].long()
    # transformers shifts labels inside the model: give it T + 1 tokens whose labels are the
    # targets (the last input's target is the extra token).
    ids = torch.cat([inputs, targets[:, -1:].clamp_min(0)], 1)
    labels = torch.cat([inputs[:, :1], targets], 1)
    labels[labels < 0] = -100
    model.train(False)
    kw = {}
    if len(argv) > 3 and argv[2] == "--restart-after":
        pos = torch.zeros_like(ids)
        for t in range(1, ids.shape[1]):
            pos[:, t] = torch.where(ids[:, t - 1] == int(argv[3]), torch.zeros_like(pos[:, t]),
                                    pos[:, t - 1] + 1)
        kw["position_ids"] = pos
    out = model(input_ids=ids, labels=labels, **kw)
    out.loss.backward()
    dsc_loss = float(meta.get("loss", dump["loss"].item() if "loss" in dump else "nan"))
    hf_loss = out.loss.item()
    print(f"loss {dsc_loss:.9g} {hf_loss:.9g} {abs(dsc_loss - hf_loss) / abs(hf_loss):.3g}")
    worst, where = 0.0, ""
    for name, p in model.named_parameters():
        key = name[len("transformer."):] if name.startswith("transformer.") else name
        if key not in dump:
            print(f"missing {key}")
            worst, where = float("inf"), key
            continue
        g = dump[key].to(torch.float64)
        ref = p.grad.to(torch.float64)
        err = ((g - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        if err > worst:
            worst, where = err, key
    print(f"grads {worst:.3g} {where}")


def trace(argv):
    model = load(argv[0])
    with open(argv[1]) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    ids = [int(x) for x in argv[2].split()]
    worst, equal = 0.0, 1
    with torch.no_grad():
        for s in steps:
            logits = model(torch.tensor([ids])).logits[0, -1]
            if int(logits.argmax()) != s["token"]:
                equal = 0
            for tok, val in s["top"]:
                ref = logits[tok].item()
                worst = max(worst, abs(val - ref) / max(abs(ref), 1e-6))
            ids.append(s["token"])
    print(f"trace {equal} {worst:.3g}")


def info(argv):
    cfg = transformers.AutoConfig.from_pretrained(argv[0])
    dtype = getattr(cfg, "dtype", None) if MAJOR >= 5 else cfg.torch_dtype
    rope = getattr(cfg, "rope_parameters", None) if MAJOR >= 5 else None
    if rope is None:  # 4.x: rope_theta and rope_scaling
        scaling = getattr(cfg, "rope_scaling", None) or {}
        rope = {"rope_type": scaling.get("rope_type", scaling.get("type", "default")),
                "rope_theta": getattr(cfg, "rope_theta", None)}
    print(f"version {transformers.__version__} dtype {str(dtype).replace('torch.', '')} "
          f"rope {rope.get('rope_type')} {rope.get('rope_theta')}")


if __name__ == "__main__":
    cmds = {"info": info, "make": make, "loss": loss, "logits": logits, "greedy": greedy, "grads": grads,
            "trace": trace}
    if len(sys.argv) < 3 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])
