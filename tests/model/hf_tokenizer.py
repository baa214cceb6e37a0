"""Oracle side of test_tokenizer_hf.sh, test_tokenizer_sp.sh and bench/tokenize.sh: a mixed corpus,
small BPE tokenizer.json files in the formats of the byte-level and SentencePiece-style families,
and the `tokenizers` library's ids.

  corpus OUT_DIR MIN_BYTES        documents (doc-NNN.txt) from texts Debian ships + generated cases
  train FAMILY CORPUS_DIR OUT_DIR tokenizer.json + tokenizer_config.json of FAMILY
  gpt2-files SRC_DIR OUT_DIR      tokenizer.json from GPT-2's vocab.json + merges.txt
  sp CORPUS_DIR OUT_ROOT          SentencePiece-style tokenizer.json files, one folder per variant
                                  (SP_VARIANTS) under OUT_ROOT, sharing one vocabulary
  edge-docs CORPUS_DIR            add short documents of edge cases (doc-9NN.txt) to the corpus
  compare TOK_DIR CORPUS_DIR SHARD   ids of `tokenizers` (joined as dsc data prepare joins
                                  documents) vs the shard dsc wrote; decode of them vs TEXT
  decode TOK_DIR SHARD TEXT       `tokenizers`' decode of the shard's ids equals the file TEXT
  bench TOK_DIR CORPUS_DIR THREADS  encode_batch throughput, MB/s

Families, each as its published tokenizer.json is configured (vocabularies are trained here on
the corpus, small, since the published ones are not at hand):
  gpt2     ByteLevel pre-tokenizer with GPT-2's pattern; <|endoftext|> last, also in model.vocab
  llama3   Split by Llama 3's pattern (case-insensitive contractions, \\p{N}{1,3}) + ByteLevel;
           ignore_merges; <|begin_of_text|> added by a TemplateProcessing post-processor; 256 special
           tokens at ids 128000-128255 as in Llama 3 (stand-in tokens fill the BPE vocabulary up
           to 128000, so ids need 32 bits)
  qwen2    NFC normalizer; Split by Qwen2's pattern (single digits) + ByteLevel; <|endoftext|>,
           <|im_start|>, <|im_end|> after the BPE vocabulary
  smollm2  Digits(individual_digits) + ByteLevel with GPT-2's pattern; 17 special tokens at ids
           0-16 (<|endoftext|>, <|im_start|>, <|im_end|>, <repo_name>, ...)
  gpt2-prefix  gpt2 with ByteLevel add_prefix_space true (as RoBERTa-style files set it)

SentencePiece-style variants (`sp`), one BPE vocabulary laid out as Llama 2's (<unk>, <s>, </s>,
then <0x00>..<0xFF> at ids 3-258, then the pieces; the alphabet is limited so that rare characters
need byte fallback), model.byte_fallback true and fuse_unk true unless said:
  llama2           normalizer Sequence[Prepend("▁"), Replace(" " -> "▁")], no pre-tokenizer;
                   decoder Sequence[Replace("▁" -> " "), ByteFallback, Fuse, Strip(" ", 1, 0)];
                   <s> added by a TemplateProcessing post-processor (Llama 2, TinyLlama, Mistral)
  metaspace-first  no normalizer; Metaspace(prepend_scheme "first", split false); decoder and
                   post-processor as llama2 (files converted with legacy false)
  metaspace-split  Metaspace(prepend_scheme "always", split true); decoder
                   Sequence[Metaspace, ByteFallback, Fuse]; no BOS
  metaspace-never  Metaspace(prepend_scheme "never", split true); decoder Metaspace(never) first
  gemma            normalizer Replace(" " -> "▁") alone; decoder Sequence[Replace, ByteFallback,
                   Fuse]; <s> added
  unk-fused        llama2 without byte_fallback: unknown characters are <unk>, runs fused
  unk-unfused      the same with fuse_unk false
"""
import glob
import json
import os
import random
import struct
import sys
import time

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SMOL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
                 "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>",
                 "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",
                 "<jupyter_output>", "<jupyter_script>", "<empty_output>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                   "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|reserved_special_token_4|>", "<|eot_id|>"]
