"""A shared baseline store on S3, against a local S3-compatible server (moto's server mode) the
tests start: save, list, prune, compare and history through the URL store; two concurrent saves
under one name both kept; a store that refuses writes or cannot be reached stops the session
before any load; a missing cloud backend names the extra to install; no credential is printed."""

import importlib
import os
import secrets
import sys
import threading

import pytest

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (in the dev extra)")
pytest.importorskip("s3fs", reason="needs s3fs (pytest-llmperf[s3], in the dev extra)")
boto3 = pytest.importorskip("boto3", reason="needs boto3 (in the dev extra)")

from pytest_llmperf.baseline.history import load_history  # noqa: E402
from pytest_llmperf.baseline.store import BaselineStore, ObjectBaselineStore, StoreError  # noqa: E402
from pytest_llmperf.cli.main import main as cli_main  # noqa: E402

SECRET = "s3cr3t-never-printed-" + secrets.token_hex(4)

SUITE = """
from pytest_llmperf import Workload, slo

MARKER = {marker!r}


@slo(tpot_p50=0.05)
def test_tiny(llmperf):
    open(MARKER, "a").close()  # proves the test body (and so the load) ran
    llmperf.run(Workload(input_tokens=64, output_tokens=16, rate_rps=40, num_requests=20, warmup_requests=3))
"""


