/*
 * stubs.c - the entry points api.def marks `stub`: what the simulator does
 * not model. Each is exported at an address of its own and answers as an
 * unsupported feature does on NVIDIA's library: NVML_ERROR_UNINITIALIZED
 * before nvmlInit (or an injected fault), else NVML_ERROR_NOT_SUPPORTED.
 *
 * One function serves them all, through a tail jump from each name
 * (VGPU_ALIAS). It declares no parameters: whatever a caller passes (every
 * NVML entry point returns nvmlReturn_t and takes its arguments in
 * registers or on a stack the caller cleans up, on x86_64 and aarch64) is
 * left alone, and nothing is written through the caller's pointers.
 */
#include "init.h"

nvmlReturn_t nvml_not_modeled(void);

nvmlReturn_t nvml_not_modeled(void)
{
    nvmlReturn_t rc = nvml_enter();
    return rc ? rc : NVML_ERROR_NOT_SUPPORTED;
}

#define NVML_API(name, where) NVML_API_##where(name)
#define NVML_API_stub(name) VGPU_ALIAS(nvml_not_modeled, name)
/* defined by the file of that name */
#define NVML_API_init(name)
#define NVML_API_mig(name)
#define NVML_API_procs(name)
#define NVML_API_device(name)
#define NVML_API_sensors(name)
#define NVML_API_fields(name)
#include "api.def"
