/*
 * module.c - modules, libraries and the functions they hold (their
 * attributes are function.c's, the JIT linker link.c's).
 *
 * An image is PTX text (the entries and their parameter lists are parsed),
 * a cubin (ELF: one function per .text.<name> section) or a fatbinary
 * holding either. Anything else is CUDA_ERROR_INVALID_IMAGE, and PTX newer
 * than this driver's ISA is CUDA_ERROR_UNSUPPORTED_PTX_VERSION. Nothing is
 * compiled: a kernel's run time follows the rule in launch.c.
 *
 * The runtime hands over its registered fatbins as a __fatBinC_Wrapper_t,
 * often compressed: such a module (and any fatbin with nothing readable in
 * it) is open, answering every function and global name asked for, since the
 * runtime asks only for names its program registered.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloctab.h"
#include "context.h"
#include "image.h"
#include "init.h"
#include "module.h"

#define PTX_ISA_MAJOR_MAX 9 /* the newest PTX ISA this driver version reads */
#define FATBIN_WRAPPER_MAGIC 0x466243b1u
/* What a __device__ variable of an open module holds: its size is in the
 * image, which is not read. */
#define OPEN_GLOBAL_SIZE (64u << 10)

/* __fatBinC_Wrapper_t, as nvcc emits it. */
struct fatbin_wrapper {
    uint32_t magic;
    uint32_t version;
    const void *data;
    const void *filename_or_fatbins;
};

struct module_global {
    char name[256];
    CUdeviceptr ptr;
    size_t size;
    struct module_global *next;
};

struct CUlib_st {
    uint32_t magic;
    struct CUmod_st *mod;
};

/* ---- PTX ---- */

/* A copy of the text with comments blanked out. */
static char *strip_comments(const char *src, size_t n)
{
    char *out = malloc(n + 1);
    if (!out)
        return NULL;
    size_t i = 0;
    while (i < n) {
        if (src[i] == '/' && i + 1 < n && src[i + 1] == '/') {
            while (i < n && src[i] != '\n')
                out[i++] = ' ';
        } else if (src[i] == '/' && i + 1 < n && src[i + 1] == '*') {
            while (i < n && !(src[i] == '*' && i + 1 < n && src[i + 1] == '/'))
                out[i++] = ' ';
            if (i < n)
                out[i++] = ' ';
            if (i < n)
                out[i++] = ' ';
        } else {
            out[i] = src[i];
            i++;
        }
    }
    out[n] = '\0';
    return out;
}

static int ident_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '$' || c == '.';
}

/* The directive `word` as a whole token in s, from p on. */
static char *find_directive(char *p, const char *word)
{
    size_t n = strlen(word);
    for (char *q = strstr(p, word); q; q = strstr(q + 1, word)) {
        int before = q == p || !ident_char(q[-1]);
        if (before && !ident_char(q[n]))
            return q;
    }
    return NULL;
}

static unsigned int type_size(const char *t)
{
    /* .u64 .s32 .b8 .f16 .pred ... */
    const char *d = t + 2;
    if (strncmp(t, ".pred", 5) == 0)
        return 1;
    int bits = atoi(d);
    return bits >= 8 ? (unsigned)bits / 8 : 0;
}

/* Parse "(.param .u64 a, .param .align 8 .b8 b[16])". */
static void parse_params(char *p, struct CUfunc_st *f)
{
    char *end = strchr(p, ')');
    if (!end)
        return;
    *end = '\0';
    unsigned int offset = 0;
    for (char *tok = strtok(p + 1, ","); tok && f->nparams < 64; tok = strtok(NULL, ",")) {
        if (!strstr(tok, ".param"))
            continue;
        unsigned int size = 0, align = 0, count = 1;
        char *a = strstr(tok, ".align");
        if (a)
            align = (unsigned)atoi(a + 6);
        for (char *t = strchr(tok, '.'); t; t = strchr(t + 1, '.')) {
            if ((t[1] == 'u' || t[1] == 's' || t[1] == 'b' || t[1] == 'f') && isdigit((unsigned char)t[2]))
                size = type_size(t);
        }
        char *br = strchr(tok, '[');
        if (br)
            count = (unsigned)atoi(br + 1);
        if (!align)
            align = size ? size : 1;
        offset = (offset + align - 1) / align * align;
        f->params[f->nparams].offset = offset;
        f->params[f->nparams].size = size * (count ? count : 1);
        offset += f->params[f->nparams].size;
        f->nparams++;
    }
    *end = ')';
}

