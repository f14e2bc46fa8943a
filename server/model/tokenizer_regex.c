/* A backtracking matcher for the ECMAScript subset in tokenizer_regex.h. It follows the order in
 * which libstdc++'s std::regex (its depth-first executor, ECMAScript grammar) tries things, so that
 * the first match it finds is the one std::regex_search returns: alternatives left to right, a
 * greedy quantifier longest first, a lazy one shortest first, lookaheads atomic.
 *
 * Matching passes continuations: m(node, pos, k) matches node at pos and then whatever k says
 * comes next. A quantified one-character body (a class, a literal, a group of lookaheads around
 * one such) is matched in a loop rather than by recursion, so a long run of letters or spaces
 * costs no stack; other quantified bodies recurse once per iteration. */
#include "model/tokenizer_regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum kind { K_CHAR, K_CLASS, K_ANY, K_SEQ, K_ALT, K_REPEAT, K_LOOK, K_BOL, K_EOL, K_WORDB };

/* \s \S \d \D \w \W inside or outside brackets */
enum { C_SPACE = 1, C_NSPACE = 2, C_DIGIT = 4, C_NDIGIT = 8, C_WORD = 16, C_NWORD = 32 };

#define UNBOUNDED UINT32_MAX

struct node {
    uint8_t kind;
    uint8_t negate; /* K_CLASS: [^...]; K_LOOK: (?!...); K_WORDB: \B */
    uint8_t greedy; /* K_REPEAT */
    int8_t width;   /* characters it always consumes (0 or 1), -1 when it varies */
    uint32_t ch;    /* K_CHAR */
    unsigned cls;   /* K_CLASS: C_* */
    int first;      /* K_SEQ / K_ALT: first child; K_REPEAT / K_LOOK: the body; K_CLASS: first range */
    int count;      /* K_CLASS: ranges */
    int next;       /* the next child of the parent K_SEQ / K_ALT, or -1 */
    uint32_t min, max;
};

struct qd_regex {
    struct node *nodes;
    int n_nodes, cap_nodes;
    uint32_t *ranges; /* lo, hi pairs */
    int n_ranges, cap_ranges;
    int root;
    int lead; /* a K_REPEAT of one character, unbounded, that every match starts with; or -1 */
};

/* ---- parsing -------------------------------------------------------------------------------- */

struct parser {
    struct qd_regex *re;
    const uint32_t *p;
    size_t n, i;
    char *err;
    size_t errlen;
    int failed;
};

static int perr(struct parser *ps, const char *fmt, ...)
{
    if (!ps->failed) {
        va_list ap;
        va_start(ap, fmt);
        int k = snprintf(ps->err, ps->errlen, "regex at %zu: ", ps->i);
        if (k >= 0 && (size_t)k < ps->errlen)
            vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    ps->failed = 1;
    return -1;
}

static int new_node(struct parser *ps, int kind)
{
    struct qd_regex *re = ps->re;
    if (re->n_nodes == re->cap_nodes) {
        int cap = re->cap_nodes ? re->cap_nodes * 2 : 32;
        struct node *nn = realloc(re->nodes, (size_t)cap * sizeof *nn);
        if (!nn)
            return perr(ps, "no memory");
        re->nodes = nn;
        re->cap_nodes = cap;
    }
    struct node *nd = &re->nodes[re->n_nodes];
    memset(nd, 0, sizeof *nd);
    nd->kind = (uint8_t)kind;
    nd->first = nd->next = -1;
    nd->width = kind == K_CHAR || kind == K_CLASS || kind == K_ANY ? 1 : 0;
    return re->n_nodes++;
}

static int add_range(struct parser *ps, uint32_t lo, uint32_t hi)
{
    struct qd_regex *re = ps->re;
    if (re->n_ranges == re->cap_ranges) {
        int cap = re->cap_ranges ? re->cap_ranges * 2 : 64;
        uint32_t *nr = realloc(re->ranges, (size_t)cap * 2 * sizeof *nr);
        if (!nr)
            return perr(ps, "no memory");
        re->ranges = nr;
        re->cap_ranges = cap;
    }
    re->ranges[2 * re->n_ranges] = lo;
    re->ranges[2 * re->n_ranges + 1] = hi;
    re->n_ranges++;
    return 0;
}

static int at(struct parser *ps, uint32_t c) { return ps->i < ps->n && ps->p[ps->i] == c; }

static int hex_digit(uint32_t c)
{
    return c >= '0' && c <= '9' ? (int)(c - '0') : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10)
         : c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10) : -1;
}

