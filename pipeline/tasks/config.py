"""The YAML build matrix: which models to compile for which targets, how.

    models:
      resnet18: {generator: resnet18}                   # built by models/
      resnet18_b8: {generator: resnet18, args: {batch: 8}}   # with arguments
      mynet:
        path: nets/mynet.onnx                           # relative to this file
      squeezenet:
        path: "onnx-light:squeezenet"                   # the onnx wheel's light zoo
        random_weights: 0                               # seeded weights (models/reweight.py)
        inputs: {input.1: [1, 3, 224, 224]}             # optional shape overrides
        validate: {rtol: 1.0e-3}                        # optional overrides
        executor: vm                                    # run by the VM (docs/vm.md)
      bert:                                             # dynamic axes, run by the VM:
        path: nets/bert.onnx
        executor: vm
        dims: {batch: [1, 8], seq: [1, 512]}            # bounds of symbolic dimensions
        inputs: {input_ids: [batch, 128]}               # a name keeps a dim symbolic
    targets:
      llvm: {target: "llvm -mcpu=native", opt_level: 3,
             disabled_pass: [], required_pass: [], config: {FuseOps.max_depth: 256}}
      arm64:
        target: "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76"
        cc: aarch64-linux-gnu-gcc          # compiler + linker driver; required off-host
        run: "qemu-aarch64 -L /usr/aarch64-linux-gnu"   # runs target programs
        pack: elf                          # devc.o by our ELF writer, or c (compiled)
        executor: graph                    # the default; vm: its models run by the VM
      m4:
        target: "llvm -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4"
        cc: arm-none-eabi-gcc
        run: "qemu-system-arm -M mps2-an386 -nographic -semihosting-config
              enable=on,target=native -kernel"   # the firmware follows
        executor: aot                      # graph (default off bare metal) or aot
        ram_kib: 256                       # board budgets: the build fails past them
        flash_kib: 1024
    validate: {reference: onnx, rtol: 1.0e-4, atol: 1.0e-4, seed: 0}   # quant_steps: 1
    cache: {url: "http://cache:8080/pipeline", upload: true, timeout: 10}   # remote tier

Every mistake stops the load with one ConfigError naming the file, the key
path and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.errors import ConfigError
from pipeline.ir.target import TargetError, parse_target
from pipeline.link.cc import ToolchainError, cc_package, toolchain_identity
from pipeline.link.export import PACKS, choose_pack, resolve_cc
from pipeline.transform import PassContext

REFERENCES = ("onnx", "onnxruntime")
# How a model runs: the graph executor (the .so), the VM (the .so with a .ro,
# docs/vm.md) or the AOT entry function (lib<m>.a, docs/microcontrollers.md).
# A model entry's `executor` wins over its target's.
EXECUTORS = ("graph", "aot", "vm")
# `path: onnx-light:<name>` names a model of the light zoo in the installed onnx
# wheel, whose site-packages path differs from machine to machine.
ONNX_LIGHT = "onnx-light:"


@dataclass(frozen=True)
class ValidateOptions:
    reference: str = "onnx"
    rtol: float = 1e-4
    atol: float = 1e-4
    seed: int = 0
    # Quantized models: an output computed by a DequantizeLinear may differ by this
    # many steps of its scale (atol + quant_steps * scale for that output).
    quant_steps: float | None = None

    def to_dict(self) -> dict:
        extra = {} if self.quant_steps is None else {"quant_steps": self.quant_steps}
        return {"reference": self.reference, "rtol": self.rtol, "atol": self.atol,
                "seed": self.seed, **extra}


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path | None             # an ONNX file the user keeps
    generator: str | None         # or a generator in models/
    args: dict = field(default_factory=dict)     # the generator's keyword arguments
    inputs: dict = field(default_factory=dict)   # input name -> shape override
    validate: ValidateOptions = ValidateOptions()
    random_weights: int | None = None  # a path model's weights made random, this seed
    executor: str | None = None   # EXECUTORS; None: the target's
    dims: dict = field(default_factory=dict)     # symbolic dimension -> (low, high)

    @property
    def written(self) -> bool:
        """Whether the build writes this model's ONNX file (the model task): a
        generator's, or a path model's with random weights."""
        return self.generator is not None or self.random_weights is not None


@dataclass(frozen=True)
class TargetEntry:
    name: str
    target: str
    opt_level: int = 3
    required_pass: tuple[str, ...] = ()
    disabled_pass: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)
    cc: str | None = None      # the target's compiler; None: the host's ($CC or cc)
    run: str | None = None     # command prefix that runs the target's programs
    pack: str | None = None    # how devc.o is written (export.choose_pack); None: by target
    path: Path | None = None   # the config file, for errors
    executor: str | None = None   # EXECUTORS; None: graph, aot on bare metal
    ram_kib: float | None = None   # the board's RAM and flash: a model past them fails
    flash_kib: float | None = None

    @property
    def bare_metal(self) -> bool:
        """A target without an operating system (Target.bare_metal)."""
        return parse_target(self.target).bare_metal

    def pass_context(self) -> PassContext:
        return PassContext(self.opt_level, self.required_pass, self.disabled_pass,
                           self.config)

    def to_dict(self) -> dict:
        """Everything that decides this entry's build; what doit hashes."""
        resolved = parse_target(self.target, self.cc)
        # A c target's kernels are compiled by cc: optimize writes it into their specs.
        cc = {"cc": self.cc} if resolved.kind == "c" else {}
        return {"target": self.target, "resolved": resolved.key(), **cc,
                **self.pass_context().pass_config.to_dict()}

    def toolchain(self) -> dict:
        """The compiler's identity (link.cc.toolchain_identity): an input of every
        task that runs it. ConfigError naming the key and the Debian package when
        the compiler cannot be found."""
        try:
            return toolchain_identity(self.cc)
        except ToolchainError as err:
            arch = parse_target(self.target).arch
            hint = "" if self.cc is None else f"; install the Debian package {cc_package(arch)}"
            raise ConfigError(f"{self.path}: targets.{self.name}.cc: {err}{hint}") from None

    def packing(self) -> dict:
        """What decides devc.o besides its inputs: the pack, and the compiler when
        the pack is "c"."""
        pack = choose_pack(parse_target(self.target), self.pack)
        return {"pack": pack, **(self.toolchain() if pack == "c" else {})}


