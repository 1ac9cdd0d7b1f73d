/* The VM interpreter linked into every library built with `executor: vm` (instead of
 * the graph executor, whose C API it implements: pipeline_runtime.h, so pipeline-run
 * and C programs use either library alike).
 *
 * It reads a .ro executable (format: pipeline/vm/format.py, docs/vm.md): from the
 * library's own __pipeline_vm_exec symbol (pl_create) or from bytes the caller gives
 * (pl_vm_load: Python's Executable.load_exec); kernels are resolved by symbol in the
 * library, as the graph executor does. Every count, offset, index and register read
 * from the .ro is checked when it is loaded, so a corrupted file gives one error
 * message, never a crash (tests/runtime/fuzz_ro.c fuzzes this reader).
 *
 * Registers hold tensors (data pointer, dtype, shape) or storages; storages come from
 * a pool: released ones are kept by size and handed out again, so a run after the
 * first allocates nothing. Constants are copied once into one arena on huge pages
 * (read_consts; pages.h). A caller may take an output's storage instead of copying it
 * (pl_vm_take_outputs); it comes back to the pool when given back, from any thread.
 */
#define _GNU_SOURCE
#include "pipeline_runtime.h"

#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))
#define MAX_NDIM 32u
#define RO_SYMBOL "__pipeline_vm_exec"
#define RO_VERSION 3u
#define RO_HEAD 88u
#define RO_DIGEST 32u
#ifndef PL_MAX_STORAGE /* the fuzzer lowers it: a fuzzed size must not allocate GBs */
#define PL_MAX_STORAGE ((uint64_t)1 << 46)
#endif
#ifndef PL_MAX_REGS /* registers of one function (the fuzzer lowers it too) */
#define PL_MAX_REGS (1u << 20)
#endif
#ifndef PL_MAX_STEPS /* instructions per run; 0: no limit (the fuzzer sets one: a Goto
                       * to itself must not hang it) */
#define PL_MAX_STEPS 0
#endif
#define MAX_DEPTH 64 /* nested function calls (If and Loop bodies nest, never recurse) */
enum { ALLOC_STORAGE = 1, ALLOC_TENSOR, LOAD_CONST, INVOKE_PACKED, COPY, VIEW, MOVE, IF, GOTO,
       INVOKE, RET, SCALAR, ADD_IMM, LESS, COPY_AT, VIEW_AT, FAIL, SHAPE_OF, MUL_DIM,
       ALLOC_TENSOR_DIMS, VIEW_DIMS, INVOKE_PACKED_DIMS, ADD_DIM,
       /* 30-39: data-dependent shapes */
       VIEW_SHAPE = 30, ALLOC_SHAPED, VIEW_ROWS };
/* FAIL's reasons (pipeline/vm/bytecode.py FAILURES) */
static const char *const FAILURES[] = {
    "a Loop ended before its trip count: its scan outputs would be shorter than planned "
    "(needs dynamic shapes)"};
#define N_FAILURES (sizeof FAILURES / sizeof FAILURES[0])
#define DT_INT64 3
#define DT_BOOL 4

#include "dtypes.h" /* DTYPES: the dtype codes (pipeline/vm/bytecode.py) and sizes */
#include "pages.h"  /* arena_alloc, copy_weights: huge pages, pages given back */

#include "parallel.h" /* pl_parallel: the parallel kernels' thread team */
extern void omp_set_num_threads(int) __attribute__((weak));

typedef int32_t (*kernel_fn)(void **args);
/* A kernel over symbolic rows: dims holds the values of its symbols (docs/vm.md). */
typedef int32_t (*kernel_dims_fn)(void **args, const int64_t *dims);

struct storage {
    long refs; /* atomic: a taken output's storage is given back from any thread */
    size_t size;
    void *data;
    struct storage *next; /* in the pool's free list */
    int borrowed; /* a caller's zero-copy buffer or a constant: never pooled, data never
                   * freed here (nor written) */
    int mapped;   /* data is its own mmap (storage_new, from LAZY_BYTES) */
};

/* Storages from this size on are mapped, not malloc'd and zeroed: their pages become
 * resident only where a run writes. Storages are planned at the dimensions' bounds, and
 * a decode step (seq 1 of a bound of 128) writes a sliver of its logits' and
 * activations' storages; zeroing made all of them resident (~20 MB of a test
 * decoder's peak RSS; with bounds in the thousands, gigabytes). Nothing reads what
 * it did not write: a pooled storage holds the last user's bytes anyway. */
#define LAZY_BYTES ((size_t)256 << 10)

/* obj kinds: a sequence (a storage of element objects) and none (an empty optional):
 * vm_sequence.h */
enum { OBJ_TENSOR = 2, OBJ_SEQ = 3, OBJ_NONE = 4, SEQ_STORAGE = 2 };

struct obj { /* a register: nothing, a storage, or a tensor viewing a storage */
    uint8_t kind, dtype, ndim; /* kind: 0 nothing, 1 storage, 2 tensor, 3 sequence, 4 none */
    struct storage *st;
    void *data;
    size_t nbytes;
    int64_t shape[MAX_NDIM];
};

/* A declared type; shape[d] = -1 - k for symbolic dimension k (main's parameters and
 * results only), nbytes then at the dimensions' upper bounds. */
struct type { const char *name; uint8_t dtype, ndim; int64_t shape[MAX_NDIM]; size_t nbytes; };
struct dim { const char *name; int64_t low, high; };

struct ins { uint16_t op; uint32_t n; const int64_t *w; void **args; };

struct func {
    const char *name;
    uint32_t n_params, n_results, n_regs, n_code;
    struct type *params, *results;
    struct ins *code;
    struct obj *regs; /* one register file: no function calls itself */
    struct obj *out;  /* what its Ret returns, until the caller takes it */
    int active;
};

struct pl_executor {
    uint32_t n_funcs, n_consts, n_kernels, n_dims;
    struct dim *dims;        /* the symbolic dimensions and their bounds */
    int64_t (*in_shape)[MAX_NDIM]; /* each input's shape: pl_set_input_shape's */
    size_t *in_nbytes;       /* its bytes; (size_t)-1 until a symbolic one is set */
    struct func *funcs;
    struct storage **consts; /* the constants, each a storage over const_arena */
    void *const_arena;
    size_t const_arena_bytes;
    struct type *const_types;
    kernel_fn *kernels;
    const char **kernel_names; /* into the .ro, which outlives the executor */
    int64_t *words;          /* every instruction's operands */
    void **arg_pool;
    struct ins *ins_pool;
    struct type *type_pool;
    struct storage **inputs; /* main's parameters, set by pl_set_input */
    struct storage **zero_copy; /* per input, the caller's buffer runs read, or NULL */
    struct obj *outputs;     /* main's results of the last run */
    int ran, num_threads, depth;
    uint64_t steps;
    struct storage *pool;    /* released storages, for reuse */
    struct storage *returned; /* given back by pl_vm_give_back, for the pool (atomic) */
    void *dl_handle;
    char error[512];
};

static int fail(pl_executor *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(pl_executor *h, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->error, sizeof h->error, fmt, ap);
    va_end(ap);
    return -1;
}

#include "reader.h" /* struct reader, take, read_u, read_count, read_str */

/* The sections' names in messages; read_type tells the constants' by its address. */
static const char CONSTS_SECTION[] = ".ro constants section";

/* Byte size of dtype and shape, or -1 past PL_MAX_STORAGE or for a bad value. */
static int64_t size_of(int64_t dtype, int64_t ndim, const int64_t *shape) {
    if (dtype < 0 || (uint64_t)dtype >= N_DTYPES || ndim < 0 || ndim > (int64_t)MAX_NDIM)
        return -1;
    uint64_t n = DTYPES[dtype].size ? DTYPES[dtype].size : 1;
    for (int64_t d = 0; d < ndim; d++) /* no division: this runs for every tensor made */
        if (shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[d], &n) ||
            n > PL_MAX_STORAGE)
            return -1;
    if (DTYPES[dtype].size) return (int64_t)n;
    uint64_t per_byte = 8 / DTYPES[dtype].dl_bits; /* sub-byte: 2 or 4 a byte */
    return (int64_t)((n + per_byte - 1) / per_byte);
}

