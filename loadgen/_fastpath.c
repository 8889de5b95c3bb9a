/* The compiled per-chunk path of bench's raw HTTP transport (issue 8).
 *
 * One FastStream per streamed response, created by loadgen/rawhttp.py once the
 * response head was parsed (2xx, chunked) and the recorder's parser offers a fast
 * path. Its ``readable`` is registered with the event loop in place of the Python
 * reader, so each read costs no Python frame: recv (or recvmsg with the kernel's
 * receive timestamp), one CLOCK_MONOTONIC stamp (the clock of time.perf_counter_ns),
 * HTTP/1.1 chunk de-framing, SSE framing, and a validating JSON scan of each payload.
 *
 * The scan only *recognises* the common token event of an OpenAI-style stream (one
 * choice with non-empty text, finish_reason null, and either usage with an integer
 * completion_tokens or no usage at all) and keeps its few numbers in a C array. A
 * stream's first token event without usage goes to the parser (it changes the
 * parser's state: usage is no longer cumulative), the later ones are the scan's. Every other payload (the
 * role event, the final event, usage-only events, errors, anything unusual or that
 * might not be valid JSON) goes to the adapter's own Python parser through
 * ``sink.fast_special(ts, payload)``, which returns (code, event). So the adapter's
 * parser stays the one definition; this file must only ever agree with it, and
 * tests/test_fastpath.py checks that it does, payload by payload and stream by stream.
 *
 * A body containing '\r' (CRLF-framed SSE) is handed, from that point on, to the
 * recorder's Python framer (``sink.data``); the HTTP framing stays here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#ifndef SO_TIMESTAMPNS
#define SO_TIMESTAMPNS 35
#endif
#ifndef SCM_TIMESTAMPNS
#define SCM_TIMESTAMPNS SO_TIMESTAMPNS
#endif

#define READ_SIZE 65536
/* Reads happen on the event loop's thread with the GIL held: one buffer serves all. */
static char read_buf[READ_SIZE];

static inline int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------- */
/* growable byte buffer                                                               */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} bbuf;

static int bbuf_add(bbuf *b, const char *s, Py_ssize_t n) {
    if (n <= 0) return 0;
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        char *p = PyMem_Realloc(b->p, cap);
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static void bbuf_free(bbuf *b) {
    PyMem_Free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---------------------------------------------------------------------------------- */
/* the JSON scan: recognise the regular OpenAI token event, validate it fully           */

enum { SPECIAL = 0, REGULAR = 1 };
enum { KIND_SPECIAL = 0, KIND_CONTENT = 1, KIND_REASONING = 2, KIND_PENDING = 3, KIND_DROPPED = 4 };
/* Unrecognised payloads wait (as bytes) for the parser until a token event needs its
 * verdict, the record is built, or this many wait: the final events of a response are
 * then parsed when its record is built, not in the read that freed its closed-loop slot. */
#define MAX_PENDING 32
enum { API_COMPLETIONS = 1, API_CHAT = 2, API_TGI = 3, API_SGLANG = 4 };
/* SGLang's per-request timings in meta_info (adapters/sglang.py TIMING_KEYS, in that order) */
#define N_TIMING 8
static const char *const TIMING_KEYS[N_TIMING] = {"queue_time", "prefill_launch_delay", "prefill_launch_latency",
                                                  "prefill_waiting_latency", "forward_entry_time",
                                                  "prefill_finished_time", "first_token_latency", "kv_transfer_time"};
#define MAX_DEPTH 128

typedef struct {
    const unsigned char *s;
    Py_ssize_t i, n;
} scan_t;

typedef struct {
    double v[N_TIMING];
    int mask; /* which of TIMING_KEYS hold a number */
} timing_t;

typedef struct {
    int kind;
    int64_t cum, prompt, cached; /* -1: absent or null */
    Py_ssize_t id_start, id_len; /* id_len -1: absent or null */
    /* SGLang only: the (cumulative or delta) text, the number of output_ids (-1: none the
     * parser counts), the timings (has_timing: the parser's _timings gives a dict) */
    Py_ssize_t text_start, text_len;
    int text_esc, has_timing;
    int64_t n_ids;
    timing_t timing;
} regular_t;

static inline void ws(scan_t *sc) {
    while (sc->i < sc->n) {
        unsigned char c = sc->s[sc->i];
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t')
            sc->i++;
        else
            break;
    }
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A JSON string at sc->i (the opening quote). Returns 0 when valid (UTF-8, escapes,
 * no control characters) and gives the span between the quotes and whether it has
 * escapes; -1 when invalid (a lone \u surrogate escape included, as orjson refuses it). */
static int scan_string(scan_t *sc, Py_ssize_t *start, Py_ssize_t *len, int *esc) {
    const unsigned char *s = sc->s;
    Py_ssize_t i = sc->i, n = sc->n;
    if (i >= n || s[i] != '"') return -1;
    i++;
    Py_ssize_t b = i;
    int e = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == '"') {
            *start = b;
            *len = i - b;
            *esc = e;
            sc->i = i + 1;
            return 0;
        }
        if (c == '\\') {
            e = 1;
            if (i + 1 >= n) return -1;
            unsigned char d = s[i + 1];
            if (d == 'u') {
                if (i + 5 >= n) return -1;
                int v = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hexval(s[i + k]);
                    if (h < 0) return -1;
                    v = v * 16 + h;
                }
                if (v >= 0xDC00 && v <= 0xDFFF) return -1; /* a low surrogate first */
                if (v >= 0xD800 && v <= 0xDBFF) {          /* must pair with a low one */
                    if (i + 11 >= n || s[i + 6] != '\\' || s[i + 7] != 'u') return -1;
                    int w = 0;
                    for (int k = 8; k < 12; k++) {
                        int h = hexval(s[i + k]);
                        if (h < 0) return -1;
                        w = w * 16 + h;
                    }
                    if (w < 0xDC00 || w > 0xDFFF) return -1;
                    i += 12;
                    continue;
                }
                i += 6;
                continue;
            }
            if (d == '"' || d == '\\' || d == '/' || d == 'b' || d == 'f' || d == 'n' || d == 'r' || d == 't') {
                i += 2;
                continue;
            }
            return -1;
        }
        if (c < 0x20) return -1;
        if (c < 0x80) {
            i++;
            continue;
        }
        /* UTF-8: no overlongs, no surrogates, nothing above U+10FFFF */
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return -1;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return -1;
            unsigned char c1 = s[i + 1], c2 = s[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80) return -1;
            if (c == 0xE0 && c1 < 0xA0) return -1;
            if (c == 0xED && c1 >= 0xA0) return -1;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return -1;
            unsigned char c1 = s[i + 1], c2 = s[i + 2], c3 = s[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80) return -1;
            if (c == 0xF0 && c1 < 0x90) return -1;
            if (c == 0xF4 && c1 >= 0x90) return -1;
            i += 4;
        } else {
            return -1;
        }
    }
    return -1;
}

/* A JSON number. Returns 0 when valid; *plain is set for a non-negative integer
 * without fraction or exponent that fits comfortably in int64 (its value in *value).
 * Numbers that might overflow a double return -1 (Python decides). */
static int scan_number(scan_t *sc, int *plain, int64_t *value) {
    const unsigned char *s = sc->s;
    Py_ssize_t i = sc->i, n = sc->n, digits_at;
    int neg = 0, frac = 0;
    if (i < n && s[i] == '-') {
        neg = 1;
        i++;
    }
    digits_at = i;
    if (i >= n) return -1;
    if (s[i] == '0') {
        i++;
    } else if (s[i] >= '1' && s[i] <= '9') {
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    } else {
        return -1;
    }
    Py_ssize_t int_end = i;
    if (i < n && s[i] == '.') {
        frac = 1;
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return -1;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    int expo = 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        /* valid unless it overflows a double (orjson refuses infinities): with at most
         * 300 characters, only a large positive exponent can */
        int eneg = 0;
        long e = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) eneg = s[i++] == '-';
        if (i >= n || s[i] < '0' || s[i] > '9') return -1;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (e < 100000) e = e * 10 + (s[i] - '0');
            i++;
        }
        if (!eneg && (int_end - digits_at) + e > 300) return -1;
        expo = 1;
    }
    if (i - sc->i > 300) return -1;
    *plain = 0;
    if (!neg && !frac && !expo && int_end - digits_at <= 18) {
        int64_t v = 0;
        for (Py_ssize_t k = digits_at; k < int_end; k++) v = v * 10 + (s[k] - '0');
        *plain = 1;
        *value = v;
    }
    sc->i = i;
    return 0;
}

static int scan_value(scan_t *sc, int depth);

