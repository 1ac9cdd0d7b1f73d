"""Thin wrappers around a target's C compiler (which also drives its linker) and tar.

`cc` everywhere is the compiler command for the target ("aarch64-linux-gnu-gcc",
"ccache gcc"); None means the host's: $CC, else "cc". Every function writes its
output atomically through pipeline/files.py (temporary file + rename, an
unchanged output left untouched, mtime included).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from functools import cache

from pipeline.errors import PipelineError
from pipeline.files import temp_output
from pipeline.link.integrity import stamp_code_digest

__all__ = ["LinkError", "ToolchainError", "cc_package", "compile_c", "create_archive",
           "create_shared", "create_tar", "host_cc", "link_relocatable", "machine_flags",
           "toolchain_identity"]

PathLike = str | os.PathLike


class LinkError(PipelineError, RuntimeError):
    """An external tool (cc, ld) failed; the message holds its command line and stderr."""


class ToolchainError(LinkError):
    """A target's compiler cannot be found or run."""


def host_cc() -> str:
    """The host's compiler command: $CC, else "cc"."""
    return os.environ.get("CC") or "cc"


def _tool(cc: str | None) -> list[str]:
    # cc may carry a wrapper or flags ("ccache gcc"), so split like a shell.
    words = shlex.split(cc or host_cc())
    if not words:
        raise ToolchainError("the compiler command is empty (cc option or $CC)")
    return words


def cc_package(arch: str) -> str:
    """The Debian package with the GNU cross compiler for an architecture
    ("aarch64" -> "gcc-aarch64-linux-gnu"), named in errors about a missing cc."""
    return f"gcc-{arch}-linux-gnu"