static int read_type(pl_executor *h, struct reader *r, struct type *t) {
    int64_t high[MAX_NDIM];
    uint64_t dtype, ndim, pad, dim;
    if (read_str(h, r, &t->name) || read_u(h, r, 1, &dtype) || read_u(h, r, 1, &ndim) ||
        read_u(h, r, 2, &pad))
        return -1;
    if (dtype >= N_DTYPES || ndim > MAX_NDIM)
        return fail(h, "%s corrupted: type of '%s'", r->what, t->name);
    t->dtype = (uint8_t)dtype, t->ndim = (uint8_t)ndim;
    for (uint32_t d = 0; d < ndim; d++) {
        if (read_u(h, r, 8, &dim)) return -1;
        t->shape[d] = (int64_t)dim;
        int64_t k = -1 - t->shape[d]; /* a symbolic dimension (the constants have none) */
        if (t->shape[d] < 0 && (k >= (int64_t)h->n_dims || r->what == CONSTS_SECTION))
            return fail(h, "%s corrupted: shape of '%s'", r->what, t->name);
        high[d] = t->shape[d] < 0 ? h->dims[k].high : t->shape[d];
    }
    int64_t n = size_of(t->dtype, t->ndim, high);
    if (n < 0) return fail(h, "%s corrupted: shape of '%s'", r->what, t->name);
    t->nbytes = (size_t)n;
    return 0;
}

/* ---- the storage pool ---- */

static struct storage *storage_new(pl_executor *h, size_t size) {
    for (struct storage **p = &h->pool; *p; p = &(*p)->next)
        if ((*p)->size == size) { /* a released one of this size */
            struct storage *s = *p;
            *p = s->next;
            s->refs = 1, s->next = NULL;
            return s;
        }
    struct storage *s = calloc(1, sizeof *s);
    if (s && size >= LAZY_BYTES) { /* the kernel's zero pages, made resident as written */
        s->data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        s->mapped = s->data != MAP_FAILED;
    }
    if (!s || (!s->mapped && posix_memalign(&s->data, 64, size ? size : 64))) {
        free(s);
        fail(h, "out of memory: %zu bytes", size);
        return NULL;
    }
    if (!s->mapped) memset(s->data, 0, size);
    s->refs = 1, s->size = size;
    return s;
}

static void storage_free(struct storage *s) {
    if (s->mapped) munmap(s->data, s->size);
    else free(s->data);
    free(s);
}

static void seq_free(pl_executor *h, struct storage *s);

static void storage_retain(struct storage *s) {
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
}

static void storage_release(pl_executor *h, struct storage *s) {
    if (s && __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        if (s->borrowed == SEQ_STORAGE) seq_free(h, s);
        else if (s->borrowed) free(s);
        else s->next = h->pool, h->pool = s;
    }
}

/* The storages given back since the last run (pl_vm_give_back), into the pool. */
static void take_returned(pl_executor *h) {
    struct storage *s = __atomic_exchange_n(&h->returned, NULL, __ATOMIC_ACQUIRE);
    while (s) {
        struct storage *next = s->next;
        s->next = h->pool, h->pool = s;
        s = next;
    }
}

static void obj_clear(pl_executor *h, struct obj *o) {
    if (o->kind) storage_release(h, o->st);
    o->kind = 0, o->st = NULL;
}

/* dst = a tensor over storage st (taking a reference to it). Only the ndim dimensions
 * used are copied: a register is ~300 bytes, MAX_NDIM's shape most of it, and copying
 * whole registers (two or three times an instruction) was most of the interpreter's
 * time in a decode step. dst's old value is released last: `shape` (or src in
 * obj_set) may live in what it frees (r = SequenceAt(r, i) reads an element of the
 * sequence in r). */
static void obj_tensor(pl_executor *h, struct obj *dst, uint8_t dtype, uint8_t ndim,
                       struct storage *st, void *data, size_t nbytes, const int64_t *shape) {
    struct storage *old = dst->kind ? dst->st : NULL;
    storage_retain(st);
    dst->kind = OBJ_TENSOR, dst->dtype = dtype, dst->ndim = ndim;
    dst->st = st, dst->data = data, dst->nbytes = nbytes;
    if (ndim) memcpy(dst->shape, shape, (size_t)ndim * sizeof *shape);
    storage_release(h, old);
}

static void obj_set(pl_executor *h, struct obj *dst, const struct obj *src) {
    if (dst == src) return; /* Move r, r */
    if (src->kind == OBJ_TENSOR) {
        obj_tensor(h, dst, src->dtype, src->ndim, src->st, src->data, src->nbytes, src->shape);
        return;
    }
    struct storage *old = dst->kind ? dst->st : NULL;
    if (src->kind) storage_retain(src->st);
    dst->kind = src->kind, dst->dtype = 0, dst->ndim = 0, dst->st = src->st;
    dst->data = src->data, dst->nbytes = 0;
    storage_release(h, old);
}

/* ---- reading the .ro ---- */

static int read_kernels(pl_executor *h, struct reader *r, void *(*resolve)(void *, const char *),
                        void *ctx) {
    if (read_count(h, r, 5, &h->n_kernels)) return -1;
    h->kernels = calloc(h->n_kernels + 1, sizeof *h->kernels);
    h->kernel_names = calloc(h->n_kernels + 1, sizeof *h->kernel_names);
    if (!h->kernels || !h->kernel_names) return fail(h, "out of memory");
    for (uint32_t k = 0; k < h->n_kernels; k++) {
        const char *name;
        if (read_str(h, r, &name)) return -1;
        h->kernel_names[k] = name;
        if (!(*(void **)&h->kernels[k] = resolve(ctx, name)))
            return fail(h, "kernel symbol '%s' not found in the library", name);
    }
    return 0;
}

/* The constants, copied once into one arena (pages.h: on huge pages from 2 MiB: a
 * decoder's weights stream from memory every decode step, and on the 4 KiB pages of
 * the mapped file or of malloc they were read at two thirds of the speed). From the
 * library's own .ro (`mapped`: read-only data of its file) each constant's pages are
 * given back as it is copied, so the process holds the weights once. Each constant is
 * a borrowed storage over its part of the arena (never pooled, never written). */
static size_t padded64(size_t n) { return (n + 63) & ~(size_t)63; }

static int read_consts(pl_executor *h, struct reader *r, const uint8_t *ro, size_t data_end,
                       int mapped) {
    if (read_count(h, r, 24, &h->n_consts)) return -1;
    h->consts = calloc(h->n_consts + 1, sizeof *h->consts);
    h->const_types = calloc(h->n_consts + 1, sizeof *h->const_types);
    uint64_t *at = calloc(h->n_consts + 1, sizeof *at);
    if (!h->consts || !h->const_types || !at) return free(at), fail(h, "out of memory");
    size_t total = 0;
    for (uint32_t c = 0; c < h->n_consts; c++) {
        struct type *t = &h->const_types[c];
        uint64_t nbytes;
        if (read_type(h, r, t) || read_u(h, r, 8, &nbytes) || read_u(h, r, 8, &at[c]))
            return free(at), -1;
        if (nbytes != t->nbytes || at[c] > data_end || nbytes > data_end - at[c])
            return free(at), fail(h, ".ro constants section corrupted: constant '%s'", t->name);
        total += padded64(nbytes); /* each at most the .ro's size */
    }
    if (arena_alloc(&h->const_arena, total, 64))
        return free(at), fail(h, "out of memory: %zu bytes of constants", total);
    h->const_arena_bytes = total;
    size_t off = 0;
    for (uint32_t c = 0; c < h->n_consts; c++) {
        size_t nbytes = h->const_types[c].nbytes;
        struct storage *s = calloc(1, sizeof *s);
        if (!s) return free(at), fail(h, "out of memory");
        *s = (struct storage){1, nbytes, (char *)h->const_arena + off, NULL, 1, 0};
        h->consts[c] = s;
        copy_weights(s->data, ro + at[c], nbytes, mapped);
        off += padded64(nbytes);
    }
    free(at);
    return 0;
}

