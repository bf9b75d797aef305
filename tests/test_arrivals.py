import numpy as np
import pytest

from pytest_llmperf.load.arrivals import arrival_times, gaps


@pytest.mark.parametrize("process,shape,cv", [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5), ("constant", 1.0, 0.0)])
def test_mean_rate_and_cv_within_sampling_error(process, shape, cv):
    rng = np.random.default_rng(5)
    n = 20000
    g = gaps(process, 10.0, shape, rng, n)
    # mean gap 0.1 s; the standard error of the mean is cv*0.1/sqrt(n)
    se = max(cv, 1e-9) * 0.1 / np.sqrt(n)
    assert abs(g.mean() - 0.1) < 4 * se + 1e-12
    measured_cv = g.std() / g.mean()
    assert measured_cv == pytest.approx(cv, abs=0.05 * max(cv, 0.2))


def test_arrival_stream_starts_at_zero_is_increasing_and_reproducible():
    a = arrival_times("poisson", 50.0, 1.0, seed=3)
    b = arrival_times("poisson", 50.0, 1.0, seed=3)
    xs = [next(a) for _ in range(500)]
    ys = [next(b) for _ in range(500)]
    assert xs == ys
    assert xs[0] == 0.0
    assert all(x2 > x1 for x1, x2 in zip(xs, xs[1:]))
    # 499 gaps at 50 rps: about 10 s
    assert 8.5 < xs[-1] < 11.5


def test_unknown_process_and_bad_rate_are_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="poisson, gamma, constant"):
        gaps("uniform", 1.0, 1.0, rng, 3)
    with pytest.raises(ValueError, match="positive"):
        gaps("poisson", 0.0, 1.0, rng, 3)


def test_pacer_never_releases_early_and_is_not_millisecond_quantised():
    import asyncio
    import sys
    import time

    from pytest_llmperf.load.arrivals import Pacer

    async def lateness(pacer):
        out = []
        start = time.perf_counter() + 0.005
        for i in range(60):
            when = start + i * 0.0033  # deliberately off the millisecond grid
            entered = time.perf_counter()
            await pacer.wait_until(when)
            if entered < when:  # a preempted process reaches some instants already late: not the pacer's
                out.append(time.perf_counter() - when)
        pacer.close()
        return np.array(out)

    precise = Pacer()
    if sys.platform.startswith("linux"):
        assert precise.precise  # the timerfd path is available on Linux
    for pacer in (precise, Pacer(use_timerfd=False)):
        late = asyncio.run(lateness(pacer))
        assert late.min() >= 0.0  # never before the instant
        # A plain asyncio.sleep lands 0-1 ms late (epoll's millisecond grid) plus the loop's own
        # overhead; the pacer's typical wake-up is a fraction of that, even on a busy machine.
        assert len(late) > 20 and np.median(late) < 0.0004, late