@dataclass(frozen=True)
class BuildConfig:
    path: Path
    models: dict[str, ModelEntry]
    targets: dict[str, TargetEntry]
    validate: ValidateOptions
    cache: dict = field(default_factory=dict)   # the remote tier: url, upload, timeout

    def select(self, models: str | None, targets: str | None):
        """(model entries, target entries) named by comma lists; None means all."""
        return (_pick(self.models, models, "model", self.path),
                _pick(self.targets, targets, "target", self.path))


def executor_of(m: ModelEntry, t: TargetEntry) -> str:
    """The executor entry m x t is built for: the model's, else the target's, else
    aot on a bare-metal target and graph elsewhere."""
    executor = m.executor or t.executor or ("aot" if t.bare_metal else "graph")
    if m.dims and executor != "vm":
        raise ConfigError(f"{t.path}: models.{m.name}.dims: symbolic dimensions run only in "
                          f"the VM, and target {t.name} builds it with executor {executor}; "
                          f"give models.{m.name}.executor: vm")
    if executor != "aot" and t.bare_metal:
        raise ConfigError(f"{t.path}: models.{m.name}.executor: target {t.name} has no "
                          "operating system to load a shared library: only executor aot "
                          "runs there")
    return executor


def _pick(entries: dict, names: str | None, what: str, path: Path) -> list:
    if not names:
        return list(entries.values())
    chosen = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in entries:
            raise ConfigError(f"{path}: {what}={name!r} is not in the config; "
                              f"{what}s are {', '.join(entries)}")
        chosen.append(entries[name])
    return chosen


