// test_tokenizer_json.c - Hugging Face tokenizer.json tokenizers: pre-tokenizer patterns (pieces
// as the `tokenizers` library 0.19.1 splits the same strings), BPE with added tokens, the
// post-processor and tokenizer_config.json, NFC, a small SentencePiece-style file (byte
// fallback, unk, Metaspace, the decoders), and the errors for what dsc does not read.
// The exactness on a large corpus is tests/model/test_tokenizer_hf.sh and test_tokenizer_sp.sh.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>  // json_*
#include <stdio.h>    // snprintf
#include <stdlib.h>   // free, mkdtemp
#include <string.h>   // memcmp, strlen, strstr
#include <unistd.h>   // rmdir, unlink

#include "data/pretok.h"         // dsc__pretok_*
#include "data/tokenizer.h"      // dsc_tokenizer_*
#include "data/tokenizer_impl.h" // dsc__tok_byte_to_cp
#include "data/unicode.h"        // dsc__nfc
#include "dsc/status.h"          // dsc_last_error

static const char LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// ---- helpers ----

typedef struct pieces {
    char buf[4096];
    size_t at;
} pieces;

// Pieces joined with '|' (none of the test strings holds one).
static bool collect(void *ctx, const uint8_t *w, size_t n) {
    pieces *p = ctx;
    if (p->at) p->buf[p->at++] = '|';
    memcpy(p->buf + p->at, w, n);
    p->at += n;
    p->buf[p->at] = '\0';
    return true;
}

static void assert_split(const char *pre_json, const char *text, const char *want) {
    json_error_t err;
    json_t *pre = json_loads(pre_json, 0, &err);
    assert_non_null(pre);
    dsc__pretok *p;
    bool byte_level;
    dsc_status st = dsc__pretok_create(&p, pre, "test.json", &byte_level);
    if (st != DSC_OK) fail_msg("%s", dsc_last_error());
    pieces got = {.at = 0};
    assert_true(dsc__pretok_split(p, (const uint8_t *)text, strlen(text), collect, &got));
    if (strcmp(got.buf, want))
        fail_msg("split of \"%s\":\n got  %s\n want %s", text, got.buf, want);
    dsc__pretok_destroy(p);
    json_decref(pre);
}

static char *split_json(const char *pattern) {
    json_t *o = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", pattern,
                          "behavior", "Isolated", "invert", 0);
    char *s = json_dumps(o, 0);
    json_decref(o);
    return s;
}

// A folder with a tokenizer.json: the 256 byte tokens (id = byte), merges "Ġ t", "h e",
// "Ġt he" (ids 256-258), added tokens <|bos|> 259, <|x|> 260, <|x|>y 261, the token "ab" 262
// that no merge makes; Llama 3's pattern; <|bos|> before each text; ignore_merges as given.
// extra: applied to the JSON before it is written (may be NULL).
typedef struct fixture {
    char dir[64], path[128], cfg[128];
} fixture;

