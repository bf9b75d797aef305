"""vLLM's CI serving definitions as gated pytest-llmperf tests.

vLLM's performance CI (``.buildkite/performance-benchmarks/``) keeps its serving benchmarks as
JSON: either a bare list of tests (the older format, each test with its own ``qps_list``), or
``{"defaults": {...}, "tests": [...]}`` where every test is merged over the defaults. Its runner,
``scripts/run-performance-benchmarks.sh``, reads them as follows (``merge_serving_tests_stream``
and ``run_serving_tests``), and so does :func:`convert`:

- ``qps_list`` and ``max_concurrency_list`` come from the test, else from the defaults (jq's
  ``//``); a missing ``max_concurrency_list`` is ``[num_prompts]``. ``server_environment_variables``,
  ``server_parameters`` and ``client_parameters`` are the defaults' dict updated with the test's.
- ``test_name`` must start with ``serving_``; ``server_parameters.model`` is required, and a test
  whose ``client_parameters.model`` differs from it is skipped ("Server model and client model
  must be the same").
- The server is ``VAR=value ... vllm serve MODEL --key value ...`` (``json2envs``, ``json2args``:
  ``_`` in a key becomes ``-``, an empty value is a bare flag, any other value is jq's ``tostring``),
  run through ``bash -c``: quotes in a value are the shell's (``"'{\\"image\\": 3}'"`` reaches
  vLLM as ``{"image": 3}``). One launch per test; every test gets its own server.
- For each qps, for each max concurrency: ``vllm bench serve --request-rate QPS
  --max-concurrency C <client_parameters as arguments>``, the client's arguments last (argparse
  keeps the last of a repeated flag).

How ``vllm bench serve`` (``vllm/benchmarks/serve.py``, ``datasets.py``,
``lib/endpoint_request_func.py``) turns the client parameters into traffic, and the
:class:`~pytest_llmperf.workload.Workload` that sends the same:

=====================================  ==========================================================
vLLM                                   pytest-llmperf
=====================================  ==========================================================
``--request-rate inf``                 every request is created at once and an
``--max-concurrency C``                ``asyncio.Semaphore(C)`` lets C run (``benchmark``,
``--num-prompts N``                    ``limited_request_func``): ``concurrency=min(C, N)``,
                                       ``num_requests=N`` (a closed loop)
``--request-rate R`` (finite)          ``rate_rps=R, max_concurrency=C, num_requests=N``: Poisson
``--burstiness B``                     arrivals, or gamma gaps of shape B (``get_request``) with
                                       ``arrival="gamma", burstiness=B``; an arrival waits for one
                                       of the C slots and is timed from when it is sent
``--backend vllm`` / ``openai``        ``api="completions"`` (``/v1/completions``)
``--backend openai-chat``              ``api="chat"`` (``/v1/chat/completions``)
``--backend openai-embeddings``        ``api="embeddings"`` (``/v1/embeddings``), one input per
                                       request (``--random-batch-size`` inputs with random)
``--dataset-name random``              ``input_tokens`` = prefix + uniform on
``--random-input-len L``               [⌊L(1−r)⌋, ⌈L(1+r)⌉], ``output_tokens`` uniform on
``--random-output-len O``              [max(1, ⌊O(1−r)⌋), max(1, ⌈O(1+r)⌉)] (``get_sampling_params``;
``--random-range-ratio r``             a fixed count when r = 0). The prompt is random tokens,
``--random-prefix-len P``              so ``cache="cold"``; with P > 0 every prompt starts with the
                                       same P tokens: ``cache="warm", prefix_tokens=P,
                                       num_prefixes=1`` (see below)
``--dataset-name random-mm``           the same text, plus ``images``: a count uniform on
``--random-mm-base-items-per-request`` [max(0, ⌊n(1−r)⌋), min(Σ limits, ⌈n(1+r)⌉)]
``--random-mm-num-mm-items-range-``    (``get_mm_item_sampling_params``), each image's size drawn
``ratio r``                            from the buckets by probability, zero-probability buckets
``--random-mm-limit-mm-per-prompt``    dropped (``normalize_bucket_config``); a bucket key is
``--random-mm-bucket-config``          (height, width, frames), frames 1 an image (``width`` x
                                       ``height`` pixels, random RGB, JPEG ``data:`` URLs after the
                                       text: ``process_image``, ``_get_chat_content``)
``--dataset-name sharegpt``            ``dataset={path, format: sharegpt, min_input_tokens: 4,
``--dataset-path FILE``                max_input_tokens: 1024}``: the first human turn, the reply's
                                       length as the answer (``ShareGPTDataset.sample``,
                                       ``is_valid_sequence``)
``--ignore-eos``                       ``ignore_eos=True``; ``serve.py`` also sets it for random and
                                       random-mm on the completions and chat backends; otherwise
                                       ``ignore_eos=False`` (answers may end at EOS)
``--temperature``, ``--top-p``, ...    ``sampling`` (generation only; none given: the server's
                                       defaults, as ``serve.py`` sends none)
``--seed``, ``--num-warmups``          ``seed``; ``warmup_requests`` (run, excluded)
(the client's 6-hour timeout)          ``timeout_s=21600`` (``AIOHTTP_TIMEOUT``)
=====================================  ==========================================================

The server parameters become the vLLM preset's arguments (``llmperf_server_args``, model as
``llmperf_model``) and the environment is set before the server launches; the ones the simulator
models (``--max-num-seqs``, ``--max-num-batched-tokens``) are also given to it, and an image test's
sub-suite gives the simulator a vision encoder (:data:`SIM_VISION_PRESET`: the default preset
``+`` :data:`SIM_VISION_ENCODER`).

Approximations, each written as a :class:`Note` where it applies:

- Token counts: vLLM subtracts the tokenizer's special tokens (a BOS) from ``random-input-len``
  and counts the random text alone; ``input_tokens`` counts the whole prompt as the server does
  (special tokens and, for chat, the template included), so a chat prompt carries a few fewer
  random tokens than vLLM's.
- A shared prefix: a warm run is checked to draw at least
  :data:`~pytest_llmperf.cache_check.WARM_MIN_HIT_RATE` of its prompt tokens from the prefix cache.
  A prefix shorter than that share of the shortest prompt is converted ``cold`` (each prompt
  unique, the prefix's tokens still counted in ``input_tokens``) with a note: vLLM's prompts
  there share their first P tokens (a block or two cached).
- Videos (buckets with more than one frame): not sent; items are drawn from the image buckets.
- ShareGPT: ``--sharegpt-output-len`` (rows keep their reply's length), and vLLM's filter on
  prompt + reply <= 2048 tokens and replies >= 4 tokens (the prompt bounds are kept).
- Anything else in ``client_parameters`` (result files, reported percentiles, vLLM's own goodput
  SLO, the client-side tokenizer, extra body fields) and unknown test keys (``tier``).

Gating: each test is ``@slo`` with the medians of TTFT, TPOT and E2E (E2E alone for embeddings:
the only latency a pooled answer has), the tail a run of ``num_prompts`` requests can judge
(:func:`tail_percentile`: p90 from 200 requests, p95 from 400, p99 from 2,000) and an error
rate. Their limits are ceilings far from any healthy engine (:func:`ceilings`): they fail a
broken build where no baseline exists; main's stored baseline (``--llmperf-baseline main``) is
what catches a regression.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import json
import json.decoder
import json.scanner
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_llmperf.cache_check import WARM_MIN_HIT_RATE
from pytest_llmperf.errors import InputError
from pytest_llmperf.stats import MIN_TAIL_SAMPLES
from pytest_llmperf.workload import Workload, WorkloadError

# Where vLLM's runner downloads the ShareGPT file its tests name (run-performance-benchmarks.sh,
# ensure_sharegpt_downloaded), into its benchmarks/ directory.
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_URL = f"https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/resolve/main/{SHAREGPT_FILE}"
# ShareGPTDataset.sample keeps rows with is_valid_sequence's defaults (vllm/benchmarks/datasets.py):
# prompt >= 4 tokens, prompt <= 1024, prompt + reply <= 2048, reply >= 4.
SHAREGPT_MIN_PROMPT_TOKENS = 4
SHAREGPT_MAX_PROMPT_TOKENS = 1024
SHAREGPT_MAX_TOTAL_TOKENS = 2048
# endpoint_request_func.py: AIOHTTP_TIMEOUT = aiohttp.ClientTimeout(total=6 * 60 * 60).
CLIENT_TIMEOUT_S = 6 * 60 * 60
# vllm bench serve's defaults (serve.py add_cli_args, datasets.py add_dataset_parser).
DEFAULT_NUM_PROMPTS = 1000
DEFAULT_SEED = 0
DEFAULT_BACKEND = "openai"
DEFAULT_ENDPOINT = "/v1/completions"
DEFAULT_DATASET = "random"
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128
# RandomMultiModalDataset's defaults.
DEFAULT_MM_ITEMS = 1
DEFAULT_MM_LIMIT = {"image": 255, "video": 1}
DEFAULT_MM_BUCKETS = {(256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}
# The simulator's vision encoder for image tests, attached to its default preset: Qwen2.5-VL's ViT,
# the encoder of the vision-language models vLLM's multimodal CI serves.
SIM_VISION_ENCODER = "qwen2.5-vl-vit"
SIM_VISION_PRESET = f"llama-3.1-8b-h100+{SIM_VISION_ENCODER}"
# Server parameters the simulator models, as its own flags.
SIM_FLAGS = {"max-num-seqs": "--max-num-seqs", "max-num-batched-tokens": "--max-num-batched-tokens"}

# Backends -> the request kind; the route vLLM's request function insists on (_validate_api_url).
BACKENDS = {"vllm": ("completions", "completions"), "openai": ("completions", "completions"),
            "openai-chat": ("chat", "chat/completions"), "openai-embeddings": ("embeddings", "embeddings")}
# vLLM's other backends (ASYNC_REQUEST_FUNCS): a test using one is not converted.
OTHER_BACKENDS = ("openai-audio", "openai-embeddings-chat", "openai-embeddings-clip", "openai-embeddings-vlm2vec",
                  "infinity-embeddings", "infinity-embeddings-clip", "vllm-pooling", "vllm-rerank")
DATASETS = ("random", "random-mm", "sharegpt")
# vLLM's other datasets (add_dataset_parser's choices): a test using one is not converted.
OTHER_DATASETS = ("burstgpt", "sonnet", "random-rerank", "hf", "custom", "prefix_repetition", "spec_bench",
                  "txt-slices", "timed_trace")
SAMPLING = {"temperature": float, "top-p": float, "top-k": int, "min-p": float, "frequency-penalty": float,
            "presence-penalty": float, "repetition-penalty": float}
RANDOM_KEYS = ("random-input-len", "random-output-len", "random-range-ratio", "random-prefix-len")
MM_KEYS = ("random-mm-base-items-per-request", "random-mm-num-mm-items-range-ratio",
           "random-mm-limit-mm-per-prompt", "random-mm-bucket-config")
# Client parameters read by the conversion itself (the others are notes).
CONVERTED_KEYS = frozenset({
    "model", "backend", "endpoint", "dataset-name", "dataset-path", "num-prompts", "seed", "ignore-eos",
    "request-rate", "max-concurrency", "burstiness", "num-warmups", "input-len", "output-len",
    "random-batch-size", *RANDOM_KEYS, *MM_KEYS, *SAMPLING,
})
_RESULTS = "vLLM's result files and progress output; pytest-llmperf writes its own reports (--llmperf-report-dir)"
_TOKENIZER = "the client-side tokenizer; pytest-llmperf counts tokens with the server's (/tokenize and usage)"
_WHERE = "where the server is; the plugin launches it (--llmperf-url for one already running)"
WHY_NOT = {
    **dict.fromkeys(("save-result", "save-detailed", "append-result", "result-dir", "result-filename", "metadata",
                     "label", "plot-timeline", "timeline-itl-thresholds", "plot-dataset-stats", "disable-tqdm"),
                    _RESULTS),
    **dict.fromkeys(("percentile-metrics", "metric-percentiles"),
                    "the percentiles vLLM prints; the gated statistics are the test's @slo keys"),
    "goodput": "vLLM's per-request SLO for its goodput figure; pytest-llmperf's goodput counts requests within "
               "the @slo tail limits",
    **dict.fromkeys(("tokenizer", "tokenizer-mode", "trust-remote-code", "skip-tokenizer-init"), _TOKENIZER),
    **dict.fromkeys(("host", "port", "base-url", "insecure", "header"), _WHERE),
    "sharegpt-output-len": "ShareGPT rows keep the length of their reply as the answer length",
    "served-model-name": "requests name the sub-suite's model (llmperf_model)",
    "extra-body": "extra request fields are not part of a Workload",
}
TEST_KEYS = ("test_name", "qps_list", "max_concurrency_list", "server_environment_variables", "server_parameters",
             "client_parameters")
# Gate limits (see ceilings): far from any healthy engine, so they only fail a broken one.
BASE_TTFT_S = 60.0  # a first token within a minute, plus the queue below
FLOOR_PREFILL_TOKENS_PER_S = 500.0  # every prompt in flight prefilled at no less than this
CEILING_TPOT_S = 1.0  # no healthy engine spends a second per output token
# Vision tokens per image for the limits only: one per 28x28 pixels (Qwen2-VL's 14-pixel patches
# merged 2x2, the densest of the common encoders).
VISION_PIXELS_PER_TOKEN = 28 * 28
ERROR_RATE_LIMIT = 0.01


class ConversionError(InputError):
    """A definition file that cannot be converted; the message names the file, the line and the test."""


@dataclass(frozen=True)
class Note:
    """A parameter with no pytest-llmperf counterpart (or converted only approximately).

    ``test`` is the definition's ``test_name`` (None for the file as a whole), ``parameter``
    where it was written (``client_parameters.save_result``), ``reason`` what happens instead."""

    test: str | None
    parameter: str
    reason: str

    def line(self) -> str:
        where = f"{self.test}: " if self.test else ""
        return f"{where}{self.parameter}: {self.reason}"


@dataclass(frozen=True)
class Case:
    """One (qps, max concurrency) pair of a definition's sweep: one ``vllm bench serve`` run."""

    qps: float
    max_concurrency: int

    @property
    def id(self) -> str:
        """vLLM's result name for it: ``qps_inf_concurrency_16`` (``${test_name}_qps_..._concurrency_...``)."""
        return f"qps_{format_qps(self.qps)}_concurrency_{self.max_concurrency}"


