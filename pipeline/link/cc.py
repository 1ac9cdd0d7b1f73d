"""Thin wrappers around the system C compiler, linker and tar.

Every function writes its output atomically through pipeline/link/files.py
(temporary file + rename, an unchanged output left untouched, mtime included).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tarfile
from collections.abc import Sequence

from pipeline.errors import PipelineError
from pipeline.link.files import temp_output
from pipeline.link.integrity import stamp_code_digest

__all__ = ["LinkError", "create_shared", "create_tar", "link_relocatable"]

PathLike = str | os.PathLike


class LinkError(PipelineError, RuntimeError):
    """An external tool (cc, ld) failed; the message holds its command line and stderr."""


def _tool(env_var: str, default: str, override: str | None = None) -> list[str]:
    # CC / LD may carry a wrapper or flags ("ccache gcc"), so split like a shell.
    words = shlex.split(override or os.environ.get(env_var) or default)
    if not words:
        raise LinkError(f"{env_var} is set but empty")
    return words


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
    `cc` if given, else $CC, else "cc". Raises LinkError (command line + stderr)
    if the link fails and ValueError for a bad output name or no objects.
    """
    output = os.fspath(output)
    if not output.endswith(".so"):
        raise ValueError(f"shared library name {output!r} must end with '.so'")
    paths = _check_objects(objects)
    with temp_output(output) as tmp:
        cmd = [*_tool("CC", "cc", cc), "-shared", "-fPIC", "-o", tmp, *paths, "-lm",
               "-lgomp", *(options or ())]
        _run("link", cmd)
        stamp_code_digest(tmp)  # a library with a blob records its code (see integrity.py)


def link_relocatable(output: PathLike, objects: Sequence[PathLike]) -> None:
    """Combine object files into one relocatable object with `ld -r` ($LD honoured).

    Objects are passed to ld in the given order (the caller sorts them), so the
    output bytes are deterministic. Raises LinkError on failure.
    """
    paths = _check_objects(objects)
    with temp_output(output) as tmp:
        _run("relocatable link", [*_tool("LD", "ld"), "-r", "-o", tmp, *paths])


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