LLAMA3_BOS = 128000  # Llama 3's first special id: ids need 32 bits
BPE_VOCAB = 4000


# ---- corpus ----

def debian_texts():
    """(name, text) of UTF-8 texts Debian ships, in a fixed order, by kind."""
    kinds = [sorted(glob.glob("/usr/share/common-licenses/*")),
             sorted(glob.glob("/usr/share/doc/*/copyright")),
             sorted(glob.glob("/usr/lib/python3*/*.py")) +
             sorted(glob.glob("/usr/lib/python3*/*/*.py"))]
    out = []
    for files in kinds:
        for f in files:
            if os.path.islink(f) or not os.path.isfile(f):
                continue
            try:
                with open(f, encoding="utf-8") as fh:
                    out.append((f, fh.read()))
            except (UnicodeDecodeError, OSError):
                continue
    return out


SCRIPTS = {
    "cjk": "天地玄黄宇宙洪荒日月盈昃辰宿列张寒来暑往秋收冬藏東京都の人口は約千四百万人ですカタカナひらがな",
    "cyrillic": "Съешь же ещё этих мягких французских булок да выпей чаю Ёжик ЪЫЬ Україна їжак",
    "arabic": "نص عربي للتجربة مع أرقام ١٢٣٤٥٦٧٨٩٠ وعلامات، ترقيم؟",
    "devanagari": "हिन्दी पाठ का उदाहरण संख्या १२३४ और विराम। क्षत्रिय",
    "greek": "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία ΆΈΉΊΌΎΏ",
    "hebrew": "עברית טקסט לדוגמה עם ניקוד שָׁלוֹם",
    "thai": "ภาษาไทยเป็นภาษาที่ไม่มีการเว้นวรรคระหว่างคำ ๑๒๓",
    "hangul": "한국어 문장입니다 \u1100\u1161\u11a8 \u1112\u1161\u11ab",
    "emoji": "😀 👍🏽 👨‍👩‍👧‍👦 🇩🇪🇯🇵 ❤️ ✨🚀 🧑‍💻 1️⃣ #️⃣",
    "combining": "e\u0301 a\u0300 o\u0308\u0304 n\u0303 A\u030a \u1e9b\u0323 q\u0307\u0323 "
                 "Å Ω ﬁ \u0958 \u2126 x\u0345\u0301",
    "math": "∑∫√∞ ≤≥≠ ½ ¾ ⅓ Ⅻ ⅷ ① ² ³ ₄ 𝟘𝟙 ٣ ۴ ߁",
    # Unicode 15.0: Kawi letter and digits, Kaktovik numerals, Nag Mundari digits
    "unicode15": "\U00011F04\U00011F50\U00011F51 x\U0001D2C0\U0001D2C1y 7\U0001E4F0\U0001E4F1 \U00011F05a",
    "spaces": "a\u00a0b\u2003c\u3000d\u2009e\u202ff\u205fg\u1680h\u200bi\u0085j\u2028k\u2029l",
}
CONTRACTIONS = ["don't", "DON'T", "it's", "IT'S", "It'S", "we're", "WE'RE", "they've", "I'm",
                "I'M", "you'll", "YOU'LL", "he'd", "HE'D", "'ſ", "o'clock", "rock'n'roll", "''",
                "'s'", "l'amour", "' s", "’s", "it'ſt", "X'ſ", "x'ﬅx"]
SPECIAL_TEXT = ["<|endoftext|>", "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>",
                "<|eot_id|>", "<|im_sta", "<|endoftext|<|endoftext|>>", "<repo_name>x<file_sep>",
                "<|reserved_special_token_4|>", "<<|endoftext|>"]


