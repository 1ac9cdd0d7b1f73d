"""A library's flash and RAM, measured from the built file (pipeline.runtime.metadata
.library_sizes): what the export task prints and `pipeline info` and the report show."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline
from pipeline.runtime.metadata import kernel_metadata, library_sizes, memory_plan, size_line
from pipeline.transform import PassContext
from tests.support import REPO
from tests.support.aot_models import tiny_cnn


@pytest.fixture(scope="module")
def tiny_so(tmp_path_factory) -> tuple[Path, str, dict]:
    graph, params = pipeline.frontend.from_onnx(tiny_cnn())
    with PassContext(opt_level=3):
        factory = pipeline.build(graph, target="llvm -mcpu=native", params=params)
    path = factory.export_library(tmp_path_factory.mktemp("sizes") / "tiny.so")
    return Path(path), factory.get_graph_json(), factory.get_params()


def test_flash_is_what_binutils_size_counts(tiny_so):
    """flash = code + read-only data + initialised data: `size -B`'s text (code and
    read-only data) plus its data; RAM adds the writable data and bss."""
    if shutil.which("size") is None:
        pytest.skip("binutils' size is not installed")
    path, graph_json, params = tiny_so
    sizes = library_sizes(str(path), graph_json, set(params))
    text, data, bss = map(int, subprocess.run(
        ["size", "-B", str(path)], capture_output=True, text=True, check=True
    ).stdout.splitlines()[1].split()[:3])
    assert sizes["flash"]["code"] + sizes["flash"]["rodata"] == text
    assert sizes["flash"]["data"] == data and sizes["ram"]["data"] == data + bss
    assert sizes["flash_bytes"] == text + data


def test_ram_is_workspace_io_and_the_deepest_stack(tiny_so):
    path, graph_json, params = tiny_so
    sizes = library_sizes(str(path), graph_json, set(params))
    assert sizes["ram"]["workspace"] == memory_plan(graph_json)["planned_activation_bytes"]
    assert sizes["ram"]["io"] == 4 * (8 * 8 + 10)  # x [1,1,8,8] and y [1,10], float32
    stacks = {k["symbol"]: k["stack_bytes"] for k in kernel_metadata(graph_json)}
    assert sizes["ram"]["stack"] == max(stacks.values())
    assert stacks[sizes["deepest_kernel"]] == sizes["ram"]["stack"]
    assert sizes["ram_bytes"] == sum(sizes["ram"].values())
    line = size_line("tiny", sizes)
    assert line.startswith(f"tiny: flash {sizes['flash_bytes'] / 1024:.1f} KiB (code ")


def test_pipeline_info_shows_flash_and_ram(tiny_so):
    path, graph_json, params = tiny_so
    sizes = library_sizes(str(path), graph_json, set(params))
    out = subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "info", str(path)],
                         capture_output=True, text=True, check=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout
    assert f"\nflash     {sizes['flash_bytes']:,} bytes (code " in out
    assert f"\nRAM       {sizes['ram_bytes']:,} bytes (workspace " in out
    info = subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "info", "--json",
                           str(path)], capture_output=True, text=True, check=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout
    assert json.loads(info)["sizes"] == sizes