static json_t *base_json(bool ignore_merges) {
    uint32_t enc[256];
    dsc__tok_byte_to_cp(enc);
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char key[4] = {0};
        uint32_t cp = enc[b];
        if (cp < 0x80) key[0] = (char)cp;
        else key[0] = (char)(0xC0 | cp >> 6), key[1] = (char)(0x80 | (cp & 0x3F));
        json_object_set_new(vocab, key, json_integer(b));
    }
    json_object_set_new(vocab, "\xc4\xa0t", json_integer(256));
    json_object_set_new(vocab, "he", json_integer(257));
    json_object_set_new(vocab, "\xc4\xa0the", json_integer(258));
    json_object_set_new(vocab, "ab", json_integer(262));
    json_t *merges = json_pack("[s,s,s]", "\xc4\xa0 t", "h e", "\xc4\xa0t he");
    json_t *model = json_pack("{s:s, s:n, s:n, s:s, s:s, s:b, s:o, s:o}", "type", "BPE",
                              "dropout", "unk_token", "continuing_subword_prefix", "",
                              "end_of_word_suffix", "", "ignore_merges", ignore_merges, "vocab",
                              vocab, "merges", merges);
    json_t *added = json_array();
    const char *names[] = {"<|bos|>", "<|x|>", "<|x|>y"};
    for (int i = 0; i < 3; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                               259 + i, "content", names[i], "single_word", 0,
                                               "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
    char *split = split_json(LLAMA3);
    json_t *pre = json_pack("{s:s, s:[o, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
                            "pretokenizers", json_loads(split, 0, NULL), "type", "ByteLevel",
                            "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
    free(split);
    json_t *post = json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}",
                             "type", "TemplateProcessing", "single", "SpecialToken", "id",
                             "<|bos|>", "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                             "special_tokens", "<|bos|>", "id", "<|bos|>", "ids", 259, "tokens",
                             "<|bos|>");
    return json_pack("{s:s, s:o, s:n, s:o, s:o, s:{s:s}, s:o}", "version", "1.0", "added_tokens",
                     added, "normalizer", "pre_tokenizer", pre, "post_processor", post,
                     "decoder", "type", "ByteLevel", "model", model);
}

static void fixture_write(fixture *f, json_t *j, const char *config) {
    snprintf(f->dir, sizeof f->dir, "/tmp/dsc-tokjson-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/tokenizer.json", f->dir);
    snprintf(f->cfg, sizeof f->cfg, "%s/tokenizer_config.json", f->dir);
    assert_int_equal(json_dump_file(j, f->path, 0), 0);
    json_decref(j);
    if (config) {
        FILE *c = fopen(f->cfg, "w");
        assert_non_null(c);
        fputs(config, c);
        fclose(c);
    }
}

static void fixture_remove(fixture *f) {
    unlink(f->path);
    unlink(f->cfg);
    rmdir(f->dir);
}

static dsc_tokenizer *open_fixture(fixture *f, bool ignore_merges, const char *config) {
    fixture_write(f, base_json(ignore_merges), config);
    char spec[128];
    snprintf(spec, sizeof spec, "hf:%s", f->dir);
    dsc_tokenizer *t = NULL;
    if (dsc_tokenizer_create(&t, spec) != DSC_OK) fail_msg("%s", dsc_last_error());
    return t;
}

static void assert_ids(const dsc_tokenizer *t, const char *text, const int32_t *want, size_t n) {
    int32_t *ids;
    size_t m;
    assert_int_equal(dsc_tokenizer_encode(t, text, strlen(text), &ids, &m), DSC_OK);
    if (m != n || memcmp(ids, want, n * sizeof *ids)) {
        char got[512] = "";
        for (size_t i = 0, at = 0; i < m && at < sizeof got - 12; i++)
            at += (size_t)snprintf(got + at, sizeof got - at, " %d", ids[i]);
        fail_msg("encode \"%s\": got%s (%zu ids, want %zu)", text, got, m, n);
    }
    free(ids);
}

// ---- tests ----

