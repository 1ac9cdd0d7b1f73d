"""The C side of the c target's translation (pipeline/codegen/c_source.py): LLVM
types and constants as C99 text, and the tables of what each LLVM operation is in C."""

from __future__ import annotations

import ctypes
import math
import re
import struct

from llvmlite.binding import ValueRef

from pipeline.errors import PipelineError


class CSourceError(PipelineError):
    """A kernel's LLVM IR holds something the C translation does not handle."""


INT = {1: "_Bool", 8: "uint8_t", 16: "uint16_t", 32: "uint32_t", 64: "uint64_t"}
SIGNED = {1: "int8_t", 8: "int8_t", 16: "int16_t", 32: "int32_t", 64: "int64_t"}
SCALAR = {"float": "float", "double": "double", "half": "uint16_t", "ptr": "void *",
          **{f"i{w}": t for w, t in INT.items()}}
SIZE = {"float": "4", "double": "8", "half": "2", "ptr": "sizeof(void *)",
        **{f"i{w}": str(max(w // 8, 1)) for w in INT}}
# llvm.<name>.<f32|f64> -> the C99 math.h function of float (double without the f).
MATH = {"fma": "fmaf", "maxnum": "fmaxf", "minnum": "fminf", "maximumnum": "fmaxf",
        "minimumnum": "fminf", "floor": "floorf", "ceil": "ceilf", "sqrt": "sqrtf",
        "fabs": "fabsf", "exp": "expf", "log": "logf", "pow": "powf",
        "copysign": "copysignf", "roundeven": "rintf", "trunc": "truncf",
        "round": "roundf", "exp2": "exp2f", "log2": "log2f", "sin": "sinf", "cos": "cosf"}
# Float functions kernels call by name (builder.extern): declared by math.h already.
LIBM = re.compile(r"^(erf|erfc|tanh|log1p|expm1|sinh|cosh|asinh|acosh|atanh|asin|acos|"
                  r"atan|atan2|tan|sin|cos|exp|log|pow|fmod|cbrt|lgamma|tgamma|round|"
                  r"nearbyint|rint)f?$")
FCMP = {"oeq": "{a} == {b}", "ogt": "{a} > {b}", "oge": "{a} >= {b}", "olt": "{a} < {b}",
        "ole": "{a} <= {b}", "one": "({a} < {b} || {a} > {b})",
        "ord": "(!isnan({a}) && !isnan({b}))", "ueq": "!({a} < {b} || {a} > {b})",
        "ugt": "!({a} <= {b})", "uge": "!({a} < {b})", "ult": "!({a} >= {b})",
        "ule": "!({a} > {b})", "une": "{a} != {b}", "uno": "(isnan({a}) || isnan({b}))",
        "true": "1", "false": "0"}
ICMP = {"eq": "==", "ne": "!=", "ugt": ">", "uge": ">=", "ult": "<", "ule": "<=",
        "sgt": ">", "sge": ">=", "slt": "<", "sle": "<="}
ARITH = {"add": "+", "sub": "-", "mul": "*", "and": "&", "or": "|", "xor": "^",
         "udiv": "/", "urem": "%", "sdiv": "/", "srem": "%", "shl": "<<", "lshr": ">>",
         "ashr": ">>", "fadd": "+", "fsub": "-", "fmul": "*", "fdiv": "/"}
# Instructions kept whether or not their result is used (effects, block ends).
EFFECTS = {"store", "call", "br", "ret", "atomicrmw", "cmpxchg", "fence", "unreachable",
           "switch"}

# C functions a kernel's source carries when it needs them (float bits, half floats).
HELPERS = {
    "bits": """\
static inline uint32_t pl_f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float pl_u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static inline uint64_t pl_d2u(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
static inline double pl_u2d(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }
""",
    "half": """\
static inline float pl_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float x;
    if (e == 0x1fu) {
        uint32_t u = sign | 0x7f800000u | (m << 13);
        memcpy(&x, &u, 4);
        return x;
    }
    x = e ? ldexpf((float)(m | 0x400u), (int)e - 25) : ldexpf((float)m, -24);
    return sign ? -x : x;
}
static inline uint16_t pl_f2h(float f) {
    uint32_t u, sign, e, m, r;
    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000u; e = (u >> 23) & 0xffu; m = u & 0x7fffffu;
    if (e == 0xffu) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u : 0u));
    if (e > 142u) return (uint16_t)(sign | 0x7c00u);
    if (e < 113u) {  /* a half subnormal or zero: m / 2^(126 - e) at 2^-24 steps */
        uint32_t shift = 126u - e, full = m | 0x800000u, half_ulp, rest;
        if (shift > 24u) return (uint16_t)sign;
        r = full >> shift; half_ulp = 1u << (shift - 1u);
        rest = full & ((half_ulp << 1) - 1u);
        if (rest > half_ulp || (rest == half_ulp && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    r = ((e - 112u) << 10) | (m >> 13);
    if ((m & 0x1fffu) > 0x1000u || ((m & 0x1fffu) == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}
""",
}


def identity(value: ValueRef) -> int:
    """The identity of an llvmlite.binding value (its wrapper objects are new on
    every access)."""
    return ctypes.cast(value._ptr, ctypes.c_void_p).value


def c_name(name: str) -> str:
    """A C identifier for an LLVM symbol ("conv2d_ab.planes" -> "conv2d_ab_planes")."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def vector_of(type_text: str) -> tuple[int, str] | None:
    """(lanes, element type) of a vector type's text ("<4 x float>"), else None."""
    m = re.fullmatch(r"<(\d+) x (\S+)>", type_text)
    return (int(m.group(1)), m.group(2)) if m else None


def c_type(type_text: str) -> str:
    if type_text == "void":
        return "void"
    try:
        return SCALAR[type_text]
    except KeyError:
        raise CSourceError(f"type {type_text} has no C form here") from None


def c_sizeof(type_text: str) -> str:
    """sizeof the LLVM type (a scalar or an array of them) as C text."""
    m = re.fullmatch(r"\[(\d+) x (.+)\]|<(\d+) x (.+)>", type_text)
    if m:
        count, elem = m.group(1) or m.group(3), m.group(2) or m.group(4)
        inner = c_sizeof(elem)
        return str(int(count) * int(inner)) if inner.isdigit() else f"{count} * {inner}"
    if type_text not in SIZE:
        raise CSourceError(f"type {type_text} has no C form here")
    return SIZE[type_text]


def c_constant(text: str) -> str:
    """C text of one scalar constant's LLVM text ("float 1.000000e+00", "i64 -1")."""
    kind, _, value = text.strip().partition(" ")
    if value in ("undef", "poison", "zeroinitializer"):
        return "0"
    if value == "null":
        return "(void *)0"
    if kind.startswith("i"):
        if value in ("true", "false"):
            return "1" if value == "true" else "0"
        width = int(kind[1:])
        n = int(value) % (1 << width)
        return f"{n}u" if n < 1 << 32 else f"UINT64_C({n})"
    if kind == "half":
        return f"0x{int(value[3:], 16):04x}u" if value.startswith("0xH") else \
            c_constant(f"float {value}").join(("pl_f2h(", ")"))
    if value.startswith("0x"):
        x = struct.unpack(">d", bytes.fromhex(value[2:]))[0]
    else:
        x = float(value)
    suffix = "f" if kind == "float" else ""
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    return x.hex() + suffix


def aggregate_elements(text: str) -> list[str]:
    """The element texts of an aggregate constant's body ("[i64 1, i64 2]", "<...>")."""
    body = text.strip()[1:-1].strip()
    return [e.strip() for e in body.split(",")] if body else []


def element_type(type_text: str) -> str:
    """A vector type's element type, else the type itself."""
    vec = vector_of(type_text)
    return vec[1] if vec else type_text
