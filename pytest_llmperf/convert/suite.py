"""A :class:`~pytest_llmperf.convert.vllm.Conversion` written out as a directory of pytest suites.

Layout of ``DIR`` (``llmperf convert vllm FILE --out DIR``)::

    DIR/README.md                       the sub-suites, the commands, the notes
    DIR/<sub-suite>/pytest.ini          one server configuration: llmperf_server = vllm, llmperf_model,
                                        llmperf_server_args, llmperf_sim_args, its own store
    DIR/<sub-suite>/conftest.py         the server's environment, set before it launches; the
                                        simulator spared vLLM's arguments; one sub-suite a session
    DIR/<sub-suite>/test_<file>.py      one gated test per definition, parametrized over its sweep

One sub-suite per server configuration (model, server parameters and environment) because a
pytest session launches one server: vLLM's runner relaunches its server for every test, the
sub-suite launches it once for every test that shares it. Each sub-suite keeps its baselines in
``.llmperf/<sub-suite>`` (``llmperf_store``, relative to where pytest runs): a baseline's newest
session is what a gate compares against, so two sub-suites saving ``main`` into one store would
hide each other's.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmperf._version import __version__
from pytest_llmperf.convert.vllm import CLIENT_TIMEOUT_S, SHAREGPT_FILE, SHAREGPT_URL
from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.convert.vllm import Conversion, Definition, SubSuite

# The order keyword arguments are written in (the rest follow in their own order).
_KEY_ORDER = ("name", "api", "input_tokens", "output_tokens", "dataset", "images", "batch_size", "cache",
              "prefix_tokens", "num_prefixes", "ignore_eos", "sampling", "seed", "warmup_requests")
_WIDTH = 110


class SuiteWriteError(InputError):
    """The output directory cannot take the suite (not empty, not a directory, not writable)."""


def module_name(source: Path) -> str:
    """``serving-tests-cpu-text.json`` -> ``test_serving_tests_cpu_text.py``."""
    return f"test_{re.sub(r'[^0-9A-Za-z_]+', '_', source.stem).strip('_') or 'vllm'}.py"


def function_names(definitions: Sequence[Definition]) -> list[str]:
    """A Python test function name per definition (``serving_qwen1.7B_...`` -> ``test_serving_qwen1_7B_...``)."""
    out: list[str] = []
    for d in definitions:
        base = "test_" + re.sub(r"\W+", "_", d.test_name).strip("_")
        name, k = base, 2
        while name in out:
            name, k = f"{base}_{k}", k + 1
        out.append(name)
    return out


def _py(value: Any) -> str:
    """``value`` as Python source, strings double-quoted."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    raise InputError(f"cannot write {value!r} as a Python literal")


def _limit(value: float) -> str:
    return str(int(value)) if value >= 10 and float(value).is_integer() else repr(float(value))


def _pack(units: Sequence[str], first: str, rest: str, width: int = _WIDTH) -> list[str]:
    """``units`` joined by spaces into lines of at most ``width`` characters (a unit is never
    split), the first line starting with ``first``, the others with ``rest``."""
    lines: list[str] = []
    current = ""
    for unit in units:
        prefix = rest if lines or current else first
        if current and len(current) + 1 + len(unit) > width:
            lines.append(current)
            current = f"{rest}{unit}"
        else:
            current = f"{current} {unit}" if current else f"{prefix}{unit}"
    if current:
        lines.append(current)
    return lines


def _comment(text: str, first: str = "# ", rest: str = "#   ") -> list[str]:
    return _pack(text.split(), first, rest)


def _arg_units(args: Sequence[str]) -> list[str]:
    """Command-line arguments grouped as ``--flag value`` units, shell-quoted."""
    units: list[str] = []
    for arg in args:
        if units and not arg.startswith("--") and units[-1].startswith("--") and " " not in units[-1]:
            units[-1] = f"{units[-1]} {shlex.quote(arg)}"
        else:
            units.append(shlex.quote(arg))
    return units


def _items_source(items: Sequence[tuple[str, str, Sequence[str] | None]], indent: str) -> list[str]:
    """Keyword arguments ``key=value`` packed into lines, each ending with a comma; a value too
    wide for a line is opened over lines of its own parts (``parts``: the inside of a dict)."""
    lines: list[str] = []
    row: list[str] = []
    for key, value, parts in items:
        item = f"{key}={value}" if key else value
        if len(indent) + len(item) + 1 > _WIDTH and parts:
            if row:
                lines += _pack([f"{r}," for r in row], indent, indent)
                row = []
            lines.append(f"{indent}{key}={{")
            lines += _pack([f"{p}," for p in parts], indent + "    ", indent + "    ")
            lines.append(f"{indent}}},")
            continue
        row.append(item)
    if row:
        lines += _pack([f"{r}," for r in row], indent, indent)
    return lines