// Pieces as tokenizers 0.19.1's Split(Regex(pattern), "isolated").pre_tokenize_str gives them.
static void test_patterns(void **state) {
    (void)state;
    const char *text = "Hello WORLD'S it'Re 12345 x\r\n\n  y  \tz!!\n\n$a 'ſ ١٢٣ 東京 é!";
    char *l3 = split_json(LLAMA3), *q2 = split_json(QWEN2);
    assert_split(l3, text, "Hello| WORLD|'S| it|'Re| |123|45| x|\r\n\n| | y|  |\tz|!!\n\n|$a| '|ſ"
                           "| |١٢٣| 東京| é|!");
    assert_split(q2, text, "Hello| WORLD|'S| it|'Re| |1|2|3|4|5| x|\r\n\n| | y|  |\tz|!!\n\n|$a"
                           "| '|ſ| |١|٢|٣| 東京| é|!");
    // (?i:'s) also matches the long s, which folds to s; ﬅ (folds to "st") is a letter.
    assert_split(l3, "x'ſt x'st x'ﬅx", "x|'ſ|t| x|'s|t| x|'ﬅx");
    free(q2);
    const char *gpt2 =
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";
    assert_split(gpt2, "  hello  world 123 it's IT'S!!  \n",
                 " | hello| | world| 123| it|'s| IT|'|S|!!|  \n");
    const char *smol = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
                       "\"individual_digits\": true}, {\"type\": \"ByteLevel\", "
                       "\"add_prefix_space\": false, \"use_regex\": true}]}";
    // The pattern stops at each digit's piece: the two spaces stay together.
    assert_split(smol, "a  1b22 x", "a|  |1|b|2|2| x");
    const char *runs = "{\"type\": \"Digits\", \"individual_digits\": false}";
    assert_split(runs, "ab123c4", "ab|123|c|4");
    // Digits knows Unicode 15.0's Kaktovik numerals and Kawi digits; the patterns' \p{N} does not.
    assert_split(runs, "a\xf0\x9d\x8b\x80\xf0\x91\xbd\x90" "b",
                 "a|\xf0\x9d\x8b\x80\xf0\x91\xbd\x90|b");
    assert_split(l3, "a\xf0\x9d\x8b\x80" "b", "a|\xf0\x9d\x8b\x80" "b");
    free(l3);
}

static void test_bpe_added_post(void **state) {
    (void)state;
    fixture f;
    dsc_tokenizer *t = open_fixture(&f, false, NULL);
    assert_int_equal(dsc_tokenizer_vocab_size(t), 263);
    assert_ids(t, " the", (int32_t[]){259, 258}, 2);
    assert_ids(t, "the12345", (int32_t[]){259, 't', 257, '1', '2', '3', '4', '5'}, 8);
    // Added tokens before BPE, leftmost then longest; "ab" is not merged (no merge makes it).
    assert_ids(t, "<|x|>y<|x|>ab", (int32_t[]){259, 261, 260, 'a', 'b'}, 5);
    assert_ids(t, "", (int32_t[]){259}, 1);
    int32_t ids[] = {259, 258, 260, 'a'};
    char *text;
    size_t len;
    assert_int_equal(dsc_tokenizer_decode(t, ids, 4, &text, &len), DSC_OK);
    assert_string_equal(text, "<|bos|> the<|x|>a");
    free(text);
    dsc_tokenizer_destroy(t);
    fixture_remove(&f);
    // ignore_merges: a word that is a vocabulary token as a whole is that token.
    t = open_fixture(&f, true, NULL);
    assert_ids(t, "ab", (int32_t[]){259, 262}, 2);
    dsc_tokenizer_destroy(t);
    fixture_remove(&f);
}

static void test_config(void **state) {
    (void)state;
    fixture f;
    dsc_tokenizer *t = open_fixture(&f, false, "{\"add_bos_token\": false, \"add_eos_token\": true,"
                                              " \"eos_token\": {\"content\": \"<|x|>\"}}");
    assert_ids(t, " the", (int32_t[]){258, 260}, 2);
    assert_int_equal(dsc_tokenizer_eot(t), 260);
    dsc_tokenizer_destroy(t);
    fixture_remove(&f);
    t = open_fixture(&f, false, NULL); // no config: end of text is none of the usual names
    assert_int_equal(dsc_tokenizer_eot(t), -1);
    dsc_tokenizer_destroy(t);
    fixture_remove(&f);
    fixture_write(&f, base_json(false), "{\"add_bos_token\": true, \"bos_token\": \"<nope>\"}");
    char spec[128];
    snprintf(spec, sizeof spec, "hf:%s", f.dir);
    assert_int_equal(dsc_tokenizer_create(&t, spec), DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "bos_token \"<nope>\" is not a token"));
    fixture_remove(&f);
}

