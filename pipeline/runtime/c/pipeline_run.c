/* pipeline-run: run a model library exported by pipeline, without Python.
 *
 *   pipeline-run LIB.so --input NAME=FILE.npy [--input ...] --output-dir DIR
 *                [--threads T] [--repeat N] [--print-time] [--print-memory] [--no-check]
 *
 * Loads the library, sets each input from a .npy file (C order, little endian;
 * float32/float64/int64/int32/bool and the library's other dtypes; bfloat16 and
 * float8 as their bits, see DESCR), runs it,
 * writes output i to DIR/output_<i>.npy (a VM library's sequence output: element j to
 * DIR/output_<i>_<j>.npy; an empty optional: no file; DIR and its missing parents are
 * created, as mkdir -p does) and with --repeat N prints the
 * median milliseconds per run of N more runs. --print-time prints instead one line
 * `time: median X ms, min Y ms over N runs` (N from --repeat, else 1), as tvmc run
 * --print-time does. --print-memory prints, last, one line `memory: peak X MB
 * resident` (the process's high-water resident size, Linux's VmHWM: what loading and
 * running the model took, the runtime included). The blob's sha256 is checked
 * (a corrupted weight refused) unless --no-check. Any error: one line on
 * stderr, exit status 1.
 */
#define _GNU_SOURCE
#include "pipeline_runtime.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pipeline-run: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* The C API, resolved from the library (it is linked into every exported .so). */
static struct {
    pl_create_fn create, create_unchecked;
    const char *(*last_error)(const pl_executor *);
    int (*num_inputs)(const pl_executor *), (*num_outputs)(const pl_executor *);
    int (*get_input_index)(const pl_executor *, const char *);
    int (*input_info)(const pl_executor *, int, pl_tensor_info *);
    int (*output_info)(const pl_executor *, int, pl_tensor_info *);
    int (*set_input)(pl_executor *, int, const void *, size_t);
    int (*get_output)(pl_executor *, int, void *, size_t);
    int (*set_num_threads)(pl_executor *, int);
    int (*run)(pl_executor *);
    /* VM libraries only (NULL for a graph library): an input's runtime shape */
    int (*set_input_shape)(pl_executor *, int, int, const int64_t *);
    /* VM libraries: sequence and optional outputs (NULL in a graph library) */
    int (*output_count)(const pl_executor *, int);
    int (*output_item_info)(pl_executor *, int, int, pl_tensor_info *);
    int (*get_output_item)(pl_executor *, int, int, void *, size_t);
} api;

static void *sym(void *lib, const char *path, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) die("%s: no %s: not a library exported by pipeline", path, name);
    return p;
}

#if defined(__x86_64__)
#define MACHINE EM_X86_64
#elif defined(__aarch64__)
#define MACHINE EM_AARCH64
#elif defined(__riscv)
#define MACHINE EM_RISCV
#endif

/* dlopen trusts the file: a truncated library is mapped past its end and the
 * first touch of a missing page kills us with SIGBUS. So check first that it is
 * an ELF file of our class and machine whose loadable segments are all there. */
static void check_elf(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot load %s: cannot open it", path);
    ElfW(Ehdr) eh;
    if (fread(&eh, sizeof eh, 1, f) != 1 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
        die("cannot load %s: not an ELF shared library", path);
#ifdef MACHINE
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 - (sizeof(void *) == 4) || eh.e_machine != MACHINE)
        die("cannot load %s: built for ELF machine %d, this program runs on machine %d",
            path, (int)eh.e_machine, MACHINE);
#endif
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    for (unsigned i = 0; i < eh.e_phnum; i++) {
        ElfW(Phdr) ph;
        if (fseek(f, (long)(eh.e_phoff + (uint64_t)i * sizeof ph), SEEK_SET) ||
            fread(&ph, sizeof ph, 1, f) != 1)
            die("cannot load %s: truncated (program headers missing)", path);
        if (ph.p_type == PT_LOAD && ph.p_offset + ph.p_filesz > (uint64_t)size)
            die("cannot load %s: truncated (%ld bytes, a segment ends at %llu)", path, size,
                (unsigned long long)(ph.p_offset + ph.p_filesz));
    }
    fclose(f);
}

