/* The graph executor linked into every exported library (API: pipeline_runtime.h).
 *
 * It reads the blob (format: pipeline/link/blob.py) and its binary executor
 * plan (pipeline/link/plan.py), never JSON: the plan lists the tensors
 * ("entries": storage id, dtype, shape), the graph's arguments (inputs and
 * params, by name), the outputs and the nodes to run in order, each a kernel
 * `int32_t f(void **args)` (inputs then outputs) or a copy. Every count,
 * offset, index and size read from the blob is checked before use, so a
 * truncated or corrupted blob gives an error message, never a crash
 * (tests/runtime/fuzz_blob.c fuzzes exactly this reader).
 *
 * The blob's sha256 and the library's code digest (the blob's trailer) are
 * checked by the Python loader, not here: the structure is validated field by
 * field instead, which is what keeps a bad blob from crashing us (corrupted
 * weights would run, with wrong numbers).
 *
 * Zero-copy inputs and shared params are in binding.c, node by node execution
 * (profiling, the debug executor) in debug.c (internals: executor_internal.h).
 */
#define _GNU_SOURCE
#include "pipeline_runtime.h"

#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "executor_internal.h"
#include "sha256.h"

#define BLOB_SYMBOL "__pipeline_dev_mblob"
#define BLOB_VERSION 4u
#define BLOB_FIXED 80u   /* magic, version, reserved, total, header length, 3 sections */
#define TRAILER 64u      /* the blob's sha256, then the code digest the link stamps */
#ifndef PL_MAX_STORAGE /* the fuzzer lowers it: a fuzzed shape must not allocate GBs */
#define PL_MAX_STORAGE ((uint64_t)1 << 46)
#endif
#define PARAM_LIST_MAGIC 0xF7E58D4F05049CB7ull
#define PARAM_ARRAY_MAGIC 0xDD5E40F096B4A13Full

typedef void *(*resolve_fn)(void *ctx, const char *symbol);

#include "dtypes.h" /* DTYPES: the dtype codes, sizes and DLPack codes */
#include "pages.h"  /* arena_alloc, copy_weights: huge pages, pages given back */

#include "parallel.h" /* pl_parallel: the parallel kernels' thread team */

/* Present when a kernel of the library uses libgomp; weak, so a library
 * without parallel kernels does not need libgomp at all. */
extern void omp_set_num_threads(int) __attribute__((weak));

int fail(pl_executor *h, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->error, sizeof h->error, fmt, ap);
    va_end(ap);
    return -1;
}

#include "reader.h" /* struct reader, take, read_u, read_count, read_str */

static int read_eid(pl_executor *h, struct reader *r, uint32_t *eid) {
    uint64_t v;
    if (read_u(h, r, 4, &v)) return -1;
    if (v >= h->n_entries)
        return fail(h, "plan corrupted: entry %llu of %u", (unsigned long long)v, h->n_entries);
    *eid = (uint32_t)v;
    return 0;
}

static int read_entries(pl_executor *h, struct reader *r) {
    if (read_count(h, r, 16, &h->n_entries)) return -1;
    h->entries = calloc(h->n_entries ? h->n_entries : 1, sizeof *h->entries);
    if (!h->entries) return fail(h, "out of memory");
    for (uint32_t e = 0; e < h->n_entries; e++) {
        struct entry *t = &h->entries[e];
        uint64_t sid, dtype, ndim, dim, offset;
        if (read_u(h, r, 4, &sid) || read_u(h, r, 1, &dtype) || read_u(h, r, 1, &ndim) ||
            read_u(h, r, 2, &dim) || read_u(h, r, 8, &offset))
            return -1;
        if (sid >= h->n_entries || dtype >= N_DTYPES || ndim > MAX_NDIM ||
            offset > PL_MAX_STORAGE)
            return fail(h, "plan corrupted: entry %u has storage %llu, dtype %llu, ndim %llu, "
                        "offset %llu", e, (unsigned long long)sid, (unsigned long long)dtype,
                        (unsigned long long)ndim, (unsigned long long)offset);
        t->sid = (uint32_t)sid, t->dtype = (uint8_t)dtype, t->ndim = (uint8_t)ndim;
        t->offset = (size_t)offset;
        uint64_t nbytes = DTYPES[dtype].size ? DTYPES[dtype].size : 1;
        for (uint32_t d = 0; d < ndim; d++) {
            if (read_u(h, r, 8, &dim)) return -1;
            /* Overflow-safe product, capped: PL_MAX_STORAGE is far below 2^63. */
            if ((int64_t)dim < 0 || (dim && nbytes > PL_MAX_STORAGE / dim))
                return fail(h, "plan corrupted: entry %u has dimension %lld", e, (long long)dim);
            t->shape[d] = (int64_t)dim;
            nbytes *= dim;
        }
        uint64_t per_byte = 8 / DTYPES[dtype].dl_bits; /* sub-byte: 2 or 4 a byte */
        t->nbytes = (size_t)(DTYPES[dtype].size ? nbytes : (nbytes + per_byte - 1) / per_byte);
        if (sid + 1 > h->n_storage) h->n_storage = (uint32_t)sid + 1;
    }
    return 0;
}

