# pytester's in-process runs drop modules first imported during a run; importing the plugin's
# whole dependency graph here keeps one copy of httpx/httpcore classes across runs (otherwise an
# `except httpx.TransportError` can miss an exception raised by a re-imported httpcore).
from pathlib import Path  # noqa: E402

import httpcore  # noqa: F401
import httpx  # noqa: F401
import pytest  # noqa: E402

# The package imports scipy.stats on first use; first used inside an in-process run, it would be
# dropped with that run's modules, and numpy's C extensions it pulls in cannot load twice in one
# process ("cannot load module more than once per process") at the next run.
import scipy.stats  # noqa: F401, E402

import pytest_llmperf.cli.main  # noqa: F401
import pytest_llmperf.plugin.perf  # noqa: F401
import pytest_llmperf.plugin.summary  # noqa: F401
import pytest_llmperf.sim.server  # noqa: F401

# The same rule, for speed: every session writes plots at its end, and each in-process run would
# import matplotlib again (about 2 s a session) unless it is imported here.
try:
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import matplotlib.ticker  # noqa: F401
except ImportError:  # plots are optional: the sessions then write none
    pass

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _not_in_ci(monkeypatch):
    """The plugin is stricter in CI (CI=true): invalid runs fail. The project's own tests run in
    CI on a shared 2-core machine; tests that check the CI behaviour set CI themselves."""
    monkeypatch.delenv("CI", raising=False)


# ---------------------------------------------------------------------- the serial group
#
# scripts/test.sh runs `pytest -n N -m "not serial"`, then the serial tests alone (BESIDE_SERIAL's
# real-engine tests in a run of their own beside them, the engine at idle priority). A test is
# serial when an assertion depends on measured time (latencies, rates, lags, wall-clock bounds) or
# on signals: beside a second busy worker on a 2-core machine it would measure the other worker.
# Listed here (file -> test function names, or None for the whole file) rather than marked in each
# file, so the split is one table to review; `realengine` tests are serial too (a CPU engine wants
# both cores). Any test may also carry @pytest.mark.serial itself.
SERIAL: dict[str, frozenset[str] | None] = {
    # gate end to end: measured A/A sessions must pass, slowed ones read REGRESSED, faster ones
    # IMPROVED (the gate's tests on stored entries, test_baseline_gate.py, test_compare_cli.py and
    # test_gate_*.py, run in parallel)
    "test_one_gate.py": None,
    # the README's save-then-gate flow: the example suites' absolute SLO limits must hold
    "test_example_flow.py": None,
    "test_adaptive_trials.py": None,
    "test_ab.py": frozenset({
        "test_a_slower_candidate_regresses_against_the_reference", "test_reference_already_running_at_a_url",
        "test_capacity_searches_are_compared_side_by_side",
    }),
    "test_bisect.py": frozenset({
        "test_git_bisect_run_finds_the_commit_that_slowed_the_server",
        "test_git_bisect_run_in_ab_mode_needs_no_stored_baseline",
    }),
    "test_xdist.py": frozenset({"test_verdicts_under_xdist_match_a_run_without_it"}),
    # the simulator held to its model, and load-generator / pacer / worker timing
    "test_sim_fidelity.py": None,
    "test_loadgen.py": None,
    "test_workers.py": frozenset({"test_open_loop_summary_is_the_same_from_one_or_two_workers"}),
    "test_ray.py": None,  # clock offsets and dispatch lag across Ray workers
    "test_integration.py": frozenset({
        "test_cold_run_has_no_prefix_hits_and_warm_run_hits_with_lower_ttft", "test_slowdown_scales_tpot",
    }),
    "test_multiturn.py": frozenset({
        "test_follow_up_turns_resend_the_answers_hit_the_cache_and_start_faster",
        "test_max_concurrency_caps_requests_in_flight_with_a_rate",
    }),
    "test_arrivals.py": frozenset({"test_pacer_never_releases_early_and_is_not_millisecond_quantised"}),
    "test_capacity.py": frozenset({"test_capacity_matches_the_simulators_saturation_and_drops_with_a_slowdown"}),
    "test_traces.py": frozenset({"test_replay_on_the_simulator_sends_every_row_on_time_and_hits_shared_prefixes"}),
    "test_sim_kinds.py": frozenset({
        "test_the_encoder_time_lands_in_ttft_and_a_repeated_image_skips_it", "test_the_text_reference_is_sane",
        "test_kinds_follow_the_model",
    }),
    "test_sim_constrained.py": frozenset({
        "test_the_client_judges_the_simulators_constrained_answers", "test_the_client_reads_the_acceptance_from_the_counters",
        "test_an_adapter_load_lands_in_the_ttft_of_its_request",
        "test_tpot_of_constrained_and_speculative_chat_follows_the_model", "test_ttft_of_lora_chat_follows_the_model",
    }),
    "test_sim_api.py": frozenset({
        "test_requests_are_batched", "test_reasoning_then_visible_and_multi_token_chunks",
        "test_llama8b_end_to_end_latency_is_realistic", "test_stop_is_quick_with_streams_in_flight",
    }),
    "test_sim_scheduler.py": frozenset({
        "test_engine_timing_follows_the_model_without_drift", "test_engine_time_scale_and_idle_cost",
    }),
    "test_sim_faults.py": frozenset({
        "test_stalls_hold_chunks_back_while_generation_continues",
        "test_slowdown_and_time_scale_stretch_latency_end_to_end",
    }),
    "test_client.py": frozenset({
        "test_server_time_stamps_share_the_client_time_base", "test_many_concurrent_streams",
        "test_max_connections_bounds_open_connections", "test_stall_beyond_timeout",
        "test_cancel_propagates_and_keeps_measurements",
    }),
    # signals and wall-clock bounds on process teardown
    "test_plugin.py": frozenset({
        "test_interrupted_launch_leaves_no_server_process",
        "test_command_server_that_never_becomes_ready_shows_log_tail",
    }),
    "test_servers.py": frozenset({
        "test_ctrl_c_during_startup_leaves_no_process", "test_sigterm_stops_servers_then_terminates_like_the_default",
        "test_stop_kills_the_whole_group_including_a_sigterm_ignoring_grandchild",
        "test_reaper_chains_to_previous_handler_and_uninstall_restores",
    }),
    "test_sim_cli.py": frozenset({"test_module_entry_point_serves_and_stops"}),
    "test_faults.py": frozenset({"test_signal_stops_everything_and_keeps_what_was_measured"}),
}