@dataclass(frozen=True)
class Definition:
    """One test of the file: a gated pytest test, parametrized over its ``cases``.

    ``workload`` holds the :class:`~pytest_llmperf.workload.Workload` keywords of every case
    (the load's come from :func:`bench_load`); ``dataset_path`` is the ShareGPT file as the
    definition names it (relative paths resolve against the sub-suite's directory)."""

    test_name: str
    line: int
    workload: Mapping[str, Any]
    num_prompts: int
    burstiness: float
    cases: tuple[Case, ...]
    slo: Mapping[str, float]
    bench_args: tuple[str, ...]
    dataset_path: str | None = None
    notes: tuple[Note, ...] = ()

    @property
    def api(self) -> str:
        return str(self.workload["api"])


@dataclass(frozen=True)
class ServerSetup:
    """One server configuration: the model, ``vllm serve``'s arguments, its environment, and the
    simulator flags that model the same."""

    model: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    sim_args: tuple[str, ...] = ()
    # The simulator's preset where the tests need more than its default (a vision encoder).
    sim_preset: str | None = None

    def command(self) -> str:
        """The launch line as vLLM's runner writes it (``server_command``)."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        return " ".join([*env, "vllm", "serve", shlex.quote(self.model), *map(shlex.quote, self.args)])


@dataclass(frozen=True)
class SubSuite:
    """The definitions that share one server configuration: one pytest session, one launch."""

    name: str
    server: ServerSetup
    definitions: tuple[Definition, ...]

    @property
    def needs_images(self) -> bool:
        return any(d.workload.get("images") is not None for d in self.definitions)


@dataclass(frozen=True)
class Conversion:
    """A whole file: its sub-suites, the tests left out, and every note (file-level ones too)."""

    source: Path
    subsuites: tuple[SubSuite, ...]
    skipped: tuple[str, ...] = ()
    notes: tuple[Note, ...] = field(default=())

    @property
    def definitions(self) -> tuple[Definition, ...]:
        return tuple(d for s in self.subsuites for d in s.definitions)


# ---------------------------------------------------------------------- the load of one case


def bench_load(qps: float, max_concurrency: int, num_prompts: int, burstiness: float = 1.0) -> dict[str, Any]:
    """The :class:`~pytest_llmperf.workload.Workload` load fields of ``vllm bench serve
    --request-rate QPS --max-concurrency C --num-prompts N [--burstiness B]``.

    ``vllm/benchmarks/serve.py`` creates one task per request as ``get_request`` yields it (all at
    once at QPS inf; else after Poisson gaps, or gamma gaps of shape B, of mean 1/QPS) and each
    task waits on ``asyncio.Semaphore(C)`` before it sends, timing the request from then on. At
    QPS inf that is a closed loop of min(C, N) streams over N requests; else an open loop at QPS
    capped at C in flight, whose arrivals wait for a slot (``max_concurrency``).
    """
    if math.isinf(qps):
        return {"concurrency": min(max_concurrency, num_prompts), "num_requests": num_prompts}
    arrival: dict[str, Any] = {} if burstiness == 1.0 else {"arrival": "gamma", "burstiness": burstiness}
    return {"rate_rps": qps, "max_concurrency": max_concurrency, "num_requests": num_prompts, **arrival}


def format_qps(qps: float) -> str:
    """A rate as vLLM's runner prints it in result names (``inf``, ``4``, ``0.5``)."""
    return "inf" if math.isinf(qps) else jq_tostring(qps)


