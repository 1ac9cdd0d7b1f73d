"""A library's flash and RAM, measured from the built file (pipeline.runtime.metadata
.library_sizes): what the export task prints and writes to sizes.json (the aot task
too, from its objects), and `pipeline info` and the report show."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import pipeline
from pipeline.runtime.metadata import kernel_metadata, library_sizes, memory_plan, size_line
from pipeline.transform import PassContext
from tests.support import REPO
from tests.support.aot_models import tiny_cnn
from tests.support.doit_runner import doit


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


def _size_b(path: Path) -> list[tuple[int, int, int]]:
    """`size -B`'s (text, data, bss) per file, or per member of an archive."""
    lines = subprocess.run(["size", "-B", str(path)], capture_output=True, text=True,
                           check=True).stdout.splitlines()[1:]
    return [tuple(map(int, line.split()[:3])) for line in lines]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """`doit build` of the tiny CNN for this machine, graph executor and aot."""
    if shutil.which("size") is None:
        pytest.skip("binutils' size is not installed")
    folder = tmp_path_factory.mktemp("sizes_build")
    onnx.save(tiny_cnn(), folder / "tiny.onnx")
    (folder / "matrix.yaml").write_text(
        'models:\n  tiny: {path: tiny.onnx}\ntargets:\n  host: {target: "llvm -mcpu=native"}\n'
        '  host_aot: {target: "llvm -mcpu=native", executor: aot}\n')
    code, _, log = doit(folder, "build", "config=matrix.yaml", "cache=cache")
    assert code == 0, log
    return folder, log


def test_the_build_writes_the_sizes_it_prints(built):
    folder, log = built
    d = folder / "out" / "tiny" / "host"
    sizes = json.loads((d / "sizes.json").read_text())
    ((text, data, bss),) = _size_b(d / "tiny.so")
    assert sizes["flash_bytes"] == text + data and sizes["ram"]["data"] == data + bss
    assert sizes["ram_bytes"] == sum(sizes["ram"].values()) > sizes["ram"]["workspace"] > 0
    assert size_line("tiny", sizes) in log
    # The aot entry: its archive's objects (kernels, entry points, constants).
    d = folder / "out" / "tiny" / "host_aot"
    sizes = json.loads((d / "sizes.json").read_text())
    members = _size_b(d / "libtiny.a")
    assert len(members) == 3 and sizes["flash_bytes"] == sum(t + a for t, a, _ in members)
    (module,) = json.loads((d / "metadata.json").read_text())["modules"].values()
    assert sizes == module["sizes"]


def test_sizes_json_is_a_target_of_the_link(built):
    folder, _ = built
    code, executed, log = doit(folder, "build", "config=matrix.yaml", "cache=cache")
    assert code == 0 and not executed, (executed, log)
    for target, task in (("host", "export"), ("host_aot", "aot")):
        path = folder / "out" / "tiny" / target / "sizes.json"
        before = path.read_bytes()
        path.unlink()
        code, executed, log = doit(folder, "build", "config=matrix.yaml", "cache=cache")
        assert code == 0, log
        assert {t.partition(":")[0] for t in executed} <= {task, "budget"}, executed
        assert path.read_bytes() == before