/* After a member or element: 1 when a ',' follows (another one comes), 0 when ``close``
 * ends the container, -1 otherwise (invalid). */
static inline int next_item(scan_t *sc, unsigned char close) {
    ws(sc);
    if (sc->i >= sc->n) return -1;
    if (sc->s[sc->i] == ',') {
        sc->i++;
        return 1;
    }
    if (sc->s[sc->i] == close) {
        sc->i++;
        return 0;
    }
    return -1;
}

static int scan_literal(scan_t *sc, const char *lit, Py_ssize_t len) {
    if (sc->n - sc->i < len || memcmp(sc->s + sc->i, lit, len) != 0) return -1;
    sc->i += len;
    return 0;
}

/* Any JSON value (validated, contents ignored). */
static int scan_value(scan_t *sc, int depth) {
    if (depth > MAX_DEPTH) return -1;
    ws(sc);
    if (sc->i >= sc->n) return -1;
    unsigned char c = sc->s[sc->i];
    Py_ssize_t st, ln;
    int esc, plain;
    int64_t v;
    switch (c) {
    case '"':
        return scan_string(sc, &st, &ln, &esc);
    case '{':
        sc->i++;
        ws(sc);
        if (sc->i < sc->n && sc->s[sc->i] == '}') {
            sc->i++;
            return 0;
        }
        for (;;) {
            ws(sc);
            if (scan_string(sc, &st, &ln, &esc) < 0) return -1;
            ws(sc);
            if (sc->i >= sc->n || sc->s[sc->i] != ':') return -1;
            sc->i++;
            if (scan_value(sc, depth + 1) < 0) return -1;
            int more = next_item(sc, '}');
            if (more <= 0) return more;
        }
    case '[':
        sc->i++;
        ws(sc);
        if (sc->i < sc->n && sc->s[sc->i] == ']') {
            sc->i++;
            return 0;
        }
        for (;;) {
            if (scan_value(sc, depth + 1) < 0) return -1;
            int more = next_item(sc, ']');
            if (more <= 0) return more;
        }
    case 't':
        return scan_literal(sc, "true", 4);
    case 'f':
        return scan_literal(sc, "false", 5);
    case 'n':
        return scan_literal(sc, "null", 4);
    default:
        return scan_number(sc, &plain, &v);
    }
}

static inline int key_is(scan_t *sc, Py_ssize_t st, Py_ssize_t ln, const char *k, Py_ssize_t kl) {
    return ln == kl && memcmp(sc->s + st, k, kl) == 0;
}

static inline int at(scan_t *sc, unsigned char c) {
    ws(sc);
    return sc->i < sc->n && sc->s[sc->i] == c;
}

static inline int is_null(scan_t *sc) {
    ws(sc);
    if (sc->n - sc->i >= 4 && memcmp(sc->s + sc->i, "null", 4) == 0) {
        sc->i += 4;
        return 1;
    }
    return 0;
}

/* Iterates an object's members: ``body`` sees the key span (escape-free) and must
 * consume the value or return SPECIAL (-1 invalid is also SPECIAL). */
#define OBJECT_MEMBERS(sc, KST, KLN, ...)                                        \
    do {                                                                         \
        if (!at(sc, '{')) return SPECIAL;                                        \
        (sc)->i++;                                                               \
        if (at(sc, '}')) {                                                       \
            (sc)->i++;                                                           \
            break;                                                               \
        }                                                                        \
        for (;;) {                                                               \
            Py_ssize_t KST, KLN;                                                 \
            int kesc_;                                                           \
            ws(sc);                                                              \
            if (scan_string(sc, &KST, &KLN, &kesc_) < 0 || kesc_) return SPECIAL; \
            if (!at(sc, ':')) return SPECIAL;                                    \
            (sc)->i++;                                                           \
            ws(sc);                                                              \
            __VA_ARGS__                                                          \
            int more_ = next_item(sc, '}');                                      \
            if (more_ < 0) return SPECIAL;                                       \
            if (!more_) break;                                                   \
        }                                                                        \
    } while (0)

#define GENERIC_VALUE(sc, depth) \
    if (scan_value(sc, depth) < 0) return SPECIAL;

/* an optional non-negative integer: null -> -1 */
static int opt_int(scan_t *sc, int64_t *out) {
    if (is_null(sc)) {
        *out = -1;
        return 0;
    }
    int plain = 0;
    int64_t v = 0;
    if (!(sc->i < sc->n && (sc->s[sc->i] == '-' || (sc->s[sc->i] >= '0' && sc->s[sc->i] <= '9')))) return -1;
    if (scan_number(sc, &plain, &v) < 0 || !plain) return -1;
    *out = v;
    return 0;
}

/* a string that Python would see as: 0 absent/null/"", 1 non-empty string; -1 other */
static int text_value(scan_t *sc) {
    if (is_null(sc)) return 0;
    Py_ssize_t st, ln;
    int esc;
    if (!at(sc, '"')) return -1;
    if (scan_string(sc, &st, &ln, &esc) < 0) return -1;
    return ln > 0;
}

static int scan_details(scan_t *sc, regular_t *r) {
    int seen_cached = 0;
    OBJECT_MEMBERS(sc, kst, kln, {
        if (key_is(sc, kst, kln, "cached_tokens", 13)) {
            if (seen_cached++ || opt_int(sc, &r->cached) < 0) return SPECIAL;
        } else {
            GENERIC_VALUE(sc, 3)
        }
    });
    return REGULAR;
}

static int scan_usage(scan_t *sc, regular_t *r) {
    int seen_c = 0, seen_p = 0, seen_d = 0, members = 0;
    OBJECT_MEMBERS(sc, kst, kln, {
        members++;
        if (key_is(sc, kst, kln, "completion_tokens", 17)) {
            if (seen_c++ || opt_int(sc, &r->cum) < 0 || r->cum < 0) return SPECIAL;
        } else if (key_is(sc, kst, kln, "prompt_tokens", 13)) {
            if (seen_p++ || opt_int(sc, &r->prompt) < 0) return SPECIAL;
        } else if (key_is(sc, kst, kln, "prompt_tokens_details", 21)) {
            if (seen_d++) return SPECIAL;
            if (!is_null(sc) && scan_details(sc, r) != REGULAR) return SPECIAL;
        } else {
            GENERIC_VALUE(sc, 2)
        }
    });
    return (members && seen_c) ? REGULAR : SPECIAL;
}

static int scan_delta(scan_t *sc, regular_t *r) {
    int content = 0, reasoning_content = 0, reasoning = 0;
    int seen_c = 0, seen_rc = 0, seen_r = 0, seen_t = 0;
    OBJECT_MEMBERS(sc, kst, kln, {
        if (key_is(sc, kst, kln, "content", 7)) {
            if (seen_c++ || (content = text_value(sc)) < 0) return SPECIAL;
        } else if (key_is(sc, kst, kln, "reasoning_content", 17)) {
            if (seen_rc++ || (reasoning_content = text_value(sc)) < 0) return SPECIAL;
        } else if (key_is(sc, kst, kln, "reasoning", 9)) {
            if (seen_r++ || (reasoning = text_value(sc)) < 0) return SPECIAL;
        } else if (key_is(sc, kst, kln, "tool_calls", 10)) {
            if (seen_t++ || !is_null(sc)) return SPECIAL;
        } else {
            GENERIC_VALUE(sc, 4)
        }
    });
    if (content)
        r->kind = KIND_CONTENT;
    else if (reasoning_content || reasoning)
        r->kind = KIND_REASONING;
    else
        return SPECIAL; /* role-only, empty or tool-call deltas: the parser decides */
    return REGULAR;
}

static int scan_choice(scan_t *sc, regular_t *r, int api) {
    int seen_text = 0, seen_finish = 0, seen_delta = 0, text = 0;
    OBJECT_MEMBERS(sc, kst, kln, {
        if (key_is(sc, kst, kln, "finish_reason", 13)) {
            if (seen_finish++ || !is_null(sc)) return SPECIAL;
        } else if (api == API_COMPLETIONS && key_is(sc, kst, kln, "text", 4)) {
            if (seen_text++ || (text = text_value(sc)) < 0) return SPECIAL;
        } else if (api == API_CHAT && key_is(sc, kst, kln, "delta", 5)) {
            if (seen_delta++ || scan_delta(sc, r) != REGULAR) return SPECIAL;
        } else {
            GENERIC_VALUE(sc, 3)
        }
    });
    if (api == API_COMPLETIONS) {
        if (!text) return SPECIAL;
        r->kind = KIND_CONTENT;
        return REGULAR;
    }
    return seen_delta ? REGULAR : SPECIAL;
}