def generated_doc(rng, nbytes):
    """Numbers, whitespace runs, scripts, contractions, special-token text, mixed."""
    parts, size = [], 0
    while size < nbytes:
        k = rng.randrange(9)
        if k == 0:
            p = " ".join(str(rng.randrange(10 ** rng.randrange(1, 25))) for _ in range(8))
            p += " 3.14159 -0.5e-10 1,234,567.89 2026-12-04 12:30:45 +1 (555) 010-9999 0x1F"
        elif k == 1:
            p = "".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "   \n  ", "\n\n\n", " \t ",
                                    "\u00a0", "\u3000", "x", "y z", ".", "\r", "\u2003 "])
                        for _ in range(30))
        elif k == 2:
            name = rng.choice(sorted(SCRIPTS))
            p = " ".join(rng.choice(SCRIPTS[name].split(" ")) for _ in range(12))
        elif k == 3:
            p = " ".join(rng.choice(CONTRACTIONS) for _ in range(10))
        elif k == 4:
            p = rng.choice(SPECIAL_TEXT) + " " + rng.choice(SPECIAL_TEXT)
        elif k == 5:
            p = "".join(chr(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0xA0, 0x2FF),
                                        rng.randrange(0x370, 0x1000), rng.randrange(0x3000, 0x9FFF),
                                        rng.randrange(0x1F300, 0x1FAFF)]))
                        for _ in range(40))
        elif k == 6:
            p = "abc123def4567 x1y22z333 ١٢٣abc ½3 x²+y² = z²  tab\tsep 42\n 7  8\n"
        elif k == 7:
            p = "    def f(x):\n        return x  # comment\n\n\n    \n" + "}" * 3 + "  \n\t\n"
        else:
            p = "".join(rng.choice(SCRIPTS[rng.choice(sorted(SCRIPTS))]) for _ in range(30))
        sep = rng.choice([" ", "\n", "", "  ", "\n\n", "\t"])
        parts.append(p + sep)
        size += len((p + sep).encode())
    return "".join(parts)


