"""Looking a stage up in, and saving it to, the cache tiers: the local folder
(pipeline.tasks.action_cache) first, then the remote server (pipeline.tasks.remote).

`CacheSettings` is what the doit command line and the config decide (cache=,
cache_url=, cache_upload=, cache_timeout=, actions=); `Action` is one task's
description of what decides its outputs; `CachedRun` pairs them for one task.
All are plain picklable values: they travel with the task's action into
`doit -n` workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
from dataclasses import dataclass, field

from pipeline.tasks import action_cache as ac
from pipeline.tasks import lazy
from pipeline.tasks.paths import cache_dir, ir_path, listed_kernels, spec_path
from pipeline.tasks.remote import HttpCache


@dataclass(frozen=True)
class CacheSettings:
    root: str                      # the local tier (the kernel cache folder)
    url: str | None = None         # the remote tier's base URL
    upload: bool = True            # False: read the remote tier only
    timeout: float = 10.0          # seconds per remote request
    actions: bool = True           # False: no action cache at all (kernel cache only)
    dask: str | None = None        # scheduler address for kernel compiles
    downloads: str = "minimal"     # "all": every output of a remote hit comes down


@dataclass(frozen=True)
class Action:
    """What decides one stage run's outputs, and where they go.

    args: the stage's arguments as they enter the key (the cache folder left out);
    inputs: its input files (file_dep, compiler sources included); extra: what
    decides it outside files (the toolchain identity); outputs: name -> path;
    specs_of: a kernels.json whose listed kernel specs and their IR (<hash>.json,
    .ll in specs_dir) are outputs too (optimize);
    fetch: the output names a hit always brings to disk (the deliverables and
    what the build reads itself), the others may stay in the cache (lazy).
    """
    stage: str
    args: list
    inputs: list[str]
    outputs: dict[str, str]
    extra: dict = field(default_factory=dict)
    specs_of: str | None = None
    specs_dir: str | None = None
    fetch: tuple = ()

    def key(self) -> str:
        return ac.action_key(self.stage, self.args, self.inputs, self.extra)

    def all_outputs(self) -> dict[str, str]:
        """outputs, plus the kernel specs and IR listed by specs_of (named by their
        paths)."""
        out = dict(self.outputs)
        if self.specs_of:
            for k in listed_kernels(self.specs_of):
                spec = spec_path(self.specs_dir, k["hash"])
                out[spec] = spec
                out[ir_path(spec)] = ir_path(spec)
        return out


@dataclass(frozen=True)
class CachedRun:
    """A task's part in the action cache, carried by doit's action to run_stage
    (its `cached` keyword) and read by name: what decides the task's outputs
    and the tiers that may hold them."""
    action: Action
    settings: CacheSettings


def settings_from(section: dict, get_var) -> CacheSettings:
    """The settings from the config's `cache:` section and the doit variables
    (`get_var(name, default)`), which win: cache=, cache_url=, cache_upload=,
    cache_timeout=, actions=, dask=, downloads=. ConfigError on a malformed value."""
    from pipeline.errors import ConfigError

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
    downloads = get_var("downloads", None) or section.get("downloads", "minimal")
    if downloads not in ("minimal", "all"):
        raise ConfigError(f"downloads={downloads}: expected minimal or all")
    url = get_var("cache_url", None) or section.get("url")
    if url and not url.startswith(("http://", "https://")):
        raise ConfigError(f"cache_url={url}: expected an http:// or https:// URL")
    return CacheSettings(cache_dir(get_var("cache", None)), url or None,
                         flag("cache_upload", section.get("upload", True)), timeout,
                         flag("actions", True), get_var("dask", None) or None, downloads)


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


def lookup(settings: CacheSettings, action: Action, key: str, call: tuple[str, list]
           ) -> str | None:
    """Restore the outputs of `action` (its key `key`) if a tier has them: "local",
    "remote" or None. With downloads "minimal" an output not in action.fetch whose
    blob only the remote tier holds stays there, marked (pipeline.tasks.lazy);
    call: the stage and its arguments, recorded to fetch or remake it later."""
    local, remote = ac.LocalStore(settings.root), remote_of(settings)
    tier, manifest = "local", local.get_manifest(key)
    if manifest is not None:  # a use: doit gc --max-age-days keeps it
        with contextlib.suppress(OSError):  # a read-only shared cache
            os.utime(local.manifest_path(key))
    else:
        manifest, tier = _remote_manifest(remote, key), "remote"
        if manifest is None:
            return None
    plan = {}  # output path -> "keep" | "mark" | a verified local blob
    for name, o in manifest["outputs"].items():
        path, digest = action.outputs.get(name, name), o["sha256"]
        if os.path.exists(path) and ac.file_digest(path) == digest:
            plan[path] = "keep"
        elif (blob := local.verified_blob(digest)) is not None:
            plan[path] = blob
        elif (settings.downloads == "minimal" and name not in action.fetch
              and remote is not None and not remote.down):
            plan[path] = "mark"
        elif remote is not None and (data := remote.get_blob(digest)) is not None:
            local.put_blob_bytes(digest, data)
            plan[path], tier = local.blob_path(digest), "remote"
        else:
            return None
    if tier == "remote":
        local.put_manifest(key, manifest)
    outputs = {action.outputs.get(n, n): o for n, o in manifest["outputs"].items()}
    if "mark" in plan.values():
        lazy.write_producer(key, {"fn": call[0], "args": call[1],
                                  "action": dataclasses.asdict(action),
                                  "settings": dataclasses.asdict(settings)})
    for path, how in plan.items():
        o = outputs[path]
        if how == "mark":
            lazy.write(path, o["sha256"], o["size"], bool(o.get("executable")), key)
            continue
        if how != "keep":
            ac.place(how, path, o)
        lazy.drop([path])
    return tier


def _remote_manifest(remote, key: str) -> dict | None:
    if remote is None or (data := remote.get("ac", key)) is None:
        return None
    try:
        manifest = json.loads(data)
        if all(isinstance(o["sha256"], str) for o in manifest["outputs"].values()):
            return manifest
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    remote.warnings.append(f"warning: remote cache {remote.base}: ac/{key} is not a "
                           "manifest; ignored")
    return None


def materialize(path: str, recompute: bool = True) -> bool:
    """Bring a marked output (pipeline.tasks.lazy) to disk: its blob from the
    local tier or the remote one it was left on, else (`recompute`) by running
    the stage that made it again, its own marked inputs first. True if `path`
    exists afterwards; an unmarked path is left as it is."""
    marker = lazy.read(path)
    if marker is None:
        return os.path.exists(path)
    doc = lazy.producer(marker["producer"])
    settings = CacheSettings(**doc["settings"]) if doc else None
    digest = marker["sha256"]
    if settings is not None:
        local = ac.LocalStore(settings.root)
        blob = local.verified_blob(digest)
        remote = remote_of(settings)
        if blob is None and remote is not None and (data := remote.get_blob(digest)):
            local.put_blob_bytes(digest, data)
            blob = local.blob_path(digest)
        if blob is not None:
            ac.place(blob, path, marker)
            lazy.drop([path])
            return True
    if not recompute or doc is None:
        return False
    action = Action(**{**doc["action"], "fetch": tuple(doc["action"]["fetch"])})
    for p in action.inputs:
        materialize(p)
    run_body(doc["fn"], doc["args"])
    if settings.actions:
        save(settings, action.key(), action.all_outputs())
    lazy.drop(action.all_outputs().values())
    return os.path.exists(path)


def run_body(fn: str, args: list):
    """Call the stage `fn` ("module:function" in pipeline) on `args`."""
    module, _, name = fn.partition(":")
    return getattr(importlib.import_module(f"pipeline.{module}"), name)(*args)


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
