import gzip
import json
import multiprocessing
import os
import queue
import tempfile
import warnings
from datetime import timezone
from pathlib import Path

import numpy as np
import pytest

from pytest_llmperf.baseline import store as store_mod
from pytest_llmperf.baseline.history import load_history
from pytest_llmperf.baseline.samples import pack_samples, unpack_samples
from pytest_llmperf.baseline.store import (
    SCHEMA_VERSION,
    BaselineCorrupt,
    BaselineMissing,
    BaselineStore,
    BaselineTooNew,
    StoreError,
    StoreWarning,
)
from pytest_llmperf.cli.baselines_command import baselines_main
from pytest_llmperf.errors import InputError, pytest_flag
from pytest_llmperf.fingerprint import Fingerprint, FingerprintMismatch, ensure_comparable


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def _write_gz(path: Path, payload: bytes) -> None:
    path.write_bytes(gzip.compress(payload))


# ---------------------------------------------------------------------- save / load


def test_save_load_round_trip(tmp_path):
    store = BaselineStore(tmp_path / ".llmperf")
    run = {"tests": {"t[cold]": {"ttft_p95_s": 0.25, "n": np.int64(3), "x": np.float32(0.5)}}, "nan": float("nan")}
    path = store.save("main", run)

    assert path.parent == tmp_path / ".llmperf" / "baselines" / "main"
    assert path.name.endswith(".json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["name"] == "main"
    assert doc["saved_at"].endswith("+00:00")

    saved = store.latest("main")
    assert saved.name == "main"
    assert saved.path == path
    assert saved.run_id == path.name[: -len(".json.gz")]
    assert saved.schema_version == SCHEMA_VERSION
    assert saved.saved_at.tzinfo == timezone.utc
    assert saved.run["tests"] == {"t[cold]": {"ttft_p95_s": 0.25, "n": 3, "x": 0.5}}
    assert saved.run["nan"] is None  # strict JSON (pytest_llmperf.jsonio): NaN is written as null
    assert store.names() == ["main"]
    assert [e.path for e in store.runs("main")] == [path]


def test_branch_names_map_to_one_directory(tmp_path):
    store = BaselineStore(tmp_path)
    path = store.save("feature/x-1.2_b", {"a": 1})
    assert path.parent.parent == tmp_path / "baselines"
    assert path.parent.name == "feature%2Fx-1.2_b"
    assert store.names() == ["feature/x-1.2_b"]
    assert store.latest("feature/x-1.2_b").run == {"a": 1}


@pytest.mark.parametrize("bad", ["", "..", "../x", "a/../b", "/abs", "a//b", "a/", ".", "sp ace", "a%2Fb", "C:x"])
def test_invalid_names_rejected(tmp_path, bad):
    store = BaselineStore(tmp_path)
    with pytest.raises(StoreError, match="baseline name"):
        store.save(bad, {"a": 1})
    assert not (tmp_path / "baselines").exists() or _files(tmp_path / "baselines") == []


def test_unserializable_run_is_a_clear_error(tmp_path):
    store = BaselineStore(tmp_path)
    with pytest.raises(StoreError, match="not JSON-serializable.*object"):
        store.save("main", {"bad": object()})
    with pytest.raises(StoreError, match="run must be a dict"):
        store.save("main", [1, 2])  # type: ignore[arg-type]
    assert store.runs("main") == []


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(StoreError, match="keep"):
        BaselineStore(tmp_path, keep=0)


# ---------------------------------------------------------------------- atomicity, concurrency


def test_interrupted_save_leaves_previous_intact(tmp_path, monkeypatch):
    store = BaselineStore(tmp_path)
    first = store.save("main", {"v": 1})
    before = first.read_bytes()

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(StoreError, match="No space left"):
        store.save("main", {"v": 2})
    monkeypatch.undo()

    # No new visible file, no leftover temporary file, the old baseline unchanged and current.
    assert _files(first.parent) == [first.name]
    assert first.read_bytes() == before
    assert store.latest("main").run == {"v": 1}


def _save_many(root, name, tag, count, keep, barrier, results):
    store = BaselineStore(root, keep=keep)
    barrier.wait(timeout=30)  # start both writers together so their saves interleave
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a prune warning here would mean a file looked corrupt
        results.put([str(store.save(name, {"tag": tag, "i": i, "pad": list(range(50))})) for i in range(count)])


def _run_writers(ctx, root, name, keep):
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_save_many, args=(root, name, tag, 20, keep, barrier, results)) for tag in "ab"]
    for p in procs:
        p.start()
    out = []
    while len(out) < len(procs):
        try:
            out.append(results.get(timeout=0.5))
        except queue.Empty:
            # A writer that crashed will never report; fail now instead of waiting.
            assert all(p.exitcode in (None, 0) for p in procs), [p.exitcode for p in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return out[0] + out[1]


def test_concurrent_saves_lose_nothing(tmp_path):
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    written_all = set(_run_writers(ctx, str(tmp_path), "all", None))
    written_pruned = sorted(set(_run_writers(ctx, str(tmp_path), "pruned", 10)), key=lambda p: Path(p).name)
    store = BaselineStore(tmp_path, keep=None)

    assert len(written_all) == 40  # unique ids across processes
    on_disk = {str(e.path) for e in store.runs("all")}
    assert on_disk == written_all
    loaded = [store.load(p).run for p in on_disk]
    assert sorted((r["tag"], r["i"]) for r in loaded) == sorted((t, i) for t in "ab" for i in range(20))

    assert len(written_pruned) == 40
    kept = [str(e.path) for e in store.runs("pruned")]
    # Exactly `keep` survive, all from these saves, including the newest ones. (A save keeps
    # its own file even if the other process wrote many newer ones meanwhile, so under extreme
    # scheduling the set can differ from "newest 10" by such a file; hence not set equality.)
    assert len(kept) == 10 and set(kept) <= set(written_pruned)
    assert set(written_pruned[-5:]) <= set(kept)
    for p in kept:
        assert store.load(p).run["pad"] == list(range(50))
    for directory in (tmp_path / "baselines").iterdir():
        assert not [n for n in _files(directory) if n.startswith(".")]  # no temp files left


def test_pruning_keeps_newest(tmp_path):
    store = BaselineStore(tmp_path, keep=3)
    for i in range(6):
        store.save("main", {"tests": {}, "i": i})
    assert [s.run["i"] for s in load_history(store, "main").runs] == [5, 4, 3]
    assert len(_files(tmp_path / "baselines" / "main")) == 3


def test_pruning_never_deletes_the_file_just_written(tmp_path):
    store = BaselineStore(tmp_path, keep=2)
    directory = tmp_path / "baselines" / "main"
    for i in range(2):
        path = store.save("main", {"tests": {}, "i": i})
        # Pretend these came from a machine whose clock runs far ahead.
        path.rename(directory / f"2999010{i + 1}T000000000000Z-0000000{i}.json.gz")
    newest_written = store.save("main", {"tests": {}, "i": "now"})
    assert newest_written.exists()
    assert len(store.runs("main")) == 2
    assert store.load(newest_written).run == {"tests": {}, "i": "now"}


# ---------------------------------------------------------------------- corruption


def _corrupt_cases(valid: bytes):
    return {
        "truncated": (valid[: len(valid) // 2], BaselineCorrupt, "gzip data is truncated"),
        "bad json": (gzip.compress(b'{"schema_version": 1, "run": {'), BaselineCorrupt, "not valid JSON"),
        "not object": (gzip.compress(b"[1, 2, 3]"), BaselineCorrupt, "expected a JSON object"),
        "run not dict": (gzip.compress(b'{"schema_version": 1, "name": "main", "run": [1]}'), BaselineCorrupt,
                         "'run' must be an object"),
        "bad version": (gzip.compress(b'{"schema_version": "one", "run": {}}'), BaselineCorrupt,
                        "schema_version must be a positive integer"),
        "too new": (gzip.compress(b'{"schema_version": 99, "name": "main", "run": {}}'), BaselineTooNew,
                    "schema version 99 is newer.*upgrade pytest-llmperf"),
    }


@pytest.mark.parametrize("case", list(_corrupt_cases(b"x")))
def test_corrupt_file_errors_name_the_file_and_survive(tmp_path, case):
    store = BaselineStore(tmp_path, keep=1)
    good = store.save("main", {"tests": {}, "v": 1})
    payload, error, message = _corrupt_cases(good.read_bytes())[case]
    bad = good.parent / "29990101T000000000000Z-deadbeef.json.gz"  # sorts as newest
    bad.write_bytes(payload)

    with pytest.raises(error, match=message) as info:
        store.latest("main")
    assert str(bad) in str(info.value)
    # The history (what the gate reads behind the newest run) skips it with a warning naming it.
    with pytest.warns(StoreWarning, match="deadbeef"):
        history = load_history(store, "main")
    assert [s.path for s in history.runs] == [good]
    assert len(history.skipped) == 1 and str(bad) in history.skipped[0]

    # A save with keep=1 prunes the old good run but must not touch the corrupt file.
    with pytest.warns(StoreWarning, match="left in place"):
        newest = store.save("main", {"tests": {}, "v": 2})
    assert bad.read_bytes() == payload
    assert sorted(_files(bad.parent)) == sorted([bad.name, newest.name])


def test_missing_name_says_how_to_create_it(tmp_path):
    store = BaselineStore(tmp_path)
    with pytest.raises(BaselineMissing, match="no baseline named 'nope'") as excinfo:
        store.latest("nope")
    # The library names no flag; the front end renders its own spelling of the option.
    assert "--llmperf" not in str(excinfo.value)
    assert excinfo.value.render(pytest_flag).endswith("create one by running with --llmperf-save nope")
    with pytest.raises(BaselineMissing, match="the save option nope"):
        load_history(store, "nope")


def test_load_accepts_any_result_file(tmp_path):
    plain = tmp_path / "result.json"
    plain.write_text(json.dumps({"schema_version": 7, "tests": {"a": 1}}))
    saved = BaselineStore(tmp_path / "s").load(plain)
    assert saved.run == {"schema_version": 7, "tests": {"a": 1}}  # the report's own version is not ours
    assert saved.name == "result"
    gz = tmp_path / "other.json.gz"
    _write_gz(gz, b"not json at all")
    with pytest.raises(BaselineCorrupt, match=str(gz)):
        store_mod.load_run(gz)


# ---------------------------------------------------------------------- unwritable store


def test_store_under_a_regular_file_is_not_writable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = BaselineStore(blocker / "sub")
    with pytest.raises(StoreError, match="not writable.*choose a writable directory") as excinfo:
        store.check_writable()
    assert "--llmperf" not in str(excinfo.value)  # the library names no flag; the plugin adds it
    with pytest.raises(StoreError, match="cannot create baseline directory"):
        store.save("main", {"a": 1})


def test_check_writable_reports_permission_errors(tmp_path, monkeypatch):
    store = BaselineStore(tmp_path / "s")

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "s" / "baselines"))

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(StoreError, match="Permission denied"):
        store.check_writable()
    monkeypatch.undo()
    store.check_writable()  # the real directory is fine
    assert _files(tmp_path / "s" / "baselines") == []  # the probe cleaned up after itself


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="not writable"):
            BaselineStore(ro / "store").check_writable()
    finally:
        ro.chmod(0o700)


