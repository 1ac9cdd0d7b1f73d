/* The C API of a model library exported by pipeline.
 *
 * Every exported .so carries its graph (the blob: executor plan, params, graph
 * JSON) and this executor, so running a model needs only the library:
 *
 *     char err[256];
 *     void *lib = dlopen("model.so", RTLD_NOW | RTLD_LOCAL);
 *     pl_create_fn create = (pl_create_fn)dlsym(lib, "pl_create");
 *     pl_executor *h = create(err, sizeof err);        // NULL: err says why
 *     pl_set_input(h, pl_get_input_index(h, "data"), x, sizeof x);
 *     if (pl_run(h) != 0) puts(pl_last_error(h));
 *     pl_get_output(h, 0, y, sizeof y);
 *     pl_destroy(h);
 *
 * (Link against the .so instead of dlopen'ing it and call pl_create directly.)
 * Functions returning int give 0 on success and -1 on error, the message then
 * in pl_last_error. One executor must not be used by two threads at once;
 * several executors of one library are independent (each has its own storage
 * and copy of the params) unless they share params (pl_share_input).
 */
#ifndef PIPELINE_RUNTIME_H
#define PIPELINE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PL_API_VERSION 2

typedef struct pl_executor pl_executor;

/* What an input, param or output is. Pointers stay valid until pl_destroy. */
typedef struct {
    const char *name;    /* the graph's name (for an output: its producing node's) */
    const char *dtype;   /* numpy's name: "float32", "float64", "int64", "int32", "bool", ... */
    int32_t ndim;
    const int64_t *shape;
    size_t nbytes;       /* C-contiguous size of the data */
} pl_tensor_info;

/* An executor over the blob of the library this code is linked into: verifies
 * the blob (its sha256, once per load of the library, then every count and
 * offset), allocates storage from the memory plan, copies the params in and
 * resolves every kernel. NULL on failure with a one-line message in err. */
pl_executor *pl_create(char *err, size_t err_size);
typedef pl_executor *(*pl_create_fn)(char *err, size_t err_size);
/* pl_create without the sha256 check, for a caller that checked the blob's bytes
 * itself (pipeline's Python loader does, with hashlib). */
pl_executor *pl_create_unchecked(char *err, size_t err_size);
void pl_destroy(pl_executor *h);
const char *pl_last_error(const pl_executor *h);

/* Slots 0 .. num_inputs-1 are the graph inputs, then num_params params (which
 * pl_set_input may overwrite too); outputs are numbered on their own. */
int pl_num_inputs(const pl_executor *h);
int pl_num_params(const pl_executor *h);
int pl_num_outputs(const pl_executor *h);
int pl_get_input_index(const pl_executor *h, const char *name); /* -1: no such input */
int pl_input_info(const pl_executor *h, int index, pl_tensor_info *info);
int pl_output_info(const pl_executor *h, int index, pl_tensor_info *info);

/* Copy C-contiguous data in or out; nbytes must equal the tensor's nbytes. */
int pl_set_input(pl_executor *h, int index, const void *data, size_t nbytes);
/* VM libraries only: the runtime shape of an input with symbolic dimensions (rank and
 * static dims as declared, each symbolic one within its bounds), before pl_set_input
 * or pl_set_input_zero_copy (a run refuses a zero-copy buffer smaller than a shape
 * set after it); pl_input_info then describes that shape. */
int pl_set_input_shape(pl_executor *h, int index, int ndim, const int64_t *shape);
int pl_get_input(pl_executor *h, int index, void *data, size_t nbytes);
int pl_get_output(pl_executor *h, int index, void *data, size_t nbytes);
/* VM libraries only (sequence and optional outputs, docs/vm.md): after a run, output
 * index's element count if it is a sequence, -1 for a tensor, -2 for an empty
 * optional (-3: no such output or no run yet); a sequence element's info and bytes. */
int pl_output_count(const pl_executor *h, int index);
int pl_output_item_info(pl_executor *h, int index, int item, pl_tensor_info *info);
int pl_get_output_item(pl_executor *h, int index, int item, void *data, size_t nbytes);

/* The caller's buffer becomes input (or param) `index`, without a copy, as TVM's
 * set_input_zero_copy: runs read it in place until the next pl_set_input_zero_copy
 * of that index, or pl_set_input, which copies into the executor's own storage
 * again. data must stay valid that long and be 64-byte aligned (TVM's
 * kAllocAlignment) and C-contiguous, nbytes the tensor's size (dtype and shape
 * are the caller's to check: pl_input_info). Every reshape the memory plan
 * aliases to the input follows it; no node ever writes an input's storage (the
 * executor refuses such a plan), so the buffer is only read. */
int pl_set_input_zero_copy(pl_executor *h, int index, void *data, size_t nbytes);
/* Input (or param) `index` of h uses other's storage for it from now on, no copy,
 * as TVM's share_params does for each name of a param dict: a write through
 * either executor (pl_set_input) is seen by both. other must be an executor of
 * the same library; its storage stays allocated until both are destroyed. (What
 * is shared is other's own storage for that input, not a zero-copy buffer bound
 * to it.) h's own copy (pl_create made one) goes back to the OS (madvise) unless
 * another executor shares from h. Runs only read params, so executors sharing
 * them may run in different threads at once. */
int pl_share_input(pl_executor *h, pl_executor *other, int index);
/* Where input (or param) `index` lives now: the executor's storage, a zero-copy
 * buffer or another executor's storage; NULL if index is out of range. */
void *pl_input_data(pl_executor *h, int index);

/* Threads of the parallel kernels in this executor's runs; 0 (the default)
 * leaves libgomp's own choice ($OMP_NUM_THREADS, else every core). */
int pl_set_num_threads(pl_executor *h, int num_threads);
int pl_run(pl_executor *h);
/* Runs since the last pl_set_num_threads that used one thread although the executor
 * has more: pl_run measures both ways and runs the faster (executor.c, run_alone). */
unsigned pl_runs_alone(const pl_executor *h);

/* Profiling: the executed nodes in run order, and one run that stores each
 * node's wall time in seconds[k] (an array of pl_num_nodes doubles). */
int pl_num_nodes(const pl_executor *h);
const char *pl_node_name(const pl_executor *h, int k);
const char *pl_node_func(const pl_executor *h, int k);
int pl_run_timed(pl_executor *h, double *seconds);
/* Debugging (TVM's debug executor): run node k alone (the nodes before it must
 * have run), storing its wall time in *seconds unless NULL; then describe or copy
 * its outputs 0 .. n_out-1 (pl_node_output_info gives -1 past the last). Copy
 * them before later nodes run: the memory plan reuses their storage. */
int pl_run_node(pl_executor *h, int k, double *seconds);
int pl_node_output_info(const pl_executor *h, int k, int output, pl_tensor_info *info);
int pl_get_node_output(pl_executor *h, int k, int output, void *data, size_t nbytes);
/* Bytes of planned storage (inputs, params and intermediates) this executor holds. */
size_t pl_storage_bytes(const pl_executor *h);

#ifdef __cplusplus
}
#endif
#endif
