"""BuildReporter: progress, why each task ran, and what the build reused.

doit calls its reporter for every task it checks (get_status), skips
(skip_uptodate) and runs (execute_task, then add_success or add_failure);
under `doit -n`, the worker processes send those calls back to the main
process, so this one object sees the whole build. It
  - prints progress: `[done/total] stage model@target` with the total growing
    as the per-kernel tasks appear; on a terminal a live line rewritten in
    place, otherwise (CI, pipes) one quiet line per task run;
  - records, per task run, why it ran (pipeline.tasks.explain), when it started
    (seconds into the build) and how long it took;
  - ends with one line per model@target: kernels compiled and reused, time;
  - writes all of it to out/build-report.json, which `doit explain` prints and
    tests read to know exactly which tasks executed.
Failures are reported exactly as doit's console reporter does.
"""

from __future__ import annotations

import json
import os
import sys
import time

from doit.reporter import ConsoleReporter

from pipeline.link.files import atomic_write
from pipeline.tasks.explain import reasons

REPORT = os.path.join("out", "build-report.json")
# Runs of only these tasks leave the previous report alone (it is what they show).
READ_ONLY_TASKS = {"explain"}


def _entry(name: str) -> str | None:
    """'optimize:resnet50@llvm' -> 'resnet50@llvm' (None for tasks of no entry)."""
    sub = name.partition(":")[2]
    return sub if "@" in sub else None


