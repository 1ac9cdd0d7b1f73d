"""`doit report`: out/report.html, one self-contained page about the last builds.

    write_report("out", [("mlp", "llvm"), ...], "out/report.html")

It reads what the other tasks left in out/ and needs none of them to have run:
  - the matrix, model x target: built (the .so or, executor aot, lib<m>.a) with its
    flash and RAM, validated (validation.json, max abs error), bench ratio against
    onnxruntime (bench.json), colour-coded;
  - the last build's timeline (out/last-build.json, the build report of the last
    run that built something; validate and bench runs leave it): one row per worker process, one
    bar per task run, coloured by stage, hatched when its outputs came from the
    action cache, plus each optimize run's time per pass;
  - per entry, the slowest nodes of the profile `doit bench profile=1` wrote
    into bench.json (else a note saying how to get one);
  - the memory plan (kernels.json): planned activation bytes against the sum of
    all intermediate tensors;
  - per entry, its kernels with the most FLOPs: calls, FLOPs, bytes moved, stack
    scratch and constant bytes (kernels.json).
Charts are drawn with matplotlib (the optional extra `report`) as SVG and
inlined: the page loads nothing (no scripts, no network). The SVG ids are
seeded (svg.hashsalt) and carry no date, so the same inputs give the same page.
"""

from __future__ import annotations

import html
import io
import json
import os
import re

from pipeline.errors import PipelineError
from pipeline.files import atomic_write

# Stage -> colour in the timeline (matplotlib's tab10, fixed so pages compare).
STAGE_COLOURS = {"model": "#7f7f7f", "import": "#9467bd", "optimize": "#ff7f0e",
                 "kernel": "#1f77b4", "lib0": "#17becf", "devc": "#8c564b",
                 "runtime": "#bcbd22", "export": "#2ca02c", "validate": "#e377c2"}
OTHER_COLOUR = "#c7c7c7"
MIB = 2**20


def _figure(width: float, height: float):
    """A matplotlib Figure outside pyplot (no global state, no display), or a
    PipelineError saying how to install matplotlib."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise PipelineError("doit report needs matplotlib: pip install -e '.[report]'") from None
    matplotlib.rcParams.update({"svg.hashsalt": "pipeline-report", "svg.fonttype": "none",
                                "font.size": 9})
    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig) -> str:
    """The figure as an <svg> element to inline (no XML prolog, no RDF metadata)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text[text.index("<svg"):], flags=re.S)


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def _entry_files(out: str, model: str, target: str) -> dict:
    d = os.path.join(out, model, target)
    return {"so": os.path.join(d, f"{model}.so"),
            # executor aot: lib<m>.a instead, its sizes in metadata.json
            "archive": os.path.join(d, f"lib{model}.a"),
            "metadata": _read_json(os.path.join(d, "metadata.json")),
            "validation": _read_json(os.path.join(d, "validation.json")),
            "bench": _read_json(os.path.join(d, "bench.json")),
            "kernels": _read_json(os.path.join(d, "kernels.json"))}


# -- the matrix ------------------------------------------------------------------

def _cell(files: dict) -> tuple[str, str]:
    """(css class, HTML) of one matrix cell."""
    aot = files["metadata"] is not None and os.path.exists(files["archive"])
    if not os.path.exists(files["so"]) and not aot:
        return "missing", "not built"
    lines, css = ["built"], "built"
    # Flash and RAM measured from the built files: the AOT executor's model
    # (metadata.json's sizes) or the shared library (its sections, memory plan).
    if aot:
        (module,) = files["metadata"]["modules"].values()
        sizes, built = module.get("sizes", {}), "built (aot)"
    else:
        sizes, built = _so_sizes(files["so"]), "built"
    if sizes:
        lines = [f"{built}: flash {sizes.get('flash_bytes', 0) / 1024:.1f} KiB, "
                 f"RAM {sizes.get('ram_bytes', 0) / 1024:.1f} KiB"]
    v = files["validation"]
    if v is not None:
        err = max((o.get("max_abs_err", float("inf")) for o in v["outputs"]), default=0.0)
        css = "pass" if v.get("passed") else "fail"
        lines.append(f"{'validated' if v.get('passed') else 'FAILED'}, max err {err:.2g}")
    else:
        lines.append("not validated")
    b = files["bench"]
    if b is not None and b.get("emulated"):
        lines += [f"{t} thr: {r['emulated_ms']:.1f} ms emulated" for t, r in b["threads"].items()]
    elif b is not None:
        # A peer that could not run the model has no ratio (pipeline.tools.bench_table).
        lines += [f"{t} thr: {r['ratio']:.2f}&times; ort" if "ratio" in r else
                  f"{t} thr: ort &#x2717;" for t, r in b["threads"].items()]
        lines += [f"{t} thr: {r['ratio_openvino']:.2f}&times; ov"
                  for t, r in b["threads"].items() if "ratio_openvino" in r]
    return css, "<br>".join(lines)


