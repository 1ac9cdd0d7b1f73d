"""Target strings ("llvm -mcpu=native -mattr=+avx2", "c -mcpu=cortex-m4") parsed
into a Target.

A Target names everything that decides machine code: triple, cpu and feature
string. `-mcpu=native` is resolved to this host's cpu and features at parse
time, so the resolved values (not the word "native") enter kernel hashes.
A triple for another machine (`-mtriple=aarch64-linux-gnu`) never takes the
host's cpu: without `-mcpu` it gets its architecture's generic cpu.

`c [-mtriple=T] [-mcpu=C]` is TVM's C target: the kernels are rendered as for LLVM,
translated to C99 (pipeline/codegen/c_source.py) and compiled by the target's C
compiler, which is part of the Target (its command and a digest of its `--version`),
so the kernels' hashes name the compiler that builds them. The triple (this
machine's by default) gives the data layout and whether there is an OS; the cpu only
reaches the compiler's flags (pipeline.link.cc.machine_flags). Its kernels see no
cpu features: 4-lane vectors (one C statement per lane) and a single thread.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm


class TargetError(ValueError):
    """A target string that cannot be understood."""


@dataclass(frozen=True)
class Target:
    """A resolved CPU target: what the code generator needs to emit objects."""

    kind: str  # "llvm", or "c": kernels as C source (module doc)
    triple: str
    cpu: str
    features: str  # LLVM feature string: "+avx2,+fma,-avx512f"
    cc: str = ""          # kind "c": the compiler command of the kernels
    cc_version: str = ""  # kind "c": a digest of its `--version` output

    @property
    def arch(self) -> str:
        """The triple's architecture ("x86_64", "aarch64", "riscv64")."""
        return triple_arch(self.triple)

    @property
    def is_host(self) -> bool:
        """True when this machine runs the target's code natively (same
        architecture and operating system as the process)."""
        host = host_triple()
        return self.arch == triple_arch(host) and _system(self.triple) == _system(host)

    @property
    def bare_metal(self) -> bool:
        """True for a triple without an operating system (`thumbv7em-none-eabihf`,
        `riscv32-unknown-none-elf`): no threads, no dlopen, no files; its kernels
        run single-threaded and its models link only through the AOT executor."""
        return bare_metal_triple(self.triple)

    @property
    def object_format(self) -> str:
        """The object file format the target's toolchain links: elf, macho, coff or wasm."""
        return _object_format(self.triple)

    @property
    def vector_width(self) -> int:
        """Floats per native vector register the kernels are laid out for: on x86,
        16 with AVX-512, 8 with AVX, else 4 (SSE); 4 everywhere else (AArch64
        NEON's 128 bits; on RISC-V LLVM legalises 4-wide vectors for any V setting;
        4 for the c target, whose vectors are one C statement per lane)."""
        if self.arch not in ("x86_64", "i386", "i686") or self.kind == "c":
            return 4
        feats = set(self.features.split(","))
        if "+avx512f" in feats or (self.cpu in _AVX512_CPUS and "-avx512f" not in feats):
            return 16
        if "+avx" in feats or "+avx2" in feats or self.cpu in _AVX2_CPUS:
            return 8
        return 4

    @property
    def threaded(self) -> bool:
        """Whether kernels split loops over threads: not on bare metal (no threads) nor
        for the c target (plain C99: no atomics, no weak symbols)."""
        return not self.bare_metal and self.kind == "llvm"

    def key(self) -> dict:
        """The fields that enter kernel hashes and object cache keys (the compiler's
        too, for the c target)."""
        key = {"triple": self.triple, "cpu": self.cpu, "features": self.features}
        if self.kind != "llvm":
            key.update(kind=self.kind, cc=self.cc, cc_version=self.cc_version)
        return key

    def target_machine(self, opt_level: int = 3):
        """An llvmlite TargetMachine emitting position-independent objects
        (one per target and opt level; render and compile share it)."""
        return _target_machine(self, opt_level)

    def elf_flags(self) -> int:
        """The e_flags LLVM writes into this target's ELF objects (RISC-V records
        its float ABI and compressed instructions there; the linker refuses to mix
        objects whose float ABIs differ), read from an empty module's object."""
        return _elf_flags(self)


def host_triple() -> str:
    """This process's LLVM triple ("x86_64-unknown-linux-gnu")."""
    return llvm.get_process_triple()


def bare_metal_triple(triple: str) -> bool:
    """Whether an LLVM triple names no operating system (its OS word is "none")."""
    return "none" in triple.split("-")[1:]


def triple_arch(triple: str) -> str:
    """The architecture word of an LLVM triple, with LLVM's aliases folded."""
    arch = triple.split("-")[0]
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(arch, arch)


def _system(triple: str) -> str:
    words = triple.split("-")[1:]
    for system in ("linux", "darwin", "macos", "ios", "windows", "freebsd", "wasi"):
        if any(w.startswith(system) for w in words):
            return system
    return "-".join(words)