static int scan_choices(scan_t *sc, regular_t *r, int api) {
    if (!at(sc, '[')) return SPECIAL;
    sc->i++;
    if (at(sc, ']')) return SPECIAL; /* no choices: a usage-only or empty event */
    if (scan_choice(sc, r, api) != REGULAR) return SPECIAL;
    for (;;) {
        int more = next_item(sc, ']');
        if (more < 0) return SPECIAL;
        if (!more) return REGULAR;
        if (scan_value(sc, 2) < 0) return SPECIAL;
    }
}

/* TGI's /generate_stream token event (adapters/tgi.py): an object whose ``token`` is an
 * object, without ``error``, with ``generated_text`` and ``details`` absent or null (the
 * final event has them: the parser reads it). Each such event is one token of text. */
static int classify_tgi(const char *p, Py_ssize_t n, regular_t *r) {
    scan_t sc = {(const unsigned char *)p, 0, n};
    int seen_token = 0, seen_gen = 0, seen_details = 0; /* (``r`` was reset by classify) */
    OBJECT_MEMBERS(&sc, kst, kln, {
        if (key_is(&sc, kst, kln, "token", 5)) {
            if (seen_token++ || !at(&sc, '{') || scan_value(&sc, 1) < 0) return SPECIAL;
        } else if (key_is(&sc, kst, kln, "generated_text", 14)) {
            if (seen_gen++ || !is_null(&sc)) return SPECIAL;
        } else if (key_is(&sc, kst, kln, "details", 7)) {
            if (seen_details++ || !is_null(&sc)) return SPECIAL;
        } else if (key_is(&sc, kst, kln, "error", 5)) {
            return SPECIAL;
        } else {
            GENERIC_VALUE(&sc, 1)
        }
    });
    ws(&sc);
    if (sc.i != sc.n || !seen_token) return SPECIAL;
    r->kind = KIND_CONTENT;
    return REGULAR;
}

/* The value of a top-level "object" member: SPECIAL for a second one, or for "error" (the
 * parsers' ``obj.get("object") == "error"``). */
static int object_member(scan_t *sc, int *seen) {
    Py_ssize_t st, ln;
    int esc;
    if ((*seen)++) return SPECIAL;
    if (!at(sc, '"')) return scan_value(sc, 1) < 0 ? SPECIAL : REGULAR;
    if (scan_string(sc, &st, &ln, &esc) < 0 || esc) return SPECIAL;
    return (ln == 5 && memcmp(sc->s + st, "error", 5) == 0) ? SPECIAL : REGULAR;
}

/* A JSON number as a double, as float(orjson.loads(literal)) gives it; -1 when the scan
 * should not decide (not a number, or an integer too long to be sure of orjson's type). */
static int number_value(scan_t *sc, double *out) {
    Py_ssize_t b = sc->i;
    int plain = 0;
    int64_t v = 0;
    if (!(sc->i < sc->n && (sc->s[sc->i] == '-' || (sc->s[sc->i] >= '0' && sc->s[sc->i] <= '9')))) return -1;
    if (scan_number(sc, &plain, &v) < 0) return -1;
    Py_ssize_t len = sc->i - b;
    char tmp[320];
    int integer = 1;
    for (Py_ssize_t k = b; k < sc->i; k++)
        if (sc->s[k] == '.' || sc->s[k] == 'e' || sc->s[k] == 'E') integer = 0;
    if (integer && len > 17) return -1;
    if (integer && !plain && sc->s[b] == '-' && len == 2 && sc->s[b + 1] == '0') { /* -0 is the integer 0 */
        *out = 0.0;
        return 0;
    }
    memcpy(tmp, sc->s + b, len);
    tmp[len] = 0;
    double d = PyOS_string_to_double(tmp, NULL, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *out = d;
    return 0;
}

static int scan_sglang_meta(scan_t *sc, regular_t *r) {
    int seen_c = 0, seen_p = 0, seen_k = 0, seen_id = 0, seen_f = 0, seen_t[N_TIMING] = {0};
    OBJECT_MEMBERS(sc, kst, kln, {
        int t = -1;
        for (int k = 0; k < N_TIMING; k++)
            if (key_is(sc, kst, kln, TIMING_KEYS[k], (Py_ssize_t)strlen(TIMING_KEYS[k]))) t = k;
        if (t >= 0) {
            if (seen_t[t]++) return SPECIAL;
            /* the parser's "queue_time"/"prefill_launch_latency"/"first_token_latency" in meta */
            if (t == 0 || t == 2 || t == 6) r->has_timing = 1;
            if (!is_null(sc)) {
                if (number_value(sc, &r->timing.v[t]) < 0) return SPECIAL; /* strings, booleans: the parser's */
                r->timing.mask |= 1 << t;
            }
        } else if (key_is(sc, kst, kln, "completion_tokens", 17)) {
            if (seen_c++ || is_null(sc) || opt_int(sc, &r->cum) < 0) return SPECIAL;
        } else if (key_is(sc, kst, kln, "prompt_tokens", 13)) {
            if (seen_p++ || opt_int(sc, &r->prompt) < 0) return SPECIAL;
        } else if (key_is(sc, kst, kln, "cached_tokens", 13)) {
            if (seen_k++ || opt_int(sc, &r->cached) < 0) return SPECIAL;
        } else if (key_is(sc, kst, kln, "finish_reason", 13)) {
            if (seen_f++ || !is_null(sc)) return SPECIAL;
        } else if (key_is(sc, kst, kln, "id", 2)) {
            if (seen_id++) return SPECIAL;
            if (!is_null(sc)) {
                int esc;
                if (!at(sc, '"') || scan_string(sc, &r->id_start, &r->id_len, &esc) < 0 || esc) return SPECIAL;
            }
        } else {
            GENERIC_VALUE(sc, 2)
        }
    });
    if (!seen_c) return SPECIAL;
    if (!r->timing.mask) r->has_timing = 0; /* the parser's ``out or None`` */
    return REGULAR;
}

/* The common output_ids array after its '[': integers without sign, fraction, exponent or
 * spaces ("1,22,0]"), counted in one tight pass; -1 for anything else (the general scan
 * then decides). SGLang repeats every id so far on every event: this is most of its bytes. */
static int ids_count(scan_t *sc, int64_t *count) {
    const unsigned char *s = sc->s;
    Py_ssize_t i = sc->i, n = sc->n;
    int64_t c = 0;
    if (i < n && s[i] == ']') {
        sc->i = i + 1;
        *count = 0;
        return 0;
    }
    for (;;) {
        Py_ssize_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d || i - d > 18 || (s[d] == '0' && i - d > 1) || i >= n) return -1;
        c++;
        if (s[i] == ',') {
            i++;
            continue;
        }
        if (s[i] != ']') return -1;
        sc->i = i + 1;
        *count = c;
        return 0;
    }
}

/* SGLang's /generate event (adapters/sglang.py): an object with ``text`` (a string or null),
 * ``meta_info`` with an integer ``completion_tokens`` and no finish reason, optionally
 * ``output_ids`` (numbers only, the very array the parser's _drop_output_ids counts), no error.
 * What the event means (its text delta, whether tokens grew) depends on the stream so far:
 * FastStream decides that (sg_take); this only reads the payload. */