/* An escape after '\' (ps->i at the escaped character): a character in *c, or a class in *cls. */
static int parse_escape(struct parser *ps, int in_bracket, uint32_t *c, unsigned *cls)
{
    if (ps->i >= ps->n)
        return perr(ps, "a pattern cannot end with '\\'");
    uint32_t e = ps->p[ps->i++];
    *cls = 0;
    switch (e) {
    case 'd': *cls = C_DIGIT; return 0;
    case 'D': *cls = C_NDIGIT; return 0;
    case 's': *cls = C_SPACE; return 0;
    case 'S': *cls = C_NSPACE; return 0;
    case 'w': *cls = C_WORD; return 0;
    case 'W': *cls = C_NWORD; return 0;
    case 'n': *c = '\n'; return 0;
    case 'r': *c = '\r'; return 0;
    case 't': *c = '\t'; return 0;
    case 'f': *c = '\f'; return 0;
    case 'v': *c = '\v'; return 0;
    case '0': *c = 0; return 0;
    case 'b':
        if (in_bracket) {
            *c = '\b';
            return 0;
        }
        break;
    case 'x': case 'u': {
        int digits = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            int h = ps->i < ps->n ? hex_digit(ps->p[ps->i]) : -1;
            if (h < 0)
                return perr(ps, "\\%c needs %d hex digits", (int)e, digits);
            v = v * 16 + (uint32_t)h;
            ps->i++;
        }
        *c = v;
        return 0;
    }
    default:
        break;
    }
    if ((e >= '1' && e <= '9') || e == 'c' || e == 'B' || e == 'b')
        return perr(ps, "escape \\%c is not supported here", (int)e);
    *c = e; /* an identity escape: \[ \] \- \\ \$ ... */
    return 0;
}

static int parse_class(struct parser *ps)
{
    int id = new_node(ps, K_CLASS);
    if (id < 0)
        return -1;
    struct node *nd = &ps->re->nodes[id];
    nd->first = ps->re->n_ranges;
    if (at(ps, '^')) {
        nd->negate = 1;
        ps->i++;
    }
    unsigned cls_all = 0;
    for (;;) {
        if (ps->i >= ps->n)
            return perr(ps, "'[' without ']'");
        uint32_t c = ps->p[ps->i++];
        if (c == ']')
            break;
        unsigned cls = 0;
        if (c == '\\' && parse_escape(ps, 1, &c, &cls))
            return -1;
        if (cls) {
            cls_all |= cls;
            continue;
        }
        uint32_t hi = c;
        /* a '-' between two characters makes a range; first, last or after a class, a dash */
        if (at(ps, '-') && ps->i + 1 < ps->n && ps->p[ps->i + 1] != ']') {
            ps->i++;
            hi = ps->p[ps->i++];
            unsigned hcls = 0;
            if (hi == '\\' && parse_escape(ps, 1, &hi, &hcls))
                return -1;
            if (hcls)
                return perr(ps, "a class cannot end a range");
            if (hi < c)
                return perr(ps, "range out of order");
        }
        if (add_range(ps, c, hi))
            return -1;
    }
    nd = &ps->re->nodes[id]; /* (add_range may not move nodes, new_node may) */
    nd->cls = cls_all;
    nd->count = ps->re->n_ranges - nd->first;
    return id;
}

