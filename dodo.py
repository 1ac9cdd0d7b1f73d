"""doit entry point: `doit build target=llvm`, `doit validate model=resnet18`.

Variables: config=PATH (default configs/default.yaml), model=NAME[,NAME],
target=NAME[,NAME], cache=DIR (the kernel and action cache; default
$PIPELINE_KERNEL_CACHE or out/kernels), cache_url=URL (a remote tier; or
`cache: {url: ...}` in the config), cache_upload=0 (read the remote tier only),
cache_timeout=SECONDS, downloads=all (bring every output of a remote hit to
disk, not only what the build needs), actions=0 (no action cache), dask=tcp://HOST:PORT (kernel
compiles on a Dask cluster), shard=I/N (the I-th of N slices of the matrix). The
tasks themselves are described in pipeline/tasks/__init__.py.
"""

import fcntl
import os
import sys

from doit import get_var

from pipeline.errors import ConfigError
from pipeline.tasks.checker import BuildChecker
from pipeline.tasks.paths import OUT, cache_dir, path
from pipeline.tasks.reporter import BuildReporter

os.makedirs(OUT, exist_ok=True)

# One doit process per out/ at a time: doit keeps its database in memory and
# writes it when the run ends, so two runs at once would each overwrite the
# other's record. The lock is held until this process exits; `doit -n` workers
# are forked from it and share it. A kernel cache shared by several out/
# folders needs no lock (see pipeline/tasks/cache.py).
_lock = open(path(OUT, ".lock"), "a")
try:
    fcntl.flock(_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(f"error: a build is already running in {os.path.abspath(OUT)} "
             f"({OUT}/.lock is held); wait for it to finish")

DOIT_CONFIG = {
    # Fixed from day one: changing backend, dep file or checker rebuilds everything.
    "backend": "sqlite3",
    "dep_file": path(OUT, ".doit.db"),
    "check_file_uptodate": BuildChecker,  # doit's md5, hashing each file once
    "default_tasks": ["build"],
    "action_string_formatting": "new",
    "reporter": BuildReporter,
}

try:
    from pipeline.files import remove_stale_temporaries
    from pipeline.tasks import make_tasks
    from pipeline.tasks.config import load_config
    from pipeline.tasks.tiered import settings_from

    _config = load_config(get_var("config", "configs/default.yaml"))
    # A build killed mid-write leaves its temporary files; no one else writes here now.
    remove_stale_temporaries(OUT, skip=cache_dir(get_var("cache")))
    globals().update(make_tasks(_config, *_config.select(get_var("model"), get_var("target")),
                                settings_from(_config.cache, get_var), get_var("shard")))
except ConfigError as err:
    sys.exit(f"error: {err}")
