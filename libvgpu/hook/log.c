/*
 * log.c - "vgpu: ..." lines on stderr, at the level VGPU_LOG_LEVEL sets
 * (error; warn, the default; info; debug). Each distinct message is printed
 * once per process, so a refusal inside a training loop can't flood the log.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "hook.h"

static int level = -1;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
#define SEEN 512
static uint64_t seen[SEEN];   /* hashes of the messages printed, 0 = empty */

static int configured_level(void)
{
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l >= 0)
        return l;
    const char *e = getenv("VGPU_LOG_LEVEL");
    l = VGPU_LOG_WARN;
    if (e != NULL) {
        if (strcasecmp(e, "error") == 0)
            l = VGPU_LOG_ERROR;
        else if (strcasecmp(e, "warn") == 0 || strcasecmp(e, "warning") == 0)
            l = VGPU_LOG_WARN;
        else if (strcasecmp(e, "info") == 0)
            l = VGPU_LOG_INFO;
        else if (strcasecmp(e, "debug") == 0)
            l = VGPU_LOG_DEBUG;
    }
    __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    return l;
}

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h ? h : 1;
}

/* 1 if the message is new (and now remembered). */
static int first_time(uint64_t h)
{
    int fresh = 1;
    pthread_mutex_lock(&log_lock);
    for (unsigned i = 0; i < SEEN; i++) {
        unsigned k = (unsigned)((h + i) % SEEN);
        if (seen[k] == h) {
            fresh = 0;
            break;
        }
        if (seen[k] == 0) {
            seen[k] = h;
            break;
        }
    }
    pthread_mutex_unlock(&log_lock);
    return fresh;
}

void vgpu_log(int lvl, const char *fmt, ...)
{
    if (lvl > configured_level())
        return;
    char buf[1024];
    int n = snprintf(buf, sizeof(buf), "vgpu: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (!first_time(hash(buf + n)))
        return;
    size_t len = strlen(buf);
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

const char *vgpu_fmt_size(uint64_t n, char *buf, unsigned len)
{
    static const char units[] = "TGMK";
    for (int i = 0; i < 4; i++) {
        uint64_t scale = 1ull << (10 * (4 - i));
        if (n >= scale) {
            if (n % scale == 0)
                snprintf(buf, len, "%llu%c", (unsigned long long)(n / scale), units[i]);
            else
                snprintf(buf, len, "%.1f%c", (double)n / (double)scale, units[i]);
            return buf;
        }
    }
    snprintf(buf, len, "%lluB", (unsigned long long)n);
    return buf;
}
