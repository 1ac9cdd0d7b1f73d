"""The file checker doit uses (DOIT_CONFIG "check_file_uptodate"): md5, hashed once.

doit's md5 checker hashes a changed input twice, once to decide the task must
run and again to record its new state, and it does so for every task that reads
the file. For ResNet-50 a weight change moves 100 MB through the ONNX file,
the weights, the params and devc.o: eight md5 passes, over a second of a
rebuild that should be a few seconds. This checker keeps doit's rules and
drops the repeats:

- Inputs the user edits (models, configs, compiler sources, kernel specs): as
  doit does, an unchanged mtime means unchanged, a new size means changed,
  otherwise the md5 decides; each (path, mtime, size) is hashed at most once
  per run.
- Artifacts under out/: every stage writes them through
  pipeline.files.temp_output, which leaves a file whose bytes did not
  change untouched, mtime included. So a new mtime there already means new
  content, and the md5 would only confirm it.
"""

from __future__ import annotations

import os

from doit.dependency import MD5Checker, get_file_md5

from pipeline.tasks import lazy
from pipeline.tasks.paths import OUT

ARTIFACTS = OUT + os.sep  # task paths reach us relative and normalised (paths.path)


class BuildChecker(MD5Checker):
    """doit's MD5Checker without repeated hashing; states stay (mtime, size, md5),
    with md5 None for artifacts. An output a cache hit left in the cache
    (pipeline.tasks.lazy) exists, with its marker's mtime and its own size."""

    def exists(self, file_path):
        return lazy.exists(file_path)

    def info(self, file_path):
        return lazy.stat(file_path)

    def __init__(self):
        self._md5: dict[tuple[str, float, int], str] = {}

    def _digest(self, path: str, mtime: float, size: int) -> str | None:
        if path.startswith(ARTIFACTS):
            return None
        key = (path, mtime, size)
        if key not in self._md5 and not os.path.exists(path):
            self._md5[key] = "sha256:" + lazy.digest(path)  # a marked input
        if key not in self._md5:
            self._md5[key] = get_file_md5(path)
        return self._md5[key]

    def check_modified(self, file_path, file_stat, state):
        timestamp, size, md5 = state
        if file_stat.st_mtime == timestamp:
            return False
        if file_stat.st_size != size or md5 is None:
            return True
        return md5 != self._digest(file_path, file_stat.st_mtime, file_stat.st_size)

    def get_state(self, dep, current_state):
        stat = lazy.stat(dep)
        if current_state and current_state[0] == stat.st_mtime:
            return None
        return stat.st_mtime, stat.st_size, self._digest(dep, stat.st_mtime, stat.st_size)
