#!/usr/bin/env python3
"""Rewrite a Hugging Face model folder's config.json in the transformers 4.x or 5.x spelling,
from the fields' published definitions; the weights are linked, not copied.

  hf_spelling.py v5 IN OUT    "rope_theta" and "rope_scaling" become "rope_parameters"
                              ({"rope_type", "rope_theta", factors}), "torch_dtype" becomes
                              "dtype"; a Qwen2 config gets the "layer_types" transformers 5
                              derives (and its null sliding_window when use_sliding_window is
                              false); transformers_version says 5.
  hf_spelling.py v4 IN OUT    the reverse: "rope_parameters" back to "rope_theta" and
                              "rope_scaling" (null for the default type), "dtype" back to
                              "torch_dtype", no "layer_types".

Only the standard library: it runs under any python.
"""
import json
import os
import sys

DEFAULT_THETA = 10000.0  # every family's default RoPE base, in 4.44 and in 5.x


def to_v5(c):
    arch = (c.get("architectures") or [""])[0]
    if "torch_dtype" in c:
        c["dtype"] = c.pop("torch_dtype")
    if arch == "GPT2LMHeadModel":
        return c
    theta = c.pop("rope_theta", DEFAULT_THETA)
    params = dict(c.pop("rope_scaling", None) or {})
    if "type" in params:
        params.setdefault("rope_type", params.pop("type"))
    params.setdefault("rope_type", "default")
    params["rope_theta"] = theta
    c["rope_parameters"] = params
    if arch == "Qwen2ForCausalLM":
        on = c.get("use_sliding_window", False) and c.get("sliding_window") is not None
        if not on:
            c["sliding_window"] = None
        start = c.get("max_window_layers", 28)
        c["layer_types"] = ["sliding_attention" if on and i >= start else "full_attention"
                            for i in range(c["num_hidden_layers"])]
    return c


def to_v4(c):
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    c.pop("layer_types", None)
    params = c.pop("rope_parameters", None)
    if params is None:
        return c
    params = dict(params)
    c["rope_theta"] = params.pop("rope_theta", DEFAULT_THETA)
    c["rope_scaling"] = None if params.get("rope_type", "default") == "default" else params
    return c


def main(argv):
    if len(argv) != 3 or argv[0] not in ("v4", "v5"):
        sys.exit(__doc__)
    spelling, src, out = argv
    with open(os.path.join(src, "config.json")) as f:
        c = json.load(f)
    c = to_v5(c) if spelling == "v5" else to_v4(c)
    c["transformers_version"] = "5.17.0" if spelling == "v5" else "4.44.2"
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(src):
        if name != "config.json" and not os.path.exists(os.path.join(out, name)):
            os.symlink(os.path.abspath(os.path.join(src, name)), os.path.join(out, name))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