// Each edit of the fixture must be refused with a sentence naming the thing.
static void assert_refused(const char *path_in_json, json_t *value, dsc_status want,
                           const char *needle) {
    json_t *j = base_json(false);
    char key[64];
    snprintf(key, sizeof key, "%s", path_in_json);
    char *dot = strchr(key, '.');
    json_t *parent = j;
    if (dot) {
        *dot = '\0';
        parent = json_object_get(j, key);
        memmove(key, dot + 1, strlen(dot + 1) + 1);
    }
    json_object_set_new(parent, key, value);
    fixture f;
    fixture_write(&f, j, NULL);
    dsc_tokenizer *t = NULL;
    dsc_status st = dsc_tokenizer_create(&t, f.path);
    fixture_remove(&f);
    if (st != want || !strstr(dsc_last_error(), needle))
        fail_msg("%s: status %d, message \"%s\"; want %d with \"%s\"", path_in_json, st,
                 dsc_last_error(), want, needle);
}

static void test_refused(void **state) {
    (void)state;
    char *bad = split_json("\\p{Lu}+|\\s+");
    assert_refused("pre_tokenizer", json_loads(bad, 0, NULL), DSC_ERR_CONFIG,
                   "the alternative \"\\p{Lu}+\" is not supported");
    free(bad);
    assert_refused("pre_tokenizer", json_pack("{s:s}", "type", "Metaspace"), DSC_ERR_CONFIG,
                   "Metaspace needs \"replacement\"");
    // A byte-level vocabulary and decoder without a ByteLevel pre-tokenizer: parts of two kinds.
    assert_refused("pre_tokenizer", json_pack("{s:s, s:s}", "type", "Metaspace", "replacement",
                                              "\xe2\x96\x81"), DSC_ERR_CONFIG,
                   "decoder ByteLevel without a ByteLevel step in the pre_tokenizer");
    assert_refused("pre_tokenizer", json_null(), DSC_ERR_CONFIG, "decoder ByteLevel without");
    assert_refused("decoder", json_pack("{s:s}", "type", "Fuse"), DSC_ERR_CONFIG,
                   "decoder \"Fuse\" with a ByteLevel pre_tokenizer is not supported");
    assert_refused("model.type", json_string("Unigram"), DSC_ERR_CONFIG,
                   "model.type \"Unigram\" is not supported; dsc reads BPE models");
    assert_refused("normalizer", json_pack("{s:s}", "type", "Lowercase"), DSC_ERR_CONFIG,
                   "normalizer \"Lowercase\"");
    assert_refused("model.byte_fallback", json_true(), DSC_ERR_CONFIG,
                   "model.byte_fallback is true with a ByteLevel pre_tokenizer");
    assert_refused("model.continuing_subword_prefix", json_string("##"), DSC_ERR_CONFIG,
                   "model.continuing_subword_prefix is set");
    assert_refused("model.merges", json_pack("[s]", "h zz"), DSC_ERR_CORRUPT,
                   "model.merges[0] \"h\" + \"zz\": the right token is not in model.vocab");
    assert_refused("post_processor", json_pack("{s:s}", "type", "RobertaProcessing"),
                   DSC_ERR_CONFIG, "post_processor type \"RobertaProcessing\"");
    json_t *added = json_pack("[{s:i, s:s, s:b}]", "id", 300, "content", "<|gap|>", "lstrip", 0);
    assert_refused("added_tokens", added, DSC_ERR_CORRUPT, "no token has id 259");
    dsc_tokenizer *t = NULL;
    assert_int_equal(dsc_tokenizer_create(&t, "hf:/nonexistent-dir"), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), "/nonexistent-dir/tokenizer.json"));
}