static int classify_sglang(const char *p, Py_ssize_t n, regular_t *r) {
    scan_t sc = {(const unsigned char *)p, 0, n};
    int seen_text = 0, seen_meta = 0, seen_ids = 0, seen_object = 0;
    Py_ssize_t ids_key = -1;
    OBJECT_MEMBERS(&sc, kst, kln, {
        if (key_is(&sc, kst, kln, "text", 4)) {
            if (seen_text++) return SPECIAL;
            if (!is_null(&sc)) {
                if (!at(&sc, '"') || scan_string(&sc, &r->text_start, &r->text_len, &r->text_esc) < 0) return SPECIAL;
            }
        } else if (key_is(&sc, kst, kln, "meta_info", 9)) {
            if (seen_meta++ || scan_sglang_meta(&sc, r) != REGULAR) return SPECIAL;
        } else if (key_is(&sc, kst, kln, "output_ids", 10)) {
            if (seen_ids++ || !at(&sc, '[')) return SPECIAL;
            ids_key = kst - 1;
            if (sc.s[kst + kln + 1] != ':') return SPECIAL; /* the parser finds the key only as "output_ids": */
            sc.i++;
            int64_t count = 0;
            Py_ssize_t ids_at = sc.i;
            if (ids_count(&sc, &count) < 0) { /* not the compact shape: the general scan */
                sc.i = ids_at;
                count = 0;
                if (at(&sc, ']')) {
                    sc.i++;
                } else {
                    for (;;) {
                        int plain;
                        int64_t v;
                        ws(&sc);
                        if (!(sc.i < sc.n && (sc.s[sc.i] == '-' || (sc.s[sc.i] >= '0' && sc.s[sc.i] <= '9'))) ||
                            scan_number(&sc, &plain, &v) < 0)
                            return SPECIAL;
                        count++;
                        int more = next_item(&sc, ']');
                        if (more < 0) return SPECIAL;
                        if (!more) break;
                    }
                }
            }
            r->n_ids = count;
        } else if (key_is(&sc, kst, kln, "object", 6)) {
            if (object_member(&sc, &seen_object) != REGULAR) return SPECIAL;
        } else if (key_is(&sc, kst, kln, "error", 5)) {
            return SPECIAL;
        } else {
            GENERIC_VALUE(&sc, 1)
        }
    });
    ws(&sc);
    if (sc.i != sc.n || !seen_meta) return SPECIAL;
    /* the parser counts the first "output_ids": in the payload, wherever it is */
    const char *found = NULL;
    for (Py_ssize_t k = 0; k + 13 <= n; k++) {
        const char *q = memchr(p + k, '"', n - k - 12);
        if (!q) break;
        if (memcmp(q, "\"output_ids\":", 13) == 0) {
            found = q;
            break;
        }
        k = q - p;
    }
    if (found ? found - p != ids_key : ids_key >= 0) return SPECIAL;
    r->kind = KIND_CONTENT;
    return REGULAR;
}

static int classify(const char *p, Py_ssize_t n, int api, regular_t *r) {
    r->kind = KIND_SPECIAL;
    r->cum = r->prompt = r->cached = -1;
    r->id_start = 0;
    r->id_len = -1;
    r->text_start = r->text_len = 0;
    r->text_esc = r->has_timing = 0;
    r->n_ids = -1;
    r->timing.mask = 0;
    if (api == API_TGI) return classify_tgi(p, n, r);
    if (api == API_SGLANG) return classify_sglang(p, n, r);
    scan_t sc = {(const unsigned char *)p, 0, n};
    int seen_choices = 0, seen_usage = 0, seen_id = 0, seen_object = 0;
    OBJECT_MEMBERS(&sc, kst, kln, {
        if (key_is(&sc, kst, kln, "choices", 7)) {
            if (seen_choices++ || scan_choices(&sc, r, api) != REGULAR) return SPECIAL;
        } else if (key_is(&sc, kst, kln, "usage", 5)) {
            /* null reads as no usage (the parser's ``if not usage``); an object must be
             * a usage with an integer completion_tokens */
            if (seen_usage++ || (!is_null(&sc) && scan_usage(&sc, r) != REGULAR)) return SPECIAL;
        } else if (key_is(&sc, kst, kln, "id", 2)) {
            if (seen_id++) return SPECIAL;
            if (!is_null(&sc)) {
                int esc;
                if (!at(&sc, '"') || scan_string(&sc, &r->id_start, &r->id_len, &esc) < 0 || esc) return SPECIAL;
            }
        } else if (key_is(&sc, kst, kln, "object", 6)) {
            if (object_member(&sc, &seen_object) != REGULAR) return SPECIAL;
        } else if (key_is(&sc, kst, kln, "error", 5)) {
            return SPECIAL;
        } else {
            GENERIC_VALUE(&sc, 1)
        }
    });
    ws(&sc);
    if (sc.i != sc.n) return SPECIAL; /* trailing bytes: not one JSON value */
    /* without usage (absent or null) it is a plain token event: r->cum stays -1 */
    if (!seen_choices) return SPECIAL;
    return REGULAR;
}

/* ---------------------------------------------------------------------------------- */
/* FastStream                                                                          */

typedef struct {
    int64_t ts, cum, prompt, cached;
    PyObject *obj; /* special: the parser's event; pending: the payload (bytes); regular: its id (str) or NULL */
    int kind;
    int timing; /* SGLang: index into FastStream.timings, -1: none */
} ev_t;

enum { H_SIZE, H_DATA, H_CRLF, H_TRAILER, H_DONE };
enum { END_COMPLETE = 0, END_EOF = 1, END_OSERROR = 2, END_PROTOCOL = 3, END_CLIENT = 4, END_TOO_LONG = 5 };

typedef struct {
    PyObject_HEAD int fd;
    int kernel_clock;
    int api;
    long long offset_ns;
    long long last_read_ns;
    long long last_data_ns;
    long long last_payload_ns;
    long long fallback_reads;
    long long reads;
    Py_ssize_t max_event; /* longest SSE event (or line) kept before the request fails */
    PyObject *sink;
    PyObject *on_end;
    int hstate;
    long long remaining;
    bbuf line;    /* a partial chunk-size or trailer line */
    bbuf pending; /* SSE bytes after the last complete event */
    bbuf pyout;   /* bytes for the Python framer (after a hand-over), per read */
    bbuf joined;  /* a multi-line data field, joined */
    int handed_over;
    int cumulative_ok; /* usage still reads as a cumulative count (the parser's fast_ok) */
    long long scanned; /* payloads the scan took itself (token events, [DONE]) */
    int stopped;
    int done;
    Py_ssize_t done_at; /* events before the [DONE] marker */
    long long after_done; /* payloads after the [DONE] marker: dropped, a protocol anomaly */
    Py_ssize_t npending, first_pending;
    int id_found;
    int ended;
    ev_t *ev;
    Py_ssize_t nev, cap;
    /* SGLang: the parser's state as the scan keeps it while it takes events (sg_take) */
    int sg_mode;       /* -1 undecided, 0 cumulative text, 1 text deltas, -2 the scan takes none */
    int sg_follows;    /* the text follows output_ids (SGLang >= 0.5.10) */
    int sg_stale;      /* the parser read a payload since: fetch its state before taking one */
    int sg_dirty;      /* the scan took events since: give the parser its state before it reads one */
    int64_t sg_tokens; /* the highest completion_tokens so far */
    bbuf sg_text;      /* the text so far (UTF-8), in modes -1 and 0 */
    bbuf sg_scratch;   /* an escaped text, decoded */
    timing_t *timings; /* the distinct timings of the events taken, in order */
    Py_ssize_t ntimings, tcap;
} FastStream;


/* ---------------------------------------------------------------------------------- */
/* SGLang: the stream state the parser (adapters/sglang.py SGLangStreamParser) keeps     */

static int put_utf8(bbuf *b, uint32_t cp) {
    char u[4];
    int k;
    if (cp < 0x80) {
        u[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    return bbuf_add(b, u, k);
}

static uint32_t hex4(const char *s) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) v = v * 16 + (uint32_t)hexval((unsigned char)s[k]);
    return v;
}

/* The UTF-8 of a JSON string's contents that scan_string validated. */
static int json_unescape(const char *s, Py_ssize_t n, bbuf *out) {
    out->len = 0;
    Py_ssize_t i = 0;
    while (i < n) {
        const char *bs = memchr(s + i, '\\', n - i);
        Py_ssize_t e = bs ? bs - s : n;
        if (bbuf_add(out, s + i, e - i) < 0) return -1;
        if (!bs) break;
        char d = s[e + 1], c;
        i = e + 2;
        switch (d) {
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
            uint32_t cp = hex4(s + i);
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* validated: a low surrogate follows */
                cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(s + i + 2) - 0xDC00);
                i += 6;
            }
            if (put_utf8(out, cp) < 0) return -1;
            continue;
        }
        default: c = d; /* " \ / */
        }
        if (bbuf_add(out, &c, 1) < 0) return -1;
    }
    return 0;
}

/* The parser's state, fetched (sink.fast_state() -> (mode, follows, tokens, text)). */
static int sg_fetch(FastStream *self) {
    self->sg_stale = 0;
    self->sg_mode = -2;
    if (!self->sink) return 0;
    PyObject *st = PyObject_CallMethod(self->sink, "fast_state", NULL);
    if (!st) return -1;
    long mode, follows;
    long long tokens;
    const char *text;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(st, "llLy#", &mode, &follows, &tokens, &text, &len)) {
        Py_DECREF(st);
        PyErr_Clear(); /* a state the scan cannot hold (a float count, say): the parser reads all */
        return 0;
    }
    self->sg_text.len = 0;
    int r = bbuf_add(&self->sg_text, text, len);
    Py_DECREF(st);
    if (r < 0) return -1;
    if (mode < -1 || mode > 1 || tokens < 0) return 0;
    self->sg_mode = (int)mode;
    self->sg_follows = follows != 0;
    self->sg_tokens = tokens;
    return 0;
}

