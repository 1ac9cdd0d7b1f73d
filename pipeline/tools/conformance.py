"""ONNX backend conformance: run onnx's backend test suites over pipeline.tools.backend.

    write_report("out")        # out/conformance.json and out/conformance.md

The suites are onnx.backend.test's: "Node" (about 1,900 one-operator models the
onnx package generates in Python), and the model suites its wheel ships
("Simple", "PyTorchConverted", "PyTorchOperator", and "Real": nine full-size
model-zoo networks with constant weights, run on dummy inputs against stored
outputs; the report includes it, the pytest suite does not). A test is skipped only when
pipeline.tools.backend.unsupported() names a reason; the report counts passed,
failed and skipped per suite and opt level, lists every failure with its first
error line, the skip reasons, and the supported operators with the opsets
their converters start at (from the registry).
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import onnx

from pipeline.tasks.paths import OUT
from pipeline.tools.backend import PipelineBackend, unsupported

SUITES = ("Node", "Simple", "PyTorchConverted", "PyTorchOperator")
REPORT_SUITES = (*SUITES, "Real")
OPT_LEVELS = (3, 0)
_SKIP_PREFIX = "unsupported: "


def skipping_backend(opt_level: int) -> type[PipelineBackend]:
    """PipelineBackend at `opt_level` whose prepare skips (unittest.SkipTest) exactly
    the models backend.unsupported() names a reason for."""

    class ConformanceBackend(PipelineBackend):
        @classmethod
        def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kw: Any) -> bool:
            return True  # prepare skips, with the reasons

        @classmethod
        def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kw: Any):
            reasons = unsupported(model)
            if reasons:
                raise unittest.SkipTest(_SKIP_PREFIX + "; ".join(reasons))
            return super().prepare(model, device, **{"opt_level": opt_level, **kw})

    return ConformanceBackend


def _runner_class():
    """onnx's test runner (BackendTest), comparing each element of a sequence output as a
    one-output list: its own recursion passes the element bare and takes its len(),
    which a 0-d element has not (test_loop16_seq_none's first element)."""
    from onnx.backend.test import BackendTest

    class Runner(BackendTest):
        @classmethod
        def assert_similar_outputs(cls, ref_outputs, outputs, rtol, atol, model_dir=None):
            if isinstance(ref_outputs, np.ndarray) and isinstance(outputs, np.ndarray):
                ref_outputs, outputs = [ref_outputs], [outputs]
            super().assert_similar_outputs(ref_outputs, outputs, rtol, atol,
                                           model_dir=model_dir)

    return Runner


def make_backend_tests(opt_level: int, suites=SUITES,
                       module: str = __name__) -> dict[str, type[unittest.TestCase]]:
    """unittest.TestCase classes, one per suite, named OnnxBackend<Suite>O<level>:
    the suites' CPU tests run through skipping_backend(opt_level)."""
    runner = _runner_class()(skipping_backend(opt_level), module)
    classes = {}
    for name, case in runner.test_cases.items():
        suite = name.removeprefix("OnnxBackend").removesuffix("ModelTest")
        if suite not in suites:
            continue
        methods = {k: v for k, v in vars(case).items()
                   if k.startswith("test_") and k.endswith("_cpu")}
        cls_name = f"OnnxBackend{suite}O{opt_level}"
        classes[cls_name] = type(cls_name, (unittest.TestCase,),
                                 {**methods, "__module__": module, "suite": suite})
    return classes


class _Result(unittest.TestResult):
    """Records one outcome per test: ("passed" | "failed" | "skipped", message), and
    the seconds each test took (compile and run)."""

    def __init__(self):
        super().__init__()
        self.outcomes: dict[str, tuple[str, str]] = {}
        self.seconds: dict[str, float] = {}

    def startTest(self, test):  # noqa: N802 (unittest's names)
        super().startTest(test)
        self._start = time.perf_counter()

    def stopTest(self, test):  # noqa: N802
        self.seconds[test._testMethodName] = time.perf_counter() - self._start
        super().stopTest(test)

    def addSuccess(self, test):  # noqa: N802
        self.outcomes[test._testMethodName] = ("passed", "")

    def addFailure(self, test, err):  # noqa: N802
        self.outcomes[test._testMethodName] = ("failed", _first_line(err[1]))

    def addError(self, test, err):  # noqa: N802
        self.outcomes[test._testMethodName] = ("failed", _first_line(err[1]))

    def addSkip(self, test, reason):  # noqa: N802
        self.outcomes[test._testMethodName] = ("skipped", reason.removeprefix(_SKIP_PREFIX))


def _first_line(err: BaseException) -> str:
    lines = [x for x in str(err).splitlines() if x.strip()]
    text = next((x for x in lines if "Mismatched" in x or "Max absolute" in x), None)
    return f"{type(err).__name__}: {text or (lines[0] if lines else '')}"[:300]


def run_suites(suites=REPORT_SUITES, opt_levels=OPT_LEVELS) -> dict:
    """Run the suites at each opt level; returns the report as a dict."""
    results: dict[str, dict] = {}
    # The Real suite writes its dummy inputs and outputs under $ONNX_HOME.
    with tempfile.TemporaryDirectory(prefix="onnx-home-") as home, \
            mock.patch.dict(os.environ, {"ONNX_HOME": home}):
        _run_levels(suites, opt_levels, results)
    return {"onnx": onnx.__version__, "results": results,
            "supported_operators": supported_operators(),
            "limits_audit": audit_limits(opt_levels[0]) if "Node" in suites else {}}


def _run_levels(suites, opt_levels, results: dict) -> None:
    for level in opt_levels:
        for case in make_backend_tests(level, suites).values():
            result = _Result()
            start = time.perf_counter()
            unittest.defaultTestLoader.loadTestsFromTestCase(case).run(result)
            seconds = time.perf_counter() - start
            counts = collections.Counter(kind for kind, _ in result.outcomes.values())
            ran = {t: s for t, s in result.seconds.items() if result.outcomes[t][0] != "skipped"}
            slowest = sorted(ran.items(), key=lambda item: -item[1])[:5]
            results[f"{case.suite}@O{level}"] = {
                "suite": case.suite, "opt_level": level, "seconds": round(seconds, 1),
                "mean_seconds_per_test_run": round(sum(ran.values()) / max(len(ran), 1), 3),
                "slowest": {t: round(s, 2) for t, s in slowest},
                **{k: counts.get(k, 0) for k in ("passed", "failed", "skipped")},
                "failures": {t: m for t, (k, m) in sorted(result.outcomes.items())
                             if k == "failed"},
                "skip_reasons": _reason_counts(
                    m for k, m in result.outcomes.values() if k == "skipped"),
            }


def audit_limits(opt_level: int = 3) -> dict[str, dict[str, list[str]]]:
    """Run the tests (node and model suites) that only converter limits skip, anyway:
    {limit: {"passed": [test names], "failed": [...]}}. A limit whose tests all
    pass is stale and hides passing tests."""
    Runner = _runner_class()  # noqa: N806 (a class)
    audit: dict[str, dict[str, list[str]]] = {}
    for name, model, data_sets, rtol, atol in _all_cases():
        reasons = unsupported(model)
        if not reasons or unsupported(model, limits=False):
            continue
        outcome = "passed"
        try:
            rep = PipelineBackend.prepare(model, opt_level=opt_level)
            for inputs, outputs in data_sets:
                Runner.assert_similar_outputs(outputs, rep.run(inputs), rtol, atol)
        except Exception:  # any failure is what the limit declares
            outcome = "failed"
        for reason in reasons:
            audit.setdefault(reason, {"passed": [], "failed": []})[outcome].append(name)
    return audit


def _all_cases():
    """(name, model, [(inputs, outputs)], rtol, atol) of the node and model suites."""
    from onnx.backend.test.loader import load_model_tests

    for case in load_model_tests(kind="node"):
        yield (case.name, case.model,
               [([_array(i) for i in ins], [_array(o) for o in outs])
                for ins, outs in case.data_sets], case.rtol, case.atol)
    for kind in ("simple", "pytorch-converted", "pytorch-operator"):
        for case in load_model_tests(kind=kind):
            model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
            data_sets = [([_load(f) for f in sorted(Path(d).glob("input_*.pb"))],
                          [_load(f) for f in sorted(Path(d).glob("output_*.pb"))])
                         for d in sorted(Path(case.model_dir).glob("test_data_set*"))]
            yield case.name, model, data_sets, case.rtol, case.atol


def _load(path: Path):
    return onnx.numpy_helper.to_array(onnx.load_tensor(str(path)))


def _array(value):
    return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def _reason_counts(messages) -> dict[str, int]:
    counts = collections.Counter(r for m in messages for r in m.split("; "))
    return dict(counts.most_common())


def supported_operators() -> dict[str, list[int]]:
    """ONNX op_type -> the opsets its converters start at (Constant: the frontend's own)."""
    from pipeline.frontend.onnx import ONNX_CONVERTERS

    ops = {op: sorted({c.since for c in conv}) for op, conv in ONNX_CONVERTERS.items()}
    ops["Constant"] = [1]
    return dict(sorted(ops.items()))


def render_markdown(report: dict) -> str:
    """The report as a Markdown page: summary table, supported operators, failures."""
    lines = [f"# ONNX backend conformance (onnx {report['onnx']})", "",
             "| suite | opt level | passed | failed | skipped (unsupported) | pass rate of run |"
             " seconds |", "|---|---|---|---|---|---|---|"]
    for r in report["results"].values():
        run = r["passed"] + r["failed"]
        rate = f"{100 * r['passed'] / run:.1f}%" if run else "-"
        lines.append(f"| {r['suite']} | {r['opt_level']} | {r['passed']} | {r['failed']} | "
                     f"{r['skipped']} | {rate} | {r['seconds']} |")
    ops = report["supported_operators"]
    lines += ["", f"## Supported operators ({len(ops)}; converter opsets)", "",
              ", ".join(f"{op} ({'/'.join(map(str, v))})" for op, v in ops.items())]
    for key, r in report["results"].items():
        if r["failures"]:
            lines += ["", f"## Failures: {key}", ""]
            lines += [f"- `{t}`: {m}" for t, m in r["failures"].items()]
    lines += ["", "## Slowest tests (seconds to compile and run)", ""]
    lines += [f"- {key}: mean {r['mean_seconds_per_test_run']} s per test run; "
              + ", ".join(f"`{t}` {s}" for t, s in r["slowest"].items())
              for key, r in report["results"].items() if r["slowest"]]
    hidden = {r: v["passed"] for r, v in report["limits_audit"].items() if v["passed"]}
    if hidden:
        lines += ["", "## Node tests a declared limit skips but that pass when run anyway", ""]
        lines += [f"- {r}: {', '.join(f'`{t}`' for t in names)}" for r, names in hidden.items()]
    first = [r for r in report["results"].values()
             if r["opt_level"] == next(iter(report["results"].values()))["opt_level"]]
    if first:
        counts = collections.Counter()
        for r in first:
            counts.update(r["skip_reasons"])
        lines += ["", f"## Skip reasons (tests per reason, all suites at opt level "
                      f"{first[0]['opt_level']}; a test may have several)", ""]
        lines += [f"- {n} {reason}" for reason, n in counts.most_common(80)]
    return "\n".join(lines) + "\n"


def write_report(out_dir: str | Path = OUT, suites=REPORT_SUITES,
                 opt_levels=OPT_LEVELS) -> dict:
    """Run the suites and write <out_dir>/conformance.json and conformance.md."""
    report = run_suites(suites, opt_levels)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "conformance.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "conformance.md").write_text(render_markdown(report))
    for key, r in report["results"].items():
        print(f"{key}: {r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped "
              f"(unsupported), {r['seconds']} s")
    return report
