"""One server per session: launched from a preset, or connected to by URL; started lazily, once.

A launch that fails is remembered, so every later perf test is told "the server failed to start"
in one line instead of launching (and timing out) again; the first failure carries the command
and the log tail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.servers.engine_presets import (
    EngineNotFound,
    LaunchSpec,
    PresetError,
    build_launch,
    engine_preset,
    read_version,
)
from pytest_llmperf.servers.process import ProcessReaper, ServerProcess, ServerStartError, free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence


class ServerUnavailable(LLMPerfError, RuntimeError):
    """The session's server could not be started or reached; the message says why."""


@dataclass
class ServerInfo:
    """What the tests and the fingerprint need to know about the server under test."""

    preset: str
    base_url: str
    root_url: str
    model: str
    launched: bool
    startup_s: float | None = None
    version: str | None = None
    log_path: Path | None = None
    metrics_url: str | None = None
    reset_cache_url: str | None = None
    sim_preset: str | None = None
    sim_args: list[str] = field(default_factory=list)
    length_fields: Callable[[int, bool, int | None], dict[str, object]] | None = None
    # The engine's way of selecting a LoRA adapter per request (EnginePreset.adapter_fields), and
    # where it lists the adapters it loaded (llama-server's /lora-adapters; None: not needed).
    adapter_fields: Callable[[str, Sequence[Mapping[str, object]] | None], dict[str, object]] | None = None
    adapters_url: str | None = None
    process: ServerProcess | None = None

    def alive(self) -> bool:
        return self.process.alive() if self.process is not None else True

    def describe(self) -> str:
        how = f"launched in {self.startup_s:.1f} s" if self.launched and self.startup_s is not None else "connected"
        version = f" {self.version}" if self.version else ""
        return f"{self.preset}{version} serving {self.model} at {self.base_url} ({how})"


@dataclass
class ServerConfig:
    preset: str = "sim"
    url: str | None = None
    model: str | None = None
    command: str | None = None
    server_args: list[str] = field(default_factory=list)
    sim_preset: str | None = None
    sim_args: list[str] = field(default_factory=list)
    health_path: str | None = None
    api_key: str | None = None
    startup_timeout_s: float = 600.0
    log_dir: Path = Path(".llmperf/report")
    # Which server this is when a session has two (A/B mode: "candidate", "reference"); it names
    # the log files and the messages.
    label: str | None = None


