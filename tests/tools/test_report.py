"""Progress output of `doit -n 2 build` (a terminal, and CI=true) and `doit report`'s
page, loaded in headless Chromium.

One module fixture runs, in a temporary folder, as a user would:
  1. `doit -n 2 build` of mlp on a pseudo-terminal: the live line;
  2. `doit forget`, then `doit -n 2 build` of mlp and a tiny convnet with CI=true,
     still on the terminal: plain lines; mlp's stages come from the action cache,
     the convnet's are computed (both kinds in the timeline);
  3. `doit validate`, `doit bench profile=1` of mlp only (the other has no profile);
  4. `doit report`.
"""

from __future__ import annotations

import json
import os
import pty
import re
from pathlib import Path

import numpy as np
import pytest

from tests.support.doit_runner import doit_process
from tests.support.onnx_models import tiny_convnet

CONFIG = """\
models:
  mlp: {generator: mlp}
  tiny: {path: tiny.onnx, inputs: {x: [1, 3, 16, 16]}}
targets:
  llvm: {target: "llvm -mcpu=native", opt_level: 3}
validate: {reference: onnx, rtol: 1.0e-4, atol: 1.0e-4}
"""


def on_terminal(folder: Path, *args: str, ci: bool = False) -> tuple[int, str]:
    """Run doit in `folder` with stdout and stderr on a pseudo-terminal; (exit, output)."""
    leader, follower = pty.openpty()
    proc = doit_process(folder, *args, env={"CI": "true" if ci else None},
                        stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the terminal closed: the process is done
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=600), b"".join(chunks).decode()