def jq_tostring(value: Any) -> str:
    """jq's ``tostring``, as ``json2args`` renders a value: strings as they are, integral numbers
    without a fraction, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e17:
        return str(int(value))
    return json.dumps(value, separators=(",", ":"))


def tail_percentile(num_requests: int) -> str | None:
    """The highest tail a run of ``num_requests`` requests can be gated on: one whose trial holds
    at least :data:`~pytest_llmperf.stats.MIN_TAIL_SAMPLES` requests beyond it (p90 from 200, p95
    from 400, p99 from 2,000), so the gate's precision floor
    (:func:`~pytest_llmperf.baseline.compare.precision_floor`) judges it from a single trial;
    None below 200 (medians only)."""
    for q in (99, 95, 90):
        if num_requests * (100 - q) / 100 >= MIN_TAIL_SAMPLES:
            return f"p{q}"
    return None


def ceilings(*, api: str, in_flight: int, input_tokens_max: float, output_tokens_max: int) -> dict[str, float]:
    """The absolute limits of a test: far from any healthy engine, so only a broken one fails them.

    TTFT: :data:`BASE_TTFT_S` plus the time to prefill every prompt that can be in flight at
    :data:`FLOOR_PREFILL_TOKENS_PER_S` (a request may queue behind all the others); TPOT:
    :data:`CEILING_TPOT_S`; E2E: the TTFT limit plus the longest answer at the TPOT limit (for
    embeddings, the TTFT limit: a pooled answer is one prefill). Rounded up to two digits."""
    ttft_s = _round_up(BASE_TTFT_S + in_flight * input_tokens_max / FLOOR_PREFILL_TOKENS_PER_S)
    if api == "embeddings":
        return {"e2e": ttft_s}
    return {"ttft": ttft_s, "tpot": CEILING_TPOT_S, "e2e": _round_up(ttft_s + CEILING_TPOT_S * output_tokens_max)}


def _round_up(value: float) -> float:
    step = 10.0 ** (math.floor(math.log10(value)) - 1)
    return float(math.ceil(value / step - 1e-9) * step)


# ---------------------------------------------------------------------- reading the file


class _Located(dict[str, Any]):
    """A JSON object that knows the line it starts on."""

    line: int = 0


# The standard library's pure-Python JSON object parser and scanner (json.decoder, json.scanner):
# the scanner calls the decoder's parse_object for every object, with the object's position,
# where the C scanner would not. Private to the json module and absent from its type stubs.
_JSON_OBJECT = vars(json.decoder)["JSONObject"]
_PY_MAKE_SCANNER = vars(json.scanner)["py_make_scanner"]


def _load_json(text: str, path: Path) -> Any:
    """``json.loads`` that records each object's first line (``_Located.line``); a malformed file
    fails naming the file, the line and the column."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    decoder = json.JSONDecoder()

    def parse_object(s_and_end: tuple[str, int], *args: Any) -> tuple[_Located, int]:
        obj, end = _JSON_OBJECT(s_and_end, *args)
        located = _Located(obj)
        located.line = bisect.bisect_right(starts, s_and_end[1] - 1)  # s_and_end[1]: just after the "{"
        return located, end

    vars(decoder).update(parse_object=parse_object)  # set in JSONDecoder.__init__, read by the scanner
    vars(decoder).update(scan_once=_PY_MAKE_SCANNER(decoder))
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise ConversionError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None