static void assert_nfc(const char *in, const char *want) {
    uint8_t *out;
    size_t n;
    assert_true(dsc__nfc((const uint8_t *)in, strlen(in), &out, &n));
    if (n != strlen(want) || memcmp(out, want, n))
        fail_msg("NFC of \"%s\" is \"%.*s\"", in, (int)n, out);
    free(out);
}

// Expected forms from Python's unicodedata.normalize("NFC", ...).
static void test_nfc(void **state) {
    (void)state;
    assert_nfc("e\xcc\x81", "\xc3\xa9");                       // e + acute -> é
    assert_nfc("\xe2\x84\xab", "\xc3\x85");                    // U+212B Angstrom -> Å
    assert_nfc("q\xcc\x87\xcc\xa3", "q\xcc\xa3\xcc\x87");      // marks reordered by class
    assert_nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"); // jamo -> 각
    assert_nfc("\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc");    // U+0958 is excluded: stays apart
    assert_nfc("\xe1\xba\x9b\xcc\xa3", "\xe1\xba\x9b\xcc\xa3"); // ẛ̣ is NFC already
    assert_nfc("plain ascii", "plain ascii");
    // The quick check says yes only for text certainly in NFC (a "maybe" character, such as a
    // combining mark that could compose with what precedes it, sends the text to dsc__nfc).
    assert_false(dsc__nfc_quick_check((const uint8_t *)"e\xcc\x81", 3));
    assert_true(dsc__nfc_quick_check((const uint8_t *)"\xc3\xa9 \xe6\x9d\xb1 ok", 9));
    assert_false(dsc__nfc_quick_check((const uint8_t *)"\xe2\x84\xab", 3));
}

// ---- SentencePiece-style BPE ----

#define SP "\xe2\x96\x81" // ▁, U+2581

// Llama 2's layout: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3-258, then 259 ▁, 260 h, 261 e,
// 262 l, 263 o, 264 ▁h, 265 ▁he, 266 ll, 267 ▁hell, 268 ▁hello, 269 w, 270 r, 271 d. Normalizer
// Prepend + Replace, no pre-tokenizer, Llama 2's decoder, <s> added before each text.
static json_t *sp_json(bool byte_fallback, bool fuse_unk, bool pairs) {
    json_t *vocab = json_object();
    const char *special[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) json_object_set_new(vocab, special[i], json_integer(i));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_object_set_new(vocab, name, json_integer(3 + b));
    }
    const char *pieces[] = {SP, "h", "e", "l", "o", SP "h", SP "he", "ll", SP "hell", SP "hello",
                            "w", "r", "d"};
    for (int i = 0; i < 13; i++) json_object_set_new(vocab, pieces[i], json_integer(259 + i));
    json_t *merges = pairs ? json_pack("[[s,s],[s,s],[s,s],[s,s],[s,s]]", SP, "h", SP "h", "e",
                                       "l", "l", SP "he", "ll", SP "hell", "o")
                           : json_pack("[s,s,s,s,s]", SP " h", SP "h e", "l l", SP "he ll",
                                       SP "hell o");
    json_t *model = json_pack("{s:s, s:n, s:s, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE",
                              "dropout", "unk_token", "<unk>", "continuing_subword_prefix",
                              "end_of_word_suffix", "fuse_unk", fuse_unk, "byte_fallback",
                              byte_fallback, "ignore_merges", 0, "vocab", vocab, "merges",
                              merges);
    json_t *added = json_array();
    for (int i = 0; i < 3; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", i,
                                               "content", special[i], "single_word", 0, "lstrip",
                                               0, "rstrip", 0, "normalized", 0, "special", 1));
    json_t *norm = json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence",
                             "normalizers", "type", "Prepend", "prepend", SP, "type", "Replace",
                             "pattern", "String", " ", "content", SP);
    json_t *dec = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}",
                            "type", "Sequence", "decoders", "type", "Replace", "pattern", "String",
                            SP, "content", " ", "type", "ByteFallback", "type", "Fuse", "type",
                            "Strip", "content", " ", "start", 1, "stop", 0);
    json_t *post = json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}",
                             "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>",
                             "type_id", 0, "Sequence", "id", "A", "type_id", 0, "special_tokens",
                             "<s>", "id", "<s>", "ids", 1, "tokens", "<s>");
    return json_pack("{s:s, s:o, s:o, s:n, s:o, s:o, s:o}", "version", "1.0", "added_tokens",
                     added, "normalizer", norm, "pre_tokenizer", "post_processor", post,
                     "decoder", dec, "model", model);
}

