/*
 * size_check.c - prints, for each argument, what vgpu_parse_size makes of
 * it: the bytes, or "error". tests/sim/test_native_layout.py runs it on every
 * case of tests/data/sizes.json.
 */
#include <inttypes.h>
#include <stdio.h>

#include "vgpu/size.h"

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        uint64_t n;
        if (vgpu_parse_size(argv[i], &n) == 0)
            printf("%" PRIu64 "\n", n);
        else
            printf("error\n");
    }
    return 0;
}
