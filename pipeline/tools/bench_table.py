"""The tables of `doit bench` (pipeline.tools.bench): one model's (format_report) and
the suite's (summarize: out/bench-summary.md and .json).

Against each peer (onnxruntime; OpenVINO when it ran) the ratio is ours / theirs, so
below 1 we are faster; "vs better" is ours / the faster peer at that thread count.
A peer that could not run a model shows ✗ in its columns and its reason under the
table, and that model is left out of the peer's geometric mean (not out of the
table, nor out of the better-peer mean while another peer ran it). With no OpenVINO
in any report the tables are those of onnxruntime alone, column for column.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from pipeline.files import atomic_write

MIB = 2**20
# A round trip this slow means the two cores share no cache (pipeline.tools.peak).
SLOW_CORE_TO_CORE_NS = 250
FAILED = "✗"  # a peer that could not load or run the model


def _spread(row: dict, side: str) -> float:
    """(max - min) / median of a side's round figures, in percent."""
    return 100 * (row[f"{side}_max_ms"] - row[f"{side}_min_ms"]) / row[f"{side}_ms"]


def _has_openvino(reports: list[dict]) -> bool:
    """Whether any report timed (or tried) OpenVINO."""
    return any("openvino" in rep.get("peers", {}) for rep in reports)


def _failures(rep: dict) -> list[str]:
    """'<peer> could not run <model>: <reason>' per peer that failed on the model."""
    return [f"{FAILED} {peer} could not run {rep['model']}: {about['failed']}"
            for peer, about in rep.get("peers", {}).items() if "failed" in about]


def _cell(row: dict, key: str, fmt: str, width: int | str = "") -> str:
    """row[key] formatted, or the failed mark (right-aligned to `width`)."""
    return f"{row[key]:{width}{fmt}}" if key in row else f"{FAILED:>{width}}"


def _report_line(t: str, r: dict, openvino: bool) -> str:
    """One thread count's line of format_report."""
    ort = "onnxruntime_ms" in r
    line = (f"{t:>7} {r['ours_ms']:9.2f} {_cell(r, 'onnxruntime_ms', '.2f', 9)} "
            f"{_cell(r, 'ratio', '.2f', 6)} "
            + (f"{r['ratio_min']:5.2f}-{r['ratio_max']:<5.2f} " if ort else f"{'':11} ")
            + f"{_spread(r, 'ours'):4.0f}%/"
            + (f"{_spread(r, 'onnxruntime'):4.0f}% " if ort else f"{FAILED:>4}  ")
            + f"{r['ours_gflops']:10.1f} {r['ours_peak_pct']:6.0f}% "
            f"{r['ours_peak_rss_bytes'] / MIB:6.0f}MiB "
            + (f"{r['onnxruntime_peak_rss_bytes'] / MIB:5.0f}MiB" if ort else f"{FAILED:>8}"))
    if openvino:
        ov = "openvino_ms" in r
        line += (f" {_cell(r, 'openvino_ms', '.2f', 9)} {_cell(r, 'ratio_openvino', '.2f', 6)} "
                 + (f"{r['ratio_openvino_min']:5.2f}-{r['ratio_openvino_max']:<5.2f} "
                    if ov else f"{'':11} ")
                 + (f"{r['openvino_peak_rss_bytes'] / MIB:5.0f}MiB" if ov else f"{FAILED:>8}")
                 + f" {_cell(r, 'ratio_best', '.2f', 6)}")
    return line


def format_report(report: dict) -> str:
    """The bench table of one model: one line per thread count, then its memory."""
    if report.get("emulated"):
        return "\n".join(
            [f"{report['model']} @ {report['target']}: EMULATED under {report['run']!r} "
             f"(median of {report['rounds']} rounds of {report['runs']} runs; not a device "
             "time, no onnxruntime ratio)", f"{'threads':>7} {'emulated ms':>12} {'range':>19}"]
            + [f"{t:>7} {r['emulated_ms']:12.2f} {r['emulated_min_ms']:9.2f}-"
               f"{r['emulated_max_ms']:<9.2f}" for t, r in report["threads"].items()])
    openvino = _has_openvino([report])
    lines = [f"{report['model']} @ {report['target']} ({report['gflop']} GFLOP; median of "
             f"{report['rounds']} rounds of {report['runs']} runs, each side in its own "
             "process)",
             f"{'threads':>7} {'ours ms':>9} {'ort ms':>9} {'ratio':>6} {'range':>11} "
             f"{'spread':>11} {'ours GF/s':>10} {'% peak':>7} {'RSS ours':>9} {'RSS ort':>8}"
             + (f" {'ov ms':>9} {'ratio':>6} {'range':>11} {'RSS ov':>8} {'best':>6}"
                if openvino else "")]
    lines += [_report_line(t, r, openvino) for t, r in report["threads"].items()]
    lines += [f"{t:>7} threads: a cache line's round trip between two cores "
              f"{r['core_to_core_ns'][0]:.0f} ns before the rounds, "
              f"{r['core_to_core_ns'][1]:.0f} ns after"
              for t, r in report["threads"].items() if "core_to_core_ns" in r]
    mem = report["memory"]
    lines.append(f"activations: planned {mem['planned_activation_bytes'] / MIB:.1f} MiB of "
                 f"{mem['intermediate_bytes'] / MIB:.1f} MiB (range: per-round ratios; "
                 "spread: (max - min) / median of the rounds, ours/ort"
                 + ("; best: ours / the faster peer)" if openvino else ")"))
    ov = report.get("peers", {}).get("openvino", {})
    if "version" in ov:
        lines.append(f"openvino {ov['version'].split('-')[0]}: CPU plugin, "
                     f"{ov.get('precision', '?')} inference precision, latency hint"
                     + (", threads pinned to cores" if ov.get("cpu_pinning") else ""))
    return "\n".join(lines + _failures(report))


