"""Launching an inference server as a subprocess, waiting until it is ready, and tearing it down.

Every server runs in its own session (so its own process group): engines spawn workers
(tensor-parallel ranks, tokenizer processes, detokenizers) that would outlive a plain
``terminate()`` of the leader and keep holding GPU memory. Teardown therefore signals the whole
group: SIGTERM, a grace period, then SIGKILL.

This module knows nothing about pytest: the plugin wraps :class:`ServerProcess` in fixtures and
owns one :class:`ProcessReaper` so that Ctrl-C, SIGTERM and interpreter exit also stop servers.
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.signals import chain

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from types import FrameType

LOG_TAIL_LINES = 30

# Environment variable names whose values must never appear in an error message.
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# Command-line flags whose following value is a secret (engines accept API keys and HF tokens).
_SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--api-token", "--password")
# Shorter values are too likely to collide with ordinary text ("1", "true") to be worth masking.
_MIN_SECRET_LEN = 4
_MASK = "***"

# Readiness polling: start fast (a simulator is up in well under a second), back off to spare a
# slow engine's event loop from probe traffic while it loads weights for minutes.
_FIRST_DELAY_S = 0.05
_MAX_DELAY_S = 1.0
_BACKOFF = 1.5
_PROBE_TIMEOUT_S = 2.0


class ServerStartError(LLMPerfError, RuntimeError):
    """The server could not be started or did not become ready; the message says why and shows
    the command, the log path and the end of the log."""

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        command: str = "",
        log_path: Path | None = None,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.command = command
        self.log_path = log_path
        self.exit_code = exit_code


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it; another process may still
    take it before the server binds, which the startup error then reports)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _secret_values(env: Mapping[str, str] | None, extra: Iterable[str] = ()) -> list[str]:
    """Values of secret-looking variables (in ``os.environ`` and ``env``) plus ``extra``, longest
    first so a secret containing another secret is masked whole."""
    secrets = {value for value in extra if value and len(value) >= _MIN_SECRET_LEN}
    for source in (os.environ, env or {}):
        for name, value in source.items():
            if _SECRET_NAME.search(name) and value and len(value) >= _MIN_SECRET_LEN:
                secrets.add(value)
    return sorted(secrets, key=len, reverse=True)


def scrub_command(command: Iterable[str], env: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> str:
    """Shell-quoted command with secret values (from secret-looking env names, ``extra``, and the
    values of flags like ``--api-key``) replaced by ``***``."""
    secrets = _secret_values(env, extra)
    parts: list[str] = []
    mask_next = False
    for arg in command:
        arg = str(arg)
        if mask_next:
            arg, mask_next = _MASK, False
        elif arg in _SECRET_FLAGS:
            mask_next = True
        else:
            flag, eq, _value = arg.partition("=")
            if eq and flag in _SECRET_FLAGS:
                arg = f"{flag}={_MASK}"
        for secret in secrets:
            arg = arg.replace(secret, _MASK)
        parts.append(arg)
    return shlex.join(parts)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {_signal_name(-code)}"
    return f"exited with code {code}"


def _group_has_live_members(pgid: int) -> bool:
    """Whether any non-zombie process is left in the group.

    ``killpg(pgid, 0)`` alone is not enough: orphaned children are reparented to PID 1, which in a
    container is often not a real init and never reaps them, so zombies would keep the group
    "alive" forever. On Linux, /proc tells zombies apart.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


class AlreadyStarted(LLMPerfError, RuntimeError):
    """:meth:`ServerProcess.start` called on a process that was started (or stopped) before."""


