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


# Small templates, each exercising a part of the subset, rendered with the conversation SNIPPET_CONV
# by dsc and by apply_chat_template (loop controls: by jinja2 with the loopcontrols extension, as
# transformers 5 sets it up; 4.44 lacks it).
SNIPPET_CONV = {"messages": [msg("system", " Sys  "), msg("user", "Hello there, World"),
                             msg("assistant", "Ok!", extra={"k": [1, 2.5, None, True, "x"]}),
                             msg("user", "Ünï 中文\ttab\n")],
                "tools": [WEATHER]}
SNIPPETS = [
    "{{ messages | length }} {{ messages[0].content | trim }}|{{ messages[-1]['content'] }}|",
    "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
    "{{ loop.first }}{{ loop.last }}{{ loop.length }}{% if loop.previtem is defined %}"
    "<{{ loop.previtem.role }}>{% endif %}{% if loop.nextitem is defined %}[{{ loop.nextitem.role }}]"
    "{% endif %};{% endfor %}",
    "{% set ns = namespace(n=0, seen=false) %}{% for m in messages if m.role != 'system' %}"
    "{% set ns.n = ns.n + 1 %}{% if m.role == 'assistant' %}{% set ns.seen = true %}{% endif %}"
    "{% else %}none{% endfor %}{{ ns.n }} {{ ns.seen }}",
    "{{ messages[1].content.split() }} {{ messages[1].content.split(',') }} "
    "{{ messages[1].content.split(' ', 1) }} {{ '  a  b '.split() }}",
    "{{ messages[1].content.upper() }} {{ messages[1].content.lower() }} "
    "{{ 'hello wORLD-x(y' | title }} {{ 'hello wORLD' | capitalize }} {{ 'ab cD' .title() }}",
    "{{ messages[1].content.startswith('Hello') }} {{ messages[1].content.endswith(('x', 'World')) }}"
    " {{ messages[1].content.replace('o', '0') }} {{ messages[1].content | replace('l', 'L', 2) }}"
    " {{ messages[1].content.find('World') }} {{ messages[1].content.count('l') }}",
    "{{ '  x ' | trim }}|{{ 'xxhixx'.strip('x') }}|{{ '  y '.lstrip() }}|{{ ' z  '.rstrip() }}|"
    "{{ messages[3].content | trim }}|{{ messages[3].content[::-1] }}|{{ messages[3].content[1:3] }}",
    "{{ tools | tojson }}\n{{ tools[0] | tojson(indent=2) }}\n{{ messages[2].extra | tojson }}",
    "{{ messages[2].extra }} {{ messages[2].extra.k }} {{ none }} {{ true }} {{ 1.5e20 }} {{ 0.0001 }}"
    " {{ 1e-5 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 3 * 'ab' }}",
    "{{ messages | map(attribute='role') | join(', ') }}|{{ messages | selectattr('role', 'equalto',"
    " 'user') | map(attribute='content') | list | length }}|{{ messages | rejectattr('role', 'eq',"
    " 'user') | list | length }}|{{ [1, 0, 2, none] | select | list }}|{{ ['a', 'b'] | first }}"
    "{{ ['a', 'b'] | last }}|{{ messages | first | attr_free_check }}",
    "{{ undefined_thing is defined }} {{ undefined_thing is undefined }} {{ none is none }} "
    "{{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 3 is odd }} {{ 4 is even }} "
    "{{ 3 is number }} {{ 3 is integer }} {{ 3.0 is float }} {{ 6 is divisibleby 3 }} "
    "{{ 'ab' is lower }} {{ true is true }} {{ 1 is true }} {{ 'x' is in ['x'] }} {{ [] is sequence }}",
    "{{ 'b' in 'abc' }} {{ 'z' not in 'abc' }} {{ 2 in [1, 2] }} {{ 'role' in messages[0] }} "
    "{{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ [1] == [1] }} {{ 1 != 2 and not false }} "
    "{{ none or 'dflt' }} {{ 0 and 'x' }} {{ 'yes' if 1 else 'no' }}{{ 'hidden' if 0 }}.",
    "{{ undefined_thing | default('d') }} {{ '' | default('e', true) }} {{ '' | default('f') }}|"
    "{{ messages[0].get('content') }} {{ messages[0].get('nope', 'g') }} {{ messages[0].get('x') }}"
    " {{ messages[0].keys() | list }} {{ messages[0] | items | list }} {{ '7' | int + 1 }} "
    "{{ '2.5' | float }} {{ 3.9 | int }} {{ 'x' | int }} {{ -3 | abs }} {{ 42 | string ~ '!' }}",
    "{% macro turn(role, text='none given') -%}\n<{{ role }}>{{ text }}</{{ role }}>\n{%- endmacro %}"
    "{{ turn('a') }}{{ turn('b', 'x') }}{{ turn(text='y', role='c') }}"
    "{% set block %}  inner {{ messages[0].role }}\n{% endset %}[{{ block }}]",
    "{%- for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% for k, v in messages[0].items() %}"
    "{{ k }}={{ v }};{% endfor %}{% for c in 'abc' %}{{ c }}{% endfor %}{% for i in range(3) %}"
    "{{ i }}{% endfor %}{{ range(1, 10, 3) | list }}{{ dict(a=1, b='x') }}",
    "line one\n  {% if true %}\n    indented {{ 'x' }}\n  {% endif %}\n{# comment #}\nafter\n"
    "{%- if true -%}\n   dash   \n{%- endif -%}\n  end  {%+ if true %}plus{% endif %}\n",
    "{{ 'a' + 'b' ~ 3 ~ none }} {{ (1, 2) }} {{ [1, 'two', none] }} {{ {'a': {'b': [1]}} }} "
    "{{ 'it\\'s' }} {{ \"q\\\"q\" }} {{ '\\u00e9\\x41\\n' | tojson }} {{ \"x\" 'y' }}",
]
SNIPPETS_LOOPCONTROLS = [
    "{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}{% if m.role == 'system' %}"
    "{% continue %}{% endif %}{{ m.role }};{% endfor %}",
]