def _object_format(triple: str) -> str:
    system = _system(triple)
    if system in ("darwin", "macos", "ios") or "apple" in triple.split("-"):
        return "macho"
    if system == "windows" or any(w in triple for w in ("mingw", "cygwin", "msvc")):
        return "coff"
    if triple.startswith("wasm"):
        return "wasm"
    return "elf"


# What clang assumes for a riscv64 Linux triple without -march (RV64GC, the
# ISA Debian and every Linux distribution build for): without it LLVM picks
# soft-float code, which the system's double-float (lp64d) libraries refuse.
# Bare-metal riscv32 gets RV32GC: qemu's virt board runs it and picolibc ships its
# rv32imafdc/ilp32d multilib (LLVM's default ABI with +d is ilp32d).
_DEFAULT_FEATURES = {"riscv64": "+m,+a,+f,+d,+c", "riscv32": "+m,+a,+f,+d,+c"}


# Named CPUs whose implied features we know without asking LLVM (features
# given with -mattr override these).
_AVX512_CPUS = {"skylake-avx512", "cascadelake", "cooperlake", "icelake-server",
                "icelake-client", "tigerlake", "sapphirerapids", "emeraldrapids",
                "graniterapids", "znver4", "znver5", "x86-64-v4"}
_AVX2_CPUS = {"haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
              "arrowlake", "znver1", "znver2", "znver3", "x86-64-v3"}


@cache
def _target_machine(target: Target, opt_level: int):
    _init_llvm()
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=opt_level,
        reloc="pic", codemodel="default")


@cache
def _elf_flags(target: Target) -> int:
    if target.object_format != "elf":
        raise ValueError(f"{target.triple}: not an ELF target")
    module = llvm.parse_assembly(f'target triple = "{target.triple}"\n')
    obj = _target_machine(target, 0).emit_object(module)
    # e_flags sits after ident(16), type, machine (2+2), version (4), entry, phoff, shoff.
    offset = 48 if obj[4] == 2 else 36  # ELF64 or ELF32
    return int.from_bytes(obj[offset:offset + 4], "little" if obj[5] == 1 else "big")


@cache
def _init_llvm() -> None:
    # Safe to call repeatedly; current llvmlite needs no llvm.initialize().
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


@cache
def parse_target(text: str, cc: str | None = None) -> Target:
    """Parse a target string: `llvm [-mtriple=T] [-mcpu=C] [-mattr=+a,-b]`, or
    `c [-mtriple=T] [-mcpu=C]` whose kernels the compiler `cc` builds (None: the
    host's, $CC or cc; for another machine's triple, none: such a Target compiles
    no kernel).

    `-mcpu=native` (or no -mcpu, for this machine's triple) takes this host's
    cpu and all its features; for another machine's triple no -mcpu means
    "generic" (plus RV64GC on riscv64 Linux, as clang assumes) and native is an
    error. -mattr entries then add to or remove from that set.
    """
    words = shlex.split(text)
    if words and words[0] == "c":
        return _c_target(text, words, cc)
    if not words or words[0] != "llvm":
        raise TargetError(f"target {text!r}: only 'llvm' and 'c' targets are supported "
                          "(e.g. 'llvm -mcpu=native', 'c')")
    _init_llvm()
    opts = {}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if key not in ("-mtriple", "-mcpu", "-mattr") or not eq:
            raise TargetError(f"target {text!r}: unknown option {word!r} "
                              "(allowed: -mtriple=, -mcpu=, -mattr=)")
        opts[key] = value
    host = host_triple()
    triple = _normalize(opts.get("-mtriple", host))
    foreign = (triple_arch(triple), _system(triple)) != (triple_arch(host), _system(host))
    cpu = opts.get("-mcpu", "generic" if foreign else "native")
    if cpu == "native" and foreign:
        raise TargetError(f"target {text!r}: -mcpu=native names this machine's cpu "
                          f"({llvm.get_host_cpu_name()}, {triple_arch(host)}), not one for "
                          f"{triple}; name a cpu of {triple_arch(triple)} or leave -mcpu "
                          "out for the generic one")
    if cpu == "native":
        cpu = llvm.get_host_cpu_name()
        features = dict(_split_features(llvm.get_host_cpu_features().flatten()))
    elif "-mcpu" not in opts and ("linux" in triple or bare_metal_triple(triple)):
        features = dict(_split_features(_DEFAULT_FEATURES.get(triple_arch(triple), "")))
    else:
        features = {}
    for name, sign in _split_features(opts.get("-mattr", "")):
        features[name] = sign
    feature_text = ",".join(f"{sign}{name}" for name, sign in sorted(features.items()))
    try:
        llvm.Target.from_triple(triple)
    except RuntimeError as err:
        raise TargetError(f"target {text!r}: unknown triple {triple!r}: {err}") from None
    for line in _llvm_complaints(triple, cpu, feature_text).splitlines():
        if "is not a recognized" in line:  # LLVM would silently ignore the name
            raise TargetError(f"target {text!r}: {line.split(' (ignoring')[0].strip()}")
    return Target("llvm", triple, cpu, feature_text)