def _summary_row(rep: dict, t: str, r: dict, best: dict, openvino: bool) -> str:
    """One model and thread count's line of the suite table (Markdown)."""
    ort = "onnxruntime_ms" in r
    line = (f"| {rep['model']} | {rep['target']} | {t} | {r['ours_ms']:.2f} | "
            f"{_cell(r, 'onnxruntime_ms', '.2f')} | {_cell(r, 'ratio', '.2f')} | "
            + (f"{r['ratio_min']:.2f}–{r['ratio_max']:.2f} | {_spread(r, 'ours'):.0f}% / "
               f"{_spread(r, 'onnxruntime'):.0f}% | " if ort else
               f"{FAILED} | {_spread(r, 'ours'):.0f}% / {FAILED} | ")
            + f"{r['ours_gflops']:.1f} | {100 * r['ours_gflops'] / best[t]:.0f}% | "
            f"{r['ours_peak_rss_bytes'] / MIB:.0f} / "
            + (f"{r['onnxruntime_peak_rss_bytes'] / MIB:.0f} |" if ort else f"{FAILED} |"))
    if openvino:
        ov = "openvino_ms" in r
        line += (f" {_cell(r, 'openvino_ms', '.2f')} | {_cell(r, 'ratio_openvino', '.2f')} | "
                 + (f"{r['ratio_openvino_min']:.2f}–{r['ratio_openvino_max']:.2f} | "
                    f"{r['openvino_peak_rss_bytes'] / MIB:.0f} |" if ov else
                    f"{FAILED} | {FAILED} |")
                 + f" {_cell(r, 'ratio_best', '.2f')} |")
    return line


def _geomean(ratios: list[tuple[float, str]]) -> dict:
    """{"models", "geomean_ratio", "worst_model", "worst_ratio"} of (ratio, model)s."""
    geo = math.exp(statistics.fmean(math.log(r) for r, _ in ratios))
    worst = max(ratios)
    return {"models": len(ratios), "geomean_ratio": round(geo, 3), "worst_model": worst[1],
            "worst_ratio": worst[0]}


def _means(reports: list[dict], openvino: bool) -> tuple[dict, list[str]]:
    """Per target and thread count the geometric means (summary.json's "summary") and
    their lines: against onnxruntime (the keys of before OpenVINO), and with OpenVINO
    in the reports also against it ("openvino") and the better peer ("best")."""
    keys = [("onnxruntime", "ratio")] + (
        [("openvino", "ratio_openvino"), ("the better peer", "ratio_best")] if openvino else [])
    groups: dict[tuple[str, str], dict[str, list]] = {}
    for rep in reports:
        for t, r in rep["threads"].items():
            group = groups.setdefault((rep["target"], t), {k: [] for _, k in keys})
            for _, key in keys:
                group[key].append((r[key], rep["model"]) if key in r else (None, rep["model"]))
    summary, lines = {}, []
    for (target, t), group in sorted(groups.items()):
        entry = {"target": target, "threads": int(t)}
        for peer, key in keys:
            ratios = [(r, m) for r, m in group[key] if r is not None]
            missing = [m for r, m in group[key] if r is None]
            if not ratios:
                continue
            means = {**_geomean(ratios), **({"failed": missing} if missing else {})}
            if key == "ratio":
                entry.update(means)
            else:
                entry["openvino" if key == "ratio_openvino" else "best"] = means
            lines.append(f"{target}, {t} thread{'s' * (t != '1')}: geometric-mean ratio "
                         f"(ours / {peer}) {means['geomean_ratio']:.2f} over {len(ratios)} "
                         f"models; worst {means['worst_model']} {means['worst_ratio']:.2f}"
                         + (f"; {FAILED} {', '.join(missing)}" if missing else ""))
        summary[f"{target}@{t}"] = entry
    return summary, lines


