"""One defined LLVM function as a C99 function: declarations, blocks as labels,
branches as gotos, phis assigned on the edges (the statements half of the c
target's translation; the expressions are c_expression.py's)."""

from __future__ import annotations

import re

import llvmlite.binding as llvm
from llvmlite.binding import ValueRef

from pipeline.codegen.c_expression import ExpressionWriter
from pipeline.codegen.c_types import EFFECTS, c_type, identity, vector_of


class FunctionWriter(ExpressionWriter):
    """One defined function's C text: declarations, then its blocks as labels."""

    def __init__(self, fn: ValueRef, names: dict[int, str], helpers: set[str]):
        """fn: a defined function of the parsed module; names: identity of each
        function and global -> its C name; helpers: the HELPERS keys the file needs,
        added to as the translation uses them."""
        self.fn, self.names, self.helpers = fn, names, helpers
        self.blocks = list(fn.blocks)
        self.block_index = {identity(b): k for k, b in enumerate(self.blocks)}
        self.args = {identity(a): f"p{k}" for k, a in enumerate(fn.arguments)}
        self.values: dict[int, str] = {}     # instruction -> its variable
        self.ctypes: dict[str, str] = {}     # variable -> its C type
        self.decls: list[str] = []
        self.lines: list[str] = []
        self.targets: set[int] = set()       # blocks some goto names
        self.phis: dict[int, list] = {}      # block -> its phi instructions
        self.live = self._live()

    def signature(self) -> str:
        """The C declarator: `[static] <return type> <name>(<params>)`."""
        ftype = self.fn.global_value_type
        ret = c_type(str(ftype.get_function_return()))
        ret = "int32_t" if ret == "uint32_t" else ret
        args = ", ".join(f"{c_type(str(a.type))} p{k}" for k, a in enumerate(self.fn.arguments))
        static = "" if self.fn.linkage == llvm.Linkage.external else "static "
        return f"{static}{ret} {self.names[identity(self.fn)]}({args or 'void'})"

    def _live(self) -> set[int]:
        """The instructions whose results are used, or that have effects."""
        operands, todo, live = {}, [], set()
        for block in self.blocks:
            for inst in block.instructions:
                operands[identity(inst)] = [identity(o) for o in inst.operands]
                if inst.opcode in EFFECTS:
                    todo.append(identity(inst))
        while todo:
            a = todo.pop()
            if a in live:
                continue
            live.add(a)
            todo += [o for o in operands[a] if o in operands]
        return live

    def text(self) -> str:
        """The function's C definition (declarations first, then one labelled
        statement list per block)."""
        for block in self.blocks:
            self.phis[identity(block)] = [i for i in block.instructions if i.opcode == "phi"
                                       and identity(i) in self.live]
        k = 0
        for block in self.blocks:
            for inst in block.instructions:
                if identity(inst) in self.live and inst.opcode not in EFFECTS - {"call"} \
                        and str(inst.type) != "void" and inst.opcode != "alloca":
                    self._declare(inst, f"v{k}")
                    k += 1
        for block in self.blocks:
            self.lines.append(("label", identity(block)))
            for inst in block.instructions:
                if identity(inst) in self.live:
                    self._instruction(inst)
        self._drop_unread()
        out = [self.signature() + " {"] + [f"    {d}" for d in self.decls]
        for line in self.lines:
            if isinstance(line, tuple):
                if line[1] in self.targets:
                    out.append(f"L{self.block_index[line[1]]}:;")
            else:
                out.append(f"    {line}")
        return "\n".join(out) + "\n}\n"

    def _drop_unread(self) -> None:
        """Drop the variables nothing reads (a vector's lanes no one uses) and their
        assignments, until none is left: -Wall warns of a variable set but unused."""
        assign = re.compile(r"^\s*(\w+) = (.*);$")
        while True:
            reads: dict[str, int] = {}
            for line in self.lines:
                if isinstance(line, tuple):
                    continue
                m = assign.match(line)
                for name in _NAME.findall(m.group(2) if m else line):
                    reads[name] = reads.get(name, 0) + 1
            dead = {v for v in self.ctypes if v not in reads}
            if not dead:
                return
            self.lines = [ln for ln in self.lines if isinstance(ln, tuple)
                          or not (assign.match(ln) and assign.match(ln).group(1) in dead)]
            self.decls = [d for d in self.decls if _declared(d) not in dead]
            for v in dead:
                del self.ctypes[v]

    def _declare(self, inst, name: str) -> None:
        type_text = str(inst.type)
        vec = vector_of(type_text)
        self.values[identity(inst)] = name
        ctype = c_type(vec[1] if vec else type_text)
        for var in [f"{name}_{i}" for i in range(vec[0])] if vec else [name]:
            self.ctypes[var] = ctype
            self.decls.append(f"{ctype} {var} = 0;")

    # -- instructions --

    def _instruction(self, inst) -> None:
        op = inst.opcode
        if op in EFFECTS - {"store", "call", "br", "ret"}:  # atomics, switch, ...
            self._fail(inst, f"instruction {op} has no C form here")
        if op == "phi":
            return  # assigned on the edges
        if op == "br":
            return self._branch(inst)
        if op == "ret":
            ops = list(inst.operands)
            return self.lines.append(f"return {self.value(ops[0])};" if ops else "return;")
        if op == "alloca":
            return self._alloca(inst)
        if op == "store":
            value, ptr = inst.operands
            vec = vector_of(str(value.type))
            ctype = c_type(vec[1] if vec else str(value.type))
            p = self.value(ptr)
            if vec:
                for i in range(vec[0]):
                    self.lines.append(f"(({ctype} *){p})[{i}] = {self.value(value, i)};")
            else:
                self.lines.append(f"*({ctype} *){p} = {self.value(value)};")
            return None
        if op == "call" and str(inst.type) == "void":
            return self._void_call(inst)
        vec = vector_of(str(inst.type))
        for lane in range(vec[0]) if vec else [None]:
            dst = self.values[identity(inst)] + ("" if lane is None else f"_{lane}")
            self.lines.append(f"{dst} = {self._expression(inst, lane)};")
        return None

    def _alloca(self, inst) -> None:
        m = re.search(r"alloca (.+?)(?:, (i\d+) (\d+))?(?:, align \d+)?$", str(inst).strip())
        if not m:
            self._fail(inst, "an alloca of no known form")
        elem, count = m.group(1), int(m.group(3) or 1)
        name = f"a{len(self.decls)}"
        arr = re.fullmatch(r"\[(\d+) x (.+)\]|<(\d+) x (.+)>", elem)
        if arr:  # an array or vector slot: its elements in a row
            elem = arr.group(2) or arr.group(4)
            count *= int(arr.group(1) or arr.group(3))
        self.decls.append(f"{c_type(elem).replace(' *', '')}{' *' if elem == 'ptr' else ''}"
                          f" {name}[{count}];")
        self.values[identity(inst)] = f"(void *){name}"

    def _void_call(self, inst) -> None:
        callee = list(inst.operands)[-1]
        if callee.name.startswith("llvm.prefetch"):
            return
        if identity(callee) not in self.names or callee.name.startswith("llvm."):
            self._fail(inst, "a call of no C form")
        args = ", ".join(self.value(o) for o in list(inst.operands)[:-1])
        self.lines.append(f"{self.names[identity(callee)]}({args});")

    def _branch(self, inst) -> None:
        ops = list(inst.operands)
        if len(ops) == 1:
            return self.lines.extend(self._edge(inst.block, ops[0]))
        cond, false, true = ops  # LLVM keeps a conditional branch's targets reversed
        self.lines.append(f"if ({self.value(cond)}) {{")
        self.lines.extend(f"    {s}" for s in self._edge(inst.block, true))
        self.lines.append("} else {")
        self.lines.extend(f"    {s}" for s in self._edge(inst.block, false))
        self.lines.append("}")
        return None

    def _edge(self, source, target) -> list[str]:
        """The phi assignments of the edge source -> target, then its goto."""
        phis = self.phis[identity(target)]
        assigns = []
        reading = {identity(p) for p in phis}
        for phi in phis:
            k = [identity(b) for b in phi.incoming_blocks].index(identity(source))
            incoming = list(phi.operands)[k]
            vec = vector_of(str(phi.type))
            for lane in range(vec[0]) if vec else [None]:
                dst = self.values[identity(phi)] + ("" if lane is None else f"_{lane}")
                assigns.append((dst, self.value(incoming, lane), identity(incoming) in reading))
        lines = []
        if any(reads for *_, reads in assigns):  # a parallel copy: read all, then write
            for dst, src, _ in assigns:
                self._temporary(dst)
                lines.append(f"{dst}_t = {src};")
            lines += [f"{dst} = {dst}_t;" for dst, _, _ in assigns]
        else:
            lines += [f"{dst} = {src};" for dst, src, _ in assigns]
        self.targets.add(identity(target))
        return [*lines, f"goto L{self.block_index[identity(target)]};"]

    def _temporary(self, var: str) -> None:
        """Declare `<var>_t`, of the type of the variable `var`, once."""
        if var + "_t" not in self.ctypes:
            self.ctypes[var + "_t"] = self.ctypes[var]
            self.decls.append(f"{self.ctypes[var]} {var}_t = 0;")


# The variables a function's C declares: v<k>, v<k>_<lane>, their _t temporaries, a<k>.
_NAME = re.compile(r"\b[va]\d+(?:_\d+)?(?:_t)?\b")


def _declared(declaration: str) -> str:
    """The variable a declaration line ("float v3_1 = 0;", "float a2[16];") declares."""
    return re.search(r"(\w+)(?:\[\d+\])? ?(?:= 0)?;$", declaration).group(1)


