/*
 * image.c - reading device images: a fatbinary's entries (which one the
 * driver loads, decompressed), and the variables a module declares.
 *
 * A fatbinary is a header {u32 magic, u16 version, u16 header size, u64
 * size of the entries} followed by entries, each a header and its payload:
 * {u16 kind (1 PTX, 2 ELF), u16 version, u32 header size, u32 payload size,
 * u32, u32 compressed size, u32, u32, u32 sm (90 for 9.0), u32, u32, u64
 * flags (0x2000: LZ4, 0x8000: zstd), u64, u64 uncompressed size}. The layout
 * is public reverse engineering (ZLUDA, vosen/ZLUDA, MIT/Apache-2.0:
 * cuda_types/src/dark_api.rs, dark_api/src/fatbin.rs); cuFFT's images, for
 * one, are LZ4-compressed PTX. zstd (what nvcc's --compress-mode=size
 * writes) is not read here: such an entry leaves the image unreadable.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"

#define FATBIN_KIND_PTX 1
#define FATBIN_KIND_ELF 2
#define FATBIN_LZ4 0x2000ull
#define FATBIN_ZSTD 0x8000ull
#define MAX_PAYLOAD (256u << 20) /* no entry of a real fatbinary comes near */

struct entry {
    uint16_t kind, version;
    uint32_t header_size, payload_size, unknown0, compressed_size, unknown1, unknown2;
    uint32_t sm, bits, unknown3;
    uint64_t flags, unknown5, uncompressed;
};

/* ---- LZ4 ---- */

/* A length whose 4-bit field is full goes on in bytes at src[*i]: each
 * added, until one under 255. -1 if src (n bytes) ends first. */
static int lz4_more(const unsigned char *src, size_t n, size_t *i, size_t *len)
{
    unsigned char b;
    do {
        if (*i >= n)
            return -1;
        b = src[(*i)++];
        *len += b;
    } while (b == 255);
    return 0;
}

long image_lz4(const unsigned char *src, size_t n, unsigned char *dst, size_t cap)
{
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned token = src[i++];
        size_t lit = token >> 4;
        if (lit == 15 && lz4_more(src, n, &i, &lit) < 0)
            return -1;
        if (lit > n - i || lit > cap - o)
            return -1;
        memcpy(dst + o, src + i, lit);
        i += lit;
        o += lit;
        if (i == n)
            break; /* the last sequence has literals only */
        if (n - i < 2)
            return -1;
        size_t off = (size_t)src[i] | (size_t)src[i + 1] << 8;
        i += 2;
        if (off == 0 || off > o)
            return -1;
        size_t len = (token & 15u) + 4;
        if ((token & 15u) == 15 && lz4_more(src, n, &i, &len) < 0)
            return -1;
        if (len > cap - o)
            return -1;
        for (size_t k = 0; k < len; k++, o++) /* may overlap: byte by byte */
            dst[o] = dst[o - off];
    }
    return (long)o;
}

/* ---- fatbinary entries ---- */

/* Better for a device of `sm`: a cubin for it beats PTX, PTX the device can
 * JIT (not newer) beats anything else, the newer such PTX the better. */
static int rank(const struct entry *e, int sm)
{
    if (e->kind == FATBIN_KIND_ELF && (int)e->sm == sm)
        return 3000;
    if (e->kind == FATBIN_KIND_PTX && (int)e->sm <= sm)
        return 2000 + (int)e->sm;
    if (e->kind == FATBIN_KIND_ELF || e->kind == FATBIN_KIND_PTX)
        return 1;
    return 0;
}

static int entry_bytes(const unsigned char *payload, const struct entry *e, unsigned char **out,
                       size_t *len)
{
    unsigned char *buf;
    size_t n;
    if (e->flags & FATBIN_ZSTD)
        return IMAGE_NONE;
    if (e->flags & FATBIN_LZ4) {
        if (e->uncompressed == 0 || e->uncompressed > MAX_PAYLOAD)
            return IMAGE_NONE;
        buf = malloc((size_t)e->uncompressed + 1);
        if (!buf)
            return -1;
        long got = image_lz4(payload, e->compressed_size, buf, (size_t)e->uncompressed);
        if (got < 0) {
            free(buf);
            return IMAGE_NONE;
        }
        n = (size_t)got;
    } else {
        n = e->payload_size;
        buf = malloc(n + 1);
        if (!buf)
            return -1;
        memcpy(buf, payload, n);
    }
    buf[n] = '\0';
    if (e->kind == FATBIN_KIND_PTX)
        n = strlen((char *)buf); /* the payload is padded with NULs */
    *out = buf;
    *len = n;
    return e->kind == FATBIN_KIND_ELF ? IMAGE_ELF : IMAGE_PTX;
}