class ServerProcess:
    """One server subprocess in its own process group, with readiness polling and teardown.

    ``env`` is merged over ``os.environ``. ``models_url``, when given, must also answer 200 before
    the server counts as ready (some engines answer ``/health`` before the model is served); the
    ids it lists are kept in :attr:`served_models`.
    """

    def __init__(
        self,
        command: list[str],
        *,
        health_url: str,
        models_url: str | None,
        log_path: Path,
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 600,
        grace_s: float = 10,
        cwd: str | os.PathLike[str] | None = None,
        hint: str | None = None,
    ) -> None:
        if not command:
            raise InputError("ServerProcess: command is empty; give the program and its arguments")
        if startup_timeout_s <= 0:
            raise InputError(f"ServerProcess: startup_timeout_s must be > 0, got {startup_timeout_s}")
        if grace_s < 0:
            raise InputError(f"ServerProcess: grace_s must be >= 0, got {grace_s}")
        self.command = [str(arg) for arg in command]
        self.health_url = health_url
        self.models_url = models_url
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.startup_timeout_s = float(startup_timeout_s)
        self.grace_s = float(grace_s)
        self.cwd = cwd
        # One line of what to check, added after the log tail when the server fails to start.
        self.hint = hint
        self.startup_s: float | None = None
        # Sent as a bearer token by the readiness probe; never printed (it is also in `secrets`).
        self.probe_api_key: str | None = None
        self.served_models: list[str] = []
        # Secrets not recognisable by their variable's name (e.g. the client's API key), masked in
        # the command and in log tails like those that are.
        self.secrets: set[str] = set()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._returncode: int | None = None
        self._stopped = False
        self._stopping = False
        self._lock = threading.RLock()

    # -- identity and state ---------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def pgid(self) -> int | None:
        return self._pgid

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (it will not start again)."""
        return self._stopped

    @property
    def display_command(self) -> str:
        return scrub_command(self.command, self.env, self.secrets)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exited_code(self) -> int | None:
        """The leader's exit status (negative: killed by that signal), None while running."""
        if self._proc is not None and self._returncode is None:
            self._returncode = self._proc.poll()
        return self._returncode

    def log_tail(self, n: int = LOG_TAIL_LINES) -> list[str]:
        """The last ``n`` lines of the server log (read from the end: logs of long runs are big),
        secrets masked: these lines end up in error messages, and engines log their arguments."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 256 * 1024))
                data = fh.read()
        except OSError:
            return []
        lines = data.decode("utf-8", errors="replace").splitlines()[-n:] if n > 0 else []
        secrets = _secret_values(self.env, self.secrets)
        for secret in secrets:
            lines = [line.replace(secret, _MASK) for line in lines]
        return lines

    # -- start ----------------------------------------------------------------------------------

    def start(self) -> ServerProcess:
        """Launch the command and block until it is ready; raise :class:`ServerStartError` if it
        exits, is not ready in ``startup_timeout_s`` or cannot be executed. Any exception
        (KeyboardInterrupt included) kills the process group before propagating."""
        with self._lock:
            if self._proc is not None or self._stopped:
                raise AlreadyStarted(f"ServerProcess already started: {self.display_command}")
            self._launch()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        with open(self.log_path, "w", buffering=1, encoding="utf-8") as log:
            log.write(f"# llmperf: launching {self.display_command}\n")
            log.flush()
            self._t_launch = time.monotonic()
            try:
                # The child keeps its own copy of the log descriptor; ours is closed on exit.
                self._proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            except FileNotFoundError as exc:
                self._stopped = True
                missing = self.command[0]
                if self.cwd is not None and not Path(self.cwd).is_dir():
                    reason = f"working directory {str(self.cwd)!r} does not exist"
                else:
                    reason = (
                        f"command not found: {missing!r}; it must be installed and on PATH "
                        "(or given as a full path)"
                    )
                raise self._error(reason) from exc
            except PermissionError as exc:
                self._stopped = True
                raise self._error(f"{self.command[0]!r} is not executable ({exc.strerror})") from exc
        try:
            self._pgid = os.getpgid(self._proc.pid)
        except ProcessLookupError:
            # Already gone; with start_new_session the group id is the leader's pid.
            self._pgid = self._proc.pid

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = self._t_launch + self.startup_timeout_s
        delay = _FIRST_DELAY_S
        last_probe = "no probe yet"
        pending = [url for url in (self.health_url, self.models_url) if url]
        # trust_env=False: a proxy from the environment must not intercept loopback probes.
        with httpx.Client(trust_env=False, follow_redirects=True) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    self._returncode = code
                    raise self._error(f"the server {_describe_exit(code)} during startup", exit_code=code)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._error(
                        f"not ready after {self.startup_timeout_s:g} s "
                        f"(waiting for {pending[0]}; last probe: {last_probe})"
                    )
                url = pending[0]
                try:
                    # An engine started with --api-key guards /v1/models too: probe with the key.
                    headers = {"Authorization": f"Bearer {self.probe_api_key}"} if self.probe_api_key else None
                    resp = client.get(url, timeout=min(_PROBE_TIMEOUT_S, max(remaining, 0.05)), headers=headers)
                    last_probe = f"HTTP {resp.status_code}"
                    if resp.status_code == 200:
                        if url == self.models_url:
                            self.served_models = _model_ids(resp)
                        pending.pop(0)
                        if not pending:
                            self.startup_s = time.monotonic() - self._t_launch
                            return
                        continue
                except httpx.TransportError as exc:
                    last_probe = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                # Waiting on the process (not sleeping) notices an early exit immediately.
                try:
                    self._proc.wait(timeout=min(delay, max(deadline - time.monotonic(), 0.01)))
                except subprocess.TimeoutExpired:
                    pass
                delay = min(delay * _BACKOFF, _MAX_DELAY_S)

    def _error(self, reason: str, exit_code: int | None = None) -> ServerStartError:
        tail = self.log_tail(LOG_TAIL_LINES)
        lines = [
            f"inference server failed to start: {reason}",
            f"  command: {self.display_command}",
            f"  log: {self.log_path}",
        ]
        if tail:
            lines.append(f"  last {len(tail)} lines of the log:")
            lines.extend(f"    | {line}" for line in tail)
        else:
            lines.append("  (the log is empty)")
        if self.hint:
            lines.append(f"  what to check: {self.hint}")
        return ServerStartError(
            "\n".join(lines),
            reason=reason,
            command=self.display_command,
            log_path=self.log_path,
            exit_code=exit_code,
        )

    # -- stop -----------------------------------------------------------------------------------

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM the whole group, wait ``grace_s``, SIGKILL what is left. Idempotent; returns
        the leader's exit status. Re-entered while already stopping (a second Ctrl-C), it
        escalates to SIGKILL at once."""
        if self._stopping:
            self.kill()
            return self.exited_code()
        with self._lock:
            if self._stopped or self._proc is None:
                self._stopped = True
                return self.exited_code()
            self._stopping = True
            try:
                grace = self.grace_s if grace_s is None else grace_s
                self._signal_group(signal.SIGTERM)
                deadline = time.monotonic() + grace
                try:
                    self._proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass
                # The leader may be gone while its workers still shut down; give them the rest.
                while _group_has_live_members(self._pgid_or_pid()) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if _group_has_live_members(self._pgid_or_pid()):
                    self.kill()
                self._returncode = self._proc.wait()
                self._stopped = True
            finally:
                self._stopping = False
        return self._returncode

    def kill(self) -> None:
        """SIGKILL the whole group now and wait briefly for it to vanish."""
        if self._proc is None:
            return
        self._signal_group(signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while _group_has_live_members(self._pgid_or_pid()) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _pgid_or_pid(self) -> int:
        assert self._proc is not None
        return self._pgid if self._pgid is not None else self._proc.pid

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self._pgid_or_pid(), sig)
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServerProcess:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exit={self.exited_code()}"
        return f"ServerProcess(pid={self.pid}, {state}, {self.display_command!r})"