static int read_nodes(pl_executor *h, struct reader *r, resolve_fn resolve, void *ctx) {
    if (read_count(h, r, 16, &h->n_nodes)) return -1;
    h->nodes = calloc(h->n_nodes ? h->n_nodes : 1, sizeof *h->nodes);
    /* Every node holds at least one argument, so the pool needs at most bytes/4. */
    size_t pool = (size_t)(r->end - r->p) / 4 + 1, used = 0;
    h->eid_pool = calloc(pool, sizeof *h->eid_pool);
    h->ptr_pool = calloc(pool, sizeof *h->ptr_pool);
    if (!h->nodes || !h->eid_pool || !h->ptr_pool) return fail(h, "out of memory");
    for (uint32_t k = 0; k < h->n_nodes; k++) {
        struct node *n = &h->nodes[k];
        uint64_t kind, reserved, n_in, n_out;
        if (read_u(h, r, 1, &kind) || read_u(h, r, 1, &reserved) || read_u(h, r, 2, &n_in) ||
            read_u(h, r, 2, &n_out) || read_str(h, r, &n->name) || read_str(h, r, &n->func))
            return -1;
        if (kind > 1 || (kind == 1 && (n_in != 1 || n_out != 1)) || n_out == 0 ||
            n_in + n_out > pool - used)
            return fail(h, "plan corrupted: node %u has kind %llu, %llu inputs, %llu outputs",
                        k, (unsigned long long)kind, (unsigned long long)n_in,
                        (unsigned long long)n_out);
        n->is_copy = (uint8_t)kind, n->n_in = (uint16_t)n_in, n->n_out = (uint16_t)n_out;
        n->eids = h->eid_pool + used, n->args = h->ptr_pool + used;
        used += n_in + n_out;
        for (uint32_t a = 0; a < n_in + n_out; a++)
            if (read_eid(h, r, &n->eids[a])) return -1;
        if (n->is_copy) {
            if (h->entries[n->eids[0]].nbytes != h->entries[n->eids[1]].nbytes)
                return fail(h, "plan corrupted: copy node '%s' between tensors of different "
                            "sizes", n->name);
        } else if (!(n->fn = (kernel_fn)resolve(ctx, n->func))) {
            return fail(h, "kernel symbol '%s' of node '%s' not found in the library",
                        n->func, n->name);
        }
    }
    return 0;
}

static int read_plan(pl_executor *h, struct reader *r, resolve_fn resolve, void *ctx) {
    if (read_entries(h, r)) return -1;
    if (read_count(h, r, 9, &h->n_args)) return -1;
    h->arg_eid = calloc(h->n_args + 1, sizeof *h->arg_eid);
    h->arg_name = calloc(h->n_args + 1, sizeof *h->arg_name);
    h->is_param = calloc(h->n_args + 1, 1);
    h->slots = calloc(h->n_args + 1, sizeof *h->slots);
    if (!h->arg_eid || !h->arg_name || !h->is_param || !h->slots) return fail(h, "out of memory");
    for (uint32_t a = 0; a < h->n_args; a++)
        if (read_eid(h, r, &h->arg_eid[a]) || read_str(h, r, &h->arg_name[a])) return -1;
    if (read_count(h, r, 9, &h->n_outputs)) return -1;
    h->out_eid = calloc(h->n_outputs + 1, sizeof *h->out_eid);
    h->out_name = calloc(h->n_outputs + 1, sizeof *h->out_name);
    if (!h->out_eid || !h->out_name) return fail(h, "out of memory");
    for (uint32_t o = 0; o < h->n_outputs; o++)
        if (read_eid(h, r, &h->out_eid[o]) || read_str(h, r, &h->out_name[o])) return -1;
    if (read_nodes(h, r, resolve, ctx)) return -1;
    if (r->p != r->end) return fail(h, "plan corrupted: %zu trailing bytes", (size_t)(r->end - r->p));
    return 0;
}

