"""Load from a Ray cluster: the same schedule as one process, clock offsets, lost nodes, bad input.

The cluster is a local one started here (127.0.0.1, 2 CPUs, no dashboard) and shut down after
the module; tests that need it skip with the reason where Ray cannot be imported.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
import types

import pytest

from pytest_llmperf.cli.options import OPTIONS, resolve
from pytest_llmperf.errors import InputError
from pytest_llmperf.load.ray_load import (
    INSTALL,
    NodeShare,
    RayError,
    RayMissingError,
    RayRun,
    _reasons,
    connect,
)
from pytest_llmperf.load.runner import Runner
from pytest_llmperf.load.runner_config import RunnerConfig
from pytest_llmperf.results import with_invalid_reasons
from pytest_llmperf.sim import SimConfig, start_in_thread
from pytest_llmperf.workload import Workload, WorkloadError


@pytest.fixture(autouse=True)
def no_fork_of_a_threaded_process(recwarn):
    """Forking a process that runs threads can deadlock the child; Python 3.12+ warns "This
    process ... is multi-threaded, use of fork() may lead to deadlocks in the child". Workers must
    start without that hazard, so the warning fails the test. (A filterwarnings "error" mark
    cannot do it: CPython swallows an exception raised by this warning inside os.fork.)"""
    yield
    forks = [str(w.message) for w in recwarn if "use of fork() may lead to deadlocks" in str(w.message)]
    assert not forks, forks


def _ray_or_skip():
    try:
        import ray
    except Exception as exc:  # noqa: BLE001 - any import failure: no Ray on this platform
        pytest.skip(f"Ray cannot be imported here ({type(exc).__name__}: {exc}); install it with {INSTALL}")
    return ray


@pytest.fixture(scope="module")
def ray_cluster():
    ray = _ray_or_skip()
    environ = dict(os.environ)  # ray.init sets variables (RAY_AUTH_MODE...) that other tests must not see
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level="WARNING", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(environ)


@pytest.fixture(scope="module")
def sim():
    with start_in_thread(SimConfig(preset="tiny")) as handle:
        yield handle


def _schedule(result):
    """Each request's scheduled send, relative to the first one, by index."""
    records = sorted(result.trials[0].records, key=lambda r: r.index)
    t0 = records[0].scheduled_s
    return [(r.index, r.phase, round(r.scheduled_s - t0, 6)) for r in records]


def test_one_process_two_local_workers_and_two_ray_workers_send_the_same_schedule(sim, ray_cluster):
    # 50 requests: the three throughputs agree to ~0.1% (the schedule sets the window), 5% allowed
    w = Workload(input_tokens=64, output_tokens=16, rate_rps=50, arrival="poisson", num_requests=50,
                 warmup_requests=4, seed=11)
    one = Runner(sim.base_url).run(w)
    local = Runner(sim.base_url, RunnerConfig(workers=2)).run(w)
    on_ray = Runner(sim.base_url, RunnerConfig(ray_address="auto", ray_workers=2)).run(w)
    counts = [(r.summary.requests, r.summary.completed, len(r.trials[0].records)) for r in (one, local, on_ray)]
    assert counts == [(50, 50, 54)] * 3
    assert _schedule(one) == _schedule(local) == _schedule(on_ray)
    for other in (local, on_ray):
        assert other.summary.request_throughput_rps == pytest.approx(one.summary.request_throughput_rps, rel=0.05)
        assert other.summary.output_throughput_tps == pytest.approx(one.summary.output_throughput_tps, rel=0.05)
        assert other.summary.goodput_rps == pytest.approx(one.summary.goodput_rps, rel=0.05)
    assert on_ray.summary.validity.valid, on_ray.summary.validity.reasons
    # Where each share ran, and each node's clock offset to the driver, are in the result.
    dist = on_ray.trials[0].distributed.to_dict()
    assert dist["backend"] == "ray" and dist["workers"] == 2 and dist["reasons"] == []
    nodes = dist["nodes"]
    assert [n["share"] for n in nodes] == ["arrivals with index % 2 == 0", "arrivals with index % 2 == 1"]
    assert [n["requests"] for n in nodes] == [27, 27] and {n["status"] for n in nodes} == {"ok"}
    for n in nodes:  # one machine: the offset is ~0, known to well under the 5 ms bound
        assert abs(n["clock_offset_s"]) < 0.005 and 0 < n["clock_uncertainty_s"] < 0.005
    # Records from the two nodes interleave in schedule order on the driver's time axis.
    assert sorted(r.index for r in on_ray.trials[0].records) == list(range(54))
    assert max(r.dispatch_lag_s for r in on_ray.trials[0].measured) < 0.05


