/*
 * interpose.c - how calls reach the hook: exported symbols (programs linked
 * against libcuda.so.1 / libnvidia-ml.so.1), dlsym (runtimes that dlopen the
 * driver; the exported dlsym is dlsym_entry.S, which asks vgpu_dlsym_route
 * here), and cuGetProcAddress / cuGetProcAddress_v2 (CUDA 11.3+ runtimes and
 * cuda-bindings fetch every entry point through it).
 *
 * Everything here is generated from hooks.def. For a wrapped name the hook
 * asks the real driver first, then swaps the answer for its wrapper only
 * when the answer is that very driver symbol: each wrapper forwards to
 * exactly the versioned entry point (_v2, _ptsz, ...) the driver chose.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "hook.h"

/* ---- exported symbols: thin jumps into hook_<sym>() ---------------------- */
#define CU_HOOK(base, sym, params, args) \
    VGPU_EXPORT CUresult sym params { return hook_##sym args; } \
    extern __typeof__(sym) vgpu_self_##sym \
        __attribute__((alias(#sym), visibility("hidden")));
#define NVML_HOOK(sym, params, args) \
    VGPU_EXPORT nvmlReturn_t sym params { return hook_##sym args; } \
    extern __typeof__(sym) vgpu_self_##sym \
        __attribute__((alias(#sym), visibility("hidden")));
#include "hooks.def"

/* ---- stubs for entry points the real library lacks ------------------------ */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define CU_HOOK(base, sym, params, args) \
    static CUresult missing_##sym params { return CUDA_ERROR_NOT_FOUND; }
#define CU_REAL(sym, params) \
    static CUresult missing_##sym params { return CUDA_ERROR_NOT_FOUND; }
#define NVML_HOOK(sym, params, args) \
    static nvmlReturn_t missing_##sym params { return NVML_ERROR_FUNCTION_NOT_FOUND; }
#define NVML_REAL(sym, params) \
    static nvmlReturn_t missing_##sym params { return NVML_ERROR_FUNCTION_NOT_FOUND; }
#include "hooks.def"
#pragma GCC diagnostic pop

/* ---- the table ---------------------------------------------------------- */
enum { LIB_CUDA = 0, LIB_NVML = 1 };

struct hook_entry {
    const char *base;   /* name given to cuGetProcAddress (CUDA hooks) */
    const char *sym;    /* exported, versioned name */
    void *self;         /* our wrapper; NULL for CU_REAL / NVML_REAL */
    void *missing;      /* stub used when the real library lacks sym */
    int lib;
};

static const struct hook_entry table[VGPU_H_COUNT] = {
#define CU_HOOK(base, sym, params, args) \
    [VGPU_H_##sym] = {#base, #sym, (void *)vgpu_self_##sym, (void *)missing_##sym, LIB_CUDA},
#define NVML_HOOK(sym, params, args) \
    [VGPU_H_##sym] = {#sym, #sym, (void *)vgpu_self_##sym, (void *)missing_##sym, LIB_NVML},
#define CU_REAL(sym, params) \
    [VGPU_H_##sym] = {#sym, #sym, NULL, (void *)missing_##sym, LIB_CUDA},
#define NVML_REAL(sym, params) \
    [VGPU_H_##sym] = {#sym, #sym, NULL, (void *)missing_##sym, LIB_NVML},
#include "hooks.def"
};

void *vgpu_real[VGPU_H_COUNT];
static unsigned char present[VGPU_H_COUNT];

int vgpu_real_present(int id)
{
    return present[id];
}

/* ---- the real dlsym and dlvsym ----------------------------------------------- */
/* The hook exports both names, so a call to either by name from here would
 * come back to the hook. The real dlvsym is found by reading the dynamic
 * symbol table of the first other loaded object that defines it (libc.so.6
 * from glibc 2.34, libdl.so.2 before); the real dlsym through it. */
static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

static uint32_t sysv_hash(const char *s)
{
    uint32_t h = 0, g;
    for (; *s; s++) {
        h = (h << 4) + (unsigned char)*s;
        g = h & 0xf0000000u;
        if (g)
            h ^= g >> 24;
        h &= ~g;
    }
    return h;
}

/* d_ptr values: relocated by ld.so in place on most targets, not on all. */
static const void *dyn_ptr(const struct link_map *l, ElfW(Addr) p)
{
    return (const void *)(p < l->l_addr ? p + l->l_addr : p);
}

static void *defined_in(const struct link_map *l, const char *name)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gnu = NULL, *sysv = NULL;
    for (const ElfW(Dyn) *d = l->l_ld; d != NULL && d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = dyn_ptr(l, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = dyn_ptr(l, d->d_un.d_ptr); break;
        case DT_GNU_HASH: gnu = dyn_ptr(l, d->d_un.d_ptr); break;
        case DT_HASH: sysv = dyn_ptr(l, d->d_un.d_ptr); break;
        default: break;
        }
    }
    if (symtab == NULL || strtab == NULL)
        return NULL;
#define VGPU_DEFINES(sym) \
    ((sym)->st_shndx != SHN_UNDEF && ELF64_ST_TYPE((sym)->st_info) == STT_FUNC && \
     strcmp(strtab + (sym)->st_name, name) == 0)
    if (gnu != NULL) {
        uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
        const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(gnu + 4) + bloom_size);
        const uint32_t *chain = buckets + nbuckets;
        uint32_t h = gnu_hash(name);
        if (nbuckets == 0)
            return NULL;
        uint32_t i = buckets[h % nbuckets];
        if (i < symoffset)
            return NULL;
        for (;; i++) {
            uint32_t c = chain[i - symoffset];
            if ((c | 1) == (h | 1) && VGPU_DEFINES(&symtab[i]))
                return (void *)(l->l_addr + symtab[i].st_value);
            if (c & 1)
                return NULL;
        }
    }
    if (sysv != NULL) {
        uint32_t nbucket = sysv[0];
        const uint32_t *bucket = sysv + 2, *chain = bucket + nbucket;
        for (uint32_t i = bucket[sysv_hash(name) % nbucket]; i != STN_UNDEF; i = chain[i])
            if (VGPU_DEFINES(&symtab[i]))
                return (void *)(l->l_addr + symtab[i].st_value);
    }
#undef VGPU_DEFINES
    return NULL;
}

static vgpu_dlvsym_fn real_dlvsym_ptr;

static vgpu_dlvsym_fn real_dlvsym(void)
{
    vgpu_dlvsym_fn f = __atomic_load_n(&real_dlvsym_ptr, __ATOMIC_ACQUIRE);
    if (VGPU_LIKELY(f != NULL))
        return f;
    Dl_info info;
    struct link_map *self = NULL;
    if (dladdr1((void *)real_dlvsym, &info, (void **)&self, RTLD_DL_LINKMAP) == 0)
        self = NULL;
    struct link_map *l = self;
    while (l != NULL && l->l_prev != NULL)
        l = l->l_prev;
    for (; l != NULL && f == NULL; l = l->l_next)
        if (l != self)
            f = (vgpu_dlvsym_fn)defined_in(l, "dlvsym");
    /* Racing threads store the same value. */
    __atomic_store_n(&real_dlvsym_ptr, f, __ATOMIC_RELEASE);
    return f;
}

static vgpu_dlsym_fn real_dlsym_ptr;

static vgpu_dlsym_fn real_dlsym(void)
{
    vgpu_dlsym_fn f = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (VGPU_LIKELY(f != NULL))
        return f;
    vgpu_dlvsym_fn dv = real_dlvsym();
    /* glibc >= 2.34 has dlsym@GLIBC_2.34 in libc; older ones dlsym@GLIBC_2.2.5
     * in libdl (aarch64: GLIBC_2.17). Racing threads store the same value. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (unsigned i = 0; dv != NULL && i < sizeof(versions) / sizeof(versions[0]) && !f; i++)
        f = (vgpu_dlsym_fn)dv(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&real_dlsym_ptr, f, __ATOMIC_RELEASE);
    return f;
}

/* ---- resolving the real libraries ---------------------------------------------- */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int loading;   /* this thread is inside dlopen of a real library */
static void *lib_handle[2];

static void *open_real(const char *soname)
{
    void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL)
        h = dlopen(soname, RTLD_NOW);
    return h;
}

static void resolve(int lib)
{
    static const char *const sonames[2] = {"libcuda.so.1", "libnvidia-ml.so.1"};
    vgpu_dlsym_fn ds = real_dlsym();
    loading = 1;
    void *h = open_real(sonames[lib]);
    loading = 0;
    lib_handle[lib] = h;
    if (h == NULL)
        vgpu_log(VGPU_LOG_INFO, "cannot load %s: %s", sonames[lib], dlerror());
    for (int i = 0; i < VGPU_H_COUNT; i++) {
        if (table[i].lib != lib)
            continue;
        void *p = (h != NULL && ds != NULL) ? ds(h, table[i].sym) : NULL;
        /* With the hook preloaded, a driver that takes the address of its own
         * exported function may hand back ours; never forward to ourselves. */
        if (p == table[i].self)
            p = NULL;
        present[i] = p != NULL;
        __atomic_store_n(&vgpu_real[i], p != NULL ? p : table[i].missing, __ATOMIC_RELEASE);
    }
}

/* First call into lib: resolve its symbols, then publish the hook's state in
 * *lib_state (vgpu_g_cu_state or vgpu_g_nvml_state). */
static int lib_init_slow(int lib, int *lib_state)
{
    int s = vgpu_state();
    pthread_mutex_lock(&load_lock);
    if (__atomic_load_n(lib_state, __ATOMIC_ACQUIRE) == VGPU_UNINIT) {
        if (lib_handle[lib] == NULL)
            resolve(lib);
        __atomic_store_n(lib_state, s, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&load_lock);
    return __atomic_load_n(lib_state, __ATOMIC_ACQUIRE);
}

int vgpu_cu_init_slow(void)
{
    return lib_init_slow(LIB_CUDA, &vgpu_g_cu_state);
}

int vgpu_nvml_init_slow(void)
{
    return lib_init_slow(LIB_NVML, &vgpu_g_nvml_state);
}

static void lib_ready(int lib)
{
    if (lib == LIB_CUDA)
        vgpu_cu_state();
    else
        vgpu_nvml_state();
}

/* ---- swapping a real pointer for our wrapper ----------------------------------- */

/* 1 for the per-thread default stream variants (_ptsz, _ptds). */
static int per_thread_sym(const char *sym)
{
    size_t n = strlen(sym);
    return n > 5 && (strcmp(sym + n - 5, "_ptsz") == 0 || strcmp(sym + n - 5, "_ptds") == 0);
}

/* p is what the real driver returned for a lookup of `name` (a base name for
 * cuGetProcAddress, an exact symbol for dlsym). Return our wrapper when p is
 * the real driver's entry point of a wrapped symbol, else p itself. When a
 * driver exports two versions at one address (an alias), the one matching
 * the requested stream semantics is taken; both forward to the same code. */
static void *swap(const char *name, void *p, int by_base, int per_thread)
{
    int named = 0, matched = 0;
    void *found = NULL;
    for (int i = 0; i < VGPU_H_COUNT; i++) {
        const struct hook_entry *e = &table[i];
        if (e->self == NULL || strcmp(by_base ? e->base : e->sym, name) != 0)
            continue;
        named = 1;
        lib_ready(e->lib);
        void *w = NULL;
        if (present[i] && p == vgpu_real[i])
            w = e->self;
        else if (p == e->self)   /* found our export (RTLD_DEFAULT and the like) */
            w = present[i] ? e->self : (by_base ? p : NULL);
        else
            continue;
        if (!matched || per_thread_sym(e->sym) == per_thread)
            found = w;
        matched = 1;
    }
    if (matched)
        return found;
    if (named)
        vgpu_log(VGPU_LOG_DEBUG, "%s(\"%s\") returned an entry point the hook does not "
                 "know; passed through unwrapped", by_base ? "cuGetProcAddress" : "dlsym", name);
    return p;
}

static int interesting(const char *name)
{
    return name != NULL && ((name[0] == 'c' && name[1] == 'u') ||
                            (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l'));
}

/* 1 if name is one of the symbols the hook wraps. */
static int wrapped_symbol(const char *name)
{
    for (int i = 0; i < VGPU_H_COUNT; i++)
        if (table[i].self != NULL && strcmp(table[i].sym, name) == 0)
            return 1;
    return 0;
}

/* dlsym(RTLD_NEXT, name) for a name the hook wraps, asked from `caller`: the
 * first definition in an object after the caller's in the link map, each
 * object checked to define the symbol itself (asked through a handle, an
 * object also answers for its dependencies). This is the order glibc searches
 * for the objects a program starts with and those it loads RTLD_GLOBAL; it
 * is needed only here, where the hook must see the answer to swap it. */
static void *next_definition(const void *caller, const char *name, vgpu_dlsym_fn ds)
{
    Dl_info info;
    struct link_map *from = NULL;
    if (dladdr1(caller, &info, (void **)&from, RTLD_DL_LINKMAP) == 0 || from == NULL)
        return NULL;
    for (struct link_map *l = from->l_next; l != NULL; l = l->l_next) {
        if (l->l_name == NULL || l->l_name[0] == '\0')
            continue;
        void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (h == NULL)
            continue;
        void *p = ds(h, name);
        struct link_map *owner = NULL;
        int own = p != NULL && dladdr1(p, &info, (void **)&owner, RTLD_DL_LINKMAP) != 0 &&
                  owner == l;
        dlclose(h);
        if (own)
            return p;
    }
    return NULL;
}

static void *hook_dlsym(vgpu_dlsym_fn ds, void *handle, const char *name, const void *caller)
{
    void *p = handle == RTLD_NEXT ? next_definition(caller, name, ds) : ds(handle, name);
    if (p == NULL || vgpu_state() == VGPU_PASS)
        return p;
    return swap(name, p, 0, per_thread_sym(name));
}

/* Every dlsym in the process enters at dlsym_entry.S, which asks this what to
 * do. Names the hook does not wrap (nearly all) get the real dlsym back, and
 * the entry jumps to it with the caller's return address in place, so
 * RTLD_NEXT resolves relative to the caller whatever the compiler did here.
 * A wrapped driver name is answered here, in *answer: the real lookup first
 * (from the caller for RTLD_NEXT), then our wrapper for the driver's own
 * function. Other names never wake the hook up (no slot, no message). */
/* The hook's own entries (dlsym_entry.S). */
extern char vgpu_dlsym_entry[], vgpu_dlvsym_entry[];

/* dlsym or dlvsym asked for the real dlsym or dlvsym (from libc's handle,
 * RTLD_NEXT, or by version): the hook's entry, which answers as the real one
 * does for every other name. NULL for other names. */
static void *lookup_of_lookup(const char *name)
{
    if (name == NULL || name[0] != 'd' || name[1] != 'l')
        return NULL;
    if (strcmp(name, "dlsym") == 0)
        return (void *)vgpu_dlsym_entry;
    if (strcmp(name, "dlvsym") == 0)
        return (void *)vgpu_dlvsym_entry;
    return NULL;
}

vgpu_dlsym_fn vgpu_dlsym_route(void *handle, const char *name, const void *caller,
                               void **answer)
{
    vgpu_dlsym_fn ds = real_dlsym();
    if (VGPU_LIKELY(ds != NULL) &&
        (VGPU_LIKELY(!interesting(name)) || loading || !wrapped_symbol(name))) {
        void *own = loading ? NULL : lookup_of_lookup(name);
        if (VGPU_LIKELY(own == NULL))
            return ds;
        *answer = own;
        return NULL;
    }
    *answer = ds != NULL ? hook_dlsym(ds, handle, name, caller) : NULL;
    return NULL;
}

/* dlvsym: the same routes; a wrapped driver name is looked up by its name
 * alone (the driver's symbols carry no version). */
vgpu_dlvsym_fn vgpu_dlvsym_route(void *handle, const char *name, const char *version,
                                 const void *caller, void **answer)
{
    vgpu_dlvsym_fn dv = real_dlvsym();
    vgpu_dlsym_fn ds = real_dlsym();
    void *own = loading ? NULL : lookup_of_lookup(name);
    if (own != NULL) {
        *answer = own;
        return NULL;
    }
    if (VGPU_LIKELY(dv != NULL) &&
        (VGPU_LIKELY(!interesting(name)) || loading || ds == NULL || !wrapped_symbol(name)))
        return dv;
    if (dv == NULL) {
        *answer = NULL;
        return NULL;
    }
    void *p = handle == RTLD_NEXT ? next_definition(caller, name, ds) : dv(handle, name, version);
    *answer = (p == NULL || vgpu_state() == VGPU_PASS) ? p : swap(name, p, 0, per_thread_sym(name));
    return NULL;
}

/* ---- cuGetProcAddress ------------------------------------------------------------ */
static void count_lookup(void)
{
    struct vgpu_proc_slot *slot = vgpu_g_slot;
    if (slot != NULL)
        __atomic_fetch_add(&slot->get_proc_calls, 1, __ATOMIC_RELAXED);
}

CUresult hook_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                               cuuint64_t flags)
{
    int s = vgpu_cu_state();
    CUresult r = REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (s == VGPU_PASS)
        return r;
    count_lookup();
    if (r == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
        *pfn = swap(symbol, *pfn, 1,
                     (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
    return r;
}

CUresult hook_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    int s = vgpu_cu_state();
    CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (s == VGPU_PASS)
        return r;
    count_lookup();
    if (r == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
        *pfn = swap(symbol, *pfn, 1,
                     (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
    return r;
}

void vgpu_interpose_atfork_child(void)
{
    pthread_mutex_init(&load_lock, NULL);
}

CUresult hook_cuInit(unsigned int Flags)
{
    CU_PROLOGUE(cuInit, (Flags));
    return REAL(cuInit)(Flags);
}
