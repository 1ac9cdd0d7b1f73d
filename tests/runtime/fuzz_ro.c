/* libFuzzer target for the VM's .ro reader and interpreter (pipeline/runtime/c/vm.c,
 * included whole so its static create_from is reachable). Built by
 * tests/runtime/test_vm_fuzz.py:
 *
 *   clang -fsanitize=fuzzer,address,undefined -I pipeline/runtime/c tests/runtime/fuzz_ro.c
 *
 * Any input must give a VM or an error message; an accepted one is run (kernels are a
 * stub that touches nothing; a step limit ends a Goto loop) and its outputs described.
 * AddressSanitizer and UndefinedBehaviorSanitizer turn every out-of-bounds access,
 * overflow or leak into a crash the fuzzer reports.
 */
#define PL_MAX_STORAGE ((uint64_t)1 << 24) /* a fuzzed size must not allocate GBs */
#define PL_MAX_REGS (1u << 12)
#define PL_MAX_STEPS 100000
#include "vm.c"

static int32_t stub_kernel(void **args) {
    (void)args;
    return 0;
}

static void *resolve_stub(void *ctx, const char *symbol) {
    (void)ctx;
    return symbol[0] == 'k' ? (void *)stub_kernel : NULL; /* other names: "not found" */
}

/* Each input with symbolic dimensions at their upper bounds (pl_set_input_shape). */
static void set_shapes(pl_executor *h) {
    const struct func *m = &h->funcs[0];
    for (uint32_t i = 0; i < m->n_params; i++) {
        const struct type *t = &m->params[i];
        int64_t shape[MAX_NDIM];
        for (uint32_t d = 0; d < t->ndim; d++)
            shape[d] = t->shape[d] < 0 ? h->dims[-1 - t->shape[d]].high : t->shape[d];
        if (pl_set_input_shape(h, (int)i, t->ndim, shape) && !pl_last_error(h)[0]) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The length field must equal the bytes given: set it, so mutations that change
     * the size still reach the sections. (The sha256 is the Python loader's check.) */
    uint8_t *ro = malloc(size ? size : 1);
    memcpy(ro, data, size);
    for (int i = 0; size >= 24 && i < 8; i++) ro[16 + i] = (uint8_t)((uint64_t)size >> (8 * i));
    char err[256] = "";
    pl_executor *h = create_from(ro, size, 0, resolve_stub, NULL, err, sizeof err);
    if (h) {
        pl_tensor_info info;
        for (int i = 0; i < pl_num_inputs(h); i++)
            if (pl_input_info(h, i, &info) || pl_get_input_index(h, info.name) < 0) abort();
        set_shapes(h);
        for (int r = 0; r < 2; r++) { /* twice: the second run reuses the pool */
            if (pl_run(h) == 0) {
                static uint8_t out[1 << 16];
                for (int o = 0; o < pl_num_outputs(h); o++) {
                    int count = pl_output_count(h, o); /* a sequence's elements, or none */
                    for (int j = 0; j < count; j++)
                        if (pl_output_item_info(h, o, j, &info) ||
                            (info.nbytes <= sizeof out &&
                             pl_get_output_item(h, o, j, out, info.nbytes)))
                            abort();
                    if (count == -1 && (pl_output_info(h, o, &info) ||
                                        (info.nbytes <= sizeof out &&
                                         pl_get_output(h, o, out, info.nbytes))))
                        abort();
                }
            } else if (!pl_last_error(h)[0]) {
                abort(); /* a failed run always says why */
            }
        }
        pl_destroy(h);
    } else if (!err[0]) {
        abort(); /* a refusal always says why */
    }
    free(ro);
    return 0;
}

#ifdef FUZZ_MAIN
/* Without libFuzzer (cc -DFUZZ_MAIN): what the reader says of each file, and of a run. */
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        static uint8_t buf[1 << 20];
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        char err[256] = "";
        pl_executor *h = create_from(buf, n, 0, resolve_stub, NULL, err, sizeof err);
        if (h) set_shapes(h);
        if (h && pl_run(h)) printf("run: %s\n", pl_last_error(h));
        else printf("%s\n", h ? "ok" : err);
        pl_destroy(h);
    }
    return 0;
}
#endif