int image_fatbin_entry(const unsigned char *fatbin, int sm, unsigned char **out, size_t *len)
{
    uint32_t magic;
    uint16_t hsize;
    uint64_t total;
    memcpy(&magic, fatbin, 4);
    memcpy(&hsize, fatbin + 6, 2);
    memcpy(&total, fatbin + 8, 8);
    if (magic != FATBIN_MAGIC || hsize < 16 || total > MAX_PAYLOAD)
        return IMAGE_NONE;
    const unsigned char *p = fatbin + hsize, *end = p + total;
    const unsigned char *best = NULL;
    struct entry be = {0};
    int best_rank = 0;
    while ((size_t)(end - p) >= sizeof(struct entry)) {
        struct entry e;
        memcpy(&e, p, sizeof e);
        size_t stride = (size_t)e.header_size +
                        (e.payload_size > e.compressed_size ? e.payload_size : e.compressed_size);
        if (e.header_size < sizeof e || stride > (size_t)(end - p))
            break;
        size_t body = stride - e.header_size;
        int readable = !(e.flags & FATBIN_ZSTD) &&
                       ((e.flags & FATBIN_LZ4) ? e.compressed_size <= body
                                               : e.payload_size <= body);
        int r = readable ? rank(&e, sm) : 0;
        if (r > best_rank) {
            best_rank = r;
            best = p + e.header_size;
            be = e;
        }
        p += stride;
    }
    if (!best)
        return IMAGE_NONE;
    return entry_bytes(best, &be, out, len);
}

/* ---- variables ---- */

static int push_var(struct image_var **vars, int *n, int *cap, const char *name, size_t nlen,
                    size_t size, unsigned char *init)
{
    if (nlen == 0 || nlen >= sizeof(*vars)->name || size == 0) {
        free(init);
        return 0;
    }
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 8;
        struct image_var *t = realloc(*vars, (size_t)c * sizeof *t);
        if (!t) {
            free(init);
            return -1;
        }
        *vars = t;
        *cap = c;
    }
    struct image_var *v = &(*vars)[(*n)++];
    memcpy(v->name, name, nlen);
    v->name[nlen] = '\0';
    v->size = size;
    v->init = init;
    return 0;
}

void image_vars_free(struct image_var *vars, int n)
{
    for (int i = 0; i < n; i++)
        free(vars[i].init);
    free(vars);
}

static int ident(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '$' || c == '.' || c == '%';
}

/* The size in bytes of a PTX fundamental type (.u32, .f64, .b8, .pred), 0
 * if `t` is none. */
static unsigned ptx_type_size(const char *t, size_t n)
{
    if (n == 5 && strncmp(t, ".pred", 5) == 0)
        return 1;
    if (n < 3 || t[0] != '.' || !strchr("usbf", t[1]))
        return 0;
    for (size_t i = 2; i < n; i++)
        if (!isdigit((unsigned char)t[i]))
            return 0;
    int bits = atoi(t + 2);
    return bits == 8 || bits == 16 || bits == 32 || bits == 64 || bits == 128 ? (unsigned)bits / 8
                                                                               : 0;
}

/* One initializer element into `size` bytes (little-endian): integers, and
 * floats as PTX writes them (0fXXXXXXXX, 0dXXXXXXXXXXXXXXXX, or decimal). An
 * address (generic(x), a symbol) is 0 here. */
static void put_element(unsigned char *dst, unsigned size, char ftype, const char *tok)
{
    uint64_t bits = 0;
    if ((tok[0] == '0' && (tok[1] == 'f' || tok[1] == 'F' || tok[1] == 'd' || tok[1] == 'D')) &&
        isxdigit((unsigned char)tok[2])) {
        bits = strtoull(tok + 2, NULL, 16);
    } else if (ftype == 'f' && (isdigit((unsigned char)tok[0]) || tok[0] == '-' ||
                                tok[0] == '+' || tok[0] == '.')) {
        double d = strtod(tok, NULL);
        if (size == 4) {
            float f = (float)d;
            uint32_t u;
            memcpy(&u, &f, 4);
            bits = u;
        } else if (size == 8) {
            memcpy(&bits, &d, 8);
        }
    } else if (tok[0] == '-') {
        bits = (uint64_t)strtoll(tok, NULL, 0);
    } else if (isdigit((unsigned char)tok[0]) || tok[0] == '+') {
        bits = strtoull(tok, NULL, 0);
    }
    for (unsigned i = 0; i < size && i < 8; i++)
        dst[i] = (unsigned char)(bits >> (8 * i));
}