static int parse_alt(struct parser *ps);

static int parse_atom(struct parser *ps)
{
    uint32_t c = ps->p[ps->i++];
    int id;
    switch (c) {
    case '(': {
        int kind = K_SEQ, negate = 0;
        if (at(ps, '?')) {
            uint32_t t = ps->i + 1 < ps->n ? ps->p[ps->i + 1] : 0;
            if (t != ':' && t != '=' && t != '!')
                return perr(ps, "group '(?%c' is not supported", (int)t);
            kind = t == ':' ? K_SEQ : K_LOOK;
            negate = t == '!';
            ps->i += 2;
        }
        int body = parse_alt(ps);
        if (body < 0)
            return -1;
        if (!at(ps, ')'))
            return perr(ps, "'(' without ')'");
        ps->i++;
        if (kind == K_SEQ)
            return body; /* a group only groups: nothing is captured (llama.cpp asks for nosubs) */
        if ((id = new_node(ps, K_LOOK)) < 0)
            return -1;
        ps->re->nodes[id].first = body;
        ps->re->nodes[id].negate = (uint8_t)negate;
        return id;
    }
    case '[':
        return parse_class(ps);
    case '.':
        return new_node(ps, K_ANY);
    case '^':
        return new_node(ps, K_BOL);
    case '$':
        return new_node(ps, K_EOL);
    case '*': case '+': case '?': case '{': case '}': case ']':
        return perr(ps, "'%c' has nothing to repeat or is unbalanced", (int)c);
    case '\\': {
        if (at(ps, 'b') || at(ps, 'B')) {
            int neg = at(ps, 'B');
            ps->i++;
            if ((id = new_node(ps, K_WORDB)) >= 0)
                ps->re->nodes[id].negate = (uint8_t)neg;
            return id;
        }
        unsigned cls = 0;
        if (parse_escape(ps, 0, &c, &cls))
            return -1;
        if (!cls)
            break;
        if ((id = new_node(ps, K_CLASS)) >= 0) {
            ps->re->nodes[id].cls = cls;
            ps->re->nodes[id].first = ps->re->n_ranges;
        }
        return id;
    }
    default:
        break;
    }
    if ((id = new_node(ps, K_CHAR)) >= 0)
        ps->re->nodes[id].ch = c;
    return id;
}

static int parse_number(struct parser *ps, uint32_t *v)
{
    if (ps->i >= ps->n || ps->p[ps->i] < '0' || ps->p[ps->i] > '9')
        return -1;
    uint32_t x = 0;
    while (ps->i < ps->n && ps->p[ps->i] >= '0' && ps->p[ps->i] <= '9') {
        if (x > 100000)
            return perr(ps, "repeat count too large");
        x = x * 10 + (ps->p[ps->i++] - '0');
    }
    *v = x;
    return 0;
}

static int parse_term(struct parser *ps)
{
    int atom = parse_atom(ps);
    if (atom < 0 || ps->i >= ps->n)
        return atom;
    uint32_t c = ps->p[ps->i], lo = 0, hi = 0;
    if (c == '*' || c == '+' || c == '?') {
        lo = c == '+';
        hi = c == '?' ? 1 : UNBOUNDED;
        ps->i++;
    } else if (c == '{') {
        ps->i++;
        if (parse_number(ps, &lo))
            return perr(ps, "'{' needs a count");
        hi = lo;
        if (at(ps, ',')) {
            ps->i++;
            hi = UNBOUNDED;
            if (!at(ps, '}') && parse_number(ps, &hi))
                return perr(ps, "bad '{n,m}'");
        }
        if (!at(ps, '}') || hi < lo)
            return perr(ps, "bad '{n,m}'");
        ps->i++;
    } else {
        return atom;
    }
    int id = new_node(ps, K_REPEAT);
    if (id < 0)
        return -1;
    struct node *nd = &ps->re->nodes[id];
    nd->first = atom;
    nd->min = lo;
    nd->max = hi;
    nd->greedy = 1;
    nd->width = -1;
    if (at(ps, '?')) {
        nd->greedy = 0;
        ps->i++;
    }
    return id;
}