@dataclass
class _Test:
    """One test after vLLM's merge of the defaults (``merge_serving_tests_stream``)."""

    raw: Mapping[str, Any]
    line: int
    name: str
    qps_list: Any
    max_concurrency_list: Any
    env: dict[str, Any]
    server: dict[str, Any]
    client: dict[str, Any]


def _line(obj: Any, default: int = 1) -> int:
    return obj.line if isinstance(obj, _Located) else default


def _dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConversionError(f"{where} must be an object, got {type(value).__name__}")
    return dict(value)


def _alternative(test: Mapping[str, Any], defaults: Mapping[str, Any], key: str) -> Any:
    """jq's ``.key // $d.key``: the test's value unless it is null or false."""
    value = test.get(key)
    return value if value is not None and value is not False else defaults.get(key)


def read_tests(path: str | Path) -> list[_Test]:
    """The file's tests with the defaults merged in, in file order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConversionError(f"{path}: cannot read the definitions file: {exc.strerror}") from None
    root = _load_json(text, path)
    if isinstance(root, list):
        defaults: dict[str, Any] = {}
        tests = root
    elif isinstance(root, Mapping) and "tests" in root:
        defaults = _dict(root.get("defaults"), f"{path}:{_line(root)}: 'defaults'")
        tests = root.get("tests") or []
        if not isinstance(tests, list):
            raise ConversionError(f"{path}:{_line(root)}: 'tests' must be a list of tests")
    else:
        # run-performance-benchmarks.sh: error("Unsupported serving test file format: ...")
        raise ConversionError(f"{path}: unsupported serving test file format: must be a list of tests or an "
                              "object with 'tests' (and optional 'defaults')")
    out = []
    seen: dict[str, int] = {}
    for index, test in enumerate(tests):
        line = _line(test, _line(root))
        if not isinstance(test, Mapping):
            raise ConversionError(f"{path}:{line}: tests[{index}] must be an object, got {type(test).__name__}")
        name = test.get("test_name")
        if not isinstance(name, str) or not name:
            raise ConversionError(f"{path}:{line}: tests[{index}] has no test_name")
        where = f"{path}:{line}: {name}"
        if not name.startswith("serving_"):
            # run_serving_tests: 'test_name must start with "serving_"' (and the runner exits)
            raise ConversionError(f"{where}: test_name must start with 'serving_', as vLLM's runner requires")
        if name in seen:
            raise ConversionError(f"{where}: test_name already used by the test at line {seen[name]}")
        seen[name] = line

        out.append(_Test(
            raw=test, line=line, name=name, qps_list=_alternative(test, defaults, "qps_list"),
            max_concurrency_list=_alternative(test, defaults, "max_concurrency_list"),
            env={**_dict(defaults.get("server_environment_variables"), f"{where}: defaults' server_environment_variables"),
                 **_dict(test.get("server_environment_variables"), f"{where}: server_environment_variables")},
            server={**_dict(defaults.get("server_parameters"), f"{where}: defaults' server_parameters"),
                    **_dict(test.get("server_parameters"), f"{where}: server_parameters")},
            client={**_dict(defaults.get("client_parameters"), f"{where}: defaults' client_parameters"),
                    **_dict(test.get("client_parameters"), f"{where}: client_parameters")},
        ))
    return out


# ---------------------------------------------------------------------- the server


def _shell_words(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:  # an unclosed quote: bash -c would fail the same way
        raise ConversionError(f"{where}: {text!r} is not a valid shell word list ({exc})") from None


def json2args(params: Mapping[str, Any], where: str) -> list[str]:
    """The arguments vLLM's runner passes (``json2args``: ``--key-with-dashes value``, an empty
    value a bare flag), split as ``bash -c`` splits them."""
    text = " ".join(f"--{key.replace('_', '-')} {jq_tostring(value)}" for key, value in params.items())
    return _shell_words(text, where)


def _server_setup(test: _Test, path: Path, notes: list[Note], images: bool) -> ServerSetup:
    where = f"{path}:{test.line}: {test.name}"
    model = str(test.server["model"])  # checked by _definition
    params = {k: v for k, v in test.server.items() if k != "model"}
    for key, value in params.items():
        if isinstance(value, (Mapping, list)):
            notes.append(Note(test.name, f"server_parameters.{key}", "passed as vLLM's runner passes it: compact JSON "
                                                                     "through bash, which drops its double quotes"))
    args = json2args(params, f"{where}: server_parameters")
    env_words = _shell_words(" ".join(f"{k}={jq_tostring(v)}" for k, v in test.env.items()),
                             f"{where}: server_environment_variables")
    env = []
    for word in env_words:
        name, sep, value = word.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConversionError(f"{where}: server_environment_variables: {word!r} is not NAME=VALUE")
        env.append((name, value))
    sim_args: list[str] = []
    for key, value in params.items():
        flag = SIM_FLAGS.get(key.replace("_", "-"))
        if flag is not None and _is_int(value):
            sim_args += [flag, str(int(value))]
    return ServerSetup(model=model, args=tuple(args), env=tuple(env), sim_args=tuple(sim_args),
                       sim_preset=SIM_VISION_PRESET if images else None)


# ---------------------------------------------------------------------- the client


def _is_int(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


class _Client:
    """The client parameters of one test, read as ``vllm bench serve``'s argparse reads them."""

    def __init__(self, test: _Test, path: Path) -> None:
        self.test = test
        self.where = f"{path}:{test.line}: {test.name}"
        self.params: dict[str, Any] = {}
        self.keys: dict[str, str] = {}  # normalized -> as written
        for key, value in test.client.items():
            norm = key.replace("_", "-")
            self.params[norm] = value
            self.keys[norm] = key

    def has(self, key: str) -> bool:
        return key in self.params

    def written(self, key: str) -> str:
        return f"client_parameters.{self.keys.get(key, key)}"

    def word(self, key: str) -> str | None:
        """The one shell word a parameter passes (None when absent; '' for a bare flag)."""
        if key not in self.params:
            return None
        words = _shell_words(jq_tostring(self.params[key]), f"{self.where}: {self.written(key)}")
        if len(words) > 1:
            raise ConversionError(f"{self.where}: {self.written(key)}: expected one value, got {len(words)}: "
                                  f"{' '.join(words)}")
        return words[0] if words else ""

    def flag(self, key: str) -> bool:
        word = self.word(key)
        if word is None:
            return False
        if word not in ("", "true"):
            raise ConversionError(f"{self.where}: {self.written(key)}: a flag takes an empty value (\"\"), got {word!r}")
        return True

    def integer(self, key: str, default: int, *, minimum: int) -> int:
        word = self.word(key)
        if word is None:
            return default
        try:
            value = int(word)
        except ValueError:
            raise ConversionError(f"{self.where}: {self.written(key)}: expected an integer, got {word!r}") from None
        if value < minimum:
            raise ConversionError(f"{self.where}: {self.written(key)}: must be at least {minimum}, got {value}")
        return value

    def number(self, key: str, default: float, *, low: float, high: float, high_open: bool = False) -> float:
        word = self.word(key)
        if word is None:
            return default
        try:
            value = float(word)
        except ValueError:
            raise ConversionError(f"{self.where}: {self.written(key)}: expected a number, got {word!r}") from None
        if not (low <= value and (value < high if high_open else value <= high)):
            bound = f"[{low:g}, {high:g}{')' if high_open else ']'}"
            raise ConversionError(f"{self.where}: {self.written(key)}: must be in {bound}, got {word}")
        return value

    def json(self, key: str, default: Any) -> Any:
        word = self.word(key)
        if word is None:
            return default
        try:
            return json.loads(word)
        except json.JSONDecodeError as exc:
            raise ConversionError(f"{self.where}: {self.written(key)}: not JSON ({exc.msg}): {word!r}") from None