/* Count the elements of an initializer `{...}` (nested braces flattened) or
 * a single value. */
static size_t count_elements(const char *p, const char *end)
{
    size_t c = 0;
    int in = 0;
    for (; p < end; p++) {
        if (*p == '{' || *p == '}' || *p == ',' || isspace((unsigned char)*p)) {
            in = 0;
        } else if (!in) {
            in = 1;
            c++;
            if (strncmp(p, "generic(", 8) == 0) { /* one element, with parentheses */
                const char *q = memchr(p, ')', (size_t)(end - p));
                if (q)
                    p = q;
            }
        }
    }
    return c;
}

/* Parse one module-scope declaration [s, e) (no ';'), a .global or .const
 * one, into vars. */
static int ptx_decl(const char *s, const char *e, struct image_var **vars, int *n, int *cap)
{
    unsigned elem = 0, vec = 1;
    char ftype = 0;
    const char *p = s;
    const char *name = NULL;
    size_t nlen = 0;
    int space = 0;
    while (p < e) {
        while (p < e && isspace((unsigned char)*p))
            p++;
        const char *t = p;
        while (p < e && ident(*p))
            p++;
        size_t tl = (size_t)(p - t);
        if (tl == 0)
            break;
        if ((tl == 7 && strncmp(t, ".global", 7) == 0) || (tl == 6 && strncmp(t, ".const", 6) == 0))
            space = 1;
        else if (tl == 7 && strncmp(t, ".extern", 7) == 0)
            return 0; /* defined elsewhere */
        else if (tl == 6 && strncmp(t, ".align", 6) == 0) {
            while (p < e && isspace((unsigned char)*p))
                p++;
            while (p < e && isdigit((unsigned char)*p))
                p++;
        } else if (tl == 3 && (strncmp(t, ".v2", 3) == 0 || strncmp(t, ".v4", 3) == 0 ||
                               strncmp(t, ".v8", 3) == 0)) {
            vec = (unsigned)(t[2] - '0');
        } else if (ptx_type_size(t, tl)) {
            elem = ptx_type_size(t, tl);
            ftype = t[1];
        } else if (t[0] != '.') {
            name = t;
            nlen = tl;
            break;
        }
        /* other qualifiers (.visible, .weak, .common, .attribute(...)) */
        if (p < e && *p == '(') {
            const char *q = memchr(p, ')', (size_t)(e - p));
            p = q ? q + 1 : e;
        }
    }
    if (!space || !name || !elem)
        return 0; /* .texref, .samplerref, .surfref, or not a variable */
    unsigned esize = elem * vec;
    size_t count = 1;
    int open_dim = 0;
    while (p < e && *p == '[') {
        const char *q = memchr(p, ']', (size_t)(e - p));
        if (!q)
            return 0;
        const char *d = p + 1;
        while (d < q && isspace((unsigned char)*d))
            d++;
        if (d == q)
            open_dim = 1;
        else
            count *= strtoull(d, NULL, 0);
        p = q + 1;
        while (p < e && isspace((unsigned char)*p))
            p++;
    }
    const char *eq = p < e ? memchr(p, '=', (size_t)(e - p)) : NULL;
    size_t elems = eq ? count_elements(eq + 1, e) : 0;
    if (open_dim)
        count = (elems + vec - 1) / vec;
    if (count == 0 || count > (256u << 20) / esize)
        return 0;
    size_t size = count * esize;
    unsigned char *init = NULL;
    if (eq && elems) {
        init = calloc(1, size);
        if (!init)
            return -1;
        /* elements in order, each of the fundamental type's size */
        size_t k = 0, max = size / elem;
        const char *q = eq + 1;
        char tok[128];
        while (q < e && k < max) {
            while (q < e && (*q == '{' || *q == '}' || *q == ',' || isspace((unsigned char)*q)))
                q++;
            const char *t = q;
            while (q < e && !(*q == '{' || *q == '}' || *q == ',' || isspace((unsigned char)*q)))
                q++;
            size_t tl = (size_t)(q - t);
            if (tl == 0)
                break;
            if (tl >= sizeof tok)
                tl = sizeof tok - 1;
            memcpy(tok, t, tl);
            tok[tl] = '\0';
            put_element(init + k * elem, elem, ftype, tok);
            k++;
        }
    }
    return push_var(vars, n, cap, name, nlen, size, init);
}

/* Blank out the module directives that end with the line, not with ';'
 * (.version, .target, .address_size, .file). */
