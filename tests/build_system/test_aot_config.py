"""The config keys of the AOT executor: `executor` on model and target entries (the
model's wins; bare-metal targets default to aot and refuse graph) and the board
budgets `ram_kib` / `flash_kib` on targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.tasks.config import executor_of, load_config

M4 = ('{target: "llvm -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4", '
      'cc: arm-none-eabi-gcc')


def _config(tmp: Path, models: str, targets: str):
    (tmp / "m.onnx").write_bytes(b"")
    (tmp / "c.yaml").write_text(f"models:\n{models}targets:\n{targets}")
    return load_config(tmp / "c.yaml")


def test_executor_precedence_and_bare_metal_default(tmp_path: Path):
    config = _config(
        tmp_path, "  a: {path: m.onnx}\n  b: {path: m.onnx, executor: aot}\n",
        f'  host: {{target: "llvm -mcpu=native"}}\n  m4: {M4}, ram_kib: 64, flash_kib: 512}}\n'
        '  host_aot: {target: "llvm -mcpu=native", executor: aot}\n')
    m, t = config.models, config.targets
    assert executor_of(m["a"], t["host"]) == "graph"
    assert executor_of(m["b"], t["host"]) == "aot"
    assert executor_of(m["a"], t["m4"]) == "aot"
    assert executor_of(m["a"], t["host_aot"]) == "aot"
    assert (t["m4"].ram_kib, t["m4"].flash_kib) == (64.0, 512.0)
    # A budget decides no compile: it is no part of what the build hashes.
    assert "ram_kib" not in str(t["m4"].to_dict())


@pytest.mark.parametrize(("models", "targets", "message"), [
    ("  a: {path: m.onnx, executor: tvm}\n", '  h: {target: "llvm -mcpu=native"}\n',
     r"models\.a\.executor: 'tvm' is not an executor; allowed: graph, aot, vm"),
    ("  a: {path: m.onnx}\n", f"  m4: {M4}, executor: graph}}\n",
     r"targets\.m4\.executor: .* only executor aot runs there"),
    ("  a: {path: m.onnx}\n", f"  m4: {M4}, ram_kib: -1}}\n",
     r"targets\.m4\.ram_kib: must be positive"),
    ("  a: {path: m.onnx}\n", f"  m4: {M4}, flash_kib: lots}}\n",
     r"targets\.m4\.flash_kib: must be a number of KiB"),
])
def test_config_mistakes_are_one_line(tmp_path: Path, models: str, targets: str, message: str):
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, models, targets)


def test_a_model_asking_for_graph_on_bare_metal_is_refused(tmp_path: Path):
    config = _config(tmp_path, "  a: {path: m.onnx, executor: graph}\n", f"  m4: {M4}}}\n")
    with pytest.raises(ConfigError, match=r"models\.a\.executor: target m4 .* only executor "
                                          "aot"):
        executor_of(config.models["a"], config.targets["m4"])
