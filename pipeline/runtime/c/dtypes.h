/* The dtype codes of the graph plan and the VM's .ro (pipeline/link/plan.py and
 * pipeline/vm/bytecode.py DTYPES: appended, never renumbered), with their sizes and
 * the (type code, bits) TVM's param dicts and DLPack write for them. Included by
 * executor.c and vm.c. */
#ifndef PIPELINE_DTYPES_H
#define PIPELINE_DTYPES_H

#include <stdint.h>

static const struct { const char *name; uint8_t size, dl_code, dl_bits; } DTYPES[] = {
    {"float32", 4, 2, 32}, {"float64", 8, 2, 64}, {"int32", 4, 0, 32}, {"int64", 8, 0, 64},
    {"bool", 1, 1, 1},     {"float16", 2, 2, 16}, {"int8", 1, 0, 8},   {"int16", 2, 0, 16},
    {"uint8", 1, 1, 8},    {"uint16", 2, 1, 16},  {"uint32", 4, 1, 32}, {"uint64", 8, 1, 64},
    /* DLPack's kDLBfloat and kDLFloat8_* codes */
    {"bfloat16", 2, 4, 16}, {"float8_e4m3fn", 1, 10, 8}, {"float8_e4m3fnuz", 1, 11, 8},
    {"float8_e5m2", 1, 12, 8}, {"float8_e5m2fnuz", 1, 13, 8},
    /* size 0: 8 / dl_bits elements a byte (element k*i in the low bits of byte i) */
    {"uint4", 0, 1, 4},     {"int4", 0, 0, 4},
    /* DLPack's kDLFloat4_e2m1fn (17) and kDLFloat8_e8m0fnu (14); int2/uint2 four a byte */
    {"float4_e2m1fn", 0, 17, 4}, {"float8_e8m0fnu", 1, 14, 8},
    {"uint2", 0, 1, 2},     {"int2", 0, 0, 2},
};
#define N_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

#endif
