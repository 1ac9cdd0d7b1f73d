"""BuildReporter: progress, why each task ran, and what the build reused.

doit calls its reporter for every task it checks (get_status), skips
(skip_uptodate) and runs (execute_task, then add_success or add_failure);
under `doit -n`, the worker processes send those calls back to the main
process, so this one object sees the whole build. It
  - prints progress: `[done/total]` with the total growing as the per-kernel
    tasks appear; on a terminal one live line rewritten in place (every second
    too) naming the tasks running now (several under -n) and an ETA, otherwise
    (CI=true, pipes) one quiet line per task run;
  - records, per task run, why it ran (pipeline.tasks.explain), when it started
    and ended (seconds into the build), how long it took, the process that ran
    it (`worker`, a pid: the stage's values carry it, pipeline.tasks.run.run_stage)
    and, for optimize, the time of each pass (`passes`);
  - records how each task got its outputs: "computed", "computed on the cluster"
    or "restored from cache (local|remote)" (the action cache), and prints each
    distinct cache warning once (a remote tier that is down);
  - ends with one line per model@target: kernels compiled and reused, time, and
    one line counting the tasks by how they got their outputs;
  - writes all of it to out/build-report.json, which `doit explain` prints and
    tests read to know exactly which tasks executed (and, for a run that built
    something, to out/last-build.json, the timeline of `doit report`).
Failures are reported exactly as doit's console reporter does.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from doit.reporter import ConsoleReporter

from pipeline.files import atomic_write
from pipeline.tasks.explain import reasons
from pipeline.tasks.paths import BUILD_STAGES, LAST_BUILD, REPORT

# Runs of only these tasks leave the previous report alone (it is what they show).
READ_ONLY_TASKS = {"explain", "report"}


def _entry(name: str) -> str | None:
    """'optimize:resnet50@llvm' -> 'resnet50@llvm' (None for tasks of no entry)."""
    sub = name.partition(":")[2]
    return sub if "@" in sub else None


class BuildReporter(ConsoleReporter):
    desc = "progress, reasons for each rebuild, per-entry summary (out/build-report.json)"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.live = outstream.isatty() and os.environ.get("CI", "").lower() not in ("true", "1")
        self.tasks = {}
        self.pending: set[str] = set()   # work tasks not yet run or skipped
        self.done = 0
        self.started: dict[str, float] = {}
        self.ran: list[dict] = []
        self.failed: list[str] = []
        self.record = True
        self.optimize_tasks: list[str] = []
        self.recompiled: dict[str, list[str]] = {}  # lib0 task -> cache entries it rebuilt
        self.warned: list[str] = []
        self.t0 = time.monotonic()
        self.running: dict[str, float] = {}  # task -> start, for the live line
        self.first_start: float | None = None
        self.finished = 0  # tasks run to an end, for the ETA
        self.lock = threading.Lock()  # the live line is also redrawn by a ticker thread
        self.stop = threading.Event()

    # -- doit's reporter interface --

    def initialize(self, tasks, selected_tasks):
        self.tasks = tasks  # doit adds delayed tasks to this same dict later
        self.record = bool(set(selected_tasks or ()) - READ_ONLY_TASKS)
        self.pending = self._reachable(selected_tasks or ())
        self.optimize_tasks = sorted(n for n in self.pending if n.startswith("optimize:"))
        if self.live:
            threading.Thread(target=self._tick, daemon=True).start()

    def get_status(self, task):
        if task.actions and task.name not in self.pending:
            self.pending.add(task.name)  # a kernel task created after optimize

    def execute_task(self, task):
        if not task.actions or task.name in self.started:
            return
        now = time.monotonic()
        self.started[task.name] = self.running[task.name] = now
        self.first_start = self.first_start or now
        self.ran.append({"task": task.name, "why": reasons(task)})
        if self.live:
            self._live(self._status())

    def add_success(self, task):
        if task.name not in self.started:
            return
        if task.values.get("recompiled"):
            self.recompiled[task.name] = task.values["recompiled"]
        for warning in task.values.get("warnings", ()):
            if warning not in self.warned:
                self.warned.append(warning)
                self.write(warning + "\n")
        if task.values.get("cache"):
            self._finish(task, "restored", f"restored from cache ({task.values['cache']})")
        elif task.values.get("compiled") == "cluster":
            self._finish(task, "ok", "computed on the cluster")
        else:
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
        self.stop.set()
        if self.live:
            self._live("")
        summary = self._summary()
        for line in summary["lines"]:
            self.write(line + "\n")
        if self.record:
            record = json.dumps(
                {"executed": self.ran, "failed": self.failed, "entries": summary["entries"],
                 "how": summary["how"], "warnings": self.warned,
                 "wall_s": round(time.monotonic() - self.t0, 3)}, indent=1).encode()
            atomic_write(REPORT, record)
            if any(i["task"].partition(":")[0] in BUILD_STAGES for i in self.ran):
                atomic_write(LAST_BUILD, record)
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

    def _finish(self, task, status: str, how: str = "computed"):
        end = time.monotonic()
        seconds = end - self.started[task.name]
        self.running.pop(task.name, None)
        self.finished += 1
        self._count(task)
        for item in reversed(self.ran):
            if item["task"] == task.name:
                item.update(status=status, how=how, seconds=round(seconds, 3),
                            start=round(self.started[task.name] - self.t0, 3),
                            end=round(end - self.t0, 3),
                            worker=task.values.get("worker", os.getpid()))
                why = "; ".join(item["why"][:2]) + (" ..." if len(item["why"]) > 2 else "")
                if task.values.get("note"):  # e.g. a kernel compiled by a fallback
                    item["note"] = task.values["note"]
                if task.values.get("passes"):
                    item["passes"] = task.values["passes"]
                break
        if self.live:
            self._live(self._status())
        else:
            shown = status if how == "computed" else how
            self.write(f"{self._progress()} {self._title(task)} {shown} {seconds:.2f} s"
                       f"  ({why})\n")
        if task.values.get("note"):
            self.write(f"  note: {task.values['note']}\n")

    def _progress(self) -> str:
        total = self.done + len(self.pending)
        width = len(str(total))
        return f"[{self.done:>{width}}/{total}]"

    def _eta(self) -> str:
        """Remaining tasks at the rate tasks have finished so far (so it counts the
        workers of -n): shown once a few tasks have finished."""
        if self.finished < 3 or self.first_start is None:
            return ""
        rate = self.finished / max(time.monotonic() - self.first_start, 1e-3)
        left = round(len(self.pending) / rate)
        return f" ETA {left // 60}:{left % 60:02d}"

    def _status(self) -> str:
        """The live line: progress, ETA, the tasks running now and for how long."""
        now = time.monotonic()
        running = sorted(self.running.items(), key=lambda kv: kv[1])
        shown = ", ".join(" ".join(self._title(self.tasks[n]).split()) + f" {now - t:.0f}s"
                          for n, t in running[:3])
        more = f" (+{len(running) - 3})" if len(running) > 3 else ""
        return f"{self._progress()}{self._eta()} | {shown or 'checking'}{more}"

    def _tick(self) -> None:
        """Redraw the live line every second: the ETA and running times move even
        while one long task (a big kernel) holds the build."""
        while not self.stop.wait(1.0):
            self._live(self._status())

    @staticmethod
    def _title(task) -> str:
        stage, _, sub = task.name.partition(":")
        if stage == "kernel" and task.doc:
            sub = task.doc  # the kernel's symbol reads better than its bare hash
        return f"{stage:<8} {sub}"

    def write(self, text: str):
        with self.lock:  # a whole line, over the live line if there is one
            self.outstream.write(("\r\x1b[2K" if self.live else "") + text)

    def _live(self, text: str):
        with self.lock:
            if self.stop.is_set() and text:
                return
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
        how = count_how(self.ran)
        if how:
            lines.append(how_line(how))
        return {"entries": entries, "lines": lines, "how": how}


def count_how(ran: list[dict]) -> dict[str, int]:
    """Tasks run, counted by how they got their outputs ("computed", ...)."""
    how: dict[str, int] = {}
    for item in ran:
        if item.get("status") in ("ok", "restored", "reused"):
            how[item["how"]] = how.get(item["how"], 0) + 1
    return dict(sorted(how.items()))


def how_line(how: dict[str, int]) -> str:
    return "tasks: " + ", ".join(f"{n} {what}" for what, n in how.items())


def print_report(path: str = REPORT, stream=sys.stdout) -> None:
    """`doit explain`: the last build's reasons and summary, human readable."""
    if not os.path.exists(path):
        stream.write(f"{path}: no build report yet; run `doit build` first\n")
        return
    report = json.loads(open(path).read())
    if not report["executed"]:
        stream.write("The last build ran no task: everything was up to date.\n")
    for item in report["executed"]:
        stream.write(f"{item['task']}  [{item.get('how', item.get('status', '?'))}, "
                     f"{item.get('seconds', 0):.2f} s]\n")
        for why in item["why"]:
            stream.write(f"    because {why}\n")
    for entry, s in report["entries"].items():
        stream.write(f"{entry}: {s['kernels']} kernels ({s['compiled']} compiled, "
                     f"{s['reused']} reused), {s['seconds']:.1f} s of work\n")
    if report.get("how"):
        stream.write(how_line(report["how"]) + "\n")
    for warning in report.get("warnings", ()):
        stream.write(warning + "\n")
    stream.write(f"wall time {report['wall_s']:.1f} s\n")