static char *blank_line_directives(const char *text)
{
    char *t = strdup(text);
    if (!t)
        return NULL;
    static const char *const words[] = {".version", ".target", ".address_size", ".file"};
    for (char *line = t; *line;) {
        char *q = line;
        while (*q == ' ' || *q == '\t')
            q++;
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
            size_t n = strlen(words[i]);
            if (strncmp(q, words[i], n) == 0 && !ident(q[n])) {
                while (*q && *q != '\n')
                    *q++ = ' ';
                break;
            }
        }
        char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return t;
}

int image_ptx_vars(const char *source, struct image_var **out)
{
    struct image_var *vars = NULL;
    int n = 0, cap = 0;
    char *text = blank_line_directives(source);
    if (!text)
        return -1;
    const char *p = text;
    while (*p) {
        while (*p && (isspace((unsigned char)*p) || *p == ';'))
            p++;
        if (!*p)
            break;
        /* one statement at module scope: up to ';', or a body in braces
         * (a function's; an initializer's braces follow '=') */
        const char *s = p;
        int depth = 0, seen_eq = 0;
        while (*p) {
            if (*p == '=' && depth == 0)
                seen_eq = 1;
            if (*p == '{') {
                if (depth == 0 && !seen_eq)
                    break; /* a function body */
                depth++;
            } else if (*p == '}') {
                depth--;
            } else if (*p == ';' && depth <= 0) {
                break;
            }
            p++;
        }
        if (*p == '{') { /* skip the body */
            int d = 0;
            do {
                if (*p == '{')
                    d++;
                else if (*p == '}')
                    d--;
                p++;
            } while (*p && d > 0);
            continue;
        }
        if (ptx_decl(s, p, &vars, &n, &cap) < 0) {
            image_vars_free(vars, n);
            free(text);
            return -1;
        }
        if (*p)
            p++;
    }
    free(text);
    *out = vars;
    return n;
}

int image_elf_vars(const unsigned char *img, size_t n, struct image_var **out)
{
    struct image_var *vars = NULL;
    int nv = 0, cap = 0;
    *out = NULL;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    if (n < sizeof *eh || eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_shoff == 0 ||
        eh->e_shoff > n || eh->e_shnum > (n - eh->e_shoff) / sizeof(Elf64_Shdr) ||
        eh->e_shstrndx >= eh->e_shnum)
        return 0;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    const Elf64_Shdr *shstr = &sh[eh->e_shstrndx];
    if (shstr->sh_offset > n || shstr->sh_size > n - shstr->sh_offset)
        return 0;
    const char *secnames = (const char *)img + shstr->sh_offset;
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum ||
            sh[i].sh_entsize != sizeof(Elf64_Sym) || sh[i].sh_offset > n ||
            sh[i].sh_size > n - sh[i].sh_offset)
            continue;
        const Elf64_Shdr *strs = &sh[sh[i].sh_link];
        if (strs->sh_offset > n || strs->sh_size > n - strs->sh_offset)
            continue;
        const char *names = (const char *)img + strs->sh_offset;
        const Elf64_Sym *sym = (const Elf64_Sym *)(img + sh[i].sh_offset);
        size_t count = sh[i].sh_size / sizeof *sym;
        for (size_t k = 0; k < count; k++) {
            const Elf64_Sym *s = &sym[k];
            if (ELF64_ST_TYPE(s->st_info) != STT_OBJECT || s->st_size == 0 ||
                s->st_shndx == SHN_UNDEF || s->st_shndx >= eh->e_shnum ||
                s->st_name >= strs->sh_size)
                continue;
            const Elf64_Shdr *sec = &sh[s->st_shndx];
            const char *secname = sec->sh_name < shstr->sh_size ? secnames + sec->sh_name : "";
            if (strncmp(secname, ".nv.global", 10) != 0 &&
                strncmp(secname, ".nv.constant", 12) != 0)
                continue;
            const char *name = names + s->st_name;
            size_t nlen = strnlen(name, strs->sh_size - s->st_name);
            if (s->st_size > (256u << 20))
                continue;
            unsigned char *init = NULL;
            if (sec->sh_type != SHT_NOBITS && sec->sh_offset <= n &&
                s->st_value <= sec->sh_size && s->st_size <= sec->sh_size - s->st_value &&
                sec->sh_offset + s->st_value + s->st_size <= n) {
                init = malloc(s->st_size);
                if (!init) {
                    image_vars_free(vars, nv);
                    return -1;
                }
                memcpy(init, img + sec->sh_offset + s->st_value, s->st_size);
            }
            if (push_var(&vars, &nv, &cap, name, nlen, s->st_size, init) < 0) {
                image_vars_free(vars, nv);
                return -1;
            }
        }
    }
    *out = vars;
    return nv;
}
