"""One option table: the plugin's flags and ini keys, the typed options they resolve to and the
``llmperf`` command's flags for the settings it shares with the plugin all come from
``pytest_llmperf/cli/options.py``. These tests hold every copy to the table: the command's
parsers (same default, same value from a good one, the same refusal of a bad one), the
:class:`LLMPerfOptions` fields and their types, the engine choices and the engine presets, and
the library defaults the table restates."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing

import pytest

from pytest_llmperf import defaults
from pytest_llmperf.baseline.history import DEFAULT_HISTORY
from pytest_llmperf.baseline.store import DEFAULT_ROOT, BaselineStore
from pytest_llmperf.cli import compare_command, history_command
from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.cli.options import OPTIONS, SERVER_CHOICES, LLMPerfOptions, OptionError, option_spec, resolve

if typing.TYPE_CHECKING:
    from collections.abc import Callable


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in cli_main.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


# (command, its parser, the arguments it needs anyway, its flag, the table's option)
SHARED: list[tuple[str, Callable[[], argparse.ArgumentParser], list[str], str, str]] = [
    ("compare", compare_command.build_parser, ["a", "b"], "--store", "store"),
    ("compare", compare_command.build_parser, ["a", "b"], "--tolerance", "tolerance"),
    ("compare", compare_command.build_parser, ["a", "b"], "--alpha", "alpha"),
    ("compare", compare_command.build_parser, ["a", "b"], "--history", "history"),
    ("compare", compare_command.build_parser, ["a", "b"], "--session-cv", "session-cv"),
    ("compare", compare_command.build_parser, ["a", "b"], "--allow-diff", "allow-diff"),
    ("compare", compare_command.build_parser, ["a", "b"], "--strict", "strict"),
    ("compare", compare_command.build_parser, ["a", "b"], "--bisect", "bisect"),
    ("history", history_command.build_parser, ["main"], "--store", "store"),
    ("run", _run_parser, ["--url", "http://x/v1"], "--model", "model"),
    ("run", _run_parser, ["--url", "http://x/v1"], "--api-key-env", "api-key-env"),
    ("run", _run_parser, ["--url", "http://x/v1"], "--timeslice", "timeslice"),
    ("run", _run_parser, [], "--url", "url"),
]

# Values each kind of validator must refuse, and one it must accept.
BAD = {"fraction": ["0", "1", "1.5", "-0.1", "x"], "positive_int": ["0", "-3", "2.5", "x"],
       "positive_float": ["0", "-1", "x"], "allow_list": ["gpu_name,bogus", "extra."]}
GOOD = {"fraction": "0.2", "positive_int": "3", "positive_float": "2.5", "allow_list": "gpu_name, extra.tp",
        "shell_words": "--seed 7",
        "str": "some-value"}


def _kind(name: str) -> str:
    return option_spec(name).type.__name__.lstrip("_")


def _plugin(name: str, raw: str | None) -> object:
    """What the plugin resolves ``--llmperf-<name> raw`` to (the default when raw is None)."""
    spec = option_spec(name)
    given = {spec.dest: raw} if raw is not None else {}
    return getattr(resolve(lambda dest: given.get(dest), lambda key: None), spec.key)


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


@pytest.mark.parametrize("command, build, needed, flag, name", SHARED, ids=[f"{c} {f}" for c, _, _, f, _ in SHARED])
def test_shared_flag_has_the_tables_default_and_values(command, build, needed, flag, name):
    parser = build()
    action = _action(parser, flag)
    assert action.llmperf_option == name
    spec = option_spec(name)
    if name != "url":  # the command's --url is required: it has no default to compare
        args = parser.parse_args(needed)
        assert getattr(args, action.dest) == _plugin(name, None)
    if spec.flag:
        assert getattr(parser.parse_args([*needed, flag]), action.dest) is True
        return
    good = GOOD[_kind(name)]
    assert getattr(parser.parse_args([*needed, flag, good]), action.dest) == _plugin(name, good)


@pytest.mark.parametrize("command, build, needed, flag, name",
                         [s for s in SHARED if _kind(s[4]) in BAD], ids=lambda v: v if isinstance(v, str) else "")
def test_shared_flag_refuses_what_the_plugin_refuses(command, build, needed, flag, name, capsys):
    parser = build()
    for bad in BAD[_kind(name)]:
        with pytest.raises(OptionError) as plugin_error:
            _plugin(name, bad)
        with pytest.raises(SystemExit) as exc:
            parser.parse_args([*needed, f"{flag}={bad}"])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        # Both say the validator's own words: "invalid value '1.5': must be a fraction ..."
        detail = str(plugin_error.value).split(": ", 1)[1]
        assert f"argument {flag}: {detail}" in err, (bad, err)


def test_every_command_flag_built_from_the_table_is_listed_here():
    parsers = {"compare": compare_command.build_parser(), "history": history_command.build_parser(), "run": _run_parser()}
    tagged = {(command, flag) for command, parser in parsers.items() for a in parser._actions
              if getattr(a, "llmperf_option", None) for flag in a.option_strings}
    assert tagged == {(command, flag) for command, _, _, flag, _ in SHARED}


def test_baselines_store_falls_back_to_the_tables_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    BaselineStore(tmp_path / option_spec("store").default).save("main", {"tests": {}})
    assert cli_main.main(["baselines", "list"]) == 0
    assert "main" in capsys.readouterr().out


def test_options_are_typed_fields_one_per_row():
    assert [f.name for f in dataclasses.fields(LLMPerfOptions)] == [spec.key for spec in OPTIONS]
    hints = typing.get_type_hints(LLMPerfOptions)
    defaults = resolve(lambda dest: None, lambda key: None)
    for spec in OPTIONS:
        hint = hints[spec.key]
        assert _conforms(getattr(defaults, spec.key), hint), (spec.name, hint)
        if spec.flag:
            assert hint is bool
            continue
        raw = spec.choices[-1] if spec.choices else GOOD[_kind(spec.name)]
        value = getattr(resolve(lambda dest, s=spec, r=raw: r if dest == s.dest else None, lambda key: None), spec.key)
        assert _conforms(value, hint), (spec.name, value, hint)


def _conforms(value: object, hint: object) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (list, tuple):
        item = typing.get_args(hint)[0]
        return isinstance(value, origin) and all(_conforms(v, item) for v in value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    assert isinstance(hint, type), hint
    return isinstance(value, hint) and not (hint is int and isinstance(value, bool))


def test_options_are_frozen_and_derived_values_keep_working():
    given = {"llmperf_server_args": "--max-num-seqs 128 --x 'a b'", "llmperf_allow_diff": "gpu_name, model",
             "llmperf_report_dir": "out/rep", "llmperf_ab_sim_args": "--seed 3"}
    opts = resolve(lambda dest: given.get(dest), lambda key: None)
    assert opts.server_args == ["--max-num-seqs", "128", "--x", "a b"] and opts.sim_args == []
    assert opts.allowed_diffs == ["gpu_name", "model"] and opts.report_path.as_posix() == "out/rep"
    assert opts.ab and opts.launch_count == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.tolerance = 0.1  # type: ignore[misc]
    with pytest.raises(OptionError, match="--llmperf-server-args: invalid value .*cannot split into arguments"):
        resolve(lambda dest: "'unclosed" if dest == "llmperf_server_args" else None, lambda key: None)


def test_server_choices_are_the_engine_presets():
    from pytest_llmperf.servers.engine_presets import PRESETS

    assert SERVER_CHOICES == tuple(PRESETS)
    assert option_spec("server").choices == option_spec("ab-server").choices == SERVER_CHOICES


def test_library_defaults_are_the_tables():
    from pytest_llmperf.baseline.sessions import PRIOR_SESSION_CV
    from pytest_llmperf.stats import DEFAULT_ALPHA, DEFAULT_TOLERANCE

    assert option_spec("keep").default == defaults.DEFAULT_KEEP == BaselineStore(".").keep
    assert option_spec("history").default == DEFAULT_HISTORY == defaults.DEFAULT_HISTORY
    assert option_spec("store").default == defaults.DEFAULT_STORE == str(DEFAULT_ROOT)
    assert option_spec("report-dir").default == f"{DEFAULT_ROOT}/report"
    assert option_spec("tolerance").default == DEFAULT_TOLERANCE == defaults.DEFAULT_TOLERANCE
    assert option_spec("alpha").default == DEFAULT_ALPHA == defaults.DEFAULT_ALPHA
    assert option_spec("session-cv").default == PRIOR_SESSION_CV == defaults.DEFAULT_SESSION_CV