/* Operands that must be registers of fn, per opcode: which words (a bitmask of the
 * first 4) and whether the list after word `list_at` is registers too. */
static int reg_ok(const struct func *fn, int64_t r) { return r >= 0 && r < fn->n_regs; }

static int check_list(const struct func *fn, const struct ins *in, uint32_t at, int regs) {
    if (at >= in->n || in->w[at] < 0 || (uint64_t)in->w[at] > in->n - at - 1) return 0;
    for (int64_t k = 0; regs && k < in->w[at]; k++)
        if (!reg_ok(fn, in->w[at + 1 + k])) return 0;
    return 1;
}

/* Dim operands (docs/vm.md): a constant >= 0, or -1 - r for the int64 in register r. */
static int dims_ok(const struct func *fn, const int64_t *w, int64_t n) {
    for (int64_t k = 0; k < n; k++)
        if (w[k] < 0 ? w[k] == INT64_MIN || !reg_ok(fn, -1 - w[k])
                     : (uint64_t)w[k] > PL_MAX_STORAGE)
            return 0;
    return 1;
}

static int check_sequence(const struct func *fn, const struct ins *in);

static int check_ins(const pl_executor *h, const struct func *fn, const struct ins *in) {
    const int64_t *w = in->w;
    uint32_t n = in->n;
    switch (in->op) {
    case ALLOC_STORAGE:
        return n == 3 && reg_ok(fn, w[0]) && w[1] >= 0 && (uint64_t)w[1] <= PL_MAX_STORAGE;
    case ALLOC_TENSOR: case VIEW:
        return n >= 5 && (uint64_t)w[4] == n - 5 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) &&
               w[2] >= 0 && (uint64_t)w[2] <= PL_MAX_STORAGE && size_of(w[3], w[4], w + 5) >= 0;
    case LOAD_CONST: return n == 2 && reg_ok(fn, w[0]) && w[1] >= 0 && w[1] < h->n_consts;
    case INVOKE_PACKED:
        return n >= 2 && w[0] >= 0 && w[0] < h->n_kernels && (uint64_t)w[1] == n - 2 &&
               check_list(fn, in, 1, 1);
    case COPY: case MOVE: return n == 2 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]);
    case IF:
        return n == 3 && reg_ok(fn, w[0]) && w[1] >= 0 && w[1] < fn->n_code && w[2] >= 0 &&
               w[2] < fn->n_code;
    case GOTO: return n == 1 && w[0] >= 0 && w[0] < fn->n_code;
    case INVOKE: {
        if (n < 3 || w[0] < 0 || w[0] >= h->n_funcs || !check_list(fn, in, 1, 1)) return 0;
        uint32_t at = 2 + (uint32_t)w[1];
        const struct func *callee = &h->funcs[w[0]];
        return check_list(fn, in, at, 1) && (uint64_t)w[at] == n - at - 1 &&
               (uint64_t)w[1] == callee->n_params && (uint64_t)w[at] == callee->n_results;
    }
    case RET:
        return n >= 1 && (uint64_t)w[0] == n - 1 && (uint64_t)w[0] == fn->n_results &&
               check_list(fn, in, 0, 1);
    case SCALAR: return n == 3 && reg_ok(fn, w[0]) && (w[1] == DT_INT64 || w[1] == DT_BOOL);
    case FAIL: return n == 1 && w[0] >= 0 && (uint64_t)w[0] < N_FAILURES;
    case ADD_IMM: return n == 3 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]);
    case VIEW_SHAPE: return n == 3 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) && reg_ok(fn, w[2]);
    case ALLOC_SHAPED:
        return n == 3 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) && w[2] >= 0 &&
               (uint64_t)w[2] < N_DTYPES;
    case VIEW_ROWS:
        return n == 4 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) && reg_ok(fn, w[2]) && w[3] >= 0 &&
               w[3] < (int64_t)MAX_NDIM;
    case LESS: case COPY_AT:
        return n == 3 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) && reg_ok(fn, w[2]);
    case VIEW_AT:
        return n >= 5 && (uint64_t)w[4] == n - 5 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) &&
               reg_ok(fn, w[2]) && size_of(w[3], w[4], w + 5) >= 0;
    case SHAPE_OF:
        return n == 3 && reg_ok(fn, w[0]) && reg_ok(fn, w[1]) && w[2] >= 0 && w[2] < MAX_NDIM;
    case MUL_DIM: case ADD_DIM: return n == 3 && reg_ok(fn, w[0]) && dims_ok(fn, w + 1, 2);
    case ALLOC_TENSOR_DIMS: case VIEW_DIMS:
        return n >= 5 && (uint64_t)w[4] == n - 5 && w[4] <= MAX_NDIM && reg_ok(fn, w[0]) &&
               reg_ok(fn, w[1]) && w[2] >= 0 && (uint64_t)w[2] <= PL_MAX_STORAGE && w[3] >= 0 &&
               (uint64_t)w[3] < N_DTYPES && dims_ok(fn, w + 5, w[4]);
    case INVOKE_PACKED_DIMS: {
        if (n < 3 || w[0] < 0 || w[0] >= h->n_kernels || !check_list(fn, in, 1, 1)) return 0;
        uint32_t at = 2 + (uint32_t)w[1];
        return check_list(fn, in, at, 0) && (uint64_t)w[at] == n - at - 1 &&
               w[at] <= MAX_NDIM && dims_ok(fn, w + at + 1, w[at]);
    }
    default: return in->op >= 40 && in->op < 50 && check_sequence(fn, in);
    }
}

static int read_code(pl_executor *h, struct reader *r, struct ins **all, uint32_t *count) {
    const uint8_t *start = r->p;
    size_t words = 0, n_ins = 0;
    while (r->p < r->end) { /* count first: operands and instructions */
        uint64_t op, pad, n;
        const uint8_t *p;
        if (read_u(h, r, 2, &op) || read_u(h, r, 2, &pad) || read_u(h, r, 4, &n) ||
            n > (size_t)(r->end - r->p) / 8 || take(h, r, (size_t)n * 8, &p))
            return fail(h, ".ro bytecode section corrupted at instruction %zu", n_ins);
        words += n, n_ins++;
    }
    h->words = calloc(words + 1, sizeof *h->words);
    h->arg_pool = calloc(words + 1, sizeof *h->arg_pool);
    *all = h->ins_pool = calloc(n_ins + 1, sizeof **all);
    if (!h->words || !h->arg_pool || !*all) return fail(h, "out of memory");
    r->p = start, words = 0;
    for (size_t k = 0; k < n_ins; k++) {
        struct ins *in = &(*all)[k];
        uint64_t op = 0, pad = 0, n = 0, v = 0;
        read_u(h, r, 2, &op), read_u(h, r, 2, &pad), read_u(h, r, 4, &n); /* checked above */
        in->op = (uint16_t)op, in->n = (uint32_t)n, in->w = h->words + words;
        in->args = h->arg_pool + words;
        for (uint64_t i = 0; i < n; i++) read_u(h, r, 8, &v), h->words[words++] = (int64_t)v;
    }
    *count = (uint32_t)n_ins;
    return 0;
}

