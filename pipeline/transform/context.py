"""PassContext: every optimisation option in one object (TVM: tvm.transform.PassContext).

The same frozen PassConfig is what the build hashes, so an option change
reaches exactly the matrix entries that use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError

# Options a pass reads from `config`, with their default and type.
CONFIG_OPTIONS = {"FuseOps.max_depth": (256, int), "AlterOpLayout.winograd": (True, bool)}
# The names of pipeline.transform.PIPELINE, in order (checked there). Kept here
# so that reading a build config need not import the passes and numpy.
PASS_NAMES = ("SimplifyInference", "FuseQDQ", "FoldConstant", "FuseLayerNorm", "FuseGelu",
              "FuseAttention", "FoldBatchNorm", "AlterOpLayout", "FoldChannelShuffle",
              "FuseOps")


@dataclass(frozen=True)
class PassConfig:
    opt_level: int = 2
    required_pass: tuple[str, ...] = ()
    disabled_pass: tuple[str, ...] = ()
    config: tuple[tuple[str, object], ...] = ()

    def option(self, key: str):
        return dict(self.config).get(key, CONFIG_OPTIONS[key][0])

    def enabled(self, name: str, opt_level: int) -> bool:
        if name in self.disabled_pass:
            return False
        return name in self.required_pass or opt_level <= self.opt_level

    def to_dict(self) -> dict:
        return {"opt_level": self.opt_level, "required_pass": list(self.required_pass),
                "disabled_pass": list(self.disabled_pass), "config": dict(self.config)}


_STACK: list[PassContext] = []


class PassContext:
    """`with PassContext(opt_level=3, disabled_pass=["FuseOps"]): build(...)`.

    instruments: PassInstrument objects (pipeline/transform/instrument.py) called
    around each pass run inside the context; they observe the build and never
    enter the options it hashes.
    """

    def __init__(self, opt_level: int = 2, required_pass=(), disabled_pass=(),
                 config: dict | None = None, instruments=()):
        for name in (*required_pass, *disabled_pass):
            if name not in PASS_NAMES:
                raise ConfigError(f"unknown pass {name!r}; passes are {', '.join(PASS_NAMES)}")
        for key, value in (config or {}).items():
            if key not in CONFIG_OPTIONS:
                raise ConfigError(f"unknown pass option {key!r}; options are "
                                  f"{', '.join(CONFIG_OPTIONS)}")
            if not isinstance(value, CONFIG_OPTIONS[key][1]):
                raise ConfigError(f"pass option {key!r} must be "
                                  f"{CONFIG_OPTIONS[key][1].__name__}, got {value!r}")
        if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
            raise ConfigError(f"opt_level must be an integer 0..3, got {opt_level!r}")
        self.pass_config = PassConfig(opt_level, tuple(required_pass), tuple(disabled_pass),
                                      tuple(sorted((config or {}).items())))
        self.instruments = tuple(instruments)

    @staticmethod
    def current() -> PassConfig:
        return _STACK[-1].pass_config if _STACK else PassConfig()

    @staticmethod
    def current_instruments() -> tuple:
        """The instruments of the innermost PassContext (none outside one)."""
        return _STACK[-1].instruments if _STACK else ()

    def __enter__(self) -> PassContext:
        for instrument in self.instruments:
            instrument.enter_pass_ctx()
        _STACK.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _STACK.pop()
        for instrument in self.instruments:
            instrument.exit_pass_ctx()
