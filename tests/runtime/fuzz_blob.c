/* libFuzzer target for the C executor's reader: blob prefix, section table,
 * executor plan, params (pipeline/runtime/c/executor.c, included whole so its
 * static create_from_blob is reachable), then on what it accepts the storage
 * swaps of binding.c and the single steps of debug.c. Built by
 * tests/runtime/test_executor_c.py:
 *
 *   clang -fsanitize=fuzzer,address,undefined -I pipeline/runtime/c tests/runtime/fuzz_blob.c
 *
 * Any input must give an executor or an error message; AddressSanitizer and
 * UndefinedBehaviorSanitizer turn every out-of-bounds read, overflow or leak
 * into a crash the fuzzer reports. Kernels are a stub that touches nothing.
 */
#define PL_MAX_STORAGE ((uint64_t)1 << 24) /* a fuzzed shape must not allocate GBs */
#include "executor.c"
#include "binding.c"
#include "debug.c"

static int32_t stub_kernel(void **args) {
    (void)args;
    return 0;
}

static void *resolve_stub(void *ctx, const char *symbol) {
    (void)ctx;
    return symbol[0] == 'k' ? (void *)stub_kernel : NULL; /* other names: "not found" */
}

/* A second executor of the blob shares every input and param of h, h's first
 * input is a zero-copy buffer; h goes first, the other must still run on h's
 * storage (AddressSanitizer catches a use after free), node by node. */
static void share_and_step(const uint8_t *blob, size_t size, pl_executor *h) {
    char err[256];
    pl_executor *h2 = create_from_blob(blob, size, 0, resolve_stub, NULL, err, sizeof err);
    if (!h2) abort(); /* the same bytes were accepted once */
    int slots = pl_num_inputs(h) + pl_num_params(h);
    for (int i = 0; i < slots; i++)
        if (pl_share_input(h2, h, i) || pl_input_data(h2, i) != pl_input_data(h, i)) abort();
    pl_tensor_info info;
    void *buffer = NULL;
    if (slots && !pl_input_info(h, 0, &info) &&
        !posix_memalign(&buffer, ALIGN, info.nbytes ? info.nbytes : 1)) {
        memset(buffer, 0, info.nbytes);
        if (pl_set_input_zero_copy(h, 0, buffer, info.nbytes) || pl_input_data(h, 0) != buffer)
            abort();
        if (pl_run(h)) abort();
    }
    pl_destroy(h);
    free(buffer);
    static uint8_t out[1 << 16];
    for (int k = 0; k < pl_num_nodes(h2); k++) {
        if (pl_run_node(h2, k, NULL)) abort();
        for (int o = 0; !pl_node_output_info(h2, k, o, &info); o++)
            if (info.nbytes <= sizeof out && pl_get_node_output(h2, k, o, out, info.nbytes))
                abort();
    }
    pl_destroy(h2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The blob's length field must equal the bytes given; set it, so mutations
     * that change the size still reach the sections (the check itself is one line). */
    uint8_t *blob = malloc(size ? size : 1);
    memcpy(blob, data, size);
    for (int i = 0; size >= 24 && i < 8; i++) blob[16 + i] = (uint8_t)((uint64_t)size >> (8 * i));
    char err[256];
    pl_executor *h = create_from_blob(blob, size, 0, resolve_stub, NULL, err, sizeof err);
    if (h) {
        pl_tensor_info info;
        for (int i = 0; i < pl_num_inputs(h) + pl_num_params(h); i++)
            if (pl_input_info(h, i, &info) || pl_get_input_index(h, info.name) < 0) abort();
        for (int i = 0; i < pl_num_outputs(h); i++)
            if (pl_output_info(h, i, &info)) abort();
        if (pl_run(h)) abort(); /* the stub kernels and copies cannot fail */
        share_and_step(blob, size, h);
    } else if (!err[0]) {
        abort(); /* a refusal always says why */
    }
    free(blob);
    return 0;
}

#ifdef FUZZ_MAIN
/* Without libFuzzer (cc -DFUZZ_MAIN): print what the reader says of each file. */
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        static uint8_t buf[1 << 20];
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        char err[256] = "";
        pl_executor *h = create_from_blob(buf, n, 0, resolve_stub, NULL, err, sizeof err);
        printf("%s\n", h ? "ok" : err);
        pl_destroy(h);
    }
    return 0;
}
#endif