def load_config(path: str | Path) -> BuildConfig:
    """Read and check a build-matrix YAML file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        loader = yaml.SafeLoader(path.read_text())
        try:  # yaml.safe_load's steps, the node graph checked before it is built
            node = loader.get_single_node()
            _check_expanded_size(node, path)
            doc = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid YAML: not UTF-8 text") from None
    where = _Where(path)
    doc = where.mapping(doc, "", {"models", "targets", "validate", "cache"},
                        required={"models", "targets"})
    validate = _validate_options(where, doc.get("validate") or {}, "validate",
                                 ValidateOptions())
    models = {name: _model(where, name, spec, validate)
              for name, spec in where.mapping(doc["models"], "models").items()}
    targets = {name: _target(where, name, spec)
               for name, spec in where.mapping(doc["targets"], "targets").items()}
    if not models or not targets:
        raise ConfigError(f"{path}: 'models' and 'targets' must each list at least one entry")
    return BuildConfig(path, models, targets, validate, _cache(where, doc.get("cache") or {}))


def _cache(where: _Where, doc) -> dict:
    """The `cache:` section: {url: str, upload: bool, timeout: seconds,
    downloads: minimal | all}."""
    doc = where.mapping(doc, "cache", {"url", "upload", "timeout", "downloads"})
    if doc.get("downloads", "minimal") not in ("minimal", "all"):
        where.fail("cache.downloads", f"must be minimal or all, got {doc['downloads']!r}")
    if "url" in doc and not str(where.typed(doc["url"], "cache.url", str, "a string")
                                ).startswith(("http://", "https://")):
        where.fail("cache.url", f"must be an http:// or https:// URL, got {doc['url']!r}")
    if "upload" in doc:
        where.typed(doc["upload"], "cache.upload", bool, "true or false")
    if "timeout" in doc and (where.typed(doc["timeout"], "cache.timeout", (int, float),
                                         "a number of seconds") <= 0):
        where.fail("cache.timeout", "must be positive")
    return dict(doc)


# Aliases are fine (a target reusing another's settings), but every alias is a
# copy once the config is walked: "billion laughs" (nine aliases of nine aliases
# ...) is a few hundred bytes that expands to 10**9 values. Configs have tens.
MAX_CONFIG_VALUES = 100_000


def _check_expanded_size(root: yaml.Node | None, path: Path) -> None:
    """ConfigError if the YAML node graph, aliases expanded, has more than
    MAX_CONFIG_VALUES nodes or refers to itself. Counts each node once, with memo."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in active:
            raise ConfigError(f"{path}: a YAML alias refers to the value that contains it")
        active.add(id(node))
        children = (node.value if isinstance(node, yaml.SequenceNode) else
                    [n for pair in node.value for n in pair]
                    if isinstance(node, yaml.MappingNode) else [])
        total = 1 + sum(size(child) for child in children)
        active.discard(id(node))
        if total > MAX_CONFIG_VALUES:
            raise ConfigError(f"{path}: the YAML expands to more than {MAX_CONFIG_VALUES} "
                              "values through its aliases (an alias bomb?)")
        sizes[id(node)] = total
        return total

    if root is not None:
        size(root)