class BuildReporter(ConsoleReporter):
    desc = "progress, reasons for each rebuild, per-entry summary (out/build-report.json)"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.live = outstream.isatty() and not os.environ.get("CI")
        self.tasks = {}
        self.pending: set[str] = set()   # work tasks not yet run or skipped
        self.done = 0
        self.started: dict[str, float] = {}
        self.ran: list[dict] = []
        self.failed: list[str] = []
        self.record = True
        self.optimize_tasks: list[str] = []
        self.recompiled: dict[str, list[str]] = {}  # lib0 task -> cache entries it rebuilt
        self.t0 = time.monotonic()

    # -- doit's reporter interface --

    def initialize(self, tasks, selected_tasks):
        self.tasks = tasks  # doit adds delayed tasks to this same dict later
        self.record = bool(set(selected_tasks or ()) - READ_ONLY_TASKS)
        self.pending = self._reachable(selected_tasks or ())
        self.optimize_tasks = sorted(n for n in self.pending if n.startswith("optimize:"))

    def get_status(self, task):
        if task.actions and task.name not in self.pending:
            self.pending.add(task.name)  # a kernel task created after optimize

    def execute_task(self, task):
        if not task.actions or task.name in self.started:
            return
        self.started[task.name] = time.monotonic()
        self.ran.append({"task": task.name, "why": reasons(task)})
        if self.live:
            self._live(f"{self._progress()} {self._title(task)} ...")

    def add_success(self, task):
        if task.name not in self.started:
            return
        if task.values.get("recompiled"):
            self.recompiled[task.name] = task.values["recompiled"]
        # A kernel task whose object another process put in the shared cache.
        self._finish(task, "reused" if task.values.get("compiled") is False else "ok")

    def add_failure(self, task, fail):
        if task.name in self.started:
            self._finish(task, "failed")
            self.failed.append(task.name)
        if self.live:
            self._live("")
        super().add_failure(task, fail)

    def skip_uptodate(self, task):
        if task.actions:
            self._count(task)

    def skip_ignore(self, task):
        self._count(task)

    def complete_run(self):
        if self.live:
            self._live("")
        summary = self._summary()
        for line in summary["lines"]:
            self.write(line + "\n")
        if self.record:
            atomic_write(REPORT, json.dumps(
                {"executed": self.ran, "failed": self.failed, "entries": summary["entries"],
                 "wall_s": round(time.monotonic() - self.t0, 3)}, indent=1).encode())
        super().complete_run()

    # -- helpers --

    def _reachable(self, names) -> set[str]:
        """Work tasks (with actions) the selection leads to, via task_dep and file_dep."""
        producer = {t: name for name, task in self.tasks.items() for t in task.targets}
        seen, todo = set(), list(names)
        while todo:
            task = self.tasks.get(todo.pop())
            if task is None or task.name in seen:
                continue
            seen.add(task.name)
            todo += task.task_dep + task.setup_tasks
            todo += [producer[f] for f in task.file_dep if f in producer]
        return {n for n in seen if self.tasks[n].actions}

    def _count(self, task):
        if task.name in self.pending:
            self.pending.discard(task.name)
            self.done += 1

    def _finish(self, task, status: str):
        seconds = time.monotonic() - self.started[task.name]
        self._count(task)
        for item in reversed(self.ran):
            if item["task"] == task.name:
                item.update(status=status, seconds=round(seconds, 3),
                            start=round(self.started[task.name] - self.t0, 3))
                why = "; ".join(item["why"][:2]) + (" ..." if len(item["why"]) > 2 else "")
                if task.values.get("note"):  # e.g. a kernel compiled by a fallback
                    item["note"] = task.values["note"]
                break
        if self.live:
            self._live(f"{self._progress()} {self._title(task)} {seconds:.1f} s")
        else:
            self.write(f"{self._progress()} {self._title(task)} {status} {seconds:.2f} s"
                       f"  ({why})\n")
        if task.values.get("note"):
            self.write(f"  note: {task.values['note']}\n")

    def _progress(self) -> str:
        total = self.done + len(self.pending)
        width = len(str(total))
        return f"[{self.done:>{width}}/{total}]"

    @staticmethod
    def _title(task) -> str:
        stage, _, sub = task.name.partition(":")
        if stage == "kernel" and task.doc:
            sub = task.doc  # the kernel's symbol reads better than its bare hash
        return f"{stage:<8} {sub}"

    def _live(self, text: str):
        self.outstream.write("\r\x1b[2K" + text[:150])
        self.outstream.flush()

    def _summary(self) -> dict:
        """Per model@target: kernels compiled vs reused and the time spent on it."""
        seconds = {i["task"]: i.get("seconds", 0.0) for i in self.ran
                   if i.get("status") == "ok"}
        entries, lines = {}, []
        for name in self.optimize_tasks:
            entry, task = _entry(name), self.tasks[name]
            manifest = next((t for t in task.targets if t.endswith("kernels.json")), None)
            if manifest is None or not os.path.exists(manifest):
                continue
            hashes = [k["hash"] for k in json.loads(open(manifest).read())["kernels"]]
            # Kernels are compiled by their own tasks, or by lib0 when it finds a
            # damaged cache entry (it reports those in its values).
            again = set(self.recompiled.get(f"lib0:{entry}", ()))
            compiled = [h for h in hashes if f"kernel:{h}" in seconds or h in again]
            own = sum(s for n, s in seconds.items() if _entry(n) == entry)
            kernel_s = sum(seconds.get(f"kernel:{h}", 0.0) for h in compiled)
            entries[entry] = {"kernels": len(hashes), "compiled": len(compiled),
                              "reused": len(hashes) - len(compiled),
                              "seconds": round(own + kernel_s, 3)}
            lines.append(f"{entry}: {len(hashes)} kernels ({len(compiled)} compiled, "
                         f"{len(hashes) - len(compiled)} reused), "
                         f"{own + kernel_s:.1f} s of work")
        return {"entries": entries, "lines": lines}


def print_report(path: str = REPORT, stream=sys.stdout) -> None:
    """`doit explain`: the last build's reasons and summary, human readable."""
    if not os.path.exists(path):
        stream.write(f"{path}: no build report yet; run `doit build` first\n")
        return
    report = json.loads(open(path).read())
    if not report["executed"]:
        stream.write("The last build ran no task: everything was up to date.\n")
    for item in report["executed"]:
        stream.write(f"{item['task']}  [{item.get('status', '?')}, "
                     f"{item.get('seconds', 0):.2f} s]\n")
        for why in item["why"]:
            stream.write(f"    because {why}\n")
    for entry, s in report["entries"].items():
        stream.write(f"{entry}: {s['kernels']} kernels ({s['compiled']} compiled, "
                     f"{s['reused']} reused), {s['seconds']:.1f} s of work\n")
    stream.write(f"wall time {report['wall_s']:.1f} s\n")