class ServerManager:
    """Starts (or connects to) the server on first use and stops it at the end of the session."""

    def __init__(self, config: ServerConfig, reaper: ProcessReaper | None = None) -> None:
        self.config = config
        self.reaper = reaper
        self._info: ServerInfo | None = None
        self._failure: str | None = None
        self._failures_reported = 0
        self.launch_times_s: list[float] = []  # startup time of every launch, in order

    @property
    def info(self) -> ServerInfo | None:
        return self._info

    def get(self) -> ServerInfo:
        if self._info is not None:
            if not self._info.alive():
                code = self._info.process.exited_code() if self._info.process else None
                raise ServerUnavailable(
                    f"the {self._info.preset} server is gone (exited with code {code}); "
                    f"see its log {self._info.log_path}"
                )
            return self._info
        if self._failure is not None:
            self._failures_reported += 1
            raise ServerUnavailable(f"server failed to start earlier in this session: {self._failure.splitlines()[0]}")
        try:
            self._info = self._connect() if self.config.url else self._launch()
        except (ServerStartError, EngineNotFound, PresetError, ServerUnavailable) as exc:
            self._failure = str(exc)
            raise ServerUnavailable(Exception.__str__(exc), remedy=exc.remedy, option=exc.option) from None
        if self._info.startup_s is not None:
            self.launch_times_s.append(self._info.startup_s)
        return self._info

    @property
    def launches(self) -> bool:
        """Whether this manager launches its server (rather than connecting to a URL)."""
        return not self.config.url

    @property
    def running(self) -> bool:
        return self._info is not None and self._info.process is not None and self._info.process.alive()

    def relaunch(self) -> ServerInfo:
        """Stop the launched server (if running) and launch a fresh one: each launch draws its own
        start-up state, as each CI job's does. ``info`` keeps the last server until then."""
        self.stop()
        self._info = None
        return self.get()

    def stop(self) -> None:
        if self._info is not None and self._info.process is not None:
            self._info.process.stop()
            if self.reaper is not None:
                self.reaper.untrack(self._info.process)

    # ------------------------------------------------------------------ connect

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    def _scrub(self, text: str) -> str:
        # Gateways echo request headers in error bodies; the key must not reach the terminal.
        key = self.config.api_key
        return text.replace(key, "***") if key else text

    def _connect(self) -> ServerInfo:
        base = self.config.url.rstrip("/")  # type: ignore[union-attr]
        root = base[: -len("/v1")] if base.endswith("/v1") else base
        try:
            resp = httpx.get(base + "/models", headers=self._headers(), timeout=10.0, trust_env=False)
        except httpx.HTTPError as exc:
            raise ServerUnavailable(
                f"cannot reach {base}/models: {type(exc).__name__}: {self._scrub(str(exc))}",
                remedy="is the server running and is {flag} the OpenAI base URL (ending in /v1)?", option="url",
            ) from None
        if resp.status_code != 200:
            auth = resp.status_code in (401, 403)
            raise ServerUnavailable(
                f"{base}/models answered HTTP {resp.status_code}: {self._scrub(resp.text)[:200]}",
                remedy="check the key in {flag}" if auth else None, option="api-key-env" if auth else None,
            )
        model = self._pick_model(_model_ids(resp), base)
        preset = self.config.preset if self.config.preset != "sim" else "openai"
        return ServerInfo(
            preset=preset, base_url=base, root_url=root, model=model, launched=False,
            metrics_url=root + "/metrics",
            version=_version_or_none(self.config.preset, root),
        )

    def _pick_model(self, served: list[str], where: str) -> str:
        if self.config.model:
            if served and self.config.model not in served:
                raise ServerUnavailable(
                    f"model {self.config.model!r} is not served at {where}; it serves: {', '.join(served)}"
                )
            return self.config.model
        if not served:
            raise ServerUnavailable(f"{where}/models lists no model", remedy="pass {flag}", option="model")
        return served[0]

    # ------------------------------------------------------------------ launch

    def _launch(self) -> ServerInfo:
        cfg = self.config
        port = free_port("127.0.0.1")
        spec: LaunchSpec = build_launch(
            cfg.preset,
            model=cfg.model,
            host="127.0.0.1",
            port=port,
            extra_args=cfg.server_args,
            sim_preset=cfg.sim_preset if cfg.preset == "sim" else None,
            sim_args=cfg.sim_args if cfg.preset == "sim" else None,
            command=cfg.command if cfg.preset == "command" else None,
            health_path=cfg.health_path,
            # e.g. vLLM serves /reset_prefix_cache only in dev mode; the plugin resets between trials
            env=dict(engine_preset(cfg.preset).reset_cache_env),
        )
        cfg.log_dir.mkdir(parents=True, exist_ok=True)
        side = f"{cfg.label}-" if cfg.label else ""
        # Relaunched servers (A/B blocks) start within the same second: number them.
        n = f"-{len(self.launch_times_s) + 1}" if self.launch_times_s else ""
        log_path = cfg.log_dir / f"server-{side}{cfg.preset}-{time.strftime('%Y%m%d-%H%M%S')}{n}.log"
        process = spec.server_process(log_path, startup_timeout_s=cfg.startup_timeout_s)
        if cfg.api_key:
            process.secrets.add(cfg.api_key)
            process.probe_api_key = cfg.api_key
        if self.reaper is not None:
            self.reaper.start(process)
        else:
            process.start()
        model = self._pick_model(process.served_models, spec.base_url)
        preset = spec.preset
        return ServerInfo(
            preset=cfg.preset,
            base_url=spec.base_url,
            root_url=spec.root_url,
            model=model,
            launched=True,
            startup_s=process.startup_s,
            version=_version_or_none(preset, spec.root_url, spec.executable),
            log_path=log_path,
            metrics_url=spec.metrics_url,
            reset_cache_url=spec.reset_cache_url,
            sim_preset=cfg.sim_preset if cfg.preset == "sim" else None,
            sim_args=list(cfg.sim_args) if cfg.preset == "sim" else [],
            length_fields=preset.length_fields,  # a bound method: picklable for worker processes
            adapter_fields=preset.adapter_fields,
            adapters_url=spec.adapters_url,
            process=process,
        )


def answers(root_url: str) -> bool:
    """Whether anything answers HTTP at ``root_url`` (any status: a dying engine's 503 counts)."""
    try:
        httpx.get(root_url + "/health", timeout=2.0, trust_env=False)
    except httpx.TransportError:
        return False
    return True


def _version_or_none(preset: Any, root: str, executable: str | None = None) -> str | None:
    try:
        return read_version(preset, root, executable)
    except Exception:
        return None


def _model_ids(resp: httpx.Response) -> list[str]:
    try:
        data = resp.json().get("data", [])
        return [m["id"] for m in data if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError):
        return []
