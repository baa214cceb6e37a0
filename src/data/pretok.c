// data/pretok.c - tokenizer.json pre-tokenizers: ByteLevel, Split by pattern, Digits (see
// pretok.h).
//
// A pattern is compiled into a list of alternatives, each a small matcher written for one
// building block of the families' patterns; matching tries them in order at each position, which
// is exactly the backtracking reference's leftmost-first semantics because every block below
// reproduces its own backtracking (noted at each).
#include "data/pretok.h"

#include <stdlib.h> // calloc, free
#include <string.h> // memcmp, strcmp, strlen

#include "base/status.h"    // dsc__fail
#include "data/normalize.h" // dsc__replace
#include "data/unicode.h"   // dsc__utf8_decode, dsc__unicode_is_*

#define MAX_ALTS 32
#define MAX_STAGES 8
#define MAX_LITERAL 16

// GPT-2's pattern, what ByteLevel(use_regex=true) splits by.
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum alt_kind {
    A_LITERAL,        // the bytes of lit
    A_CONTRACTION_CI, // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    A_SP_LETTERS,     //  ?\p{L}+
    A_SP_NUMBERS,     //  ?\p{N}+
    A_SP_OTHER,       //  ?[^\s\p{L}\p{N}]+
    A_SP_OTHER_NL,    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    A_PREFIX_LETTERS, // [^\r\n\p{L}\p{N}]?\p{L}+
    A_NUMBERS_UPTO,   // \p{N}{1,k} (\p{N}: k = 1)
    A_SPACE_NL,       // \s*[\r\n]+
    A_SPACE_NOT_LAST, // \s+(?!\S)
    A_SPACE,          // \s+
};

typedef struct alt {
    int kind;
    int k;                      // A_NUMBERS_UPTO's bound
    size_t nlit;
    uint8_t lit[MAX_LITERAL];
} alt;

enum { ST_SPLIT, ST_DIGITS };

// What becomes of a match and the text around it (the reference's SplitDelimiterBehavior).
enum { B_ISOLATED, B_REMOVED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };

typedef struct stage {
    int kind;
    bool individual; // ST_DIGITS
    int behavior;    // ST_SPLIT
    int nalts;       // ST_SPLIT
    alt alts[MAX_ALTS];
} stage;

// How the first step rewrites each text before splitting it.
enum { PREP_NONE, PREP_METASPACE, PREP_SPACE };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

struct dsc__pretok {
    int nstages;
    stage st[MAX_STAGES];
    int prep;            // PREP_*
    int prepend;         // PREP_METASPACE: PREPEND_*
    uint8_t repl[4];     // PREP_METASPACE: the replacement character's UTF-8 ("▁")
    size_t nrepl;
};

// ---- internal: character classes ----

enum { C_SPACE, C_LETTER, C_NUMBER, C_OTHER };

static int cls(const uint8_t *s, size_t len, size_t p, size_t *next) {
    uint8_t b = s[p];
    if (b < 0x80) { // ASCII fast path
        *next = p + 1;
        if (b == ' ' || (b >= 0x09 && b <= 0x0D)) return C_SPACE;
        if ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') return C_LETTER;
        return b >= '0' && b <= '9' ? C_NUMBER : C_OTHER;
    }
    uint32_t cp;
    *next = p + dsc__utf8_decode(s + p, len - p, &cp);
    if (dsc__unicode_is_space(cp)) return C_SPACE;
    if (dsc__unicode_is_letter(cp)) return C_LETTER;
    return dsc__unicode_is_number(cp) ? C_NUMBER : C_OTHER;
}

// End of the run of class c starting at p (p itself when s[p] is not of class c).
static size_t run(const uint8_t *s, size_t len, size_t p, int c) {
    size_t next;
    while (p < len && cls(s, len, p, &next) == c) p = next;
    return p;
}

static bool is_nl(uint8_t b) { return b == '\r' || b == '\n'; }