def test_closed_loop_divides_concurrency_and_requests_over_ray_workers(sim, ray_cluster):
    # The head's GCS address (host:port) works as well as "auto".
    address = ray_cluster.get_runtime_context().gcs_address
    w = Workload(input_tokens=32, output_tokens=8, concurrency=4, num_requests=40, seed=1,
                 ray_address=address, ray_workers=2)
    result = Runner(sim.base_url).run(w)
    assert result.summary.requests == 40 and result.summary.completed == 40
    nodes = result.trials[0].distributed.to_dict()["nodes"]
    assert [n["share"] for n in nodes] == ["concurrency 2, 20 requests"] * 2
    assert [n["requests"] for n in nodes] == [20, 20]


def test_a_node_that_dies_mid_run_leaves_its_share_missing_and_the_run_invalid(sim, ray_cluster):
    from ray.util import list_named_actors

    w = Workload(input_tokens=32, output_tokens=8, rate_rps=40, arrival="constant", duration_s=2, seed=2)
    killed = []

    def kill_worker_1() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            names = [n for n in list_named_actors() if n.startswith("llmperf-load-") and n.endswith("-1")]
            if names:
                seen = sim.state.requests_seen
                while sim.state.requests_seen < seen + 30 and time.monotonic() < deadline:
                    time.sleep(0.01)  # mid-run: once the actors have sent some of their load
                ray_cluster.kill(ray_cluster.get_actor(names[0]))
                killed.append(names[0])
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_worker_1)
    killer.start()
    # No rerun of the invalid trial here: the point is what the invalid trial itself reports.
    result = Runner(sim.base_url, RunnerConfig(ray_address="auto", ray_workers=2, rerun_invalid=False)).run(w)
    killer.join()
    assert killed
    nodes = result.trials[0].distributed.to_dict()["nodes"]
    assert [n["status"] for n in nodes] == ["ok", "missing"]
    assert "ActorDiedError" in nodes[1]["error"]
    validity = result.summary.validity
    assert not validity.valid
    missing = [r for r in validity.reasons if "died during the run" in r]
    assert len(missing) == 1 and "arrivals with index % 2 == 1" in missing[0] and "is missing" in missing[0]
    # The surviving node's records are kept: every even index, none of the odd ones.
    indices = [r.index for r in result.trials[0].records]
    assert len(indices) >= 36 and all(i % 2 == 0 for i in indices)  # 2 s at 40 req/s: 40 of 80
    assert result.trials[0].invalid_reasons == result.trials[0].distributed.to_dict()["reasons"]


def test_unreachable_address_fails_before_any_load_naming_the_address(ray_cluster):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"ray://127.0.0.1:{port}"
    # The server URL is unreachable too: reaching it would raise RunError, so RayError proves
    # the address was checked before any request.
    runner = Runner("http://127.0.0.1:9/v1", RunnerConfig(ray_address=address, ray_workers=2))
    with pytest.raises(RayError, match=f"cannot reach the Ray cluster at {address}"):
        runner.run(Workload(rate_rps=10, num_requests=5))