static CUresult parse_ptx(const char *img, size_t n, struct CUmod_st *m)
{
    char *text = strip_comments(img, n);
    if (!text)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_SUCCESS;
    char *v = find_directive(text, ".version");
    int major = v ? atoi(v + 8) : 0;
    if (!v || !find_directive(text, ".target") || major <= 0) {
        rc = CUDA_ERROR_INVALID_PTX;
        goto out;
    }
    if (major > PTX_ISA_MAJOR_MAX) {
        rc = CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
        goto out;
    }
    for (char *e = find_directive(text, ".entry"); e; e = find_directive(e + 6, ".entry")) {
        char *p = e + 6;
        while (isspace((unsigned char)*p))
            p++;
        size_t len = 0;
        while (ident_char(p[len]))
            len++;
        if (len == 0 || len >= sizeof m->funcs[0].name) {
            rc = CUDA_ERROR_INVALID_PTX;
            goto out;
        }
        struct CUfunc_st *f = &m->funcs[m->nfuncs];
        memcpy(f->name, p, len);
        f->name[len] = '\0';
        p += len;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '(')
            parse_params(p, f);
        m->nfuncs++;
    }
    m->nvars = image_ptx_vars(text, &m->vars);
    if (m->nvars < 0) {
        m->nvars = 0;
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
out:
    free(text);
    return rc;
}

static int count_entries(const char *img, size_t n)
{
    int c = 0;
    for (const char *p = img; (p = memmem(p, (size_t)(img + n - p), ".entry", 6)); p += 6)
        c++;
    return c;
}

/* ---- cubin (ELF) ---- */

static int parse_elf(const unsigned char *img, size_t n, struct CUmod_st *m, int count_only)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    if (n < sizeof *eh || eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_shoff == 0 ||
        eh->e_shoff > n || eh->e_shnum > (n - eh->e_shoff) / sizeof(Elf64_Shdr) ||
        eh->e_shstrndx >= eh->e_shnum)
        return -1;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    const Elf64_Shdr *strs = &sh[eh->e_shstrndx];
    if (strs->sh_offset > n || strs->sh_size > n - strs->sh_offset)
        return -1;
    const char *names = (const char *)img + strs->sh_offset;
    int c = 0;
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_name >= strs->sh_size)
            continue;
        const char *name = names + sh[i].sh_name;
        if (strncmp(name, ".text.", 6) != 0 || !name[6])
            continue;
        if (!count_only) {
            struct CUfunc_st *f = &m->funcs[m->nfuncs++];
            snprintf(f->name, sizeof f->name, "%s", name + 6);
            f->nparams = -1; /* not read from .nv.info */
        }
        c++;
    }
    return c;
}

/* ---- loading ---- */

static void init_funcs(struct CUmod_st *m)
{
    for (int i = 0; i < m->nfuncs; i++) {
        struct CUfunc_st *f = &m->funcs[i];
        f->magic = MAGIC_FUNC;
        f->mod = m;
        f->spin = strncmp(f->name, "vgpu_spin", 9) == 0;
    }
}

/* Where the image ends: PTX is NUL-terminated text; an ELF gives its size. */
static size_t image_size(const unsigned char *img)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    if (memcmp(img, ELFMAG, SELFMAG) == 0)
        return (size_t)(eh->e_shoff + (uint64_t)eh->e_shnum * eh->e_shentsize);
    return strlen((const char *)img);
}

static CUresult new_open_module(CUcontext ctx, struct CUmod_st **out)
{
    struct CUmod_st *m = cu_obj_new(sizeof *m, MAGIC_MODULE);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->ctx = ctx;
    m->open = 1;
    *out = m;
    return CUDA_SUCCESS;
}

static CUresult load_bytes(const unsigned char *img, size_t n, int is_elf, CUcontext ctx,
                           struct CUmod_st **out);