// What Digits splits at: Rust's char::is_numeric in the reference, whose Unicode (15.x) has the
// numbers 15.0 added beyond the 14.0 table that the patterns' \p{N} (Oniguruma's) uses.
static bool digit_at(const uint8_t *s, size_t len, size_t p, size_t *next) {
    if (cls(s, len, p, next) == C_NUMBER) return true;
    if (s[p] != 0xF0) return false;
    uint32_t cp;
    (void)dsc__utf8_decode(s + p, len - p, &cp);
    return (cp >= 0x11F50 && cp <= 0x11F59) || // Kawi digits
           (cp >= 0x1D2C0 && cp <= 0x1D2D3) || // Kaktovik numerals
           (cp >= 0x1E4F0 && cp <= 0x1E4F9);   // Nag Mundari digits
}

// ---- internal: the building blocks; each returns the match's end, or <= p for no match ----

// (?i:'s|'t|'re|'ve|'m|'ll|'d). Under case folding 's also matches U+017F (long s, UTF-8
// C5 BF), which folds to s.
static size_t m_contraction_ci(const uint8_t *s, size_t len, size_t p) {
    if (s[p] != '\'' || p + 1 >= len) return 0;
    uint8_t c = s[p + 1] | 0x20, d = p + 2 < len ? s[p + 2] | 0x20 : 0;
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return p + 2;
    if (s[p + 1] == 0xC5 && p + 2 < len && s[p + 2] == 0xBF) return p + 3;
    if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return p + 3;
    return 0;
}

//  ?X+ for X a class: an optional space is taken only when a run of X follows it (the
// backtracking reference retries without the space, but a space is never X, so that fails).
static size_t m_sp_run(const uint8_t *s, size_t len, size_t p, int c) {
    size_t q = s[p] == ' ' && p + 1 < len ? p + 1 : p, next;
    if (cls(s, len, q, &next) != c) return 0;
    return run(s, len, next, c);
}

// [^\r\n\p{L}\p{N}]?\p{L}+: a letter run, or one character that is neither CR, LF, letter nor
// number followed by a letter run.
static size_t m_prefix_letters(const uint8_t *s, size_t len, size_t p) {
    size_t next;
    int c = cls(s, len, p, &next);
    if (c == C_LETTER) return run(s, len, next, C_LETTER);
    if (c == C_NUMBER || is_nl(s[p]) || next >= len) return 0;
    size_t after;
    if (cls(s, len, next, &after) != C_LETTER) return 0;
    return run(s, len, after, C_LETTER);
}

static size_t m_numbers_upto(const uint8_t *s, size_t len, size_t p, int k) {
    size_t next;
    for (int i = 0; i < k && p < len && cls(s, len, p, &next) == C_NUMBER; i++) p = next;
    return p;
}

// \s*[\r\n]+: \s* backs off from the end of the whitespace run to its last CR or LF, which
// [\r\n]+ then takes (CR and LF are ASCII, so they never sit inside a multi-byte space).
static size_t m_space_nl(const uint8_t *s, size_t len, size_t p) {
    size_t e = run(s, len, p, C_SPACE);
    while (e > p && !is_nl(s[e - 1])) e--;
    return e;
}

// \s+(?!\S): the whitespace run, less its last character unless the run ends the text.
static size_t m_space_not_last(const uint8_t *s, size_t len, size_t p) {
    size_t last = p, q = p, next;
    while (q < len && cls(s, len, q, &next) == C_SPACE) {
        last = q;
        q = next;
    }
    if (q == p) return 0;
    if (q == len) return q;
    return last > p ? last : 0;
}

static size_t match_alt(const alt *a, const uint8_t *s, size_t len, size_t p) {
    switch (a->kind) {
    case A_LITERAL:
        return len - p >= a->nlit && !memcmp(s + p, a->lit, a->nlit) ? p + a->nlit : 0;
    case A_CONTRACTION_CI: return m_contraction_ci(s, len, p);
    case A_SP_LETTERS: return m_sp_run(s, len, p, C_LETTER);
    case A_SP_NUMBERS: return m_sp_run(s, len, p, C_NUMBER);
    case A_SP_OTHER: return m_sp_run(s, len, p, C_OTHER);
    case A_SP_OTHER_NL: {
        size_t e = m_sp_run(s, len, p, C_OTHER);
        while (e && e < len && is_nl(s[e])) e++;
        return e;
    }
    case A_PREFIX_LETTERS: return m_prefix_letters(s, len, p);
    case A_NUMBERS_UPTO: {
        size_t e = m_numbers_upto(s, len, p, a->k);
        return e > p ? e : 0;
    }
    case A_SPACE_NL: return m_space_nl(s, len, p);
    case A_SPACE_NOT_LAST: return m_space_not_last(s, len, p);
    default: { // A_SPACE
        size_t e = run(s, len, p, C_SPACE);
        return e > p ? e : 0;
    }
    }
}