class _Where:
    """Checks values and words errors as `<file>: <key.path>: <problem>`."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, problem: str):
        raise ConfigError(f"{self.path}: {key}: {problem}" if key else f"{self.path}: {problem}")

    def mapping(self, value, key: str, allowed=None, required=()) -> dict:
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping, got {type(value).__name__}")
        for k in value:
            if allowed is not None and k not in allowed:
                self.fail(f"{key}.{k}" if key else str(k),
                          f"unknown key; allowed: {', '.join(sorted(allowed))}")
        for k in required:
            if k not in value:
                self.fail(key, f"missing required key {k!r}")
        return value

    def typed(self, value, key: str, kind, name: str):
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            self.fail(key, f"must be {name}, got {value!r}")
        return value


def _validate_options(where: _Where, doc, key: str, base: ValidateOptions) -> ValidateOptions:
    doc = where.mapping(doc, key, {"reference", "rtol", "atol", "seed", "quant_steps"})
    ref = doc.get("reference", base.reference)
    if ref not in REFERENCES:
        where.fail(f"{key}.reference", f"{ref!r} is not a reference; allowed: "
                   f"{', '.join(REFERENCES)}")
    num = (int, float)
    return ValidateOptions(
        reference=ref,
        rtol=float(where.typed(doc.get("rtol", base.rtol), f"{key}.rtol", num, "a number")),
        atol=float(where.typed(doc.get("atol", base.atol), f"{key}.atol", num, "a number")),
        seed=where.typed(doc.get("seed", base.seed), f"{key}.seed", int, "an integer"),
        quant_steps=None if doc.get("quant_steps", base.quant_steps) is None else float(
            where.typed(doc.get("quant_steps", base.quant_steps), f"{key}.quant_steps", num,
                        "a number")))


def _model(where: _Where, name: str, spec, validate: ValidateOptions) -> ModelEntry:
    from models import GENERATORS  # only needed when the config is read

    key = f"models.{name}"
    spec = where.mapping(spec, key, {"path", "generator", "args", "inputs", "validate",
                                     "random_weights", "executor", "dims"})
    if ("path" in spec) == ("generator" in spec):
        where.fail(key, "give exactly one of 'path' (an ONNX file) or 'generator' "
                   f"(one of {', '.join(GENERATORS)})")
    path = generator = None
    if "args" in spec and "generator" not in spec:
        where.fail(f"{key}.args", "only a model built by a generator takes args")
    if "random_weights" in spec and "path" not in spec:
        where.fail(f"{key}.random_weights", "only a model read from a path takes "
                   "random_weights (a generator's weights are random already)")
    seed = spec.get("random_weights")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        where.fail(f"{key}.random_weights", f"must be a seed (an integer >= 0), got {seed!r}")
    if "path" in spec:
        text = where.typed(spec["path"], f"{key}.path", str, "a file path")
        if text.startswith(ONNX_LIGHT):
            path = _onnx_light(where, text.removeprefix(ONNX_LIGHT), f"{key}.path")
        else:
            path = (where.path.parent / text).resolve()
        if not path.is_file():
            where.fail(f"{key}.path", f"model file {path} does not exist "
                       "(paths are relative to the config file)")
    else:
        generator = spec["generator"]
        if generator not in GENERATORS:
            where.fail(f"{key}.generator", f"unknown generator {generator!r}; allowed: "
                       f"{', '.join(GENERATORS)}")
    args = _generator_args(where, spec.get("args") or {}, f"{key}.args", generator)
    dims = _dims(where, spec, key)
    inputs = {}
    for inp, shape in where.mapping(spec.get("inputs") or {}, f"{key}.inputs").items():
        if not isinstance(shape, list) or not all(
                (isinstance(d, int) and not isinstance(d, bool) and d > 0) or d in dims
                for d in shape):
            where.fail(f"{key}.inputs.{inp}", f"must be a list of positive integers (or "
                       f"names of its dims:), got {shape!r}")
        inputs[inp] = tuple(shape)
    return ModelEntry(name, path, generator, args, inputs,
                      _validate_options(where, spec.get("validate") or {},
                                        f"{key}.validate", validate), seed,
                      _executor(where, spec, key), dims)


def _dims(where: _Where, spec: dict, key: str) -> dict:
    """The model's `dims:` (pipeline/ir/dims.py): name -> (low, high)."""
    from pipeline.ir.dims import parse_bounds

    doc = where.mapping(spec.get("dims") or {}, f"{key}.dims")
    try:
        return parse_bounds(doc, f"{key}.dims")
    except ValueError as err:
        where.fail(f"{key}.dims", str(err).removeprefix(f"{key}.dims: "))


def _budgets(where: _Where, spec: dict, key: str) -> dict:
    """The target's `ram_kib:` and `flash_kib:` (positive numbers) that are given."""
    budgets = {}
    for k in ("ram_kib", "flash_kib"):
        if k in spec:
            value = where.typed(spec[k], f"{key}.{k}", (int, float), "a number of KiB")
            if value <= 0:
                where.fail(f"{key}.{k}", "must be positive")
            budgets[k] = float(value)
    return budgets


