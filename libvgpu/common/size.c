/*
 * size.c - the one size parser (see vgpu/size.h), compiled into the hook,
 * the simulator and vgpu-burn.
 *
 * Exact integer arithmetic throughout: the whole part saturates just above
 * the maximum, and the fraction times the unit is a digit-by-digit long
 * multiplication, so "1.0000000000000000000001G" is exactly 1 GiB and
 * "0.0001K" is 0 (refused), where a double would round either way.
 */
#include <stddef.h>

#include "vgpu/size.h"

/* ASCII only: the locale must not change what a size is. */
static int is_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static char lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* floor(0.d[0]d[1]...d[n-1] x unit), from the last digit to the first: each
 * carry is below unit, so for unit <= 2^40 nothing overflows. */
static uint64_t fraction_times(const char *d, size_t n, uint64_t unit)
{
    uint64_t carry = 0;
    while (n-- > 0)
        carry = ((uint64_t)(d[n] - '0') * unit + carry) / 10;
    return carry;
}

int vgpu_parse_size(const char *text, uint64_t *bytes)
{
    if (text == NULL)
        return -1;
    const char *p = text;
    while (is_space(*p))
        p++;
    if (!is_digit(*p))
        return -1;
    uint64_t whole = 0;
    for (; is_digit(*p); p++) {
        whole = whole * 10 + (uint64_t)(*p - '0');
        if (whole > VGPU_SIZE_MAX)
            whole = VGPU_SIZE_MAX + 1;   /* too big already; keep reading */
    }
    const char *frac = p;
    size_t nfrac = 0;
    if (*p == '.') {
        frac = ++p;
        while (is_digit(*p))
            p++;
        nfrac = (size_t)(p - frac);
        if (nfrac == 0)
            return -1;
    }
    while (is_space(*p))
        p++;
    unsigned shift = 0;
    switch (lower(*p)) {
    case 'k': shift = 10; break;
    case 'm': shift = 20; break;
    case 'g': shift = 30; break;
    case 't': shift = 40; break;
    default: break;
    }
    if (shift != 0) {
        p++;
        if (lower(*p) == 'i')
            p++;
        if (lower(*p) == 'b')
            p++;
    } else if (lower(*p) == 'b') {
        p++;
    } else {
        return -1;   /* no unit: "4" is not a size */
    }
    while (is_space(*p))
        p++;
    if (*p != '\0' || whole > (VGPU_SIZE_MAX >> shift))
        return -1;
    uint64_t n = (whole << shift) + fraction_times(frac, nfrac, 1ull << shift);
    if (n < 1 || n > VGPU_SIZE_MAX)
        return -1;
    *bytes = n;
    return 0;
}