# ---------------------------------------------------------------------- history, delete


def _comparable(saved, candidate, allow=()):
    """Whether a saved run's fingerprint can be compared with ``candidate`` (as the gate decides)."""
    stored = saved.run.get("fingerprint")
    if stored is None:
        return False
    try:
        ensure_comparable(Fingerprint.from_dict(stored), candidate, allow)
    except FingerprintMismatch:
        return False
    return True


def test_history_limit_and_fingerprint_match(tmp_path):
    store = BaselineStore(tmp_path)
    h100 = Fingerprint(engine="vllm", model="m", gpu_name="H100", gpu_count=1)
    a100 = Fingerprint(engine="vllm", model="m", gpu_name="A100", gpu_count=1)
    for i, fp in enumerate([h100, a100, h100, None, h100]):
        store.save("main", {"tests": {}, "i": i, **({"fingerprint": fp.to_dict()} if fp else {})})
    assert [s.run["i"] for s in load_history(store, "main").runs] == [4, 3, 2, 1, 0]
    assert [s.run["i"] for s in load_history(store, "main", limit=2).runs] == [4, 3]
    runs = load_history(store, "main").runs
    assert [s.run["i"] for s in runs if _comparable(s, h100)] == [4, 2, 0]
    assert [s.run["i"] for s in runs if _comparable(s, h100, allow=["gpu_name"])] == [4, 2, 1, 0]


