/* Memory for weights (included by executor.c and vm.c).
 *
 * arena_alloc: arenas from HUGE_PAGE bytes on are mappings aligned to it, offered to the
 * kernel for transparent huge pages (Linux's THP "madvise" mode backs only what asks).
 * The weights of a batch-1 dense layer stream from memory once per run; on 4 KiB pages
 * every page of them is a TLB miss, which on a VM is a two-level page walk: a 144 MiB
 * read ran at 12-21 GB/s on 4 KiB pages, 30-34 GB/s on 2 MiB ones (alexnet's first
 * fully connected layer reached 55-60% of the measured read bandwidth).
 *
 * copy_weights: a copy out of the library's own read-only data (mapped from its file)
 * gives back each copied chunk's whole pages: a later read faults them in again from
 * the file, and the process does not hold the weights twice (vgg19: 700 MB) while it
 * copies them. */
#ifndef PIPELINE_PAGES_H
#define PIPELINE_PAGES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)
#define WEIGHT_CHUNK ((size_t)2 << 20)

/* *data = `bytes` bytes aligned to `align` (64); from HUGE_PAGE bytes on, a mapping of
 * its own aligned to HUGE_PAGE with the THP hint. Own mappings because from malloc a
 * big arena may be heap memory an earlier free left resident (glibc's mmap threshold
 * rises to 32 MiB after such frees): it would then never go back to the system at
 * arena_free, and a process's resident size would not show what a model holds.
 * 0, or -1 out of memory; release with arena_free(data, bytes). A mapping comes zeroed
 * (its pages are the kernel's zero pages until written); malloc's memory does not. */
static int arena_alloc(void **data, size_t bytes, size_t align) {
    if (bytes < HUGE_PAGE) return posix_memalign(data, align, bytes ? bytes : align);
    char *map = mmap(NULL, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return -1;
    char *start = (char *)(((uintptr_t)map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (start > map) munmap(map, (size_t)(start - map)); /* trim to the alignment */
    size_t tail = (size_t)(map + bytes + HUGE_PAGE - (start + bytes));
    if (tail) munmap(start + bytes, tail);
#ifdef MADV_HUGEPAGE
    madvise(start, bytes, MADV_HUGEPAGE); /* a hint: without THP, 4 KiB pages as before */
#endif
    *data = start;
    return 0;
}

/* Release what arena_alloc(data, bytes, ...) gave (data may be NULL). */
static void arena_free(void *data, size_t bytes) {
    if (data && bytes >= HUGE_PAGE) munmap(data, bytes);
    else free(data);
}

/* Drop the whole pages of [start, start + n) (read-only data of a mapped file). */
static void give_back_pages(const uint8_t *start, size_t n) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)start + page - 1) / page * page;
    uintptr_t hi = (uintptr_t)(start + n) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* memcpy(dst, src, n), giving src's pages back chunk by chunk when it is `mapped`. */
static void copy_weights(void *dst, const uint8_t *src, size_t n, int mapped) {
    for (size_t done = 0; done < n; done += WEIGHT_CHUNK) {
        size_t len = n - done < WEIGHT_CHUNK ? n - done : WEIGHT_CHUNK;
        memcpy((char *)dst + done, src + done, len);
        if (mapped) give_back_pages(src + done, len);
    }
}

#endif
