"""Chat templates: dsc's rendering against transformers' apply_chat_template (jinja2).

For each template style in tests/model/chat_templates (written for these tests in the style of
Llama 3.1, Qwen2.5, Mistral v0.3, SmolLM2 and Gemma), a tokenizer folder is made with the
template in its tokenizer_config.json (as a string, as the list of named templates, or as
chat_template.jinja beside it), and a set of conversations is rendered by
`dsc data chat --json` and by apply_chat_template, with and without the generation prompt. The
texts must be equal byte for byte; the assistant spans dsc reports must be the ones found by
rendering prefixes with jinja2 (the method docs/data.md describes), each holding its message's
text; conversations a template refuses (raise_exception) must be refused by both, with the
template's message. Templates beyond dsc's subset must be refused naming the construct.

usage: hf_chat.py DSC_BINARY TEMPLATE_DIR WORK_DIR
"""
import datetime
import json
import os
import subprocess
import sys

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer

DSC, TEMPLATES, WORK = sys.argv[1], sys.argv[2], sys.argv[3]

STYLES = {  # template file, special tokens, how the template is stored
    "llama31": ("llama31.jinja", "<|begin_of_text|>", "<|eot_id|>", "string"),
    "qwen25": ("qwen25.jinja", None, "<|im_end|>", "named"),
    "mistral": ("mistral.jinja", "<s>", "</s>", "string"),
    "smollm2": ("smollm2.jinja", "<|im_start|>", "<|im_end|>", "jinja_file"),
    "gemma": ("gemma.jinja", "<bos>", "<eos>", "string"),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, \"now\".",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
        "required": ["city"]}}}


def msg(role, content, **kw):
    m = {"role": role, "content": content}
    m.update(kw)
    return m


def call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


BASIC = [
    [msg("user", "Hi"), msg("assistant", "Hello! How can I help?")],
    [msg("user", "  spaced out  \n"), msg("assistant", "\n  and so am I \n\n"),
     msg("user", "Ünïcødé — 中文 — emoji 🙂 and \"quotes\" and 'single'"),
     msg("assistant", "Tabs\tand\\backslashes and {{ not a tag }} {% neither %}")],
    [msg("user", "one"), msg("assistant", "two"), msg("user", "three"), msg("assistant", "four"),
     msg("user", "five"), msg("assistant", "six")],
]
WITH_SYSTEM = [
    [msg("system", "You are terse."), msg("user", "What is 2+2?"), msg("assistant", "4")],
    [msg("system", "  Pad me  "), msg("user", "a"), msg("assistant", "b"), msg("user", "c"),
     msg("assistant", "d")],
]
LLAMA_TOOLS = [
    {"messages": [msg("system", "Use tools."), msg("user", "Weather in Paris?"),
                  msg("assistant", None, tool_calls=[call("get_weather", {"city": "Paris", "days": 2})]),
                  msg("tool", "{\"temp\": 21.5}"),
                  msg("assistant", "It is 21.5 degrees.")],
     "tools": [WEATHER]},
    {"messages": [msg("user", "Weather?"), msg("assistant", "Which city?")], "tools": [WEATHER]},
]
QWEN_TOOLS = [
    {"messages": [msg("user", "Weather in Oslo and Rome?"),
                  msg("assistant", "Let me look.", tool_calls=[
                      call("get_weather", {"city": "Oslo"}), call("get_weather", {"city": "Rome"})]),
                  msg("tool", "cold"), msg("tool", "warm"),
                  msg("assistant", "Oslo is cold, Rome is warm.")],
     "tools": [WEATHER]},
    {"messages": [msg("system", "Custom system."), msg("user", "Hi"), msg("assistant", "Hey")],
     "tools": [WEATHER, {"type": "function", "function": {"name": "noop", "parameters": {}}}]},
]

CASES = {  # style -> (conversations that render, conversations the template refuses)
    "llama31": (BASIC + WITH_SYSTEM + LLAMA_TOOLS,
                [{"messages": [msg("system", "s"), msg("user", "u"),
                               msg("assistant", None, tool_calls=[call("a", {}), call("b", {})])]}]),
    "qwen25": (BASIC + WITH_SYSTEM + QWEN_TOOLS, []),
    "mistral": (BASIC + WITH_SYSTEM, [[msg("user", "a"), msg("user", "b"), msg("assistant", "c")],
                                      [msg("user", "a"), msg("bot", "b")]]),
    "smollm2": (BASIC + WITH_SYSTEM, []),
    "gemma": (BASIC, [WITH_SYSTEM[0], [msg("assistant", "first"), msg("user", "then")]]),
}

UNSUPPORTED = {  # a template beyond the subset -> the construct the refusal must name
    "{% include 'other.jinja' %}": "include",
    "{{ messages | wordwrap(10) }}": "wordwrap",
    "{% call m() %}x{% endcall %}": "call",
    "{{ cycler('a', 'b') }}": "cycler",
    "{% for m in messages %}{{ loop.cycle('a', 'b') }}{% endfor %}": "cycle",
    "{{ 'x' is divisibleby3 }}": "divisibleby3",
    "{% for m in messages recursive %}{% endfor %}": "recursive",
    "{{ '%s' % 'x' }}": None,  # runtime: printf-style formatting
}


def word_tokenizer(folder, specials):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([s for s in specials if s])
    tok.save(os.path.join(folder, "tokenizer.json"))


