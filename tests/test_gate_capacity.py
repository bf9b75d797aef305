import saved

from pytest_llmperf.baseline.compare import compare_capacity
from pytest_llmperf.fingerprint import Fingerprint
from pytest_llmperf.stats import Verdict

FP = Fingerprint.for_run(engine="sim", model="m", gpu={"gpu_name": "none", "gpu_count": 0, "gpu_driver": "none"})


def _verdict(base, cand):
    return compare_capacity("k", saved.capacity(*base, fingerprint=FP), saved.capacity(*cand, fingerprint=FP),
                            tolerance=0.05, alpha=0.05).comparisons[0]


def test_capacity_brackets_decide():
    assert _verdict((34.0, 35.5), (26.0, 27.2)).verdict is Verdict.REGRESSED
    assert _verdict((26.0, 27.2), (34.0, 35.5)).verdict is Verdict.IMPROVED
    assert _verdict((34.0, 35.0), (34.2, 35.1)).verdict is Verdict.UNCHANGED
    assert _verdict((34.0, 38.0), (31.0, 34.0)).verdict is Verdict.INCONCLUSIVE
    none = _verdict((34.0, 35.0), (None, 1.0))
    assert none.verdict is Verdict.NOT_GATED and "no passing rate" in none.reason


def test_regressed_capacity_message_reads_like_the_others():
    c = _verdict((34.0, 35.5), (26.0, 27.2))
    assert c.message().startswith("capacity_rps 34")
    assert "→ 26" in c.message()