@cache
def toolchain_identity(cc: str | None = None) -> dict:
    """What identifies the compiler `cc` (None: host_cc()): its command, resolved
    path and `--version` output. Build tasks that run it hash this dict, so a
    changed compiler (another cc, $CC, an upgraded package) rebuilds what it made.

    Cached per process and command (one `cc --version`, a few milliseconds).
    Raises ToolchainError if the command cannot be found or run.
    """
    words = _tool(cc)
    found = shutil.which(words[0])
    if found is None:
        raise ToolchainError(f"compiler {words[0]!r} not found on PATH")
    try:
        proc = subprocess.run([*words, "--version"], capture_output=True, text=True,
                              check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ToolchainError(f"cannot run {shlex.join(words)} --version: {err}") from None
    if proc.returncode != 0:
        raise ToolchainError(f"{shlex.join(words)} --version failed (exit {proc.returncode}): "
                             f"{(proc.stderr or proc.stdout).strip()[:200]}")
    return {"cc": shlex.join(words), "path": os.path.realpath(found),
            "version": proc.stdout.strip()}


def _run(what: str, cmd: list[str]) -> subprocess.CompletedProcess:
    """Run cmd; raise LinkError with the command line and stderr if it fails."""
    line = shlex.join(cmd)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as err:
        raise LinkError(f"{what} failed: {line}\ncannot run {cmd[0]!r}: {err}") from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise LinkError(f"{what} failed (exit {proc.returncode}): {line}\n{detail}")
    return proc


def _check_objects(objects: Sequence[PathLike]) -> list[str]:
    paths = [os.fspath(o) for o in objects]
    if not paths:
        raise ValueError("no object files to link")
    return paths


def create_shared(
    output: PathLike,
    objects: Sequence[PathLike],
    options: Sequence[str] | None = None,
    cc: str | None = None,
) -> None:
    """Link object files into the shared library `output` (must end with ".so").

    Runs `cc -shared -fPIC -o OUT objs... -lm -lgomp [options...]` (kernels call
    libm and libgomp's GOMP_parallel; a library that does not is linked to neither
    where the toolchain links --as-needed, the default on Debian/Ubuntu); the compiler is
    `cc` if given, else host_cc(). Raises LinkError (command line + stderr)
    if the link fails and ValueError for a bad output name or no objects.
    """
    output = os.fspath(output)
    if not output.endswith(".so"):
        raise ValueError(f"shared library name {output!r} must end with '.so'")
    paths = _check_objects(objects)
    with temp_output(output) as tmp:
        cmd = [*_tool(cc), "-shared", "-fPIC", "-o", tmp, *paths, "-lm",
               "-lgomp", *(options or ())]
        _run("link", cmd)
        stamp_code_digest(tmp)  # a library with a blob records its code (see integrity.py)


def link_relocatable(output: PathLike, objects: Sequence[PathLike],
                     cc: str | None = None, options: Sequence[str] = ()) -> None:
    """Combine object files into one relocatable object: `cc -r -nostdlib`, which
    runs the target's own `ld -r` (for the host, the same bytes as `ld -r`).

    Objects are passed in the given order (the caller sorts them), so the
    output bytes are deterministic; options are extra arguments for cc. Raises
    LinkError on failure.
    """
    paths = _check_objects(objects)
    with temp_output(output) as tmp:
        _run("relocatable link", [*_tool(cc), "-r", "-nostdlib", *_emulation(paths[0]),
                                  "-o", tmp, *paths, *options])


def _emulation(path: str) -> list[str]:
    """The linker emulation of an object its compiler's default would not pick: a
    32-bit RISC-V object (riscv32) for riscv64-unknown-elf-gcc, which serves both
    widths and links 64-bit by default. Read from the ELF header (class, e_machine)."""
    with open(path, "rb") as f:
        header = f.read(20)
    if header[:4] == b"\x7fELF" and header[4] == 1 and header[18:20] == b"\xf3\x00":
        return ["-Wl,-melf32lriscv"]
    return []


def compile_c(output: PathLike, source: PathLike, cc: str | None = None,
              options: Sequence[str] = ()) -> None:
    """Compile one C file into the position-independent object `output`
    (`cc -c -fPIC -O0 [options] -o OUT SRC`). Raises LinkError on failure."""
    with temp_output(output) as tmp:
        _run("compile", [*_tool(cc), "-c", "-fPIC", "-O0", *options, "-o", tmp,
                         os.fspath(source)])


def machine_flags(triple: str, cpu: str, features: str = "") -> list[str]:
    """What the target's gcc needs to compile C for the kernels' machine and ABI
    (pipeline.ir.target.cc_machine_flags)."""
    # Imported here: ir.target loads llvmlite, which the runtime's imports of this
    # module must not.
    from pipeline.ir.target import cc_machine_flags

    return cc_machine_flags(triple, cpu, features)


def archiver(cc: str | None) -> list[str]:
    """The archiver beside the compiler `cc`: `<prefix>ar` for `<prefix>gcc`
    ("arm-none-eabi-gcc" -> "arm-none-eabi-ar"), else the host's `ar`."""
    words = _tool(cc)
    base = os.path.basename(words[-1] if words[0] == "ccache" else words[0])
    for suffix in ("gcc", "clang", "cc"):
        if base.endswith(suffix) and base != suffix:
            candidate = base[:-len(suffix)] + "ar"
            if shutil.which(candidate):
                return [candidate]
    return ["ar"]


def create_archive(output: PathLike, objects: Sequence[PathLike], cc: str | None = None
                   ) -> None:
    """Write the static library `output` (.a) of `objects`, in the given order, with
    the archiver beside cc: `ar rcsD` (deterministic: no times, owners or modes)."""
    paths = _check_objects(objects)
    with temp_output(output) as tmp:
        os.remove(tmp)  # ar adds to an archive it finds; an empty file is none
        _run("archive", [*archiver(cc), "rcsD", tmp, *paths])


def create_tar(output: PathLike, files: Sequence[PathLike]) -> None:
    """Write a deterministic, flat tar of files (stored under their base names).

    Members are sorted by name with mtime 0, uid/gid 0, empty owner names and
    mode 0644, in plain ustar format (no pax headers carrying times), so the
    same inputs always give the same bytes. Raises ValueError on two files
    with the same base name.
    """
    by_name: dict[str, str] = {}
    for f in files:
        path = os.fspath(f)
        name = os.path.basename(path)
        if name in by_name:
            raise ValueError(f"duplicate file name {name}")
        by_name[name] = path
    with temp_output(output) as tmp, tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(by_name):
            info = tarfile.TarInfo(name)
            info.size = os.path.getsize(by_name[name])
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(by_name[name], "rb") as src:
                tar.addfile(info, src)