/* The scan's state, given to the parser before it reads a payload
 * (sink.fast_sync(mode, tokens, text or None)). */
static int sg_sync(FastStream *self, PyObject *sink) {
    if (!self->sg_dirty) return 0;
    self->sg_dirty = 0;
    PyObject *text;
    if (self->sg_mode == 1) {
        text = Py_None;
        Py_INCREF(text);
    } else {
        text = PyBytes_FromStringAndSize(self->sg_text.p ? self->sg_text.p : "", self->sg_text.len);
        if (!text) return -1;
    }
    PyObject *r = PyObject_CallMethod(sink, "fast_sync", "iLN", self->sg_mode, (long long)self->sg_tokens, text);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* Whether the scan takes this SGLang event (1), as the parser would read it: a content
 * event (its tokens grew or its text delta is not empty). It then holds the parser's
 * state after it. 0: the parser reads it (an empty event, or the state is unknown). */
static int sg_take(FastStream *self, regular_t *r, const char *p) {
    if (self->sg_stale && sg_fetch(self) < 0) return -1;
    if (self->sg_mode == -2) return 0;
    const char *t = p + r->text_start;
    Py_ssize_t tl = r->text_len;
    if (r->text_esc) {
        if (json_unescape(t, tl, &self->sg_scratch) < 0) return -1;
        t = self->sg_scratch.p ? self->sg_scratch.p : "";
        tl = self->sg_scratch.len;
    }
    int mode = self->sg_mode;
    if (mode == -1 && r->n_ids >= 0 && r->cum > 0) { /* _incremental_mode */
        if (r->n_ids < r->cum)
            mode = self->sg_follows;
        else if (self->sg_tokens > 0)
            mode = 0;
    }
    Py_ssize_t prev = self->sg_text.len;
    int prefix = mode != 1 && tl >= prev && (prev == 0 || memcmp(t, self->sg_text.p, prev) == 0);
    int delta = prefix ? tl > prev : tl > 0;
    if (!(r->cum > self->sg_tokens || delta)) return 0;
    if (mode != 1 && bbuf_add(&self->sg_text, prefix ? t + prev : t, prefix ? tl - prev : tl) < 0) return -1;
    self->sg_mode = mode;
    if (r->cum > self->sg_tokens) self->sg_tokens = r->cum;
    self->sg_dirty = 1;
    return 1;
}

/* The index of the event's timings in self->timings (the last one again when equal). */
static int sg_timing(FastStream *self, regular_t *r) {
    if (!r->has_timing) return -1;
    timing_t *last = self->ntimings ? &self->timings[self->ntimings - 1] : NULL;
    if (last && last->mask == r->timing.mask) {
        int same = 1;
        for (int k = 0; k < N_TIMING; k++)
            if ((last->mask >> k & 1) && last->v[k] != r->timing.v[k]) same = 0;
        if (same) return (int)(self->ntimings - 1);
    }
    if (self->ntimings == self->tcap) {
        Py_ssize_t cap = self->tcap ? self->tcap * 2 : 4;
        timing_t *q = PyMem_Realloc(self->timings, cap * sizeof(timing_t));
        if (!q) {
            PyErr_NoMemory();
            return -2;
        }
        self->timings = q;
        self->tcap = cap;
    }
    self->timings[self->ntimings] = r->timing;
    return (int)self->ntimings++;
}

static int fs_push(FastStream *self, ev_t *e) {
    if (self->nev == self->cap) {
        Py_ssize_t cap = self->cap ? self->cap * 2 : 64;
        ev_t *p = PyMem_Realloc(self->ev, cap * sizeof(ev_t));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        self->ev = p;
        self->cap = cap;
    }
    self->ev[self->nev++] = *e;
    self->last_payload_ns = e->ts; /* every event is an SSE data payload (comments are none) */
    return 0;
}

/* The parser's verdict on one payload, stored in ``slot`` (its event, or dropped). */
static int fs_parse(FastStream *self, PyObject *sink, ev_t *slot, const char *p, Py_ssize_t n) {
    slot->kind = KIND_DROPPED;
    slot->obj = NULL;
    if (self->api == API_SGLANG) {
        if (sg_sync(self, sink) < 0) return -1;
        self->sg_stale = 1;
    }
    PyObject *res = PyObject_CallMethod(sink, "fast_special", "Ly#", (long long)slot->ts, p, n);
    if (!res) return -1;
    if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_TypeError, "fast_special must return (code, event)");
        return -1;
    }
    long code = PyLong_AsLong(PyTuple_GET_ITEM(res, 0));
    PyObject *event = PyTuple_GET_ITEM(res, 1);
    if (code == -1 && PyErr_Occurred()) {
        Py_DECREF(res);
        return -1;
    }
    if (event != Py_None) {
        if (!self->id_found) {
            /* the first id the record keeps is the first one set, in event order */
            PyObject *sid = PySequence_GetItem(event, 8);
            if (!sid) {
                Py_DECREF(res);
                return -1;
            }
            self->id_found = sid != Py_None;
            Py_DECREF(sid);
        }
        Py_INCREF(event);
        slot->obj = event;
        slot->kind = KIND_SPECIAL;
    }
    Py_DECREF(res);
    if (code == 1) self->cumulative_ok = 0;
    if (code == 2) self->stopped = 1;
    return 0;
}

/* Parses the waiting payloads, in order (after a failure the rest are dropped, as the
 * Python path ignores what follows an error). */
static int fs_flush(FastStream *self, PyObject *sink) {
    if (!self->npending) return 0;
    for (Py_ssize_t i = self->first_pending; i < self->nev; i++) {
        ev_t *e = &self->ev[i];
        if (e->kind != KIND_PENDING) continue;
        PyObject *payload = e->obj;
        e->obj = NULL;
        e->kind = KIND_DROPPED;
        if (!self->stopped) {
            int r = fs_parse(self, sink, e, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload));
            if (r < 0) {
                Py_DECREF(payload);
                for (Py_ssize_t j = i + 1; j < self->nev; j++) {
                    if (self->ev[j].kind == KIND_PENDING) {
                        Py_CLEAR(self->ev[j].obj);
                        self->ev[j].kind = KIND_DROPPED;
                    }
                }
                self->npending = 0;
                return -1;
            }
            if (self->stopped && self->done_at > i) self->done = 0; /* [DONE] after the failure */
        }
        Py_DECREF(payload);
    }
    self->npending = 0;
    return 0;
}

/* one SSE data payload */
static int fs_payload(FastStream *self, int64_t ts, const char *p, Py_ssize_t n) {
    if (self->stopped) return 0;
    if (self->done) { /* the stream said it ended: what follows is never counted */
        self->after_done++;
        return 0;
    }
    if (self->api != API_TGI && n == 6 && memcmp(p, "[DONE]", 6) == 0) { /* (TGI has no marker) */
        self->done = 1;
        self->done_at = self->nev;
        self->scanned++;
        return 0;
    }
    if (self->npending) {
        /* what a token event means may depend on the payloads before it */
        if (!self->sink) return 0; /* closed meanwhile */
        if (fs_flush(self, self->sink) < 0) return -1;
        if (self->stopped) return 0;
    }
    regular_t r;
    /* A token event with usage is the scan's while usage is cumulative; one without
     * usage once the parser has seen one (the first goes to the parser, whose state it
     * changes: usage is then a final count, and the parser says so, fast_ok false). */
    int take = classify(p, n, self->api, &r) == REGULAR;
    if (take && self->api == API_SGLANG) {
        take = sg_take(self, &r, p);
        if (take < 0) return -1;
    } else if (take && self->api != API_TGI) {
        take = (r.cum >= 0) == (self->cumulative_ok != 0);
    }
    if (take) {
        ev_t e = {ts, r.cum, r.prompt, r.cached, NULL, r.kind, -1};
        if (self->api == API_SGLANG && (e.timing = sg_timing(self, &r)) == -2) return -1;
        if (!self->id_found && r.id_len >= 0) {
            e.obj = PyUnicode_DecodeUTF8(p + r.id_start, r.id_len, "strict");
            if (!e.obj) return -1;
            self->id_found = 1;
        }
        if (fs_push(self, &e) < 0) {
            Py_XDECREF(e.obj);
            return -1;
        }
        self->scanned++;
        return 0;
    }
    /* not a token event the scan may take: the parser reads it later, off the read path */
    ev_t e = {ts, -1, -1, -1, PyBytes_FromStringAndSize(p, n), KIND_PENDING, -1};
    if (!e.obj) return -1;
    if (fs_push(self, &e) < 0) {
        Py_DECREF(e.obj);
        return -1;
    }
    if (!self->npending++) self->first_pending = self->nev - 1;
    if (self->npending >= MAX_PENDING && self->sink) return fs_flush(self, self->sink);
    return 0;
}

