"""Launch presets for inference engines: command line, endpoints, version discovery, the
request fields that pin an output length, and those that select a LoRA adapter.

A preset is data (a frozen :class:`EnginePreset`); :func:`build_launch` turns a preset name plus
model/host/port into a :class:`LaunchSpec` that :class:`~.process.ServerProcess` can run. Nothing
here starts a process except :func:`read_version`'s ``<exe> --version`` fallback.

Fixing the output length matters because a latency test is only comparable across runs when
every request generates the tokens the workload asked for. Engines differ in how (or whether)
they let a client suppress EOS; :meth:`EnginePreset.length_fields` encodes that, and
:attr:`EnginePreset.length_note` says what an engine cannot do.

A LoRA adapter is selected per request, and engines differ there too: vLLM, SGLang and the
simulator take the adapter's name in the ``model`` field (the OpenAI way); llama.cpp's llama-server
ignores ``model`` (it serves one model) and applies the adapters a request lists in its own
``lora`` field by id, the ids its ``GET /lora-adapters`` gives the files it loaded with
``--lora``. :meth:`EnginePreset.adapter_fields` encodes that.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import httpx

from pytest_llmperf.errors import InputError
from pytest_llmperf.servers.installs import VLLM_PYTHON_ENV, find_llama_server, find_vllm_python
from pytest_llmperf.servers.process import ServerProcess, ServerStartError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

# How an engine's OpenAI route is told to generate exactly max_tokens.
LENGTH_IGNORE_EOS_MIN_TOKENS = "ignore_eos+min_tokens"  # vLLM, SGLang, the simulator
LENGTH_IGNORE_EOS = "ignore_eos"  # llama.cpp's llama-server
LENGTH_EOS_LOGIT_BIAS = "eos_logit_bias"  # llama-cpp-python's server: ban EOS via logit_bias
LENGTH_MAX_TOKENS_ONLY = "max_tokens_only"  # no way to suppress EOS: max_tokens is an upper bound
LENGTH_STYLES = (
    LENGTH_IGNORE_EOS_MIN_TOKENS,
    LENGTH_IGNORE_EOS,
    LENGTH_EOS_LOGIT_BIAS,
    LENGTH_MAX_TOKENS_ONLY,
)

# How a request selects a LoRA adapter.
ADAPTER_MODEL_FIELD = "model"  # the adapter's name in the model field: vLLM, SGLang, the simulator
ADAPTER_LORA_IDS = "lora_ids"  # llama-server: "lora": [{"id": k, "scale": 1.0}], k from GET /lora-adapters
ADAPTER_STYLES = (ADAPTER_MODEL_FIELD, ADAPTER_LORA_IDS)

# How a preset's command line is formed.
KIND_TEMPLATE = "template"  # fixed argv template with {python} {model} {host} {port} {hostport}
KIND_SIM = "sim"  # the built-in simulator: adds --preset and simulator arguments
KIND_COMMAND = "command"  # the user's own command line with {model} {host} {port}

COMMAND_PLACEHOLDERS = ("{model}", "{host}", "{port}")
_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
_VERSION_IN_TEXT = re.compile(
    r"(?:version(?:\s+is)?:?\s*)?(v?\d+(?:\.\d+)*[\w.+-]*(?:\s+\([0-9a-fA-F]{6,}\))?)", re.IGNORECASE
)
_VERSION_TIMEOUT_S = 5.0
# llama-cpp-python adds logit_bias to the logits; -100 makes EOS unreachable in practice.
_EOS_BAN_BIAS = -100


class PresetError(InputError):
    """Bad preset name or launch arguments; the message names the problem and the valid choices."""


class UnknownAdapter(PresetError):
    """A workload names a LoRA adapter the server has not loaded; the message lists those it has."""

    def __init__(self, name: str, listed: Sequence[str], where: str, hint: str) -> None:
        have = ", ".join(listed) if listed else "none"
        super().__init__(f"LoRA adapter {name!r} is not loaded on the server: {where} lists {have}; {hint}")
        self.name = name
        self.listed = tuple(listed)


class EngineNotFound(ServerStartError):
    """The engine a preset launches is not installed (or not on PATH)."""

    def __init__(self, preset: str, looked_for: str, install_hint: str) -> None:
        message = (
            f"server preset {preset!r} cannot start: {looked_for}.\n"
            f"  To install it: {install_hint}\n"
            "  Or start the server yourself and point pytest-llmperf at its URL instead of launching one."
        )
        super().__init__(message, reason=looked_for, command="")
        self.preset = preset
        self.looked_for = looked_for
        self.install_hint = install_hint


@dataclass(frozen=True)
class EnginePreset:
    """Everything pytest-llmperf needs to know to launch and talk to one engine.

    ``argv`` is a template (placeholders ``{python}``, ``{model}``, ``{host}``, ``{port}``,
    ``{hostport}``); ``env`` is a tuple of (name, template) pairs. ``executable`` is the program
    looked up on PATH; presets launched as ``python -m`` set ``module`` instead and run with the
    current interpreter.
    """

    name: str
    description: str
    argv: tuple[str, ...] = ()
    kind: str = KIND_TEMPLATE
    variant: str = ""
    executable: str | None = None
    module: str | None = None
    health_path: str = "/health"
    api_base_path: str = "/v1"
    metrics_path: str | None = "/metrics"
    # Endpoint (POST) that empties the prefix cache, for cold-cache runs.
    reset_cache_path: str | None = None
    # Environment the server needs for that endpoint to exist (vLLM hides it behind dev mode).
    reset_cache_env: tuple[tuple[str, str], ...] = ()
    version_paths: tuple[str, ...] = ()
    version_keys: tuple[str, ...] = ("version",)
    # Python distribution whose version identifies the engine when no endpoint says so.
    version_dist: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    # Set only where neither the caller nor the inherited environment sets them (user settings win).
    env_defaults: tuple[tuple[str, str], ...] = ()
    length_style: str = LENGTH_MAX_TOKENS_ONLY
    length_note: str = ""
    adapter_style: str = ADAPTER_MODEL_FIELD
    # Where the server lists the adapters it loaded (GET), for styles that select them by id.
    adapters_path: str | None = None
    needs_model: bool = True
    model_is_path: bool = False
    install_hint: str = ""
    # One line added to a failed start's message, after the engine's log tail: what to check.
    # ``{python}`` is replaced by the interpreter that ran the engine.
    start_hint: str = ""

    def __post_init__(self) -> None:
        if self.length_style not in LENGTH_STYLES:
            raise PresetError(
                f"preset {self.name!r}: unknown length_style {self.length_style!r}; "
                f"valid: {', '.join(LENGTH_STYLES)}"
            )
        if self.adapter_style not in ADAPTER_STYLES:
            raise PresetError(
                f"preset {self.name!r}: unknown adapter_style {self.adapter_style!r}; "
                f"valid: {', '.join(ADAPTER_STYLES)}"
            )
        if self.adapter_style == ADAPTER_LORA_IDS and not self.adapters_path:
            raise PresetError(f"preset {self.name!r}: adapter_style {ADAPTER_LORA_IDS!r} needs adapters_path")

    @property
    def exact_length(self) -> bool:
        """Whether requests can be made to generate exactly ``max_tokens`` tokens."""
        return self.length_style != LENGTH_MAX_TOKENS_ONLY

    def command(
        self,
        *,
        model: str | None,
        host: str,
        port: int,
        extra_args: Sequence[str] = (),
        python: str | None = None,
        sim_preset: str | None = None,
        sim_args: Sequence[str] = (),
        command: str | Sequence[str] | None = None,
    ) -> list[str]:
        """The command line, without checking that anything is installed."""
        values = _values(model=model, host=host, port=port, python=python or sys.executable)
        if self.kind == KIND_COMMAND:
            return [*_user_command(command, values), *extra_args]
        argv = [_fill(token, values) for token in self.argv]
        if self.kind == KIND_SIM:
            head = argv[:3]  # python -m pytest_llmperf.sim
            preset_args = ["--preset", sim_preset] if sim_preset else []
            # A model name given to the simulator is the name it serves (as vLLM's
            # --served-model-name), so a suite written for an engine's model runs on it as is.
            model_args = ["--model", model] if model else []
            return [*head, *preset_args, *argv[3:], *model_args, *sim_args, *extra_args]
        return [*argv, *extra_args]

    def launch_env(self, *, model: str | None, host: str, port: int) -> dict[str, str]:
        values = _values(model=model, host=host, port=port, python=sys.executable)
        return {name: _fill(template, values) for name, template in self.env}

    def length_fields(
        self,
        max_tokens: int,
        ignore_eos: bool,
        min_tokens: int | None,
        eos_token_id: int | None = None,
    ) -> dict[str, object]:
        """Request-body fields that make the engine generate ``max_tokens`` tokens.

        Includes ``max_tokens`` itself so the result can be merged into a body as is. What each
        engine accepts:

        - vLLM, SGLang, simulator: ``ignore_eos`` and ``min_tokens``.
        - llama-server: ``ignore_eos`` (``max_tokens`` maps to ``n_predict``); no ``min_tokens``.
        - llama-cpp-python server: no ``ignore_eos``; EOS is banned with ``logit_bias``, which
          needs ``eos_token_id`` (the model's EOS token id).
        - TGI and Ollama OpenAI routes: no way to suppress EOS (Ollama ignores unknown fields,
          TGI has no such parameter); ``max_tokens`` is only an upper bound.
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise PresetError(f"length_fields: max_tokens must be an integer >= 1, got {max_tokens!r}")
        if min_tokens is not None and not (0 <= min_tokens <= max_tokens):
            raise PresetError(
                f"length_fields: min_tokens must be between 0 and max_tokens ({max_tokens}), "
                f"got {min_tokens!r}"
            )
        fields: dict[str, object] = {"max_tokens": max_tokens}
        style = self.length_style
        if style == LENGTH_IGNORE_EOS_MIN_TOKENS:
            if ignore_eos:
                fields["ignore_eos"] = True
            if min_tokens:
                fields["min_tokens"] = min_tokens
        elif style == LENGTH_IGNORE_EOS:
            if ignore_eos:
                fields["ignore_eos"] = True
        elif style == LENGTH_EOS_LOGIT_BIAS and ignore_eos:
            if eos_token_id is None:
                raise PresetError(
                    f"preset {self.name!r} ({self.variant or self.name}) has no ignore_eos: "
                    "EOS is suppressed with logit_bias, so length_fields needs eos_token_id "
                    "(the model's EOS token id)"
                )
            fields["logit_bias"] = {str(int(eos_token_id)): _EOS_BAN_BIAS}
        return fields


    def adapter_fields(self, name: str, loaded: Sequence[Mapping[str, object]] | None = None) -> dict[str, object]:
        """Request-body fields that make the engine serve a request with LoRA adapter ``name``.

        - vLLM, SGLang, simulator (and unknown engines): ``{"model": name}``, the name the server
          loaded the adapter under (vLLM ``--lora-modules NAME=PATH``).
        - llama-server: ``{"lora": [{"id": k, "scale": 1.0}]}``, where ``k`` is the id of the
          adapter named ``name`` in ``loaded``, the list ``GET /lora-adapters`` answers: an entry
          is named by its file's stem (``--lora /a/b/sql.gguf`` serves adapter ``sql``), its file
          name or its path as given, or its ``task_name``. Adapters a request does not list get
          scale 0, so each request runs with its adapter alone, whatever the server's global
          scales. ``model`` is left alone: llama-server ignores it.

        Raises :class:`UnknownAdapter` naming the adapters ``loaded`` lists when none is ``name``.
        """
        if self.adapter_style == ADAPTER_MODEL_FIELD:
            return {"model": name}
        listed: list[str] = []
        for entry in loaded or ():
            path = str(entry.get("path") or "")
            task = str(entry.get("task_name") or "")
            names = {path, Path(path).name, Path(path).stem, task} - {""}
            if name in names:
                return {"lora": [{"id": entry.get("id"), "scale": 1.0}]}
            listed.append(f"{Path(path).stem or task or '?'} (id {entry.get('id')}, {path or 'no path'})")
        raise UnknownAdapter(
            name, listed, f"GET {self.adapters_path}",
            f"start {self.variant or self.name} with --lora FILE (comma-separated for several); an adapter "
            "is named by its file's stem",
        )


def _values(*, model: str | None, host: str, port: int, python: str) -> dict[str, str]:
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return {
        "{python}": python,
        "{model}": model or "",
        "{host}": host,
        "{port}": str(port),
        "{hostport}": hostport,
    }


def _fill(token: str, values: Mapping[str, str]) -> str:
    # Plain replacement, not str.format: user arguments may hold JSON braces.
    for key, value in values.items():
        token = token.replace(key, value)
    return token


def _user_command(command: str | Sequence[str] | None, values: Mapping[str, str]) -> list[str]:
    if command is None or (isinstance(command, str) and not command.strip()) or not command:
        raise PresetError(
            "server preset 'command' needs a command line, e.g. "
            "'my-server --model {model} --host {host} --port {port}'"
        )
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    for token in argv:
        unknown = [p for p in _PLACEHOLDER.findall(token) if p not in COMMAND_PLACEHOLDERS]
        if unknown:
            raise PresetError(
                f"server command {shlex.join(argv)!r}: unknown placeholder {unknown[0]} in "
                f"{token!r}; valid placeholders: {', '.join(COMMAND_PLACEHOLDERS)}"
            )
    if any("{model}" in token for token in argv) and not values["{model}"]:
        raise PresetError("server command uses {model} but no model was given")
    return [_fill(token, {k: values[k] for k in COMMAND_PLACEHOLDERS}) for token in argv]


# Names the Python interpreter of an environment with vLLM (e.g. the one scripts/install-vllm-cpu.sh
# makes), for when vLLM is not installed next to pytest-llmperf.
_VLLM_INSTALL_HINT = (
    "pip install vllm  (https://docs.vllm.ai/en/latest/getting_started/installation/); on a machine "
    f"without a GPU, vLLM's CPU build: bash scripts/install-vllm-cpu.sh, then set {VLLM_PYTHON_ENV} to "
    "the python it prints"
)
_VLLM_START_HINT = (
    "check that vLLM has a usable device (GPU build: a CUDA GPU this user can see, nvidia-smi; "
    "CPU build: VLLM_CPU_KVCACHE_SPACE fits in memory) and that "
    "`{python} -c 'import vllm.entrypoints.openai.api_server'` works (a broken dependency fails there)"
)

_VLLM = EnginePreset(
    name="vllm",
    variant="vllm serve",
    description="vLLM (vllm serve)",
    argv=("vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}"),
    executable="vllm",
    reset_cache_path="/reset_prefix_cache",
    reset_cache_env=(("VLLM_SERVER_DEV_MODE", "1"),),
    version_paths=("/version",),
    length_style=LENGTH_IGNORE_EOS_MIN_TOKENS,
    install_hint=_VLLM_INSTALL_HINT,
    start_hint=_VLLM_START_HINT.replace("{python}", "python"),
)

_VLLM_MODULE_ARGV = (
    "{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "--host", "{host}",
    "--port", "{port}",
)
# vLLM in another interpreter ($LLMPERF_VLLM_PYTHON), or importable here without `vllm` on PATH.
VLLM_MODULE = dataclasses.replace(
    _VLLM,
    variant="vllm (python -m)",
    description="vLLM (python -m vllm.entrypoints.openai.api_server)",
    argv=_VLLM_MODULE_ARGV,
    executable=None,
    module="vllm.entrypoints.openai.api_server",
    version_dist="vllm",
    start_hint=_VLLM_START_HINT,
)
# vLLM's CPU build (distribution vllm-cpu, or a source build versioned +cpu). `vllm serve` fails
# there (it asks importlib.metadata for the distribution "vllm"), the module entry point works.
# The KV cache lives in host memory (VLLM_CPU_KVCACHE_SPACE, GiB), the default
# --gpu-memory-utilization (0.92) is refused, and there are no CUDA graphs to capture.
VLLM_CPU = dataclasses.replace(
    VLLM_MODULE,
    variant="vllm-cpu",
    description="vLLM's CPU build (python -m vllm.entrypoints.openai.api_server)",
    argv=(*_VLLM_MODULE_ARGV, "--enforce-eager", "--gpu-memory-utilization", "0.3"),
    env_defaults=(("VLLM_CPU_KVCACHE_SPACE", "1"),),
    version_dist="vllm-cpu",
)

_SGLANG = EnginePreset(
    name="sglang",
    description="SGLang (python -m sglang.launch_server)",
    # --enable-metrics: without it SGLang serves no /metrics and telemetry would find nothing.
    argv=(
        "{python}", "-m", "sglang.launch_server", "--model-path", "{model}",
        "--host", "{host}", "--port", "{port}", "--enable-metrics",
    ),
    module="sglang.launch_server",
    reset_cache_path="/flush_cache",
    # Newer releases serve /server_info; older ones only /get_server_info.
    version_paths=("/server_info", "/get_server_info"),
    version_dist="sglang",
    length_style=LENGTH_IGNORE_EOS_MIN_TOKENS,
    install_hint='pip install "sglang[all]"  (https://docs.sglang.ai/get_started/install.html)',
)

_TGI = EnginePreset(
    name="tgi",
    description="Hugging Face Text Generation Inference (text-generation-launcher)",
    argv=("text-generation-launcher", "--model-id", "{model}", "--hostname", "{host}", "--port", "{port}"),
    executable="text-generation-launcher",
    version_paths=("/info",),
    length_style=LENGTH_MAX_TOKENS_ONLY,
    length_note=(
        "TGI's OpenAI route has no ignore_eos/min_tokens: requests may stop early at EOS, so "
        "output lengths (and TPOT/E2E) vary with the model's text"
    ),
    install_hint=(
        "install Text Generation Inference so that text-generation-launcher is on PATH "
        "(https://huggingface.co/docs/text-generation-inference/installation), or run its "
        "Docker image and give its URL instead"
    ),
)

_LLAMA_SERVER = EnginePreset(
    name="llamacpp",
    variant="llama-server",
    description="llama.cpp HTTP server (llama-server)",
    argv=("llama-server", "-m", "{model}", "--host", "{host}", "--port", "{port}", "--metrics"),
    executable="llama-server",
    version_paths=("/props",),
    version_keys=("build_info",),
    length_style=LENGTH_IGNORE_EOS,
    length_note="llama-server accepts ignore_eos but not min_tokens",
    adapter_style=ADAPTER_LORA_IDS,
    adapters_path="/lora-adapters",
    model_is_path=True,
    install_hint=(
        "build llama.cpp (https://github.com/ggml-org/llama.cpp: cmake -B build && "
        "cmake --build build --target llama-server) and put llama-server on PATH, or "
        "pip install 'llama-cpp-python[server]'"
    ),
)

LLAMA_CPP_PYTHON = EnginePreset(
    name="llamacpp",
    variant="llama_cpp.server",
    description="llama-cpp-python's OpenAI server (python -m llama_cpp.server)",
    argv=("{python}", "-m", "llama_cpp.server", "--model", "{model}", "--host", "{host}", "--port", "{port}"),
    module="llama_cpp.server",
    # No /health route; /v1/models answers once the model is loaded.
    health_path="/v1/models",
    metrics_path=None,
    version_dist="llama_cpp_python",
    length_style=LENGTH_EOS_LOGIT_BIAS,
    length_note=(
        "llama_cpp.server has no ignore_eos: EOS is banned through logit_bias, which needs the "
        "model's EOS token id"
    ),
    model_is_path=True,
    install_hint=_LLAMA_SERVER.install_hint,
)

_OLLAMA = EnginePreset(
    name="ollama",
    description="Ollama (ollama serve; pull the model beforehand)",
    argv=("ollama", "serve"),
    executable="ollama",
    env=(("OLLAMA_HOST", "{hostport}"),),
    health_path="/api/version",
    metrics_path=None,
    version_paths=("/api/version",),
    length_style=LENGTH_MAX_TOKENS_ONLY,
    length_note=(
        "Ollama's OpenAI route maps max_tokens to num_predict and silently ignores unknown "
        "fields such as ignore_eos: requests may stop early at EOS"
    ),
    needs_model=False,
    install_hint="curl -fsSL https://ollama.com/install.sh | sh  (https://ollama.com/download)",
)

_SIM = EnginePreset(
    name="sim",
    description="pytest-llmperf's built-in simulator (no GPU)",
    argv=("{python}", "-m", "pytest_llmperf.sim", "--host", "{host}", "--port", "{port}"),
    kind=KIND_SIM,
    module="pytest_llmperf.sim",
    version_paths=("/version",),
    version_dist="pytest-llmperf",
    length_style=LENGTH_IGNORE_EOS_MIN_TOKENS,
    needs_model=False,
    reset_cache_path="/reset_prefix_cache",  # as vLLM's: every trial starts from an empty prefix cache
    install_hint="the simulator ships with pytest-llmperf: reinstall it (pip install pytest-llmperf)",
)

_COMMAND = EnginePreset(
    name="command",
    description="your own command line, with {model} {host} {port} placeholders",
    kind=KIND_COMMAND,
    version_paths=("/version",),
    length_style=LENGTH_MAX_TOKENS_ONLY,
    length_note=(
        "unknown engine: only max_tokens is sent; for vLLM-style ignore_eos/min_tokens use "
        "dataclasses.replace(preset, length_style=LENGTH_IGNORE_EOS_MIN_TOKENS)"
    ),
    needs_model=False,
    install_hint="check the command: its program must be installed and on PATH, or given as a path",
)

# Read-only: presets are shared data, not a registry to patch at run time.
PRESETS: Mapping[str, EnginePreset] = MappingProxyType(
    {p.name: p for p in (_SIM, _VLLM, _SGLANG, _TGI, _LLAMA_SERVER, _OLLAMA, _COMMAND)}
)


def engine_preset(name: str) -> EnginePreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError(
            f"unknown server preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}"
        ) from None


def _module_available(module: str) -> bool:
    # Only the top-level package: find_spec of a submodule imports its parents (torch, for
    # SGLang), and a missing top-level package is what matters.
    top = module.split(".")[0]
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _which_program(program: str, which: Callable[[str], str | None]) -> str | None:
    if "/" in program:
        path = Path(program)
        return str(path) if path.is_file() else None
    return which(program)


def resolve_executable(
    preset: EnginePreset | str,
    *,
    command: str | Sequence[str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    module_available: Callable[[str], bool] = _module_available,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The program that will run the preset (a PATH lookup, or the current Python for
    ``python -m`` presets); raise :class:`EngineNotFound` saying what is missing and how to
    install it. For ``llamacpp``: llama-server from ``$LLMPERF_LLAMA_SERVER``, PATH or
    scripts/install-llamacpp.sh's cache (:func:`~pytest_llmperf.servers.installs.find_llama_server`),
    else an importable llama_cpp.
    """
    p = engine_preset(preset) if isinstance(preset, str) else preset
    if p.kind == KIND_COMMAND:
        argv = _user_command(command, _values(model="x", host="h", port=0, python=sys.executable))
        found = _which_program(argv[0], which)
        if found is None:
            raise EngineNotFound(
                p.name, f"command not found: {argv[0]!r} (it must be installed and on PATH)", p.install_hint
            )
        return found
    if p.name == "vllm":
        return resolve_vllm(which=which, module_available=module_available, environ=environ)[1]
    if p.name == "llamacpp" and p.variant == _LLAMA_SERVER.variant:
        found_path, where = find_llama_server(environ, which)
        if found_path is not None:
            return str(found_path)
        if module_available("llama_cpp"):
            return sys.executable
        raise EngineNotFound(
            p.name,
            f"{where}, and the Python package llama_cpp (llama-cpp-python) was not found either",
            p.install_hint,
        )
    if p.executable is not None:
        found = which(p.executable)
        if found is None:
            raise EngineNotFound(
                p.name, f"command not found: {p.executable!r} (it must be installed and on PATH)", p.install_hint
            )
        return found
    if p.module is not None:
        if not module_available(p.module):
            raise EngineNotFound(
                p.name,
                f"Python module {p.module!r} is not importable by {sys.executable}",
                p.install_hint,
            )
        return sys.executable
    raise PresetError(f"preset {p.name!r} names neither an executable nor a module")


_VLLM_PROBE = """
import importlib.metadata as m, importlib.util as u
found = u.find_spec("vllm") is not None
for dist in ("vllm-cpu", "vllm"):
    try:
        print(dist, m.version(dist), found)
        break
    except m.PackageNotFoundError:
        pass
else:
    print("none", "-", found)
"""


def probe_vllm(python: str, timeout_s: float = 30.0) -> tuple[str, str] | None:
    """``(distribution, version)`` of the vLLM installed for ``python`` (``vllm`` or ``vllm-cpu``),
    or None when that interpreter has no importable vLLM. Runs ``python -c``; imports no vLLM."""
    try:
        out = subprocess.run([python, "-c", _VLLM_PROBE], capture_output=True, text=True, timeout=timeout_s,
                             stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    words = out.stdout.split()
    if out.returncode != 0 or len(words) != 3 or words[2] != "True":
        return None
    if words[0] == "none":  # importable but not installed as a distribution (a source tree)
        return ("vllm", "unknown")
    return (words[0], words[1])


def is_cpu_build(dist: str, version: str) -> bool:
    """vLLM's CPU build: the ``vllm-cpu`` distribution, or a source build versioned ``+cpu``."""
    return dist == "vllm-cpu" or version.endswith("+cpu") or "+cpu." in version


def _shebang_python(script: str) -> str | None:
    """The interpreter a console script (such as ``vllm``) runs with, when it names one."""
    try:
        with open(script, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0] if Path(parts[0]).is_file() else None


def resolve_vllm(
    *,
    which: Callable[[str], str | None] = shutil.which,
    environ: Mapping[str, str] | None = None,
    probe: Callable[[str], tuple[str, str] | None] = probe_vllm,
    module_available: Callable[[str], bool] = _module_available,
) -> tuple[EnginePreset, str]:
    """Which vLLM to launch and how: ``(variant, executable)``.

    Looks at ``$LLMPERF_VLLM_PYTHON`` (an interpreter with vLLM), then ``vllm`` on PATH, then the
    current interpreter, then scripts/install-vllm-cpu.sh's cache. A CPU build runs as :data:`VLLM_CPU` (module entry point, host-memory KV
    cache); a GPU build found as ``vllm`` on PATH as ``vllm serve``; otherwise the module entry
    point of the interpreter that has it.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(VLLM_PYTHON_ENV)
    if explicit:
        if not (Path(explicit).is_file() and os.access(explicit, os.X_OK)):
            raise PresetError(f"${VLLM_PYTHON_ENV}={explicit} is not an executable file (it must name a python)")
        found = probe(explicit)
        if found is None:
            raise EngineNotFound(
                "vllm", f"${VLLM_PYTHON_ENV}={explicit} has no importable vLLM", _VLLM_INSTALL_HINT
            )
        return (VLLM_CPU if is_cpu_build(*found) else VLLM_MODULE), explicit
    script = which("vllm")
    if script is not None:
        python = _shebang_python(script)
        found = probe(python) if python else None
        if python and found is not None and is_cpu_build(*found):
            return VLLM_CPU, python
        return _VLLM, script
    if module_available("vllm"):
        found = probe(sys.executable)
        if found is not None:
            return (VLLM_CPU if is_cpu_build(*found) else VLLM_MODULE), sys.executable
    cached, where = find_vllm_python(env)
    if cached is not None:
        found = probe(str(cached))
        if found is not None:
            return (VLLM_CPU if is_cpu_build(*found) else VLLM_MODULE), str(cached)
    raise EngineNotFound(
        "vllm",
        f"command not found: 'vllm' (it must be installed and on PATH), ${VLLM_PYTHON_ENV} is not set, "
        f"{sys.executable} cannot import vllm, and {where}",
        _VLLM_INSTALL_HINT,
    )


def _looks_like_path(model: str) -> bool:
    """A model name that can only mean a local path (a hub id is ``org/name``)."""
    return model.startswith(("/", "./", "../", "~")) or model.count("/") > 1 or model.endswith((".gguf", ".safetensors"))


@dataclass(frozen=True)
class LaunchSpec:
    """A resolved launch: what to run, with which environment, and where to reach it.

    ``preset`` is the variant actually launched (for llamacpp it may be llama-cpp-python's
    server); ``env`` holds only the variables added to the inherited environment.
    """

    preset: EnginePreset
    command: list[str]
    env: dict[str, str]
    executable: str
    model: str | None
    host: str
    port: int
    root_url: str
    base_url: str
    health_url: str
    models_url: str
    metrics_url: str | None
    reset_cache_url: str | None
    # Where the server lists its LoRA adapters (llama-server), None where the model field names them.
    adapters_url: str | None = None

    def server_process(
        self,
        log_path: Path,
        *,
        startup_timeout_s: float = 600,
        grace_s: float = 10,
        cwd: str | None = None,
    ) -> ServerProcess:
        return ServerProcess(
            self.command,
            health_url=self.health_url,
            models_url=self.models_url,
            log_path=log_path,
            env=self.env,
            startup_timeout_s=startup_timeout_s,
            grace_s=grace_s,
            cwd=cwd,
            hint=self.preset.start_hint.replace("{python}", self.executable) or None,
        )


def connect_host(host: str) -> str:
    """The address a client uses to reach a server bound to ``host`` (wildcards -> loopback),
    bracketed for IPv6 URLs."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def build_launch(
    preset_name: str,
    *,
    model: str | None,
    host: str,
    port: int,
    extra_args: Sequence[str] | str | None,
    sim_preset: str | None = None,
    sim_args: Sequence[str] | None = None,
    command: str | Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    health_path: str | None = None,
    which: Callable[[str], str | None] = shutil.which,
    module_available: Callable[[str], bool] = _module_available,
    environ: Mapping[str, str] | None = None,
    probe: Callable[[str], tuple[str, str] | None] = probe_vllm,
) -> LaunchSpec:
    """Validate the arguments, check the engine is installed, and assemble the launch.

    ``extra_args`` (and ``sim_args``) may be a list or one shell-style string. ``health_path``
    overrides the preset's readiness path (mainly for ``command``). Raises :class:`PresetError`
    for bad arguments and :class:`EngineNotFound` when the engine is missing. ``environ`` (default
    ``os.environ``) is where ``$LLMPERF_VLLM_PYTHON`` is read and what a preset's environment
    defaults give way to; ``probe`` asks an interpreter which vLLM it has (see :func:`resolve_vllm`).
    """
    preset = engine_preset(preset_name)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise PresetError(f"server port must be an integer in 1..65535, got {port!r}")
    if not host:
        raise PresetError("server host is empty; use e.g. 127.0.0.1")
    if preset.kind != KIND_SIM and (sim_preset is not None or sim_args):
        raise PresetError(f"sim_preset/sim_args only apply to the 'sim' preset, not {preset.name!r}")
    if preset.kind != KIND_COMMAND and command is not None:
        raise PresetError(
            f"a command line only applies to the 'command' preset, not {preset.name!r}; "
            "use extra_args to add arguments to a preset"
        )
    if preset.needs_model and not model:
        raise PresetError(f"server preset {preset.name!r} needs a model (a model name or path)")
    if health_path is not None and not health_path.startswith("/"):
        raise PresetError(f"health_path must start with '/', got {health_path!r}")
    extra = _split_args(extra_args, "extra_args")
    sim_extra = _split_args(sim_args, "sim_args")

    if preset.needs_model and not preset.model_is_path and model and _looks_like_path(model):
        if not Path(model).expanduser().exists():
            raise PresetError(f"server preset {preset.name!r}: the model path {model!r} does not exist")

    environ = os.environ if environ is None else environ
    if preset.name == "vllm":
        preset, executable = resolve_vllm(which=which, environ=environ, probe=probe,
                                          module_available=module_available)
    else:
        executable = resolve_executable(preset, command=command, which=which, module_available=module_available,
                                        environ=environ)
    if preset is _LLAMA_SERVER and executable == sys.executable:
        # llama-server is missing but llama_cpp is importable: run llama-cpp-python's server.
        preset = LLAMA_CPP_PYTHON
    if preset.model_is_path and model and not Path(model).is_file():
        raise PresetError(
            f"server preset {preset.name!r} ({preset.variant}) needs a local GGUF file as the "
            f"model; {model!r} is not a file"
        )

    argv = preset.command(
        model=model, host=host, port=port, extra_args=extra, sim_preset=sim_preset,
        sim_args=sim_extra, command=command, python=executable if preset.module else None,
    )
    if preset is _LLAMA_SERVER:
        argv[0] = executable  # found outside PATH too (the install script's cache)
    launch_env = {**preset.launch_env(model=model, host=host, port=port), **dict(env or {})}
    for name, value in preset.env_defaults:
        if name not in launch_env and name not in environ:
            launch_env[name] = value
    root = f"http://{connect_host(host)}:{port}"
    base = root + preset.api_base_path
    return LaunchSpec(
        preset=preset,
        command=argv,
        env=launch_env,
        executable=executable,
        model=model,
        host=host,
        port=port,
        root_url=root,
        base_url=base,
        health_url=root + (health_path or preset.health_path),
        models_url=base + "/models",
        metrics_url=root + preset.metrics_path if preset.metrics_path else None,
        reset_cache_url=root + preset.reset_cache_path if preset.reset_cache_path else None,
        adapters_url=root + preset.adapters_path if preset.adapters_path else None,
    )


def _split_args(args: Sequence[str] | str | None, what: str) -> list[str]:
    if args is None:
        return []
    if isinstance(args, str):
        return shlex.split(args)
    bad = [a for a in args if not isinstance(a, str)]
    if bad:
        raise PresetError(f"{what} must be strings, got {bad[0]!r} ({type(bad[0]).__name__})")
    return list(args)


def read_version(
    preset: EnginePreset | str,
    base_root_url: str | None,
    executable: str | None,
    *,
    client: httpx.Client | None = None,
    timeout_s: float = _VERSION_TIMEOUT_S,
) -> str | None:
    """The engine's version for the run fingerprint, or None when it cannot be told.

    Tries the engine's own endpoint first (``base_root_url`` is the server root, without /v1),
    then the installed Python distribution (``python -m`` presets, run with ``executable``),
    then ``<executable> --version``. Never raises for an unreachable server or odd output.
    """
    p = engine_preset(preset) if isinstance(preset, str) else preset
    if base_root_url and p.version_paths:
        version = _version_from_endpoints(p, base_root_url.rstrip("/"), client, timeout_s)
        if version:
            return version
    if not executable:
        return None
    if p.version_dist:
        code = f"import importlib.metadata as m; print(m.version({p.version_dist!r}))"
        return _version_from_output([executable, "-c", code], timeout_s)
    # `python --version` would name the interpreter, not the engine it runs.
    if Path(executable).name.startswith("python"):
        return None
    return _version_from_output([executable, "--version"], timeout_s)


def _version_from_endpoints(
    p: EnginePreset, root: str, client: httpx.Client | None, timeout_s: float
) -> str | None:
    owned = client is None
    http = client if client is not None else httpx.Client(trust_env=False, timeout=timeout_s)
    try:
        for path in p.version_paths:
            try:
                resp = http.get(root + path)
                if resp.status_code != 200:
                    continue
                data = resp.json()
            except (httpx.HTTPError, ValueError):
                continue
            if not isinstance(data, dict):
                continue
            for key in p.version_keys:
                value = data.get(key)
                if isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value).strip():
                    return str(value).strip()
        return None
    finally:
        if owned:
            http.close()


def _version_from_output(argv: list[str], timeout_s: float) -> str | None:
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    # Some engines print their version on stderr (llama-server) or next to warnings (ollama).
    lines = (out.stdout + "\n" + out.stderr).splitlines()
    # Lines that say "version" first: start-up chatter ("found 1 CUDA devices") also has digits.
    for candidates in ([ln for ln in lines if "version" in ln.lower()], lines):
        for line in candidates:
            match = _VERSION_IN_TEXT.search(line)
            if match:
                return match.group(1).strip()
    return None
