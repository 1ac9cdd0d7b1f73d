"""Compile: LLVM IR text -> relocatable object bytes, with llvmlite.

Parsing verifies the module; the new pass manager runs the O<n> pipeline for
the target machine (so vectorisation sees the real vector width), O2 for opt
level 3: the kernels come explicitly vectorised and unrolled, and O3's extra
passes took 16% of the compile time of the default matrix's kernels without
changing any bench model's speed beyond noise (1 thread, same process, 0.96-1.02);
the target machine emits an ELF object at its opt level. The output depends only
on (text, triple, cpu, features, opt level), which is what the kernel hash already
covers.

The LLVM inside the llvmlite wheel is built with assertions on, so a bug in
one of its passes (LLVM 22's loop vectorizer on znver4/znver5, for one) calls
abort() and would take down whoever compiles: pytest, a serial `doit build`
before it writes its database, a user's Python session. So `compile_ir` runs
LLVM in a worker process (started on first use, reused for every compile of
this process) and an abort kills only the worker. A compile that aborts is
retried once with the loop vectorizer off (the pass that has aborted so far)
and the result carries a warning saying so; if that aborts too, CompileError
names the kernel, the target, LLVM's message and what the user can change.
"""

from __future__ import annotations

import atexit
import os
import pickle
import re
import struct
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import llvmlite.binding as llvm

from pipeline.errors import PipelineError
from pipeline.ir.target import Target


class CompileError(PipelineError):
    """LLVM could not compile a kernel (it aborted, or rejected the IR)."""


class CompileWarning(UserWarning):
    """A kernel compiled only after a fallback (e.g. with the loop vectorizer off)."""


def optimize_ir(text: str, target: Target, opt_level: int = 3, loop_vectorize: bool = True):
    """Parse, verify and optimise `text` in this process; returns the llvmlite ModuleRef."""
    tm = target.target_machine(opt_level)
    module = llvm.parse_assembly(text)
    module.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=min(opt_level, 2))
    pto.loop_vectorization = loop_vectorize and opt_level >= 2
    pto.slp_vectorization = opt_level >= 2
    builder = llvm.create_pass_builder(tm, pto)
    builder.getModulePassManager().run(module, builder)
    return module


def emit_object(text: str, target: Target, opt_level: int = 3,
                loop_vectorize: bool = True) -> bytes:
    """Object-file bytes for `text`, compiled in this process (an LLVM abort ends it)."""
    module = optimize_ir(text, target, opt_level, loop_vectorize)
    return target.target_machine(opt_level).emit_object(module)


def compile_ir(text: str, target: Target, opt_level: int = 3, name: str | None = None,
               fallback: bool = True) -> bytes:
    """Object-file bytes for the module in `text`, compiled in a worker process.

    `name` (default: the module's ModuleID) is what errors and warnings call it.
    Raises CompileError if LLVM rejects the IR or aborts (with `fallback`, only
    if it aborts again with the loop vectorizer off; CompileWarning says when
    that fallback compiled it). Threads compiling at once get a worker each.
    """
    name = name or _module_id(text)
    where = f"kernel {name} for {target.cpu} ({target.triple}, opt_level {opt_level})"
    try:
        return _run((text, target, opt_level, True))
    except _Aborted as first:
        if not fallback:
            raise CompileError(f"{where}: LLVM aborted: {first}") from None
        try:
            obj = _run((text, target, opt_level, False))
        except _Aborted as second:
            raise CompileError(
                f"{where}: LLVM aborted: {second}; retried with the loop vectorizer off, "
                "it aborted again. Try another -mcpu, a lower opt_level, or "
                "disabled_pass: [FuseOps] for this target") from None
        warnings.warn(CompileWarning(
            f"{where}: LLVM aborted ({first}); compiled with the loop vectorizer off"),
            stacklevel=2)
        return obj


def _module_id(text: str) -> str:
    match = re.match(r'; ModuleID = "?([^"\n]*)', text)
    return match.group(1) if match else "module"


