import sys

import pytest

from pytest_llmperf import __version__
from pytest_llmperf.errors import pytest_flag
from pytest_llmperf.fingerprint import (
    FieldDiff,
    Fingerprint,
    FingerprintError,
    FingerprintMismatch,
    diff,
    ensure_comparable,
    valid_fields,
)
from pytest_llmperf.telemetry.gpu import collect_gpu
from pytest_llmperf.workload import Workload

H100 = Fingerprint(
    engine="vllm", engine_version="0.6.3", model="Qwen/Qwen3-8B", gpu_name="NVIDIA H100 80GB HBM3",
    gpu_count=1, gpu_driver="550.54", sampling={"temperature": 0.0, "top_p": 1.0},
    plugin_version="0.1.0", workload_hash="abc", slo={"ttft_p95": 1.0},
)


def _with(**changes):
    data = H100.to_dict()
    data.update(changes)
    return Fingerprint.from_dict(data)


def test_mapping_fields_are_canonical_and_hashable():
    a = Fingerprint(engine="vllm", sampling={"top_p": 1.0, "temperature": 0.0})
    b = Fingerprint(engine="vllm", sampling={"temperature": 0.0, "top_p": 1.0})
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a.mapping("sampling") == {"temperature": 0.0, "top_p": 1.0}
    assert Fingerprint(engine="vllm", sampling={"temperature": 0.7}) != a


def test_round_trip_and_unknown_keys_kept_in_extra():
    assert Fingerprint.from_dict(H100.to_dict()) == H100
    assert H100.to_dict()["sampling"] == {"temperature": 0.0, "top_p": 1.0}
    newer = Fingerprint.from_dict({**H100.to_dict(), "tp_size": 2})
    assert newer.mapping("extra") == {"tp_size": 2}
    assert [d.field for d in diff(H100, newer)] == ["extra.tp_size"]


@pytest.mark.parametrize("data, message", [
    ({"gpu_count": -1}, "gpu_count"),
    ({"gpu_count": "2"}, "gpu_count"),
    ({"engine": 3}, "'engine' must be a string"),
    ({"sampling": [1, 2]}, "'sampling' must be a mapping"),
    ({"slo": "not json"}, "'slo'"),
])
def test_bad_fields_are_named(data, message):
    with pytest.raises(FingerprintError, match=message):
        Fingerprint.from_dict(data, source="run.json")
    with pytest.raises(FingerprintError, match="run.json"):
        Fingerprint.from_dict(data, source="run.json")