static int read_dims(pl_executor *h, struct reader *r) {
    if (read_count(h, r, 21, &h->n_dims)) return -1;
    h->dims = calloc(h->n_dims + 1, sizeof *h->dims);
    if (!h->dims) return fail(h, "out of memory");
    for (uint32_t k = 0; k < h->n_dims; k++) {
        uint64_t low, high;
        if (read_str(h, r, &h->dims[k].name) || read_u(h, r, 8, &low) || read_u(h, r, 8, &high))
            return -1;
        if ((int64_t)low < 0 || (int64_t)high < (int64_t)low || high > PL_MAX_STORAGE)
            return fail(h, ".ro functions section corrupted: bounds of '%s'", h->dims[k].name);
        h->dims[k].low = (int64_t)low, h->dims[k].high = (int64_t)high;
    }
    return 0;
}

static int read_funcs(pl_executor *h, struct reader *r, struct ins *all, uint32_t n_ins) {
    if (read_dims(h, r) || read_count(h, r, 37, &h->n_funcs)) return -1;
    if (h->n_funcs == 0) return fail(h, ".ro has no function");
    h->funcs = calloc(h->n_funcs, sizeof *h->funcs);
    /* Every type takes at least 9 bytes of the section. */
    size_t n_types = (size_t)(r->end - r->p) / 9 + 1, used = 0;
    h->type_pool = calloc(n_types, sizeof *h->type_pool);
    if (!h->funcs || !h->type_pool) return fail(h, "out of memory");
    for (uint32_t f = 0; f < h->n_funcs; f++) {
        struct func *fn = &h->funcs[f];
        uint64_t np, nr, regs, pad, first, count;
        if (read_str(h, r, &fn->name) || read_u(h, r, 4, &np) || read_u(h, r, 4, &nr) ||
            read_u(h, r, 4, &regs) || read_u(h, r, 4, &pad) || read_u(h, r, 8, &first) ||
            read_u(h, r, 8, &count))
            return -1;
        if (np + nr > n_types - used || regs < np || regs > PL_MAX_REGS || first > n_ins ||
            count > n_ins - first || count == 0)
            return fail(h, ".ro functions section corrupted: function '%s'", fn->name);
        fn->n_params = (uint32_t)np, fn->n_results = (uint32_t)nr, fn->n_regs = (uint32_t)regs;
        fn->params = h->type_pool + used, fn->results = fn->params + np;
        used += np + nr;
        for (uint32_t t = 0; t < np + nr; t++)
            if (read_type(h, r, &fn->params[t])) return -1;
        fn->code = all + first, fn->n_code = (uint32_t)count;
        fn->regs = calloc(regs + 1, sizeof *fn->regs);
        fn->out = calloc(nr + 1, sizeof *fn->out);
        if (!fn->regs || !fn->out) return fail(h, "out of memory");
    }
    if (r->p != r->end) return fail(h, ".ro functions section corrupted: trailing bytes");
    for (uint32_t f = 0; f < h->n_funcs; f++) {
        const struct func *fn = &h->funcs[f];
        for (uint32_t k = 0; k < fn->n_code; k++)
            if (!check_ins(h, fn, &fn->code[k]))
                return fail(h, ".ro bytecode corrupted: function '%s', instruction %u "
                            "(opcode %u)", fn->name, k, fn->code[k].op);
        uint16_t last = fn->code[fn->n_code - 1].op;
        if (last != RET && last != GOTO && last != FAIL)
            return fail(h, ".ro function '%s' does not end in a return", fn->name);
    }
    return 0;
}

static int open_ro(pl_executor *h, const uint8_t *ro, size_t size, int mapped,
                   void *(*resolve)(void *, const char *), void *ctx) {
    if (size < RO_HEAD + RO_DIGEST || memcmp(ro, "PLVMEXE\0", 8) != 0)
        return fail(h, "not a pipeline VM executable (bad magic or too short)");
    uint64_t version = le(ro + 8, 4), total = le(ro + 16, 8);
    if (version != RO_VERSION)
        return fail(h, "VM executable format version %llu, this runtime reads version %u; "
                    "rebuild the library", (unsigned long long)version, RO_VERSION);
    if (total != size) return fail(h, "VM executable truncated or corrupted: length %llu, "
                                   "%zu bytes available", (unsigned long long)total, size);
    struct reader s[4];
    static const char *names[4] = {".ro functions section", CONSTS_SECTION,
                                   ".ro kernels section", ".ro bytecode section"};
    for (int k = 0; k < 4; k++) {
        uint64_t off = le(ro + 24 + 16 * k, 8), len = le(ro + 32 + 16 * k, 8);
        if (off < RO_HEAD || off > total - RO_DIGEST || len > total - RO_DIGEST - off)
            return fail(h, "%s out of bounds", names[k]);
        s[k] = (struct reader){ro + off, ro + off + len, names[k]};
    }
    struct ins *all = NULL;
    uint32_t n_ins = 0;
    if (read_kernels(h, &s[2], resolve, ctx) ||
        read_consts(h, &s[1], ro, size - RO_DIGEST, mapped) ||
        read_code(h, &s[3], &all, &n_ins) || read_funcs(h, &s[0], all, n_ins))
        return -1;
    const struct func *main_fn = &h->funcs[0];
    h->inputs = calloc(main_fn->n_params + 1, sizeof *h->inputs);
    h->outputs = calloc(main_fn->n_results + 1, sizeof *h->outputs);
    h->zero_copy = calloc(main_fn->n_params + 1, sizeof *h->zero_copy);
    if (!h->inputs || !h->outputs || !h->zero_copy) return fail(h, "out of memory");
    h->in_shape = calloc(main_fn->n_params + 1, sizeof *h->in_shape);
    h->in_nbytes = calloc(main_fn->n_params + 1, sizeof *h->in_nbytes);
    if (!h->in_shape || !h->in_nbytes) return fail(h, "out of memory");
    for (uint32_t i = 0; i < main_fn->n_params; i++) {
        const struct type *t = &main_fn->params[i];
        if (!(h->inputs[i] = storage_new(h, t->nbytes))) return -1;
        h->in_nbytes[i] = t->nbytes; /* at the bounds: storage for the largest shape */
        for (uint32_t d = 0; d < t->ndim; d++) {
            h->in_shape[i][d] = t->shape[d] < 0 ? -1 : t->shape[d];
            if (t->shape[d] < 0) h->in_nbytes[i] = (size_t)-1; /* set by pl_set_input_shape */
        }
    }
    return 0;
}

/* ---- the interpreter ---- */

static int run_func(pl_executor *h, struct func *fn, struct obj *results);

static int make_tensor(pl_executor *h, struct obj *dst, const struct obj *base,
                       const int64_t *w, int view, const int64_t *shape) {
    if (base->kind == 0)
        return fail(h, "VM: %s of an empty register", view ? "view" : "tensor");
    int64_t size = size_of(w[3], w[4], shape);
    if (size < 0) return fail(h, "VM: a tensor of a bad runtime shape");
    size_t start = (size_t)((char *)base->data - (char *)base->st->data) * (base->kind == OBJ_TENSOR && view);
    if (start + (size_t)w[2] + (size_t)size > base->st->size)
        return fail(h, "VM: a tensor of %zu bytes at offset %lld does not fit its %zu-byte "
                    "storage", (size_t)size, (long long)w[2], base->st->size);
    obj_tensor(h, dst, (uint8_t)w[3], (uint8_t)w[4], base->st,
               (char *)base->st->data + start + w[2], (size_t)size, shape);
    return 0;
}

static int int64_of(pl_executor *h, const struct obj *o, int64_t *v);

/* The values of n dim operands (docs/vm.md) into out. */
static int dim_values(pl_executor *h, const struct func *fn, const int64_t *w, int64_t n,
                      int64_t *out) {
    for (int64_t k = 0; k < n; k++) {
        if (w[k] >= 0) out[k] = w[k];
        else if (int64_of(h, &fn->regs[-1 - w[k]], &out[k])) return -1;
        if (out[k] < 0) return fail(h, "VM: a negative runtime dimension");
    }
    return 0;
}