/* Every node argument from where its entry lives now. */
static void fill_args(pl_executor *h) {
    for (uint32_t k = 0; k < h->n_nodes; k++)
        for (uint32_t a = 0; a < (uint32_t)h->nodes[k].n_in + h->nodes[k].n_out; a++)
            h->nodes[k].args[a] = h->entries[h->nodes[k].eids[a]].data;
}

/* Inputs and params must keep their values across runs: a kernel writing into
 * their storage is a memory-planning bug, caught here instead of giving silent
 * wrong answers. (So an input's storage holds nothing but the input and the
 * reshapes aliasing it, all read-only, which is what lets pl_set_input_zero_copy
 * and pl_share_input swap it for another buffer.) Then one 64-byte aligned,
 * zeroed arena holds every storage id, each sized for its largest entry. */
static int setup_storage(pl_executor *h) {
    size_t *offset = calloc(h->n_storage + 1, sizeof *offset);
    int64_t *owner = malloc((h->n_storage + 1) * sizeof *owner);
    int rc = -1;
    if (!offset || !owner) { fail(h, "out of memory"); goto out; }
    for (uint32_t s = 0; s < h->n_storage; s++) owner[s] = -1;
    for (uint32_t a = 0; a < h->n_args; a++) {
        uint32_t sid = h->entries[h->arg_eid[a]].sid;
        if (owner[sid] >= 0) {
            fail(h, "inputs '%s' and '%s' share storage %u", h->arg_name[owner[sid]],
                 h->arg_name[a], sid);
            goto out;
        }
        owner[sid] = a;
        if (h->entries[h->arg_eid[a]].offset) {
            fail(h, "plan corrupted: input '%s' lies at an offset in its storage",
                 h->arg_name[a]);
            goto out;
        }
    }
    for (uint32_t k = 0; k < h->n_nodes; k++) {
        struct node *n = &h->nodes[k];
        for (uint32_t o = n->n_in; o < n->n_in + n->n_out; o++) {
            uint32_t sid = h->entries[n->eids[o]].sid;
            if (owner[sid] >= 0) {
                fail(h, "node '%s' writes storage %u, which holds '%s'", n->name, sid,
                     h->arg_name[owner[sid]]);
                goto out;
            }
        }
    }
    for (uint32_t e = 0; e < h->n_entries; e++) { /* offset[] holds sizes for now */
        const struct entry *t = &h->entries[e];
        if (t->offset + t->nbytes > offset[t->sid]) offset[t->sid] = t->offset + t->nbytes;
    }
    uint64_t total = 0;
    for (uint32_t s = 0; s < h->n_storage; s++) {
        uint64_t size = (offset[s] + ALIGN - 1) / ALIGN * ALIGN;
        offset[s] = (size_t)total;
        total += size;
        if (total > PL_MAX_STORAGE) { fail(h, "plan needs too much storage"); goto out; }
    }
    h->home = calloc(h->n_storage + 1, sizeof *h->home);
    h->home_arena = calloc(h->n_storage + 1, sizeof *h->home_arena);
    h->arena = calloc(1, sizeof *h->arena);
    if (h->arena) h->arena->refs = 1;
    if (!h->home || !h->home_arena || !h->arena ||
        arena_alloc(&h->arena->data, (size_t)total, ALIGN)) {
        if (h->arena) h->arena->data = NULL;
        fail(h, "out of memory: the plan needs %llu bytes", (unsigned long long)total);
        goto out;
    }
    if ((size_t)total < HUGE_PAGE) /* a mapping of its own (pages.h) is zero already */
        memset(h->arena->data, 0, (size_t)total);
    h->arena->bytes = (size_t)total;
    for (uint32_t s = 0; s < h->n_storage; s++) {
        h->home[s] = (char *)h->arena->data + offset[s];
        h->home_arena[s] = h->arena;
    }
    for (uint32_t e = 0; e < h->n_entries; e++)
        h->entries[e].data = (char *)h->home[h->entries[e].sid] + h->entries[e].offset;
    fill_args(h);
    rc = 0;
out:
    free(offset);
    free(owner);
    return rc;
}