def check_snippets(failures):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    folder = os.path.join(WORK, "snippets")
    os.makedirs(folder, exist_ok=True)
    word_tokenizer(folder, ["<s>", "</s>"])
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"}, f)
    tk = AutoTokenizer.from_pretrained(folder)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    for i, snip in enumerate(SNIPPETS + SNIPPETS_LOOPCONTROLS):
        snip = snip.replace(" | attr_free_check", "")
        if snip in SNIPPETS_LOOPCONTROLS:
            want = env.from_string(snip).render(add_generation_prompt=False, eos_token="</s>",
                                                tools=SNIPPET_CONV["tools"], documents=None,
                                                messages=SNIPPET_CONV["messages"])
        else:
            want = hf_render(tk, snip, SNIPPET_CONV, False)
        path = os.path.join(WORK, f"snippet{i}.jinja")
        with open(path, "w", encoding="utf-8") as f:
            f.write(snip)
        conv = os.path.join(WORK, "snippet.jsonl")
        with open(conv, "w", encoding="utf-8") as f:
            f.write(json.dumps(SNIPPET_CONV, ensure_ascii=False) + "\n")
        r = subprocess.run([DSC, "data", "chat", "--input", conv, "--chat-template", path,
                            "--tokenizer", "hf:" + folder], capture_output=True, text=True)
        got = r.stdout[:-1] if r.returncode == 0 and r.stdout else None  # the text, then "\n"
        if got != want:
            failures.append(f"snippet {i} {snip!r}:\n  dsc: {got!r} {r.stderr.strip()}\n"
                            f"  jinja2: {want!r}")
    print(f"{len(SNIPPETS) + len(SNIPPETS_LOOPCONTROLS)} snippets of the subset render as jinja2 "
          "renders them")


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
    check_prepare(style, folder, tk, text, good, failures)
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
        print(f"{style}: {len(bad)} conversation(s) refused by both, with the template's message")


def read_shard(path):
    """Tokens and flags of a flagged token shard (versions 3-4)."""
    import struct
    data = open(path, "rb").read()
    magic, version, ntok = struct.unpack_from("<3i", data)
    assert magic == 20240520 and version in (3, 4), (magic, version)
    width = 2 if version == 3 else 4
    body = data[1024:1024 + ntok * width]
    toks = list(struct.unpack_from(f"<{ntok}{'H' if width == 2 else 'I'}", body))
    return toks, data[1024 + ntok * width:]


def check_prepare(style, folder, tk, text, convs, failures):
    """dsc data prepare with the byte tokenizer: one token per byte, so the shard must hold the
    rendered bytes, with the loss targets on exactly the assistant spans (and the end-of-text
    byte after a conversation that ends with one)."""
    path = os.path.join(WORK, f"prep-{style}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps(normalise(c), ensure_ascii=False) + "\n")
    out = os.path.join(WORK, f"prep-{style}")
    r = subprocess.run([DSC, "data", "prepare", "--input", path, "--tokenizer", "byte",
                        "--chat-template", folder, "--out", out, "--val-fraction", "0"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{style}: dsc data prepare failed: {r.stderr.strip()}")
        return
    toks, flags = read_shard(os.path.join(out, "train.bin"))
    at = 0
    for k, conv in enumerate(convs):
        want = hf_render(tk, text, conv, False).encode()
        mask = bytearray(len(want))
        for b, e in hf_spans(tk, text, conv):
            mask[b:e] = b"\1" * (e - b)
        n = len(want)
        got, got_mask = bytes(toks[at:at + n]), bytes(f & 1 for f in flags[at:at + n])
        if got != want or got_mask != bytes(mask) or toks[at + n] != 0 or \
                (flags[at + n] & 1) != mask[-1]:
            failures.append(f"{style} conversation {k}: data prepare's bytes or loss mask differ")
        at += n + 1
    print(f"{style}: dsc data prepare trains on exactly the assistant spans")


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
    check_snippets(failures)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


main()