/* Links children: a sequence's width is the sum of its children's when each is fixed. */
static int parse_seq(struct parser *ps)
{
    int id = new_node(ps, K_SEQ), last = -1, width = 0;
    if (id < 0)
        return -1;
    while (ps->i < ps->n && !at(ps, '|') && !at(ps, ')')) {
        int t = parse_term(ps);
        if (t < 0)
            return -1;
        struct node *nodes = ps->re->nodes;
        if (last < 0)
            nodes[id].first = t;
        else
            nodes[last].next = t;
        last = t;
        width = width < 0 || nodes[t].width < 0 ? -1 : width + nodes[t].width;
    }
    ps->re->nodes[id].width = (int8_t)(width > 1 ? -1 : width);
    return id;
}

static int parse_alt(struct parser *ps)
{
    int first = parse_seq(ps);
    if (first < 0 || !at(ps, '|'))
        return first;
    int id = new_node(ps, K_ALT), last = first, width = ps->re->nodes[first].width;
    if (id < 0)
        return -1;
    ps->re->nodes[id].first = first;
    while (at(ps, '|')) {
        ps->i++;
        int s = parse_seq(ps);
        if (s < 0)
            return -1;
        ps->re->nodes[last].next = s;
        last = s;
        if (ps->re->nodes[s].width != width)
            width = -1;
    }
    ps->re->nodes[id].width = (int8_t)width;
    return id;
}

struct qd_regex *qd_regex_compile(const uint32_t *pattern, size_t n, char *err, size_t errlen)
{
    struct qd_regex *re = calloc(1, sizeof *re);
    struct parser ps = {re, pattern, n, 0, err, errlen, 0};
    if (!re) {
        snprintf(err, errlen, "no memory");
        return NULL;
    }
    re->root = parse_alt(&ps);
    if (re->root >= 0 && ps.i < n)
        perr(&ps, "unbalanced ')'");
    if (ps.failed || re->root < 0) {
        qd_regex_free(re);
        return NULL;
    }
    const struct node *r = &re->nodes[re->root];
    int first = r->kind == K_SEQ ? r->first : -1;
    re->lead = first >= 0 && re->nodes[first].kind == K_REPEAT && re->nodes[first].max == UNBOUNDED &&
                       re->nodes[re->nodes[first].first].width == 1 ? first : -1;
    return re;
}

void qd_regex_free(struct qd_regex *re)
{
    if (re) {
        free(re->nodes);
        free(re->ranges);
        free(re);
    }
}

/* ---- matching ------------------------------------------------------------------------------- */