static int fs_end(FastStream *self, int code, PyObject *message, int keep_alive);

/* one SSE block (the bytes between two blank lines), as adapters/sse.py reads it */
static int fs_block(FastStream *self, int64_t ts, const char *b, Py_ssize_t n) {
    if (n == 0) return 0;
    if (n >= 5 && memcmp(b, "data:", 5) == 0 && !memchr(b, '\n', n)) {
        const char *p = b + 5;
        Py_ssize_t m = n - 5;
        if (m && *p == ' ') {
            p++;
            m--;
        }
        return fs_payload(self, ts, p, m);
    }
    self->joined.len = 0;
    int lines = 0;
    Py_ssize_t i = 0;
    while (i <= n) {
        const char *nl = i < n ? memchr(b + i, '\n', n - i) : NULL;
        Py_ssize_t e = nl ? nl - b : n;
        if (e - i >= 5 && memcmp(b + i, "data:", 5) == 0) {
            Py_ssize_t s = i + 5;
            if (s < e && b[s] == ' ') s++;
            if (lines++ && bbuf_add(&self->joined, "\n", 1) < 0) return -1;
            if (bbuf_add(&self->joined, b + s, e - s) < 0) return -1;
        }
        if (!nl) break;
        i = e + 1;
    }
    if (!lines) return 0;
    return fs_payload(self, ts, self->joined.p ? self->joined.p : "", self->joined.len);
}

/* SSE bytes of the body (no '\r' in them) */
static int fs_sse(FastStream *self, int64_t ts, const char *p, Py_ssize_t n) {
    const char *buf = p;
    Py_ssize_t len = n;
    if (self->pending.len) {
        if (bbuf_add(&self->pending, p, n) < 0) return -1;
        buf = self->pending.p;
        len = self->pending.len;
    }
    Py_ssize_t start = 0;
    for (;;) {
        const char *hit = NULL;
        Py_ssize_t k = start;
        while (k + 1 < len) {
            const char *nl = memchr(buf + k, '\n', len - k - 1);
            if (!nl) break;
            if (nl[1] == '\n') {
                hit = nl;
                break;
            }
            k = nl - buf + 1;
        }
        if (!hit) break;
        Py_ssize_t end = hit - buf;
        if (fs_block(self, ts, buf + start, end - start) < 0) return -1;
        start = end + 2;
        if (self->stopped) {
            start = len;
            break;
        }
    }
    if (buf == self->pending.p) {
        memmove(self->pending.p, self->pending.p + start, len - start);
        self->pending.len = len - start;
    } else if (start < len) {
        if (bbuf_add(&self->pending, buf + start, len - start) < 0) return -1;
    }
    if (self->pending.len > self->max_event) {
        /* an event that never ends: fail now, memory bounded (the recorder's framer does the same) */
        self->stopped = 1;
        self->pending.len = 0;
        PyObject *msg = PyUnicode_FromFormat("an SSE event or line longer than %zd bytes", self->max_event);
        if (!msg) return -1;
        int r = fs_end(self, END_TOO_LONG, msg, 0);
        Py_DECREF(msg);
        return r;
    }
    return 0;
}

/* de-chunked body bytes */
static int fs_body(FastStream *self, int64_t ts, const char *p, Py_ssize_t n) {
    if (n <= 0 || self->stopped) return 0;
    self->last_data_ns = ts;
    if (!self->handed_over && memchr(p, '\r', n)) {
        /* CRLF-framed events: the Python framer takes over from the last complete event */
        self->handed_over = 1;
        if (bbuf_add(&self->pyout, self->pending.p, self->pending.len) < 0) return -1;
        self->pending.len = 0;
    }
    if (self->handed_over) return bbuf_add(&self->pyout, p, n);
    return fs_sse(self, ts, p, n);
}

static int fs_flush_py(FastStream *self, int64_t ts) {
    if (!self->pyout.len) return 0;
    if (!self->sink) { /* closed meanwhile */
        self->pyout.len = 0;
        return 0;
    }
    PyObject *r = PyObject_CallMethod(self->sink, "data", "Ly#", (long long)ts, self->pyout.p, self->pyout.len);
    self->pyout.len = 0;
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

static void fs_release(FastStream *self) {
    self->ended = 1;
    Py_CLEAR(self->sink);
    Py_CLEAR(self->on_end);
}

static int fs_end(FastStream *self, int code, PyObject *message, int keep_alive) {
    PyObject *cb = self->on_end;
    if (self->ended || !cb) return 0;
    Py_INCREF(cb);
    fs_release(self);
    PyObject *r = PyObject_CallFunction(cb, "iOO", code, message ? message : Py_None, keep_alive ? Py_True : Py_False);
    Py_DECREF(cb);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

static int parse_size(const char *s, Py_ssize_t n, long long *size) {
    const char *semi = memchr(s, ';', n);
    Py_ssize_t m = semi ? semi - s : n;
    if (m >= 1 && m <= 15) {
        long long v = 0;
        Py_ssize_t k;
        for (k = 0; k < m; k++) {
            int h = hexval((unsigned char)s[k]);
            if (h < 0) break;
            v = v * 16 + h;
        }
        if (k == m) {
            *size = v;
            return 0;
        }
    }
    /* what int(line, 16) accepts (spaces, 0x, underscores) or refuses */
    PyObject *b = PyBytes_FromStringAndSize(s, m);
    if (!b) return -1;
    PyObject *v = PyObject_CallFunction((PyObject *)&PyLong_Type, "Oi", b, 16);
    Py_DECREF(b);
    if (!v) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) return -1;
        PyErr_Clear();
        return 1;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 1;
    }
    if (x < 0) return 1;
    *size = x;
    return 0;
}

static int fs_protocol_error(FastStream *self, const char *line, Py_ssize_t n) {
    PyObject *b = PyBytes_FromStringAndSize(line, n > 40 ? 40 : n);
    if (!b) return -1;
    PyObject *msg = PyUnicode_FromFormat("bad chunk size line %R", b);
    Py_DECREF(b);
    if (!msg) return -1;
    int r = fs_end(self, END_PROTOCOL, msg, 0);
    Py_DECREF(msg);
    return r;
}

/* one read's bytes: HTTP chunk framing, then the body */
static int fs_process(FastStream *self, int64_t ts, const char *data, Py_ssize_t n) {
    bbuf joined = {NULL, 0, 0};
    if (self->line.len) {
        if (bbuf_add(&joined, self->line.p, self->line.len) < 0 || bbuf_add(&joined, data, n) < 0) {
            bbuf_free(&joined);
            return -1;
        }
        self->line.len = 0;
        data = joined.p;
        n = joined.len;
    }
    Py_ssize_t pos = 0;
    int rc = 0;
    while (pos < n && self->hstate != H_DONE) {
        if (self->hstate == H_SIZE || self->hstate == H_TRAILER) {
            const char *nl = NULL;
            for (Py_ssize_t k = pos; k + 1 < n; k++) {
                const char *c = memchr(data + k, '\r', n - k - 1);
                if (!c) break;
                if (c[1] == '\n') {
                    nl = c;
                    break;
                }
                k = c - data;
            }
            if (!nl) {
                if (n - pos > 4096) {
                    rc = fs_protocol_error(self, data + pos, n - pos);
                    goto out;
                }
                if (bbuf_add(&self->line, data + pos, n - pos) < 0) rc = -1;
                pos = n;
                break;
            }
            Py_ssize_t e = nl - data;
            if (self->hstate == H_TRAILER) {
                if (e == pos) self->hstate = H_DONE;
                pos = e + 2;
                continue;
            }
            long long size = 0;
            int pr = parse_size(data + pos, e - pos, &size);
            if (pr < 0) {
                rc = -1;
                goto out;
            }
            if (pr > 0) {
                rc = fs_protocol_error(self, data + pos, e - pos);
                goto out;
            }
            pos = e + 2;
            if (size == 0) {
                self->hstate = H_TRAILER;
            } else {
                self->remaining = size;
                self->hstate = H_DATA;
            }
        } else if (self->hstate == H_DATA) {
            Py_ssize_t take = n - pos < self->remaining ? n - pos : (Py_ssize_t)self->remaining;
            if (fs_body(self, ts, data + pos, take) < 0) {
                rc = -1;
                goto out;
            }
            pos += take;
            self->remaining -= take;
            if (!self->remaining) {
                self->remaining = 2;
                self->hstate = H_CRLF;
            }
        } else { /* H_CRLF: the two bytes that close a data chunk */
            Py_ssize_t skip = n - pos < self->remaining ? n - pos : (Py_ssize_t)self->remaining;
            pos += skip;
            self->remaining -= skip;
            if (!self->remaining) self->hstate = H_SIZE;
        }
    }
    if (fs_flush_py(self, ts) < 0) {
        rc = -1;
        goto out;
    }
    if (self->hstate == H_DONE) rc = fs_end(self, END_COMPLETE, NULL, pos >= n);
out:
    bbuf_free(&joined);
    return rc;
}