def test_diff_names_fields_with_both_values():
    candidate = _with(gpu_name="NVIDIA A100-SXM4-80GB", engine_version="0.7.0")
    assert diff(H100, H100) == []
    diffs = diff(H100, candidate)
    assert diffs == [
        FieldDiff("engine_version", "0.6.3", "0.7.0"),
        FieldDiff("gpu_name", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"),
    ]
    with pytest.raises(FingerprintMismatch) as info:
        ensure_comparable(H100, candidate)
    assert info.value.render(pytest_flag) == (
        "baseline and candidate differ in: engine_version ('0.6.3' vs '0.7.0'), "
        "gpu_name ('NVIDIA H100 80GB HBM3' vs 'NVIDIA A100-SXM4-80GB'); "
        "pass --llmperf-allow-diff engine_version,gpu_name to compare anyway"
    )
    assert info.value.diffs == diffs


def test_mapping_diffs_show_decoded_values():
    candidate = _with(sampling={"temperature": 0.7, "top_p": 1.0})
    (d,) = diff(H100, candidate)
    assert d == FieldDiff("sampling", {"temperature": 0.0, "top_p": 1.0}, {"temperature": 0.7, "top_p": 1.0})
    assert "sampling ({'temperature': 0.0, 'top_p': 1.0} vs {'temperature': 0.7, 'top_p': 1.0})" in str(
        FingerprintMismatch([d])
    )


def test_allow_list():
    candidate = _with(gpu_name="A100", engine_version="0.7.0", extra={"tp": 2})
    assert [d.field for d in diff(H100, candidate, allow=["gpu_name"])] == ["engine_version", "extra.tp"]
    assert [d.field for d in diff(H100, candidate, allow="gpu_name, engine_version")] == ["extra.tp"]
    assert diff(H100, candidate, allow=["gpu_name,engine_version", "extra"]) == []
    assert diff(H100, candidate, allow=["gpu_name", "engine_version", "extra.tp"]) == []
    allowed = ensure_comparable(H100, candidate, allow="gpu_name,engine_version,extra.tp")
    assert {d.field for d in allowed} == {"gpu_name", "engine_version", "extra.tp"}
    with pytest.raises(FingerprintMismatch, match=r"differ in: extra.tp \(None vs 2\)"):
        ensure_comparable(H100, candidate, allow="gpu_name,engine_version")


def test_unknown_allow_names_list_valid_fields():
    with pytest.raises(FingerprintError) as info:
        diff(H100, H100, allow=["gpu", "gpu_name", "extra."])
    message = str(info.value)
    assert "unknown fingerprint field(s) allowed to differ: extra., gpu;" in message
    for name in valid_fields():
        assert name in message
    with pytest.raises(FingerprintError, match="modle"):
        ensure_comparable(H100, H100, allow="modle")


def test_stored_fingerprints_compare_as_the_gate_reads_them():
    # A stored fingerprint dict comes back through from_dict, then ensure_comparable decides.
    assert ensure_comparable(Fingerprint.from_dict(H100.to_dict()), H100) == []
    with pytest.raises(FingerprintMismatch, match="model"):
        ensure_comparable(Fingerprint.from_dict(_with(model="other").to_dict()), H100)
    with pytest.raises(FingerprintError):
        Fingerprint.from_dict({"gpu_count": "broken"})
    allowed = ensure_comparable(Fingerprint.from_dict(_with(model="other").to_dict()), H100, allow=["model"])
    assert [d.field for d in allowed] == ["model"]


def test_for_run_fills_version_hash_and_gpu():
    workload = Workload(rate_rps=2.0, duration_s=10)
    fp = Fingerprint.for_run(engine="sim", model="m", workload=workload, sim_preset="llama8b-h100",
                             gpu={"gpu_name": "none", "gpu_count": 0, "gpu_driver": "none"})
    assert fp.plugin_version == ".".join(__version__.split(".")[:2])  # major.minor only
    assert fp.workload_hash == workload.content_hash()
    assert fp.sim_preset == "llama8b-h100" and fp.gpu_count == 0


class FakeNvml:
    def __init__(self, names, driver=b"550.54.15", fail_init=False):
        self.names, self.driver, self.fail_init = names, driver, fail_init
        self.shutdown_called = False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}aaa-bbbb"

    def nvmlDeviceGetName(self, handle):
        return self.names[handle]


# The inventory lives with the NVML sampler (telemetry/gpu.py): the domain reads no NVML.


def test_for_run_without_gpu_info_records_no_gpu():
    assert Fingerprint.for_run(engine="vllm", model="m").to_dict()["gpu_name"] == "none"


def test_collect_gpu_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    assert collect_gpu() == {"gpu_name": "none", "gpu_count": 0, "gpu_driver": "none"}
    assert collect_gpu(nvml=FakeNvml([], fail_init=True)) == {"gpu_name": "none", "gpu_count": 0, "gpu_driver": "none"}


def test_collect_gpu_with_fake_nvml():
    nvml = FakeNvml([b"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    assert collect_gpu(nvml=nvml, environ={}) == {
        "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 2, "gpu_driver": "550.54.15"}
    assert nvml.shutdown_called
    mixed = FakeNvml(["NVIDIA L4", "NVIDIA A10G", "NVIDIA L4"])
    assert collect_gpu(nvml=mixed, environ={})["gpu_name"] == "NVIDIA A10G + NVIDIA L4"
    assert collect_gpu(nvml=mixed, environ={"CUDA_VISIBLE_DEVICES": "2,0"}) == {
        "gpu_name": "NVIDIA L4", "gpu_count": 2, "gpu_driver": "550.54.15"}
    assert collect_gpu(nvml=mixed, environ={"CUDA_VISIBLE_DEVICES": "GPU-1aaa"})["gpu_name"] == "NVIDIA A10G"
    assert collect_gpu(nvml=mixed, environ={"CUDA_VISIBLE_DEVICES": "-1"})["gpu_count"] == 0