def _so_sizes(path: str) -> dict | None:
    """A shared library's flash and RAM (pipeline info's), None if unreadable."""
    # Imported here: it loads numpy, which creating doit's tasks must not.
    from pipeline.tools.library_info import describe_library

    try:
        return describe_library(path).get("sizes")
    except (OSError, ValueError, PipelineError):
        return None


def _matrix(out: str, entries: list[tuple[str, str]]) -> str:
    models = list(dict.fromkeys(m for m, _ in entries))
    targets = list(dict.fromkeys(t for _, t in entries))
    rows = ["<tr><th>model</th>" + "".join(f"<th>{html.escape(t)}</th>" for t in targets)
            + "</tr>"]
    for m in models:
        cells = []
        for t in targets:
            if (m, t) not in entries:
                cells.append("<td></td>")
                continue
            css, text = _cell(_entry_files(out, m, t))
            cells.append(f'<td class="{css}">{text}</td>')
        rows.append(f"<tr><th>{html.escape(m)}</th>{''.join(cells)}</tr>")
    return ('<table class="matrix">' + "".join(rows) + "</table>"
            '<p class="legend"><span class="pass">validated</span> '
            '<span class="built">built, not validated</span> <span class="fail">validation '
            'failed</span> <span class="missing">not built</span>; ratio: our time over '
            "onnxruntime's (below 1 is faster)</p>")


# -- the build timeline ------------------------------------------------------------