# ---------------------------------------------------------------------- the test module


def _sweeps(definitions: Sequence[Definition]) -> dict[tuple[Any, ...], str]:
    """One module constant per distinct sweep: ``SWEEP``, ``SWEEP_2``..."""
    names: dict[tuple[Any, ...], str] = {}
    for d in definitions:
        if d.cases not in names:
            names[d.cases] = "SWEEP" if not names else f"SWEEP_{len(names) + 1}"
    return names


def _sweep_source(name: str, cases: Sequence[Any]) -> list[str]:
    lines = [f"{name} = ["]
    for case in cases:
        qps = "INF" if math.isinf(case.qps) else _py(case.qps)
        lines.append(f"    pytest.param({qps}, {case.max_concurrency}, id={_py(case.id)}),")
    lines.append("]")
    return lines


def _dict_parts(value: Mapping[str, Any], path_source: str | None = None) -> list[str]:
    return [f"{_py(k)}: {path_source if k == 'path' and path_source else _py(v)}" for k, v in value.items()]


def _workload_items(d: Definition) -> list[tuple[str, str, Sequence[str] | None]]:
    """The Workload's keyword arguments as (key, source, parts of a dict value)."""
    keys = [k for k in _KEY_ORDER if k in d.workload]
    keys += [k for k in d.workload if k not in _KEY_ORDER and k != "timeout_s"]
    items: list[tuple[str, str, Sequence[str] | None]] = []
    for key in keys:
        value = d.workload[key]
        if key == "dataset":
            parts = _dict_parts(value, f"dataset_file({_py(value['path'])})")
            items.append((key, "{" + ", ".join(parts) + "}", parts))
        elif isinstance(value, dict):
            items.append((key, _py(value), _dict_parts(value)))
        else:
            items.append((key, _py(value), None))
    items.append(("timeout_s", "TIMEOUT_S", None))
    burst = "" if d.burstiness == 1.0 else f", burstiness={_py(d.burstiness)}"
    items.append(("", f"**bench_load(qps, max_concurrency, num_prompts={d.num_prompts}{burst})", None))
    return items


def _docstring(paragraphs: Sequence[str]) -> list[str]:
    lines: list[str] = []
    for k, paragraph in enumerate(paragraphs):
        if k:
            lines.append("")
        lines += _pack(paragraph.split(), '"""' if k == 0 else "", "")
    lines.append('"""')
    return lines


