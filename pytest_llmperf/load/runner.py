"""Run a workload against an OpenAI-compatible server: prompts -> load -> records -> Summary.

This is the library entry point the pytest layer and the CLI share::

    runner = Runner("http://127.0.0.1:8000/v1")
    result = runner.run(Workload(input_tokens=256, output_tokens=128, rate_rps=4, duration_s=30))
    print(result.summary.ttft_s.p95)

A workload with ``trials=N`` runs N full trials (each with its own warm-up); statistics are kept per
trial for the baseline comparison, and ``result.summary`` pools the trials' measured requests.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING

import httpx
import numpy as np

from pytest_llmperf.cache_check import verify as verify_cache
from pytest_llmperf.cache_check import verify_conversation, verify_hit_rate
from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.load.client import StreamingClient
from pytest_llmperf.load.file_requests import DatasetTraffic, TraceTraffic, load_dataset
from pytest_llmperf.load.loadgen import LoadGenerator, LoadOutcome, OverloadGuard, Progress, run_sync
from pytest_llmperf.load.multiturn import ConversationLoad
from pytest_llmperf.load.prompts import (
    PromptFactory,
    TokenModel,
    calibrate_with_tokenizer,
    estimated_model,
    exact_prompts,
    fit_from_usage,
    planned_requests,
)
from pytest_llmperf.load.workers import ClientSpec, run_in_workers
from pytest_llmperf.metrics import summarize
from pytest_llmperf.records import PreparedRequest, RequestRecord
from pytest_llmperf.results import (
    THROTTLE_POLICIES,
    RunResult,
    TrialResult,
    generated_tokens,
    pooled_summary,
    with_gpu,
    with_invalid_reasons,
)
from pytest_llmperf.telemetry import GpuSampler, ServerTelemetry, TelemetrySampler
from pytest_llmperf.timeslices import DEFAULT_TIMESLICE_S, GaugeSample, check_timeslice_s, compute_timeslices
from pytest_llmperf.traffic.datasets import read_dataset
from pytest_llmperf.traffic.traces import scan as scan_trace

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_llmperf.cache_check import CacheCheck
    from pytest_llmperf.load.ray_load import RayRun
    from pytest_llmperf.objectives import SLO
    from pytest_llmperf.telemetry.gpu import GpuTelemetry
    from pytest_llmperf.timeslices import Timeslices
    from pytest_llmperf.workload import Workload


class RunError(LLMPerfError, RuntimeError):
    """The run could not start (server unreachable, model unknown); the message says why."""


class Runner:
    """Bound to one server; runs workloads against it."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        extra_body: dict[str, object] | None = None,
        send_ignore_eos: bool = True,
        length_fields: Callable[[int, bool, int | None], dict[str, object]] | None = None,
        metrics_url: str | None = None,
        reset_cache_url: str | None = None,
        progress: Callable[[Progress], None] | None = None,
        progress_interval_s: float = 2.0,
        workers: int | None = None,
        use_uvloop: bool | None = None,
        overload: OverloadGuard | None = None,
        rerun_invalid: bool = True,
        ray_address: str | None = None,
        ray_workers: int | None = None,
        gpu_telemetry: bool = False,
        throttle: str = "invalid",
        gpu_interval_s: float = 0.5,
        timeslice_s: float = DEFAULT_TIMESLICE_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._api_key = api_key
        self.extra_body = dict(extra_body or {})
        self.send_ignore_eos = send_ignore_eos
        self.length_fields = length_fields
        # Where the server's Prometheus metrics live; None skips server telemetry.
        self.metrics_url = metrics_url
        # POSTed before every trial where the engine offers it (vLLM /reset_prefix_cache, SGLang
        # /flush_cache), so each trial starts from the same cache state; its warm-up re-warms it.
        self.reset_cache_url = reset_cache_url
        self.cache_resets_failed = 0
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        # Load-generator processes per trial (None: the workload's own ``workers``); see workers.py.
        if workers is not None and not (isinstance(workers, int) and not isinstance(workers, bool) and workers >= 1):
            raise InputError(f"workers must be a positive integer, got {workers!r}")
        self.workers = workers
        # Load from a Ray cluster (None: the workload's own ``ray_address``); see ray_load.py.
        if ray_address is not None:
            from pytest_llmperf.load import ray_load

            ray_address = ray_load.check_address(ray_address)
            ray_load.require_ray()  # a missing extra fails here, before anything runs
        if ray_workers is not None and not (isinstance(ray_workers, int) and not isinstance(ray_workers, bool)
                                            and ray_workers >= 1):
            raise InputError(f"ray_workers must be a positive integer, got {ray_workers!r}", option="ray-workers")
        self.ray_address = ray_address
        self.ray_workers = ray_workers
        # None: uvloop when installed (cheaper per chunk), True: required, False: never.
        self.use_uvloop = use_uvloop
        # Ends open-loop trials early when the backlog grows without bound (capacity search).
        self.overload = overload
        # Run an invalid trial (client lag, dispatch lag, Little's law) once more before keeping it.
        self.rerun_invalid = rerun_invalid
        # Sample this machine's GPUs (NVML) during every trial: for a server launched here. Without
        # NVML or a GPU the trial's ``gpu`` says why and nothing else changes.
        self.gpu_telemetry = gpu_telemetry
        if throttle not in THROTTLE_POLICIES:
            raise InputError(f"throttle must be one of {', '.join(THROTTLE_POLICIES)}, got {throttle!r}")
        # A trial whose GPU throttled for heat or power: "invalid" (not gated) or "warn".
        self.throttle = throttle
        self.gpu_interval_s = gpu_interval_s
        # Length of the intervals each trial's window is cut into (TrialResult.timeslices).
        self.timeslice_s = check_timeslice_s(timeslice_s)
        self._token_models: dict[str, TokenModel] = {}

    def __repr__(self) -> str:  # never show the key
        return f"Runner({self.base_url!r}, model={self.model!r})"

    def run(self, workload: Workload, *, slo: SLO | None = None, trials: int | None = None) -> RunResult:
        return run_sync(self.arun(workload, slo=slo, trials=trials), use_uvloop=self.use_uvloop)

    async def arun(self, workload: Workload, *, slo: SLO | None = None, trials: int | None = None) -> RunResult:
        n_trials = trials or workload.trials or 1
        results = []
        if workload.trace is not None:
            scan_trace(workload.trace)  # a bad line fails here, before any load
        if workload.dataset is not None:
            read_dataset(workload.dataset, workload.seed)
        ray_address = self._ray_address(workload)
        if ray_address is not None:
            from pytest_llmperf.load import ray_load

            # An unreachable cluster or a version mismatch fails here, before any request is sent.
            ray_load.connect(ray_address)
        model = await self._resolve_model()
        # The calibration probes obey the workload's request timeout: a stalling server must not
        # hold the run for a fixed 30 s per probe before any load is sent.
        token_model = await self._token_model(workload.api, model, timeout_s=workload.timeout_s)
        dataset = None
        if workload.dataset is not None:
            async with self._client(time.perf_counter(), timeout_s=workload.timeout_s) as client:
                client.model = model
                dataset = await load_dataset(workload, PromptFactory(workload, token_model), client)
        for index in range(n_trials):
            trial = await self._trial(workload, model, token_model, slo, index, dataset)
            if not trial.summary.validity.valid and self.rerun_invalid:
                # One rerun: a transient stall of the load generator's machine should not cost the
                # verdict; a second invalid trial stands, and the gate reports the run as invalid.
                first = trial
                trial = await self._trial(workload, model, token_model, slo, index, dataset)
                trial.reruns = 1
                trial.rerun_reasons = list(first.summary.validity.reasons)
            results.append(trial)
        return RunResult(
            workload=workload,
            model=model,
            base_url=self.base_url,
            trials=results,
            summary=pooled_summary(results, slo, throttle=self.throttle),
            token_model=token_model.to_dict(),
            slo=slo,
            label=workload.label(),
            cache_check=self._cache_check(workload, results, token_model),
        )

    @staticmethod
    def _cache_check(workload: Workload, results: list[TrialResult], token_model: TokenModel) -> CacheCheck | None:
        telemetry = [t.telemetry for t in results]
        records = [r for t in results for r in t.records]
        if workload.cache_hit_target is not None:
            return verify_hit_rate(workload.cache_hit_target, telemetry, records)
        if workload.conversation is not None:
            return verify_conversation(telemetry, records, workload.cache_block_tokens)
        if workload.trace is not None or workload.dataset is not None:
            return None  # the file decides what repeats; there is no cold/warm claim to check
        return verify_cache(workload.cache, telemetry, records,
                            template_tokens=max(0.0, token_model.overhead) if workload.api == "chat" else 0.0)
    def _ray_address(self, workload: Workload) -> str | None:
        address = self.ray_address or workload.ray_address
        if address is None and (self.ray_workers or workload.ray_workers):
            raise InputError("ray_workers needs a Ray cluster address ('auto', 'ray://host:10001' or 'host:6379')",
                             option="ray-address")
        return address

    def _client(self, origin_s: float, workload: Workload | None = None,
                timeout_s: float | None = None) -> StreamingClient:
        conns = 64
        if workload is not None:
            conns = workload.concurrency or int(max(64, (workload.rate_rps or 1) * 60))
        return StreamingClient(
            self.base_url,
            model=self.model,
            api_key=self._api_key,
            timeout_s=timeout_s if timeout_s is not None else (workload.timeout_s if workload else 30.0),
            max_connections=min(conns, 20000),
            origin_s=origin_s,
        )

    async def _resolve_model(self) -> str:
        if self.model:
            return self.model
        async with self._client(time.perf_counter()) as client:
            try:
                models = await client.list_models()
            except Exception as exc:
                raise RunError(f"cannot list models at {self.base_url}/models: {exc}") from None
        if not models:
            raise RunError(f"{self.base_url}/models lists no model; pass a model name explicitly")
        self.model = models[0]
        return self.model

    async def _token_model(self, api: str, model: str, timeout_s: float | None = None) -> TokenModel:
        if api in self._token_models:
            return self._token_models[api]
        async with self._client(time.perf_counter(), timeout_s=timeout_s) as client:
            token_model = None
            try:
                token_model = await calibrate_with_tokenizer(client, api)
            except Exception:
                token_model = None
            if token_model is None:
                token_model = await self._probe_usage(client, api)
        self._token_models[api] = token_model
        return token_model

    async def _reset_cache(self) -> None:
        if not self.reset_cache_url:
            return
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
                resp = await http.post(self.reset_cache_url, headers=headers)
            if resp.status_code >= 400:
                self.cache_resets_failed += 1
        except httpx.HTTPError:
            self.cache_resets_failed += 1

    async def _probe_usage(self, client: StreamingClient, api: str) -> TokenModel:
        """No /tokenize: fit the word->token line from two tiny requests' usage.prompt_tokens."""
        fallback = estimated_model(api)
        points = []
        rng = np.random.default_rng(99)
        for n_words in (16, 96):
            prompt = " ".join(fallback.vocab[i] for i in rng.integers(0, len(fallback.vocab), n_words))
            request = PreparedRequest(index=-1, prompt=prompt, max_tokens=1, api=api, ignore_eos=False,
                                      extra_body=dict(self.extra_body))
            record = RequestRecord(index=-1)
            await client.send(request, record)
            if record.ok and record.prompt_tokens and record.token_source == "usage":
                points.append((n_words, record.prompt_tokens))
        return fit_from_usage(points, api)

    async def _trial(self, workload: Workload, model: str, token_model: TokenModel, slo: SLO | None,
                     index: int, dataset: DatasetTraffic | None = None) -> TrialResult:
        factory = PromptFactory(workload, token_model, extra_body=self.extra_body,
                                send_ignore_eos=self.send_ignore_eos, length_fields=self.length_fields)
        expected: dict[int, int | None] = {}
        build: Callable[[int, str], PreparedRequest] = factory.make
        schedule = None
        if workload.trace is not None:
            trace = TraceTraffic(workload, factory)
            build, schedule = trace.make, trace.schedule()
        elif dataset is not None:
            dataset.factory = factory
            build = dataset.make

        def make(i: int, phase: str) -> PreparedRequest:
            request = build(i, phase)
            expected[i] = request.prompt_tokens_expected
            return request

        if workload.conversation is not None:
            return await self._conversation_trial(workload, model, factory, slo, index)
        if token_model.source == "tokenize" and build == factory.make:
            # Exact prompt lengths: count the prompts ahead of the load and fix any that are off.
            async with self._client(time.perf_counter(), timeout_s=workload.timeout_s) as client:
                await exact_prompts(factory.prebuild(range(planned_requests(workload))), client, token_model)
        await self._reset_cache()
        origin = time.perf_counter()
        started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        n_workers = self.workers or workload.workers
        if schedule is not None:
            n_workers = 1  # a streamed trace is read by one process
        ray_address = self._ray_address(workload)
        if schedule is not None and ray_address is not None:
            raise InputError("trace replay and conversations are sent by one process; they do not run on Ray "
                             "(drop the Ray address for this workload)")
        distributed: RayRun | None = None
        async with self._client(origin, workload) as client:
            client.model = model
            generator = LoadGenerator(
                workload, make, client.send,
                clock=lambda: time.perf_counter() - origin,
                progress=self.progress,
                progress_interval_s=self.progress_interval_s,
                prepare=client.encode,
                overload=self.overload,
                schedule=schedule,
            )
            sampler = None
            if self.metrics_url:
                sampler = TelemetrySampler(self.metrics_url, interval_s=self._scrape_interval_s, origin_s=origin)
                await sampler.start()
            gpu_sampler = None
            if self.gpu_telemetry:
                gpu_sampler = GpuSampler(interval_s=self.gpu_interval_s)
                gpu_sampler.start()
            try:
                spec = ClientSpec(self.base_url, model, self._api_key, client.timeout_s,
                                  client.max_connections, self.use_uvloop)
                if ray_address is not None:
                    from pytest_llmperf.load.ray_load import run_on_ray

                    outcome, sent, ray_run = await run_on_ray(
                        workload, factory.make, spec, address=ray_address,
                        ray_workers=self.ray_workers or workload.ray_workers, local_workers=n_workers,
                        origin_s=origin, overload=self.overload)
                    expected.update(sent)
                    distributed = ray_run
                elif n_workers > 1:
                    # The factory's bound method, not ``make``: worker processes start from a
                    # fresh interpreter (forkserver/spawn) and need a picklable builder.
                    outcome, sent = await run_in_workers(
                        workload, factory.make, spec, n_workers, origin_s=origin, overload=self.overload,
                        progress=self.progress, progress_interval_s=self.progress_interval_s)
                    expected.update(sent)
                else:
                    outcome = await generator.run()
            finally:
                server = await sampler.stop() if sampler is not None else None
                gpu = gpu_sampler.stop() if gpu_sampler is not None else None
        return self._trial_result(index, outcome, slo, started_at, origin, expected, server, distributed, gpu)

    def _trial_result(self, index: int, outcome: LoadOutcome, slo: SLO | None, started_at: str, origin: float,
                      expected: dict[int, int | None], server: ServerTelemetry | None,
                      distributed: RayRun | None = None, gpu: GpuTelemetry | None = None) -> TrialResult:
        summary = summarize(outcome.records, slo=slo, window_s=outcome.window_s,
                            loop_lag_p99_s=outcome.loop_lag_p99_s)
        summary = with_gpu(summary, gpu, generated_tokens(outcome.records), self.throttle)
        invalid = list(distributed.reasons) if distributed is not None else []
        summary = with_invalid_reasons(summary, invalid)
        trial = TrialResult(
            index=index,
            records=outcome.records,
            summary=summary,
            window_s=outcome.window_s,
            loop_lag_max_s=outcome.loop_lag_max_s,
            loop_lag_p99_s=outcome.loop_lag_p99_s,
            started_at=started_at,
            wall_s=time.perf_counter() - origin,
            expected_prompt_tokens=[expected.get(r.index) for r in outcome.records],
            telemetry=server,
            distributed=distributed,
            invalid_reasons=invalid,
            gpu=gpu,
            timeslices=self._timeslices(outcome, server),
        )
        return trial

    @property
    def _scrape_interval_s(self) -> float:
        # Once a second, or once per timeslice when slices are shorter, so every slice can hold a
        # scrape of the running/waiting gauges.
        return min(1.0, self.timeslice_s)

    def _timeslices(self, outcome: LoadOutcome, server: ServerTelemetry | None) -> Timeslices:
        gauges: list[GaugeSample] | None = None
        reason: str | None = None
        if server is None:
            reason = "no /metrics URL for this server"
        elif not server.available:
            reason = server.reason
        else:
            gauges = [GaugeSample(p.t_s, p.running, p.waiting) for p in server.series]
        return compute_timeslices(outcome.records, outcome.window_s, self.timeslice_s,
                                  gauges=gauges, gauges_reason=reason)

    async def _conversation_trial(self, workload: Workload, model: str, factory: PromptFactory,
                                  slo: SLO | None, index: int) -> TrialResult:
        await self._reset_cache()
        origin = time.perf_counter()
        started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        async with self._client(origin, workload) as client:
            client.model = model
            load = ConversationLoad(workload, factory, client.send, clock=lambda: time.perf_counter() - origin,
                                    prepare=client.encode)
            sampler = None
            if self.metrics_url:
                sampler = TelemetrySampler(self.metrics_url, interval_s=self._scrape_interval_s, origin_s=origin)
                await sampler.start()
            try:
                outcome = await load.run()
            finally:
                server = await sampler.stop() if sampler is not None else None
        expected = {r.index: r.prompt_tokens_expected for r in outcome.records}
        return self._trial_result(index, outcome, slo, started_at, origin, expected, server)