/* Storage swaps (binding.c) and the arenas' reference counts: executor_internal.h. */
void point_storage(pl_executor *h, uint32_t sid, void *data) {
    for (uint32_t e = 0; e < h->n_entries; e++)
        if (h->entries[e].sid == sid) h->entries[e].data = (char *)data + h->entries[e].offset;
    fill_args(h);
}

void arena_retain(struct arena *a) { atomic_fetch_add(&a->refs, 1); }

void arena_release(struct arena *a) {
    if (a && atomic_fetch_sub(&a->refs, 1) == 1) {
        arena_free(a->data, a->bytes);
        free(a);
    }
}

/* The params section: TVM's param dict (pipeline/runtime/params.py). Each
 * array goes into the graph argument of its name, checked for dtype and shape. */
static int bind_params(pl_executor *h, struct reader *r) {
    uint64_t magic, count, n_arrays, v;
    const uint8_t *p = NULL;
    if (r->p == r->end) return 0; /* a graph without params may store none */
    if (read_u(h, r, 8, &magic) || read_u(h, r, 8, &v)) return -1;
    if (magic != PARAM_LIST_MAGIC) return fail(h, "params corrupted: bad magic");
    if (read_u(h, r, 8, &count)) return -1;
    if (count > (size_t)(r->end - r->p) / 8) return fail(h, "params corrupted: bad count");
    const struct reader names_at = *r;
    for (uint64_t i = 0; i < count; i++) /* skip the names; read them with the arrays */
        if (read_u(h, r, 8, &v) || take(h, r, (size_t)v, &p)) return -1;
    if (read_u(h, r, 8, &n_arrays)) return -1;
    if (n_arrays != count) return fail(h, "params corrupted: %llu names, %llu arrays",
                                       (unsigned long long)count, (unsigned long long)n_arrays);
    struct reader names = names_at;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t len = 0, ndim, code, bits, lanes, size;
        const uint8_t *name = NULL;
        read_u(h, &names, 8, &len), take(h, &names, (size_t)len, &name); /* checked above */
        uint32_t a = 0;
        while (a < h->n_args && !(strlen(h->arg_name[a]) == len &&
                                  memcmp(h->arg_name[a], name, (size_t)len) == 0))
            a++;
        if (a == h->n_args)
            return fail(h, "param '%.*s' is not used by the graph", (int)(len > 200 ? 200 : len),
                        (const char *)name);
        const struct entry *t = &h->entries[h->arg_eid[a]];
        if (read_u(h, r, 8, &magic) || read_u(h, r, 8, &v) || read_u(h, r, 8, &v) ||
            read_u(h, r, 4, &ndim) || read_u(h, r, 1, &code) || read_u(h, r, 1, &bits) ||
            read_u(h, r, 2, &lanes))
            return -1;
        if (magic != PARAM_ARRAY_MAGIC) return fail(h, "params corrupted: bad array magic");
        int same = ndim == t->ndim && lanes == 1 && (code == DTYPES[t->dtype].dl_code &&
                                                    bits == DTYPES[t->dtype].dl_bits);
        if (t->dtype == 4 && code == 6 && bits == 8) same = ndim == t->ndim && lanes == 1;
        for (uint32_t d = 0; same && d < ndim; d++) {
            if (read_u(h, r, 8, &v)) return -1;
            same = (int64_t)v == t->shape[d];
        }
        if (!same || read_u(h, r, 8, &size) || size != t->nbytes)
            return fail(h, "param '%s' does not match the graph's dtype %s and shape",
                        h->arg_name[a], DTYPES[t->dtype].name);
        if (take(h, r, (size_t)size, &p)) return -1;
        copy_weights(t->data, p, (size_t)size, h->blob_mapped);
        h->is_param[a] = 1;
    }
    if (r->p != r->end) return fail(h, "params corrupted: trailing bytes");
    return 0;
}