/* AllocTensorDims, ViewDims: make_tensor of the runtime shape. */
static int make_tensor_dims(pl_executor *h, struct func *fn, const int64_t *w, int view) {
    int64_t shape[MAX_NDIM];
    if (dim_values(h, fn, w + 5, w[4], shape)) return -1;
    return make_tensor(h, &fn->regs[w[0]], &fn->regs[w[1]], w, view, shape);
}

/* dst = a new scalar tensor (int64 or bool) holding value. */
static int new_scalar(pl_executor *h, struct obj *dst, int dtype, int64_t value) {
    struct storage *st = storage_new(h, 8);
    if (!st) return -1;
    if (dtype == DT_BOOL) *(uint8_t *)st->data = value != 0;
    else memcpy(st->data, &value, sizeof value);
    obj_tensor(h, dst, (uint8_t)dtype, 0, st, st->data, DTYPES[dtype].size, NULL);
    storage_release(h, st); /* obj_tensor took its own reference */
    return 0;
}

static int int64_of(pl_executor *h, const struct obj *o, int64_t *v) {
    if (o->kind != 2 || o->dtype != DT_INT64 || o->nbytes != 8)
        return fail(h, "VM: expected an int64 scalar");
    memcpy(v, o->data, sizeof *v);
    return 0;
}

/* Row `index` of a tensor of `total` bytes, rows of `row` bytes: its offset, or -1. */
static int64_t row_offset(int64_t index, size_t row, size_t total) {
    if (index < 0 || (row && (uint64_t)index >= total / row) || (!row && index > 0)) return -1;
    return index * (int64_t)row;
}

static int indexed(pl_executor *h, struct func *fn, const struct ins *in) {
    struct obj *r = fn->regs;
    const int64_t *w = in->w;
    int64_t i = 0, j = 0;
    if (in->op == ADD_IMM)
        return int64_of(h, &r[w[1]], &i) ||
               new_scalar(h, &r[w[0]], DT_INT64, (int64_t)((uint64_t)i + (uint64_t)w[2]));
    if (in->op == LESS)
        return int64_of(h, &r[w[1]], &i) || int64_of(h, &r[w[2]], &j) ||
               new_scalar(h, &r[w[0]], DT_BOOL, i < j);
    if (int64_of(h, &r[w[2]], &i)) return -1;
    const struct obj *src = &r[w[1]];
    if (src->kind != 2) return fail(h, "VM: indexed access to a non-tensor");
    if (in->op == COPY_AT) {
        int64_t at = row_offset(i, src->nbytes, r[w[0]].nbytes);
        if (r[w[0]].kind != 2 || at < 0)
            return fail(h, "VM: row %lld out of range", (long long)i);
        memmove((char *)r[w[0]].data + at, src->data, src->nbytes);
        return 0;
    }
    size_t row = (size_t)size_of(w[3], w[4], w + 5);
    int64_t at = row_offset(i, row, src->nbytes);
    if (at < 0) return fail(h, "VM: row %lld out of range", (long long)i);
    struct obj t = {2, (uint8_t)w[3], (uint8_t)w[4], src->st, (char *)src->data + at, row, {0}};
    memcpy(t.shape, w + 5, (size_t)w[4] * sizeof *t.shape);
    obj_set(h, &r[w[0]], &t);
    return 0;
}

/* ---- data-dependent shapes (ViewShape, AllocShaped, ViewRows) ---- */

/* The element limit of a tensor allocated at run time: $PIPELINE_MAX_TENSOR_ELEMENTS
 * (default 2^34), as the compiler's check_elements. */
static uint64_t max_elements(void) {
    const char *env = getenv("PIPELINE_MAX_TENSOR_ELEMENTS");
    char *end = NULL;
    unsigned long long v = env && *env ? strtoull(env, &end, 10) : 0;
    return env && *env && end && *end == 0 ? (uint64_t)v : (uint64_t)1 << 34;
}

/* The shape a 1-d int64 tensor holds, into t->ndim and t->shape (the data pointer,
 * dtype and sizes are the caller's); -1 with the error set if it is not one. */
static int shape_from(pl_executor *h, const struct obj *s, struct obj *t) {
    if (s->kind != 2 || s->dtype != DT_INT64 || s->ndim != 1 || s->shape[0] > (int64_t)MAX_NDIM)
        return fail(h, "VM: a runtime shape is not a 1-d int64 tensor of at most %u values",
                    MAX_NDIM);
    t->ndim = (uint8_t)s->shape[0];
    memcpy(t->shape, s->data, (size_t)t->ndim * sizeof *t->shape);
    uint64_t count = 1;
    for (uint8_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0) return fail(h, "VM: runtime shape has a negative dimension");
        count = t->shape[d] && count > UINT64_MAX / (uint64_t)t->shape[d]
                    ? UINT64_MAX : count * (uint64_t)t->shape[d];
    }
    if (count > max_elements())
        return fail(h, "VM: a runtime shape of %llu elements is more than the limit of %llu "
                    "($PIPELINE_MAX_TENSOR_ELEMENTS)", (unsigned long long)count,
                    (unsigned long long)max_elements());
    int64_t nbytes = size_of(t->dtype, t->ndim, t->shape); /* int4: two elements a byte */
    if (nbytes < 0) return fail(h, "VM: a runtime shape too large for a storage");
    t->nbytes = (size_t)nbytes;
    return 0;
}

static int dynamic_shape(pl_executor *h, struct func *fn, const struct ins *in) {
    struct obj *r = fn->regs;
    const int64_t *w = in->w;
    if (in->op == ALLOC_SHAPED) {
        struct obj t = {2, (uint8_t)w[2], 0, NULL, NULL, 0, {0}};
        if (shape_from(h, &r[w[1]], &t) || !(t.st = storage_new(h, t.nbytes))) return -1;
        t.data = t.st->data;
        obj_clear(h, &r[w[0]]);
        r[w[0]] = t; /* takes storage_new's reference */
        return 0;
    }
    const struct obj *src = &r[w[1]];
    if (src->kind != 2) return fail(h, "VM: a runtime view of a non-tensor");
    struct obj t = *src;
    if (in->op == VIEW_SHAPE) {
        if (shape_from(h, &r[w[2]], &t)) return -1;
    } else {
        const struct obj *like = &r[w[2]];
        if (like->kind != 2 || w[3] >= like->ndim || src->ndim == 0)
            return fail(h, "VM: ViewRows of a tensor without that dimension");
        t.shape[0] = like->shape[w[3]];
        int64_t nbytes = size_of(t.dtype, t.ndim, t.shape); /* int4: two elements a byte */
        if (nbytes < 0) return fail(h, "VM: ViewRows of a bad shape");
        t.nbytes = (size_t)nbytes;
    }
    if (t.nbytes > src->nbytes || (in->op == VIEW_ROWS && t.shape[0] > src->shape[0]))
        return fail(h, "VM: a data-dependent result of %zu bytes exceeds its %zu-byte bound",
                    t.nbytes, src->nbytes);
    obj_set(h, &r[w[0]], &t);
    return 0;
}

static int invoke_packed(pl_executor *h, struct func *fn, struct ins *in) {
    for (int64_t a = 0; a < in->w[1]; a++) {
        const struct obj *o = &fn->regs[in->w[2 + a]];
        if (o->kind != 2) return fail(h, "VM: kernel argument %lld is not a tensor", (long long)a);
        in->args[a] = o->data;
    }
    int32_t rc;
    if (in->op == INVOKE_PACKED_DIMS) {
        int64_t dims[MAX_NDIM];
        const int64_t *d = in->w + 2 + in->w[1];
        if (dim_values(h, fn, d + 1, d[0], dims)) return -1;
        rc = ((kernel_dims_fn)(void *)h->kernels[in->w[0]])(in->args, dims);
    } else {
        rc = h->kernels[in->w[0]](in->args);
    }
    return rc ? fail(h, "kernel %s returned an error (%d): an input value out of its range",
                     h->kernel_names[in->w[0]], (int)rc) : 0;
}