// ---- internal: compiling a pattern ----

static const struct {
    const char *text;
    int kind;
} BLOCKS[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)", A_CONTRACTION_CI},
    {" ?\\p{L}+", A_SP_LETTERS},
    {" ?\\p{N}+", A_SP_NUMBERS},
    {" ?[^\\s\\p{L}\\p{N}]+", A_SP_OTHER},
    {" ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*", A_SP_OTHER_NL},
    {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", A_PREFIX_LETTERS},
    {"\\p{N}", A_NUMBERS_UPTO},
    {"\\s*[\\r\\n]+", A_SPACE_NL},
    {"\\s+(?!\\S)", A_SPACE_NOT_LAST},
    {"\\s+", A_SPACE},
};

// Text without regex syntax: letters, digits, apostrophe, space and a few other plain bytes.
static bool plain_literal(const char *a, size_t n) {
    if (n == 0 || n > MAX_LITERAL) return false;
    for (size_t i = 0; i < n; i++)
        if (strchr("\\()[]{}|?*+.^$", a[i])) return false;
    return true;
}

// \p{N}{1,K} with 1 <= K <= 99 -> K, else 0.
static int numbers_bound(const char *a, size_t n) {
    static const char head[] = "\\p{N}{1,";
    size_t h = sizeof head - 1;
    if (n < h + 2 || n > h + 3 || memcmp(a, head, h) || a[n - 1] != '}') return 0;
    int k = 0;
    for (size_t i = h; i + 1 < n; i++) {
        if (a[i] < '0' || a[i] > '9') return 0;
        k = k * 10 + (a[i] - '0');
    }
    return k;
}

static dsc_status compile_alt(alt *out, const char *a, size_t n, const char *file,
                              const char *pattern) {
    *out = (alt){.k = 1};
    for (size_t i = 0; i < sizeof BLOCKS / sizeof BLOCKS[0]; i++) {
        if (strlen(BLOCKS[i].text) == n && !memcmp(BLOCKS[i].text, a, n)) {
            out->kind = BLOCKS[i].kind;
            return DSC_OK;
        }
    }
    if ((out->k = numbers_bound(a, n)) > 0) {
        out->kind = A_NUMBERS_UPTO;
        return DSC_OK;
    }
    if (plain_literal(a, n)) {
        out->kind = A_LITERAL;
        out->nlit = n;
        memcpy(out->lit, a, n);
        return DSC_OK;
    }
    return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer Split pattern \"%s\": the alternative "
                     "\"%.*s\" is not supported; dsc reads the byte-level BPE patterns of GPT-2, "
                     "Llama 3, Qwen2 and SmolLM2 (docs/data.md lists their building blocks)",
                     file, pattern, (int)n, a);
}

// Split at the '|' that are outside parentheses and brackets.
static dsc_status compile_pattern(stage *st, const char *pattern, const char *file) {
    st->kind = ST_SPLIT;
    st->nalts = 0;
    int depth = 0;
    size_t start = 0, n = strlen(pattern);
    for (size_t i = 0; i <= n; i++) {
        char c = i < n ? pattern[i] : '|';
        if (c == '\\' && i + 1 < n) {
            i++;
            continue;
        }
        if (c == '(' || c == '[') depth++;
        if ((c == ')' || c == ']') && depth > 0) depth--;
        if (c != '|' || (depth > 0 && i < n)) continue;
        if (st->nalts == MAX_ALTS)
            return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer pattern \"%s\" has more than %d "
                             "alternatives", file, pattern, MAX_ALTS);
        DSC_TRY(compile_alt(&st->alts[st->nalts++], pattern + start, i - start, file, pattern));
        start = i + 1;
    }
    return DSC_OK;
}

// ---- internal: reading the JSON ----