def corpus(out_dir, min_bytes):
    """About min_bytes in documents of ~128 KiB: Debian texts interleaved with generated ones."""
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(20261204)
    texts = debian_texts()
    # Take every k-th text so that licenses, copyright files and Python sources all appear.
    budget = int(min_bytes * 0.8)
    total = sum(len(t.encode()) for _, t in texts)
    step = max(1, total // budget)
    chosen = [t for i, (_, t) in enumerate(texts) if i % step == 0]
    docs, cur, size, n = [], [], 0, 0
    for t in chosen:
        cur.append(t)
        size += len(t.encode())
        if size >= 128 * 1024:
            docs.append("".join(cur))
            n += size
            cur, size = [], 0
        if n >= budget:
            break
    if cur:
        docs.append("".join(cur))
        n += size
    gen = []
    while n < min_bytes:
        d = generated_doc(rng, 64 * 1024)
        gen.append(d)
        n += len(d.encode())
    # Interleave: a generated document after every few Debian ones.
    out = []
    for i, d in enumerate(docs):
        out.append(d)
        if gen and i % 3 == 2:
            out.append(gen.pop())
    out += gen
    for i, d in enumerate(out):
        with open(os.path.join(out_dir, f"doc-{i:03d}.txt"), "w", encoding="utf-8") as fh:
            fh.write(d)
    print(f"corpus: {len(out)} documents, {n} bytes in {out_dir}")


def corpus_docs(corpus_dir):
    files = sorted(glob.glob(os.path.join(corpus_dir, "doc-*.txt")))
    docs = []
    for f in files:
        with open(f, encoding="utf-8", newline="") as fh:
            docs.append(fh.read())
    return files, docs


# ---- tokenizer.json files ----

def train(family, corpus_dir, out_dir):
    from tokenizers import Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
    _, docs = corpus_docs(corpus_dir)
    sample = docs[::2]
    bl = pre_tokenizers.ByteLevel
    tok = Tokenizer(models.BPE(ignore_merges=(family == "llama3")))
    specials_first = []
    if family == "gpt2":
        tok.pre_tokenizer = bl(add_prefix_space=False, trim_offsets=True, use_regex=True)
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
    elif family == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            bl(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    elif family == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            bl(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    elif family == "gpt2-prefix":
        tok.pre_tokenizer = bl(add_prefix_space=True, trim_offsets=True, use_regex=True)
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
    elif family == "smollm2":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            bl(add_prefix_space=False, trim_offsets=True, use_regex=True)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        specials_first = SMOL_SPECIALS
    else:
        raise SystemExit(f"unknown family {family}")
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=specials_first,
                             initial_alphabet=bl.alphabet(), show_progress=False)
    tok.train_from_iterator(sample, tr)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    if family in ("gpt2", "gpt2-prefix"):
        tok.add_special_tokens(["<|endoftext|>"])
        cfg.update(bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                   unk_token="<|endoftext|>", tokenizer_class="GPT2Tokenizer")
    elif family == "llama3":
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", LLAMA3_BOS)])])
        cfg.update(bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    elif family == "qwen2":
        tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        cfg.update(bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                   tokenizer_class="Qwen2Tokenizer")
    else:
        cfg.update(bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                   unk_token="<|endoftext|>", tokenizer_class="GPT2Tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    with open(path, encoding="utf-8") as fh:
        j = json.load(fh)
    if family == "gpt2":  # GPT-2's file lists <|endoftext|> in model.vocab as well
        j["model"]["vocab"]["<|endoftext|>"] = tok.token_to_id("<|endoftext|>")
    if family == "llama3":
        # Llama 3's layout: 128000 BPE tokens, then 256 special tokens from 128000 on. Stand-ins
        # fill the BPE vocabulary up (BPE never produces them: no merge leads there).
        vocab = j["model"]["vocab"]
        for i in range(len(vocab), LLAMA3_BOS):
            vocab[f"<|filler_{i}|>"] = i
        names = LLAMA3_SPECIALS + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)]
        j["added_tokens"] = [dict(id=LLAMA3_BOS + k, content=c, single_word=False, lstrip=False,
                                  rstrip=False, normalized=False, special=True)
                             for k, c in enumerate(names)]
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(j, fh, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    print(f"{family}: vocabulary {Tokenizer.from_file(path).get_vocab_size()} in {out_dir}")


def gpt2_files(src_dir, out_dir):
    """GPT-2's published vocab.json + merges.txt as a tokenizer.json. The copy at hand lacks one
    merge result in vocab.json (the `tokenizers` library refuses such a pair); that merge can
    never fire, so it is dropped, and the count is printed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    with open(os.path.join(src_dir, "vocab.json"), encoding="utf-8") as fh:
        vocab = json.load(fh)
    merges, dropped = [], []
    with open(os.path.join(src_dir, "merges.txt"), encoding="utf-8") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            a, b = line.split(" ")
            (merges if a in vocab and b in vocab and a + b in vocab else dropped).append((a, b))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                   "tokenizer_class": "GPT2Tokenizer"}, fh)
    print(f"gpt2 files: {len(vocab)} tokens, {len(merges)} merges, dropped {len(dropped)} "
          f"naming a token vocab.json lacks: {dropped}")


SP = "\u2581"  # ▁
SP_VARIANTS = ["llama2", "metaspace-first", "metaspace-split", "metaspace-never", "gemma",
               "unk-fused", "unk-unfused"]
SP_VOCAB = 3000
SP_ALPHABET = 160


def sp_base(corpus_dir):
    """(vocab dict, merges list) of a BPE trained as SentencePiece trains: pieces start at "▁",
    never span one; Llama 2's layout of ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    _, docs = corpus_docs(corpus_dir)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always",
                                                 split=True)
    tr = trainers.BpeTrainer(vocab_size=SP_VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                             limit_alphabet=SP_ALPHABET, show_progress=False)
    tok.train_from_iterator(docs[::2], tr)
    j = json.loads(tok.to_str())
    trained = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    names = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    names += [t for t, _ in trained if t not in names]
    return {t: i for i, t in enumerate(names)}, j["model"]["merges"]


def sp_json(variant, vocab, merges):
    """The tokenizer.json of one SentencePiece-style variant."""
    def added(i, c):
        return dict(id=i, content=c, single_word=False, lstrip=False, rstrip=False,
                    normalized=False, special=True)
    replace = lambda a, b: {"type": "Replace", "pattern": {"String": a}, "content": b}
    metaspace = lambda scheme, split: {"type": "Metaspace", "replacement": SP,
                                       "prepend_scheme": scheme, "split": split}
    llama_dec = {"type": "Sequence", "decoders": [
        replace(SP, " "), {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    bos = {"type": "TemplateProcessing",
           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}}],
           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "<s>", "type_id": 1}},
                    {"Sequence": {"id": "B", "type_id": 1}}],
           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    norm, pre, dec, post = None, None, llama_dec, bos
    fallback, fuse = True, True
    if variant in ("llama2", "unk-fused", "unk-unfused"):
        norm = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SP},
                                                    replace(" ", SP)]}
        fallback = variant == "llama2"
        fuse = variant != "unk-unfused"
        if variant == "unk-unfused":
            dec = {"type": "Sequence", "decoders": [replace(SP, " "), {"type": "Fuse"},
                                                    {"type": "Strip", "content": " ", "start": 1,
                                                     "stop": 0}]}
    elif variant == "metaspace-first":
        pre = metaspace("first", False)
    elif variant == "metaspace-split":
        pre, post = metaspace("always", True), None
        dec = {"type": "Sequence", "decoders": [metaspace("always", True),
                                                {"type": "ByteFallback"}, {"type": "Fuse"}]}
    elif variant == "metaspace-never":
        pre, post = metaspace("never", True), None
        dec = {"type": "Sequence", "decoders": [metaspace("never", True),
                                                {"type": "ByteFallback"}, {"type": "Fuse"}]}
    elif variant == "gemma":
        norm = replace(" ", SP)
        dec = {"type": "Sequence", "decoders": [replace(SP, " "), {"type": "ByteFallback"},
                                                {"type": "Fuse"}]}
    else:
        raise SystemExit(f"unknown variant {variant}")
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>",
             "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": fuse,
             "byte_fallback": fallback, "ignore_merges": False, "vocab": vocab, "merges": merges}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
            "normalizer": norm, "pre_tokenizer": pre, "post_processor": post, "decoder": dec,
            "model": model}