static CUresult load_image(const void *image, CUcontext ctx, struct CUmod_st **out)
{
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *img = image;
    uint32_t magic;
    memcpy(&magic, img, 4);
    if (magic == FATBIN_WRAPPER_MAGIC) {
        const struct fatbin_wrapper *w = image;
        if ((w->version != 1 && w->version != 2) || (w->version == 1 && !w->data))
            return CUDA_ERROR_INVALID_IMAGE;
        return new_open_module(ctx, out);
    }
    if (magic == FATBIN_MAGIC) {
        /* the entry the device would run, decompressed; a fatbinary with
         * nothing readable in it (zstd-compressed entries) loads open */
        unsigned char *entry;
        size_t n;
        int kind = image_fatbin_entry(img, SIM_CC_MAJOR * 10 + SIM_CC_MINOR, &entry, &n);
        if (kind < 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        if (kind == IMAGE_NONE)
            return new_open_module(ctx, out);
        CUresult rc = load_bytes(entry, n, kind == IMAGE_ELF, ctx, out);
        free(entry);
        return rc == CUDA_SUCCESS || rc == CUDA_ERROR_OUT_OF_MEMORY ? rc
                                                                    : new_open_module(ctx, out);
    }
    int is_elf = memcmp(img, ELFMAG, SELFMAG) == 0;
    return load_bytes(img, image_size(img), is_elf, ctx, out);
}

/* A module from a cubin or PTX text of n bytes. */
static CUresult load_bytes(const unsigned char *img, size_t n, int is_elf, CUcontext ctx,
                           struct CUmod_st **out)
{
    int count;
    if (is_elf) {
        count = parse_elf(img, n, NULL, 1);
        if (count < 0)
            return CUDA_ERROR_INVALID_IMAGE;
    } else {
        for (size_t i = 0; i < n; i++)
            if (!isprint(img[i]) && !isspace(img[i]))
                return CUDA_ERROR_INVALID_IMAGE;
        if (!memmem(img, n, ".version", 8) && !memmem(img, n, ".entry", 6))
            return CUDA_ERROR_INVALID_IMAGE;
        count = count_entries((const char *)img, n);
    }
    struct CUmod_st *m = cu_obj_new(sizeof *m, MAGIC_MODULE);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->ctx = ctx;
    m->funcs = calloc((size_t)count + 1, sizeof *m->funcs);
    if (!m->funcs) {
        cu_obj_del(m, sizeof *m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = CUDA_SUCCESS;
    if (is_elf) {
        if (parse_elf(img, n, m, 0) < 0)
            rc = CUDA_ERROR_INVALID_IMAGE;
        else if ((m->nvars = image_elf_vars(img, n, &m->vars)) < 0)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        rc = parse_ptx((const char *)img, n, m);
    }
    if (rc) {
        image_vars_free(m->vars, m->nvars > 0 ? m->nvars : 0);
        free(m->funcs);
        cu_obj_del(m, sizeof *m);
        return rc;
    }
    init_funcs(m);
    *out = m;
    return CUDA_SUCCESS;
}

static void unload(struct CUmod_st *m)
{
    for (int i = 0; i < m->nfuncs; i++)
        __atomic_store_n(&m->funcs[i].magic, DEAD, __ATOMIC_RELEASE);
    for (int i = 0; i < m->nextra; i++)
        __atomic_store_n(&m->extra[i]->magic, DEAD, __ATOMIC_RELEASE);
    while (m->globals) {
        struct module_global *g = m->globals;
        m->globals = g->next;
        mem_free(g->ptr, ALLOC_GLOBAL);
        free(g);
    }
    image_vars_free(m->vars, m->nvars);
    m->vars = NULL;
    m->nvars = 0;
    /* funcs stay allocated: a stale CUfunction must still read as invalid */
    cu_obj_del(m, sizeof *m);
}

void *cu_module_read_file(const char *path, CUresult *rc)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        *rc = CUDA_ERROR_FILE_NOT_FOUND;
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        *rc = CUDA_ERROR_INVALID_IMAGE;
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    *rc = CUDA_SUCCESS;
    return buf;
}

VGPU_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    CURRENT_CONTEXT(ctx);
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    return load_image(image, ctx, module);
}

/* Answer the JIT's log options: nothing was logged. */
void cu_module_empty_logs(unsigned int n, CUjit_option *opts, void **values)
{
    if (!opts || !values)
        return;
    for (unsigned int i = 0; i < n; i++) {
        if ((opts[i] == CU_JIT_INFO_LOG_BUFFER || opts[i] == CU_JIT_ERROR_LOG_BUFFER) && values[i])
            *(char *)values[i] = '\0';
        if (opts[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ||
            opts[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
            values[i] = (void *)(uintptr_t)0;
    }
}

VGPU_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n,
                                        CUjit_option *opts, void **values)
{
    CUresult rc = cuModuleLoadData(module, image);
    cu_module_empty_logs(n, opts, values);
    return rc;
}

VGPU_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatbin)
{
    return cuModuleLoadData(module, fatbin);
}

VGPU_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *path)
{
    CURRENT_CONTEXT(ctx);
    CUresult rc = CUDA_SUCCESS;
    if (!module || !path)
        return CUDA_ERROR_INVALID_VALUE;
    void *img = cu_module_read_file(path, &rc);
    if (!img)
        return rc;
    rc = load_image(img, ctx, module);
    free(img);
    return rc;
}

VGPU_EXPORT CUresult cuModuleUnload(CUmodule m)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_obj_is(m, MAGIC_MODULE) || m->lib)
        return CUDA_ERROR_INVALID_HANDLE;
    unload(m);
    return CUDA_SUCCESS;
}