static int call(pl_executor *h, struct func *fn, const struct ins *in) {
    struct func *callee = &h->funcs[in->w[0]];
    if (callee->active) return fail(h, "VM: function '%s' calls itself", callee->name);
    if (h->depth >= MAX_DEPTH) return fail(h, "VM: calls nested more than %d deep", MAX_DEPTH);
    for (int64_t a = 0; a < in->w[1]; a++) obj_set(h, &callee->regs[a], &fn->regs[in->w[2 + a]]);
    struct obj *out = callee->out;
    h->depth++;
    int rc = run_func(h, callee, out);
    h->depth--;
    if (rc) return -1;
    const int64_t *dst = in->w + 3 + in->w[1];
    for (uint32_t k = 0; k < callee->n_results; k++) {
        obj_set(h, &fn->regs[dst[k]], &out[k]);
        obj_clear(h, &out[k]);
    }
    return 0;
}

#include "vm_sequence.h" /* sequences and optionals: opcodes 40-47 */

static int step(pl_executor *h, struct func *fn, uint32_t *pc, struct obj *results, int *done) {
    struct ins *in = &fn->code[*pc];
    const int64_t *w = in->w;
    struct obj *r = fn->regs;
    (*pc)++;
    switch (in->op) {
    case ALLOC_STORAGE: {
        struct storage *st = storage_new(h, (size_t)w[1]);
        if (!st) return -1;
        obj_clear(h, &r[w[0]]);
        r[w[0]] = (struct obj){.kind = 1, .st = st, .data = st->data};
        return 0; /* the register takes storage_new's reference */
    }
    case ALLOC_TENSOR: return make_tensor(h, &r[w[0]], &r[w[1]], w, 0, w + 5);
    case VIEW: return make_tensor(h, &r[w[0]], &r[w[1]], w, 1, w + 5);
    case ALLOC_TENSOR_DIMS: return make_tensor_dims(h, fn, w, 0);
    case VIEW_DIMS: return make_tensor_dims(h, fn, w, 1);
    case INVOKE_PACKED_DIMS: return invoke_packed(h, fn, in);
    case SHAPE_OF:
        if (r[w[1]].kind != 2 || w[2] >= r[w[1]].ndim)
            return fail(h, "VM: shape of a non-tensor or past its rank");
        return new_scalar(h, &r[w[0]], DT_INT64, r[w[1]].shape[w[2]]);
    case MUL_DIM: {
        int64_t v[2];
        if (dim_values(h, fn, w + 1, 2, v)) return -1;
        if (v[0] && v[1] > (int64_t)PL_MAX_STORAGE / v[0]) return fail(h, "VM: dimension overflow");
        return new_scalar(h, &r[w[0]], DT_INT64, v[0] * v[1]);
    }
    case ADD_DIM: {
        int64_t v[2];
        if (dim_values(h, fn, w + 1, 2, v)) return -1;
        if (v[0] > (int64_t)PL_MAX_STORAGE || v[1] > (int64_t)PL_MAX_STORAGE)
            return fail(h, "VM: dimension overflow");
        return new_scalar(h, &r[w[0]], DT_INT64, v[0] + v[1]);
    }
    case LOAD_CONST: {
        const struct type *t = &h->const_types[w[1]];
        obj_tensor(h, &r[w[0]], t->dtype, t->ndim, h->consts[w[1]], h->consts[w[1]]->data,
                   t->nbytes, t->shape);
        return 0;
    }
    case INVOKE_PACKED: return invoke_packed(h, fn, in);
    case COPY:
        if (r[w[0]].kind != 2 || r[w[1]].kind != 2 || r[w[0]].nbytes != r[w[1]].nbytes)
            return fail(h, "VM: copy between tensors of different sizes");
        memmove(r[w[0]].data, r[w[1]].data, r[w[0]].nbytes);
        return 0;
    case MOVE: obj_set(h, &r[w[0]], &r[w[1]]); return 0;
    case IF:
        if (r[w[0]].kind != 2 || r[w[0]].nbytes == 0) return fail(h, "VM: If on no value");
        *pc = (uint32_t)(*(const uint8_t *)r[w[0]].data ? w[1] : w[2]);
        return 0;
    case GOTO: *pc = (uint32_t)w[0]; return 0;
    case INVOKE: return call(h, fn, in);
    case SCALAR: return new_scalar(h, &r[w[0]], (int)w[1], w[2]);
    case FAIL: return fail(h, "VM: %s", FAILURES[w[0]]);
    case ADD_IMM: case LESS: case COPY_AT: case VIEW_AT: return indexed(h, fn, in);
    case VIEW_SHAPE: case ALLOC_SHAPED: case VIEW_ROWS: return dynamic_shape(h, fn, in);
    case RET:
        for (int64_t k = 0; k < w[0]; k++) obj_set(h, &results[k], &r[w[1 + k]]);
        *done = 1;
        return 0;
    }
    if (in->op >= 40 && in->op < 50) return sequence_op(h, fn, in);
    return fail(h, "VM: bad opcode %u", in->op);
}

/* Run fn (its parameters already in its first registers); results get its Ret's
 * objects (each one reference). The registers are cleared after. */
static int run_func(pl_executor *h, struct func *fn, struct obj *results) {
    uint32_t pc = 0;
    int done = 0, rc = 0;
    fn->active = 1;
    while (!done && rc == 0) {
        if (PL_MAX_STEPS && ++h->steps > PL_MAX_STEPS) rc = fail(h, "VM: step limit reached");
        else if (pc >= fn->n_code) rc = fail(h, "VM: function '%s' ran past its end", fn->name);
        else rc = step(h, fn, &pc, results, &done);
    }
    fn->active = 0;
    for (uint32_t k = 0; k < fn->n_regs; k++) obj_clear(h, &fn->regs[k]);
    return rc;
}

/* ---- the C API (pipeline_runtime.h), over function main ---- */

/* `mapped`: ro is the library's own packed .ro (read-only data of its file). */
static pl_executor *create_from(const uint8_t *ro, size_t size, int mapped,
                                void *(*resolve)(void *, const char *), void *ctx, char *err,
                                size_t err_size) {
    pl_executor *h = calloc(1, sizeof *h);
    if (!h) {
        if (err_size) snprintf(err, err_size, "out of memory");
        return NULL;
    }
    if (open_ro(h, ro, size, mapped, resolve, ctx)) {
        if (err_size) snprintf(err, err_size, "%s", h->error);
        pl_destroy(h);
        return NULL;
    }
    return h;
}

static void *resolve_dl(void *handle, const char *symbol) { return dlsym(handle, symbol); }

static const char self_marker;

/* This library's handle (the .so vm.o is linked into), or NULL with err set. */
static void *self_library(char *err, size_t err_size) {
    Dl_info info;
    void *handle = NULL;
    if (!dladdr(&self_marker, &info) ||
        !(handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD))) {
        if (err_size) snprintf(err, err_size, "cannot find the VM library: %s", dlerror());
        return NULL;
    }
    return handle;
}

/* An executor over the .ro packed into this library. The .ro's sha256 is the
 * Python loader's to check, as the blob's is for the graph executor. */