def test_delete_one_run_and_whole_name(tmp_path):
    store = BaselineStore(tmp_path)
    first = store.save("a/b", {"i": 0})
    second = store.save("a/b", {"i": 1})
    store.save("other", {"i": 2})
    assert store.delete("a/b", second.name[: -len(".json.gz")]) == 1
    assert store.latest("a/b").path == first
    with pytest.raises(BaselineMissing, match="no run 'bogus'"):
        store.delete("a/b", "bogus")
    with pytest.raises(BaselineMissing):
        store.delete("a/b", "../other")
    assert store.delete("a/b") == 1
    assert store.names() == ["other"]
    assert not (tmp_path / "baselines" / "a%2Fb").exists()
    with pytest.raises(BaselineMissing):
        store.delete("a/b")


# ---------------------------------------------------------------------- compact samples


def test_pack_unpack_preserves_values_nan_and_shape():
    values = np.array([0.0, 1e-6, 0.123456, 12.5, np.nan, np.inf, -1.0])
    out = unpack_samples(pack_samples(values))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, values, rtol=1e-7)
    assert np.isnan(out[4]) and np.isinf(out[5])
    t = np.linspace(0, 3600, 12).reshape(3, 4) + 1e-6
    exact = unpack_samples(pack_samples(t, dtype="float64"))
    assert exact.shape == (3, 4)
    assert np.array_equal(exact, t)
    assert unpack_samples(pack_samples(np.array([]))).shape == (0,)
    # Survives the JSON round trip it is meant for.
    assert np.allclose(unpack_samples(json.loads(json.dumps(pack_samples(values[:4])))), values[:4], rtol=1e-7)