def render_test_module(subsuite: SubSuite, conversion: Conversion, command: str) -> str:
    """The sub-suite's test module: one gated test per definition."""
    source = conversion.source.name
    defs = subsuite.definitions
    sweeps = _sweeps(defs)
    uses_dataset = any(d.dataset_path is not None for d in defs)
    count = f"{len(defs)} of vLLM's CI serving definitions" if len(defs) > 1 else "one of vLLM's CI serving definitions"
    lines = _docstring([
        f"{subsuite.name}: {count} ({source}) as gated pytest-llmperf tests.",
        f"Generated by ``{command}`` (pytest-llmperf {__version__}). pytest.ini holds the server they share "
        f"({subsuite.server.model}, one ``vllm serve`` launch for the session). One test per definition, one case "
        "per (qps, max concurrency) pair of its sweep, each the traffic of one ``vllm bench serve`` run "
        "(``pytest_llmperf.convert.vllm.bench_load``): at qps inf a closed loop of min(C, N) streams, else "
        "arrivals at qps req/s with at most C in flight.",
        "Gated against main's stored baseline (``--llmperf-baseline main``): each @slo latency, goodput and the "
        "error rate. The @slo limits are ceilings far from a healthy engine (a minute to the first token plus "
        "the queue's prefill at 500 prompt tokens/s, 1 s per output token): they fail a broken build where no "
        "baseline exists yet, and can be tightened for your hardware; the gate catches regressions.",
    ])
    lines.append("")
    if uses_dataset:
        lines += ["from pathlib import Path", ""]
    lines += ["import pytest", "", "from pytest_llmperf import Workload, slo"]
    names = "SHAREGPT_FILE, SHAREGPT_URL, bench_load" if uses_dataset else "bench_load"
    lines += [f"from pytest_llmperf.convert.vllm import {names}", ""]
    if uses_dataset:
        lines.append("HERE = Path(__file__).resolve().parent")
    lines += [
        'INF = float("inf")',
        f"TIMEOUT_S = {float(CLIENT_TIMEOUT_S)!r}  # vllm bench serve's client timeout: 6 hours a request",
        "",
        "# vLLM's runner sweeps, for each qps of qps_list, each max concurrency of max_concurrency_list.",
    ]
    for cases, name in sweeps.items():
        lines += _sweep_source(name, cases)
    if uses_dataset:
        lines += [
            "",
            "",
            "def dataset_file(name):",
            '    """A dataset file as the definition names it, relative to this directory; a missing one fails."""',
            "    path = HERE / name",
            "    if not path.is_file():",
            "        where = (f\"vLLM's runner downloads it: wget {SHAREGPT_URL}\" if path.name == SHAREGPT_FILE",
            "                 else \"vLLM's CI reads it from its benchmarks/ directory\")",
            '        pytest.fail(f"{path}: dataset file missing; {where} (into {HERE}, or link it there)",',
            "                    pytrace=False)",
            "    return str(path)",
        ]
    for d, function in zip(defs, function_names(defs)):
        lines += ["", "", f"# {d.test_name} ({source}:{d.line}):"]
        units = ["vllm bench serve", "--request-rate QPS", "--max-concurrency C", *_arg_units(d.bench_args)]
        lines += _pack(units, "#   ", "#     ")
        if d.notes:
            lines.append("# not converted:")
            for note in d.notes:
                lines += _comment(f"{note.parameter}: {note.reason}", "#   - ", "#     ")
        slo_args = [f"{k}={_limit(v)}" for k, v in d.slo.items()]
        lines += _pack([f"{a}," for a in slo_args[:-1]] + [f"{slo_args[-1]})"], "@slo(", "     ")
        lines.append(f'@pytest.mark.parametrize(("qps", "max_concurrency"), {sweeps[d.cases]})')
        lines.append(f"def {function}(llmperf, qps, max_concurrency):")
        lines.append("    llmperf.run(Workload(")
        lines += _items_source(_workload_items(d), "        ")
        lines.append("    ))")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- pytest.ini and conftest.py


def render_ini(subsuite: SubSuite, conversion: Conversion, command: str) -> str:
    server = subsuite.server
    lines = _comment(f"{subsuite.name}: one server configuration of {conversion.source.name} (vLLM's CI "
                     f"serving definitions), written by `{command}`. Every test here runs against one launch of",
                     "# ", "# ")
    lines += _pack(_arg_units(shlex.split(server.command())), "#   ", "#     ")
    lines += _comment("On the simulator (--llmperf-server sim) conftest.py drops the vLLM arguments; the simulator "
                      "gets llmperf_sim_args instead. Baselines and reports go under .llmperf/ of the directory "
                      "pytest runs in, one store per sub-suite (a gate compares with its baseline's newest session).",
                      "# ", "# ")
    lines += [
        "[pytest]",
        "llmperf_server = vllm",
        f"llmperf_model = {server.model}",
    ]
    if server.args:
        lines.append(f"llmperf_server_args = {shlex.join(server.args)}")
    if server.sim_preset:
        lines.append(f"llmperf_sim_preset = {server.sim_preset}")
    if server.sim_args:
        lines.append(f"llmperf_sim_args = {shlex.join(server.sim_args)}")
    lines += [f"llmperf_store = .llmperf/{subsuite.name}", f"llmperf_report_dir = .llmperf/report/{subsuite.name}"]
    return "\n".join(lines) + "\n"