def test_version_mismatch_shows_rays_error_and_what_to_align():
    ray = _ray_or_skip()
    from ray._private.utils import check_version_info

    def init(**_kwargs):  # what ray.init raises against a cluster of another version (Ray's own text)
        check_version_info({"ray_version": "2.9.3", "python_version": "3.10.12"}, "Ray Client")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init, __version__=ray.__version__)
    with pytest.raises(RayError) as info:
        connect("auto", fake)
    text = str(info.value)
    assert text.startswith("Version mismatch: The cluster was started with:") and "Ray: 2.9.3" in text
    last = text.splitlines()[-1]
    assert last.startswith("pytest-llmperf: the driver and the cluster at auto must run the same Ray and Python")
    assert ray.__version__ in last


def test_without_the_extra_the_option_fails_at_the_start_with_the_install_command(monkeypatch, pytester):
    monkeypatch.setitem(sys.modules, "ray", None)  # "import ray" now fails as if not installed
    with pytest.raises(RayMissingError, match=r"pip install 'pytest-llmperf\[ray\]'"):
        Runner("http://127.0.0.1:9/v1", RunnerConfig(ray_address="auto"))
    pytester.makepyfile("def test_nothing():\n    pass\n")
    out = pytester.runpytest("--llmperf-ray-address", "auto")
    assert out.ret == pytest.ExitCode.USAGE_ERROR
    out.stderr.fnmatch_lines(["*--llmperf-ray-address auto: Ray is not installed here; install it with: "
                              "pip install 'pytest-llmperf?ray?'"])


def test_ray_options_flags_ini_and_bad_values():
    names = {o.name for o in OPTIONS}
    assert {"ray-address", "ray-workers"} <= names
    ini = {"llmperf_ray_address": "ray://head:10001", "llmperf_ray_workers": "4"}
    opts = resolve(lambda dest: None, lambda key: ini.get(key))
    assert (opts.ray_address, opts.ray_workers) == ("ray://head:10001", 4)
    with pytest.raises(InputError, match="ray_workers needs a Ray cluster address"):
        Runner("http://127.0.0.1:9/v1", RunnerConfig(ray_workers=2)).run(Workload(rate_rps=1, num_requests=1))
    with pytest.raises(InputError, match="not 'auto', 'ray://host:port' or 'host:port'"):
        Runner("http://127.0.0.1:9/v1", RunnerConfig(ray_address="head-without-port"))
    with pytest.raises(WorkloadError, match="ray_workers must be a positive integer"):
        Workload(rate_rps=1, num_requests=1, ray_workers=0)
    # Where the load comes from is not part of the traffic's fingerprint.
    base = Workload(rate_rps=1, num_requests=1)
    assert dataclasses.replace(base, ray_address="auto", ray_workers=3).content_hash() == base.content_hash()


def test_untrusted_clocks_make_the_run_invalid_with_the_reason():
    w = Workload(rate_rps=10, num_requests=10)
    good = NodeShare(0, "10.0.0.1", clock_offset_s=0.0004, clock_uncertainty_s=0.0006, clock_drift_s=0.0001)
    vague = NodeShare(1, "10.0.0.2", clock_offset_s=0.002, clock_uncertainty_s=0.008, clock_drift_s=0.0)
    unsynced = NodeShare(2, "10.0.0.3", clock_offset_s=0.35, clock_uncertainty_s=0.001, clock_drift_s=0.0)
    drifting = NodeShare(3, "10.0.0.4", clock_offset_s=0.001, clock_uncertainty_s=0.001, clock_drift_s=0.02)
    run = RayRun("auto", 4, 1, nodes=[good, vague, unsynced, drifting])
    reasons = _reasons(run, [], w, 1)
    assert len(reasons) == 3
    assert "ray worker 1 on 10.0.0.2: clock offset +2.00 ms known only to ±8.0 ms (> 5 ms)" in reasons[0]
    assert "ray worker 2 on 10.0.0.3: wall clock +350.0 ms off the driver's" in reasons[1]
    assert "ray worker 3 on 10.0.0.4: clock offset drifted by +20.0 ms" in reasons[2]
    from pytest_llmperf.metrics import summarize

    summary = with_invalid_reasons(summarize([]), reasons)
    assert not summary.validity.valid and summary.validity.reasons[-3:] == reasons

