"""The remote tier of the action cache: Bazel's HTTP remote-cache protocol.

    GET/PUT <base>/ac/<key>        the action's manifest (pipeline.tasks.action_cache)
    GET/PUT <base>/cas/<sha256>    an output's bytes
so any server speaking it works: bazel-remote, nginx with WebDAV PUT, a bucket
behind such a gateway. 404 is a miss. Every request has a bounded timeout.

Faults never fail a build: the first unreachable, refusing or slow answer
turns the tier off for the rest of this process and leaves one warning (the
reporter prints each distinct warning once); a refused upload turns off
uploads only. A downloaded blob whose sha256 is not its name is a miss, and
is reported.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.parse
from dataclasses import dataclass, field


class RemoteDown(Exception):
    """The server did not answer usefully (refused, timed out, 5xx)."""


@dataclass
class HttpCache:
    base: str
    timeout: float = 10.0
    upload: bool = True
    warnings: list[str] = field(default_factory=list)  # drained by the caller
    down: bool = False
    # One kept-alive connection per process (a forked `doit -n` worker opens its
    # own): a fresh-clone build asks a few hundred times, and a connect per
    # request (a TLS handshake on a real server) would cost more than the bytes.
    _conn: tuple[int, http.client.HTTPConnection] | None = field(default=None, repr=False)

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None or self._conn[0] != os.getpid():
            url = urllib.parse.urlsplit(self.base)
            kind = (http.client.HTTPSConnection if url.scheme == "https"
                    else http.client.HTTPConnection)
            self._conn = (os.getpid(), kind(url.hostname, url.port, timeout=self.timeout))
        return self._conn[1]

    def _request(self, method: str, kind: str, name: str, data: bytes | None = None):
        path = f"{urllib.parse.urlsplit(self.base).path.rstrip('/')}/{kind}/{name}"
        headers = {"Content-Type": "application/octet-stream"} if data is not None else {}
        for attempt in (1, 2):  # the server may have closed the idle connection
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError,
                    BrokenPipeError) as err:
                conn.close()
                self._conn = None
                if attempt == 2:
                    raise RemoteDown(f"{method} {self.base}/{kind}/{name}: "
                                     f"{type(err).__name__}: {err}") from None
            except (http.client.HTTPException, OSError) as err:  # timeouts are OSErrors
                conn.close()
                self._conn = None
                raise RemoteDown(f"{method} {self.base}/{kind}/{name}: "
                                 f"{type(err).__name__}: {err}") from None
        if resp.status >= 500:
            raise RemoteDown(f"{method} {self.base}/{kind}/{name}: HTTP {resp.status}")
        return resp.status, body if method == "GET" else b""

    def _off(self, err: Exception) -> None:
        self.down = True
        self.warnings.append(f"warning: remote cache {self.base} unusable ({err}); "
                             "building locally without it")

    def get(self, kind: str, name: str) -> bytes | None:
        """The bytes under <base>/<kind>/<name>, or None on a miss or a fault."""
        if self.down:
            return None
        try:
            status, body = self._request("GET", kind, name)
        except RemoteDown as err:
            self._off(err)
            return None
        return body if status == 200 else None

    def get_blob(self, digest: str) -> bytes | None:
        """A verified blob, or None (a blob that does not hash to its name is reported)."""
        data = self.get("cas", digest)
        if data is not None and hashlib.sha256(data).hexdigest() != digest:
            self.warnings.append(f"warning: remote cache {self.base}: cas/{digest} is "
                                 f"corrupted ({len(data)} bytes, wrong digest); ignored")
            return None
        return data

    def has(self, kind: str, name: str) -> bool:
        if self.down:
            return False
        try:
            return self._request("HEAD", kind, name)[0] == 200
        except RemoteDown as err:
            self._off(err)
            return False

    def put(self, kind: str, name: str, data: bytes) -> bool:
        """Upload; False if not done (read-only, down, or refused)."""
        if self.down or not self.upload:
            return False
        try:
            status, _ = self._request("PUT", kind, name, data)
        except RemoteDown as err:
            self._off(err)
            return False
        if status not in (200, 201, 204):
            self.upload = False
            self.warnings.append(f"warning: remote cache {self.base} refused an upload "
                                 f"(PUT {kind}/{name}: HTTP {status}); not uploading more")
            return False
        return True
