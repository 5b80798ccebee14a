/*
 * size.h - sizes as users write them (512M, 1.5G, 4GiB, 100B), read
 * one way by every native part: the hook's VGPU_MEM_LIMIT, the simulator's
 * VGPU_SIM and VGPU_SIM_CTX_MEM, vgpu-burn's --alloc. vgpuctl reads them the
 * same way; tests/data/sizes.json is the table both sides are tested against.
 *
 *   size := space* digits ["." digits] space* unit space*
 *   unit := ("K" | "M" | "G" | "T") ["i"] ["B"]  |  "B"      (any case)
 *
 * The unit is required: "4" is refused (4 bytes or 4 GiB? write 4G, 4M or
 * 4B). Units are binary (K = 1024). There is no sign, exponent, hex, inf or nan,
 * and a decimal point needs digits on both sides. The value is exact (no
 * floating point), rounded down to whole bytes, and must be 1 to 2^60.
 */
#ifndef VGPU_SIZE_H
#define VGPU_SIZE_H

#include <stdint.h>

#define VGPU_SIZE_MAX (1ull << 60)

/* 0 with *bytes set, or -1 (*bytes untouched) when text is not a size. */
int vgpu_parse_size(const char *text, uint64_t *bytes);

#endif /* VGPU_SIZE_H */