API pl_executor *pl_create(char *err, size_t err_size) {
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    void *handle = self_library(err, err_size), *ro;
    if (!handle) return NULL;
    if (!(ro = dlsym(handle, RO_SYMBOL)) || !dladdr1(ro, &info, (void **)&sym, RTLD_DL_SYMENT) ||
        !sym) {
        if (err_size) snprintf(err, err_size, "cannot find the library's %s symbol", RO_SYMBOL);
        dlclose(handle);
        return NULL;
    }
    /* The symbol holds the .ro, then the code digest the link stamps (32 bytes). */
    size_t size = sym->st_size;
    if (size >= RO_HEAD && memcmp(ro, "PLVMEXE\0", 8) == 0 &&
        le((const uint8_t *)ro + 16, 8) <= size)
        size = (size_t)le((const uint8_t *)ro + 16, 8);
    pl_executor *h = create_from(ro, size, 1, resolve_dl, handle, err, err_size);
    if (h) h->dl_handle = handle;
    else dlclose(handle);
    return h;
}

API pl_executor *pl_create_unchecked(char *err, size_t err_size) {
    return pl_create(err, err_size);
}

/* An executor over .ro bytes the caller gives (Executable.load_exec), the kernels
 * resolved in this library; ro must outlive it (names are read in place). */
API pl_executor *pl_vm_load(const uint8_t *ro, size_t size, char *err, size_t err_size) {
    void *handle = self_library(err, err_size);
    if (!handle) return NULL;
    /* the library's own .ro (Python's Executable.load passes it): its file's pages */
    int mapped = (const void *)ro == dlsym(handle, RO_SYMBOL);
    pl_executor *h = create_from(ro, size, mapped, resolve_dl, handle, err, err_size);
    if (h) h->dl_handle = handle;
    else dlclose(handle);
    return h;
}

API void pl_destroy(pl_executor *h) {
    if (!h) return;
    for (uint32_t o = 0; h->outputs && o < h->funcs[0].n_results; o++)
        obj_clear(h, &h->outputs[o]);
    for (uint32_t f = 0; h->funcs && f < h->n_funcs; f++) {
        for (uint32_t k = 0; h->funcs[f].regs && k < h->funcs[f].n_regs; k++)
            obj_clear(h, &h->funcs[f].regs[k]);
        for (uint32_t k = 0; h->funcs[f].out && k < h->funcs[f].n_results; k++)
            obj_clear(h, &h->funcs[f].out[k]);
        free(h->funcs[f].regs), free(h->funcs[f].out);
    }
    for (uint32_t i = 0; h->inputs && i < h->funcs[0].n_params; i++)
        storage_release(h, h->inputs[i]), storage_release(h, h->zero_copy[i]);
    for (uint32_t c = 0; h->consts && c < h->n_consts; c++) storage_release(h, h->consts[c]);
    while (h->pool) {
        struct storage *s = h->pool;
        h->pool = s->next;
        storage_free(s);
    }
    free(h->in_shape), free(h->in_nbytes), free(h->dims), free(h->zero_copy);
    free(h->inputs), free(h->outputs), free(h->consts), free(h->const_types), free(h->kernels);
    arena_free(h->const_arena, h->const_arena_bytes);
    free(h->kernel_names);
    free(h->words), free(h->arg_pool), free(h->ins_pool), free(h->type_pool), free(h->funcs);
    if (h->dl_handle) dlclose(h->dl_handle);
    free(h);
}

API const char *pl_last_error(const pl_executor *h) { return h ? h->error : "no executor"; }
API int pl_num_inputs(const pl_executor *h) { return (int)h->funcs[0].n_params; }
API int pl_num_params(const pl_executor *h) { (void)h; return 0; }
API int pl_num_outputs(const pl_executor *h) { return (int)h->funcs[0].n_results; }
API int pl_num_functions(const pl_executor *h) { return (int)h->n_funcs; }

API int pl_get_input_index(const pl_executor *h, const char *name) {
    for (uint32_t i = 0; i < h->funcs[0].n_params; i++)
        if (strcmp(h->funcs[0].params[i].name, name) == 0) return (int)i;
    return -1;
}

static void describe(const struct type *t, pl_tensor_info *info) {
    *info = (pl_tensor_info){t->name, DTYPES[t->dtype].name, t->ndim, t->shape, t->nbytes};
}

/* The shape of input i: as pl_set_input_shape set it (a symbolic dimension not set yet
 * is -1, and nbytes then 0). */
API int pl_input_info(const pl_executor *h, int i, pl_tensor_info *info) {
    if (i < 0 || (uint32_t)i >= h->funcs[0].n_params) return -1;
    describe(&h->funcs[0].params[i], info);
    info->shape = h->in_shape[i];
    info->nbytes = h->in_nbytes[i] == (size_t)-1 ? 0 : h->in_nbytes[i];
    return 0;
}

/* The runtime shape of input i: its rank and static dimensions as declared, each
 * symbolic one within its bounds; else -1 and one line in pl_last_error. */
API int pl_set_input_shape(pl_executor *h, int i, int ndim, const int64_t *shape) {
    const struct func *m = &h->funcs[0];
    if (i < 0 || (uint32_t)i >= m->n_params)
        return fail(h, "input index %d out of range: the function has %u", i, m->n_params);
    const struct type *t = &m->params[i];
    char want[256];
    size_t used = (size_t)snprintf(want, sizeof want, "[");
    for (uint32_t d = 0; d < t->ndim && used < sizeof want; d++) {
        if (t->shape[d] < 0) {
            const struct dim *s = &h->dims[-1 - t->shape[d]];
            used += (size_t)snprintf(want + used, sizeof want - used, "%s%s (%lld..%lld)",
                                     d ? ", " : "", s->name, (long long)s->low,
                                     (long long)s->high);
        } else {
            used += (size_t)snprintf(want + used, sizeof want - used, "%s%lld", d ? ", " : "",
                                     (long long)t->shape[d]);
        }
    }
    if (used < sizeof want) snprintf(want + used, sizeof want - used, "]");
    if (ndim != t->ndim)
        return fail(h, "input '%s': rank %d given, expected %s", t->name, ndim, want);
    for (int d = 0; d < ndim; d++) {
        int64_t k = -1 - t->shape[d];
        if (t->shape[d] >= 0 && shape[d] != t->shape[d])
            return fail(h, "input '%s': dimension %d is %lld, expected %s", t->name, d,
                        (long long)shape[d], want);
        if (t->shape[d] < 0 && (shape[d] < h->dims[k].low || shape[d] > h->dims[k].high))
            return fail(h, "input '%s': dimension '%s' = %lld is outside its bounds %lld..%lld",
                        t->name, h->dims[k].name, (long long)shape[d],
                        (long long)h->dims[k].low, (long long)h->dims[k].high);
    }
    int64_t size = size_of(t->dtype, ndim, shape);
    if (size < 0) return fail(h, "input '%s': shape too large", t->name);
    memcpy(h->in_shape[i], shape, (size_t)ndim * sizeof *shape);
    h->in_nbytes[i] = (size_t)size;
    return 0;
}

/* Before a run: the declared type; after: the shape the run returned. */
API int pl_output_info(const pl_executor *h, int i, pl_tensor_info *info) {
    if (i < 0 || (uint32_t)i >= h->funcs[0].n_results) return -1;
    describe(&h->funcs[0].results[i], info);
    const struct obj *o = &h->outputs[i];
    if (h->ran && o->kind == OBJ_TENSOR)
        info->dtype = DTYPES[o->dtype].name, info->ndim = o->ndim, info->shape = o->shape,
        info->nbytes = o->nbytes;
    return 0;
}

static const struct type *io_type(pl_executor *h, int out, int i, size_t nbytes) {
    const struct func *m = &h->funcs[0];
    uint32_t n = out ? m->n_results : m->n_params;
    if (i < 0 || (uint32_t)i >= n) {
        fail(h, "%s index %d out of range: the function has %u", out ? "output" : "input", i, n);
        return NULL;
    }
    const struct type *t = out ? &m->results[i] : &m->params[i];
    size_t have = out && h->ran ? h->outputs[i].nbytes : out ? t->nbytes : h->in_nbytes[i];
    if (!out && have == (size_t)-1) {
        fail(h, "input '%s' has symbolic dimensions: give its shape first "
             "(pl_set_input_shape)", t->name);
        return NULL;
    }
    if (nbytes != have) {
        fail(h, "%s '%s': %zu bytes of %s expected, given %zu", out ? "output" : "input",
             t->name, have, DTYPES[t->dtype].name, nbytes);
        return NULL;
    }
    return t;
}

