/*
 * darkapi.c - cuGetExportTable: the driver's private interface to NVIDIA's
 * CUDA runtime (libcudart, and the static copies inside cuBLAS, cuBLASLt,
 * cuDNN). Without it every runtime stops at its first call with
 * cudaErrorCallRequiresNewerDriver.
 *
 * A table is an array of pointers, asked for by a 16-byte UUID; slot 0 holds
 * the table's size in bytes, except in CONTEXT_LOCAL_STORAGE (three
 * functions, then NULL). The UUIDs, the slots' meanings and the integrity
 * check's algorithm are public reverse engineering: ZLUDA (vosen/ZLUDA,
 * MIT/Apache-2.0), dark_api/src/lib.rs and zluda/src/impl/driver.rs. Which
 * tables and slots runtimes 12.9-13.5 actually use was measured on this
 * simulator; docs/simulator.md lists them.
 *
 * An unknown UUID is refused (CUDA_ERROR_INVALID_VALUE, as the driver does)
 * and a slot this driver does not implement returns CUDA_ERROR_NOT_SUPPORTED.
 * VGPU_SIM_DARKAPI_LOG=1 names on stderr every table asked for and every
 * unimplemented slot called: a new CUDA version's demands show there first.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "context.h"
#include "init.h"
#include "module.h"

static int log_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *s = getenv("VGPU_SIM_DARKAPI_LOG");
        on = s && *s && strcmp(s, "0") != 0;
    }
    return on;
}

static void uuid_hex(const unsigned char *u, char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", u[i]);
}

/* ---- unimplemented slots: one stub per (table, slot), each naming itself ---- */

