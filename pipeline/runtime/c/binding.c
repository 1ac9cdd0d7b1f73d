/* Zero-copy inputs and shared params (API: pipeline_runtime.h).
 *
 * Both change where the storage of one input or param lives: every tensor of
 * that storage id (the argument itself and reshapes aliasing it) and every node
 * argument reading one are pointed at the new place (point_storage). The memory
 * plan never lets a node write such a storage (checked in setup_storage), so the
 * caller's buffer, or the other executor's params, are only ever read.
 */
#define _GNU_SOURCE /* madvise */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "executor_internal.h"

/* The entry of input slot i (inputs, then params), or NULL with the error set. */
static struct entry *slot_entry(pl_executor *h, int i, const char *what) {
    if (i < 0 || (uint32_t)i >= h->n_args) {
        fail(h, "%s: input index %d out of range: the graph has %u inputs and params", what, i,
             h->n_args);
        return NULL;
    }
    return &h->entries[h->arg_eid[h->slots[i]]];
}

API int pl_set_input_zero_copy(pl_executor *h, int i, void *data, size_t nbytes) {
    struct entry *t = slot_entry(h, i, "set_input_zero_copy");
    if (!t) return -1;
    const char *name = h->arg_name[h->slots[i]];
    if (nbytes != t->nbytes)
        return fail(h, "input '%s' holds %zu bytes, the zero-copy buffer has %zu", name,
                    t->nbytes, nbytes);
    if (!data || (uintptr_t)data % ALIGN)
        return fail(h, "input '%s': the zero-copy buffer at %p is not %u-byte aligned", name,
                    data, ALIGN);
    point_storage(h, t->sid, data);
    return 0;
}

/* After pl_share_input nothing reads this executor's own copy of storage sid any
 * more: give its whole pages back to the OS (the copy pl_create made is what a
 * shared param would otherwise cost), unless another executor shares from this
 * one's arena and may read it. */
static void drop_own_copy(pl_executor *h, uint32_t sid, void *start) {
    if (atomic_load(&h->arena->refs) != 1) return;
    size_t size = 0;
    for (uint32_t e = 0; e < h->n_entries; e++)
        if (h->entries[e].sid == sid && h->entries[e].nbytes > size) size = h->entries[e].nbytes;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), at = (uintptr_t)start;
    uintptr_t lo = (at + page - 1) / page * page, hi = (at + size) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

API int pl_share_input(pl_executor *h, pl_executor *other, int i) {
    struct entry *t = slot_entry(h, i, "share_input");
    if (!t) return -1;
    if (!other || other == h) return fail(h, "share_input: needs another executor");
    if (other->blob != h->blob)
        return fail(h, "share_input: the other executor runs another library's graph");
    /* The same blob, so the same plan: slot i and its storage id mean the same there. */
    uint32_t sid = t->sid;
    struct arena *from = other->home_arena[sid];
    if (from != h->home_arena[sid]) { /* keep the other's storage alive while we use it */
        arena_retain(from);
        if (h->home_arena[sid] != h->arena) arena_release(h->home_arena[sid]);
        else drop_own_copy(h, sid, h->home[sid]);
        h->home_arena[sid] = from;
    }
    h->home[sid] = other->home[sid];
    point_storage(h, sid, h->home[sid]);
    return 0;
}

API void *pl_input_data(pl_executor *h, int i) {
    struct entry *t = slot_entry(h, i, "input_data");
    return t ? t->data : NULL;
}