static void load_api(const char *path) {
    check_elf(path);
    /* Let libgomp's idle threads sleep soon after a run, as the Python loader
     * does (pipeline/runtime/threads.py); read when libgomp loads. */
    setenv("GOMP_SPINCOUNT", "10000", 0);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) die("cannot load %s: %s", path, dlerror());
    *(void **)&api.create = sym(lib, path, "pl_create");
    *(void **)&api.create_unchecked = sym(lib, path, "pl_create_unchecked");
    *(void **)&api.last_error = sym(lib, path, "pl_last_error");
    *(void **)&api.num_inputs = sym(lib, path, "pl_num_inputs");
    *(void **)&api.num_outputs = sym(lib, path, "pl_num_outputs");
    *(void **)&api.get_input_index = sym(lib, path, "pl_get_input_index");
    *(void **)&api.input_info = sym(lib, path, "pl_input_info");
    *(void **)&api.output_info = sym(lib, path, "pl_output_info");
    *(void **)&api.set_input = sym(lib, path, "pl_set_input");
    *(void **)&api.get_output = sym(lib, path, "pl_get_output");
    *(void **)&api.set_num_threads = sym(lib, path, "pl_set_num_threads");
    *(void **)&api.run = sym(lib, path, "pl_run");
    *(void **)&api.set_input_shape = dlsym(lib, "pl_set_input_shape");
    *(void **)&api.output_count = dlsym(lib, "pl_output_count");
    *(void **)&api.output_item_info = dlsym(lib, "pl_output_item_info");
    *(void **)&api.get_output_item = dlsym(lib, "pl_get_output_item");
}

/* numpy's dtype names <-> .npy descr strings (little endian, '|' for bytes), and a
 * second descr also read. numpy has no bfloat16 or float8: they are written as their
 * bits (uint16, uint8; `.view(ml_dtypes.bfloat16)` in Python gives the values), and
 * read from such files or from what np.save writes for ml_dtypes' arrays (void). */
static const char *const DESCR[][3] = {
    {"float32", "<f4", ""}, {"float64", "<f8", ""}, {"int32", "<i4", ""}, {"int64", "<i8", ""},
    {"bool", "|b1", ""},    {"float16", "<f2", ""}, {"int8", "|i1", ""},  {"int16", "<i2", ""},
    {"uint8", "|u1", ""},   {"uint16", "<u2", ""},  {"uint32", "<u4", ""}, {"uint64", "<u8", ""},
    {"bfloat16", "<u2", "<V2"},    {"float8_e4m3fn", "|u1", "<V1"},
    {"float8_e4m3fnuz", "|u1", "<V1"}, {"float8_e5m2", "|u1", "<V1"},
    {"float8_e5m2fnuz", "|u1", "<V1"}, {"uint4", "|u1", "<V1"}, {"int4", "|i1", "<V1"},
    {"float4_e2m1fn", "|u1", "<V1"}, {"float8_e8m0fnu", "|u1", "<V1"},
    {"uint2", "|u1", "<V1"}, {"int2", "|i1", "<V1"},
};

static const char *descr_of(const char *dtype, int alternative) {
    for (size_t i = 0; i < sizeof DESCR / sizeof DESCR[0]; i++)
        if (strcmp(DESCR[i][0], dtype) == 0) return DESCR[i][1 + alternative];
    return "?";
}

/* int4, uint4, float4_e2m1fn (4 bits), int2 and uint2 (2 bits): one element a byte in
 * .npy files (what numpy and ml_dtypes hold), 8 / bits a byte in the library (element
 * k*i in the low bits of byte i). The bits of an element, 8 for the others. */
static int bits_of(const pl_tensor_info *t) {
    if (strcmp(t->dtype, "int2") == 0 || strcmp(t->dtype, "uint2") == 0) return 2;
    if (strcmp(t->dtype, "int4") == 0 || strcmp(t->dtype, "uint4") == 0 ||
        strcmp(t->dtype, "float4_e2m1fn") == 0)
        return 4;
    return 8;
}

static int packed(const pl_tensor_info *t) { return bits_of(t) < 8; }

static size_t file_bytes(const pl_tensor_info *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return packed(t) ? n : t->nbytes;
}

static void pack(const pl_tensor_info *t, const unsigned char *one, unsigned char *two) {
    size_t n = file_bytes(t), bits = (size_t)bits_of(t), per = 8 / bits;
    unsigned mask = (1u << bits) - 1;
    memset(two, 0, t->nbytes);
    for (size_t i = 0; i < n; i++)
        two[i / per] |= (unsigned char)((one[i] & mask) << (i % per * bits));
}