class _Aborted(Exception):
    """The worker died (signal or exit) while compiling; the message is LLVM's."""


class _Worker:
    """A child Python running `serve()`: one job at a time over its stdin/stdout.

    Restarted after it dies, and per process: a doit -n worker forked from a
    process that had one starts its own.
    """

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.stderr = None

    def _start(self) -> None:
        self.stderr = tempfile.TemporaryFile()  # LLVM's last words, read after an abort
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root,
                                                          env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.codegen.compile"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self.pid = os.getpid()

    def run(self, job: tuple) -> bytes:
        if self.proc is None or self.pid != os.getpid() or self.proc.poll() is not None:
            self._start()
        try:
            _send(self.proc.stdin, pickle.dumps(job))
            status, payload = _receive(self.proc.stdout)
        except (BrokenPipeError, EOFError):
            raise _Aborted(self._last_words()) from None
        if status == b"E":
            raise CompileError(payload.decode())
        return payload

    def _last_words(self) -> str:
        """LLVM's assertion or error line from the dead worker's stderr."""
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").splitlines()
        code = self.close()
        said = [ln for ln in lines if "Assertion" in ln or "LLVM ERROR" in ln] or lines[-1:]
        signal = f"signal {-code}" if code < 0 else f"exit {code}"
        return f"{signal}, {_assertion_summary(said[0]) if said else 'no message'}"

    def close(self) -> int | None:
        """End this process's worker (EOF on its stdin); returns its exit code."""
        if self.proc is None or self.pid != os.getpid():
            return None
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                stream.close()
            except BrokenPipeError:
                pass
        code, self.proc = self.proc.wait(), None
        return code


def _assertion_summary(line: str) -> str:
    """'…/LoopVectorize.cpp:7264: …computeBestVF(): Assertion `…' && " msg"' failed.'
    -> 'LoopVectorize.cpp:7264 in llvm::…::computeBestVF: msg'."""
    where = re.search(r"(\w+\.(?:cpp|h):\d+)", line)
    func = re.search(r"(llvm::[\w:]+)\(", line)
    what = re.search(r'&& "\s*([^"]+)"', line)
    if not (where and what):
        return line.strip()[:300]
    return f"{where.group(1)}{' in ' + func.group(1) if func else ''}: {what.group(1)}"


def _send(stream, data: bytes) -> None:
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read_message(stream) -> bytes:
    """One length-prefixed message (_send's); EOFError if the stream ends first."""
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    size = struct.unpack("<Q", head)[0]
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError
    return payload


def _receive(stream) -> tuple[bytes, bytes]:
    """A worker's answer: (status byte, payload)."""
    message = _read_message(stream)
    return message[:1], message[1:]


_IDLE: list[_Worker] = []   # workers not compiling right now (this process's or a parent's)
_IDLE_LOCK = threading.Lock()


def _run(job: tuple) -> bytes:
    """Run `job` on an idle worker, or a new one if every worker is busy."""
    with _IDLE_LOCK:
        worker = _IDLE.pop() if _IDLE else _Worker()
    try:
        return worker.run(job)
    finally:
        with _IDLE_LOCK:
            _IDLE.append(worker)


@atexit.register
def _close_workers() -> None:
    for worker in _IDLE:
        worker.close()


def serve() -> None:
    """The worker's loop: read (text, target, opt_level, loop_vectorize) jobs until EOF,
    answer b"O" + object bytes, or b"E" + message when LLVM rejects the IR."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            text, target, opt_level, loop_vectorize = pickle.loads(_read_message(stdin))
        except EOFError:
            return
        try:
            status, payload = b"O", emit_object(text, target, opt_level, loop_vectorize)
        except RuntimeError as err:  # parse or verify errors: the IR is at fault
            status, payload = b"E", f"LLVM rejected the IR: {err}".encode()
        _send(stdout, status + payload)


if __name__ == "__main__":
    serve()
