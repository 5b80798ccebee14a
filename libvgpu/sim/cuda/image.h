/*
 * image.h - reading device images (image.c): the entries of a fatbinary,
 * their LZ4 compression, and the module-scope variables (__device__,
 * __constant__) that PTX text and cubins declare. Pure functions on bytes,
 * below module.c; uses no other file of cuda/.
 */
#ifndef VGPU_SIM_CUDA_IMAGE_H
#define VGPU_SIM_CUDA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#define FATBIN_MAGIC 0xba55ed50u

enum { IMAGE_NONE = 0, IMAGE_PTX = 1, IMAGE_ELF = 2 };

/* A variable a module declares: its size, and its initial bytes (NULL:
 * zeros). */
struct image_var {
    char name[256];
    size_t size;
    unsigned char *init;
};

/* The entry of the fatbinary at `fatbin` the driver would load on a device
 * of compute capability `sm` (90 for 9.0): a cubin built for it, else the
 * newest PTX not newer than it, else the first cubin or PTX at all. Its
 * bytes, decompressed when they are LZ4-compressed, go to *out (malloc'ed, a
 * NUL after them) and their count to *len. IMAGE_NONE when the fatbinary
 * holds nothing readable (entries compressed otherwise, or none); -1 when
 * memory runs out. */
int image_fatbin_entry(const unsigned char *fatbin, int sm, unsigned char **out, size_t *len);

/* Decompress one LZ4 block (the format of LZ4_compress_default) of n bytes
 * into dst (cap bytes); the bytes written, or -1 if it is malformed or does
 * not fit. */
long image_lz4(const unsigned char *src, size_t n, unsigned char *dst, size_t cap);

/* The module-scope .global and .const variables of PTX text (comments
 * blanked out), with their sizes and initializers: *out (malloc'ed) and
 * their count, or -1 when memory runs out. */
int image_ptx_vars(const char *text, struct image_var **out);

/* The variables (STT_OBJECT symbols in .nv.global* and .nv.constant*
 * sections) of a cubin of n bytes, with their initial bytes. */
int image_elf_vars(const unsigned char *img, size_t n, struct image_var **out);

void image_vars_free(struct image_var *vars, int n);

#endif /* VGPU_SIM_CUDA_IMAGE_H */