/* The "C" locale's classes, which std::regex's \s \d \w use (ASCII only). */
static int is_space(uint32_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static int is_digit(uint32_t c) { return c >= '0' && c <= '9'; }
static int is_word(uint32_t c) { return is_digit(c) || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }

struct ctx {
    const struct qd_regex *re;
    const uint32_t *text;
    size_t n;        /* the piece being split: [0, n) */
    size_t start;    /* where this attempt began */
    int not_null;    /* an empty match does not count (after an empty match) */
    size_t end;      /* the match's end, on success */
};

enum { F_SEQ, F_REP };
struct frame {
    int kind;
    int node;     /* F_SEQ: the next child to match (-1: none left); F_REP: the K_REPEAT */
    uint32_t count;
    size_t from;  /* F_REP: where the iteration began */
    const struct frame *up;
};

static int m(struct ctx *c, int node, size_t pos, const struct frame *k);

static int class_has(const struct qd_regex *re, const struct node *nd, uint32_t ch)
{
    int hit = 0;
    for (int r = 0; r < nd->count && !hit; r++)
        hit = re->ranges[2 * (nd->first + r)] <= ch && ch <= re->ranges[2 * (nd->first + r) + 1];
    unsigned cls = nd->cls;
    if (!hit && cls)
        hit = ((cls & C_SPACE) && is_space(ch)) || ((cls & C_NSPACE) && !is_space(ch)) ||
              ((cls & C_DIGIT) && is_digit(ch)) || ((cls & C_NDIGIT) && !is_digit(ch)) ||
              ((cls & C_WORD) && is_word(ch)) || ((cls & C_NWORD) && !is_word(ch));
    return hit != nd->negate;
}

/* A zero-width assertion at pos. */
static int assertion(struct ctx *c, const struct node *nd, size_t pos)
{
    switch (nd->kind) {
    case K_BOL:
        return pos == 0;
    case K_EOL:
        return pos == c->n;
    case K_WORDB: {
        int left = pos > 0 && is_word(c->text[pos - 1]), right = pos < c->n && is_word(c->text[pos]);
        return (left != right) != nd->negate;
    }
    case K_LOOK: {
        struct ctx sub = *c;
        sub.not_null = 0;
        return m(&sub, nd->first, pos, NULL) != nd->negate;
    }
    }
    return 0;
}

static int one(struct ctx *c, int node, size_t pos);

/* A zero-width node (an assertion, or a group of them) at pos. */
static int zero(struct ctx *c, int node, size_t pos)
{
    const struct node *nd = &c->re->nodes[node];
    if (nd->kind == K_SEQ || nd->kind == K_ALT) {
        for (int ch = nd->first; ch >= 0; ch = c->re->nodes[ch].next)
            if (zero(c, ch, pos) != (nd->kind == K_SEQ))
                return nd->kind == K_ALT;
        return nd->kind == K_SEQ;
    }
    return assertion(c, nd, pos);
}

/* A one-character node (width 1) at pos, with no continuation: what follows it cannot change
 * whether it matches, so a repeat of it is a loop. */
static int one(struct ctx *c, int node, size_t pos)
{
    const struct node *nd = &c->re->nodes[node];
    switch (nd->kind) {
    case K_CHAR:
        return pos < c->n && c->text[pos] == nd->ch;
    case K_ANY: {
        uint32_t ch = pos < c->n ? c->text[pos] : '\n';
        return ch != '\n' && ch != '\r' && ch != 0x2028 && ch != 0x2029;
    }
    case K_CLASS:
        return pos < c->n && class_has(c->re, nd, c->text[pos]);
    case K_ALT:
        for (int ch = nd->first; ch >= 0; ch = c->re->nodes[ch].next)
            if (one(c, ch, pos))
                return 1;
        return 0;
    case K_SEQ:
        for (int ch = nd->first; ch >= 0; ch = c->re->nodes[ch].next) {
            if (c->re->nodes[ch].width == 0) {
                if (!zero(c, ch, pos))
                    return 0;
            } else if (!one(c, ch, pos++)) {
                return 0;
            }
        }
        return 1;
    }
    return 0;
}

static int kont(struct ctx *c, size_t pos, const struct frame *k);

/* Iterations beyond `count` of a repeat whose body is not one character (ECMAScript's
 * RepeatMatcher). */
static int rep(struct ctx *c, int node, uint32_t count, size_t pos, const struct frame *k)
{
    const struct node *nd = &c->re->nodes[node];
    if (count == nd->max)
        return kont(c, pos, k);
    struct frame f = {F_REP, node, count, pos, k};
    if (count < nd->min)
        return m(c, nd->first, pos, &f);
    if (nd->greedy)
        return m(c, nd->first, pos, &f) || kont(c, pos, k);
    return kont(c, pos, k) || m(c, nd->first, pos, &f);
}

static int kont(struct ctx *c, size_t pos, const struct frame *k)
{
    if (!k) {
        if (c->not_null && pos == c->start)
            return 0;
        c->end = pos;
        return 1;
    }
    if (k->kind == F_SEQ) {
        if (k->node < 0)
            return kont(c, pos, k->up);
        return m(c, k->node, pos, &(struct frame){F_SEQ, c->re->nodes[k->node].next, 0, 0, k->up});
    }
    /* an iteration that matched nothing once the minimum is reached ends the repeat (ECMAScript) */
    if (pos == k->from && k->count >= c->re->nodes[k->node].min)
        return 0;
    return rep(c, k->node, k->count + 1, pos, k->up);
}

static int m(struct ctx *c, int node, size_t pos, const struct frame *k)
{
    const struct node *nd = &c->re->nodes[node];
    switch (nd->kind) {
    case K_CHAR:
    case K_ANY:
    case K_CLASS:
        return one(c, node, pos) && kont(c, pos + 1, k);
    case K_BOL:
    case K_EOL:
    case K_WORDB:
    case K_LOOK:
        return assertion(c, nd, pos) && kont(c, pos, k);
    case K_SEQ:
        if (nd->first < 0)
            return kont(c, pos, k);
        return m(c, nd->first, pos, &(struct frame){F_SEQ, c->re->nodes[nd->first].next, 0, 0, k});
    case K_ALT:
        for (int ch = nd->first; ch >= 0; ch = c->re->nodes[ch].next)
            if (m(c, ch, pos, k))
                return 1;
        return 0;
    case K_REPEAT: {
        if (c->re->nodes[nd->first].width != 1)
            return rep(c, node, 0, pos, k);
        size_t most = 0; /* how many times the body matches here, up to max */
        while (most < nd->max && one(c, nd->first, pos + most))
            most++;
        if (most < nd->min)
            return 0;
        if (nd->greedy) {
            for (size_t t = most + 1; t-- > nd->min;)
                if (kont(c, pos + t, k))
                    return 1;
        } else {
            for (size_t t = nd->min; t <= most; t++)
                if (kont(c, pos + t, k))
                    return 1;
        }
        return 0;
    }
    }
    return 0;
}

/* The first match starting at or after `from` (std::regex_search), or 0.
 *
 * When every match starts with an unbounded repeat of one character (\s+$), an attempt that
 * failed after the repeat ran from s to e has tried every end its continuation could have from
 * any start in (s, e - min]: those starts are skipped (a long run of spaces is not quadratic). */
static int search(struct ctx *c, size_t from, int continuous, size_t *ms)
{
    for (size_t s = from; s <= c->n; s++) {
        c->start = s;
        if (m(c, c->re->root, s, NULL)) {
            *ms = s;
            return 1;
        }
        if (continuous)
            break;
        if (c->re->lead >= 0 && !c->not_null) {
            const struct node *lead = &c->re->nodes[c->re->lead];
            size_t run = 0;
            while (one(c, lead->first, s + run))
                run++;
            if (run > lead->min)
                s += run - lead->min; /* (and the loop adds one) */
        }
    }
    return 0;
}

size_t qd_regex_split(const struct qd_regex *re, const uint32_t *text, size_t n, size_t *lens)
{
    struct ctx c = {.re = re, .text = text, .n = n};
    size_t count = 0, done = 0, from = 0, ms = 0;
    int found = search(&c, from, 0, &ms);
    while (found) {
        size_t me = c.end;
        if (ms > done)
            lens[count++] = ms - done;
        if (me > ms) /* (an empty match makes an empty piece in llama.cpp: no token comes of it) */
            lens[count++] = me - ms;
        done = me;
        if (me > ms) {
            found = search(&c, me, 0, &ms);
            continue;
        }
        /* after an empty match, std::regex_iterator first wants a non-empty one right there */
        if (me == n)
            break;
        c.not_null = 1;
        found = search(&c, me, 1, &ms);
        c.not_null = 0;
        if (!found)
            found = search(&c, me + 1, 0, &ms);
    }
    if (done < n)
        lens[count++] = n - done;
    return count;
}
