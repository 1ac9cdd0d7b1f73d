"""Looking a stage up in, and saving it to, the cache tiers: the local folder
(pipeline.tasks.action_cache) first, then the remote server (pipeline.tasks.remote).

`CacheSettings` is what the doit command line and the config decide (cache=,
cache_url=, cache_upload=, cache_timeout=, actions=); `Action` is one task's
description of what decides its outputs. Both are plain picklable values: they
travel with the task's action into `doit -n` workers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from pipeline.tasks import action_cache as ac
from pipeline.tasks.remote import HttpCache


@dataclass(frozen=True)
class CacheSettings:
    root: str                      # the local tier (the kernel cache folder)
    url: str | None = None         # the remote tier's base URL
    upload: bool = True            # False: read the remote tier only
    timeout: float = 10.0          # seconds per remote request
    actions: bool = True           # False: no action cache at all (kernel cache only)
    dask: str | None = None        # scheduler address for kernel compiles


@dataclass(frozen=True)
class Action:
    """What decides one stage run's outputs, and where they go.

    args: the stage's arguments as they enter the key (the cache folder left out);
    inputs: its input files (file_dep, compiler sources included); extra: what
    decides it outside files (the toolchain identity); outputs: name -> path;
    specs_of: a kernels.json whose listed kernel specs are outputs too (optimize).
    """
    stage: str
    args: list
    inputs: list[str]
    outputs: dict[str, str]
    extra: dict = field(default_factory=dict)
    specs_of: str | None = None
    specs_dir: str | None = None

    def key(self) -> str:
        return ac.action_key(self.stage, self.args, self.inputs, self.extra)

    def all_outputs(self) -> dict[str, str]:
        """outputs, plus the kernel specs listed by specs_of (named by their paths)."""
        out = dict(self.outputs)
        if self.specs_of:
            for k in json.loads(open(self.specs_of).read())["kernels"]:
                p = os.path.join(self.specs_dir, k["hash"] + ".json")
                out[p] = p
        return out


def settings_from(section: dict, get_var) -> CacheSettings:
    """The settings from the config's `cache:` section and the doit variables
    (`get_var(name, default)`), which win: cache=, cache_url=, cache_upload=,
    cache_timeout=, actions=, dask=. ConfigError on a malformed value."""
    from pipeline.errors import ConfigError
    from pipeline.tasks.cache import cache_dir

    def flag(name: str, default: bool) -> bool:
        value = get_var(name, None)
        if value is None:
            return default
        if value not in ("0", "1"):
            raise ConfigError(f"{name}={value}: expected 0 or 1")
        return value == "1"

    timeout = get_var("cache_timeout", None)
    try:
        timeout = float(timeout) if timeout is not None else float(section.get("timeout", 10))
    except ValueError:
        raise ConfigError(f"cache_timeout={timeout}: expected seconds") from None
    url = get_var("cache_url", None) or section.get("url")
    if url and not url.startswith(("http://", "https://")):
        raise ConfigError(f"cache_url={url}: expected an http:// or https:// URL")
    return CacheSettings(cache_dir(get_var("cache", None)), url or None,
                         flag("cache_upload", section.get("upload", True)), timeout,
                         flag("actions", True), get_var("dask", None) or None)


_REMOTES: dict[tuple, HttpCache] = {}


def remote_of(settings: CacheSettings) -> HttpCache | None:
    """This process's client for the settings' server (it remembers a fault)."""
    if not settings.url:
        return None
    ident = (settings.url, settings.timeout, settings.upload)
    if ident not in _REMOTES:
        _REMOTES[ident] = HttpCache(settings.url, settings.timeout, settings.upload)
    return _REMOTES[ident]


def take_warnings(settings: CacheSettings) -> list[str]:
    remote = remote_of(settings)
    if remote is None:
        return []
    out, remote.warnings[:] = list(remote.warnings), []
    return out


def lookup(settings: CacheSettings, key: str, outputs: dict[str, str]) -> str | None:
    """Restore the outputs of `key` if a tier has them: "local", "remote" or None."""
    local = ac.LocalStore(settings.root)
    manifest = local.get_manifest(key)
    if manifest is not None and ac.restore(local, manifest, outputs):
        return "local"
    remote = remote_of(settings)
    if remote is None:
        return None
    data = remote.get("ac", key)
    if data is None:
        return None
    try:
        manifest = json.loads(data)
        digests = [o["sha256"] for o in manifest["outputs"].values()]
    except (ValueError, KeyError, TypeError, AttributeError):
        remote.warnings.append(f"warning: remote cache {remote.base}: ac/{key} is not a "
                               "manifest; ignored")
        return None
    for digest in digests:
        if local.verified_blob(digest) is None:
            blob = remote.get_blob(digest)
            if blob is None:
                return None
            local.put_blob_bytes(digest, blob)
    local.put_manifest(key, manifest)
    return "remote" if ac.restore(local, manifest, outputs) else None


def save(settings: CacheSettings, key: str, outputs: dict[str, str]) -> None:
    """Store a stage's fresh outputs locally, then upload them (blobs first, the
    manifest last, so the server never names a blob it lacks)."""
    manifest = ac.store(ac.LocalStore(settings.root), key, outputs)
    remote = remote_of(settings)
    if remote is None or not remote.upload:
        return
    for name, o in manifest["outputs"].items():
        if remote.down or not remote.upload:
            return
        if not remote.has("cas", o["sha256"]):
            with open(outputs[name], "rb") as f:
                remote.put("cas", o["sha256"], f.read())
    remote.put("ac", key, json.dumps(manifest, sort_keys=True).encode())