/* Blob prefix and section table, then the plan, storage and params. */
static int open_blob(pl_executor *h, const uint8_t *blob, size_t size, resolve_fn resolve,
                     void *ctx) {
    if (size < BLOB_FIXED + TRAILER || memcmp(blob, "PLMBLOB\0", 8) != 0)
        return fail(h, "not a pipeline blob (bad magic or too short)");
    uint64_t version = le(blob + 8, 4), total = le(blob + 16, 8), header = le(blob + 24, 8);
    if (version != BLOB_VERSION)
        return fail(h, "blob from format version %llu, this runtime reads version %u; "
                    "rebuild the library", (unsigned long long)version, BLOB_VERSION);
    if (total != size || header > total - BLOB_FIXED - TRAILER)
        return fail(h, "blob truncated or corrupted: length %llu, %zu bytes available",
                    (unsigned long long)total, size);
    struct reader section[3]; /* graph JSON (unused here), params, plan */
    static const char *names[3] = {"graph", "params", "plan"};
    for (int s = 0; s < 3; s++) {
        uint64_t off = le(blob + 32 + 16 * s, 8), len = le(blob + 40 + 16 * s, 8);
        if (off < BLOB_FIXED + header || off > total - TRAILER || len > total - TRAILER - off)
            return fail(h, "blob corrupted: section %s out of bounds", names[s]);
        section[s] = (struct reader){blob + off, blob + off + len, names[s]};
    }
    h->blob = blob;
    if (read_plan(h, &section[2], resolve, ctx) || setup_storage(h) ||
        bind_params(h, &section[1]))
        return -1;
    for (uint32_t a = 0; a < h->n_args; a++) /* slots: inputs, then params */
        if (!h->is_param[a]) h->slots[h->n_inputs++] = a;
    for (uint32_t a = 0, n = h->n_inputs; a < h->n_args; a++)
        if (h->is_param[a]) h->slots[n++] = a;
    return 0;
}

/* Create from any blob: what pl_create and the fuzzer share. mapped: the blob is a
 * library's, read-only data of its file (copy_weights). */
static pl_executor *create_from_blob(const uint8_t *blob, size_t size, int mapped,
                                     resolve_fn resolve, void *ctx, char *err,
                                     size_t err_size) {
    pl_executor *h = calloc(1, sizeof *h);
    if (!h) {
        if (err_size) snprintf(err, err_size, "out of memory");
        return NULL;
    }
    h->blob_mapped = (uint8_t)mapped;
    if (open_blob(h, blob, size, resolve, ctx)) {
        if (err_size) snprintf(err, err_size, "%s", h->error);
        pl_destroy(h);
        return NULL;
    }
    return h;
}

static void *resolve_dl(void *handle, const char *symbol) { return dlsym(handle, symbol); }

static const char self_marker; /* static, so its address is ours even if pl_* are interposed */

/* Whether the blob's bytes match the sha256 stored after them (a blob too short,
 * of another version or with a wrong length passes here: open_blob names that). The blob is
 * read-only data of this library, so one check per load is enough. */
static _Atomic int blob_checked;

static int blob_intact(const uint8_t *blob, size_t size) {
    if (blob_checked || size < BLOB_FIXED + TRAILER || le(blob + 8, 4) != BLOB_VERSION ||
        le(blob + 16, 8) != size)
        return 1;
    uint8_t digest[32];
    sha256(blob, size - TRAILER, digest);
    give_back_pages(blob, size); /* the library's read-only data: see pages.h */
    if (memcmp(digest, blob + size - TRAILER, 32) != 0) return 0;
    blob_checked = 1;
    return 1;
}

static pl_executor *create(char *err, size_t err_size, int check) {
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    void *handle = NULL, *blob;
    /* Find this library (the .so the executor is linked into), then its blob and
     * the blob symbol's size, which bounds every read. */
    if (!dladdr(&self_marker, &info) || !(handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD))
        || !(blob = dlsym(handle, BLOB_SYMBOL)) ||
        !dladdr1(blob, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym) {
        if (err_size)
            snprintf(err, err_size, "cannot find the library's %s symbol: %s", BLOB_SYMBOL,
                     handle ? "not a library exported by pipeline" : dlerror());
        if (handle) dlclose(handle);
        return NULL;
    }
    if (check && !blob_intact(blob, sym->st_size)) {
        if (err_size)
            snprintf(err, err_size, "checksum mismatch: the blob's sha256 differs from the one "
                     "stored in it; the library is corrupted, rebuild it");
        dlclose(handle);
        return NULL;
    }
    pl_executor *h = create_from_blob(blob, sym->st_size, 1, resolve_dl, handle, err,
                                       err_size);
    if (h) h->dl_handle = handle;
    else dlclose(handle);
    return h;
}

API pl_executor *pl_create(char *err, size_t err_size) { return create(err, err_size, 1); }

API pl_executor *pl_create_unchecked(char *err, size_t err_size) {
    return create(err, err_size, 0);
}

