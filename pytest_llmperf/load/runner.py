"""Run a workload against an OpenAI-compatible server: prompts -> load -> records -> Summary.

This is the library entry point the pytest layer and the CLI share::

    runner = Runner("http://127.0.0.1:8000/v1", RunnerConfig(workers=4))
    result = runner.run(Workload(input_tokens=256, output_tokens=128, rate_rps=4, duration_s=30))
    print(result.summary.ttft_s.p95)

A workload with ``trials=N`` runs N full trials (each with its own warm-up); statistics are kept per
trial for the baseline comparison, and ``result.summary`` pools the trials' measured requests.
How a trial is measured is the :class:`~pytest_llmperf.load.runner_config.RunnerConfig`; where its
load is sent from (this process, worker processes, a Ray cluster) is a backend of
:mod:`pytest_llmperf.load.backends`.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING

import httpx
import numpy as np

from pytest_llmperf.cache_check import CacheCheck, verify_conversation, verify_hit_rate
from pytest_llmperf.cache_check import verify as verify_cache
from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.kind_check import kind_problems
from pytest_llmperf.load.backends import BackendRun, TrialLoad, choose_backend, ray_address_for
from pytest_llmperf.load.client import StreamingClient
from pytest_llmperf.load.file_requests import DatasetTraffic, TraceTraffic, load_dataset
from pytest_llmperf.load.image_server import ImageServer
from pytest_llmperf.load.loadgen import run_sync
from pytest_llmperf.load.multiturn import ConversationLoad
from pytest_llmperf.load.prompts import (
    PromptFactory,
    TokenModel,
    TokenModels,
    calibrate_with_tokenizer,
    estimated_model,
    exact_prompts,
    fit_from_usage,
    planned_requests,
)
from pytest_llmperf.load.runner_config import RunnerConfig
from pytest_llmperf.load.workers import ClientSpec
from pytest_llmperf.metrics import summarize
from pytest_llmperf.objectives import check_applies
from pytest_llmperf.records import PreparedRequest, RequestRecord
from pytest_llmperf.results import (
    RunResult,
    TrialResult,
    generated_tokens,
    pooled_summary,
    with_gpu,
    with_invalid_reasons,
    with_spec_counters,
)
from pytest_llmperf.telemetry import GpuSampler, ServerTelemetry, TelemetrySampler
from pytest_llmperf.timeslices import GaugeSample, compute_timeslices
from pytest_llmperf.traffic.datasets import read_dataset
from pytest_llmperf.traffic.traces import scan as scan_trace

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_llmperf.kinds import ApiName
    from pytest_llmperf.load.loadgen import LoadOutcome
    from pytest_llmperf.objectives import SLO
    from pytest_llmperf.telemetry_data import GpuTelemetry
    from pytest_llmperf.timeslices import Timeslices
    from pytest_llmperf.traffic.images import ImageSpec
    from pytest_llmperf.workload import Workload


class RunError(LLMPerfError, RuntimeError):
    """The run could not start (server unreachable, model unknown); the message says why."""


class Runner:
    """Bound to one server; runs workloads against it as ``config`` says."""

    def __init__(self, base_url: str, config: RunnerConfig | None = None, *,
                 token_models: TokenModels | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.config = config if config is not None else RunnerConfig()
        # The served model: the config's, else the first the server lists (resolved on first use).
        self.model = self.config.model
        if self.config.ray_address is not None:
            from pytest_llmperf.load import ray_load

            ray_load.require_ray()  # a missing extra fails here, before anything runs
        self.cache_resets_failed = 0
        # Calibrations by (server, model, API); the plugin passes its session's, so a suite
        # calibrates once per server, not once per test.
        self._token_models = token_models if token_models is not None else TokenModels()

    def __repr__(self) -> str:  # never show the key
        return f"Runner({self.base_url!r}, model={self.model!r})"

    def run(self, workload: Workload, *, slo: SLO | None = None, trials: int | None = None) -> RunResult:
        return run_sync(self.arun(workload, slo=slo, trials=trials), use_uvloop=self.config.use_uvloop)

    async def arun(self, workload: Workload, *, slo: SLO | None = None, trials: int | None = None) -> RunResult:
        n_trials = trials or workload.trials or 1
        if slo is not None:
            check_applies(slo, workload.api)  # before any load: a key the kind has no metric for
        results = []
        if workload.trace is not None:
            scan_trace(workload.trace)  # a bad line fails here, before any load
        if workload.dataset is not None:
            read_dataset(workload.dataset, workload.seed)
        ray_address = ray_address_for(workload, self.config)
        if ray_address is not None:
            from pytest_llmperf.load import ray_load

            # An unreachable cluster or a version mismatch fails here, before any request is sent.
            ray_load.connect(ray_address)
        model = await self._resolve_model()
        # Before any load: an adapter the server has not loaded fails here, naming those it has.
        adapter_body = await self._adapter_body(workload)
        # The calibration probes obey the workload's request timeout: a stalling server must not
        # hold the run for a fixed 30 s per probe before any load is sent.
        token_model = await self._token_model(workload.api, model, timeout_s=workload.timeout_s)
        # What offering the tools adds to every prompt (the template writes them in): shared by
        # every request, so a cold run's prefix cache may serve it, as it serves the template.
        tools_tokens = await self._tools_tokens(workload, model) if workload.tools is not None else 0.0
        dataset = None
        if workload.dataset is not None:
            async with self._client(time.perf_counter(), timeout_s=workload.timeout_s) as client:
                client.model = model
                dataset = await load_dataset(workload, PromptFactory(workload, token_model), client)
        for index in range(n_trials):
            trial = await self._trial(workload, model, token_model, slo, index, dataset, adapter_body)
            if not trial.summary.validity.valid and self.config.rerun_invalid:
                # One rerun: a transient stall of the load generator's machine should not cost the
                # verdict; a second invalid trial stands, and the gate reports the run as invalid.
                first = trial
                trial = await self._trial(workload, model, token_model, slo, index, dataset, adapter_body)
                trial.reruns = 1
                trial.rerun_reasons = list(first.summary.validity.reasons)
            results.append(trial)
        return RunResult(
            workload=workload,
            model=model,
            base_url=self.base_url,
            trials=results,
            summary=pooled_summary(results, slo, throttle=self.config.throttle),
            token_model=token_model.to_dict(),
            slo=slo,
            label=workload.label(),
            cache_check=self._cache_check(workload, results, token_model, tools_tokens),
            kind_problems=kind_problems(workload, [r for t in results for r in t.records]),
        )

    async def _tools_tokens(self, workload: Workload, model: str) -> float | None:
        """Tokens the tools add to a chat prompt, as the server's ``/tokenize`` counts a message
        with and without them; None when it cannot tell (no ``/tokenize``, or one that ignores
        ``tools``)."""
        assert workload.tools is not None
        messages = [{"role": "user", "content": "the"}]
        tools = [dict(d) for d in workload.tools.definitions]
        async with self._client(time.perf_counter(), timeout_s=workload.timeout_s) as client:
            client.model = model
            try:
                bare = await client.tokenize(messages=messages)
                offered = await client.tokenize(messages=messages, tools=tools)
            except Exception:  # noqa: BLE001 - only a cache check's allowance depends on it
                return None
        if bare is None or offered is None or len(offered) <= len(bare):
            return None
        return float(len(offered) - len(bare))

    @staticmethod
    def _cache_check(workload: Workload, results: list[TrialResult], token_model: TokenModel,
                     tools_tokens: float | None = 0.0) -> CacheCheck | None:
        if not workload.streams:
            # Pooling engines cache prefixes or not by model type (encoder-only models cannot):
            # a cold or warm claim about them is nothing a counter can settle.
            return None
        telemetry = [t.telemetry for t in results]
        records = [r for t in results for r in t.records]
        if workload.cache_hit_target is not None:
            return verify_hit_rate(workload.cache_hit_target, telemetry, records)
        if workload.conversation is not None:
            return verify_conversation(telemetry, records, workload.cache_block_tokens)
        if workload.trace is not None or workload.dataset is not None:
            return None  # the file decides what repeats; there is no cold/warm claim to check
        if tools_tokens is None:
            return CacheCheck(expected=workload.cache, held=None,
                              message=f"{workload.cache} cache state unverified: the tools every prompt carries "
                                      "are shared by design, and the server's /tokenize cannot say how long they are")
        template = max(0.0, token_model.overhead) + tools_tokens if workload.api == "chat" else 0.0
        return verify_cache(workload.cache, telemetry, records, template_tokens=template)

    def _client(self, origin_s: float, workload: Workload | None = None,
                timeout_s: float | None = None) -> StreamingClient:
        conns = 64
        if workload is not None:
            conns = workload.concurrency or int(max(64, (workload.rate_rps or 1) * 60))
        return StreamingClient(
            self.base_url,
            model=self.model,
            api_key=self.config.api_key,
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

    async def _adapter_body(self, workload: Workload) -> dict[str, dict[str, object]] | None:
        """The body fields each of the workload's LoRA adapters is selected with on this server
        (``RunnerConfig.adapter_fields``), read once per run; None: the adapter's name in the
        model field. Where the server lists its adapters (``adapters_url``: llama-server's GET
        /lora-adapters) the list is read first, and an adapter it lacks is a :class:`RunError`
        naming the adapters it has."""
        fields_for = self.config.adapter_fields
        if workload.adapters is None or fields_for is None:
            return None
        loaded = None
        url = self.config.adapters_url
        if url:
            headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            try:
                async with httpx.AsyncClient(timeout=workload.timeout_s or 30.0, trust_env=False) as http:
                    resp = await http.get(url, headers=headers)
                resp.raise_for_status()
                loaded = resp.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise RunError(f"cannot list the server's LoRA adapters at {url}: {type(exc).__name__}: {exc}") from None
            if not isinstance(loaded, list) or not all(isinstance(e, dict) for e in loaded):
                raise RunError(f"{url} answered {str(loaded)[:200]!r}, not a list of adapters")
        try:
            return {name: fields_for(name, loaded) for name in workload.adapters.names}
        except LLMPerfError as exc:
            raise RunError(str(exc)) from None

    async def _token_model(self, api: ApiName, model: str, timeout_s: float | None = None) -> TokenModel:
        cached = self._token_models.get(self.base_url, model, api)
        if cached is not None:
            return cached
        async with self._client(time.perf_counter(), timeout_s=timeout_s) as client:
            token_model = None
            try:
                token_model = await calibrate_with_tokenizer(client, api)
            except Exception:
                token_model = None
            if token_model is None:
                token_model = await self._probe_usage(client, api)
        self._token_models.put(self.base_url, model, api, token_model)
        return token_model

    async def _reset_cache(self) -> None:
        url, api_key = self.config.reset_cache_url, self.config.api_key
        if not url:
            return
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
                resp = await http.post(url, headers=headers)
            if resp.status_code >= 400:
                self.cache_resets_failed += 1
        except httpx.HTTPError:
            self.cache_resets_failed += 1

    async def _probe_usage(self, client: StreamingClient, api: ApiName) -> TokenModel:
        """No /tokenize: fit the word->token line from two tiny requests' usage.prompt_tokens
        (rerank: the server formats each query-document pair its own way, so the estimate)."""
        fallback = estimated_model(api)
        if api == "rerank":
            return fallback
        points = []
        rng = np.random.default_rng(99)
        for n_words in (16, 96):
            prompt = " ".join(fallback.vocab[i] for i in rng.integers(0, len(fallback.vocab), n_words))
            request = PreparedRequest(index=-1, prompt=prompt, max_tokens=1, api=api, ignore_eos=False,
                                      extra_body=dict(self.config.extra_body))
            record = RequestRecord(index=-1)
            await client.send(request, record)
            if record.ok and record.prompt_tokens and record.token_source == "usage":
                points.append((n_words, record.prompt_tokens))
        return fit_from_usage(points, api)

    async def _trial(self, workload: Workload, model: str, token_model: TokenModel, slo: SLO | None,
                     index: int, dataset: DatasetTraffic | None = None,
                     adapter_body: dict[str, dict[str, object]] | None = None) -> TrialResult:
        if not _serves_images(workload):
            return await self._trial_on(workload, model, token_model, slo, index, dataset, None, adapter_body)
        if (self.config.workers or workload.workers) > 1 or ray_address_for(workload, self.config) is not None:
            raise RunError("images.transport url: the images are served from this process; "
                           "send the load from it (workers: 1, no Ray)")
        with ImageServer(self.base_url) as images:
            return await self._trial_on(workload, model, token_model, slo, index, dataset, images, adapter_body)

    async def _trial_on(self, workload: Workload, model: str, token_model: TokenModel, slo: SLO | None,
                        index: int, dataset: DatasetTraffic | None, images: ImageServer | None,
                        adapter_body: dict[str, dict[str, object]] | None = None) -> TrialResult:
        config = self.config
        factory = PromptFactory(workload, token_model, extra_body=config.extra_body,
                                send_ignore_eos=config.send_ignore_eos, length_fields=config.length_fields,
                                image_host=images.add if images is not None else None, adapter_body=adapter_body)
        if workload.conversation is not None:
            return await self._conversation_trial(workload, model, factory, slo, index)
        # The request source: a bound method each, so worker processes and Ray actors can take it.
        make: Callable[[int, str], PreparedRequest] = factory.make
        schedule = None
        if workload.trace is not None:
            trace = TraceTraffic(workload, factory)
            make, schedule = trace.make, trace.schedule()
        elif dataset is not None:
            dataset.factory = factory
            make = dataset.make
        # Chosen before any request: a trace on Ray fails here.
        backend = choose_backend(workload, config, streamed=schedule is not None)
        if token_model.source == "tokenize" and make == factory.make:
            # Exact prompt lengths: count the prompts ahead of the load and fix any that are off.
            async with self._client(time.perf_counter(), timeout_s=workload.timeout_s) as client:
                await exact_prompts(factory.prebuild(range(planned_requests(workload))), client, token_model)
        elif _has_images(workload) and make == factory.make:
            # Encoding an image takes milliseconds: done ahead, never on the load's event loop.
            factory.prebuild(range(planned_requests(workload)))
        await self._reset_cache()
        origin = time.perf_counter()
        started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        async with self._client(origin, workload) as client:
            client.model = model
            load = TrialLoad(
                workload, make, client,
                ClientSpec(self.base_url, model, config.api_key, client.timeout_s, client.max_connections,
                           config.use_uvloop),
                origin_s=origin, schedule=schedule, progress=config.progress,
                progress_interval_s=config.progress_interval_s, overload=config.overload)
            samplers = _Samplers(config, self._scrape_interval_s, origin, gpu=config.gpu_telemetry)
            await samplers.start()
            try:
                run = await backend.run(load)
            finally:
                server, gpu = await samplers.stop()
        return self._trial_result(index, run, slo, started_at, origin, server, gpu)

    def _trial_result(self, index: int, run: BackendRun, slo: SLO | None, started_at: str, origin: float,
                      server: ServerTelemetry | None, gpu: GpuTelemetry | None = None) -> TrialResult:
        outcome, distributed = run.outcome, run.distributed
        summary = summarize(outcome.records, slo=slo, window_s=outcome.window_s,
                            loop_lag_p99_s=outcome.loop_lag_p99_s)
        summary = with_gpu(summary, gpu, generated_tokens(outcome.records), self.config.throttle)
        summary = with_spec_counters(summary, [server])
        invalid = list(distributed.reasons) if distributed is not None else []
        summary = with_invalid_reasons(summary, invalid)
        expected = run.expected_prompt_tokens
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
        return min(1.0, self.config.timeslice_s)

    def _timeslices(self, outcome: LoadOutcome, server: ServerTelemetry | None) -> Timeslices:
        gauges: list[GaugeSample] | None = None
        reason: str | None = None
        if server is None:
            reason = "no /metrics URL for this server"
        elif not server.available:
            reason = server.reason
        else:
            gauges = [GaugeSample(p.t_s, p.running, p.waiting) for p in server.series]
        return compute_timeslices(outcome.records, outcome.window_s, self.config.timeslice_s,
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
            samplers = _Samplers(self.config, self._scrape_interval_s, origin, gpu=False)
            await samplers.start()
            try:
                outcome = await load.run()
            finally:
                server, _ = await samplers.stop()
        expected = {r.index: r.prompt_tokens_expected for r in outcome.records}
        return self._trial_result(index, BackendRun(outcome, expected), slo, started_at, origin, server)


def _image_specs(workload: Workload) -> list[ImageSpec]:
    specs = [workload.images] + [m.images for m in workload.mix]
    return [s for s in specs if s is not None]


def _has_images(workload: Workload) -> bool:
    return bool(_image_specs(workload))


def _serves_images(workload: Workload) -> bool:
    return any(s.transport == "url" for s in _image_specs(workload))


class _Samplers:
    """What is sampled beside a trial's load: the server's /metrics (when the config names it)
    and this machine's GPUs (when ``gpu``)."""

    def __init__(self, config: RunnerConfig, scrape_interval_s: float, origin_s: float, *, gpu: bool) -> None:
        self._server = (TelemetrySampler(config.metrics_url, interval_s=scrape_interval_s, origin_s=origin_s)
                        if config.metrics_url else None)
        self._gpu = GpuSampler(interval_s=config.gpu_interval_s) if gpu else None

    async def start(self) -> None:
        if self._server is not None:
            await self._server.start()
        if self._gpu is not None:
            self._gpu.start()

    async def stop(self) -> tuple[ServerTelemetry | None, GpuTelemetry | None]:
        server = await self._server.stop() if self._server is not None else None
        gpu = self._gpu.stop() if self._gpu is not None else None
        return server, gpu