static void unpack(const pl_tensor_info *t, const unsigned char *two, unsigned char *one) {
    int sign = t->dtype[0] == 'i'; /* int2, int4: sign-extended (float4: its bits) */
    size_t bits = (size_t)bits_of(t), per = 8 / bits;
    unsigned mask = (1u << bits) - 1, top = 1u << (bits - 1);
    for (size_t i = 0; i < file_bytes(t); i++) {
        unsigned v = two[i / per] >> (i % per * bits) & mask;
        one[i] = (unsigned char)(sign && v >= top ? v | (0xFFu & ~mask) : v);
    }
}

static void shape_text(const pl_tensor_info *t, char *out, size_t n) {
    size_t used = (size_t)snprintf(out, n, "(");
    for (int d = 0; d < t->ndim && used < n; d++)
        used += (size_t)snprintf(out + used, n - used, "%lld%s", (long long)t->shape[d],
                                 t->ndim == 1 ? "," : d + 1 < t->ndim ? ", " : "");
    if (used < n) snprintf(out + used, n - used, ")");
}

/* The value of 'key': in a .npy header dict, or NULL. */
static const char *field(const char *header, const char *key) {
    const char *p = strstr(header, key);
    if (!p) return NULL;
    p += strlen(key);
    while (*p == ' ') p++;
    return p;
}

/* How many characters of p to print: up to and including `end` (at most 40). */
static int until(const char *p, int from, char end) {
    const char *e = p ? strchr(p + from, end) : NULL;
    return e && e - p < 40 ? (int)(e - p) + 1 : 40;
}

/* Read FILE.npy into input `index`: the header must give exactly its dtype, C
 * order and shape (compared as numpy writes them, spaces ignored). */
static void read_npy(pl_executor *h, int index, const char *name, const char *path) {
    pl_tensor_info t;
    api.input_info(h, index, &t);
    FILE *f = fopen(path, "rb");
    if (!f) die("input '%s': cannot open %s", name, path);
    unsigned char pre[12];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0)
        die("input '%s': %s is not a .npy file", name, path);
    size_t hlen = pre[8] | (size_t)pre[9] << 8;
    if (pre[6] >= 2) { /* versions 2 and 3: a 4-byte header length */
        if (fread(pre + 10, 1, 2, f) != 2) die("input '%s': %s is truncated", name, path);
        hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    }
    char *header = calloc(hlen + 1, 1), *squeezed = calloc(hlen + 1, 1);
    if (!header || !squeezed || fread(header, 1, hlen, f) != hlen)
        die("input '%s': %s is truncated", name, path);
    size_t k = 0;
    for (size_t i = 0; i < hlen; i++)
        if (header[i] != ' ' && header[i] != '\n') squeezed[k++] = header[i];
    int symbolic = 0; /* a VM library's input with symbolic dimensions (-1 in its info) */
    for (int d = 0; d < t.ndim; d++) symbolic |= t.shape[d] < 0;
    if (symbolic && api.set_input_shape) { /* the file's shape, checked against bounds */
        int64_t dims[32];
        int ndim = 0;
        const char *p = field(squeezed, "'shape':");
        if (!p || *p != '(') die("input '%s': %s has no shape in its header", name, path);
        for (p++; *p && *p != ')' && ndim < 32; ndim++) {
            char *end;
            dims[ndim] = strtoll(p, &end, 10);
            if (end == p) die("input '%s': %s has a malformed shape", name, path);
            p = *end == ',' ? end + 1 : end;
        }
        if (api.set_input_shape(h, index, ndim, dims))
            die("%s: %s", path, api.last_error(h));
        api.input_info(h, index, &t);
    }
    char want[512], shape[400];
    shape_text(&t, shape, sizeof shape);
    const char *descr = field(squeezed, "'descr':"), *order = field(squeezed, "'fortran_order':");
    const char *dims = field(squeezed, "'shape':");
    char shape_squeezed[400];
    k = 0;
    for (const char *c = shape; *c; c++)
        if (*c != ' ') shape_squeezed[k++] = *c;
    shape_squeezed[k] = 0;
    snprintf(want, sizeof want, "'%s'", descr_of(t.dtype, 0));
    char also[16];
    snprintf(also, sizeof also, "'%s'", descr_of(t.dtype, 1));
    if (!descr || (strncmp(descr, want, strlen(want)) != 0 &&
                   (strlen(also) == 2 || strncmp(descr, also, strlen(also)) != 0)))
        die("input '%s': %s has dtype %.*s, expected %s %s", name, path,
            until(descr, 1, '\''), descr ? descr : "?", t.dtype, want);
    if (!order || strncmp(order, "False", 5) != 0)
        die("input '%s': %s is in Fortran order; save it in C order", name, path);
    if (!dims || strncmp(dims, shape_squeezed, strlen(shape_squeezed)) != 0)
        die("input '%s': %s has shape %.*s, expected %s", name, path, until(dims, 0, ')'),
            dims ? dims : "?", shape);
    size_t size = file_bytes(&t);
    unsigned char *data = malloc(size ? size : 1), *two = malloc(t.nbytes ? t.nbytes : 1);
    if (!data || !two || fread(data, 1, size, f) != size || fgetc(f) != EOF)
        die("input '%s': %s does not hold exactly %zu bytes of data", name, path, size);
    if (packed(&t)) pack(&t, data, two);
    if (api.set_input(h, index, packed(&t) ? two : data, t.nbytes))
        die("input '%s': %s", name, api.last_error(h));
    free(two);
    fclose(f);
    free(data), free(header), free(squeezed);
}

