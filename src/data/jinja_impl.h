// data/jinja_impl.h - the Jinja subset's insides, shared by its files: arena, values, the syntax
// tree, the lexer's tokens, and the calls between lexer, parser, evaluator and library.
//
// Values live in an arena that is freed as a whole (one per compiled template for literals, one
// per render for everything made while rendering), so no value is reference counted. Every value
// is immutable except a namespace's slots, which only `{% set ns.x = ... %}` writes.
#ifndef DSC_DATA_JINJA_IMPL_H
#define DSC_DATA_JINJA_IMPL_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t

#include "data/jinja.h" // dsc_jinja
#include "dsc/status.h" // dsc_status

// ---- arena ----

typedef struct jarena {
    struct jblock *head;
} jarena;

void *dsc__jarena_alloc(jarena *a, size_t n); // zeroed; NULL when out of memory
void dsc__jarena_free(jarena *a);

// ---- values ----

typedef enum jkind {
    JV_UNDEF, // a name or key that does not exist (prints as "", is false, iterates as empty)
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,  // also Python tuples
    JV_DICT,  // keys in insertion order
    JV_NS,    // namespace(): a dict whose slots `set` may change
    JV_MACRO, // a {% macro %}
    JV_FUNC,  // a global function (raise_exception, namespace, range, strftime_now)
    JV_METHOD // a value's method, bound to it (e.g. "abc".upper)
} jkind;

typedef struct jv {
    jkind kind;
    union {
        bool b;
        int64_t i;
        double f;
        struct jstr *s;
        struct jlist *l;
        struct jdict *d; // JV_DICT, JV_NS
        struct jnode *macro;
        struct jmethod *m;
        int func;
        const char *name; // JV_UNDEF: what was looked up (NULL: unknown), for messages
    } u;
} jv;

typedef struct jstr {
    size_t n;
    char c[]; // n bytes and a NUL
} jstr;

typedef struct jlist {
    int n;
    bool tuple; // a Python tuple: printed as (a, b)
    jv *v;
} jlist;

typedef struct jdict {
    int n, cap;
    jstr **k; // keys are strings (JSON's and keyword arguments')
    jv *v;
} jdict;

typedef struct jmethod {
    jv self;
    const char *name;
} jmethod;

enum { JF_RAISE, JF_NAMESPACE, JF_RANGE, JF_STRFTIME, JF_DICT };

extern const jv dsc__jv_undef, dsc__jv_none;
jv dsc__jv_bool(bool b);
jv dsc__jv_int(int64_t i);
jv dsc__jv_float(double f);
jv dsc__jv_str(jarena *a, const char *s, size_t n); // copied; kind JV_UNDEF when out of memory
jv dsc__jv_list(jarena *a, int n);                   // n undefined items to fill
jv dsc__jv_dict(jarena *a);
bool dsc__jv_dict_set(jarena *a, jdict *d, const char *k, size_t kn, jv v); // replaces a key
bool dsc__jv_dict_get(const jdict *d, const char *k, size_t kn, jv *out);

bool dsc__jv_truthy(jv v);
const char *dsc__jv_type(jv v); // Python's type name, for messages
bool dsc__jv_equal(jv a, jv b);
// Python's str() (repr for the items of lists and dicts; undefined is "") appended to *out.
typedef struct jbuf {
    char *s;
    size_t n, cap;
    bool oom;
} jbuf;
void dsc__jbuf_add(jbuf *b, const char *s, size_t n);
void dsc__jv_to_str(jbuf *b, jv v);
// json.dumps(v, ensure_ascii=False, indent=indent (< 0: None), sort_keys=False). False when v
// holds something JSON has no form for (undefined, a function); what then goes to *bad.
bool dsc__jv_to_json(jbuf *b, jv v, int indent, int depth, const char **bad);
// A value from JSON (jansson), copied into the arena.
struct json_t;
jv dsc__jv_from_json(jarena *a, struct json_t *j);

// ---- lexer ----

typedef enum jtok_kind {
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING, // already unescaped
    T_INT,
    T_FLOAT,
    T_OP, // s holds the operator: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
    T_EOF
} jtok_kind;

typedef struct jtok {
    jtok_kind kind;
    int line;
    const char *s; // T_TEXT, T_NAME, T_STRING, T_OP: n bytes (arena or template)
    size_t n;
    int64_t i;
    double f;
} jtok;