static bool flag(const json_t *o, const char *key, bool dflt) {
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static dsc_status add_stage(dsc__pretok *p, const char *file) {
    if (p->nstages == MAX_STAGES)
        return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer has more than %d steps", file,
                         MAX_STAGES);
    p->nstages++;
    return DSC_OK;
}

static const char *const BEHAVIORS[] = {"Isolated", "Removed", "MergedWithPrevious",
                                         "MergedWithNext", "Contiguous"};

static dsc_status read_split(dsc__pretok *p, const json_t *o, const char *file) {
    const json_t *pat = json_object_get(o, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    const char *str = json_string_value(json_object_get(pat, "String"));
    const char *beh = json_string_value(json_object_get(o, "behavior"));
    if (!re && !str)
        return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer Split has no pattern.Regex or "
                         "pattern.String", file);
    int b = 0;
    while (beh && b < 5 && strcmp(beh, BEHAVIORS[b])) b++;
    if (!beh || b == 5 || flag(o, "invert", false))
        return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer Split with behavior \"%s\"%s is not "
                         "supported; dsc reads behavior Isolated, Removed, MergedWithPrevious, "
                         "MergedWithNext or Contiguous, invert false", file,
                         beh ? beh : "(none)", flag(o, "invert", false) ? ", invert true" : "");
    DSC_TRY(add_stage(p, file));
    stage *st = &p->st[p->nstages - 1];
    if (re) {
        DSC_TRY(compile_pattern(st, re, file));
        st->behavior = b;
        return DSC_OK;
    }
    size_t n = strlen(str); // a plain string: one literal alternative
    if (n == 0 || n > MAX_LITERAL)
        return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer Split string \"%s\" must be 1 to %d "
                         "bytes", file, str, MAX_LITERAL);
    *st = (stage){.kind = ST_SPLIT, .behavior = b, .nalts = 1};
    st->alts[0] = (alt){.kind = A_LITERAL, .nlit = n};
    memcpy(st->alts[0].lit, str, n);
    return DSC_OK;
}

// Metaspace: spaces become the replacement character, which is prepended per prepend_scheme
// (files older than that key say add_prefix_space: true for "always", false for "never"); with
// split (default true) each replacement character starts a piece.
static dsc_status read_metaspace(dsc__pretok *p, const json_t *o, const char *file) {
    const char *r = json_string_value(json_object_get(o, "replacement"));
    const char *scheme = json_string_value(json_object_get(o, "prepend_scheme"));
    uint32_t cp;
    if (!r || !*r || strlen(r) > 4 ||
        dsc__utf8_decode((const uint8_t *)r, strlen(r), &cp) != strlen(r))
        return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer Metaspace needs \"replacement\", one "
                         "character (\"\xe2\x96\x81\")", file);
    p->prep = PREP_METASPACE;
    p->nrepl = strlen(r);
    memcpy(p->repl, r, p->nrepl);
    static const char *const schemes[] = {"always", "first", "never"};
    p->prepend = PREPEND_ALWAYS;
    while (scheme && p->prepend < 3 && strcmp(scheme, schemes[p->prepend])) p->prepend++;
    if (scheme && p->prepend == 3)
        return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer Metaspace prepend_scheme \"%s\" is "
                         "not one of always, first, never", file, scheme);
    if (!flag(o, "add_prefix_space", true)) {
        if (scheme && p->prepend != PREPEND_NEVER)
            return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer Metaspace has add_prefix_space "
                             "false but prepend_scheme \"%s\"; remove one of them", file, scheme);
        p->prepend = PREPEND_NEVER;
    }
    if (!flag(o, "split", true)) return DSC_OK;
    DSC_TRY(add_stage(p, file));
    stage *st = &p->st[p->nstages - 1];
    *st = (stage){.kind = ST_SPLIT, .behavior = B_MERGED_NEXT, .nalts = 1};
    st->alts[0] = (alt){.kind = A_LITERAL, .nlit = p->nrepl};
    memcpy(st->alts[0].lit, p->repl, p->nrepl);
    return DSC_OK;
}

