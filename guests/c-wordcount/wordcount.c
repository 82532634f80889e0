/*
 * c-wordcount: a Sweep handler in plain C (C11, wasi-libc), counting the words, lines,
 * characters and bytes of a text, like wc(1).
 *
 * Payload {"text": "..."} -> {"words": N, "lines": N, "chars": N, "bytes": N}.
 *   words  runs of bytes that are not ASCII whitespace (space, \t, \n, \v, \f, \r)
 *   lines  as Rust's str::lines counts them: every '\n' ends a line and a final line
 *          without one still counts ("" -> 0, "a\n" -> 1, "a\nb" -> 2)
 *   chars  Unicode scalar values
 *   bytes  the text's length in UTF-8
 *
 * The guest contract (README, "Writing a handler"): the payload arrives on stdin, the result
 * goes to stdout, logs to stderr, and the exit code decides the outcome. A payload that is not
 * JSON, not an object, lacks "text", has a "text" that is not a string, or has any other field
 * is a permanent failure (exit 100) with a one-line reason as the last line of stderr:
 * retrying cannot fix it. Failing to read stdin or write stdout exits 1 (retried).
 *
 * The JSON reader below is just enough for that shape, and strict where serde_json is: it
 * rejects trailing commas, bad escapes, control characters in strings, invalid UTF-8, lone
 * surrogates and trailing data. It never recurses, so no input can exhaust the stack.
 *
 * Build (see docs/guests.md):
 *   clang --target=wasm32-wasi -O2 -Wall -Wextra -Werror -o c-wordcount.wasm wordcount.c
 * or natively, to try it from a shell:
 *   cc -O2 -o wordcount wordcount.c && echo '{"text":"a b a"}' | ./wordcount
 */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EXIT_PERMANENT = 100, EXIT_RETRY = 1 };

/* ---- output helpers -------------------------------------------------------------------- */

/* Writes the failure reason as one line on stderr and exits with `code`. */
_Noreturn static void fail(int code, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("c-wordcount: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    fflush(stderr);
    exit(code);
}

/* ---- a growable byte buffer ------------------------------------------------------------ */

struct buf {
    unsigned char *data;
    size_t len, cap;
};

static void buf_push(struct buf *b, unsigned char c) {
    if (b->len == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        unsigned char *data = realloc(b->data, cap);
        if (data == NULL) {
            fail(EXIT_RETRY, "out of memory after %zu bytes", b->len);
        }
        b->data = data;
        b->cap = cap;
    }
    b->data[b->len++] = c;
}

static void read_all(FILE *in, struct buf *b) {
    int c;
    while ((c = getc(in)) != EOF) {
        buf_push(b, (unsigned char)c);
    }
    if (ferror(in)) {
        fail(EXIT_RETRY, "cannot read the task payload from stdin");
    }
}

/* ---- the JSON reader ------------------------------------------------------------------- */

struct parser {
    const unsigned char *p, *end, *start;
};

/* A bad payload: permanent, with the byte offset so the author can find it. */
_Noreturn static void bad(const struct parser *ps, const char *what) {
    fail(EXIT_PERMANENT, "invalid task payload: %s at byte offset %zu", what, (size_t)(ps->p - ps->start));
}

static void skip_ws(struct parser *ps) {
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) {
        ps->p++;
    }
}

static bool at(const struct parser *ps, unsigned char c) {
    return ps->p < ps->end && *ps->p == c;
}

static void expect(struct parser *ps, unsigned char c, const char *what) {
    if (!at(ps, c)) {
        bad(ps, what);
    }
    ps->p++;
}