// Tokenize src (whitespace control applied: trim_blocks, lstrip_blocks, "-" and "+" markers, one
// trailing newline dropped, line ends normalised to \n). Tokens and their strings go to a.
dsc_status dsc__jinja_lex(jarena *a, const char *src, const char *name, jtok **out, int *n);

// ---- syntax tree ----

typedef enum jexpr_kind {
    E_LIT,
    E_NAME,
    E_ATTR,   // a.name
    E_ITEM,   // a[b]
    E_SLICE,  // a[b:c:d] (NULL parts omitted)
    E_CALL,   // a(args)
    E_FILTER, // a | name(args)
    E_TEST,   // a is [not] name(args)
    E_BIN,    // a op b (op: + - * / // % ** ~ == != < <= > >= in notin)
    E_NEG,
    E_POS,
    E_NOT,
    E_AND,
    E_OR,
    E_COND, // b if a else c
    E_LIST,
    E_DICT // args: keys and values alternating
} jexpr_kind;

typedef struct jexpr {
    jexpr_kind kind;
    int line;
    jv lit;
    const char *name; // names, attributes, filters, tests, operators
    bool negate;      // E_TEST: "is not"; E_LIST: a tuple
    struct jexpr *a, *b, *c, *d;
    struct jexpr **args; // positional, then keyword (kw[i] != NULL)
    const char **kw;
    int nargs;
} jexpr;

typedef enum jnode_kind {
    S_TEXT,
    S_OUT,
    S_IF,    // if (e) body else els (elif: an S_IF in els)
    S_FOR,   // for targets in (e) [if (cond)]: body else els
    S_SET,   // set target(s) = e, or set ns.attr = e
    S_BLOCK_SET, // set name %} body {% endset
    S_MACRO,
    S_BREAK,
    S_CONTINUE,
    S_BODY // {% generation %}: the body as it is
} jnode_kind;

typedef struct jnode {
    jnode_kind kind;
    int line;
    const char *text; // S_TEXT
    size_t n;
    jexpr *e, *cond;
    const char **names; // targets, macro name + parameters
    jexpr **defaults;   // macro parameters' defaults (NULL: none)
    int nnames;
    const char *attr; // S_SET of ns.attr
    struct jnode **body, **els;
    int nbody, nels;
} jnode;

struct dsc_jinja {
    jarena arena;
    char name[256]; // for messages: "chat template"
    jnode **body;
    int nbody;
};

dsc_status dsc__jinja_parse(struct dsc_jinja *t, const jtok *tok, int ntok);

// ---- library (filters, tests, methods, globals) ----

bool dsc__jinja_has_filter(const char *name);
bool dsc__jinja_has_test(const char *name);
bool dsc__jinja_has_method(const char *name);
int dsc__jinja_global(const char *name); // JF_*, or -1

typedef struct jrender jrender; // the evaluator's state (jinja_eval.c)
// The callee's arguments: positional first (npos), then keyword ones (kw[i] names them).
typedef struct jargs {
    jv *v;
    const char **kw;
    int n, npos;
} jargs;
dsc_status dsc__jinja_filter(jrender *r, int line, const char *name, jv x, const jargs *a,
                             jv *out);
dsc_status dsc__jinja_test(jrender *r, int line, const char *name, jv x, const jargs *a,
                           bool *out);
dsc_status dsc__jinja_method(jrender *r, int line, const jmethod *m, const jargs *a, jv *out);
dsc_status dsc__jinja_call_global(jrender *r, int line, int func, const jargs *a, jv *out);
// a op b as an expression's operator gives it (op: + - * / // % ** ~ == != < <= > >= in notin).
dsc_status dsc__jinja_binop(jrender *r, int line, const char *op, jv a, jv b, jv *out);
// For the library: the render's arena, its template's name, and a runtime error at line.
jarena *dsc__jinja_arena(jrender *r);
dsc_status dsc__jinja_fail(jrender *r, int line, dsc_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
// A value's attribute as Jinja finds it (`a.name`: the attribute, else the item; undefined when
// neither).
dsc_status dsc__jinja_getattr(jrender *r, int line, jv a, const char *name, jv *out);

// UTF-8 helpers: code points in s[0, n), and the byte offset of code point k.
size_t dsc__utf8_count(const char *s, size_t n);
size_t dsc__utf8_offset(const char *s, size_t n, size_t k);
// Python's white space (str.isspace: ASCII and Unicode's) at the start / end of s[0, n): bytes.
size_t dsc__ws_prefix(const char *s, size_t n);
size_t dsc__ws_suffix(const char *s, size_t n);

#endif