// first: the step opens the pre-tokenizer, so a rewrite of the text it receives (Metaspace's,
// ByteLevel's prefix space) is a rewrite of each text between added tokens.
static dsc_status read_byte_level(dsc__pretok *p, const json_t *o, const char *file, bool first,
                                  bool *byte_level) {
    if (flag(o, "add_prefix_space", true)) {
        if (!first)
            return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer ByteLevel with add_prefix_space "
                             "true after another step is not supported; dsc reads it as the "
                             "first step", file);
        p->prep = PREP_SPACE;
    }
    *byte_level = true;
    if (!flag(o, "use_regex", true)) return DSC_OK;
    DSC_TRY(add_stage(p, file));
    return compile_pattern(&p->st[p->nstages - 1], GPT2_PATTERN, file);
}

static dsc_status read_one(dsc__pretok *p, const json_t *o, const char *file, bool first,
                           bool *byte_level) {
    const char *type = json_string_value(json_object_get(o, "type"));
    if (type && !strcmp(type, "ByteLevel")) return read_byte_level(p, o, file, first, byte_level);
    if (type && !strcmp(type, "Split")) return read_split(p, o, file);
    if (type && !strcmp(type, "Metaspace")) {
        if (!first)
            return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer Metaspace after another step is "
                             "not supported; dsc reads it as the first (or only) step", file);
        return read_metaspace(p, o, file);
    }
    if (type && !strcmp(type, "Digits")) {
        DSC_TRY(add_stage(p, file));
        p->st[p->nstages - 1] = (stage){.kind = ST_DIGITS,
                                        .individual = flag(o, "individual_digits", false)};
        return DSC_OK;
    }
    return dsc__fail(DSC_ERR_CONFIG, "%s: pre_tokenizer type \"%s\" is not supported; dsc reads "
                     "ByteLevel, Metaspace, Split, Digits and a Sequence of them", file,
                     type ? type : "(none)");
}

// ---- internal: splitting ----

typedef struct split_ctx {
    const dsc__pretok *p;
    dsc__piece_fn fn;
    void *ctx;
} split_ctx;

static bool run_stage(const split_ctx *c, int k, const uint8_t *s, size_t len);

static bool emit(const split_ctx *c, int k, const uint8_t *s, size_t n) {
    if (n == 0) return true;
    return k + 1 < c->p->nstages ? run_stage(c, k + 1, s, n) : c->fn(c->ctx, s, n);
}

// Pieces from the stream of segments (the text between matches, and matches) of one split,
// combined as the stage's behavior says; a piece may be held back until the next segment shows
// whether it joins it.
typedef struct merger {
    const split_ctx *c;
    int k, behavior;
    const uint8_t *s;     // the text being split
    size_t start, end;    // the held piece, s[start..end)
    bool held, held_match; // held_match: the last segment in it was a match
} merger;

static bool flush(merger *m) {
    if (!m->held) return true;
    m->held = false;
    return emit(m->c, m->k, m->s + m->start, m->end - m->start);
}

static bool hold(merger *m, size_t a, size_t b, bool match) {
    if (!flush(m)) return false;
    *m = (merger){m->c, m->k, m->behavior, m->s, a, b, true, match};
    return true;
}

static bool segment(merger *m, size_t a, size_t b, bool match) {
    switch (m->behavior) {
    case B_ISOLATED: return emit(m->c, m->k, m->s + a, b - a);
    case B_REMOVED: return match || emit(m->c, m->k, m->s + a, b - a);
    case B_MERGED_PREV: // a match joins the piece before it, unless that one ended in a match
        if (match && m->held && !m->held_match) {
            m->end = b;
            m->held_match = true;
            return true;
        }
        return hold(m, a, b, match);
    case B_MERGED_NEXT: // a match joins the piece after it, unless that one is a match too
        if (m->held && m->held_match && !match) {
            m->end = b;
            return flush(m);
        }
        if (match) return hold(m, a, b, true);
        return flush(m) && emit(m->c, m->k, m->s + a, b - a);
    default: // B_CONTIGUOUS: consecutive matches are one piece
        if (m->held && match && m->held_match) {
            m->end = b;
            return true;
        }
        return hold(m, a, b, match);
    }
}