/* Where input i's runs read it: the caller's zero-copy buffer or the VM's storage. */
static struct storage *input_storage(pl_executor *h, int i) {
    return h->zero_copy[i] ? h->zero_copy[i] : h->inputs[i];
}

API int pl_set_input(pl_executor *h, int i, const void *data, size_t nbytes) {
    if (!io_type(h, 0, i, nbytes)) return -1;
    memcpy(h->inputs[i]->data, data, nbytes);
    storage_release(h, h->zero_copy[i]); /* its own storage again */
    h->zero_copy[i] = NULL;
    return 0;
}

/* As the graph executor's: runs read the caller's buffer (64-byte aligned, the
 * input's size) in place until the next pl_set_input(_zero_copy) of that input. It
 * becomes a borrowed storage (views of it stay inside it); no instruction writes a
 * parameter's tensor, so the buffer is only read. */
API int pl_set_input_zero_copy(pl_executor *h, int i, void *data, size_t nbytes) {
    if (!io_type(h, 0, i, nbytes)) return -1;
    if (!data || (uintptr_t)data % 64)
        return fail(h, "input '%s': a zero-copy buffer must be 64-byte aligned",
                    h->funcs[0].params[i].name);
    struct storage *s = calloc(1, sizeof *s);
    if (!s) return fail(h, "out of memory");
    *s = (struct storage){1, nbytes, data, NULL, 1, 0};
    storage_release(h, h->zero_copy[i]);
    h->zero_copy[i] = s;
    return 0;
}

API int pl_get_input(pl_executor *h, int i, void *data, size_t nbytes) {
    if (!io_type(h, 0, i, nbytes)) return -1;
    if (input_storage(h, i)->size < nbytes)
        return fail(h, "input '%s': its zero-copy buffer is smaller than its shape: set it "
                    "again after pl_set_input_shape", h->funcs[0].params[i].name);
    memcpy(data, input_storage(h, i)->data, nbytes);
    return 0;
}

API int pl_get_output(pl_executor *h, int i, void *data, size_t nbytes) {
    if (!io_type(h, 1, i, nbytes)) return -1;
    if (!h->ran) return fail(h, "output %d: the VM has not run", i);
    if (h->outputs[i].kind != OBJ_TENSOR) /* vm_sequence.h */
        return fail(h, "output %d is a sequence or an optional: see pl_output_count", i);
    memcpy(data, h->outputs[i].data, nbytes);
    return 0;
}

API int pl_set_num_threads(pl_executor *h, int n) {
    if (n < 0) return fail(h, "the thread count must be >= 0, got %d", n);
    h->num_threads = n;
    return 0;
}

/* The shapes of main's results after a run, for all of them in one call (a Python
 * caller pays microseconds a call): row i of `out` (1 + MAX_NDIM words each, n_words
 * in all) is result i's rank, then its dimensions. -1 before a run or if out is too
 * small. */
API int pl_vm_output_shapes(pl_executor *h, int64_t *out, size_t n_words) {
    const struct func *m = &h->funcs[0];
    if (!h->ran) return fail(h, "outputs: the VM has not run");
    if (n_words < (size_t)m->n_results * (1 + MAX_NDIM))
        return fail(h, "outputs: %zu words given, %u needed", n_words,
                    m->n_results * (1 + MAX_NDIM));
    for (uint32_t i = 0; i < m->n_results; i++) {
        int64_t *row = out + (size_t)i * (1 + MAX_NDIM);
        row[0] = h->outputs[i].ndim;
        memcpy(row + 1, h->outputs[i].shape, h->outputs[i].ndim * sizeof *row);
    }
    return 0;
}

/* Main's results of the last run handed over instead of copied: for each result i
 * whose tensor is alone in a storage of the VM's own (no other result, input or
 * constant shares it) and has at least min_bytes, data[i] is where its bytes are and
 * token[i] the storage, which runs leave alone until pl_vm_give_back(h, token[i]);
 * for the others data[i] and token[i] are NULL (read them with pl_get_output). A
 * decode loop takes its present KV cache this way and may feed it back as the next
 * step's past with pl_set_input_zero_copy. -1 before a run or if n is not the number
 * of results. */
API int pl_vm_take_outputs(pl_executor *h, void **data, void **token, size_t n,
                           size_t min_bytes) {
    const struct func *m = &h->funcs[0];
    if (!h->ran) return fail(h, "outputs: the VM has not run");
    if (n != m->n_results) return fail(h, "outputs: %zu slots given, %u results", n, m->n_results);
    for (uint32_t i = 0; i < m->n_results; i++) {
        const struct obj *o = &h->outputs[i];
        struct storage *st = o->kind == OBJ_TENSOR ? o->st : NULL;
        int alone = st && !st->borrowed && o->nbytes >= min_bytes && o->nbytes &&
                    __atomic_load_n(&st->refs, __ATOMIC_ACQUIRE) == 1;
        data[i] = alone ? o->data : NULL, token[i] = alone ? st : NULL;
        if (alone) storage_retain(st);
    }
    return 0;
}

/* Give back a storage pl_vm_take_outputs handed over: from any thread, also while the
 * VM runs (it joins the pool at the next run). */
API void pl_vm_give_back(pl_executor *h, void *token) {
    struct storage *s = token;
    if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    s->next = __atomic_load_n(&h->returned, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&h->returned, &s->next, s, 1, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED)) {
    }
}

/* Invoke main on the inputs set; its results stay until the next run. */
API int pl_run(pl_executor *h) {
    struct func *m = &h->funcs[0];
    if (h->num_threads > 0 && omp_set_num_threads) omp_set_num_threads(h->num_threads);
    for (uint32_t o = 0; o < m->n_results; o++) obj_clear(h, &h->outputs[o]);
    take_returned(h);
    h->ran = 0, h->steps = 0, h->depth = 0;
    int64_t bound[MAX_NDIM]; /* each symbolic dimension's value, from the first input */
    for (uint32_t k = 0; k < h->n_dims && k < MAX_NDIM; k++) bound[k] = -1;
    for (uint32_t i = 0; i < m->n_params; i++) {
        const struct type *t = &m->params[i];
        if (h->in_nbytes[i] == (size_t)-1)
            return fail(h, "input '%s' has symbolic dimensions: give its shape first "
                        "(pl_set_input_shape)", t->name);
        struct storage *st = input_storage(h, (int)i);
        if (st->size < h->in_nbytes[i]) /* a zero-copy buffer set before a larger shape */
            return fail(h, "input '%s': its zero-copy buffer has %zu bytes, its shape needs "
                        "%zu: set it again after pl_set_input_shape", t->name, st->size,
                        h->in_nbytes[i]);
        for (uint32_t d = 0; d < t->ndim; d++) {
            int64_t k = -1 - t->shape[d], v = h->in_shape[i][d];
            if (t->shape[d] >= 0 || k >= (int64_t)MAX_NDIM) continue;
            if (bound[k] >= 0 && bound[k] != v)
                return fail(h, "inputs disagree on dimension '%s': %lld and %lld (input '%s')",
                            h->dims[k].name, (long long)bound[k], (long long)v, t->name);
            bound[k] = v;
        }
        obj_tensor(h, &m->regs[i], t->dtype, t->ndim, st, st->data, h->in_nbytes[i],
                   h->in_shape[i]);
    }
    if (run_func(h, m, h->outputs)) return -1;
    for (uint32_t o = 0; o < m->n_results; o++)
        if (h->outputs[o].kind < OBJ_TENSOR)
            return fail(h, "VM: main's result %u is not a value", o);
    h->ran = 1;
    return 0;
}
