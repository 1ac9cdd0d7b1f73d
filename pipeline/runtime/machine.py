"""Is a library for this machine? Asked before dlopen or the host linker sees
it: their messages for another architecture's file ("wrong ELF class",
"file in wrong format") do not say what the file is or how to run it."""

from __future__ import annotations

import os
import sys
from functools import cache

from pipeline.errors import PipelineError
from pipeline.link.elf import machine_name, read_machine

__all__ = ["ForeignLibraryError", "check_machine"]


class ForeignLibraryError(PipelineError, OSError):
    """A library (or object) built for another architecture than this machine's."""


@cache
def host_machine() -> int | None:
    """This process's ELF machine, read from its own executable (None if not ELF)."""
    for exe in ("/proc/self/exe", sys.executable):
        try:
            with open(exe, "rb") as f:
                return read_machine(f.read(20))
        except OSError:
            continue
    return None


def check_machine(path: str | os.PathLike, source: str) -> None:
    """Raise ForeignLibraryError if the ELF file `path` (part of the library
    `source`) is for another architecture than this machine; a non-ELF file
    passes (the loader's own error then speaks)."""
    with open(path, "rb") as f:
        machine = read_machine(f.read(20))
    host = host_machine()
    if machine is None or host is None or machine == host:
        return
    arch, here = machine_name(machine), machine_name(host)
    raise ForeignLibraryError(
        f"{source}: built for {arch}, this machine is {here}: run it on the {arch} machine "
        f"with pipeline-run, or here under emulation: qemu-{arch} -L /usr/{arch}-linux-gnu "
        f"pipeline-run {os.path.basename(source)} ... (Debian packages qemu-user and "
        f"libc6-dev-{_debian_arch(arch)}-cross)")


def _debian_arch(arch: str) -> str:
    return {"aarch64": "arm64", "x86_64": "amd64"}.get(arch, arch)
