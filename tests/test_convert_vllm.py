"""``llmperf convert vllm``: vLLM's CI serving definitions as gated pytest-llmperf suites.

The data files under ``tests/data/vllm/`` are trimmed copies of vLLM's own
(``.buildkite/performance-benchmarks/tests/``, see the README there): the text, multimodal and
embeddings CPU definitions (defaults + tests), an older bare list of tests with per-test
``qps_list`` (the HPU file), and the stored ``serving-tests.json`` that is not valid JSON.
The simulator tests convert a file and run the generated sub-suites as they are, with
``--llmperf-server sim`` and a short duration scale.
"""

from __future__ import annotations

import ast
import json
import math
import shlex
import shutil
from pathlib import Path

import iniconfig
import pytest

from pytest_llmperf.cli.main import main
from pytest_llmperf.convert.suite import SuiteWriteError, module_name, write_suite
from pytest_llmperf.convert.vllm import (
    SHAREGPT_FILE,
    SHAREGPT_URL,
    SIM_VISION_ENCODER,
    Case,
    ConversionError,
    bench_load,
    convert,
    json2args,
    tail_percentile,
)
from pytest_llmperf.objectives import SLO, check_applies
from pytest_llmperf.workload import Workload

DATA = Path(__file__).resolve().parent / "data" / "vllm"
TEXT = DATA / "serving-tests-cpu-text.json"
MULTIMODAL = DATA / "serving-tests-cpu-multimodal.json"
EMBED = DATA / "serving-tests-cpu-embed.json"
BARE_LIST = DATA / "serving-tests-hpu.json"
BROKEN = DATA / "serving-tests-broken.json"
CPU_ENV = (("VLLM_RPC_TIMEOUT", "100000"), ("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1"),
           ("VLLM_ENGINE_ITERATION_TIMEOUT_S", "120"), ("VLLM_CPU_SGL_KERNEL", "1"), ("VLLM_CPU_KVCACHE_SPACE", "40"))


def _definition(conversion, name):
    return next(d for d in conversion.definitions if d.test_name == name)


