/* A bounds-checked little-endian cursor over one section of a library's binary data:
 * the graph executor's blob (executor.c) and the VM's .ro (vm.c) read their sections
 * with it. The including file defines pl_executor (each its own) and
 * `static int fail(pl_executor *h, const char *fmt, ...)`, which records the message
 * and returns -1. Every read checks the bytes left first, so a corrupted count or
 * length gives one error line, never a read past the section. */
#ifndef PIPELINE_READER_H
#define PIPELINE_READER_H

#include <stdint.h>
#include <string.h>

struct reader {
    const uint8_t *p, *end;
    const char *what; /* the section, for messages ("params", ".ro bytecode section") */
};

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int take(pl_executor *h, struct reader *r, size_t n, const uint8_t **out) {
    if ((size_t)(r->end - r->p) < n)
        return fail(h, "%s truncated: %zu bytes needed, %zu left", r->what, n,
                    (size_t)(r->end - r->p));
    *out = r->p;
    r->p += n;
    return 0;
}

static int read_u(pl_executor *h, struct reader *r, int n, uint64_t *v) {
    const uint8_t *p = NULL;
    if (take(h, r, (size_t)n, &p)) return -1;
    *v = le(p, n);
    return 0;
}

/* A count of records of at least min_size bytes each: bounding it by the bytes
 * left keeps a corrupted count from allocating gigabytes. */
static int read_count(pl_executor *h, struct reader *r, size_t min_size, uint32_t *n) {
    uint64_t v;
    if (read_u(h, r, 4, &v)) return -1;
    if (v > (size_t)(r->end - r->p) / min_size)
        return fail(h, "%s corrupted: count %llu exceeds the bytes left", r->what,
                    (unsigned long long)v);
    *n = (uint32_t)v;
    return 0;
}

/* u32 length, the bytes, then a NUL (so names are used in place). */
static int read_str(pl_executor *h, struct reader *r, const char **s) {
    uint64_t n;
    const uint8_t *p = NULL;
    if (read_u(h, r, 4, &n) || take(h, r, (size_t)n + 1, &p)) return -1;
    if (p[n] != 0 || memchr(p, 0, (size_t)n))
        return fail(h, "%s corrupted: a name is not NUL-terminated", r->what);
    *s = (const char *)p;
    return 0;
}

#endif
