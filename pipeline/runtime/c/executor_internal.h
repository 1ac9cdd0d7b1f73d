/* What the executor's C files share (not part of the API).
 *
 * executor.o is executor.c (blob reader, storage, the core API), binding.c
 * (zero-copy inputs, shared params) and debug.c (node by node execution),
 * compiled and linked together (`cc -r`, pipeline/link/runtime_c.py). Their
 * internal functions are hidden (-fvisibility=hidden): the library exports
 * only the API functions, marked API.
 */
#ifndef PIPELINE_EXECUTOR_INTERNAL_H
#define PIPELINE_EXECUTOR_INTERNAL_H

#include "pipeline_runtime.h"

#define API __attribute__((visibility("default")))
#define MAX_NDIM 32u
#define ALIGN 64u  /* planned storage, and what a zero-copy buffer must be aligned to */

typedef int32_t (*kernel_fn)(void **args);

struct entry {
    uint32_t sid;
    uint8_t dtype, ndim;
    int64_t shape[MAX_NDIM];
    size_t nbytes;
    size_t offset;    /* bytes from its storage's start (a slice of a concat in place) */
    void *data;       /* where it lives now (see point_storage) */
};

struct node {
    uint8_t is_copy;
    uint16_t n_in, n_out;
    const char *name, *func;
    kernel_fn fn;
    uint32_t *eids;   /* n_in + n_out entry ids */
    void **args;      /* their data pointers, filled once storage exists */
};

/* One executor's planned storage. Reference counted: an executor that shares
 * params of another (pl_share_input) keeps the other's arena alive. */
struct arena {
    _Atomic long refs;
    size_t bytes;
    void *data;       /* ALIGN-aligned */
};

#define RUN_SAMPLES 5
struct run_times {
    float s[RUN_SAMPLES]; /* a ring: sample n goes to s[n % RUN_SAMPLES] */
    unsigned n;           /* samples recorded (kept below 2 * RUN_SAMPLES) */
};

struct pl_executor {
    uint32_t n_entries, n_args, n_inputs, n_outputs, n_nodes, n_storage;
    struct entry *entries;
    uint32_t *arg_eid;
    const char **arg_name;
    uint8_t *is_param;
    uint32_t *slots;  /* argument index per slot: inputs, then params */
    uint32_t *out_eid;
    const char **out_name;
    struct node *nodes;
    uint32_t *eid_pool;
    void **ptr_pool;
    const void *blob;          /* the library's blob: executors of one library share it */
    uint8_t blob_mapped;       /* it is read-only data of the library's file (copy_weights) */
    struct arena *arena;       /* this executor's own storage */
    void **home;               /* per storage id: its planned place (in arena, or in
                                  another executor's after pl_share_input) */
    struct arena **home_arena; /* per storage id: the arena home[sid] is in */
    int num_threads;
    /* The last times of whole runs (seconds) with the threads and with one, the
     * runs so far and those that used one thread (pl_run, executor.c). */
    struct run_times run_team, run_alone;
    unsigned runs, runs_alone;
    void *dl_handle;
    char error[512];
};

/* Set the error message; returns -1. */
int fail(pl_executor *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Point every tensor of storage `sid` (an input and the reshapes aliasing it)
 * and every node argument reading one at `data`. */
void point_storage(pl_executor *h, uint32_t sid, void *data);
void arena_retain(struct arena *a);
void arena_release(struct arena *a);
void describe(const pl_executor *h, uint32_t eid, const char *name, pl_tensor_info *info);
void apply_threads(const pl_executor *h);
int run_node(pl_executor *h, const struct node *n);

#endif
