"""A headless Chromium driven through the Chrome DevTools protocol, for the dashboard's browser tests.

The browser is the machine's own: Debian's ``chromium`` here (``apt-get install chromium``, which
scripts/test.sh does when none is found), the Google Chrome GitHub's runners ship, or
``$LLMPERF_BROWSER``; nothing is downloaded. It runs with the flags that keep it off the network
(no first-run, component updates, sync or background fetches) in a throwaway profile, and is
spoken to over its DevTools websocket with websocket-client: load a page, evaluate JavaScript in
it, collect console errors and uncaught exceptions, take a screenshot.

Without a browser the tests that need one skip, saying how to install it; with
``LLMPERF_REQUIRE_BROWSER=1`` (scripts/test.sh) they fail instead, as the real-engine tests do.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

CANDIDATES = ("chromium", "google-chrome", "google-chrome-stable", "chromium-browser", "chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-port=0")
REQUIRED = os.environ.get("LLMPERF_REQUIRE_BROWSER", "") not in ("", "0")


def find_browser() -> str | None:
    given = os.environ.get("LLMPERF_BROWSER")
    if given:
        return given if Path(given).is_file() or shutil.which(given) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"LLMPERF_REQUIRE_BROWSER is set but {reason}", pytrace=False)
    pytest.skip(reason)


class DevToolsError(Exception):
    """The browser answered a command with an error, or did not answer in time."""


class Browser:
    """One headless browser process and one page (a DevTools target) in it."""

    def __init__(self, executable: str, *, width: int = 1400, height: int = 900, timeout: float = 60.0) -> None:
        import websocket

        self.profile = tempfile.mkdtemp(prefix="llmperf-chromium-")
        self.timeout = timeout
        self.proc = subprocess.Popen([executable, *FLAGS, f"--user-data-dir={self.profile}",
                                      f"--window-size={width},{height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = self._devtools_url()
        self.ws = websocket.create_connection(url, timeout=timeout, suppress_origin=True, enable_multithread=False)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=True)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=True)

    def _devtools_url(self) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + self.timeout
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line)
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                # Keep reading stderr in the background: a full pipe would block the browser.
                import threading

                threading.Thread(target=self._drain, daemon=True).start()
                return m.group(1)
        self.close()
        raise DevToolsError("the browser did not start its DevTools server: " + "".join(seen[-10:]))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        with contextlib.suppress(ValueError, OSError):
            for _ in self.proc.stderr:
                pass

    # ------------------------------------------------------------------ protocol

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False) -> dict[str, Any]:
        msg_id = next(self.ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                return dict(reply.get("result") or {})
            self.events.append(reply)
        raise DevToolsError(f"{method}: no answer in {self.timeout:g} s")

    def wait_event(self, method: str, after: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for event in self.events[after:]:
                if event.get("method") == method:
                    return event
            self.events.append(json.loads(self.ws.recv()))
        raise DevToolsError(f"no {method} in {self.timeout:g} s")

    # ------------------------------------------------------------------ pages

    def goto(self, url: str) -> float:
        """Load ``url`` and wait for its load event and for every plotly chart on it to be drawn;
        return the seconds that took."""
        start = time.monotonic()
        mark = len(self.events)
        self.send("Page.navigate", {"url": url}, session=True)
        self.wait_event("Page.loadEventFired", after=mark)
        self.eval("""new Promise((resolve) => {
            const plots = () => Array.from(document.querySelectorAll('.plotly-graph-div'));
            const ready = () => plots().every((gd) => gd._fullLayout && gd.querySelector('.main-svg'));
            const tick = () => ready() ? resolve(true) : setTimeout(tick, 20);
            tick(); })""", await_promise=True)
        return time.monotonic() - start

    def eval(self, expression: str, *, await_promise: bool = False) -> Any:
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "awaitPromise": await_promise}, session=True)
        if "exceptionDetails" in reply:
            raise DevToolsError(f"{expression[:80]}...: {reply['exceptionDetails']}")
        return reply.get("result", {}).get("value")

    def errors(self) -> list[str]:
        """Console errors, failed resource loads and uncaught exceptions of the pages loaded so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params") or {}
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                found.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console." + params["type"] + ": "
                             + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                found.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
        return found

    def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            size = self.eval("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
        data = self.send("Page.captureScreenshot", params, session=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close")
        with contextlib.suppress(Exception):
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


@contextlib.contextmanager
def browser(**kwargs: Any):
    executable = find_browser()
    if executable is None:
        missing("no Chromium or Chrome found (apt-get install chromium, or set LLMPERF_BROWSER to one)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        missing("websocket-client is not installed (pip install 'pytest-llmperf[dev]')")
    assert executable is not None
    b = Browser(executable, **kwargs)
    try:
        yield b
    finally:
        b.close()