def _write(tmp_path, doc, name="serving-tests.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return path


def _one(client=None, server=None, **test):
    """A file with one test over the text file's defaults."""
    return {
        "defaults": {"qps_list": ["inf"], "max_concurrency_list": [4],
                     "server_parameters": {"model": "m/x"},
                     "client_parameters": {"model": "m/x", "backend": "vllm", "num_prompts": 20}},
        "tests": [{"test_name": "serving_x", "server_parameters": server or {},
                   "client_parameters": client or {"dataset_name": "random"}, **test}],
    }


# ---------------------------------------------------------------------- the mapping


def test_text_definitions_become_one_subsuite_per_server_configuration():
    conversion = convert(TEXT)
    assert [(s.name, s.server.model, [d.test_name for d in s.definitions]) for s in conversion.subsuites] == [
        ("serving_llama8B_tp1", "meta-llama/Llama-3.1-8B-Instruct",
         ["serving_llama8B_tp1_sharegpt", "serving_llama8B_tp1_random_128_128", "serving_llama8B_tp1_random_2048_128"]),
        ("serving_llama8B_tp2", "meta-llama/Llama-3.1-8B-Instruct",
         ["serving_llama8B_tp2_sharegpt", "serving_llama8B_tp2_random_128_128"]),
        ("serving_llama8B_int4_tp1_random_128_128", "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
         ["serving_llama8B_int4_tp1_random_128_128"]),
        ("serving_qwen1.7B_tp1_random_128_128", "Qwen/Qwen3-1.7B", ["serving_qwen1.7B_tp1_random_128_128"]),
    ]
    server = conversion.subsuites[0].server
    # json2args: defaults updated with the test's parameters, "_" -> "-", "" a bare flag, no model.
    assert server.args == ("--tensor-parallel-size", "1", "--dtype", "bfloat16", "--distributed-executor-backend", "mp",
                           "--block-size", "128", "--trust-remote-code", "--disable-log-stats",
                           "--max-num-batched-tokens", "2048", "--max-num-seqs", "256")
    assert server.env == CPU_ENV
    assert server.sim_args == ("--max-num-batched-tokens", "2048", "--max-num-seqs", "256")
    assert conversion.subsuites[1].server.args[:2] == ("--tensor-parallel-size", "2")
    assert conversion.skipped == ()

    random = _definition(conversion, "serving_llama8B_tp1_random_128_128")
    assert random.line == 54  # the test's "{" in the file
    assert dict(random.workload) == {
        "name": "serving_llama8B_tp1_random_128_128", "api": "completions", "input_tokens": 128, "output_tokens": 128,
        "ignore_eos": True, "sampling": {"temperature": 0.0}, "seed": 0, "timeout_s": 21600.0}
    assert random.cases == (Case(math.inf, 12), Case(math.inf, 32))
    assert [c.id for c in random.cases] == ["qps_inf_concurrency_12", "qps_inf_concurrency_32"]
    assert random.num_prompts == 200 and random.notes == ()
    assert random.bench_args == ("--model", "meta-llama/Llama-3.1-8B-Instruct", "--backend", "vllm", "--ignore-eos",
                                 "--temperature", "0", "--num-prompts", "200", "--dataset-name", "random",
                                 "--random-input-len", "128", "--random-output-len", "128")

    sharegpt = _definition(conversion, "serving_llama8B_tp1_sharegpt")
    assert sharegpt.dataset_path == "./ShareGPT_V3_unfiltered_cleaned_split.json"
    assert sharegpt.workload["dataset"] == {"path": "./ShareGPT_V3_unfiltered_cleaned_split.json", "format": "sharegpt",
                                            "min_input_tokens": 4, "max_input_tokens": 1024}
    assert [n.parameter for n in sharegpt.notes] == ["client_parameters.dataset_name"]


def test_gating_keys_are_medians_and_the_tail_the_request_count_can_judge():
    assert [tail_percentile(n) for n in (10, 199, 200, 399, 400, 1999, 2000)] == [
        None, None, "p90", "p90", "p95", "p95", "p99"]
    random = _definition(convert(TEXT), "serving_llama8B_tp1_random_2048_128")
    # 200 prompts: p90 is judged, p99 is not; ceilings: 60 s + 32 x 2048 tokens at 500 tok/s, then
    # 128 tokens at 1 s each.
    assert random.slo == {"ttft_p50": 200.0, "ttft_p90": 200.0, "tpot_p50": 1.0, "tpot_p90": 1.0,
                          "e2e_p50": 330.0, "e2e_p90": 330.0, "error_rate": 0.01}
    SLO.parse(dict(random.slo))


def test_the_load_of_a_case_is_vllm_bench_serves():
    # rate inf: every request at once behind a semaphore of C: a closed loop of min(C, N) streams
    assert bench_load(math.inf, 16, 200) == {"concurrency": 16, "num_requests": 200}
    assert bench_load(math.inf, 500, 200) == {"concurrency": 200, "num_requests": 200}
    # a finite rate: Poisson arrivals (gamma of shape B) that wait for one of C slots
    assert bench_load(4.0, 200, 200) == {"rate_rps": 4.0, "max_concurrency": 200, "num_requests": 200}
    assert bench_load(4.0, 8, 100, burstiness=0.5) == {"rate_rps": 4.0, "max_concurrency": 8, "num_requests": 100,
                                                        "arrival": "gamma", "burstiness": 0.5}


def test_multimodal_definitions_send_vllms_random_mm_traffic():
    conversion = convert(MULTIMODAL)
    assert [s.name for s in conversion.subsuites] == [
        "serving_qwen3b_tp1_random_mm_2x224_224", "serving_qwen3b_tp1_random_mm_var_256_256_720_1280",
        "serving_qwen7b_tp1_random_mm_1x448_448"]
    for s in conversion.subsuites:
        assert s.server.sim_args == () and s.server.sim_preset == f"llama-3.1-8b-h100+{SIM_VISION_ENCODER}"
        assert s.server.env == CPU_ENV
    # bash removes the quotes around the JSON of limit_mm_per_prompt, as it does for vLLM's runner
    assert conversion.subsuites[1].server.args == (
        "--dtype", "bfloat16", "--max-model-len", "16384", "--limit-mm-per-prompt", '{"image": 4, "video": 0}',
        "--mm-processor-kwargs", '{"max_pixels": 1003520}', "--tensor-parallel-size", "1")

    fixed = _definition(conversion, "serving_qwen3b_tp1_random_mm_2x224_224").workload
    # 25 prefix tokens + [floor(300 x 0.8), ceil(300 x 1.2)]; outputs [32, 48]
    assert fixed["input_tokens"] == {"dist": "uniform", "min": 265, "max": 385}
    assert fixed["output_tokens"] == {"dist": "uniform", "min": 32, "max": 48}
    assert fixed["api"] == "chat" and fixed["seed"] == 42 and fixed["ignore_eos"] is True
    assert fixed["images"] == {"count": 2, "sizes": [{"width": 224, "height": 224, "weight": 1.0}],
                               "position": "after", "unique": None, "format": "jpeg", "transport": "data_url"}
    mixed = _definition(conversion, "serving_qwen3b_tp1_random_mm_var_256_256_720_1280").workload["images"]
    # 2 items, range ratio 0.5: [1, 3] (under the limit of 4); keys are (height, width, frames)
    assert mixed["count"] == [1, 3]
    assert mixed["sizes"] == [{"width": 256, "height": 256, "weight": 0.7}, {"width": 1280, "height": 720, "weight": 0.3}]
    # the 25-token prefix is too small a share for a warm run's cache check: converted cold, noted
    for d in conversion.definitions:
        assert "cache" not in d.workload
        assert [n.parameter for n in d.notes] == ["client_parameters.random-prefix-len"]
        Workload(**d.workload, **bench_load(d.cases[0].qps, d.cases[0].max_concurrency, d.num_prompts))


def test_embeddings_definitions_gate_end_to_end_latency_only():
    conversion = convert(EMBED)
    (suite,) = conversion.subsuites
    assert suite.server.model == "jinaai/jina-embeddings-v3" and suite.server.sim_args == ()
    assert suite.server.args == ("--dtype", "bfloat16", "--trust-remote-code", "--tensor-parallel-size", "1")
    (d,) = suite.definitions
    assert d.api == "embeddings"
    assert d.dataset_path == SHAREGPT_FILE
    assert "ignore_eos" not in d.workload and "output_tokens" not in d.workload
    assert [c.id for c in d.cases] == ["qps_inf_concurrency_32", "qps_inf_concurrency_64", "qps_inf_concurrency_128"]
    assert set(d.slo) == {"e2e_p50", "e2e_p90", "error_rate"}
    check_applies(SLO.parse(dict(d.slo)), "embeddings")  # TTFT/TPOT keys would be a usage error


def test_the_older_bare_list_format_sweeps_each_tests_own_qps_list():
    conversion = convert(BARE_LIST)
    assert [s.name for s in conversion.subsuites] == ["serving_llama8B_tp1_sharegpt", "serving_llama70B_tp4_sharegpt"]
    d = conversion.definitions[0]
    # no max_concurrency_list: the runner caps at num_prompts
    assert [c.id for c in d.cases] == ["qps_1_concurrency_200", "qps_4_concurrency_200", "qps_16_concurrency_200",
                                       "qps_inf_concurrency_200"]
    assert d.workload["ignore_eos"] is False  # no --ignore-eos on a ShareGPT test: answers may end at EOS
    server = conversion.subsuites[0].server
    assert server.env == (("PT_HPU_LAZY_MODE", "1"), ("VLLM_DEFRAG", "1"))
    assert "--max-model-len" in server.args and server.sim_args == ("--max-num-seqs", "256")
    assert bench_load(d.cases[0].qps, d.cases[0].max_concurrency, d.num_prompts) == {
        "rate_rps": 1.0, "max_concurrency": 200, "num_requests": 200}


def test_parameters_it_cannot_express_are_notes(tmp_path, capsys):
    doc = _one(client={"dataset_name": "random-mm", "backend": "openai-chat", "endpoint": "/v1/chat/completions",
                       "save_result": "", "metadata": "tp=1", "sharegpt-output-len": 100, "random-mm-bucket-config":
                       "'{(224, 224, 1): 0.5, (224, 224, 16): 0.5}'", "random-mm-limit-mm-per-prompt":
                       "'{\"image\": 2, \"video\": 1}'", "request_rate": 2},
               tier="base")
    doc["tests"].append({"test_name": "serving_other_model", "server_parameters": {"model": "m/y"},
                         "client_parameters": {"model": "m/x"}})
    doc["tests"].append({"test_name": "serving_sonnet", "client_parameters": {"dataset_name": "sonnet"}})
    path = _write(tmp_path, doc)
    conversion = convert(path)
    assert conversion.skipped == ("serving_other_model", "serving_sonnet")
    lines = [n.line() for n in conversion.notes]
    expected = [
        "serving_x: client_parameters.request_rate: overrides every rate of qps_list",
        "serving_x: client_parameters.random-mm-bucket-config: video buckets (224, 224, 16): 0.5 not converted",
        "serving_x: client_parameters.save_result: vLLM's result files",
        "serving_x: client_parameters.metadata: vLLM's result files",
        "serving_x: client_parameters.sharegpt-output-len: not used by dataset random-mm",
        "serving_x: tier: not converted",
        "serving_other_model: client_parameters.model: 'm/x' is not the server's model 'm/y': vLLM's runner skips",
        "serving_sonnet: client_parameters.dataset_name: dataset 'sonnet' is not converted",
    ]
    for prefix in expected:
        assert any(line.startswith(prefix) for line in lines), (prefix, lines)
    (d,) = conversion.definitions
    assert d.cases == (Case(2.0, 4),)
    assert d.workload["images"]["count"] == 1 and d.workload["images"]["sizes"] == [
        {"width": 224, "height": 224, "weight": 1.0}]

    out = tmp_path / "out"
    assert main(["convert", "vllm", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    readme = (out / "README.md").read_text()
    module = (out / "serving_x" / module_name(path)).read_text()
    for note in conversion.notes:
        assert note.line() in printed
        assert f"`{note.parameter}`: {note.reason}" in readme
    for note in d.notes:  # each at its test, as a comment
        assert note.reason.split()[0] in module and note.parameter in module


def test_shell_and_jq_semantics_of_the_runners_arguments():
    assert json2args({"enforce_eager": "", "max_num_seqs": 128, "gpu_memory_utilization": 0.9,
                      "limit_mm_per_prompt": "'{\"image\": 3}'", "compilation_config": {"mode": 3}}, "here") == [
        "--enforce-eager", "--max-num-seqs", "128", "--gpu-memory-utilization", "0.9", "--limit-mm-per-prompt",
        '{"image": 3}', "--compilation-config", "{mode:3}"]  # bash eats the quotes of an unquoted JSON value


# ---------------------------------------------------------------------- bad input


def test_a_malformed_file_fails_naming_the_file_and_the_line():
    with pytest.raises(ConversionError, match=r"serving-tests-broken\.json:35: not valid JSON: Expecting ','"):
        convert(BROKEN)


@pytest.mark.parametrize(("doc", "message"), [
    ("not json at all", r"serving-tests\.json:1: not valid JSON"),
    ('{"cases": []}', r"unsupported serving test file format"),
    ({"tests": [{"server_parameters": {"model": "m/x"}}]}, r"serving-tests\.json:3: tests\[0\] has no test_name"),
    (_one(client={"dataset_name": "squad"}), r"serving-tests\.json:\d+: serving_x: client_parameters\.dataset_name: "
                                             r"unknown dataset_name 'squad'"),
    (_one(client={"backend": "tgi"}), r"serving_x: client_parameters\.backend: unknown backend 'tgi'"),
    (_one(client={"dataset_name": "random-mm", "backend": "openai-chat", "endpoint": "/v1/chat/completions",
                  "random-mm-bucket-config": "'{(0, 224, 1): 1.0}'"}),
     r"serving_x: client_parameters\.random-mm-bucket-config: bucket \(0, 224, 1\) has 0 pixels"),
    (_one(client={"dataset_name": "random-mm", "backend": "openai-chat", "endpoint": "/v1/chat/completions",
                  "random-mm-bucket-config": "'{(224, 224, 1): 0.0}'"}), r"every bucket has probability 0"),
    (_one(client={"dataset_name": "random-mm"}), r"serving_x: dataset random-mm sends images, which only backend "
                                                 r"openai-chat carries"),
    (_one(client={"backend": "openai-chat"}), r"serving_x: client_parameters\.endpoint: backend openai-chat sends to "
                                              r"a URL ending in chat/completions"),
    (_one(client={"dataset_name": "random", "dataset_path": "x.json"}), r"dataset random takes no dataset_path"),
    (_one(client={"dataset_name": "sharegpt"}), r"dataset sharegpt needs dataset_path"),
    (_one(client={"random-range-ratio": 1.0}), r"random-range-ratio: must be in \[0, 1\)"),
    (_one(client={"random-input-len": "many"}), r"random-input-len: expected an integer, got 'many'"),
    (_one(qps_list=[0]), r"serving_x: qps_list: expected a positive number"),
    (_one(max_concurrency_list=[0]), r"serving_x: max_concurrency_list: expected positive integers"),
    ({"tests": [{"test_name": "serving_x", "client_parameters": {}}]}, r"serving_x: server_parameters\.model is "
                                                                       r"missing"),
    ({"tests": [{"test_name": "latency_x"}]}, r"latency_x: test_name must start with 'serving_'"),
    ({"tests": [{"test_name": "serving_x", "qps_list": [1]}, {"test_name": "serving_x"}]},
     r"serving-tests\.json:\d+: serving_x: test_name already used by the test at line 3"),
])
def test_bad_input_fails_naming_the_file_and_the_test(tmp_path, doc, message):
    path = _write(tmp_path, doc)
    with pytest.raises(ConversionError, match=message) as info:
        convert(path)
    assert str(path) in str(info.value)


def test_the_cli_writes_nothing_for_a_bad_file_and_refuses_a_full_directory(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["convert", "vllm", str(BROKEN), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmperf convert vllm: error: ") and "serving-tests-broken.json:35:" in err
    assert not out.exists()
    assert main(["convert", "vllm", str(TEXT), "--out", str(out)]) == 0
    assert main(["convert", "vllm", str(TEXT), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["convert", "vllm", str(TEXT), "--out", str(out), "--force"]) == 0
    with pytest.raises(SuiteWriteError, match="not a directory"):
        write_suite(convert(TEXT), out / "README.md", command="x")


# ---------------------------------------------------------------------- the files written


def test_the_written_suite_holds_each_server_in_its_own_sub_suite(tmp_path):
    conversion = convert(TEXT)
    out = tmp_path / "perf"
    written = write_suite(conversion, out, command="llmperf convert vllm serving-tests-cpu-text.json --out perf")
    assert len(written) == 1 + 3 * len(conversion.subsuites)
    for suite in conversion.subsuites:
        ini = iniconfig.IniConfig(out / suite.name / "pytest.ini")["pytest"]
        assert ini["llmperf_server"] == "vllm" and ini["llmperf_model"] == suite.server.model
        assert tuple(shlex.split(ini["llmperf_server_args"])) == suite.server.args  # as the plugin splits it
        assert tuple(shlex.split(ini["llmperf_sim_args"])) == suite.server.sim_args
        assert ini["llmperf_store"] == f".llmperf/{suite.name}"
        conftest = (out / suite.name / "conftest.py").read_text()
        ast.parse(conftest)
        assert '"VLLM_CPU_KVCACHE_SPACE": "40",' in conftest
        module = (out / suite.name / "test_serving_tests_cpu_text.py").read_text()
        tree = ast.parse(module)
        functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        assert functions == ["test_" + d.test_name.replace(".", "_") for d in suite.definitions]
    module = (out / "serving_llama8B_tp1" / "test_serving_tests_cpu_text.py").read_text()
    assert "# serving_llama8B_tp1_random_128_128 (serving-tests-cpu-text.json:54):" in module
    assert ("@slo(ttft_p50=69, ttft_p90=69, tpot_p50=1.0, tpot_p90=1.0, e2e_p50=200, e2e_p90=200, error_rate=0.01)"
            in module)
    assert 'pytest.param(INF, 12, id="qps_inf_concurrency_12"),' in module
    assert 'dataset_file("./ShareGPT_V3_unfiltered_cleaned_split.json")' in module
    assert max(len(line) for line in module.splitlines()) <= 120
    readme = (out / "README.md").read_text()
    for suite in conversion.subsuites:
        assert f"[`{suite.name}`]({suite.name}/)" in readme and suite.server.command() in readme
    for command in ("pytest serving_llama8B_tp1 --llmperf-save main", "pytest serving_llama8B_tp1 --llmperf-baseline main",
                    "pytest serving_llama8B_tp1 --llmperf-server sim", f"wget {SHAREGPT_URL}"):
        assert command in readme


# ---------------------------------------------------------------------- on the simulator


def _sharegpt(path: Path) -> None:
    """A small ShareGPT file (the real one is 600+ MB): short prompts, replies of 8-19 words."""
    words = "the of and to in is that for it as with was on be at by this had not are".split()
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": " ".join(words[i % 7:] * (1 + i % 4))},
                                             {"from": "gpt", "value": " ".join(words[:8 + i % 12])}]}
            for i in range(40)]
    path.write_text(json.dumps(rows))


def _run_on_sim(pytester, source: Path) -> None:
    """Convert ``source`` and run every generated sub-suite on the simulator, each in its own
    session as the README says; every test must pass."""
    out = pytester.path / "perf"
    assert main(["convert", "vllm", str(source), "--out", str(out)]) == 0
    conversion = convert(source)
    for suite in conversion.subsuites:
        if any(d.dataset_path for d in suite.definitions):
            _sharegpt(out / suite.name / SHAREGPT_FILE)
        result = pytester.runpytest_subprocess(
            str(out / suite.name), "--llmperf-server", "sim", "--llmperf-duration-scale", "0.05",
            "--llmperf-plots", "off", "-p", "no:cacheprovider", timeout=300)
        cases = sum(len(d.cases) for d in suite.definitions)
        assert result.ret == 0, f"{suite.name}:\n" + result.stdout.str()[-4000:]
        result.assert_outcomes(passed=cases)


@pytest.mark.integration
def test_the_text_suite_passes_on_the_simulator(pytester):
    _run_on_sim(pytester, TEXT)


@pytest.mark.integration
def test_a_missing_sharegpt_file_fails_naming_it_and_where_to_get_it(pytester):
    out = pytester.path / "perf"
    write_suite(convert(TEXT), out, command="llmperf convert vllm")
    result = pytester.runpytest_subprocess(str(out / "serving_llama8B_tp2"), "--llmperf-server", "sim", "-k", "sharegpt",
                                           "--llmperf-plots", "off", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(failed=2)
    missing = out / "serving_llama8B_tp2" / SHAREGPT_FILE
    result.stdout.fnmatch_lines([f"{missing}: dataset file missing; vLLM's runner downloads it: wget {SHAREGPT_URL}*"])


@pytest.mark.integration
def test_a_sub_suite_runs_in_a_session_of_its_own(pytester):
    out = pytester.path / "perf"
    write_suite(convert(EMBED), out, command="llmperf convert vllm")
    shutil.copy(out / "serving_jina_embed_v3_tp1_sharegpt" / "pytest.ini", out / "pytest.ini")  # not its own ini
    result = pytester.runpytest_subprocess(str(out), "--llmperf-server", "sim", "-p", "no:cacheprovider", timeout=60)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*serving_jina_embed_v3_tp1_sharegpt is a sub-suite of its own: run it as `pytest *"])


@pytest.mark.integration
def test_the_multimodal_suite_passes_on_the_simulator(pytester):
    _run_on_sim(pytester, MULTIMODAL)


@pytest.mark.integration
def test_the_embeddings_suite_passes_on_the_simulator(pytester):
    _run_on_sim(pytester, EMBED)


def test_a_prefix_that_is_most_of_the_prompt_is_a_warm_shared_prefix(tmp_path):
    path = _write(tmp_path, _one(client={"dataset_name": "random", "random-prefix-len": 1000, "random-input-len": 100,
                                         "random-output-len": 16}))
    (d,) = convert(path).definitions
    # total input = prefix + sampled length (datasets.py RandomDataset: prefix_token_ids + inner_seq)
    assert d.workload["input_tokens"] == 1100
    assert (d.workload["cache"], d.workload["prefix_tokens"], d.workload["num_prefixes"]) == ("warm", 1000, 1)
    assert d.notes == ()
