"""Load a page in headless Chromium and report what a user would see: console
messages, errors, network requests and a screenshot.

Speaks the DevTools protocol over `--remote-debugging-pipe` (JSON messages
separated by NUL bytes on file descriptors 3 and 4), so it needs no websocket
library. Skipped without `chromium`, a failure under CI=true (tests/support/toolchains.py).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from tests.support.toolchains import require_tools


@dataclass
class PageLoad:
    console: list[str] = field(default_factory=list)   # "level: text" of every message
    errors: list[str] = field(default_factory=list)    # console errors, exceptions, log errors
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    screenshot: bytes = b""                            # PNG


class _Pipe:
    def __init__(self, proc, to_browser: int, from_browser: int):
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.buf, self.next_id, self.events = b"", 0, []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.inp], [], [], left)[0]:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self.inp, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for k, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(k)
            self.events.append(self._read_message(deadline))


def load_page(url: str, width: int = 1400, height: int = 2000) -> PageLoad:
    """Open `url` in a fresh headless Chromium, wait for its load event, then collect
    the console, errors and requests, and a `width` x `height` screenshot."""
    require_tools("chromium")
    a_read, a_write = os.pipe()  # we write commands -> chromium's fd 3
    b_read, b_write = os.pipe()  # chromium's fd 4 -> we read replies
    profile = tempfile.mkdtemp(prefix="chromium-")

    def child_fds():
        """Chromium's ends as fds 3 and 4 of the child (dup2 makes them inheritable;
        through fds >= 10 first, so neither end is overwritten by the other)."""
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (a_read, b_write)]
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)

    proc = subprocess.Popen(
        [shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
         "--remote-debugging-pipe", f"--user-data-dir={profile}", "--no-first-run",
         "--disable-extensions", "--disable-background-networking", "about:blank"],
        close_fds=False, preexec_fn=child_fds,  # noqa: PLW1509 - a test, one thread
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(a_read)
    os.close(b_write)
    pipe = _Pipe(proc, a_write, b_read)
    load = PageLoad()
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1,
                   "mobile": False}, session=session)
        pipe.send("Page.navigate", {"url": url}, session=session)
        pipe.wait_event("Page.loadEventFired")
        shot = pipe.send("Page.captureScreenshot", {"format": "png"}, session=session)
        load.screenshot = base64.b64decode(shot["data"])
        for e in pipe.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
                load.console.append(f"{p['type']}: {text}")
                if p["type"] in ("error", "assert"):
                    load.errors.append(text)
            elif e.get("method") == "Runtime.exceptionThrown":
                detail = p["exceptionDetails"]
                load.errors.append(detail.get("exception", {}).get("description")
                                   or detail.get("text", "exception"))
            elif e.get("method") == "Log.entryAdded":
                load.console.append(f"{p['entry']['level']}: {p['entry']['text']}")
                if p["entry"]["level"] == "error":
                    load.errors.append(p["entry"]["text"])
            elif e.get("method") == "Network.requestWillBeSent":
                load.requests.append(p["request"]["url"])
            elif e.get("method") == "Network.loadingFailed":
                load.errors.append(f"failed to load: {p.get('errorText')}")
        try:
            pipe.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError):
            pass
    finally:
        os.close(a_write)
        os.close(b_read)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    return load