def executed(folder: Path) -> list[dict]:
    return json.loads((folder / "out" / "build-report.json").read_text())["executed"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("report")
    tiny_convnet(folder / "tiny.onnx")
    (folder / "matrix.yaml").write_text(CONFIG)
    runs = {}
    code, runs["live"] = on_terminal(folder, "-n", "2", "build", "config=matrix.yaml",
                                     "model=mlp")
    assert code == 0, runs["live"]
    runs["live_executed"] = executed(folder)
    code, out = on_terminal(folder, "forget", "--all", "config=matrix.yaml")
    assert code == 0, out
    code, runs["plain"] = on_terminal(folder, "-n", "2", "build", "config=matrix.yaml",
                                      ci=True)
    assert code == 0, runs["plain"]
    runs["plain_executed"] = executed(folder)
    for args in (["validate"], ["bench", "model=mlp", "threads=1", "rounds=1", "runs=3",
                                "warmup=1", "profile=1"]):
        code, out = on_terminal(folder, *args, "config=matrix.yaml", ci=True)
        if code != 0 and args[0] == "bench" and "onnxruntime" in out:
            pytest.skip("doit bench needs onnxruntime (.[ort])")
        assert code == 0, out
    return {"folder": folder, **runs}


FRAME = re.compile(r"\r\x1b\[2K\[ *(\d+)/(\d+)\]( ETA \d+:\d\d)? \| ([^\r\n]*)")


def test_live_progress_line_under_n2(built):
    text = built["live"]
    frames = FRAME.findall(text)
    assert len(frames) >= len(built["live_executed"]), text  # a frame per start and end
    totals = [int(total) for _, total, _, _ in frames]
    assert totals == sorted(totals) and totals[-1] > totals[0]  # kernel tasks appeared
    done = [int(d) for d, _, _, _ in frames]
    assert done == sorted(done) and done[-1] == totals[-1]
    assert any(eta for _, _, eta, _ in frames)  # an ETA once a few tasks finished
    # The running tasks, each with its running time: a kernel among them at some point.
    assert any(re.search(r"kernel \S+ \d+s", running) for *_, running in frames), frames
    assert not re.search(r"\] \w+ +\S+ ok \d", text)  # no plain per-task lines
    assert "mlp@llvm: " in text  # the summary after the live line
    workers = {i["worker"] for i in built["live_executed"]}
    assert len(workers) == 2, workers  # -n 2: two processes ran the tasks


def test_plain_progress_lines_under_ci(built):
    text, ran = built["plain"], built["plain_executed"]
    assert "\r" not in text.replace("\r\n", "\n") and "\x1b" not in text  # no live line
    lines = [ln for ln in text.splitlines() if ln.startswith("[")]
    assert len(lines) == len(ran)  # one line per task run
    counts = [tuple(map(int, ln[1:ln.index("]")].split("/"))) for ln in lines]
    totals = [total for _, total in counts]
    assert totals == sorted(totals) and totals[-1] > totals[0]  # kernel tasks appeared
    assert counts[-1][0] == counts[-1][1]  # all done (up-to-date tasks count as done)
    assert any("restored from cache (local)" in ln and "mlp" in ln for ln in lines)
    assert any(" ok " in ln and "tiny@llvm" in ln for ln in lines)


def report_html(built) -> tuple[Path, str]:
    folder = built["folder"]
    code, out = on_terminal(folder, "report", "config=matrix.yaml", ci=True)
    if code != 0 and "matplotlib" in out:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but matplotlib is missing (.[report])")
        pytest.skip("doit report needs matplotlib (.[report])")
    assert code == 0, out
    page = folder / "out" / "report.html"
    return page, page.read_text()


def test_report_page_content(built):
    page, text = report_html(built)
    # Self-contained: no scripts, no links, no URL but the SVG namespaces.
    assert "<script" not in text.lower()
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", text))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    assert text.count("<svg") >= 4  # timeline, pass times, mlp's profile, memory plan
    cells = re.findall(r'<td class="(\w+)">(.*?)</td>', text)
    assert len(cells) == 2 and all(css == "pass" for css, _ in cells), cells
    mlp_cell = next(c for _, c in cells if "ort" in c)  # only mlp was benched
    ratio = json.loads((page.parent / "mlp" / "llvm" / "bench.json").read_text())
    assert f"{ratio['threads']['1']['ratio']:.2f}&times; ort" in mlp_cell
    # Each library's flash and RAM, as `pipeline info` measures them.
    from pipeline.tools.library_info import describe_library

    sizes = describe_library(str(page.parent / "tiny" / "llvm" / "tiny.so"))["sizes"]
    assert (f"built: flash {sizes['flash_bytes'] / 1024:.1f} KiB, RAM "
            f"{sizes['ram_bytes'] / 1024:.1f} KiB") in text
    err = json.loads((page.parent / "tiny" / "llvm" / "validation.json").read_text())
    assert f"max err {err['outputs'][0]['max_abs_err']:.2g}" in text
    assert "<b>tiny@llvm</b>: no profile; run <code>doit bench profile=1</code>" in text
    assert "<b>mlp@llvm</b>: no profile" not in text
    # The timeline is of the last build (the CI run), not of validate or bench.
    for pid in {str(i["worker"]) for i in built["plain_executed"]}:
        assert f"(pid {pid})" in text
    assert "restored from cache" in text
    # The kernels table: mlp's total FLOPs from kernels.json (tests/unit/test_kernel_metadata.py
    # checks those against the ONNX model).
    kernels = json.loads((page.parent / "mlp" / "llvm" / "kernels.json").read_text())["kernels"]
    mflop = sum(k["flops"] * k["calls"] for k in kernels) / 1e6
    assert f"<b>mlp@llvm</b>: {len(kernels)} kernels, {mflop:,.1f} MFLOP per run" in text
    top = max(kernels, key=lambda k: k["flops"] * k["calls"])  # its row: the stack recorded
    assert re.search(rf"<td>{top['symbol']}</td>(<td>[^<]*</td>){{4}}"
                     rf"<td>{top['stack_bytes']:,}</td>", text), top
    # Deterministic: drawn again from the same files, the same bytes.
    from pipeline.tools.report import write_report

    again = write_report(str(page.parent), [("mlp", "llvm"), ("tiny", "llvm")],
                         str(page.parent / "again.html"))
    assert Path(again).read_text() == text


def test_report_in_chromium(built):
    from tests.support.browser import load_page

    page, _ = report_html(built)
    load = load_page(page.as_uri())
    assert load.errors == [] and load.console == [], load.console
    assert load.requests == [page.as_uri()]  # nothing fetched but the page itself
    from matplotlib.image import imread

    shot = page.parent / "report.png"
    shot.write_bytes(load.screenshot)
    rgb = (imread(str(shot))[..., :3] * 255).round().astype(np.int16)
    assert rgb.shape[:2] == (2000, 1400) and rgb.std() > 20  # not a blank page

    def pixels(hex_colour: str) -> int:
        want = np.array([int(hex_colour[k:k + 2], 16) for k in (1, 3, 5)])
        return int((np.abs(rgb - want).max(axis=-1) <= 2).sum())

    assert pixels("#c8f0c8") > 1000  # the matrix's validated cells
    assert pixels("#1f77b4") > 500   # kernel bars of the timeline, the profile's bars
    assert pixels("#ff7f0e") > 50    # optimize bars
    assert pixels("#2ca02c") > 500   # planned memory bars (and export tasks)