static bool split_pattern(const split_ctx *c, int k, const stage *st, const uint8_t *s,
                          size_t len) {
    merger m = {c, k, st->behavior, s, 0, 0, false, false};
    size_t gap = 0; // start of the text not yet given out
    for (size_t p = 0; p < len;) {
        size_t end = 0;
        for (int i = 0; i < st->nalts && !end; i++) { // a match ending at p is none
            size_t e = match_alt(&st->alts[i], s, len, p);
            end = e > p ? e : 0;
        }
        if (!end) { // no alternative matches here: the character joins the gap
            size_t next;
            (void)cls(s, len, p, &next);
            p = next;
            continue;
        }
        if ((p > gap && !segment(&m, gap, p, false)) || !segment(&m, p, end, true)) return false;
        gap = p = end;
    }
    return (gap == len || segment(&m, gap, len, false)) && flush(&m);
}

static bool split_digits(const split_ctx *c, int k, bool individual, const uint8_t *s,
                         size_t len) {
    size_t gap = 0;
    for (size_t p = 0, next; p < len; p = next) {
        if (!digit_at(s, len, p, &next)) continue;
        for (size_t after; !individual && next < len && digit_at(s, len, next, &after);)
            next = after;
        if (!emit(c, k, s + gap, p - gap) || !emit(c, k, s + p, next - p)) return false;
        gap = next;
    }
    return emit(c, k, s + gap, len - gap);
}

static bool run_stage(const split_ctx *c, int k, const uint8_t *s, size_t len) {
    const stage *st = &c->p->st[k];
    if (st->kind == ST_DIGITS) return split_digits(c, k, st->individual, s, len);
    return split_pattern(c, k, st, s, len);
}

// ---- public API ----

dsc_status dsc__pretok_create(dsc__pretok **out, const json_t *pre, const char *file,
                              bool *byte_level) {
    *out = NULL;
    *byte_level = false;
    dsc__pretok *p = calloc(1, sizeof *p);
    if (!p) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", file);
    const char *type = json_string_value(json_object_get(pre, "type"));
    dsc_status st = DSC_OK;
    if (json_is_null(pre) || !pre) {
        // no pre-tokenizer: the whole text is one piece
    } else if (type && !strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(pre, "pretokenizers");
        size_t i;
        const json_t *o;
        json_array_foreach(list, i, o) {
            if ((st = read_one(p, o, file, i == 0, byte_level)) != DSC_OK) break;
        }
    } else {
        st = read_one(p, pre, file, true, byte_level);
    }
    if (st != DSC_OK) {
        free(p);
        return st;
    }
    *out = p;
    return DSC_OK;
}

void dsc__pretok_destroy(dsc__pretok *p) { free(p); }

bool dsc__pretok_prepare(const dsc__pretok *p, const uint8_t *s, size_t len, bool at_start,
                         uint8_t **out, size_t *olen) {
    *out = (uint8_t *)s;
    *olen = len;
    if (p->prep == PREP_NONE || len == 0) return true; // nothing is prepended to no text
    if (p->prep == PREP_SPACE) {
        if (s[0] == ' ') return true;
        uint8_t *b = malloc(len + 1);
        if (!b) return false;
        b[0] = ' ';
        memcpy(b + 1, s, len);
        *out = b;
        *olen = len + 1;
        return true;
    }
    size_t n;
    uint8_t *r = dsc__replace(s, len, (const uint8_t *)" ", 1, p->repl, p->nrepl, &n);
    if (!r) return false;
    bool starts = n >= p->nrepl && !memcmp(r, p->repl, p->nrepl);
    bool prepend = !starts && (p->prepend == PREPEND_ALWAYS ||
                               (p->prepend == PREPEND_FIRST && at_start));
    if (prepend) {
        uint8_t *b = malloc(n + p->nrepl);
        if (!b) {
            free(r);
            return false;
        }
        memcpy(b, p->repl, p->nrepl);
        memcpy(b + p->nrepl, r, n);
        free(r);
        r = b;
        n += p->nrepl;
    }
    *out = r;
    *olen = n;
    return true;
}

bool dsc__pretok_split(const dsc__pretok *p, const uint8_t *s, size_t len, dsc__piece_fn fn,
                       void *ctx) {
    if (len == 0) return true;
    if (p->nstages == 0) return fn(ctx, s, len);
    split_ctx c = {p, fn, ctx};
    return run_stage(&c, 0, s, len);
}