def sp(corpus_dir, out_root):
    from tokenizers import Tokenizer
    vocab, merges = sp_base(corpus_dir)
    for variant in SP_VARIANTS:
        out_dir = os.path.join(out_root, variant)
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(sp_json(variant, vocab, merges), fh, ensure_ascii=False)
        bos = variant not in ("metaspace-split", "metaspace-never")
        # As transformers writes it, model_max_length included (a number past 64 bits).
        cfg = {"add_bos_token": bos, "add_eos_token": False, "bos_token": "<s>",
               "eos_token": "</s>", "unk_token": "<unk>", "legacy": variant == "llama2",
               "model_max_length": 1000000000000000019884624838656,
               "clean_up_tokenization_spaces": False, "tokenizer_class": "LlamaTokenizer"}
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
            json.dump(cfg, fh, indent=2)
        n = Tokenizer.from_file(path).get_vocab_size()
        print(f"{variant}: vocabulary {n} ({len(merges)} merges) in {out_dir}")


EDGE_DOCS = [" leading space,  two  spaces,   three", "  \t\n indented start",
             "\n\nnewlines first\n",
             "<s>starts with BOS</s> then\nmore <unk> text<s>", "x", " ",
             SP + "already metaspace " + SP + SP + " and <0x41> <0xZZ> literal",
             "😀👍🏽 emoji first, then 🇩🇪 and 👨\u200d👩\u200d👧", "日本語のテキスト、漢字 ĳ ǅ",
             "\u00a0non-breaking\u3000ideographic space\u2003", "tab\tand\r\ncrlf\r\n",
             "a" + " " * 40 + "b" + "\n" * 10 + "c", "ÿ\x7f\x00\x01 control bytes"]