def _model_ids(resp: httpx.Response) -> list[str]:
    try:
        data = resp.json().get("data", [])
        return [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item]
    except (ValueError, AttributeError, TypeError):
        return []


# What signal.getsignal returns: a callable, SIG_DFL/SIG_IGN, or None (set outside Python).
_Handler = Any


class ProcessReaper:
    """Stops tracked servers on SIGINT/SIGTERM and at interpreter exit.

    One instance per owner (the plugin keeps one per session). Signal handlers chain to the
    handlers they replaced: SIGINT still ends in KeyboardInterrupt so pytest reports the
    interruption, and SIGTERM with the default disposition still terminates the process.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self._signals = signals
        self._procs: list[ServerProcess] = []
        self._previous: dict[int, _Handler] = {}
        self._atexit_registered = False
        self._in_handler = False
        self._lock = threading.Lock()

    @property
    def tracked(self) -> list[ServerProcess]:
        with self._lock:
            return list(self._procs)

    def track(self, proc: ServerProcess) -> ServerProcess:
        with self._lock:
            # Drop servers already stopped so a long session does not accumulate them.
            self._procs = [p for p in self._procs if not p.stopped]
            if proc not in self._procs:
                self._procs.append(proc)
        return proc

    def untrack(self, proc: ServerProcess) -> None:
        with self._lock:
            self._procs = [p for p in self._procs if p is not proc]

    def start(self, proc: ServerProcess) -> ServerProcess:
        """Track ``proc`` and then start it, so a signal during startup also reaches it."""
        self.track(proc)
        return proc.start()

    def stop_all(self) -> None:
        """Stop every tracked server, newest first; one failing stop does not spare the others."""
        for proc in reversed(self.tracked):
            try:
                proc.stop()
            except Exception:  # noqa: BLE001 - teardown must reach every server
                proc.kill()

    def install(self) -> bool:
        """Install the signal handlers and the atexit hook. Signal handlers can only be installed
        from the main thread; elsewhere only the atexit hook is registered and False returned."""
        if not self._atexit_registered:
            atexit.register(self.stop_all)
            self._atexit_registered = True
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in self._signals:
            if sig not in self._previous:
                self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._handle)
        return True

    def uninstall(self) -> None:
        """Restore the previous handlers (where ours is still the one installed) and drop the
        atexit hook. Tracked servers are left running."""
        for sig, previous in list(self._previous.items()):
            current = signal.getsignal(sig)
            if current == self._handle:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            del self._previous[sig]
        if self._atexit_registered:
            atexit.unregister(self.stop_all)
            self._atexit_registered = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._in_handler:
            # A second signal while the first is still stopping servers: no more grace.
            for proc in self.tracked:
                proc.kill()
        else:
            self._in_handler = True
            try:
                self.stop_all()
            finally:
                self._in_handler = False
        chain(self._previous.get(signum, signal.SIG_DFL), signum, frame)