#define UNIMPLEMENTED(table, slot)                                                 \
    __attribute__((unused)) static CUresult unimpl_##table##_##slot(void)          \
    {                                                                              \
        if (log_on())                                                              \
            fprintf(stderr, "vgpu-sim: darkapi: UNIMPLEMENTED %s[%d] called\n",   \
                    #table, slot);                                                 \
        return CUDA_ERROR_NOT_SUPPORTED;                                           \
    }
#define SLOT(table, slot) ((void *)unimpl_##table##_##slot)
/* Ten stubs at once: slots d0 to d9. */
#define UNIMPLEMENTED_10(table, d)                                                 \
    UNIMPLEMENTED(table, d##0) UNIMPLEMENTED(table, d##1) UNIMPLEMENTED(table, d##2)  \
    UNIMPLEMENTED(table, d##3) UNIMPLEMENTED(table, d##4) UNIMPLEMENTED(table, d##5)  \
    UNIMPLEMENTED(table, d##6) UNIMPLEMENTED(table, d##7) UNIMPLEMENTED(table, d##8)  \
    UNIMPLEMENTED(table, d##9)
#define SLOTS_10(table, d)                                                         \
    SLOT(table, d##0), SLOT(table, d##1), SLOT(table, d##2), SLOT(table, d##3),    \
    SLOT(table, d##4), SLOT(table, d##5), SLOT(table, d##6), SLOT(table, d##7),    \
    SLOT(table, d##8), SLOT(table, d##9)

/* ---- CUDART_INTERFACE ---- */

/* [1] a module from a __fatBinC_Wrapper_t (runtimes before 12.x; 12.9+ use
 * cuLibraryLoadData instead, but the slot must work). */
static CUresult cudart_module_from_wrapper(CUmodule *mod, const void *wrapper)
{
    return cu_module_from_fatbin(mod, wrapper);
}

/* [2] the device's primary context handle, created if need be and not
 * retained: the runtime makes it current, then retains it. */
static CUresult cudart_primary_ctx(CUcontext *pctx, CUdevice dev)
{
    return cu_primary_handle(pctx, dev);
}

/* [6] the same as [1], with options (ignored). */
static CUresult cudart_module_from_wrapper_ex(CUmodule *mod, const void *wrapper, void *a3,
                                              void *a4, unsigned int a5)
{
    (void)a3, (void)a4, (void)a5;
    return cu_module_from_fatbin(mod, wrapper);
}

/* [7] takes a size; nothing to do here. */
static CUresult cudart_noop_size(size_t n)
{
    (void)n;
    return CUDA_SUCCESS;
}

/* [8] a module from a fatbin header (not a wrapper), with options. */
static CUresult cudart_module_from_fatbin(const void *fatbin, CUmodule *mod, void *a3, void *a4,
                                          unsigned int a5)
{
    (void)a3, (void)a4, (void)a5;
    return cu_module_from_fatbin(mod, fatbin);
}

/* [12] load the JIT compilers (13.1+): nothing is compiled here. */
static CUresult cudart_load_compilers(void)
{
    return CUDA_SUCCESS;
}

UNIMPLEMENTED(CUDART_INTERFACE, 3)
UNIMPLEMENTED(CUDART_INTERFACE, 4)
UNIMPLEMENTED(CUDART_INTERFACE, 5)
UNIMPLEMENTED(CUDART_INTERFACE, 9)
UNIMPLEMENTED(CUDART_INTERFACE, 10)
UNIMPLEMENTED(CUDART_INTERFACE, 11)

static void *const k_cudart_interface[13] = {
    (void *)(13 * sizeof(void *)),
    (void *)cudart_module_from_wrapper,
    (void *)cudart_primary_ctx,
    SLOT(CUDART_INTERFACE, 3),
    SLOT(CUDART_INTERFACE, 4),
    SLOT(CUDART_INTERFACE, 5),
    (void *)cudart_module_from_wrapper_ex,
    (void *)cudart_noop_size,
    (void *)cudart_module_from_fatbin,
    SLOT(CUDART_INTERFACE, 9),
    SLOT(CUDART_INTERFACE, 10),
    SLOT(CUDART_INTERFACE, 11),
    (void *)cudart_load_compilers,
};

/* ---- TOOLS_RUNTIME_CALLBACK_HOOKS: two driver-owned buffers ---- */

static uint32_t g_hooks_buf2[1024];
static uint32_t g_hooks_buf6[14];

static void hooks_buffer2(void **ptr, size_t *n)
{
    if (ptr)
        *ptr = g_hooks_buf2;
    if (n)
        *n = sizeof g_hooks_buf2;
}

static void hooks_buffer6(void **ptr, size_t *n)
{
    if (ptr)
        *ptr = g_hooks_buf6;
    if (n)
        *n = sizeof g_hooks_buf6;
}

UNIMPLEMENTED(TOOLS_RUNTIME_CALLBACK_HOOKS, 1)
UNIMPLEMENTED(TOOLS_RUNTIME_CALLBACK_HOOKS, 3)
UNIMPLEMENTED(TOOLS_RUNTIME_CALLBACK_HOOKS, 4)
UNIMPLEMENTED(TOOLS_RUNTIME_CALLBACK_HOOKS, 5)

/* Exactly 7 slots: a runtime that reads 8 refuses the driver. */
static void *const k_runtime_callback_hooks[7] = {
    (void *)(7 * sizeof(void *)),
    SLOT(TOOLS_RUNTIME_CALLBACK_HOOKS, 1),
    (void *)hooks_buffer2,
    SLOT(TOOLS_RUNTIME_CALLBACK_HOOKS, 3),
    SLOT(TOOLS_RUNTIME_CALLBACK_HOOKS, 4),
    SLOT(TOOLS_RUNTIME_CALLBACK_HOOKS, 5),
    (void *)hooks_buffer6,
};

/* ---- TOOLS_TLS: [2] is the calling thread's current context (cuBLASLt) ---- */

static CUresult tls_current_ctx(CUcontext *out)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    return cuCtxGetCurrent(out);
}

UNIMPLEMENTED(TOOLS_TLS, 1)
UNIMPLEMENTED(TOOLS_TLS, 3)

static void *const k_tools_tls[4] = {
    (void *)(4 * sizeof(void *)),
    SLOT(TOOLS_TLS, 1),
    (void *)tls_current_ctx,
    SLOT(TOOLS_TLS, 3),
};

/* ---- TOOLS_CONTEXT: [4] a context's unique id (cuBLASLt keys a cache on it) ---- */

static CUresult tools_ctx_id(CUcontext ctx, unsigned long long *id)
{
    return cuCtxGetId(ctx, id);
}

/* 95 slots, as driver 595 serves it; every other slot is a stub. The
 * stubs' names carry the slot number in decimal (slot 07 is slot 7). */
UNIMPLEMENTED(TOOLS_CONTEXT, 0)
UNIMPLEMENTED(TOOLS_CONTEXT, 1)
UNIMPLEMENTED(TOOLS_CONTEXT, 2)
UNIMPLEMENTED(TOOLS_CONTEXT, 3)
UNIMPLEMENTED(TOOLS_CONTEXT, 5)
UNIMPLEMENTED(TOOLS_CONTEXT, 6)
UNIMPLEMENTED(TOOLS_CONTEXT, 7)
UNIMPLEMENTED(TOOLS_CONTEXT, 8)
UNIMPLEMENTED(TOOLS_CONTEXT, 9)
UNIMPLEMENTED_10(TOOLS_CONTEXT, 1)
UNIMPLEMENTED_10(TOOLS_CONTEXT, 2)
UNIMPLEMENTED_10(TOOLS_CONTEXT, 3)
UNIMPLEMENTED_10(TOOLS_CONTEXT, 4)
UNIMPLEMENTED_10(TOOLS_CONTEXT, 5)
UNIMPLEMENTED_10(TOOLS_CONTEXT, 6)
UNIMPLEMENTED_10(TOOLS_CONTEXT, 7)
UNIMPLEMENTED_10(TOOLS_CONTEXT, 8)
UNIMPLEMENTED(TOOLS_CONTEXT, 90)
UNIMPLEMENTED(TOOLS_CONTEXT, 91)
UNIMPLEMENTED(TOOLS_CONTEXT, 92)
UNIMPLEMENTED(TOOLS_CONTEXT, 93)
UNIMPLEMENTED(TOOLS_CONTEXT, 94)

static void *const k_tools_context[95] = {
    (void *)(95 * sizeof(void *)),
    SLOT(TOOLS_CONTEXT, 1), SLOT(TOOLS_CONTEXT, 2), SLOT(TOOLS_CONTEXT, 3),
    (void *)tools_ctx_id,
    SLOT(TOOLS_CONTEXT, 5), SLOT(TOOLS_CONTEXT, 6), SLOT(TOOLS_CONTEXT, 7),
    SLOT(TOOLS_CONTEXT, 8), SLOT(TOOLS_CONTEXT, 9),
    SLOTS_10(TOOLS_CONTEXT, 1), SLOTS_10(TOOLS_CONTEXT, 2), SLOTS_10(TOOLS_CONTEXT, 3),
    SLOTS_10(TOOLS_CONTEXT, 4), SLOTS_10(TOOLS_CONTEXT, 5), SLOTS_10(TOOLS_CONTEXT, 6),
    SLOTS_10(TOOLS_CONTEXT, 7), SLOTS_10(TOOLS_CONTEXT, 8),
    SLOT(TOOLS_CONTEXT, 90), SLOT(TOOLS_CONTEXT, 91), SLOT(TOOLS_CONTEXT, 92),
    SLOT(TOOLS_CONTEXT, 93), SLOT(TOOLS_CONTEXT, 94),
};

/* ---- TOOLS_MODULE ----
 * cuFFT loads the kernels it builds with cuModuleLoadData (fatbinaries of
 * LZ4-compressed PTX, one kernel each) and gets each one's function through
 * [7](ctx, module, fn, arg): fn(arg, f) is called for each function of the
 * module, and cuFFT takes a result of 1 for success, as the count of
 * functions visited (measured: it checks that the table has at least 8
 * slots, then compares [7]'s result with 1; anything else is
 * CUFFT_INTERNAL_ERROR). No other slot was seen called. */

static int tools_module_functions(CUcontext ctx, CUmodule mod, void (*fn)(void *, CUfunction),
                                  void *arg)
{
    (void)ctx;
    if (!fn)
        return 0;
    int n = cu_module_functions(mod, fn, arg);
    return n < 0 ? 0 : n;
}

UNIMPLEMENTED(TOOLS_MODULE, 1)
UNIMPLEMENTED(TOOLS_MODULE, 2)
UNIMPLEMENTED(TOOLS_MODULE, 3)
UNIMPLEMENTED(TOOLS_MODULE, 4)
UNIMPLEMENTED(TOOLS_MODULE, 5)
UNIMPLEMENTED(TOOLS_MODULE, 6)
UNIMPLEMENTED(TOOLS_MODULE, 8)
UNIMPLEMENTED(TOOLS_MODULE, 9)
UNIMPLEMENTED(TOOLS_MODULE, 10)
UNIMPLEMENTED(TOOLS_MODULE, 11)
UNIMPLEMENTED(TOOLS_MODULE, 12)
UNIMPLEMENTED(TOOLS_MODULE, 13)
UNIMPLEMENTED(TOOLS_MODULE, 14)
UNIMPLEMENTED(TOOLS_MODULE, 15)

/* 16 slots: what the driver serves is not known beyond [7]; a library that
 * reads further gets stubs that refuse, never a slot past the end. */
static void *const k_tools_module[16] = {
    (void *)(16 * sizeof(void *)),
    SLOT(TOOLS_MODULE, 1), SLOT(TOOLS_MODULE, 2), SLOT(TOOLS_MODULE, 3),
    SLOT(TOOLS_MODULE, 4), SLOT(TOOLS_MODULE, 5), SLOT(TOOLS_MODULE, 6),
    (void *)tools_module_functions,
    SLOT(TOOLS_MODULE, 8), SLOT(TOOLS_MODULE, 9), SLOT(TOOLS_MODULE, 10),
    SLOT(TOOLS_MODULE, 11), SLOT(TOOLS_MODULE, 12), SLOT(TOOLS_MODULE, 13),
    SLOT(TOOLS_MODULE, 14), SLOT(TOOLS_MODULE, 15),
};

/* ---- the table cuBLASLt asks for as 26dc3417-0d80-4547-8726-c0f1e7dd8bca ----
 * Not in any public description. cuBLASLt calls only [4], with two
 * out-pointers first (a pointer and a value it zeroes before the call),
 * while choosing a matmul algorithm (cublasLtMatmulAlgoGetHeuristic, from
 * cublasGemmEx, gemm_and_bias, cuDNN's engine set-up), and goes its own way
 * when [4] fails or leaves the pointer NULL (measured). It does not check the
 * size header. What the real [4] answers is not known, so it refuses, as an
 * unimplemented slot does: refusing the table instead is what cuBLASLt does
 * NOT handle (it calls [4] of a NULL table). */

UNIMPLEMENTED(CUBLASLT_26DC3417, 1)
UNIMPLEMENTED(CUBLASLT_26DC3417, 2)
UNIMPLEMENTED(CUBLASLT_26DC3417, 3)
UNIMPLEMENTED(CUBLASLT_26DC3417, 4)
UNIMPLEMENTED(CUBLASLT_26DC3417, 5)
UNIMPLEMENTED(CUBLASLT_26DC3417, 6)
UNIMPLEMENTED(CUBLASLT_26DC3417, 7)

static void *const k_cublaslt_26dc3417[8] = {
    (void *)(8 * sizeof(void *)),
    SLOT(CUBLASLT_26DC3417, 1), SLOT(CUBLASLT_26DC3417, 2), SLOT(CUBLASLT_26DC3417, 3),
    SLOT(CUBLASLT_26DC3417, 4), SLOT(CUBLASLT_26DC3417, 5), SLOT(CUBLASLT_26DC3417, 6),
    SLOT(CUBLASLT_26DC3417, 7),
};

/* ---- CONTEXT_LOCAL_STORAGE_INTERFACE_V0301 (no size header) ----
 * The runtime's per-context state; read on every runtime call. A NULL
 * context is the current one; with none current: CUDA_ERROR_INVALID_CONTEXT. */

static CUresult cls_ctx(CUcontext *ctx)
{
    if (*ctx)
        return CUDA_SUCCESS;
    CUresult rc = cuCtxGetCurrent(ctx);
    if (rc)
        return rc;
    return *ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult cls_put(CUcontext ctx, void *key, void *value, cu_cls_dtor dtor)
{
    CUresult rc = cls_ctx(&ctx);
    return rc ? rc : cu_cls_put(ctx, key, value, dtor);
}

static CUresult cls_delete(CUcontext ctx, void *key)
{
    CUresult rc = cls_ctx(&ctx);
    return rc ? rc : cu_cls_delete(ctx, key);
}

static CUresult cls_get(void **value, CUcontext ctx, void *key)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cls_ctx(&ctx);
    return rc ? rc : cu_cls_get(ctx, key, value);
}

static void *const k_context_local_storage[4] = {
    (void *)cls_put,
    (void *)cls_delete,
    (void *)cls_get,
    NULL,
};

/* ---- CONTEXT_CHECKS ---- */

/* [2] on every new context and reset: nothing flagged. */
static CUresult ctx_check(CUcontext ctx, uint32_t *r1, void **r2)
{
    (void)ctx, (void)r2;
    if (r1)
        *r1 = 0;
    return CUDA_SUCCESS;
}

/* [3] at init: nothing flagged. */
static uint32_t ctx_check_init(void)
{
    return 0;
}

UNIMPLEMENTED(CONTEXT_CHECKS, 1)

static void *const k_context_checks[4] = {
    (void *)(4 * sizeof(void *)),
    SLOT(CONTEXT_CHECKS, 1),
    (void *)ctx_check,
    (void *)ctx_check_init,
};

/* ---- INTEGRITY_CHECK ----
 * [1](version, unix_seconds, out[2]). The runtime calls it with version
 * runtime*10 + 0, 1 and 2. For +0 and +1 the answer is a constant; for +2 it
 * is HMAC-MD2 (RFC 1319 digest, RFC 2104 construction, 16-byte blocks) under
 * a fixed key, over {driver version, version, pid, thread, the
 * CUDART_INTERFACE table, this table, this function, unix_seconds} and then
 * {UUID, PCI domain, bus, device} of each visible device. */

static const unsigned char k_md2_s[256] = {
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192,
    199, 115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103,
    66, 111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187,
    47, 238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127,
    93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181,
    209, 215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107,
    226, 156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2,
    27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221,
    81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223,
    205, 244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189,
    177, 74, 120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239,
    183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237,
    31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
};

struct md2 {
    unsigned char x[48], c[16], buf[16];
    unsigned int n;
};

static void md2_block(struct md2 *m, const unsigned char *blk)
{
    unsigned char l = m->c[15];
    for (int i = 0; i < 16; i++) {
        m->x[16 + i] = blk[i];
        m->x[32 + i] = (unsigned char)(m->x[16 + i] ^ m->x[i]);
        l = m->c[i] ^= k_md2_s[blk[i] ^ l];
    }
    unsigned char t = 0;
    for (int j = 0; j < 18; j++) {
        for (int k = 0; k < 48; k++)
            t = m->x[k] ^= k_md2_s[t];
        t = (unsigned char)(t + j);
    }
}

static void md2_update(struct md2 *m, const void *data, size_t len)
{
    const unsigned char *p = data;
    while (len--) {
        m->buf[m->n++] = *p++;
        if (m->n == 16) {
            md2_block(m, m->buf);
            m->n = 0;
        }
    }
}

static void md2_final(struct md2 *m, unsigned char out[16])
{
    unsigned char pad = (unsigned char)(16 - m->n);
    for (unsigned int i = m->n; i < 16; i++)
        m->buf[i] = pad;
    md2_block(m, m->buf);
    unsigned char c[16];
    memcpy(c, m->c, 16);
    md2_block(m, c);
    memcpy(out, m->x, 16);
}

static void md2_keyed(struct md2 *m, const unsigned char key[16], unsigned char mask)
{
    unsigned char k[16];
    memset(m, 0, sizeof *m);
    for (int i = 0; i < 16; i++)
        k[i] = key[i] ^ mask;
    md2_update(m, k, 16);
}

static const unsigned char k_integrity_key[16] = {
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
};

struct integrity_input {
    uint32_t driver_version;
    uint32_t version;
    uint32_t pid;
    uint32_t thread;
    const void *cudart_table;
    const void *integrity_table;
    const void *fn;
    uint64_t unix_seconds;
};

struct integrity_device {
    unsigned char uuid[16];
    int32_t pci_domain, pci_bus, pci_device;
};

static CUresult integrity_check(uint32_t version, uint64_t unix_seconds, uint64_t out[2]);

static void *const k_integrity_check[3] = {
    (void *)(3 * sizeof(void *)),
    (void *)integrity_check,
    NULL,
};

static CUresult integrity_check(uint32_t version, uint64_t unix_seconds, uint64_t out[2])
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (version % 10 == 0) {
        out[0] = 0x3341181c03cb675cull;
        out[1] = 0x8ed383aa1f4cd1e8ull;
        return CUDA_SUCCESS;
    }
    if (version % 10 == 1) {
        out[0] = 0x1841181c03cb675cull;
        out[1] = 0x8ed383aa1f4cd1e8ull;
        return CUDA_SUCCESS;
    }
    struct integrity_input in;
    memset(&in, 0, sizeof in);
    in.driver_version = sim_cuda_version();
    in.version = version;
    in.pid = (uint32_t)getpid();
    in.thread = (uint32_t)pthread_self();
    in.cudart_table = k_cudart_interface;
    in.integrity_table = k_integrity_check;
    in.fn = (const void *)integrity_check;
    in.unix_seconds = unix_seconds;
    struct md2 m;
    unsigned char inner[16];
    md2_keyed(&m, k_integrity_key, 0x36);
    md2_update(&m, &in, sizeof in);
    for (int d = 0; d < cu_count; d++) {
        struct integrity_device dev = {.pci_domain = 0, .pci_bus = sim_slot_parent(cu_phys[d]) + 1};
        sim_device_uuid(sim_slot_parent(cu_phys[d]), dev.uuid);
        md2_update(&m, &dev, sizeof dev);
    }
    md2_final(&m, inner);
    md2_keyed(&m, k_integrity_key, 0x5c);
    md2_update(&m, inner, sizeof inner);
    unsigned char digest[16];
    md2_final(&m, digest);
    memcpy(out, digest, 16);
    return CUDA_SUCCESS;
}

/* ---- the directory of tables ---- */

struct export_table {
    const char *name;
    unsigned char uuid[16];
    const void *table;
};

static const struct export_table k_tables[] = {
    {"CUDART_INTERFACE",
     {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
     k_cudart_interface},
    {"TOOLS_RUNTIME_CALLBACK_HOOKS",
     {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
     k_runtime_callback_hooks},
    {"TOOLS_TLS",
     {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc},
     k_tools_tls},
    {"TOOLS_CONTEXT",
     {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2},
     k_tools_context},
    {"CONTEXT_LOCAL_STORAGE_INTERFACE_V0301",
     {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
     k_context_local_storage},
    {"CONTEXT_CHECKS",
     {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e},
     k_context_checks},
    {"TOOLS_MODULE",
     {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e},
     k_tools_module},
    {"CUBLASLT_26DC3417",
     {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca},
     k_cublaslt_26dc3417},
    {"INTEGRITY_CHECK",
     {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
     k_integrity_check},
};

VGPU_EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    if (!table || !id)
        return CUDA_ERROR_INVALID_VALUE;
    *table = NULL;
    char hex[33];
    for (size_t i = 0; i < sizeof k_tables / sizeof k_tables[0]; i++) {
        if (memcmp(k_tables[i].uuid, id->bytes, 16) == 0) {
            if (log_on())
                fprintf(stderr, "vgpu-sim: darkapi: table %s\n", k_tables[i].name);
            *table = k_tables[i].table;
            return CUDA_SUCCESS;
        }
    }
    if (log_on()) {
        uuid_hex((const unsigned char *)id->bytes, hex);
        fprintf(stderr, "vgpu-sim: darkapi: unknown table %s refused\n", hex);
    }
    return CUDA_ERROR_INVALID_VALUE;
}