def edge_docs(corpus_dir):
    for i, d in enumerate(EDGE_DOCS):
        with open(os.path.join(corpus_dir, f"doc-{900 + i}.txt"), "w", encoding="utf-8",
                  newline="") as fh:
            fh.write(d)
    print(f"{len(EDGE_DOCS)} edge-case documents added to {corpus_dir}")


# ---- comparing ----

def eot_of(tok_dir, tok):
    with open(os.path.join(tok_dir, "tokenizer_config.json")) as fh:
        cfg = json.load(fh)
    names = [cfg.get("eos_token"), "<|endoftext|>", "<|end_of_text|>", "</s>"]
    for n in names:
        if n and tok.token_to_id(n) is not None:
            return tok.token_to_id(n)
    return -1


def read_shard(path):
    with open(path, "rb") as fh:
        data = fh.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    assert magic == 20240520, f"{path}: bad magic"
    fmt = "H" if version == 1 else "I"
    return version, list(struct.unpack(f"<{n}{fmt}", data[1024:]))


def expected_ids(tok_dir, corpus_dir):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    files, docs = corpus_docs(corpus_dir)
    eot = eot_of(tok_dir, tok)
    out = []
    for i, enc in enumerate(tok.encode_batch(docs)):
        if i > 0 and eot >= 0 and (not out or out[-1] != eot):
            out.append(eot)
        out.extend(enc.ids)
    return tok, files, docs, out


def compare(tok_dir, corpus_dir, shard):
    tok, files, docs, want = expected_ids(tok_dir, corpus_dir)
    version, got = read_shard(shard)
    if got == want:
        print(f"{tok_dir}: {len(got)} ids identical (shard version {version}, "
              f"{sum(len(d.encode()) for d in docs)} bytes, max id {max(got)})")
        return 0
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
             min(len(got), len(want)))
    print(f"{tok_dir}: ids differ at {i} (dsc {len(got)} ids, tokenizers {len(want)})")
    lo = max(0, i - 8)
    print("  tokenizers:", [(x, tok.id_to_token(x)) for x in want[lo:i + 8]])
    print("  dsc:       ", [(x, tok.id_to_token(x)) for x in got[lo:i + 8]])
    print("  text:", repr(tok.decode(want[lo:i + 8], skip_special_tokens=False)))
    return 1


def decode(tok_dir, shard, text_file):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    _, ids = read_shard(shard)
    want = tok.decode(ids, skip_special_tokens=False)
    with open(text_file, encoding="utf-8", errors="strict", newline="") as fh:
        got = fh.read()
    if got == want:
        print(f"{tok_dir}: decode of {len(ids)} ids identical ({len(got)} characters)")
        return 0
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
             min(len(got), len(want)))
    print(f"{tok_dir}: decoded text differs at character {i}: tokenizers "
          f"{want[max(0, i - 20):i + 20]!r}, dsc {got[max(0, i - 20):i + 20]!r}")
    return 1


def bench(tok_dir, corpus_dir, threads):
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    _, docs = corpus_docs(corpus_dir)
    nbytes = sum(len(d.encode()) for d in docs)
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        n = sum(len(e.ids) for e in tok.encode_batch(docs))
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    print(f"{nbytes / best / 1e6:.2f} MB/s {n} tokens {nbytes} bytes {best:.3f} s")
    return 0


def main(argv):
    cmd = argv[1]
    if cmd == "corpus":
        corpus(argv[2], int(argv[3]))
        return 0
    if cmd == "train":
        train(argv[2], argv[3], argv[4])
        return 0
    if cmd == "sp":
        sp(argv[2], argv[3])
        return 0
    if cmd == "edge-docs":
        edge_docs(argv[2])
        return 0
    if cmd == "gpt2-files":
        gpt2_files(argv[2], argv[3])
        return 0
    if cmd == "compare":
        return compare(argv[2], argv[3], argv[4])
    if cmd == "decode":
        return decode(argv[2], argv[3], argv[4])
    if cmd == "bench":
        return bench(argv[2], argv[3], int(argv[4]))
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