/* Output `index` (element `item` of it if item >= 0: a sequence) as DIR/output_<index>.npy
 * (output_<index>_<item>.npy). */
static void write_npy(pl_executor *h, int index, int item, const char *dir) {
    pl_tensor_info t;
    char path[4096], header[512], shape[400];
    if (item >= 0 && api.output_item_info(h, index, item, &t))
        die("output %d: %s", index, api.last_error(h));
    if (item < 0) api.output_info(h, index, &t);
    shape_text(&t, shape, sizeof shape);
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, "
                     "'shape': %s, }", descr_of(t.dtype, 0), shape);
    /* Pad with spaces so the data starts 64-byte aligned; the header ends in '\n'. */
    int total = (10 + n + 1 + 63) / 64 * 64;
    memset(header + n, ' ', (size_t)(total - 10 - n - 1));
    header[total - 10 - 1] = '\n';
    size_t size = file_bytes(&t);
    unsigned char *data = malloc(t.nbytes ? t.nbytes : 1), *one = malloc(size ? size : 1);
    if (!data || !one || (item >= 0 ? api.get_output_item(h, index, item, data, t.nbytes)
                                    : api.get_output(h, index, data, t.nbytes)))
        die("output %d: %s", index, data ? api.last_error(h) : "out of memory");
    if (packed(&t)) unpack(&t, data, one);
    if (item >= 0) snprintf(path, sizeof path, "%s/output_%d_%d.npy", dir, index, item);
    else snprintf(path, sizeof path, "%s/output_%d.npy", dir, index);
    FILE *f = fopen(path, "wb");
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(total - 10),
                             (unsigned char)((total - 10) >> 8)};
    if (!f || fwrite(pre, 1, 10, f) != 10 || fwrite(header, 1, (size_t)(total - 10), f) !=
        (size_t)(total - 10) || fwrite(packed(&t) ? one : data, 1, size, f) != size ||
        fclose(f))
        die("cannot write %s", path);
    free(data), free(one);
}