// transformers' tokenizer_config.json, model_max_length included (past 64 bits).
static const char SP_CONFIG[] =
    "{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": \"<s>\", "
    "\"eos_token\": \"</s>\", \"unk_token\": \"<unk>\", "
    "\"model_max_length\": 1000000000000000019884624838656, \"legacy\": true}";

static dsc_tokenizer *open_json(fixture *f, json_t *j, const char *config) {
    fixture_write(f, j, config);
    char spec[128];
    snprintf(spec, sizeof spec, "hf:%s", f->dir);
    dsc_tokenizer *t = NULL;
    if (dsc_tokenizer_create(&t, spec) != DSC_OK) fail_msg("%s", dsc_last_error());
    return t;
}

static void assert_decode(const dsc_tokenizer *t, const int32_t *ids, size_t n,
                          const char *want) {
    char *text;
    size_t len;
    assert_int_equal(dsc_tokenizer_decode(t, ids, n, &text, &len), DSC_OK);
    assert_int_equal(len, strlen(want));
    assert_string_equal(text, want);
    free(text);
}

// Ids and texts as tokenizers 0.19.1 gives them for the same file.
static void test_sentencepiece(void **state) {
    (void)state;
    for (int pairs = 0; pairs < 2; pairs++) { // merges as "a b" strings and as [a, b] pairs
        fixture f;
        dsc_tokenizer *t = open_json(&f, sp_json(true, true, pairs), SP_CONFIG);
        assert_int_equal(dsc_tokenizer_vocab_size(t), 272);
        assert_int_equal(dsc_tokenizer_eot(t), 2);
        assert_ids(t, "hello", (int32_t[]){1, 268}, 2);
        // é has no token: its bytes C3 A9 are <0xC3> 198 and <0xA9> 172.
        assert_ids(t, "hello w\xc3\xa9", (int32_t[]){1, 268, 259, 269, 198, 172}, 6);
        assert_ids(t, " hello", (int32_t[]){1, 259, 268}, 3);
        // The normalizer runs on each text between added tokens: "llo" gets its own ▁.
        assert_ids(t, "he<s>llo", (int32_t[]){1, 265, 1, 259, 266, 263}, 6);
        assert_ids(t, "\n", (int32_t[]){1, 259, 13}, 3);
        assert_ids(t, "", (int32_t[]){1}, 1);
        assert_decode(t, (int32_t[]){1, 268, 259, 269, 198, 172}, 6, "<s> hello w\xc3\xa9");
        assert_decode(t, (int32_t[]){268, 259, 269}, 3, "hello w"); // Strip: one leading space
        assert_decode(t, (int32_t[]){198, 269}, 2, "\xef\xbf\xbdw");  // a lone C3: U+FFFD
        assert_decode(t, (int32_t[]){259, 259}, 2, " ");
        dsc_tokenizer_destroy(t);
        fixture_remove(&f);
    }
    // Without byte_fallback an unknown character is <unk>; fuse_unk joins a run into one.
    fixture f;
    dsc_tokenizer *t = open_json(&f, sp_json(false, true, false), NULL);
    assert_ids(t, "h\xe2\x82\xac\xe2\x82\xac" "e", (int32_t[]){1, 264, 0, 261}, 4);
    dsc_tokenizer_destroy(t);
    fixture_remove(&f);
    t = open_json(&f, sp_json(false, false, false), NULL);
    assert_ids(t, "h\xe2\x82\xac\xe2\x82\xac" "e", (int32_t[]){1, 264, 0, 0, 261}, 5);
    dsc_tokenizer_destroy(t);
    fixture_remove(&f);
    // A token with "▁" after another character ("o▁" 272, merged first): BPE merges across the
    // "▁" between words, so the text is not split there.
    json_t *j = sp_json(true, true, false);
    json_t *model = json_object_get(j, "model");
    json_object_set_new(json_object_get(model, "vocab"), "o" SP, json_integer(272));
    json_array_insert_new(json_object_get(model, "merges"), 0, json_string("o " SP));
    t = open_json(&f, j, NULL);
    assert_ids(t, "hello w", (int32_t[]){1, 267, 272, 269}, 4);
    assert_ids(t, "hello wo hello", (int32_t[]){1, 267, 272, 269, 272, 260, 261, 266, 263}, 9);
    dsc_tokenizer_destroy(t);
    fixture_remove(&f);
}

