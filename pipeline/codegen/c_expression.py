"""One LLVM instruction's value (one lane of a vector one) as a C99 expression:
the expressions half of the c target's function translation (c_function.py)."""

from __future__ import annotations

import re

from llvmlite.binding import ValueRef

from pipeline.codegen.c_types import (
    ARITH,
    FCMP,
    ICMP,
    INT,
    LIBM,
    MATH,
    SIGNED,
    CSourceError,
    aggregate_elements,
    c_constant,
    c_sizeof,
    c_type,
    element_type,
    identity,
    vector_of,
)


class ExpressionWriter:
    """Operands and instruction values as C text; FunctionWriter fills `values`
    (instruction -> variable), `args`, `names` (functions, globals) and `helpers`."""

    fn = None
    names: dict[int, str]
    args: dict[int, str]
    values: dict[int, str]
    helpers: set[str]

    # -- operands --

    def value(self, op: ValueRef, lane: int | None = None) -> str:
        """C text of an operand (lane `lane` of a vector operand)."""
        a = identity(op)
        if a in self.values:
            return self.values[a] + ("" if lane is None else f"_{lane}")
        if a in self.args:
            return self.args[a]
        if a in self.names:
            return f"(void *){self.names[a]}"
        text = str(op).strip()
        if vector_of(str(op.type)):
            body = text[text.index(">") + 1:].strip()
            if body in ("undef", "poison", "zeroinitializer"):
                return "0"
            if body.startswith("splat ("):  # LLVM's text for a vector of one value
                return self._constant(body[len("splat ("):-1])
            return self._constant(aggregate_elements(body)[lane])
        return self._constant(text)

    def _constant(self, text: str) -> str:
        out = c_constant(text)
        if out.startswith("pl_f2h("):
            self.helpers.add("half")
        return out

    def _fail(self, inst, why: str):
        raise CSourceError(f"kernel function {self.fn.name}: {why}: {str(inst).strip()}")

    # -- the value of one instruction (one lane of a vector one) --

    def _expression(self, inst, lane: int | None) -> str:
        op, ops = inst.opcode, list(inst.operands)
        if op in ARITH or op == "frem":
            return self._arith(inst, op, ops, lane)
        if op == "fneg":
            return f"-{self.value(ops[0], lane)}"
        if op == "icmp" or op == "fcmp":
            return self._compare(inst, op, ops, lane)
        if op == "select":
            cond = self.value(ops[0], lane if vector_of(str(ops[0].type)) else None)
            return f"{cond} ? {self.value(ops[1], lane)} : {self.value(ops[2], lane)}"
        if op == "load":
            ctype, p = c_type(element_type(str(inst.type))), self.value(ops[0])
            return f"*({ctype} *){p}" if lane is None else f"(({ctype} *){p})[{lane}]"
        if op == "getelementptr":
            return self._gep(inst, ops)
        if op == "call":
            return self._call(inst, ops, lane)
        if op == "extractelement":
            return self.value(ops[0], self._lane_index(inst, ops[1]))
        if op == "insertelement":
            at = self._lane_index(inst, ops[2])
            return self.value(ops[1]) if at == lane else self.value(ops[0], lane)
        if op == "shufflevector":
            return self._shuffle(inst, ops, lane)
        if op == "freeze":
            return self.value(ops[0], lane)
        return self._cast(inst, op, ops, lane)

    def _lane_index(self, inst, op) -> int:
        if identity(op) in self.values or identity(op) in self.args:
            self._fail(inst, "a lane index that is not a constant")
        return int(str(op).split()[-1])

    def _arith(self, inst, op: str, ops: list, lane) -> str:
        a, b = self.value(ops[0], lane), self.value(ops[1], lane)
        elem = element_type(str(inst.type))
        if op == "frem":
            return f"fmod{'f' if elem == 'float' else ''}({a}, {b})"
        if elem in ("float", "double"):
            return f"{a} {ARITH[op]} {b}"
        if elem == "half":
            self._fail(inst, "half arithmetic")
        width = int(elem[1:])
        ctype, signed = INT[width], SIGNED[width]
        if op in ("sdiv", "srem", "ashr"):
            return f"({ctype})(({signed}){a} {ARITH[op]} ({signed}){b})"
        if op in ("add", "sub", "mul", "shl") and width < 32:  # no int promotion overflow
            return f"({ctype})((uint32_t){a} {ARITH[op]} (uint32_t){b})"
        return f"{a} {ARITH[op]} {b}"

    def _compare(self, inst, op: str, ops: list, lane) -> str:
        pred = str(inst).split(f"{op} ", 1)[1].split()
        pred = pred[0] if pred[0] in FCMP or pred[0] in ICMP else \
            next(w for w in pred if w in FCMP or w in ICMP)  # past fast-math flags
        a, b = self.value(ops[0], lane), self.value(ops[1], lane)
        if op == "fcmp":
            if element_type(str(ops[0].type)) == "half":
                self._fail(inst, "half comparison")
            return FCMP[pred].format(a=a, b=b)
        elem = element_type(str(ops[0].type))
        if pred.startswith("s"):
            signed = SIGNED[int(elem[1:])]
            return f"({signed}){a} {ICMP[pred]} ({signed}){b}"
        return f"{a} {ICMP[pred]} {b}"

    def _gep(self, inst, ops: list) -> str:
        m = re.search(r"getelementptr (?:(?:inbounds|nuw|nusw|inrange\(\S+\)) )*(.+?), ptr ",
                      str(inst).strip())
        if not m:
            self._fail(inst, "a getelementptr of no known form")
        typ, constant, terms = m.group(1), 0, []
        for k, index in enumerate(ops[1:]):
            if k > 0:
                arr = re.fullmatch(r"\[(\d+) x (.+)\]", typ)
                if not arr:
                    self._fail(inst, "an index into a type that is no array")
                typ = arr.group(2)
            size = c_sizeof(typ)
            text = self.value(index)
            if re.fullmatch(r"\d+u|UINT64_C\(\d+\)", text):  # a constant: fold it
                n = int(re.sub(r"\D", "", text))
                width = int(str(index.type)[1:])
                n = n - (1 << width) if n >= 1 << (width - 1) else n
                if size.isdigit():
                    constant += n * int(size)
                    continue
                terms.append(f"({n}) * (ptrdiff_t){size}")
            else:
                signed = SIGNED[int(str(index.type)[1:])]
                terms.append(f"(ptrdiff_t)({signed}){text} * {size}")
        if constant:
            terms.append(str(constant))
        offset = " + ".join(terms) or "0"
        return f"(void *)((char *){self.value(ops[0])} + {offset})"

    def _call(self, inst, ops: list, lane) -> str:
        callee, args = ops[-1], ops[:-1]
        name = callee.name
        m = re.fullmatch(r"llvm\.(\w+)\.(?:v\d+)?(f32|f64)", name)
        if m and m.group(1) in MATH:
            fn = MATH[m.group(1)]
            fn = fn[:-1] if m.group(2) == "f64" else fn
        elif LIBM.match(name):
            fn = name
        elif identity(callee) in self.names and not name.startswith("llvm."):
            fn = self.names[identity(callee)]
        else:
            self._fail(inst, "a call of no C form")
        return f"{fn}({', '.join(self.value(a, lane) for a in args)})"

    def _shuffle(self, inst, ops: list, lane) -> str:
        m = re.search(r".*, <(\d+) x i32> (.*)$", str(inst).strip())  # the last operand
        if not m:
            self._fail(inst, "a shuffle mask of no known form")
        mask_text = m.group(2)
        if mask_text in ("zeroinitializer",):
            picks = [0] * int(m.group(1))
        elif mask_text in ("undef", "poison"):
            picks = [-1] * int(m.group(1))
        else:
            picks = [int(e.split()[1]) if e.split()[1] not in ("undef", "poison") else -1
                     for e in aggregate_elements(mask_text)]
        first = vector_of(str(ops[0].type))[0]
        pick = picks[lane]
        if pick < 0:
            return "0"
        return self.value(ops[0], pick) if pick < first else self.value(ops[1], pick - first)

    def _cast(self, inst, op: str, ops: list, lane) -> str:
        src_t, dst_t = element_type(str(ops[0].type)), element_type(str(inst.type))
        a = self.value(ops[0], lane)
        dst = c_type(dst_t)
        if op in ("trunc", "zext", "uitofp", "fptoui", "fpext", "fptrunc") \
                and "half" not in (src_t, dst_t):
            return f"({dst}){a}"
        if op == "sext":
            width = int(src_t[1:])
            return f"({dst})(-(int64_t){a})" if width == 1 else f"({dst})({SIGNED[width]}){a}"
        if op == "sitofp" and dst_t != "half":
            return f"({dst})({SIGNED[int(src_t[1:])]}){a}"
        if op == "fptosi" and src_t != "half":
            return f"({dst})({SIGNED[int(dst_t[1:])]}){a}"
        if "half" in (src_t, dst_t) and op != "bitcast":
            return self._half_cast(op, src_t, dst_t, a)
        if op == "bitcast":
            return self._bitcast(src_t, dst_t, a)
        if op == "ptrtoint":
            return f"({dst})(uintptr_t){a}"
        if op == "inttoptr":
            return f"(void *)(uintptr_t){a}"
        self._fail(inst, f"instruction {op} has no C form here")
        return ""

    def _half_cast(self, op: str, src_t: str, dst_t: str, a: str) -> str:
        """A conversion to or from half (its bits, uint16_t)."""
        self.helpers.add("half")
        if dst_t == "half":
            if op == "sitofp":
                a = f"(float)({SIGNED[int(src_t[1:])]}){a}"
            return f"pl_f2h((float){a})"
        wide = f"pl_h2f({a})"
        if op == "fptosi":
            return f"({c_type(dst_t)})({SIGNED[int(dst_t[1:])]}){wide}"
        return f"({c_type(dst_t)}){wide}"

    def _bitcast(self, src_t: str, dst_t: str, a: str) -> str:
        if src_t == dst_t or {src_t, dst_t} in ({"half", "i16"}, {"ptr"}):
            return a
        self.helpers.add("bits")
        return {("float", "i32"): "pl_f2u", ("i32", "float"): "pl_u2f",
                ("double", "i64"): "pl_d2u", ("i64", "double"): "pl_u2d"}[(src_t, dst_t)] \
            + f"({a})"