/* A Python error inside the read (the parser's callback, memory): the request fails
 * now, recorded as a client error, instead of waiting for the stall timeout. */
static PyObject *fs_internal_error(FastStream *self) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *msg = value ? PyObject_Str(value) : NULL;
    PyObject *text = msg ? PyUnicode_FromFormat("%s: %U", type ? ((PyTypeObject *)type)->tp_name : "error", msg) : NULL;
    Py_XDECREF(msg);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (!text) return NULL;
    int r = fs_end(self, END_CLIENT, text, 0);
    Py_DECREF(text);
    if (r < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *FS_readable(FastStream *self, PyObject *unused) {
    if (self->ended) Py_RETURN_NONE;
    ssize_t n;
    int64_t ts;
    if (self->kernel_clock) {
        struct iovec iov = {read_buf, READ_SIZE};
        union {
            char buf[CMSG_SPACE(sizeof(struct timespec))];
            struct cmsghdr align;
        } anc;
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = anc.buf;
        msg.msg_controllen = sizeof(anc.buf);
        n = recvmsg(self->fd, &msg, 0);
        ts = mono_ns();
        if (n > 0) {
            int found = 0;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                    struct timespec k;
                    memcpy(&k, CMSG_DATA(c), sizeof(k));
                    int64_t kts = (int64_t)k.tv_sec * 1000000000LL + k.tv_nsec - self->offset_ns;
                    if (kts < ts) ts = kts; /* never after the moment it was read */
                    found = 1;
                    break;
                }
            }
            if (!found) self->fallback_reads++;
        }
    } else {
        n = recv(self->fd, read_buf, READ_SIZE, 0);
        ts = mono_ns();
    }
    if (n < 0) {
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) Py_RETURN_NONE;
        PyObject *msg = PyUnicode_FromFormat("[Errno %d] %s", err, strerror(err));
        if (!msg) return NULL;
        int r = fs_end(self, END_OSERROR, msg, 0);
        Py_DECREF(msg);
        if (r < 0) return NULL;
        Py_RETURN_NONE;
    }
    self->last_read_ns = ts;
    self->reads++;
    if (n == 0) {
        if (fs_end(self, END_EOF, NULL, 0) < 0) return NULL;
        Py_RETURN_NONE;
    }
    if (fs_process(self, ts, read_buf, n) < 0) return fs_internal_error(self);
    Py_RETURN_NONE;
}

static PyObject *FS_feed(FastStream *self, PyObject *args) {
    long long ts;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "Ly*", &ts, &buf)) return NULL;
    if (!self->ended) self->last_read_ns = ts; /* the read these bytes came with */
    int r = self->ended ? 0 : fs_process(self, ts, buf.buf, buf.len);
    PyBuffer_Release(&buf);
    if (r < 0) return fs_internal_error(self);
    Py_RETURN_NONE;
}

static PyObject *FS_flush(FastStream *self, PyObject *sink) {
    if (fs_flush(self, sink) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *FS_close(FastStream *self, PyObject *unused) {
    fs_release(self);
    Py_RETURN_NONE;
}

static PyObject *int_or_none(int64_t v) {
    if (v < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

/* SGLang timings as the parser's _timings builds them ({key: float}, in TIMING_KEYS order) */
static PyObject *timing_dict(const timing_t *t) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int k = 0; k < N_TIMING; k++) {
        if (!(t->mask >> k & 1)) continue;
        PyObject *f = PyFloat_FromDouble(t->v[k]);
        if (!f || PyDict_SetItemString(d, TIMING_KEYS[k], f) < 0) {
            Py_XDECREF(f);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(f);
    }
    return d;
}

/* (stamps, columns): the events in order, one list per StreamEvent field. */
static PyObject *FS_columns(FastStream *self, PyObject *args) {
    PyObject *kinds;
    Py_ssize_t nfields;
    if (!PyArg_ParseTuple(args, "O!n", &PyTuple_Type, &kinds, &nfields)) return NULL;
    if (PyTuple_GET_SIZE(kinds) != 3 || nfields < 9) {
        PyErr_SetString(PyExc_ValueError, "columns((special, content, reasoning), nfields >= 9)");
        return NULL;
    }
    /* the StreamEvent field order this relies on (adapters/base.py, checked by tests) */
    enum { F_KIND, F_TEXT, F_TOKENS, F_CUM, F_FINISH, F_PROMPT, F_COMPLETION, F_CACHED, F_ID, F_ETYPE, F_EMSG, F_TIMING };
    if (self->ntimings && nfields <= F_TIMING) {
        PyErr_SetString(PyExc_ValueError, "columns: SGLang timings need nfields > 11");
        return NULL;
    }
    /* one dict per distinct timing, shared by the events that carried it */
    PyObject *tdicts = PyList_New(self->ntimings);
    if (!tdicts) return NULL;
    for (Py_ssize_t k = 0; k < self->ntimings; k++) {
        PyObject *d = timing_dict(&self->timings[k]);
        if (!d) {
            Py_DECREF(tdicts);
            return NULL;
        }
        PyList_SET_ITEM(tdicts, k, d);
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < self->nev; i++) n += self->ev[i].kind != KIND_DROPPED && self->ev[i].kind != KIND_PENDING;
    PyObject *stamps = PyList_New(n);
    PyObject *cols = PyTuple_New(nfields);
    if (!stamps || !cols) goto fail;
    for (Py_ssize_t f = 0; f < nfields; f++) {
        PyObject *l = PyList_New(n);
        if (!l) goto fail;
        PyTuple_SET_ITEM(cols, f, l);
    }
    /* The scan keeps no text, but every event it took had some: a one-character stand-in,
     * so the record counts text chunks (tokens without usage) as the parser's events would. */
    PyObject *stand_in = PyUnicode_FromStringAndSize("?", 1);
    if (!stand_in) goto fail;
    Py_ssize_t i = 0;
    for (Py_ssize_t k = 0; k < self->nev; k++) {
        ev_t *e = &self->ev[k];
        if (e->kind == KIND_DROPPED || e->kind == KIND_PENDING) continue;
        PyObject *t = PyLong_FromLongLong(e->ts);
        if (!t) {
            Py_DECREF(stand_in);
            goto fail;
        }
        PyList_SET_ITEM(stamps, i, t);
        for (Py_ssize_t f = 0; f < nfields; f++) {
            PyObject *v;
            if (e->kind == KIND_SPECIAL) {
                v = PySequence_GetItem(e->obj, f);
            } else {
                switch (f) {
                case F_KIND:
                    v = PyTuple_GET_ITEM(kinds, e->kind);
                    Py_INCREF(v);
                    break;
                case F_TEXT:
                    v = stand_in;
                    Py_INCREF(v);
                    break;
                case F_TOKENS: /* a TGI event is one token; OpenAI counts come from usage */
                    v = self->api == API_TGI ? PyLong_FromLong(1) : Py_None;
                    if (v == Py_None) Py_INCREF(v);
                    break;
                case F_CUM:
                    v = int_or_none(e->cum);
                    break;
                case F_PROMPT:
                    v = int_or_none(e->prompt);
                    break;
                case F_CACHED:
                    v = int_or_none(e->cached);
                    break;
                case F_ID:
                    v = e->obj ? e->obj : Py_None;
                    Py_INCREF(v);
                    break;
                case F_TIMING:
                    v = e->timing >= 0 ? PyList_GET_ITEM(tdicts, e->timing) : Py_None;
                    Py_INCREF(v);
                    break;
                default:
                    v = Py_None;
                    Py_INCREF(v);
                }
            }
            if (!v) {
                Py_DECREF(stand_in);
                goto fail;
            }
            PyList_SET_ITEM(PyTuple_GET_ITEM(cols, f), i, v);
        }
        i++;
    }
    Py_DECREF(stand_in);
    Py_DECREF(tdicts);
    return Py_BuildValue("(NN)", stamps, cols);
fail:
    Py_DECREF(tdicts);
    Py_XDECREF(stamps);
    Py_XDECREF(cols);
    return NULL;
}

static PyObject *FS_get_pending(FastStream *self, void *closure) {
    return PyBytes_FromStringAndSize(self->pending.p ? self->pending.p : "", self->pending.len);
}

static int FS_init(FastStream *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"fd", "kernel_clock", "offset_ns", "api", "sink", "on_end", "max_event", NULL};
    int fd, kernel_clock, api;
    long long offset;
    PyObject *sink, *on_end;
    Py_ssize_t max_event = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ipLiOO|n", kwlist, &fd, &kernel_clock, &offset, &api, &sink, &on_end,
                                     &max_event))
        return -1;
    if (api != API_COMPLETIONS && api != API_CHAT && api != API_TGI && api != API_SGLANG) {
        PyErr_SetString(PyExc_ValueError, "api must be 1 (completions), 2 (chat), 3 (TGI) or 4 (SGLang)");
        return -1;
    }
    self->fd = fd;
    self->kernel_clock = kernel_clock;
    self->offset_ns = offset;
    self->api = api;
    self->max_event = max_event;
    self->last_read_ns = mono_ns();
    self->last_data_ns = -1;
    self->last_payload_ns = -1;
    self->hstate = H_SIZE;
    self->cumulative_ok = 1;
    self->sg_stale = 1;
    Py_INCREF(sink);
    Py_XSETREF(self->sink, sink);
    Py_INCREF(on_end);
    Py_XSETREF(self->on_end, on_end);
    return 0;
}