static CUresult get_function(CUfunction *out, struct CUmod_st *m, const char *name)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || !name)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_HANDLE(m, MAGIC_MODULE);
    for (int i = 0; i < m->nfuncs; i++) {
        if (strcmp(m->funcs[i].name, name) == 0) {
            *out = &m->funcs[i];
            return CUDA_SUCCESS;
        }
    }
    if (!m->open || strlen(name) >= sizeof m->funcs[0].name) {
        const char *log = getenv("VGPU_SIM_DARKAPI_LOG");
        if (log && *log && strcmp(log, "0") != 0)
            fprintf(stderr, "vgpu-sim: module: no function %s in a module of %d\n", name,
                    m->nfuncs);
        return CUDA_ERROR_NOT_FOUND;
    }
    pthread_mutex_lock(&cu_lock);
    CUresult rc = CUDA_SUCCESS;
    struct CUfunc_st *f = NULL;
    for (int i = 0; i < m->nextra && !f; i++)
        if (strcmp(m->extra[i]->name, name) == 0)
            f = m->extra[i];
    if (!f) {
        struct CUfunc_st **grown = realloc(m->extra, sizeof *grown * (size_t)(m->nextra + 1));
        f = grown ? calloc(1, sizeof *f) : NULL;
        if (grown)
            m->extra = grown;
        if (f) {
            snprintf(f->name, sizeof f->name, "%s", name);
            f->magic = MAGIC_FUNC;
            f->mod = m;
            f->nparams = -1; /* the image was not read */
            f->spin = strncmp(f->name, "vgpu_spin", 9) == 0;
            m->extra[m->nextra++] = f;
        } else {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&cu_lock);
    if (f)
        *out = f;
    return rc;
}

CUresult cu_module_from_fatbin(CUmodule *mod, const void *image)
{
    CURRENT_CONTEXT(ctx);
    if (!mod || !image)
        return CUDA_ERROR_INVALID_VALUE;
    return load_image(image, ctx, mod);
}

int cu_module_functions(CUmodule mod, void (*fn)(void *, CUfunction), void *arg)
{
    if (!cu_obj_is(mod, MAGIC_MODULE))
        return -1;
    for (int i = 0; i < mod->nfuncs; i++)
        fn(arg, &mod->funcs[i]);
    return mod->nfuncs;
}

/* A __device__ or __constant__ variable, allocated in the current context
 * on first use (not charged: it is part of the module's image) and holding
 * its initial value. A module read from PTX or a cubin has the variables
 * its image declares; an open module makes each name asked for (its size is
 * in the image, which could not be read: OPEN_GLOBAL_SIZE, zeroed). */
static CUresult get_global(CUdeviceptr *dptr, size_t *bytes, struct CUmod_st *m, const char *name)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    CHECK_HANDLE(m, MAGIC_MODULE);
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    if (strlen(name) >= sizeof m->globals->name)
        return CUDA_ERROR_NOT_FOUND;
    const struct image_var *decl = NULL;
    for (int i = 0; i < m->nvars && !decl; i++)
        if (strcmp(m->vars[i].name, name) == 0)
            decl = &m->vars[i];
    if (!m->open && !decl)
        return CUDA_ERROR_NOT_FOUND;
    CURRENT_CONTEXT(ctx);
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&cu_lock);
    struct module_global *g = m->globals;
    while (g && strcmp(g->name, name) != 0)
        g = g->next;
    if (!g) {
        size_t size = decl ? decl->size : OPEN_GLOBAL_SIZE;
        g = calloc(1, sizeof *g);
        uintptr_t p = 0;
        rc = g ? mem_alloc(ctx, size, ALLOC_GLOBAL, 0, &p) : CUDA_ERROR_OUT_OF_MEMORY;
        if (rc == CUDA_SUCCESS) {
            snprintf(g->name, sizeof g->name, "%s", name);
            g->ptr = p;
            g->size = size;
            if (decl && decl->init)
                memcpy((void *)p, decl->init, size);
            g->next = m->globals;
            m->globals = g;
        } else {
            free(g);
            g = NULL;
        }
    }
    pthread_mutex_unlock(&cu_lock);
    if (!g)
        return rc;
    if (dptr)
        *dptr = g->ptr;
    if (bytes)
        *bytes = g->size;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    return get_function(f, m, name);
}