def render_conftest(subsuite: SubSuite, conversion: Conversion, command: str) -> str:
    env = dict(subsuite.server.env)
    lines = _docstring([f"Session settings of {subsuite.name} (written by ``{command}``)."])[:-1]
    lines += [
        "",
        "- The server's environment (vLLM's runner starts it as ``VAR=value ... vllm serve``: json2envs),",
        "  set before the server launches and restored after the session.",
        "- On the simulator (``--llmperf-server sim``), pytest.ini's ``llmperf_server_args`` (vLLM's) are",
        "  not passed; ``llmperf_sim_args`` are.",
        "- One sub-suite per session: its pytest.ini is the one server configuration its tests share.",
        '"""',
        "",
        "import os",
        "from pathlib import Path",
        "",
        "import pytest",
        "",
        "HERE = Path(__file__).resolve().parent",
        "SERVER_ENVIRONMENT = {" + ("" if env else "}"),
    ]
    if env:
        lines += [f"    {_py(k)}: {_py(v)}," for k, v in env.items()]
        lines.append("}")
    lines += [
        "_saved = {}",
        "",
        "",
        "@pytest.hookimpl(tryfirst=True)",
        "def pytest_configure(config):",
        "    if config.inipath is None or Path(config.inipath).resolve().parent != HERE:",
        "        raise pytest.UsageError(f\"{HERE.name} is a sub-suite of its own: run it as `pytest {HERE}` \"",
        '                                "(its pytest.ini holds the one server its tests share)")',
        '    server = config.getoption("llmperf_server") or config.getini("llmperf_server")',
        '    if server == "sim" and config.getoption("llmperf_server_args") is None:',
        '        config.option.llmperf_server_args = ""  # vllm serve\'s; the simulator takes llmperf_sim_args',
        "    for name, value in SERVER_ENVIRONMENT.items():",
        "        _saved[name] = os.environ.get(name)",
        "        os.environ[name] = value",
        "",
        "",
        "def pytest_unconfigure(config):",
        "    for name, value in _saved.items():",
        "        if value is None:",
        "            os.environ.pop(name, None)",
        "        else:",
        "            os.environ[name] = value",
        "    _saved.clear()",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- README.md


def render_readme(conversion: Conversion, command: str, out_dir: Path) -> str:
    source = conversion.source.name
    subs = conversion.subsuites
    n_defs = len(conversion.definitions)
    n_cases = sum(len(d.cases) for d in conversion.definitions)
    first = subs[0].name
    names = " ".join(s.name for s in subs)
    lines = [
        "# vLLM's CI serving definitions as gated pytest-llmperf suites",
        "",
        f"Converted from `{source}` by `{command}` (pytest-llmperf {__version__}): {n_defs} "
        f"definition{'s' if n_defs != 1 else ''} ({n_cases} cases) in {len(subs)} sub-suite{'s' if len(subs) != 1 else ''}, "
        "one per server configuration (model, server parameters, environment): a pytest session launches one "
        "server, so each sub-suite runs in a session of its own.",
        "",
        "| sub-suite | model | tests | cases |",
        "|---|---|---:|---:|",
    ]
    for s in subs:
        cases = sum(len(d.cases) for d in s.definitions)
        lines.append(f"| [`{s.name}`]({s.name}/) | `{s.server.model}` | {len(s.definitions)} | {cases} |")
    lines += [
        "",
        "Each sub-suite's `pytest.ini` names its server (`llmperf_server = vllm`, `llmperf_model`, "
        "`llmperf_server_args`, and `llmperf_sim_args` for the simulator) and keeps its baselines apart "
        "(`.llmperf/<sub-suite>` under the directory pytest runs in); its `conftest.py` sets the server's "
        "environment before the launch. Each test is one definition, parametrized over its sweep (every qps "
        "of `qps_list` with every value of `max_concurrency_list`, ids as vLLM names its results: "
        "`qps_inf_concurrency_16`), and gated: `@slo` medians (and the tail the request count can judge), "
        "goodput and the error rate are compared with main's stored baseline; the `@slo` limits themselves "
        "are ceilings only a broken build reaches.",
        "",
        "## Commands",
        "",
        f"From this directory (`{out_dir.name}`), one sub-suite at a time. On main's CI, measure and save:",
        "",
        "```bash",
        f"pytest {first} --llmperf-save main",
        "```",
        "",
        "On a pull request, with main's `.llmperf/` (its CI artifact) in place, gate against it:",
        "",
        "```bash",
        f"pytest {first} --llmperf-baseline main",
        "```",
        "",
        "Every sub-suite, one after another (each launches its own `vllm serve`):",
        "",
        "```bash",
        f"status=0; for d in {names}; do pytest \"$d\" --llmperf-baseline main || status=1; done; exit $status",
        "```",
        "",
        "Without a GPU, against the built-in simulator (vLLM's arguments are not passed to it; `llmperf_sim_args` "
        "are; `--llmperf-duration-scale 0.1` for a quick smoke run):",
        "",
        "```bash",
        f"pytest {first} --llmperf-server sim",
        "```",
        "",
        "With a shared store (`--llmperf-store s3://bucket/prefix`), give each sub-suite its own prefix "
        "(`--llmperf-store s3://bucket/prefix/$d`): a gate compares with the newest session saved under a "
        "baseline name.",
    ]
    datasets = sorted({d.dataset_path for d in conversion.definitions if d.dataset_path})
    if datasets:
        lines += ["", "## Datasets", ""]
        users = {s.name for s in subs if any(d.dataset_path for d in s.definitions)}
        for path in datasets:
            name = Path(path).name
            lines.append(f"The ShareGPT tests read `{path}` relative to their sub-suite's directory; a missing file "
                         "fails the test naming it.")
            if name == SHAREGPT_FILE:
                lines += ["", "```bash", f"wget {SHAREGPT_URL}"]
                lines += [f"ln -s ../{name} {u}/{path.removeprefix('./')}" for u in sorted(users)]
                lines.append("```")
    lines += ["", "## Server configurations", ""]
    for s in subs:
        lines += [f"`{s.name}`: {', '.join(d.test_name for d in s.definitions)}", "", "```bash",
                  s.server.command(), "```"]
        if s.server.sim_args:
            lines += ["", f"On the simulator: `{shlex.join(s.server.sim_args)}`."]
        lines.append("")
    lines += ["## Not converted", ""]
    if conversion.skipped:
        lines.append(f"Tests left out: {', '.join(f'`{t}`' for t in conversion.skipped)} (the reason is below).")
        lines.append("")
    if conversion.notes:
        lines += [f"- {_md_note(n.test, n.parameter, n.reason)}" for n in conversion.notes]
    else:
        lines.append("Every parameter was converted.")
    lines += [
        "",
        "## Where the suites differ from vLLM's runner",
        "",
        "- One server launch per configuration, not per test: the tests of a sub-suite share it (random "
        "prompts never repeat, so none of them hits another's prefix cache).",
        "- Token counts are the server's (`usage`), the whole prompt included (special tokens, the chat "
        "template); vLLM's random lengths count the random text, less the tokenizer's special tokens.",
        "- On the simulator the sub-suite's model name is served by the simulator's preset "
        "(`--llmperf-sim-preset`, default `llama-3.1-8b-h100`), with the server parameters it models.",
    ]
    if any(d.api == "embeddings" for d in conversion.definitions):
        lines.append("- vLLM's embeddings requests carry `truncate_prompt_tokens: -1`; these do not (the prompts are "
                     "within the 1,024 tokens the ShareGPT filter keeps, or the lengths the definition sets).")
    return "\n".join(lines) + "\n"


def _md_note(test: str | None, parameter: str, reason: str) -> str:
    where = f"`{test}`: " if test else ""
    return f"{where}`{parameter}`: {reason}"


# ---------------------------------------------------------------------- writing


def write_suite(conversion: Conversion, out_dir: str | Path, *, command: str, force: bool = False) -> list[Path]:
    """Write ``conversion`` under ``out_dir`` (created if missing) and return the files written.

    A directory that already holds files is refused unless ``force``, which overwrites the files
    the conversion writes and leaves any other file alone."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SuiteWriteError(f"{out}: not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise SuiteWriteError(f"{out}: the directory is not empty; give a new or empty one (or --force to overwrite "
                              "the files the conversion writes)")
    files: dict[Path, str] = {out / "README.md": render_readme(conversion, command, out)}
    module = module_name(conversion.source)
    for s in conversion.subsuites:
        files[out / s.name / "pytest.ini"] = render_ini(s, conversion, command)
        files[out / s.name / "conftest.py"] = render_conftest(s, conversion, command)
        files[out / s.name / module] = render_test_module(s, conversion, command)
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SuiteWriteError(f"{exc.filename or out}: cannot write the suite: {exc.strerror}") from None
    return list(files)


def summary_lines(conversion: Conversion, out_dir: str | Path) -> list[str]:
    """What the CLI prints: the sub-suites, then every note."""
    out = Path(out_dir)
    defs = conversion.definitions
    lines = [f"{conversion.source.name}: {len(defs)} test{'s' if len(defs) != 1 else ''} "
             f"({sum(len(d.cases) for d in defs)} cases) in {len(conversion.subsuites)} sub-suite"
             f"{'s' if len(conversion.subsuites) != 1 else ''} under {out}"]
    for s in conversion.subsuites:
        tests = ", ".join(d.test_name for d in s.definitions)
        lines.append(f"  {s.name}: {s.server.model} ({tests})")
    if conversion.notes:
        lines.append(f"not converted ({len(conversion.notes)}; also in {out / 'README.md'}):")
        lines += [f"  {n.line()}" for n in conversion.notes]
    lines.append(f"run: cd {out} && pytest {conversion.subsuites[0].name} --llmperf-server sim   "
                 "(vLLM: --llmperf-save main, then --llmperf-baseline main)")
    return lines


__all__ = ["SuiteWriteError", "function_names", "module_name", "render_conftest", "render_ini",
           "render_readme", "render_test_module", "summary_lines", "write_suite"]