def _parse_qps(value: Any, where: str) -> float:
    if isinstance(value, str):
        if value.strip().lower() in ("inf", "infinity"):
            return math.inf
        try:
            value = float(value)
        except ValueError:
            raise ConversionError(f"{where}: qps_list: expected a number or \"inf\", got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConversionError(f"{where}: qps_list: expected a positive number or \"inf\", got {value!r}")
    return float(value)


def _parse_concurrency(value: Any, where: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not _is_int(value) or int(value) < 1:
        # serve.py: "--max-concurrency must be greater than 0"
        raise ConversionError(f"{where}: max_concurrency_list: expected positive integers, got {value!r}")
    return int(value)


def _cases(test: _Test, client: _Client, num_prompts: int, notes: list[Note]) -> tuple[Case, ...]:
    where = client.where
    if not isinstance(test.qps_list, list) or not test.qps_list:
        raise ConversionError(f"{where}: qps_list (in the test or the defaults) must be a non-empty list: "
                              "vLLM's runner runs nothing without one")
    qps_list = [_parse_qps(v, where) for v in test.qps_list]
    if test.max_concurrency_list is None:
        concurrencies = [num_prompts]  # run_serving_tests: "fallback to num_prompts if missing"
    elif isinstance(test.max_concurrency_list, list) and test.max_concurrency_list:
        concurrencies = [_parse_concurrency(v, where) for v in test.max_concurrency_list]
    else:
        raise ConversionError(f"{where}: max_concurrency_list must be a non-empty list of integers")
    # The client's own --request-rate/--max-concurrency come after the runner's: argparse keeps them.
    if client.has("request-rate"):
        rate = client.word("request-rate") or ""
        qps_list = [_parse_qps(rate, f"{where}: {client.written('request-rate')}")] * len(qps_list)
        notes.append(Note(test.name, client.written("request-rate"),
                          "overrides every rate of qps_list (it follows the runner's --request-rate)"))
    if client.has("max-concurrency"):
        cap = client.word("max-concurrency") or ""
        concurrencies = [_parse_concurrency(cap, f"{where}: {client.written('max-concurrency')}")] * len(concurrencies)
        notes.append(Note(test.name, client.written("max-concurrency"),
                          "overrides every value of max_concurrency_list (it follows the runner's --max-concurrency)"))
    cases: list[Case] = []
    for qps in qps_list:
        for c in concurrencies:
            case = Case(qps, c)
            if case in cases:
                notes.append(Note(test.name, "qps_list x max_concurrency_list",
                                  f"{case.id} appears more than once; converted once"))
                continue
            cases.append(case)
    return tuple(cases)


def _length_range(length: int, ratio: float, *, floor_one: bool) -> tuple[int, int]:
    """RandomDataset.get_sampling_params: [⌊L(1−r)⌋, ⌈L(1+r)⌉] (outputs at least 1)."""
    low, high = math.floor(length * (1 - ratio)), math.ceil(length * (1 + ratio))
    if floor_one:
        low, high = max(low, 1), max(high, 1)
    return low, high


def _tokens(low: int, high: int) -> Any:
    return low if low == high else {"dist": "uniform", "min": low, "max": high}


def _buckets(client: _Client) -> dict[tuple[int, int, int], float]:
    word = client.word("random-mm-bucket-config")
    if word is None:
        return dict(DEFAULT_MM_BUCKETS)
    where = f"{client.where}: {client.written('random-mm-bucket-config')}"
    try:
        parsed = ast.literal_eval(word)  # datasets.py _parse_mm_bucket_config: a Python literal
    except (ValueError, SyntaxError):
        raise ConversionError(f"{where}: expected a dict of (height, width, frames): probability, got {word!r}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise ConversionError(f"{where}: expected a dict of (height, width, frames): probability, got {word!r}")
    out: dict[tuple[int, int, int], float] = {}
    for key, prob in parsed.items():
        if isinstance(key, str):
            try:
                key = ast.literal_eval(key)
            except (ValueError, SyntaxError):
                pass
        if not (isinstance(key, tuple) and len(key) == 3 and all(_is_int(k) and not isinstance(k, bool) for k in key)):
            raise ConversionError(f"{where}: bucket key {key!r} is not (height, width, frames)")
        height, width, frames = (int(k) for k in key)
        if height < 1 or width < 1 or frames < 1:
            raise ConversionError(f"{where}: bucket {key!r} has {height * width * frames} pixels: height, width and "
                                  "frames must be at least 1")
        if isinstance(prob, bool) or not isinstance(prob, (int, float)) or prob < 0:
            # normalize_bucket_config: "Bucket config values must be non-negative."
            raise ConversionError(f"{where}: bucket {key!r}: probability must be a non-negative number, got {prob!r}")
        out[(height, width, frames)] = float(prob)
    if not any(p > 0 for p in out.values()):
        raise ConversionError(f"{where}: every bucket has probability 0")
    return out


def _images(client: _Client, notes: list[Note]) -> dict[str, Any] | None:
    """The ImageSpec of random-mm (RandomMultiModalDataset), or None when no request carries one."""
    name = client.test.name
    base = client.integer("random-mm-base-items-per-request", DEFAULT_MM_ITEMS, minimum=0)
    ratio = client.number("random-mm-num-mm-items-range-ratio", 0.0, low=0.0, high=1.0)
    limits = client.json("random-mm-limit-mm-per-prompt", DEFAULT_MM_LIMIT)
    where = f"{client.where}: {client.written('random-mm-limit-mm-per-prompt')}"
    if not isinstance(limits, Mapping) or not all(_is_int(v) and v >= 0 for v in limits.values()):
        raise ConversionError(f"{where}: expected {{modality: limit}} with non-negative limits, got {limits!r}")
    buckets = {k: p for k, p in _buckets(client).items() if p > 0}
    modalities = {"image" if k[2] == 1 else "video" for k in buckets}
    missing = sorted(modalities - set(limits))
    if missing:
        # get_mm_item_sampling_params: "Modality ... is not in limit_mm_per_prompt"
        raise ConversionError(f"{where}: the buckets hold {missing[0]}s but the limits name none")
    allowed = {m: int(limits[m]) for m in modalities}
    low = max(0, math.floor(base * (1 - ratio)))
    high = min(sum(allowed.values()), math.ceil(base * (1 + ratio)))
    if low > high:
        raise ConversionError(f"{client.where}: random-mm items: the minimum {low} is above the maximum {high} "
                              "(the limits cap it)")
    videos = {k: p for k, p in buckets.items() if k[2] > 1}
    images = {k: p for k, p in buckets.items() if k[2] == 1}
    if videos:
        shown = ", ".join(f"({h}, {w}, {t}): {p:g}" for (h, w, t), p in videos.items())
        notes.append(Note(name, client.written("random-mm-bucket-config"),
                          f"video buckets {shown} not converted (chat requests carry images only); every item is "
                          "drawn from the image buckets"))
    if images:
        high = min(high, allowed.get("image", high))
        low = min(low, high)
    if not images or high == 0:
        notes.append(Note(name, client.written("random-mm-bucket-config"),
                          "no request carries an image: converted as text-only chat"))
        return None
    total = sum(images.values())
    sizes = [{"width": w, "height": h, "weight": round(p / total, 6)} for (h, w, _), p in images.items()]
    # process_image: JPEG data URLs; _get_chat_content(mm_position="last"): after the text;
    # generate_synthetic_image: fresh random pixels for every item (nothing repeats).
    return {"count": low if low == high else [low, high], "sizes": sizes, "position": "after", "unique": None,
            "format": "jpeg", "transport": "data_url"}


def _definition(test: _Test, path: Path, notes: list[Note]) -> tuple[Definition, bool] | None:
    """The gated test of one definition and whether it sends images; None when the test is not
    converted (the reason is in ``notes``)."""
    client = _Client(test, path)
    where = client.where
    name = test.name
    server_model = test.server.get("model")
    if not isinstance(server_model, str) or not server_model:
        # run_serving_tests: "Error: serving test '...' is missing server_parameters.model"
        raise ConversionError(f"{where}: server_parameters.model is missing")
    client_model = test.client.get("model")
    if client_model != server_model:
        # run_serving_tests: "Server model and client model must be the same. Skip testcase"
        notes.append(Note(name, "client_parameters.model",
                          f"{client_model!r} is not the server's model {server_model!r}: vLLM's runner skips this "
                          "test, and so does the conversion"))
        return None
    backend = client.word("backend") or DEFAULT_BACKEND
    if backend in OTHER_BACKENDS:
        notes.append(Note(name, client.written("backend"), f"backend {backend!r} is not converted (converted: "
                                                           f"{', '.join(BACKENDS)}); test skipped"))
        return None
    if backend not in BACKENDS:
        raise ConversionError(f"{where}: {client.written('backend')}: unknown backend {backend!r}; vLLM's are "
                              f"{', '.join((*BACKENDS, *OTHER_BACKENDS))}")
    api, route = BACKENDS[backend]
    dataset = client.word("dataset-name") or DEFAULT_DATASET
    if dataset in OTHER_DATASETS:
        notes.append(Note(name, client.written("dataset-name"), f"dataset {dataset!r} is not converted (converted: "
                                                                f"{', '.join(DATASETS)}); test skipped"))
        return None
    if dataset not in DATASETS:
        raise ConversionError(f"{where}: {client.written('dataset-name')}: unknown dataset_name {dataset!r}; "
                              f"converted: {', '.join(DATASETS)}")
    endpoint = client.word("endpoint") or DEFAULT_ENDPOINT
    if not endpoint.endswith(route):
        # _validate_api_url: "... URL must end with one of ..." (vllm bench serve fails the run)
        raise ConversionError(f"{where}: {client.written('endpoint')}: backend {backend} sends to a URL ending in "
                              f"{route}, not {endpoint!r} (vllm bench serve refuses it too)")
    if endpoint != f"/v1/{route}":
        notes.append(Note(name, client.written("endpoint"), f"requests go to the server's /v1/{route}"))
    num_prompts = client.integer("num-prompts", DEFAULT_NUM_PROMPTS, minimum=1)
    cases = _cases(test, client, num_prompts, notes)
    burstiness = client.number("burstiness", 1.0, low=1e-9, high=math.inf)
    workload: dict[str, Any] = {"name": name, "api": api}
    streaming = api != "embeddings"
    dataset_path = client.word("dataset-path")
    images: dict[str, Any] | None = None
    input_max: float
    output_max = 0
    used = {"model", "backend", "endpoint", "dataset-name", "num-prompts", "request-rate", "max-concurrency",
            "burstiness", "seed", "num-warmups", "ignore-eos", "dataset-path"}
    if dataset in ("random", "random-mm"):
        if dataset_path is not None:
            # serve.py: "Cannot use 'random' dataset with --dataset-path."
            raise ConversionError(f"{where}: {client.written('dataset-path')}: dataset {dataset} takes no dataset_path")
        # serve.py: --input-len/--output-len, when given, replace --random-input-len/--random-output-len.
        input_len = client.integer("input-len", client.integer("random-input-len", DEFAULT_INPUT_LEN, minimum=1),
                                   minimum=1)
        output_len = client.integer("output-len", client.integer("random-output-len", DEFAULT_OUTPUT_LEN, minimum=1),
                                    minimum=1)
        ratio = client.number("random-range-ratio", 0.0, low=0.0, high=1.0, high_open=True)
        prefix = client.integer("random-prefix-len", 0, minimum=0)
        low, high = _length_range(input_len, ratio, floor_one=False)
        if prefix + low < 1:
            raise ConversionError(f"{where}: random-input-len {input_len} with random-range-ratio {ratio:g} allows "
                                  "prompts of 0 tokens (vllm bench serve refuses it too)")
        workload["input_tokens"] = _tokens(prefix + low, prefix + high)
        if streaming:
            out_low, out_high = _length_range(output_len, ratio, floor_one=True)
            workload["output_tokens"] = _tokens(out_low, out_high)
            output_max = out_high
        used |= {*RANDOM_KEYS, "input-len", "output-len"}
        if prefix:
            share = prefix / (prefix + low) if low else 1.0
            if share >= WARM_MIN_HIT_RATE and low >= 1:
                workload.update(cache="warm", prefix_tokens=prefix, num_prefixes=1)
            else:
                notes.append(Note(name, client.written("random-prefix-len"),
                                  f"a shared prefix of {prefix} tokens is {share:.0%} of the shortest prompt, below the "
                                  f"{WARM_MIN_HIT_RATE:.0%} a warm run must draw from the prefix cache: converted cold "
                                  f"(every prompt unique), the {prefix} tokens counted in input_tokens"))
        if api == "embeddings":
            workload["batch_size"] = client.integer("random-batch-size", 1, minimum=1)
            used.add("random-batch-size")
        input_max = (prefix + high) * int(workload.get("batch_size", 1))
        if dataset == "random-mm":
            if api != "chat":
                raise ConversionError(f"{where}: dataset random-mm sends images, which only backend openai-chat "
                                      f"carries (got backend {backend})")
            images = _images(client, notes)
            used |= set(MM_KEYS)
            if images is not None:
                workload["images"] = images
                count = images["count"]
                most = count[1] if isinstance(count, list) else count
                input_max += most * max(s["width"] * s["height"] for s in images["sizes"]) / VISION_PIXELS_PER_TOKEN
    else:  # sharegpt
        if not dataset_path:
            raise ConversionError(f"{where}: dataset sharegpt needs dataset_path (vLLM's: ./{SHAREGPT_FILE})")
        workload["dataset"] = {"path": dataset_path, "format": "sharegpt",
                               "min_input_tokens": SHAREGPT_MIN_PROMPT_TOKENS,
                               "max_input_tokens": SHAREGPT_MAX_PROMPT_TOKENS}
        input_max = SHAREGPT_MAX_PROMPT_TOKENS
        output_max = SHAREGPT_MAX_TOTAL_TOKENS - SHAREGPT_MIN_PROMPT_TOKENS
        notes.append(Note(name, client.written("dataset-name"),
                          f"vLLM also drops ShareGPT rows whose prompt + reply exceed {SHAREGPT_MAX_TOTAL_TOKENS} "
                          f"tokens or whose reply is under {SHAREGPT_MIN_PROMPT_TOKENS}; the dataset keeps prompts of "
                          f"{SHAREGPT_MIN_PROMPT_TOKENS}-{SHAREGPT_MAX_PROMPT_TOKENS} tokens only"))
    if streaming:
        # serve.py: random and random-mm on the completions/chat backends always ignore EOS.
        workload["ignore_eos"] = client.flag("ignore-eos") or dataset in ("random", "random-mm")
        sampling = {}
        for key, kind in SAMPLING.items():
            if client.has(key):
                sampling[key.replace("-", "_")] = (client.integer(key, 0, minimum=-1) if kind is int
                                                   else client.number(key, 0.0, low=-math.inf, high=math.inf))
        if sampling:
            workload["sampling"] = sampling
    else:
        for key in ("ignore-eos", *SAMPLING):
            if client.has(key):
                notes.append(Note(name, client.written(key), "applies to generation only (vLLM sends no sampling "
                                                             "parameters to pooling backends)"))
    used |= set(SAMPLING)
    workload["seed"] = client.integer("seed", DEFAULT_SEED, minimum=0)
    warmups = client.integer("num-warmups", 0, minimum=0)
    if warmups:
        workload["warmup_requests"] = warmups
        notes.append(Note(name, client.written("num-warmups"),
                          f"the first {warmups} requests of each run are its warm-up (vLLM sends {warmups} copies of "
                          "its first prompt before the run)"))
    workload["timeout_s"] = float(CLIENT_TIMEOUT_S)
    for key in client.params:
        if key in used:
            continue
        if key in CONVERTED_KEYS or (key == "sharegpt-output-len" and dataset != "sharegpt"):
            notes.append(Note(name, client.written(key), f"not used by dataset {dataset} or backend {backend} "
                                                         "(vLLM ignores it too)"))
        else:
            notes.append(Note(name, client.written(key), WHY_NOT.get(key, "not converted")))
    for key in test.raw:
        if key not in TEST_KEYS:
            notes.append(Note(name, key, "not converted (a key vLLM's runner does not pass to vllm serve or "
                                         "vllm bench serve)"))
    for case in cases:  # every case must be a valid Workload now, not when the suite runs
        try:
            Workload(**workload, **bench_load(case.qps, case.max_concurrency, num_prompts, burstiness))
        except WorkloadError as exc:
            raise ConversionError(f"{where}: {case.id}: {exc}") from None
    in_flight = max(min(c.max_concurrency, num_prompts) for c in cases)
    limits = ceilings(api=api, in_flight=in_flight, input_tokens_max=input_max, output_tokens_max=output_max)
    tail = tail_percentile(num_prompts)
    slo: dict[str, float] = {}
    for metric, limit in limits.items():
        slo[f"{metric}_p50"] = limit
        if tail is not None:
            slo[f"{metric}_{tail}"] = limit
    slo["error_rate"] = ERROR_RATE_LIMIT
    args = json2args(test.client, f"{where}: client_parameters")
    definition = Definition(test_name=name, line=test.line, workload=workload, num_prompts=num_prompts,
                            burstiness=burstiness, cases=cases, slo=slo, bench_args=tuple(args),
                            dataset_path=dataset_path if dataset == "sharegpt" else None)
    return definition, images is not None


def convert(path: str | Path) -> Conversion:
    """Read a vLLM serving definitions file into sub-suites of gated tests (see the module docstring).

    Raises :class:`ConversionError` naming the file, the line and the test for a file that is not
    JSON, a test without ``test_name`` or ``server_parameters.model``, an unknown backend or
    dataset, a bucket of no pixels, or any value vLLM's runner or ``vllm bench serve`` would refuse.
    """
    path = Path(path)
    tests = read_tests(path)
    notes: list[Note] = []
    groups: dict[ServerSetup, list[Definition]] = {}
    skipped: list[str] = []
    for test in tests:
        test_notes: list[Note] = []
        made = _definition(test, path, test_notes)
        if made is None:
            skipped.append(test.name)
            notes.extend(test_notes)
            continue
        definition, images = made
        server = _server_setup(test, path, test_notes, images)
        definition = dataclasses.replace(definition, notes=tuple(test_notes))
        notes.extend(test_notes)
        groups.setdefault(server, []).append(definition)
    if not groups:
        raise ConversionError(f"{path}: no test could be converted: " + "; ".join(n.line() for n in notes))
    names = _subsuite_names([(server, [d.test_name for d in defs]) for server, defs in groups.items()])
    subsuites = tuple(SubSuite(name, server, tuple(defs)) for name, (server, defs) in zip(names, groups.items()))
    return Conversion(source=path, subsuites=subsuites, skipped=tuple(skipped), notes=tuple(notes))


def _subsuite_names(groups: list[tuple[ServerSetup, list[str]]]) -> list[str]:
    """A directory name per server configuration: the longest ``_``-separated prefix its tests'
    names share (``serving_llama8B_tp1``), else the model's name; made unique with ``_2``, ``_3``."""
    out: list[str] = []
    for server, test_names in groups:
        parts = [n.split("_") for n in test_names]
        common: list[str] = []
        for words in zip(*parts):
            if len(set(words)) != 1:
                break
            common.append(words[0])
        name = "_".join(common) if len(common) > 1 else f"serving_{server.model.rsplit('/', 1)[-1]}"
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "serving"
        unique, k = name, 2
        while unique in out:
            unique, k = f"{name}_{k}", k + 1
        out.append(unique)
    return out


__all__ = [
    "CLIENT_TIMEOUT_S", "SHAREGPT_FILE", "SHAREGPT_URL", "SIM_VISION_ENCODER", "SIM_VISION_PRESET", "Case", "Conversion", "ConversionError",
    "Definition", "Note", "ServerSetup", "SubSuite", "bench_load", "ceilings", "convert", "format_qps", "jq_tostring",
    "json2args", "read_tests", "tail_percentile",
]