def _memory_bound(reports: list[dict], bandwidth: dict) -> list[str]:
    """The Markdown table of the profiled kernels bound by memory bandwidth: achieved
    GB/s (bytes moved per call / time) and % of the best streaming read bandwidth at
    the profile's thread count."""
    rows = []
    for rep in reports:
        prof = rep.get("profile") or {}
        bw = bandwidth.get(str(prof.get("threads"))) or prof.get("read_gbps")
        rows += [f"| {rep['model']} | {prof['threads']} | {n['kernel']} | {n['ms']:.3f} | "
                 f"{n['bytes_moved'] / MIB:.1f} | {n['gbps']:.1f} | {100 * n['gbps'] / bw:.0f}% |"
                 for n in prof.get("nodes", []) if n.get("bound") == "memory" and bw]
    if not rows:
        return []
    return ["", "Memory-bound kernels among the profiled slowest nodes (bytes moved per "
            "call: every argument read once, the output written once):", "",
            "| model | threads | kernel | ms | MiB moved | GB/s | % of read bandwidth |",
            "|---|---|---|---|---|---|---|", *rows]


def summarize(report_paths: list[str], peak_path: str, md_path: str, json_path: str) -> dict:
    """The suite table of several bench.json files, with per target and thread count the
    geometric-mean ratio against each peer and the better one and the worst model;
    written as Markdown and JSON, printed. "% of peak" and "% of read bandwidth" are
    against the best in `peak_path` now, the same for every row (a report measured
    earlier may have known a lower one)."""
    reports = [json.loads(Path(p).read_text()) for p in report_paths]
    emulated = [r for r in reports if r.get("emulated")]
    reports = [r for r in reports if not r.get("emulated")]
    # No native report measured the peak when every entry was emulated.
    record = json.loads(Path(peak_path).read_text()) if reports else {}
    best, bandwidth = record.get("gflops", {}), record.get("read_gbps", {})
    openvino = _has_openvino(reports)
    head = ("| model | target | threads | ours ms | onnxruntime ms | ratio | ratio range | "
            "spread ours / ort | ours GFLOP/s | % of peak | peak RSS ours / ort MiB |"
            + (" openvino ms | ratio vs openvino | openvino ratio range | peak RSS openvino "
               "MiB | ratio vs better peer |" if openvino else ""))
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    lines += [_summary_row(rep, t, r, best, openvino)
              for rep in reports for t, r in rep["threads"].items()]
    lines += [f"\n{line}" if i == 0 else line
              for i, line in enumerate(line for rep in reports for line in _failures(rep))]
    if not reports:  # emulated entries only: no native table, no peak
        lines = []
    else:
        lines.append("\nPeak: " + ", ".join(f"{g:.0f} GFLOP/s at {t} thread{'s' * (t != '1')}"
                                            for t, g in sorted(best.items()))
                     + " (the best FMA-loop rate measured on this CPU so far)")
        if bandwidth:
            lines.append("Streaming read bandwidth: " + ", ".join(
                f"{g:.1f} GB/s at {t} thread{'s' * (t != '1')}"
                for t, g in sorted(bandwidth.items())) + " (the best measured so far)")
    lines += _notes(reports)
    summary, mean_lines = _means(reports, openvino)
    lines += mean_lines + _memory_bound(reports, bandwidth)
    if emulated:
        lines += [""] * bool(lines) + [
                  "Emulated (the target's `run` prefix on this machine: not device times, "
                  "no onnxruntime ratio):", "", "| model | target | threads | emulated ms |",
                  "|---|---|---|---|"]
        lines += [f"| {rep['model']} | {rep['target']} | {t} | {r['emulated_ms']:.2f} |"
                  for rep in emulated for t, r in rep["threads"].items()]
    text = "\n".join(lines) + "\n"
    atomic_write(md_path, text.encode())
    atomic_write(json_path, json.dumps({"summary": summary, "peak_gflops": best,
                                        "read_gbps": bandwidth, "reports": reports,
                                        "emulated": emulated}, indent=1).encode())
    print(text, end="")
    return summary


def _notes(reports: list[dict]) -> list[str]:
    """The lines on runs our executor ran alone and on the core-to-core round trip."""
    lines = []
    alone = [f"{rep['model']} {r['ours_runs_alone']}/{r['ours_runs']}"
             for rep in reports for t, r in rep["threads"].items()
             if int(t) > 1 and r.get("ours_runs_alone")]
    if alone:  # the executor's own choice (runtime/c/executor.c, run_alone): said openly
        lines.append("Timed runs at more than one thread that our executor ran on one "
                     "(it measured that faster): " + ", ".join(alone))
    trips = [(ns, rep["model"]) for rep in reports for r in rep["threads"].values()
             for ns in r.get("core_to_core_ns", ())]
    if trips:  # pipeline.tools.peak: the VM's state decides what two threads can gain
        slow = sorted({m for ns, m in trips if ns > SLOW_CORE_TO_CORE_NS})
        lines.append(f"Core-to-core round trip around the multi-thread rounds: "
                     f"{min(trips)[0]:.0f}-{max(trips)[0]:.0f} ns"
                     + (f"; over {SLOW_CORE_TO_CORE_NS} ns (two threads gain little) at "
                        + ", ".join(slow) if slow else ""))
    return lines