def test_unpack_rejects_bad_input():
    good = pack_samples(np.arange(4.0))
    # Stored samples that do not decode are a corrupt saved run.
    with pytest.raises(BaselineCorrupt, match="unknown codec"):
        unpack_samples({**good, "codec": "zip"})
    with pytest.raises(BaselineCorrupt, match="do not hold shape"):
        unpack_samples({**good, "shape": [5]})
    with pytest.raises(BaselineCorrupt, match="base64"):
        unpack_samples({**good, "data": "!!!"})
    # A bad argument of the caller's is an input error.
    with pytest.raises(InputError, match="dtype must be one of"):
        pack_samples(np.arange(3.0), dtype="float16")


def test_sixty_second_run_is_tens_of_kb(tmp_path):
    rng = np.random.default_rng(1)
    n = 1200  # 60 s at 20 req/s
    series = {
        "scheduled_s": np.sort(rng.uniform(0, 60, n)),
        "ttft_s": rng.lognormal(-2.5, 0.4, n),
        "ttfvt_s": rng.lognormal(-2.4, 0.4, n),
        "tpot_s": rng.lognormal(-3.5, 0.2, n),
        "itl_p99_s": rng.lognormal(-3.0, 0.3, n),
        "e2e_s": rng.lognormal(1.0, 0.3, n),
        "dispatch_lag_s": rng.exponential(1e-4, n),
        "output_tokens": rng.integers(100, 200, n).astype(float),
    }
    run = {"tests": {"t": {"samples": {k: pack_samples(v, dtype="float64" if k == "scheduled_s" else "float32")
                                       for k, v in series.items()}}}}
    path = BaselineStore(tmp_path).save("main", run)
    size = path.stat().st_size
    naive = len(gzip.compress(json.dumps({k: v.tolist() for k, v in series.items()}).encode()))
    assert 5_000 < size < 50_000, size
    assert size < 0.6 * naive
    back = BaselineStore(tmp_path).latest("main").run["tests"]["t"]["samples"]
    np.testing.assert_allclose(unpack_samples(back["ttft_s"]), series["ttft_s"], rtol=1e-7)
    np.testing.assert_array_equal(unpack_samples(back["scheduled_s"]), series["scheduled_s"])