# Real-engine tests that check plumbing and counts, never speed, and spend most of their time in
# vLLM's CPU build (its start-up alone is 18-30 s a launch): scripts/test.sh runs them beside the
# serial run, in a pytest run of their own, with the engine's processes at the idle CPU priority
# (SCHED_IDLE), so they take only the CPU the timing-sensitive tests leave. Their own client stays
# at normal priority: a starved client falls behind its schedule, which makes a run invalid.
BESIDE_SERIAL: dict[str, frozenset[str] | None] = {"test_realengine_vllm.py": None, "test_realengine_vllm_kinds.py": None}


# The parallel group's longest tests, started first: a long test handed out last runs alone on one
# worker while the others sit idle.
FIRST: dict[str, frozenset[str] | None] = {
    "test_convert_vllm.py": frozenset({"test_the_text_suite_passes_on_the_simulator",
                                       "test_the_multimodal_suite_passes_on_the_simulator"}),
    "test_code_rules.py": frozenset({"test_mypy_is_clean"}),
}


def _listed(table: dict[str, frozenset[str] | None], item: pytest.Item) -> bool:
    if item.path.parent != TESTS or item.path.name not in table:
        return False
    names = table[item.path.name]
    return names is None or (getattr(item, "originalname", None) or item.name) in names


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _listed(SERIAL, item) or item.get_closest_marker("realengine"):
            item.add_marker(pytest.mark.serial)
            if _listed(BESIDE_SERIAL, item):
                item.add_marker(pytest.mark.beside_serial)
    items.sort(key=lambda item: not _listed(FIRST, item))  # stable: the rest keep their order


def pytest_configure(config):
    # A renamed file or test would silently leave the serial group and run beside another worker.
    missing = []
    for file, names in [*SERIAL.items(), *FIRST.items(), *BESIDE_SERIAL.items()]:
        path = TESTS / file
        if not path.is_file():
            missing.append(file)
            continue
        source = path.read_text()
        missing.extend(f"{file}::{name}" for name in sorted(names or ()) if f"def {name}(" not in source)
    if missing:
        raise pytest.UsageError(f"tests/conftest.py SERIAL, FIRST or BESIDE_SERIAL names tests that do not exist: {', '.join(missing)}")
