/* Node by node execution (API: pipeline_runtime.h): per-node wall times for the
 * profiler (pipeline/runtime/profile.py), and single steps for the debug executor
 * (pipeline/runtime/debug_executor.py), which copies each node's outputs right
 * after it runs, before the memory plan hands their storage to a later node.
 */
#define _GNU_SOURCE /* clock_gettime under -std=c11 */
#include <string.h>
#include <time.h>

#include "executor_internal.h"

API int pl_num_nodes(const pl_executor *h) { return (int)h->n_nodes; }

API const char *pl_node_name(const pl_executor *h, int k) {
    return k >= 0 && (uint32_t)k < h->n_nodes ? h->nodes[k].name : NULL;
}

API const char *pl_node_func(const pl_executor *h, int k) {
    return k >= 0 && (uint32_t)k < h->n_nodes ? h->nodes[k].func : NULL;
}

static int run_node_timed(pl_executor *h, const struct node *n, double *seconds) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = run_node(h, n);
    clock_gettime(CLOCK_MONOTONIC, &b);
    *seconds = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    return rc;
}

API int pl_run_timed(pl_executor *h, double *seconds) {
    apply_threads(h);
    for (uint32_t k = 0; k < h->n_nodes; k++)
        if (run_node_timed(h, &h->nodes[k], &seconds[k])) return -1;
    return 0;
}

API int pl_run_node(pl_executor *h, int k, double *seconds) {
    if (k < 0 || (uint32_t)k >= h->n_nodes)
        return fail(h, "node index %d out of range: the graph runs %u nodes", k, h->n_nodes);
    double ignored;
    apply_threads(h);
    return run_node_timed(h, &h->nodes[k], seconds ? seconds : &ignored);
}

/* The entry of output o of node k, or NULL. */
static struct entry *node_output(const pl_executor *h, int k, int o) {
    if (k < 0 || (uint32_t)k >= h->n_nodes || o < 0 || o >= h->nodes[k].n_out) return NULL;
    return &h->entries[h->nodes[k].eids[h->nodes[k].n_in + o]];
}

API int pl_node_output_info(const pl_executor *h, int k, int o, pl_tensor_info *info) {
    const struct entry *t = node_output(h, k, o);
    if (!t) return -1;
    describe(h, (uint32_t)(t - h->entries), h->nodes[k].name, info);
    return 0;
}

API int pl_get_node_output(pl_executor *h, int k, int o, void *data, size_t nbytes) {
    const struct entry *t = node_output(h, k, o);
    if (!t) return fail(h, "node %d has no output %d", k, o);
    if (nbytes != t->nbytes)
        return fail(h, "output %d of node '%s' holds %zu bytes, given %zu", o,
                    h->nodes[k].name, t->nbytes, nbytes);
    memcpy(data, t->data, nbytes);
    return 0;
}