def _timeline(report: dict) -> str:
    runs = [r for r in report.get("executed", ()) if "start" in r and "end" in r]
    if not runs:
        return "<p>The last build ran no task (everything was up to date).</p>"
    workers = list(dict.fromkeys(str(r.get("worker", "?")) for r in runs))
    fig = _figure(11, 0.9 + 0.45 * len(workers))
    ax = fig.add_subplot()
    from matplotlib.patches import Patch

    for r in runs:
        stage = r["task"].partition(":")[0]
        restored = r.get("how", "").startswith("restored")
        ax.barh(workers.index(str(r.get("worker", "?"))), max(r["end"] - r["start"], 0.002),
                left=r["start"], height=0.7, color=STAGE_COLOURS.get(stage, OTHER_COLOUR),
                edgecolor="black" if restored else "none", linewidth=0.4,
                hatch="////" if restored else None, alpha=0.55 if restored else 1.0)
    ax.set_yticks(range(len(workers)), [f"worker {k + 1} (pid {w})"
                                        for k, w in enumerate(workers)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds into the build")
    seen = list(dict.fromkeys(r["task"].partition(":")[0] for r in runs))
    handles = [Patch(color=STAGE_COLOURS.get(s, OTHER_COLOUR), label=s) for s in seen]
    if any(r.get("how", "").startswith("restored") for r in runs):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="////",
                             label="restored from cache"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8,
              ncol=min(len(handles), 10), frameon=False)
    how = ", ".join(f"{n} {what}" for what, n in report.get("how", {}).items())
    return (f"<p>{len(runs)} tasks on {len(workers)} worker(s), wall time "
            f"{report.get('wall_s', 0):.1f} s; {html.escape(how)}.</p>" + _svg(fig))


def _pass_times(report: dict) -> str:
    runs = [r for r in report.get("executed", ()) if r.get("passes")]
    if not runs:
        return "<p>No optimize task ran in the last build.</p>"
    names = list(dict.fromkeys(p["pass"] for r in runs for p in r["passes"]))
    fig = _figure(11, 0.9 + 0.3 * len(runs))
    ax = fig.add_subplot()
    colours = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948"]
    labels = [r["task"].partition(":")[2] for r in runs]
    left = [0.0] * len(runs)
    for k, name in enumerate(names):
        ms = [next((p["seconds"] for p in r["passes"] if p["pass"] == name), 0.0) * 1e3
              for r in runs]
        ax.barh(labels, ms, left=left, color=colours[k % len(colours)], label=name)
        left = [a + b for a, b in zip(left, ms, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("ms per pass (PassTimingInstrument)")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8, ncol=len(names),
              frameon=False)
    return _svg(fig)


# -- per entry: slowest nodes, memory plan -----------------------------------------

def _slowest_nodes(entry: str, bench: dict | None) -> str:
    nodes = (bench or {}).get("profile", {}).get("nodes")
    if not nodes:
        return (f"<p><b>{html.escape(entry)}</b>: no profile; run "
                f"<code>doit bench profile=1</code></p>")
    fig = _figure(8, 0.5 + 0.28 * len(nodes))
    ax = fig.add_subplot()
    labels = [f"{n['kernel'][:38]} {'x'.join(map(str, n['outputs'][0])) if n['outputs'] else ''}"
              for n in nodes]
    ax.barh(range(len(nodes)), [n["ms"] for n in nodes], color="#1f77b4")
    ax.set_yticks(range(len(nodes)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"ms per node (median, {bench['profile'].get('threads', '?')} thread(s))")
    ax.set_title(entry, fontsize=9, loc="left")
    return _svg(fig)


def _memory(out: str, entries: list[tuple[str, str]]) -> str:
    rows = []
    for m, t in entries:
        k = _entry_files(out, m, t)["kernels"]
        if k and "memory" in k:
            rows.append((f"{m}@{t}", k["memory"]["planned_bytes"] / MIB,
                         k["memory"]["intermediate_bytes"] / MIB))
    if not rows:
        return "<p>No kernels.json yet: run <code>doit build</code>.</p>"
    fig = _figure(8, 0.6 + 0.45 * len(rows))
    ax = fig.add_subplot()
    ys = range(len(rows))
    ax.barh([y - 0.2 for y in ys], [r[2] for r in rows], height=0.4, color="#c7c7c7",
            label="all intermediate tensors")
    ax.barh([y + 0.2 for y in ys], [r[1] for r in rows], height=0.4, color="#2ca02c",
            label="planned (shared storage)")
    ax.set_yticks(list(ys), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("activation memory, MiB")
    ax.legend(loc="lower right", fontsize=8)
    return _svg(fig)


def _kernels(out: str, entries: list[tuple[str, str]]) -> str:
    """Per entry, its kernels by FLOPs, with the rest of their metadata (kernels.json)."""
    parts = []
    for m, t in entries:
        manifest = _entry_files(out, m, t)["kernels"]
        if not manifest or manifest["kernels"][0].get("flops") is None:
            continue
        rows = sorted(manifest["kernels"], key=lambda k: -(k["flops"] * k["calls"]))
        total = sum(k["flops"] * k["calls"] for k in rows) or 1
        body = []
        for k in rows[:8]:
            stack = "?" if k.get("stack_bytes") is None else f"{k['stack_bytes']:,}"
            body.append(f"<tr><td>{html.escape(k['symbol'])}</td><td>{k['calls']}</td>"
                        f"<td>{k['flops'] * k['calls'] / 1e6:.1f}</td>"
                        f"<td>{100 * k['flops'] * k['calls'] / total:.0f}%</td>"
                        f"<td>{k['bytes_moved'] / MIB:.2f}</td><td>{stack}</td>"
                        f"<td>{k['constant_bytes'] / MIB:.2f}</td></tr>")
        parts.append(f"<p><b>{html.escape(m)}@{html.escape(t)}</b>: {len(rows)} kernels, "
                     f"{total / 1e6:,.1f} MFLOP per run</p><table class=\"kernels\"><tr>"
                     "<th>kernel</th><th>calls</th><th>MFLOP</th><th>share</th>"
                     "<th>MiB moved / call</th><th>stack bytes</th><th>constants MiB</th></tr>"
                     + "".join(body) + "</table>")
    return "".join(parts) or "<p>No kernel metadata yet: run <code>doit build</code>.</p>"


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table.matrix { border-collapse: collapse; }
table.kernels { border-collapse: collapse; font-size: 0.8em; }
table.kernels th, table.kernels td { border: 1px solid #ccc; padding: 2px 6px; }
table.matrix th, table.matrix td { border: 1px solid #999; padding: 4px 8px;
  font-size: 0.85em; vertical-align: top; }
.pass { background: #c8f0c8; } .built { background: #fff3b0; }
.fail { background: #f6b8b8; } .missing { background: #e4e4e4; }
.legend span { padding: 1px 6px; }
svg { max-width: 100%; height: auto; display: block; }
"""


def write_report(out: str, entries: list[tuple[str, str]], path: str) -> str:
    """Write the page for the (model, target) `entries` from what is in `out`;
    returns `path`. Whatever is missing (no validation, no bench, no profile) is
    said so."""
    entries = [tuple(e) for e in entries]
    build = (_read_json(os.path.join(out, "last-build.json"))
             or _read_json(os.path.join(out, "build-report.json")) or {})
    profiles = "".join(_slowest_nodes(f"{m}@{t}", _entry_files(out, m, t)["bench"])
                       for m, t in entries)
    body = (f"<h1>pipeline build report</h1>"
            f"<h2>Matrix</h2>{_matrix(out, entries)}"
            f"<h2>Build timeline (last build)</h2>"
            f"{_timeline(build) if build else '<p>No build report yet.</p>'}"
            f"<h2>Time per pass</h2>{_pass_times(build)}"
            f"<h2>Slowest nodes</h2>{profiles}"
            f"<h2>Memory plan</h2>{_memory(out, entries)}"
            f"<h2>Kernels (the most arithmetic first)</h2>{_kernels(out, entries)}")
    page = ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            "<title>pipeline build report</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>\n")
    page = re.sub(r"\n\s*\n", "\n", page)
    atomic_write(path, page.encode())
    return path