API void pl_destroy(pl_executor *h) {
    if (!h) return;
    free(h->entries), free(h->arg_eid), free(h->arg_name), free(h->is_param), free(h->slots);
    free(h->out_eid), free(h->out_name), free(h->nodes), free(h->eid_pool), free(h->ptr_pool);
    for (uint32_t s = 0; h->home_arena && s < h->n_storage; s++)
        if (h->home_arena[s] != h->arena) arena_release(h->home_arena[s]); /* shared params */
    arena_release(h->arena);
    free(h->home), free(h->home_arena);
    if (h->dl_handle) dlclose(h->dl_handle);
    free(h);
}

API const char *pl_last_error(const pl_executor *h) { return h ? h->error : "no executor"; }
API int pl_num_inputs(const pl_executor *h) { return (int)h->n_inputs; }
API int pl_num_params(const pl_executor *h) { return (int)(h->n_args - h->n_inputs); }
API int pl_num_outputs(const pl_executor *h) { return (int)h->n_outputs; }
API size_t pl_storage_bytes(const pl_executor *h) { return h->arena ? h->arena->bytes : 0; }

API int pl_get_input_index(const pl_executor *h, const char *name) {
    for (uint32_t i = 0; i < h->n_args; i++)
        if (strcmp(h->arg_name[h->slots[i]], name) == 0) return (int)i;
    return -1;
}

void describe(const pl_executor *h, uint32_t eid, const char *name, pl_tensor_info *info) {
    const struct entry *t = &h->entries[eid];
    *info = (pl_tensor_info){name, DTYPES[t->dtype].name, t->ndim, t->shape, t->nbytes};
}

API int pl_input_info(const pl_executor *h, int i, pl_tensor_info *info) {
    if (i < 0 || (uint32_t)i >= h->n_args) return -1;
    describe(h, h->arg_eid[h->slots[i]], h->arg_name[h->slots[i]], info);
    return 0;
}

API int pl_output_info(const pl_executor *h, int i, pl_tensor_info *info) {
    if (i < 0 || (uint32_t)i >= h->n_outputs) return -1;
    describe(h, h->out_eid[i], h->out_name[i], info);
    return 0;
}

/* The entry behind input slot or output i, checked against nbytes; NULL with
 * the error set otherwise. */
static struct entry *tensor(pl_executor *h, int is_output, int i, size_t nbytes) {
    uint32_t n = is_output ? h->n_outputs : h->n_args;
    if (i < 0 || (uint32_t)i >= n) {
        fail(h, "%s index %d out of range: the graph has %u", is_output ? "output" : "input",
             i, n);
        return NULL;
    }
    struct entry *t = &h->entries[is_output ? h->out_eid[i] : h->arg_eid[h->slots[i]]];
    if (nbytes != t->nbytes) {
        /* A library is built for one shape (one batch size): say which. */
        char shape[24 * MAX_NDIM + 2] = "[";
        for (int d = 0; d < t->ndim; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld",
                     d ? "," : "", (long long)t->shape[d]);
        strcat(shape, "]");
        fail(h, "%s '%s': the library was built for shape %s %s (%zu bytes), given %zu bytes",
             is_output ? "output" : "input",
             is_output ? h->out_name[i] : h->arg_name[h->slots[i]], shape,
             DTYPES[t->dtype].name, t->nbytes, nbytes);
        return NULL;
    }
    return t;
}

API int pl_set_input(pl_executor *h, int i, const void *data, size_t nbytes) {
    struct entry *t = tensor(h, 0, i, nbytes);
    if (!t) return -1;
    if (t->data != h->home[t->sid]) /* it was zero-copy: back to its own storage */
        point_storage(h, t->sid, h->home[t->sid]);
    memcpy(t->data, data, nbytes);
    return 0;
}

API int pl_get_input(pl_executor *h, int i, void *data, size_t nbytes) {
    struct entry *t = tensor(h, 0, i, nbytes);
    if (!t) return -1;
    memcpy(data, t->data, nbytes);
    return 0;
}

API int pl_get_output(pl_executor *h, int i, void *data, size_t nbytes) {
    struct entry *t = tensor(h, 1, i, nbytes);
    if (!t) return -1;
    memcpy(data, t->data, nbytes);
    return 0;
}

API int pl_set_num_threads(pl_executor *h, int n) {
    if (n < 0) return fail(h, "the thread count must be >= 0, got %d", n);
    h->num_threads = n;
    h->run_team.n = h->run_alone.n = 0; /* measured again for the new count */
    h->runs = h->runs_alone = 0;
    return 0;
}