VGPU_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule m,
                                          const char *name)
{
    return get_global(dptr, bytes, m, name);
}

VGPU_EXPORT CUresult cuModuleGetLoadingMode(int *mode)
{
    ANSWER(mode, 2); /* CU_MODULE_LAZY_LOADING, the default since CUDA 12.2 */
}

VGPU_EXPORT CUresult cuModuleGetFunctionCount(unsigned int *count, CUmodule m)
{
    CHECK_HANDLE(m, MAGIC_MODULE);
    ANSWER(count, (unsigned)m->nfuncs); /* an open module's names are not known */
}

VGPU_EXPORT CUresult cuModuleEnumerateFunctions(CUfunction *fns, unsigned int n, CUmodule m)
{
    CHECK_HANDLE(m, MAGIC_MODULE);
    if (!fns || n < (unsigned)m->nfuncs)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < m->nfuncs; i++)
        fns[i] = &m->funcs[i];
    return CUDA_SUCCESS;
}

/* ---- libraries (context-independent modules) ---- */

VGPU_EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jopts,
                                       void **jvals, unsigned int nj, void *lopts, void **lvals,
                                       unsigned int nl)
{
    (void)lopts;
    (void)lvals;
    (void)nl;
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!lib)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *m;
    CUresult rc = load_image(code, NULL, &m);
    cu_module_empty_logs(nj, jopts, jvals);
    if (rc)
        return rc;
    struct CUlib_st *l = cu_obj_new(sizeof *l, MAGIC_LIBRARY);
    l->mod = m;
    m->lib = l;
    *lib = l;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, CUjit_option *jopts,
                                           void **jvals, unsigned int nj, void *lopts,
                                           void **lvals, unsigned int nl)
{
    if (!path)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc;
    void *img = cu_module_read_file(path, &rc);
    if (!img)
        return rc;
    rc = cuLibraryLoadData(lib, img, jopts, jvals, nj, lopts, lvals, nl);
    free(img);
    return rc;
}

VGPU_EXPORT CUresult cuLibraryUnload(CUlibrary lib)
{
    CHECK_HANDLE(lib, MAGIC_LIBRARY);
    unload(lib->mod);
    cu_obj_del(lib, sizeof *lib);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name)
{
    CHECK_HANDLE(lib, MAGIC_LIBRARY);
    return get_function((CUfunction *)k, lib->mod, name);
}

VGPU_EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary lib,
                                        const char *name)
{
    CHECK_HANDLE(lib, MAGIC_LIBRARY);
    return get_global(dptr, bytes, lib->mod, name);
}

VGPU_EXPORT CUresult cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUlibrary lib,
                                         const char *name)
{
    return cuLibraryGetGlobal(dptr, bytes, lib, name);
}

VGPU_EXPORT CUresult cuKernelGetLibrary(CUlibrary *lib, CUkernel k)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!lib)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_HANDLE(k, MAGIC_FUNC);
    struct CUfunc_st *f = (struct CUfunc_st *)k;
    if (!f->mod->lib)
        return CUDA_ERROR_INVALID_HANDLE;
    *lib = f->mod->lib;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuLibraryGetModule(CUmodule *m, CUlibrary lib)
{
    CHECK_HANDLE(lib, MAGIC_LIBRARY);
    ANSWER(m, lib->mod);
}

VGPU_EXPORT CUresult cuLibraryGetKernelCount(unsigned int *count, CUlibrary lib)
{
    CHECK_HANDLE(lib, MAGIC_LIBRARY);
    return cuModuleGetFunctionCount(count, lib->mod);
}

VGPU_EXPORT CUresult cuLibraryEnumerateKernels(CUkernel *ks, unsigned int n, CUlibrary lib)
{
    CHECK_HANDLE(lib, MAGIC_LIBRARY);
    return cuModuleEnumerateFunctions((CUfunction *)ks, n, lib->mod);
}

VGPU_EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k)
{
    CURRENT_CONTEXT(ctx);
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_HANDLE(k, MAGIC_FUNC);
    *f = (CUfunction)k;
    return CUDA_SUCCESS;
}