// The newer form: no normalizer, Metaspace with prepend_scheme "first": a text after an added
// token is not prepended to.
static void test_metaspace(void **state) {
    (void)state;
    json_t *j = sp_json(true, true, false);
    json_object_set_new(j, "normalizer", json_null());
    json_object_set_new(j, "pre_tokenizer", json_pack("{s:s, s:s, s:s, s:b}", "type",
                                                      "Metaspace", "replacement", SP,
                                                      "prepend_scheme", "first", "split", 0));
    json_object_set_new(j, "decoder", json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace",
                                                "replacement", SP, "prepend_scheme", "first",
                                                "split", 0));
    fixture f;
    dsc_tokenizer *t = open_json(&f, j, SP_CONFIG);
    assert_ids(t, "<s>hello", (int32_t[]){1, 1, 260, 261, 266, 263}, 6);
    assert_ids(t, "hello hello", (int32_t[]){1, 268, 268}, 3);
    // Metaspace decoder: the first token drops its ▁, the others' become spaces.
    assert_decode(t, (int32_t[]){268, 268, 259}, 3, "hello hello ");
    dsc_tokenizer_destroy(t);
    fixture_remove(&f);
}

static void assert_sp_refused(json_t *j, const char *needle) {
    fixture f;
    fixture_write(&f, j, NULL);
    dsc_tokenizer *t = NULL;
    dsc_status st = dsc_tokenizer_create(&t, f.path);
    fixture_remove(&f);
    if (st != DSC_ERR_CONFIG || !strstr(dsc_last_error(), needle))
        fail_msg("status %d, message \"%s\"; want the config error \"%s\"", st,
                 dsc_last_error(), needle);
}

static void test_sentencepiece_refused(void **state) {
    (void)state;
    json_t *j = sp_json(true, true, false);
    json_object_set_new(j, "decoder", json_pack("{s:s}", "type", "CTC"));
    assert_sp_refused(j, "decoder \"CTC\" is not supported; dsc reads ByteLevel");
    j = sp_json(true, true, false);
    json_object_set_new(j, "decoder", json_pack("{s:s}", "type", "ByteLevel"));
    assert_sp_refused(j, "decoder ByteLevel without a ByteLevel step");
    // An added token the normalizer would change (Prepend) cannot be found in the raw text.
    j = sp_json(true, true, false);
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i, s:s, s:b}", "id", 272, "content", "<x>", "normalized",
                                    1));
    assert_sp_refused(j, "added token \"<x>\" has \"normalized\": true");
    j = sp_json(true, true, false);
    json_object_set_new(json_object_get(j, "model"), "type", json_string("WordPiece"));
    assert_sp_refused(j, "model.type \"WordPiece\" is not supported");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_patterns),
        cmocka_unit_test(test_bpe_added_post),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_sentencepiece),
        cmocka_unit_test(test_metaspace),
        cmocka_unit_test(test_sentencepiece_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
