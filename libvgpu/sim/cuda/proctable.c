/*
 * proctable.c - the table cuGetProcAddress resolves from, generated from
 * api.def. Kept apart from procaddr.c because the entry points are
 * declared here with a placeholder type (only their addresses are needed),
 * which may not meet their real declarations in one file.
 */
#include <stddef.h>

/* Declared with a placeholder type: only their addresses are taken here. */
#define CU_API(name, version, symbol) extern void symbol(void);
#define CU_API_PT(name, version, symbol) extern void symbol(void);
#include "api.def"
#undef CU_API
#undef CU_API_PT

struct proc_entry {
    const char *name;
    int version;
    int per_thread;
    void (*fn)(void);
};

static const struct proc_entry k_table[] = {
#define CU_API(name, version, symbol) {#name, version, 0, symbol},
#define CU_API_PT(name, version, symbol) {#name, version, 1, symbol},
#include "api.def"
#undef CU_API
#undef CU_API_PT
};

const struct proc_entry *cu_proc_table(size_t *n);

const struct proc_entry *cu_proc_table(size_t *n)
{
    *n = sizeof k_table / sizeof k_table[0];
    return k_table;
}