def make_folder(style):
    fname, bos, eos, how = STYLES[style]
    text = open(os.path.join(TEMPLATES, fname), encoding="utf-8").read()
    folder = os.path.join(WORK, style)
    os.makedirs(folder, exist_ok=True)
    word_tokenizer(folder, [bos, eos])
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 10 ** 30}
    if bos:
        cfg["bos_token"] = bos
    cfg["eos_token"] = {"content": eos, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "__type": "AddedToken"} if style == "gemma" else eos
    if how == "string":
        cfg["chat_template"] = text
    elif how == "named":
        cfg["chat_template"] = [{"name": "default", "template": text},
                                {"name": "rag", "template": "{{ 'not this one' }}"}]
    else:  # transformers 5 writes the template beside the config
        with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    return folder, text


def normalise(conv):
    return conv if isinstance(conv, dict) else {"messages": conv}


def hf_render(tk, text, conv, agp):
    c = normalise(conv)
    return tk.apply_chat_template(c["messages"], tools=c.get("tools"), chat_template=text,
                                  tokenize=False, add_generation_prompt=agp,
                                  strftime_now=lambda f: datetime.datetime.now().strftime(f))


def hf_spans(tk, text, conv):
    """Assistant spans by rendering prefixes (bytes of UTF-8), as docs/data.md describes."""
    c = normalise(conv)
    msgs, whole = c["messages"], hf_render(tk, text, conv, False).encode()
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        p = hf_render(tk, text, dict(c, messages=msgs[:i]), True).encode()
        q = hf_render(tk, text, dict(c, messages=msgs[:i + 1]), False).encode()
        assert whole.startswith(p) and whole.startswith(q), "prefix property broken"
        spans.append([len(p), len(q)])
    return spans


def dsc_render(folder, convs, agp):
    path = os.path.join(WORK, "convs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps(normalise(c), ensure_ascii=False) + "\n")
    cmd = [DSC, "data", "chat", "--input", path, "--tokenizer", "hf:" + folder, "--json"]
    if agp:
        cmd.append("--add-generation-prompt")
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, [json.loads(line) for line in r.stdout.splitlines()], r.stderr


def check_style(style, failures):
    folder, text = make_folder(style)
    tk = AutoTokenizer.from_pretrained(folder)
    good, bad = CASES[style]
    for agp in (False, True):
        rc, out, err = dsc_render(folder, good, agp)
        if rc != 0 or len(out) != len(good):
            failures.append(f"{style}: dsc data chat failed (rc {rc}): {err.strip()}")
            continue
        for k, conv in enumerate(good):
            want = hf_render(tk, text, conv, agp)
            if out[k]["text"] != want:
                failures.append(f"{style} conversation {k} (generation prompt {agp}):\n"
                                f"  dsc: {out[k]['text']!r}\n  hf:  {want!r}")
            elif not agp and out[k]["spans"] != hf_spans(tk, text, conv):
                failures.append(f"{style} conversation {k}: spans {out[k]['spans']} != "
                                f"{hf_spans(tk, text, conv)}")
            elif not agp:
                check_span_text(style, k, conv, out[k], failures)
    print(f"{style}: {len(good)} conversations x 2 rendered as apply_chat_template renders them")
    for k, conv in enumerate(bad):
        try:
            hf_render(tk, text, conv, False)
            failures.append(f"{style}: refused case {k} rendered by transformers")
            continue
        except Exception as e:  # jinja2's TemplateError
            message = str(e)
        rc, _, err = dsc_render(folder, [conv], False)
        if rc == 0 or message not in err:
            failures.append(f"{style}: refused case {k}: dsc rc {rc}, stderr {err.strip()!r}, "
                            f"transformers said {message!r}")
    if bad:
        print(f"{style}: {len(bad)} conversations refused by both, with the template's message")


def check_span_text(style, k, conv, out, failures):
    whole = out["text"].encode()
    msgs = normalise(conv)["messages"]
    asst = [m for m in msgs if m["role"] == "assistant"]
    for m, (b, e) in zip(asst, out["spans"]):
        span = whole[b:e].decode()
        content = (m.get("content") or "").strip()
        if content and content not in span:
            failures.append(f"{style} conversation {k}: span {span!r} lacks {content!r}")
        for other in msgs:
            oc = other.get("content") or ""
            if other["role"] != "assistant" and len(oc.strip()) > 8 and oc.strip() in span:
                failures.append(f"{style} conversation {k}: span {span!r} holds the "
                                f"{other['role']} text {oc!r}")


def check_unsupported(failures):
    for i, (tpl, construct) in enumerate(UNSUPPORTED.items()):
        path = os.path.join(WORK, f"unsupported{i}.jinja")
        with open(path, "w", encoding="utf-8") as f:
            f.write(tpl)
        conv = os.path.join(WORK, "one.jsonl")
        with open(conv, "w", encoding="utf-8") as f:
            f.write(json.dumps([msg("user", "u"), msg("assistant", "a")]) + "\n")
        r = subprocess.run([DSC, "data", "chat", "--input", conv, "--chat-template", path],
                           capture_output=True, text=True)
        named = construct is None or construct in r.stderr
        if r.returncode == 0 or not named or "line 1" not in r.stderr:
            failures.append(f"unsupported {tpl!r}: rc {r.returncode}, stderr {r.stderr.strip()!r}")
    print(f"{len(UNSUPPORTED)} templates beyond the subset refused, naming the construct")


def main():
    failures = []
    for style in STYLES:
        check_style(style, failures)
    check_unsupported(failures)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


main()