static void push_utf8(struct buf *out, uint32_t cp) {
    if (out == NULL) {
        return;
    }
    if (cp < 0x80) {
        buf_push(out, (unsigned char)cp);
    } else if (cp < 0x800) {
        buf_push(out, (unsigned char)(0xC0 | (cp >> 6)));
        buf_push(out, (unsigned char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        buf_push(out, (unsigned char)(0xE0 | (cp >> 12)));
        buf_push(out, (unsigned char)(0x80 | ((cp >> 6) & 0x3F)));
        buf_push(out, (unsigned char)(0x80 | (cp & 0x3F)));
    } else {
        buf_push(out, (unsigned char)(0xF0 | (cp >> 18)));
        buf_push(out, (unsigned char)(0x80 | ((cp >> 12) & 0x3F)));
        buf_push(out, (unsigned char)(0x80 | ((cp >> 6) & 0x3F)));
        buf_push(out, (unsigned char)(0x80 | (cp & 0x3F)));
    }
}

static uint32_t hex4(struct parser *ps) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++, ps->p++) {
        if (ps->p >= ps->end) {
            bad(ps, "truncated \\u escape");
        }
        unsigned char c = *ps->p;
        uint32_t d;
        if (c >= '0' && c <= '9') {
            d = (uint32_t)(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            d = (uint32_t)(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            d = (uint32_t)(c - 'A' + 10);
        } else {
            bad(ps, "bad hex digit in \\u escape");
        }
        v = v * 16 + d;
    }
    return v;
}

/* One raw (unescaped) UTF-8 sequence starting at ps->p, validated per RFC 3629: no overlong
 * forms, no surrogates, nothing past U+10FFFF. */
static void utf8_sequence(struct parser *ps, struct buf *out) {
    unsigned char c = *ps->p;
    size_t n;
    uint32_t cp, min;
    if (c < 0x80) {
        n = 1, cp = c, min = 0;
    } else if ((c & 0xE0) == 0xC0) {
        n = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4, cp = c & 0x07, min = 0x10000;
    } else {
        bad(ps, "invalid UTF-8");
    }
    if ((size_t)(ps->end - ps->p) < n) {
        bad(ps, "truncated UTF-8");
    }
    for (size_t i = 1; i < n; i++) {
        if ((ps->p[i] & 0xC0) != 0x80) {
            bad(ps, "invalid UTF-8");
        }
        cp = (cp << 6) | (ps->p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        bad(ps, "invalid UTF-8");
    }
    if (out != NULL) {
        for (size_t i = 0; i < n; i++) {
            buf_push(out, ps->p[i]);
        }
    }
    ps->p += n;
}

/* A string at ps->p (the opening quote); its decoded UTF-8 goes to `out` unless NULL. */
static void parse_string(struct parser *ps, struct buf *out) {
    expect(ps, '"', "expected a string");
    for (;;) {
        if (ps->p >= ps->end) {
            bad(ps, "unterminated string");
        }
        unsigned char c = *ps->p;
        if (c == '"') {
            ps->p++;
            return;
        }
        if (c < 0x20) {
            bad(ps, "control character in string");
        }
        if (c != '\\') {
            utf8_sequence(ps, out);
            continue;
        }
        ps->p++;
        if (ps->p >= ps->end) {
            bad(ps, "unterminated string");
        }
        c = *ps->p++;
        switch (c) {
        case '"': push_utf8(out, '"'); break;
        case '\\': push_utf8(out, '\\'); break;
        case '/': push_utf8(out, '/'); break;
        case 'b': push_utf8(out, '\b'); break;
        case 'f': push_utf8(out, '\f'); break;
        case 'n': push_utf8(out, '\n'); break;
        case 'r': push_utf8(out, '\r'); break;
        case 't': push_utf8(out, '\t'); break;
        case 'u': {
            uint32_t cp = hex4(ps);
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                bad(ps, "lone low surrogate in \\u escape");
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    bad(ps, "lone high surrogate in \\u escape");
                }
                ps->p += 2;
                uint32_t low = hex4(ps);
                if (low < 0xDC00 || low > 0xDFFF) {
                    bad(ps, "high surrogate not followed by a low one");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            push_utf8(out, cp);
            break;
        }
        default:
            ps->p--;
            bad(ps, "invalid escape in string");
        }
    }
}

/* The payload: exactly one object with exactly one field, "text", a string. */
static void parse_payload(struct parser *ps, struct buf *text) {
    struct buf key = {0};
    bool have_text = false;
    skip_ws(ps);
    if (!at(ps, '{')) {
        fail(EXIT_PERMANENT, "invalid task payload: expected an object like {\"text\": \"...\"}");
    }
    ps->p++;
    skip_ws(ps);
    if (!at(ps, '}')) {
        for (;;) {
            skip_ws(ps);
            key.len = 0;
            parse_string(ps, &key);
            skip_ws(ps);
            expect(ps, ':', "expected ':' after an object key");
            skip_ws(ps);
            if (key.len == 4 && memcmp(key.data, "text", 4) == 0) {
                if (have_text) {
                    fail(EXIT_PERMANENT, "invalid task payload: duplicate field `text`");
                }
                if (!at(ps, '"')) {
                    fail(EXIT_PERMANENT, "invalid task payload: `text` must be a string");
                }
                parse_string(ps, text);
                have_text = true;
            } else {
                /* The reason must stay one line: control characters in the key show as '?'. */
                size_t shown = key.len > 64 ? 64 : key.len;
                for (size_t i = 0; i < shown; i++) {
                    if (key.data[i] < 0x20 || key.data[i] == 0x7f) key.data[i] = '?';
                }
                fail(EXIT_PERMANENT, "invalid task payload: unknown field `%.*s`, expected `text`",
                     (int)shown, (const char *)key.data);
            }
            skip_ws(ps);
            if (at(ps, '}')) {
                break;
            }
            expect(ps, ',', "expected ',' or '}'");
        }
    }
    ps->p++;
    skip_ws(ps);
    if (ps->p != ps->end) {
        bad(ps, "trailing characters after the object");
    }
    if (!have_text) {
        fail(EXIT_PERMANENT, "invalid task payload: missing field `text`");
    }
    free(key.data);
}

/* ---- the handler ----------------------------------------------------------------------- */

struct counts {
    size_t words, lines, chars, bytes;
};

static bool is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static struct counts count(const unsigned char *text, size_t len) {
    struct counts n = {0, 0, 0, len};
    bool in_word = false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = text[i];
        if ((c & 0xC0) != 0x80) {
            n.chars++;
        }
        if (c == '\n') {
            n.lines++;
        }
        if (is_space(c)) {
            in_word = false;
        } else if (!in_word) {
            in_word = true;
            n.words++;
        }
    }
    if (len > 0 && text[len - 1] != '\n') {
        n.lines++;
    }
    return n;
}

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v != NULL ? v : fallback;
}

int main(void) {
    struct buf payload = {0}, text = {0};
    read_all(stdin, &payload);
    struct parser ps = {payload.data, payload.data + payload.len, payload.data};
    if (payload.len == 0) {
        fail(EXIT_PERMANENT, "invalid task payload: empty input");
    }
    parse_payload(&ps, &text);
    struct counts n = count(text.data, text.len);

    fprintf(stderr, "c-wordcount: task %s attempt %s/%s: %zu words in %zu lines\n",
            env_or("SWEEP_TASK_ID", "-"), env_or("SWEEP_ATTEMPT", "-"),
            env_or("SWEEP_MAX_ATTEMPTS", "-"), n.words, n.lines);
    printf("{\"words\":%zu,\"lines\":%zu,\"chars\":%zu,\"bytes\":%zu}\n", n.words, n.lines,
           n.chars, n.bytes);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fail(EXIT_RETRY, "cannot write the result to stdout");
    }
    free(payload.data);
    free(text.data);
    return 0;
}