# ---------------------------------------------------------------------- CLI


def _seed_store(root: Path) -> BaselineStore:
    store = BaselineStore(root)
    fp = Fingerprint(engine="vllm", engine_version="0.6.3", model="Qwen/Qwen3-8B", gpu_name="NVIDIA H100", gpu_count=2)
    store.save("main", {"fingerprint": fp.to_dict(), "tests": {"test_chat[cold]": {"summary": {"ttft_p95_s": 0.5}}}})
    store.save("main", {
        "fingerprint": fp.to_dict(),
        "tests": {"test_chat[cold]": {"workload": {"rate_rps": 4.0}, "summary": {"ttft_p95_s": 0.25, "completed": 240},
                                      "samples": {"ttft_s": pack_samples(np.full(300, 0.2))}}},
    })
    store.save("feature/x", {"whatever": [1, 2, 3]})
    return store


def test_cli_list(tmp_path, capsys):
    assert baselines_main(["list", "--store", str(tmp_path)]) == 0
    assert "no baselines" in capsys.readouterr().out
    _seed_store(tmp_path)
    assert baselines_main(["--store", str(tmp_path), "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "RUNS", "LATEST", "(UTC)", "COMMIT", "FINGERPRINT"]
    main_row = next(line for line in lines if line.startswith("main "))
    assert main_row.split()[1] == "2"
    assert "vllm 0.6.3 | Qwen/Qwen3-8B | 2x NVIDIA H100" in main_row
    feature_row = next(line for line in lines if line.startswith("feature/x "))
    assert feature_row.split()[1] == "1" and feature_row.rstrip().endswith("-")


def test_cli_show(tmp_path, capsys):
    store = _seed_store(tmp_path)
    assert baselines_main(["show", "main", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "test_chat[cold]" in out and "ttft_p95_s: 0.25" in out and "<300 samples, median 0.2>" in out
    oldest = store.runs("main")[-1].run_id
    assert baselines_main(["show", "main", "--run", oldest, "--json", "--store", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run_id"] == oldest
    assert doc["run"]["tests"]["test_chat[cold]"]["summary"]["ttft_p95_s"] == 0.5


def test_cli_errors_exit_2_with_one_line(tmp_path, capsys):
    store = _seed_store(tmp_path)
    assert baselines_main(["show", "nope", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--llmperf-save nope" in err
    bad = store.runs("main")[0].path.parent / "29990101T000000000000Z-deadbeef.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08garbage")
    assert baselines_main(["show", "main", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err
    assert bad.exists()
    assert baselines_main(["list", "--store", str(tmp_path)]) == 0  # list shows, does not fail
    assert "unreadable: 29990101T000000000000Z-deadbeef.json.gz" in capsys.readouterr().out
    assert baselines_main(["frobnicate", "--store", str(tmp_path)]) == 2
    assert baselines_main(["show", "main", "--run", "nope", "--store", str(tmp_path)]) == 2


def test_cli_delete(tmp_path, capsys, monkeypatch):
    store = _seed_store(tmp_path)
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    assert baselines_main(["delete", "main", "--store", str(tmp_path)]) == 2
    assert "without --yes" in capsys.readouterr().err
    assert len(store.runs("main")) == 2
    newest = store.runs("main")[0].run_id
    assert baselines_main(["delete", "main", "--run", newest, "--yes", "--store", str(tmp_path)]) == 0
    assert [e.run_id for e in store.runs("main")] != [newest] and len(store.runs("main")) == 1
    assert baselines_main(["delete", "main", "--yes", "--store", str(tmp_path)]) == 0
    assert "deleted 1 run(s)" in capsys.readouterr().out
    assert store.names() == ["feature/x"]
    assert baselines_main(["delete", "main", "--yes", "--store", str(tmp_path)]) == 2


def test_saved_file_gets_the_umask_permissions_not_mkstemp_0600(tmp_path):
    import os as _os

    old = _os.umask(0o022)
    try:
        path = BaselineStore(tmp_path).save("main", {"tests": {}})
    finally:
        _os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o644


# ---------------------------------------------------------------------- rebase markers


def test_rebase_starts_the_history_anew_and_deletes_nothing(tmp_path):
    from pytest_llmperf.baseline.history import load_history

    store = BaselineStore(tmp_path, keep=None)
    before = [store.save("main", {"tests": {}, "i": i}) for i in range(3)]
    contents = [p.read_bytes() for p in before]
    mark = store.rebase("main", "new GPU:\n  H100 -> H200")
    after = store.save("main", {"tests": {}, "i": 3})

    history = load_history(store, "main")
    assert [r.run["i"] for r in history.runs] == [3]
    assert history.rebased == mark and history.since_rebase == 1
    assert mark.reason == "new GPU: H100 -> H200"  # one line: it is printed in one terminal line
    assert history.rebase_note() == (f"history of 'main' rebased on {mark.created_at:%Y-%m-%d %H:%M} UTC: "
                                     "new GPU: H100 -> H200; 1 session(s) since")
    # Nothing existing was deleted or rewritten; the marker is no run, and the newest run is still newest.
    assert [p.read_bytes() for p in before] == contents
    assert [e.path for e in store.runs("main")] == [after, *reversed(before)]
    assert store.latest("main").run == {"tests": {}, "i": 3} and store.names() == ["main"]
    doc = json.loads(mark.path.read_text())
    assert doc["kind"] == "pytest-llmperf.rebase" and doc["reason"] == mark.reason
    assert [m.mark_id for m in store.rebases("main")] == [mark.mark_id]
    # limit counts sessions after the marker only
    store.save("main", {"tests": {}, "i": 4})
    assert [r.run["i"] for r in load_history(store, "main", limit=5).runs] == [4, 3]


def test_the_newest_of_two_rebases_wins(tmp_path):
    from pytest_llmperf.baseline.history import load_history

    store = BaselineStore(tmp_path)
    store.save("main", {"tests": {}, "i": 0})
    store.rebase("main", "driver 550")
    store.save("main", {"tests": {}, "i": 1})
    second = store.rebase("main", "engine 0.7")
    store.save("main", {"tests": {}, "i": 2})
    history = load_history(store, "main")
    assert [r.run["i"] for r in history.runs] == [2] and history.rebased.reason == "engine 0.7"
    assert [m.reason for m in store.rebases("main")] == ["engine 0.7", "driver 550"]
    assert store.latest_rebase("main") == second


def test_rebase_with_no_session_saved_yet(tmp_path, capsys):
    from pytest_llmperf.baseline.history import load_history

    store = BaselineStore(tmp_path)
    store.rebase("fresh", "first H200 runs")  # a name nothing was ever saved under
    history = load_history(store, "fresh")
    assert history.runs == [] and history.rebased.reason == "first H200 runs" and history.since_rebase == 0
    assert store.names() == []  # a marker alone is not a baseline
    with pytest.raises(BaselineMissing):
        store.latest("fresh")
    # and one rebased after its sessions, none saved since: empty, said plainly, not an error
    store.save("main", {"tests": {}, "i": 0})
    store.rebase("main", "new GPU")
    history = load_history(store, "main")
    assert history.runs == [] and history.rebase_note().endswith("new GPU; 0 session(s) since")
    assert baselines_main(["list", "--store", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("main "))
    assert "1 (0 since rebase " in row


def test_pruning_never_deletes_a_rebase_marker(tmp_path):
    from pytest_llmperf.baseline.history import load_history

    store = BaselineStore(tmp_path, keep=2)
    for i in range(3):
        store.save("main", {"tests": {}, "i": i})
    mark = store.rebase("main", "new GPU")
    for i in range(3, 6):
        store.save("main", {"tests": {}, "i": i})
    assert len(store.runs("main")) == 2
    assert mark.path.exists()
    history = load_history(store, "main")
    assert [r.run["i"] for r in history.runs] == [5, 4] and history.rebased == mark


def test_delete_keeps_the_marker_until_the_whole_name_goes(tmp_path):
    store = BaselineStore(tmp_path)
    run = store.save("main", {"tests": {}, "i": 0})
    mark = store.rebase("main", "new GPU")
    assert store.delete("main", run.name[: -len(".json.gz")]) == 1
    assert mark.path.exists() and store.latest_rebase("main") == mark  # the last run went, the marker stays
    store.save("main", {"tests": {}, "i": 1})
    assert store.delete("main") == 1
    assert not mark.path.exists() and store.latest_rebase("main") is None


def test_rebase_needs_a_reason_and_a_valid_name(tmp_path):
    store = BaselineStore(tmp_path)
    for reason in ("", "   ", None):
        with pytest.raises(StoreError, match="give the reason"):
            store.rebase("main", reason)
    with pytest.raises(StoreError, match="must not be an absolute path"):
        store.rebase("/etc", "x")
    assert _files(tmp_path / "baselines" / "main") == []


def test_interrupted_rebase_leaves_no_marker_and_no_temporary_file(tmp_path, monkeypatch):
    store = BaselineStore(tmp_path)
    run = store.save("main", {"tests": {}, "v": 1})

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(StoreError, match="cannot write rebase marker .*No space left"):
        store.rebase("main", "new GPU")
    monkeypatch.undo()
    assert _files(run.parent) == [run.name] and store.latest_rebase("main") is None


def test_unreadable_marker_still_cuts_the_history_with_a_warning(tmp_path):
    from pytest_llmperf.baseline.history import load_history

    store = BaselineStore(tmp_path)
    store.save("main", {"tests": {}, "i": 0})
    mark = store.rebase("main", "new GPU")
    store.save("main", {"tests": {}, "i": 1})
    mark.path.write_text("{not json")
    with pytest.warns(StoreWarning, match="unreadable rebase marker"):
        history = load_history(store, "main")
    assert [r.run["i"] for r in history.runs] == [1] and history.rebased.reason == "(reason unreadable)"


def test_cli_rebase(tmp_path, capsys):
    store = _seed_store(tmp_path)
    assert baselines_main(["rebase", "main", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--reason" in err and "Traceback" not in err and store.latest_rebase("main") is None
    assert baselines_main(["rebase", "main", "--reason", " ", "--store", str(tmp_path)]) == 2
    assert "give the reason" in capsys.readouterr().err
    assert baselines_main(["rebase", "main", "--reason", "H200 nodes", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "'main' rebased on " in out and "H200 nodes" in out and "the 2 session(s) saved before it" in out
    assert store.latest_rebase("main").reason == "H200 nodes" and len(store.runs("main")) == 2
    assert baselines_main(["list", "--store", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("main "))
    assert "2 (0 since rebase " in row