@pytest.fixture(scope="module")
def endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(endpoint, monkeypatch):
    """Credentials and endpoint as a CI job would set them: the SDK's own variables."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "LLMPERF_STORE_OPTIONS"):
        monkeypatch.delenv(name, raising=False)
    return endpoint


def _unreachable(monkeypatch) -> None:
    """Point the SDK at a port nothing listens on, and let it give up at the first refused
    connection: its default retries (with backoff, under s3fs's own) add seconds, not coverage."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")


@pytest.fixture
def bucket(s3_env):
    name = f"perf-{secrets.token_hex(4)}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


def _doc(i: int) -> dict:
    return {"tests": {}, "i": i}


def test_url_root_gives_an_object_store_and_file_urls_stay_local(tmp_path):
    assert isinstance(BaselineStore("s3://bucket/prefix"), ObjectBaselineStore)
    local = BaselineStore(f"file://{tmp_path}/store")
    assert type(local) is BaselineStore and local.root == tmp_path / "store"
    assert type(BaselineStore(tmp_path)) is BaselineStore


def test_save_list_prune_load_delete_on_s3(bucket):
    store = BaselineStore(f"s3://{bucket}/team/perf", keep=2)
    store.check_writable()
    paths = [store.save("feature/x", _doc(i)) for i in range(3)]
    store.save("main", _doc(9))
    assert str(paths[-1]).startswith(f"s3://{bucket}/team/perf/baselines/feature%2Fx/")
    assert store.names() == ["feature/x", "main"]
    runs = store.runs("feature/x")
    assert [str(r.path) for r in runs] == [str(p) for p in paths[:0:-1]]  # newest first, oldest pruned
    assert store.latest("feature/x").run == _doc(2)
    assert store.get("feature/x", runs[1].run_id).run == _doc(1)
    assert [r.run["i"] for r in load_history(store, "feature/x").runs] == [2, 1]
    assert [r.run_id for r in load_history(store, "feature/x").runs] == [r.run_id for r in runs]
    assert store.delete("feature/x", runs[0].run_id) == 1
    assert store.delete("feature/x") == 1
    assert store.names() == ["main"]
    with pytest.raises(StoreError, match="no baseline named 'feature/x'"):
        store.latest("feature/x")


def test_rebase_on_s3_cuts_the_history_and_survives_pruning(bucket, capsys):
    store = BaselineStore(f"s3://{bucket}/team/perf", keep=2)
    for i in range(3):
        store.save("main", _doc(i))
    mark = store.rebase("main", "H200 nodes")
    assert str(mark.path).startswith(f"s3://{bucket}/team/perf/baselines/main/") and str(mark.path).endswith(".rebase.json")
    assert len(store.runs("main")) == 2  # the marker is no run, and deleted nothing
    for i in range(3, 6):
        store.save("main", _doc(i))  # pruning to keep=2 leaves the marker alone
    history = load_history(store, "main")
    assert [r.run["i"] for r in history.runs] == [5, 4]
    assert history.rebased == mark and history.since_rebase == 2
    assert BaselineStore(f"s3://{bucket}/team/perf").latest_rebase("main").reason == "H200 nodes"
    assert cli_main(["baselines", "rebase", "main", "--reason", "driver 560", "--store", f"s3://{bucket}/team/perf"]) == 0
    assert load_history(store, "main").runs == [] and [m.reason for m in store.rebases("main")] == ["driver 560", "H200 nodes"]
    assert cli_main(["baselines", "list", "--store", f"s3://{bucket}/team/perf"]) == 0
    assert "2 (0 since rebase" in capsys.readouterr().out
    assert store.delete("main") == 2 and store.rebases("main") == []  # the whole name goes, markers too


def test_two_concurrent_saves_under_one_name_keep_both_runs(bucket):
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def save(i: int) -> None:
        try:
            store = BaselineStore(f"s3://{bucket}/shared", keep=10)  # one per job
            barrier.wait()
            store.save("main", _doc(i))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    runs = load_history(BaselineStore(f"s3://{bucket}/shared"), "main").runs
    assert sorted(r.run["i"] for r in runs) == [0, 1]


def test_missing_bucket_and_unreachable_endpoint_are_clear_errors(s3_env, monkeypatch):
    with pytest.raises(StoreError, match=r"s3://no-such-bucket-x/p is not writable \(.*bucket does not exist"):
        BaselineStore("s3://no-such-bucket-x/p").check_writable()
    _unreachable(monkeypatch)
    with pytest.raises(StoreError, match="not writable.*Could not connect") as excinfo:
        BaselineStore("s3://bucket/p").check_writable()
    assert SECRET not in str(excinfo.value)


def test_missing_backend_names_the_extra(monkeypatch):
    registry = importlib.import_module("fsspec.registry")._registry  # `fsspec.registry` is a read-only view

    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if s3fs were not installed
    monkeypatch.delitem(registry, "s3", raising=False)  # nor imported already
    with pytest.raises(StoreError, match=r"pip install 'pytest-llmperf\[s3\]'"):
        BaselineStore("s3://bucket/p").names()
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(StoreError, match=r"pytest-llmperf\[gcs\]"):
            BaselineStore("gs://bucket/p").names()
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(StoreError, match=r"needs fsspec; pip install 'pytest-llmperf\[azure\]'"):
        BaselineStore("az://container/p").names()


# ---------------------------------------------------------------------- through pytest and the CLI


def _session(pytester, *args):
    # Every report but the plots: nothing here looks at them (a second or two a session).
    return pytester.runpytest("-p", "no:cacheprovider", "--llmperf-plots", "off", "--llmperf-sim-preset", "tiny",
                              "--llmperf-trials", "2", *args)


@pytest.mark.integration
def test_sessions_save_to_s3_then_compare_history_and_list(pytester, bucket, capsys):
    url = f"s3://{bucket}/ci"
    pytester.makepyfile(test_tiny=SUITE.format(marker=str(pytester.path / "ran")))
    _session(pytester, "--llmperf-store", url, "--llmperf-save", "main").assert_outcomes(passed=1)
    store = BaselineStore(url)
    store.save("main", store.latest("main").run)  # a second session of main, through the store's API
    slow = _session(pytester, "--llmperf-store", url, "--llmperf-save", "slow", "--llmperf-baseline", "main",
                    "--llmperf-sim-args", "--slowdown 1.5")
    slow.assert_outcomes(failed=1)
    slow.stdout.fnmatch_lines(["*tpot_p50*REGRESSED*"])
    assert len(store.runs("main")) == 2 and len(store.runs("slow")) == 1
    capsys.readouterr()
    assert cli_main(["compare", "main", "slow", "--store", url]) == 1
    assert "REGRESSED" in capsys.readouterr().out
    assert cli_main(["compare", "main", "slow", "--store", url, "--bisect"]) == 1
    assert cli_main(["history", "main", "--store", url]) == 0
    assert cli_main(["baselines", "list", "--store", url]) == 0
    out = capsys.readouterr().out
    assert "main" in out and "slow" in out
    assert SECRET not in out + slow.stdout.str() + slow.stderr.str()


@pytest.mark.integration
@pytest.mark.parametrize("case", ["no-bucket", "unreachable"])
def test_store_that_cannot_take_the_save_stops_the_session_before_any_load(pytester, s3_env, monkeypatch, case):
    marker = pytester.path / "ran"
    pytester.makepyfile(test_tiny=SUITE.format(marker=str(marker)))
    if case == "unreachable":
        _unreachable(monkeypatch)
    result = _session(pytester, "--llmperf-store", "s3://no-such-bucket-y/ci", "--llmperf-save", "main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--llmperf-save main: baseline store s3://no-such-bucket-y/ci is not writable" in err
    assert ("bucket does not exist" if case == "no-bucket" else "Could not connect") in err
    assert not marker.exists() and "llmperf summary" not in result.stdout.str()
    assert SECRET not in err + result.stdout.str()


@pytest.mark.integration
def test_unreachable_store_for_the_baseline_stops_the_session_before_any_load(pytester, s3_env, monkeypatch):
    marker = pytester.path / "ran"
    pytester.makepyfile(test_tiny=SUITE.format(marker=str(marker)))
    _unreachable(monkeypatch)
    result = _session(pytester, "--llmperf-store", "s3://bucket/ci", "--llmperf-baseline", "main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--llmperf-baseline main: baseline store s3://bucket/ci: cannot list" in result.stderr.str()
    assert not marker.exists()
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in result.stderr.str()