/* libgomp's thread count is per calling thread, so it is set before every run. */
void apply_threads(const pl_executor *h) {
    if (h->num_threads > 0 && omp_set_num_threads) omp_set_num_threads(h->num_threads);
}

int run_node(pl_executor *h, const struct node *n) {
    if (n->is_copy) {
        memmove(n->args[1], n->args[0], h->entries[n->eids[1]].nbytes); /* may alias */
        return 0;
    }
    int32_t rc = n->fn(n->args);
    return rc ? fail(h, "node '%s' (function '%s') returned an error (%d)", n->name, n->func,
                     (int)rc)
              : 0;
}

/* Whether a run uses one thread instead of the executor's count. Two threads can
 * be slower than one for a whole model even where each kernel is faster with them:
 * on a VM whose two vCPUs sit on different chiplets (~400 ns a cache-line round trip,
 * against ~80 at other times on the same VM), what the worker wrote moves between
 * the cores when the next kernel reads it, and the consumers pay; on a loaded machine
 * the worker is preempted. So the executor times its runs either way and runs the
 * faster way, by the median of each way's last RUN_SAMPLES counted runs: what a
 * benchmark and a service see is the typical run. The best of them had decided
 * before (the OS only ever delays a run), but with two threads on slow core-to-core
 * links a way can have a fast best and a slow typical run: shufflenet kept its two
 * threads at 4.23 ms median against 3.89 alone. A median of 5 still ignores two
 * runs the OS delayed (a timeslice, 4 ms: numpy's OpenBLAS threads spin for a while
 * after it is imported, and the first runs of a fresh process flipped to one thread
 * for good when a mean decided). The first run (it starts the workers) is not
 * counted; runs 1-3 use the threads, 4-6 one thread (4 not counted: the first run
 * after a switch moves the data between the caches and looks slower than it is);
 * then the faster way, and at runs 8, 16, 32 and then every RUN_EXPLORE runs a pair
 * the other way (the machine changes; it costs ~2/RUN_EXPLORE of the gap), of which
 * the second is counted, and not the run after the pair. */
#define RUN_EXPLORE 64

/* The median of a way's recorded runs (of the first three: the middle one). */
static float run_typical(const struct run_times *t) {
    unsigned n = t->n < RUN_SAMPLES ? t->n : RUN_SAMPLES;
    float v[RUN_SAMPLES];
    for (unsigned i = 0; i < n; i++) { /* insertion sort: at most 5 values */
        unsigned j = i;
        for (; j > 0 && v[j - 1] > t->s[i]; j--) v[j] = v[j - 1];
        v[j] = t->s[i];
    }
    return n ? v[(n - 1) / 2] : 0;
}

static void run_record(struct run_times *t, double seconds) {
    t->s[t->n++ % RUN_SAMPLES] = (float)seconds;
    if (t->n >= 2 * RUN_SAMPLES) t->n -= RUN_SAMPLES; /* stays >= RUN_SAMPLES */
}

/* Whether run k starts a pair the other way: at 8, 16, 32, then every RUN_EXPLORE. */
static int exploring(unsigned k) {
    return k >= 8 && ((k & (k - 1)) == 0 || k % RUN_EXPLORE == 0);
}

static int run_alone(pl_executor *h, int *counted) {
    *counted = 0;
    if (h->num_threads <= 1) return 0;
    unsigned k = h->runs++;
    if (k < 7) {
        *counted = k != 0 && k != 4;
        return k >= 4;
    }
    int alone = run_typical(&h->run_alone) < run_typical(&h->run_team);
    if (exploring(k) || exploring(k - 1)) {
        *counted = !exploring(k);
        return !alone;
    }
    *counted = !exploring(k - 2);
    return alone;
}

API unsigned pl_runs_alone(const pl_executor *h) { return h->runs_alone; }

API int pl_run(pl_executor *h) {
    int counted, alone = run_alone(h, &counted);
    if (alone && omp_set_num_threads) omp_set_num_threads(1);
    else apply_threads(h);
    h->runs_alone += alone;
    double start = team_now();
    for (uint32_t k = 0; k < h->n_nodes; k++)
        if (run_node(h, &h->nodes[k])) return -1;
    if (counted) run_record(alone ? &h->run_alone : &h->run_team, team_now() - start);
    return 0;
}