static int FS_traverse(FastStream *self, visitproc visit, void *arg) {
    Py_VISIT(self->sink);
    Py_VISIT(self->on_end);
    for (Py_ssize_t i = 0; i < self->nev; i++) Py_VISIT(self->ev[i].obj);
    return 0;
}

static int FS_clear(FastStream *self) {
    Py_CLEAR(self->sink);
    Py_CLEAR(self->on_end);
    for (Py_ssize_t i = 0; i < self->nev; i++) Py_CLEAR(self->ev[i].obj);
    return 0;
}

static void FS_dealloc(FastStream *self) {
    PyObject_GC_UnTrack(self);
    FS_clear(self);
    PyMem_Free(self->ev);
    bbuf_free(&self->line);
    bbuf_free(&self->pending);
    bbuf_free(&self->pyout);
    bbuf_free(&self->joined);
    bbuf_free(&self->sg_text);
    bbuf_free(&self->sg_scratch);
    PyMem_Free(self->timings);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef FS_methods[] = {
    {"readable", (PyCFunction)FS_readable, METH_NOARGS, "Read the socket once (the event loop's reader callback)."},
    {"feed", (PyCFunction)FS_feed, METH_VARARGS, "feed(ts_ns, data): bytes already read (the rest of the head's read)."},
    {"columns", (PyCFunction)FS_columns, METH_VARARGS,
     "columns(kinds, nfields) -> (stamps, columns): the events, one list per StreamEvent field."},
    {"flush", (PyCFunction)FS_flush, METH_O, "flush(sink): the parser reads the payloads still waiting (before the record)."},
    {"close", (PyCFunction)FS_close, METH_NOARGS, "Stop: no more callbacks, references released."},
    {NULL}};

static PyMemberDef FS_members[] = {
    {"offset_ns", T_LONGLONG, offsetof(FastStream, offset_ns), 0, "CLOCK_REALTIME minus perf_counter_ns"},
    {"last_read_ns", T_LONGLONG, offsetof(FastStream, last_read_ns), READONLY, "stamp of the last read"},
    {"last_data_ns", T_LONGLONG, offsetof(FastStream, last_data_ns), READONLY, "stamp of the last body bytes, -1 if none"},
    {"last_payload_ns", T_LONGLONG, offsetof(FastStream, last_payload_ns), READONLY,
     "stamp of the read of the last SSE data payload, -1 if none"},
    {"fallback_reads", T_LONGLONG, offsetof(FastStream, fallback_reads), READONLY, "kernel clock: reads without a timestamp"},
    {"reads", T_LONGLONG, offsetof(FastStream, reads), READONLY, "socket reads"},
    {"scanned", T_LONGLONG, offsetof(FastStream, scanned), READONLY, "SSE data payloads the scan took itself"},
    {"done", T_INT, offsetof(FastStream, done), READONLY, "the [DONE] marker was seen"},
    {"after_done", T_LONGLONG, offsetof(FastStream, after_done), READONLY, "payloads after the [DONE] marker (dropped)"},
    {"ended", T_INT, offsetof(FastStream, ended), READONLY, "on_end was called (or close)"},
    {NULL}};

static PyGetSetDef FS_getset[] = {
    {"pending", (getter)FS_get_pending, NULL, "SSE bytes after the last complete event", NULL},
    {NULL}};

static PyTypeObject FastStreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bench_llm.loadgen._fastpath.FastStream",
    .tp_basicsize = sizeof(FastStream),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One streamed response read, framed and scanned in C (see loadgen/_fastpath.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FS_init,
    .tp_dealloc = (destructor)FS_dealloc,
    .tp_traverse = (traverseproc)FS_traverse,
    .tp_clear = (inquiry)FS_clear,
    .tp_methods = FS_methods,
    .tp_members = FS_members,
    .tp_getset = FS_getset,
};

/* classify(payload, api) -> None (special) or (kind, cumulative, prompt, cached, id):
 * the scan alone, for tests. */
static PyObject *py_classify(PyObject *mod, PyObject *args) {
    Py_buffer buf;
    int api;
    if (!PyArg_ParseTuple(args, "y*i", &buf, &api)) return NULL;
    regular_t r;
    int c = classify(buf.buf, buf.len, api, &r);
    PyObject *out;
    if (c != REGULAR) {
        out = Py_None;
        Py_INCREF(out);
    } else {
        PyObject *id = Py_None;
        if (r.id_len >= 0) {
            id = PyUnicode_DecodeUTF8((const char *)buf.buf + r.id_start, r.id_len, "strict");
            if (!id) {
                PyBuffer_Release(&buf);
                return NULL;
            }
        } else {
            Py_INCREF(id);
        }
        if (api == API_SGLANG) {
            /* (cumulative, prompt, cached, id, text, n_ids, timing): the payload's reading */
            bbuf tb = {NULL, 0, 0};
            PyObject *text = NULL, *timing = NULL;
            const char *t = (const char *)buf.buf + r.text_start;
            Py_ssize_t tl = r.text_len;
            if (r.text_esc) {
                if (json_unescape(t, tl, &tb) < 0) {
                    Py_DECREF(id);
                    PyBuffer_Release(&buf);
                    return NULL;
                }
                t = tb.p ? tb.p : "";
                tl = tb.len;
            }
            text = PyUnicode_DecodeUTF8(t, tl, "strict");
            bbuf_free(&tb);
            if (r.has_timing) {
                timing = timing_dict(&r.timing);
            } else {
                timing = Py_None;
                Py_INCREF(timing);
            }
            out = (text && timing) ? Py_BuildValue("(NNNNNNN)", int_or_none(r.cum), int_or_none(r.prompt), int_or_none(r.cached), id,
                                                   text, int_or_none(r.n_ids), timing)
                                   : NULL;
            if (!out) {
                Py_XDECREF(text);
                Py_XDECREF(timing);
            }
        } else {
            out = Py_BuildValue("(iNNNN)", r.kind, int_or_none(r.cum), int_or_none(r.prompt), int_or_none(r.cached), id);
        }
    }
    PyBuffer_Release(&buf);
    return out;
}

static PyObject *py_monotonic_ns(PyObject *mod, PyObject *unused) { return PyLong_FromLongLong(mono_ns()); }

static PyMethodDef module_methods[] = {
    {"classify", py_classify, METH_VARARGS, "classify(payload, api): the regular-event scan alone (tests)."},
    {"monotonic_ns", py_monotonic_ns, METH_NOARGS, "The clock the reads are stamped with."},
    {NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "bench_llm.loadgen._fastpath",
                                       "bench's compiled per-chunk read path (optional).", -1, module_methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (PyType_Ready(&FastStreamType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&FastStreamType);
    if (PyModule_AddObject(m, "FastStream", (PyObject *)&FastStreamType) < 0) {
        Py_DECREF(&FastStreamType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "API_COMPLETIONS", API_COMPLETIONS);
    PyModule_AddIntConstant(m, "API_CHAT", API_CHAT);
    PyModule_AddIntConstant(m, "API_TGI", API_TGI);
    PyModule_AddIntConstant(m, "API_SGLANG", API_SGLANG);
    PyModule_AddIntConstant(m, "KIND_CONTENT", KIND_CONTENT);
    PyModule_AddIntConstant(m, "KIND_REASONING", KIND_REASONING);
    return m;
}