# The gcc option that brings picolibc (headers, startup code, link script).
PICOLIBC_SPECS = "--specs=picolibc.specs"


def cc_machine_flags(triple: str, cpu: str, features: str = "") -> list[str]:
    """What the target's gcc needs to compile C for the kernels' machine and ABI:
    for a 32-bit Arm cpu (thumbv7em-unknown-none-eabihf, cortex-m4) the cpu, Thumb
    and the float ABI of the triple; for riscv32 the ISA of `features` (LLVM's
    feature string; empty: the default RV32GC), LLVM's ABI for it (ilp32d with +d,
    else ilp32) and picolibc's headers (riscv64-unknown-elf-gcc has no C library of
    its own). Both also pick picolibc's multilib. Nothing for the other targets
    (their compiler's defaults are the kernels')."""
    if triple_arch(triple) == "riscv32":
        on = {name for name, sign in _split_features(features
                                                      or _DEFAULT_FEATURES["riscv32"])
              if sign == "+"}
        return ["-march=rv32i" + "".join(x for x in "mafdc" if x in on),
                "-mabi=" + ("ilp32d" if "d" in on else "ilp32"), PICOLIBC_SPECS]
    if not triple.startswith(("thumb", "arm")) or triple.startswith("arm64"):
        return []
    abi = "hard" if triple.endswith("eabihf") else "soft"
    return [f"-mcpu={cpu}", "-mthumb", f"-mfloat-abi={abi}"]


def _c_target(text: str, words: list[str], cc: str | None) -> Target:
    """The Target of a `c` target string (parse_target)."""
    _init_llvm()
    opts = {}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if key not in ("-mtriple", "-mcpu") or not eq:
            raise TargetError(f"target {text!r}: unknown option {word!r} for the c target "
                              "(allowed: -mtriple=, -mcpu=)")
        opts[key] = value
    triple = _normalize(opts.get("-mtriple", host_triple()))
    try:
        llvm.Target.from_triple(triple)
    except RuntimeError as err:
        raise TargetError(f"target {text!r}: unknown triple {triple!r}: {err}") from None
    cpu = opts.get("-mcpu", "generic")
    if cpu == "native":  # the kernels see no cpu features: there is nothing to resolve
        raise TargetError(f"target {text!r}: the c target's -mcpu is its compiler's "
                          "(-mcpu=cortex-m4); native names none: name a cpu or leave it out")
    host = (triple_arch(triple), _system(triple)) == (triple_arch(host_triple()),
                                                      _system(host_triple()))
    if cc is None and not host:  # what only names the target needs no compiler
        return Target("c", triple, cpu, "")
    cc = cc or os.environ.get("CC") or "cc"
    return Target("c", triple, cpu, "", cc, _compiler_digest(cc))


@cache
def _compiler_digest(cc: str) -> str:
    """sha256 (16 hex digits) of `cc --version`'s output: which compiler builds a c
    target's kernels. TargetError if it cannot be run."""
    try:
        proc = subprocess.run([*shlex.split(cc), "--version"], capture_output=True,
                              text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise TargetError(f"c target: cannot run its compiler {cc!r}: {err}") from None
    if proc.returncode != 0:
        raise TargetError(f"c target: {cc} --version failed (exit {proc.returncode})")
    return hashlib.sha256(proc.stdout.encode()).hexdigest()[:16]


def _normalize(triple: str) -> str:
    """A bare-metal triple in LLVM's four-word form: "thumbv7em-none-eabihf" ->
    "thumbv7em-unknown-none-eabihf". LLVM reads the three-word form's "none" as the
    vendor and loses the OS, and with it the hard-float ABI of "eabihf" (its libcalls,
    floorf and fmaxf, then take their arguments in integer registers). GCC's
    "riscv32-unknown-elf" (no OS) is "riscv32-unknown-none-elf"."""
    words = triple.split("-")
    if len(words) == 3 and words[1] == "none":
        words.insert(1, "unknown")
    elif len(words) == 3 and words[2] == "elf":
        words.insert(2, "none")
    return "-".join(words)


def _llvm_complaints(triple: str, cpu: str, features: str) -> str:
    """What LLVM prints while creating a target machine: it reports unknown cpu
    and feature names only on the process's stderr, so we capture fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as err:
        os.dup2(err.fileno(), 2)
        try:
            llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return err.read().decode(errors="replace")


def _split_features(text: str):
    for item in filter(None, (t.strip() for t in text.split(","))):
        if item[0] not in "+-":
            raise TargetError(f"-mattr entry {item!r} must start with '+' or '-'")
        yield item[1:], item[0]
