// data/tokenizer.h - text <-> token ids: a byte-level tokenizer, byte-level BPE (GPT-2's
// vocab.json/merges.txt, Hugging Face tokenizer.json) and SentencePiece-style BPE (Hugging Face
// tokenizer.json, data/tokenizer_json.c). The calls and the specs they accept are public
// (dsc/data.h, "tokenizers"); this header is the library's way in to them.
//
// GPT-2 encoding reproduces the reference tokenizer: bytes are mapped to printable characters,
// text is split by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (implemented by hand, with Unicode 14.0 letter/number classes), and each piece is merged by
// BPE rank. Limits: code points assigned after Unicode 14.0 count as punctuation; bytes that are
// not valid UTF-8 are tokenized one by one as punctuation (the reference cannot take them at
// all); the text "<|endoftext|>" is encoded as ordinary text, never as the special token.
#ifndef DSC_DATA_TOKENIZER_H
#define DSC_DATA_TOKENIZER_H

#include "dsc/data.h" // dsc_tokenizer_*

#endif