/* Create `dir` and its missing parents, as mkdir -p does (existing ones are fine). */
static void make_dirs(const char *dir) {
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0) die("--output-dir needs a directory name");
    if (n >= sizeof path) die("output directory name too long: %s", dir);
    memcpy(path, dir, n + 1);
    /* Each prefix ending before a '/', then the whole name; p starts past a leading '/'. */
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char end = *p;
        *p = 0;
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            die("cannot create output directory %s: %s", path, strerror(errno));
        *p = end;
        if (!end) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0)
        die("cannot create output directory %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))  /* mkdir said EEXIST: a file of that name */
        die("cannot create output directory %s: %s", dir, strerror(ENOTDIR));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* `repeat` timed runs after the first; prints their median (and with print_time
 * their minimum too, in tvmc's one-line form). */
static void time_runs(pl_executor *h, long repeat, int print_time) {
    double *ms = malloc((size_t)repeat * sizeof *ms);
    if (!ms) die("out of memory");
    for (long r = 0; r < repeat; r++) {
        double start = now_ms();
        if (api.run(h)) die("run failed: %s", api.last_error(h));
        ms[r] = now_ms() - start;
    }
    qsort(ms, (size_t)repeat, sizeof *ms, cmp_double);
    double median = repeat % 2 ? ms[repeat / 2] : (ms[repeat / 2 - 1] + ms[repeat / 2]) / 2;
    if (print_time)
        printf("time: median %.4f ms, min %.4f ms over %ld runs\n", median, ms[0], repeat);
    else
        printf("median %.4f ms per run over %ld runs\n", median, repeat);
    free(ms);
}

/* This process's peak resident memory in KiB (VmHWM of /proc/self/status), or -1. A
 * parent's rusage would not do: its ru_maxrss counts the memory of the process that
 * forked and exec'd us (a Python one's tens of MB). */
static long peak_resident_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kib = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

static long number(const char *flag, const char *text, long min) {
    char *end;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < min) die("%s needs an integer >= %ld, got '%s'", flag, min, text);
    return v;
}

int main(int argc, char **argv) {
    const char *lib = NULL, *out_dir = NULL, *inputs[256];
    int n_inputs = 0;
    long threads = 0, repeat = 0;
    int check = 1, print_time = 0, print_memory = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(a, "--input") == 0 && has_value && n_inputs < 256) inputs[n_inputs++] = argv[++i];
        else if (strcmp(a, "--output-dir") == 0 && has_value) out_dir = argv[++i];
        else if (strcmp(a, "--threads") == 0 && has_value) threads = number(a, argv[++i], 1);
        else if (strcmp(a, "--repeat") == 0 && has_value) repeat = number(a, argv[++i], 1);
        else if (strcmp(a, "--print-time") == 0) print_time = 1;
        else if (strcmp(a, "--print-memory") == 0) print_memory = 1;
        else if (strcmp(a, "--no-check") == 0) check = 0; /* the blob's sha256: skip it */
        else if (a[0] != '-' && !lib) lib = a;
        else die("bad argument '%s'; usage: pipeline-run LIB.so --input NAME=FILE.npy "
                 "[--input ...] --output-dir DIR [--threads T] [--repeat N] [--print-time] "
                 "[--print-memory] [--no-check]", a);
    }
    if (!lib || !out_dir) die("usage: pipeline-run LIB.so --input NAME=FILE.npy [--input ...] "
                              "--output-dir DIR [--threads T] [--repeat N] [--print-time] "
                              "[--print-memory] [--no-check]");
    load_api(lib);
    char err[512];
    pl_executor *h = (check ? api.create : api.create_unchecked)(err, sizeof err);
    if (!h) die("%s: %s", lib, err);
    if (threads) api.set_num_threads(h, (int)threads);
    char *given = calloc((size_t)api.num_inputs(h) + 1, 1);
    for (int i = 0; i < n_inputs; i++) {
        char name[1024];
        const char *eq = strchr(inputs[i], '=');
        if (!eq || (size_t)(eq - inputs[i]) >= sizeof name)
            die("--input needs NAME=FILE.npy, got '%s'", inputs[i]);
        memcpy(name, inputs[i], (size_t)(eq - inputs[i]));
        name[eq - inputs[i]] = 0;
        int index = api.get_input_index(h, name);
        if (index < 0) die("the library has no input named '%s'", name);
        read_npy(h, index, name, eq + 1);
        if (index < api.num_inputs(h)) given[index] = 1;
    }
    for (int i = 0; i < api.num_inputs(h); i++) {
        pl_tensor_info t;
        api.input_info(h, i, &t);
        if (!given[i]) die("input '%s' not given (--input %s=FILE.npy)", t.name, t.name);
    }
    make_dirs(out_dir);  /* before the run: a long (emulated) run is not wasted */
    if (api.run(h)) die("run failed: %s", api.last_error(h));
    for (int o = 0; o < api.num_outputs(h); o++) {
        /* a sequence: one file per element; an empty optional: none */
        int count = api.output_count ? api.output_count(h, o) : -1;
        for (int j = 0; j < count; j++) write_npy(h, o, j, out_dir);
        if (count == -1) write_npy(h, o, -1, out_dir);
    }
    if (print_time && repeat == 0) repeat = 1;
    if (repeat > 0) time_runs(h, repeat, print_time);
    if (print_memory) {
        long kib = peak_resident_kib();
        if (kib < 0) die("--print-memory: no VmHWM in /proc/self/status on this system");
        printf("memory: peak %.1f MB resident\n", (double)kib * 1024 / 1e6);
    }
    return 0;
}