def _executor(where: _Where, spec: dict, key: str) -> str | None:
    """The entry's `executor:` (one of EXECUTORS), None when not given."""
    value = spec.get("executor")
    if value is not None and value not in EXECUTORS:
        where.fail(f"{key}.executor", f"{value!r} is not an executor; allowed: "
                   f"{', '.join(EXECUTORS)}")
    return value


def _generator_args(where: _Where, doc, key: str, generator: str | None) -> dict:
    """A generator's `args:` (models.ARGUMENTS, and its OWN_ARGUMENTS): each known,
    each a positive integer."""
    from models import ARGUMENTS, OWN_ARGUMENTS

    known = {**ARGUMENTS, **OWN_ARGUMENTS.get(generator, {})}
    for arg, value in where.mapping(doc, key).items():
        if arg not in known:
            where.fail(f"{key}.{arg}", f"unknown argument; {generator} takes: "
                       f"{', '.join(f'{k} ({v})' for k, v in known.items())}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            where.fail(f"{key}.{arg}", f"must be {known[arg]}, got {value!r}")
    return dict(doc)


def _onnx_light(where: _Where, name: str, key: str) -> Path:
    """The light model zoo file `name` ("squeezenet") the installed onnx wheel ships
    under onnx/backend/test/data/light/ (its weights are constants: ConstantOfShape)."""
    import onnx  # only for a config that names a light model

    folder = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    path = folder / f"light_{name}.onnx"
    if not path.is_file():
        shipped = sorted(p.stem.removeprefix("light_") for p in folder.glob("light_*.onnx"))
        where.fail(key, f"{ONNX_LIGHT}{name}: the installed onnx {onnx.__version__} ships no "
                   f"{path.name} in {folder}; it ships: {', '.join(shipped) or 'none'}")
    return path


def _target(where: _Where, name: str, spec) -> TargetEntry:
    key = f"targets.{name}"
    spec = where.mapping(spec, key, {"target", "opt_level", "required_pass", "disabled_pass",
                                     "config", "cc", "run", "pack", "executor", "ram_kib",
                                     "flash_kib"}, required={"target"})
    text = where.typed(spec["target"], f"{key}.target", str, "a target string")
    tools = {k: where.typed(spec[k], f"{key}.{k}", str, "a command")
             for k in ("cc", "run") if k in spec}
    try:
        resolved = parse_target(text, tools.get("cc"))
    except TargetError as err:
        where.fail(f"{key}.target", str(err))
    try:
        resolve_cc(resolved, tools.get("cc"), f"{key}.cc")
    except ToolchainError as err:
        where.fail("", str(err))
    pack = spec.get("pack")
    if pack is not None and pack not in PACKS:
        where.fail(f"{key}.pack", f"{pack!r} is not a pack; allowed: {', '.join(PACKS)}")
    entry = TargetEntry(
        name, text,
        opt_level=where.typed(spec.get("opt_level", 3), f"{key}.opt_level", int, "0..3"),
        required_pass=tuple(where.typed(spec.get("required_pass", []),
                                        f"{key}.required_pass", list, "a list of passes")),
        disabled_pass=tuple(where.typed(spec.get("disabled_pass", []),
                                        f"{key}.disabled_pass", list, "a list of passes")),
        config=dict(where.mapping(spec.get("config") or {}, f"{key}.config")),
        cc=tools.get("cc"), run=tools.get("run"), pack=pack, path=where.path,
        executor=_executor(where, spec, key), **_budgets(where, spec, key))
    if resolved.bare_metal and entry.executor not in (None, "aot"):
        where.fail(f"{key}.executor", f"{resolved.triple} has no operating system to load "
                   "a shared library: only executor aot runs there")
    # Check each list and option on its own, so the error names its exact key.
    checks = [(f"{key}.{f}", {f: getattr(entry, f)}) for f in ("required_pass", "disabled_pass")]
    checks += [(f"{key}.config.{opt}", {"config": {opt: v}}) for opt, v in entry.config.items()]
    for where_key, kwargs in checks:
        try:
            PassContext(**kwargs)
        except ConfigError as err:
            where.fail(where_key, str(err))
    return entry
