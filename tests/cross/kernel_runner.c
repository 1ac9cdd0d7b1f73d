/* Runs one kernel of a model library on buffers read from files, for the cross
 * tests (tests/cross/test_cross.py), which build it with the target's compiler and run
 * it under qemu-user:
 *
 *     kernel_runner LIB.so SYMBOL FILE...
 *
 * Each FILE is read into a 64-byte aligned buffer; the kernel is called as
 * `int32_t SYMBOL(void **args)` with the buffers in order (the node's inputs,
 * then its outputs); then every buffer is written back to its file. Exit 0 on
 * success, 2 with one line on stderr otherwise. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "kernel_runner: %s: %s\n", what, detail);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 4) return fail("usage", "kernel_runner LIB.so SYMBOL FILE...");
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) return fail(argv[1], dlerror());
    int32_t (*kernel)(void **) = (int32_t (*)(void **))dlsym(lib, argv[2]);
    if (!kernel) return fail(argv[2], dlerror());
    int n = argc - 3;
    void **args = calloc((size_t)n, sizeof *args);
    long *sizes = calloc((size_t)n, sizeof *sizes);
    if (!args || !sizes) return fail("calloc", "out of memory");
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(argv[3 + i], "rb");
        if (!f || fseek(f, 0, SEEK_END) != 0) return fail(argv[3 + i], "cannot read");
        sizes[i] = ftell(f);
        rewind(f);
        args[i] = aligned_alloc(64, (size_t)(sizes[i] / 64 + 1) * 64);
        if (!args[i] || fread(args[i], 1, (size_t)sizes[i], f) != (size_t)sizes[i])
            return fail(argv[3 + i], "short read");
        fclose(f);
    }
    int32_t rc = kernel(args);
    if (rc != 0) {
        char code[32];
        snprintf(code, sizeof code, "returned %d", (int)rc);
        return fail(argv[2], code);
    }
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(argv[3 + i], "wb");
        if (!f || fwrite(args[i], 1, (size_t)sizes[i], f) != (size_t)sizes[i])
            return fail(argv[3 + i], "cannot write");
        fclose(f);
    }
    return 0;
}
