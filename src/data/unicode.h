// data/unicode.h - the few Unicode facts the tokenizers need: UTF-8 decoding, the classes \p{L}
// (letters), \p{N} (numbers) and \s (White_Space), and NFC normalization.
#ifndef DSC_DATA_UNICODE_H
#define DSC_DATA_UNICODE_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint8_t, uint32_t

// Code point returned for a byte that does not start a valid UTF-8 sequence (overlong forms,
// surrogates, truncated sequences, values past U+10FFFF). It is in none of the classes below, so
// such a byte is treated like punctuation and tokenized on its own terms, byte by byte.
#define DSC_UTF8_INVALID 0xFFFFFFFFu

// Decode one code point from s[0..len) (len >= 1) into *cp; returns the bytes consumed (1-4).
// An invalid sequence consumes exactly one byte and yields DSC_UTF8_INVALID.
size_t dsc__utf8_decode(const uint8_t *s, size_t len, uint32_t *cp);

// General_Category L* (Lu, Ll, Lt, Lm, Lo), from the Unicode Character Database 14.0.
bool dsc__unicode_is_letter(uint32_t cp);
// General_Category N* (Nd, Nl, No), from the Unicode Character Database 14.0.
bool dsc__unicode_is_number(uint32_t cp);
// The White_Space property (what \s matches in a Unicode regex).
bool dsc__unicode_is_space(uint32_t cp);

// NFC (canonical decomposition, then canonical composition; Unicode 14.0 data).
// Quick check: true when s[0..len) certainly is NFC already (no NFC_Quick_Check No/Maybe code
// point, combining classes in order), so normalizing would not change it.
bool dsc__nfc_quick_check(const uint8_t *s, size_t len);
// The NFC form of s[0..len) into *out (caller owns, free()), *olen bytes. Bytes that are not
// UTF-8 pass through unchanged. false on OOM.
bool dsc__nfc(const uint8_t *s, size_t len, uint8_t **out, size_t *olen);

#endif
