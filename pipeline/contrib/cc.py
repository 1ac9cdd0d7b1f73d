"""Thin wrappers around the system C compiler, linker and tar.

Every function writes its output atomically: the tool writes a temporary file
next to the output, which is renamed into place only on success, so a failed
or interrupted build never leaves a half-written library behind that a later
run could mistake for a good one. An output whose bytes did not change is left
untouched, mtime included: that is what lets the build's file checker
(pipeline/checker.py) trust an artifact's mtime instead of hashing it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Iterator, Sequence

from pipeline.errors import PipelineError

__all__ = [
    "LinkError",
    "atomic_write",
    "create_shared",
    "create_tar",
    "link_relocatable",
    "same_bytes",
    "temp_output",
]

PathLike = str | os.PathLike


class LinkError(PipelineError, RuntimeError):
    """An external tool (cc, ld) failed; the message holds its command line and stderr."""


@contextlib.contextmanager
def temp_output(output: PathLike) -> Iterator[str]:
    """Yield a temporary path in output's folder; rename it to output on success.

    The folder is created if needed. If output already holds the same bytes,
    the temporary file is dropped and output keeps its mtime. On any exception
    the temporary file is removed and output is untouched.
    """
    output = os.fspath(output)
    folder = os.path.dirname(os.path.abspath(output))
    base = os.path.basename(output)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{base}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are meant to be shared
    try:
        yield tmp
        if same_bytes(tmp, output):
            _remove(tmp)
        else:
            _replace(tmp, output)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _replace(tmp: str, output: str) -> None:
    """os.replace(tmp, output), the old output freed by _remove: a hard link
    keeps it alive across the (still atomic) rename."""
    old = f"{tmp}.old"
    try:
        os.link(output, old)
    except OSError:  # no old output, or a file system without hard links
        os.replace(tmp, output)
        return
    try:
        os.replace(tmp, output)
    except BaseException:
        os.unlink(old)
        raise
    _remove(old)


def _remove(path: str) -> None:
    """Delete path; a large file in a background thread.

    Freeing a big file is slow on some file systems (ext4 with online discard:
    0.15 s per 100 MB, a tenth of a ResNet-50 weight-change rebuild), so it
    happens while the build goes on; Python waits for the thread before it exits.
    """
    if os.path.getsize(path) < 1 << 20:
        os.unlink(path)
    else:
        threading.Thread(target=os.unlink, args=(path,), name=f"free {path}").start()


def same_bytes(a: PathLike, b: PathLike, chunk: int = 1 << 22) -> bool:
    """Whether files a and b both exist with identical contents (stops at the
    first differing chunk; much cheaper than hashing either)."""
    try:
        if os.path.getsize(a) != os.path.getsize(b):
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while block := fa.read(chunk):
                if block != fb.read(chunk):
                    return False
    except FileNotFoundError:
        return False
    return True


def atomic_write(path: PathLike, data: bytes | Sequence) -> None:
    """Write data (bytes, or a sequence of bytes-like chunks written in order) to
    path atomically (temporary file in the same folder + rename); a file that
    already holds exactly those bytes is left untouched."""
    with temp_output(path) as tmp:
        with open(tmp, "wb") as f:
            f.writelines([data] if isinstance(data, bytes) else data)


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
