"""The simulator's noise model: a speed factor per launch and per step, lognormal with mean 1."""

import math
import statistics

import pytest

from pytest_llmperf.sim.cli import build_parser
from pytest_llmperf.sim.config import SimConfig
from pytest_llmperf.sim.noise import SpeedNoise
from pytest_llmperf.sim.perfmodel import PerfModel


def test_launch_factor_has_mean_one_and_the_given_cv():
    factors = [SpeedNoise(launch_cv=0.03, seed=s).launch_factor for s in range(4000)]
    assert statistics.fmean(factors) == pytest.approx(1.0, abs=0.002)
    assert statistics.stdev(factors) == pytest.approx(0.03, rel=0.05)


def test_seeded_launches_repeat_and_unseeded_ones_differ():
    assert SpeedNoise(0.05, seed=7).launch_factor == SpeedNoise(0.05, seed=7).launch_factor
    draws = {SpeedNoise(0.05).launch_factor for _ in range(5)}
    assert len(draws) == 5


def test_no_jitter_is_exactly_the_model():
    noise = SpeedNoise()
    assert noise.launch_factor == 1.0 and not noise.has_step_noise and noise.step_factor() == 1.0


def test_step_factors_vary_around_one():
    noise = SpeedNoise(step_cv=0.1, seed=1)
    steps = [noise.step_factor() for _ in range(20000)]
    assert statistics.fmean(steps) == pytest.approx(1.0, abs=0.003)
    assert statistics.stdev(steps) == pytest.approx(0.1, rel=0.05)


def test_launch_factor_scales_every_step_cost():
    config = SimConfig(launch_jitter=0.05, noise_seed=3)
    noise = config.noise()
    plain, noisy = config.perf_model(), config.perf_model(noise)
    assert isinstance(noisy, PerfModel)
    ratio = noisy.step_time_s(256, 256 * 128, 256) / plain.step_time_s(256, 256 * 128, 256)
    assert ratio == pytest.approx(noise.launch_factor, rel=1e-12)
    assert not math.isclose(ratio, 1.0)


@pytest.mark.parametrize("value", [-0.1, 1.0, float("nan")])
def test_bad_jitter_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match="launch_jitter"):
        SimConfig(launch_jitter=value)


def test_cli_flags_map_to_the_config():
    args = build_parser().parse_args(["--launch-jitter", "0.03", "--step-jitter", "0.02", "--seed", "5"])
    assert (args.launch_jitter, args.step_jitter, args.seed) == (0.03, 0.02, 5)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--launch-jitter", "2"])
