"""Provenance: the commit a session measured and the CI run that measured it, read from git, from
the CI's environment (GitHub Actions, GitLab CI, Buildkite) and from --llmperf-revision; saved with
every session, shown in the reports, `llmperf history` (change points name their commit range) and
`llmperf baselines list`."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import numpy as np
import pytest
import saved

from pytest_llmperf.baseline.history import load_history
from pytest_llmperf.baseline.schema import session_document
from pytest_llmperf.baseline.store import BaselineStore
from pytest_llmperf.cli.main import main as cli_main
from pytest_llmperf.provenance import (
    CommitRange,
    Provenance,
    RevisionError,
    commit_url,
    detect,
    from_ci,
    from_git,
    parse_revision,
    web_url,
)
from pytest_llmperf.report.document import build_document
from pytest_llmperf.report.junit import render_junit
from pytest_llmperf.report.markdown import render_markdown
from pytest_llmperf.report.model import ReportDocument
from pytest_llmperf.report.writers import to_json, validate

SHA_A = "a" * 40
SHA_B = "b" * 40
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": "2026-11-01T10:00:00+00:00",
                        "GIT_COMMITTER_DATE": "2026-11-01T10:00:00+00:00", "HOME": str(repo), "PATH": "/usr/bin:/bin"})
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def _repo(tmp_path, remote="https://user:s3cret@github.com/org/suite.git"):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("1\n")
    _git(repo, "add", "a.txt")
    sha = _git(repo, "commit", "-q", "-m", "first")
    if remote:
        _git(repo, "remote", "add", "origin", remote)
    return repo, sha


@pytest.mark.parametrize("remote, url", [
    ("git@github.com:org/repo.git", "https://github.com/org/repo"),
    ("https://user:token@github.com/org/repo.git", "https://github.com/org/repo"),
    ("https://x-access-token:ghs_abc@github.com/org/repo", "https://github.com/org/repo"),
    ("ssh://git@gitlab.example.com:2222/group/sub/repo.git", "https://gitlab.example.com/group/sub/repo"),
    ("https://gitlab.com/group/repo/", "https://gitlab.com/group/repo"),
    ("/srv/git/repo.git", None),
    ("file:///srv/git/repo", None),
])
def test_remotes_become_web_urls_without_credentials(remote, url):
    assert web_url(remote) == url


def test_commit_urls_follow_the_forge():
    assert commit_url("https://github.com/o/r", SHA_A) == f"https://github.com/o/r/commit/{SHA_A}"
    assert commit_url("https://gitlab.com/o/r", SHA_A) == f"https://gitlab.com/o/r/-/commit/{SHA_A}"
    assert commit_url("https://github.com/o/r", "v0.6.3") is None  # a version is no commit page
    assert commit_url(None, SHA_A) is None


def test_revision_by_hand():
    assert parse_revision(None) == {} and parse_revision("  ") == {}
    assert parse_revision(SHA_A.upper()) == {"commit": SHA_A}
    assert parse_revision("v0.6.3") == {"commit": "v0.6.3"}
    assert parse_revision(f"commit={SHA_B}, branch=release/1.2, repo=https://github.com/vllm-project/vllm.git,"
                          "time=2026-11-01T10:00:00Z, pr=#42, run=https://ci.example.com/b/1") == {
        "commit": SHA_B, "branch": "release/1.2", "repository": "https://github.com/vllm-project/vllm",
        "commit_time": "2026-11-01T10:00:00Z", "pr": 42, "run_url": "https://ci.example.com/b/1"}
    for bad, needle in (("sha=1", "KEY=VALUE with KEY one of"), ("time=yesterday", "ISO 8601"),
                        ("repo=github.com/x", r"http\(s\) URL"), ("pr=x", "positive number"), ("commit=", "needs a value"),
                        ("a b", "must not contain spaces")):
        with pytest.raises(RevisionError, match=needle):
            parse_revision(bad)


def test_github_actions_push_and_pull_request(tmp_path):
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"head_commit": {"id": SHA_A, "timestamp": "2026-11-01T11:00:00+01:00"}}))
    env = {"GITHUB_ACTIONS": "true", "GITHUB_SHA": SHA_A, "GITHUB_REF": "refs/heads/main", "GITHUB_REF_NAME": "main",
           "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "org/repo", "GITHUB_RUN_ID": "77",
           "GITHUB_RUN_ATTEMPT": "2", "GITHUB_EVENT_PATH": str(event)}
    push = from_ci(env)
    assert (push.commit, push.branch, push.commit_time, push.pr, push.ci) == (
        SHA_A, "main", "2026-11-01T11:00:00+01:00", None, "github-actions")
    assert push.run_url == "https://github.com/org/repo/actions/runs/77/attempts/2"
    pr = from_ci({**env, "GITHUB_REF": "refs/pull/12/merge", "GITHUB_REF_NAME": "12/merge",
                  "GITHUB_HEAD_REF": "feature/x", "GITHUB_SHA": SHA_B, "GITHUB_RUN_ATTEMPT": "1"})
    assert (pr.commit, pr.branch, pr.pr, pr.commit_time) == (SHA_B, "feature/x", 12, None)
    assert pr.run_url == "https://github.com/org/repo/actions/runs/77"


def test_gitlab_and_buildkite():
    gitlab = from_ci({"GITLAB_CI": "true", "CI_COMMIT_SHA": SHA_A, "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME": "fix",
                      "CI_COMMIT_TIMESTAMP": "2026-11-01T10:00:00+00:00", "CI_PROJECT_URL": "https://gitlab.com/g/p",
                      "CI_JOB_URL": "https://gitlab.com/g/p/-/jobs/5", "CI_MERGE_REQUEST_IID": "9"})
    assert (gitlab.commit, gitlab.branch, gitlab.pr, gitlab.run_url, gitlab.ci) == (
        SHA_A, "fix", 9, "https://gitlab.com/g/p/-/jobs/5", "gitlab-ci")
    buildkite = from_ci({"BUILDKITE": "true", "BUILDKITE_COMMIT": "HEAD", "BUILDKITE_BRANCH": "main",
                         "BUILDKITE_REPO": "git@github.com:org/engine.git", "BUILDKITE_PULL_REQUEST": "false",
                         "BUILDKITE_BUILD_URL": "https://buildkite.com/org/p/builds/3"})
    assert (buildkite.commit, buildkite.branch, buildkite.pr, buildkite.repository) == (
        None, "main", None, "https://github.com/org/engine")  # "HEAD" is no commit
    assert from_ci({}) == Provenance()


@needs_git
def test_git_gives_commit_time_branch_remote_and_dirty(tmp_path):
    repo, sha = _repo(tmp_path)
    found = from_git(repo)
    assert (found.commit, found.branch, found.repository, found.dirty, found.source) == (
        sha, "main", "https://github.com/org/suite", False, "git")
    assert found.commit_time == "2026-11-01T10:00:00+00:00"
    (repo / "a.txt").write_text("2\n")
    assert from_git(repo).dirty is True
    assert from_git(tmp_path / "nowhere") == Provenance()  # not a repository: unknown, no error


@needs_git
def test_detect_fills_what_git_lacks_from_ci_and_by_hand(tmp_path):
    repo, sha = _repo(tmp_path)
    _git(repo, "checkout", "-q", "--detach")  # how CI checks out: no branch
    env = {"GITHUB_ACTIONS": "true", "GITHUB_SHA": sha, "GITHUB_REF": "refs/pull/3/merge", "GITHUB_HEAD_REF": "feat",
           "GITHUB_REPOSITORY": "org/suite", "GITHUB_RUN_ID": "9"}
    found = detect(repo, env)
    assert (found.commit, found.branch, found.pr, found.source) == (sha, "feat", 3, "git")
    assert found.commit_url == f"https://github.com/org/suite/commit/{sha}"
    assert found.run_url == "https://github.com/org/suite/actions/runs/9"
    # No git here: the CI's environment says what was checked out.
    bare = detect(tmp_path / "no-repo", {**env, "GITHUB_SHA": SHA_A})
    assert (bare.commit, bare.source, bare.commit_url) == (SHA_A, "github-actions",
                                                          f"https://github.com/org/suite/commit/{SHA_A}")
    # By hand: the engine's commit, not the suite's; the CI run is still this one.
    manual = detect(repo, env, parse_revision(f"commit={SHA_B},repo=https://github.com/vllm-project/vllm"))
    assert (manual.commit, manual.branch, manual.source, manual.dirty, manual.pr) == (SHA_B, None, "manual", None, 3)
    assert manual.commit_url == f"https://github.com/vllm-project/vllm/commit/{SHA_B}"
    assert detect(repo, {}, parse_revision("branch=nightly")).branch == "nightly"  # a field on top of git


def test_provenance_reads_leniently_and_describes_itself():
    assert Provenance.from_dict(None) is None and Provenance.from_dict("x") is None
    p = Provenance.from_dict({"commit": SHA_A, "branch": "main", "pr": "7", "dirty": "yes", "commit_time": 5,
                              "commit_time_extra": 1, "commit_time ": "x"})
    assert p == Provenance(commit=SHA_A, branch="main", pr=7)
    assert Provenance(commit=SHA_A, branch="main", commit_time="2026-11-01T11:00:00+01:00", pr=7).describe() == (
        "commit aaaaaaaaaa on main, 2026-11-01 10:00 UTC, PR #7")
    assert Provenance().describe() == "unknown commit"
    span = CommitRange(Provenance(commit=SHA_A, repository="https://github.com/o/r"),
                       Provenance(commit=SHA_B, repository="https://github.com/o/r"))
    assert span.describe() == "aaaaaaaaaa..bbbbbbbbbb"
    assert span.bisect_command() == f"git bisect start {SHA_B} {SHA_A}"
    assert span.compare_url() == f"https://github.com/o/r/compare/{SHA_A}...{SHA_B}"
    assert CommitRange(None, Provenance(commit=SHA_B)).bisect_command() is None


def test_session_documents_carry_it_and_old_ones_read_as_unknown(tmp_path):
    store = BaselineStore(tmp_path, keep=None)
    entries = {"t.py::t#0": saved.entry([saved.trial(stats={"tpot_p50": 0.01})], slo={"tpot_p50": 0.02})}
    store.save("main", {"plugin_version": "0.1.0", "tests": entries})  # saved before provenance existed
    store.save("main", session_document(entries, provenance=Provenance(commit=SHA_A, branch="main")))
    store.save("main", session_document(entries, provenance=Provenance()))  # nothing known: no key
    newest, middle, oldest = store.runs("main")
    assert "provenance" not in store.load(newest.path).run
    assert store.load(middle.path).session.provenance == Provenance(commit=SHA_A, branch="main")
    assert store.load(oldest.path).session.provenance is None


def test_reports_show_the_commit_and_the_baselines(tmp_path):
    entries = {"t.py::t#0": saved.entry([saved.trial(stats={"tpot_p50": 0.01})], slo={"tpot_p50": 0.02})}
    here = Provenance(commit=SHA_B, branch="feat", pr=12, commit_url=f"https://github.com/o/r/commit/{SHA_B}",
                      run_url="https://github.com/o/r/actions/runs/1")
    doc = build_document(entries, baseline_name="main", baseline_source="x.json.gz", provenance=here,
                         baseline_provenance=Provenance(commit=SHA_A))
    data = json.loads(to_json(doc))
    assert data["provenance"]["commit"] == SHA_B and data["baseline"]["provenance"] == {"commit": SHA_A}
    validate(data)
    again = ReportDocument.from_json_dict(data)
    assert again.provenance == here and again.baseline is not None and again.baseline.provenance.commit == SHA_A
    text = render_markdown(doc)
    assert f"commit [`bbbbbbbbbb`](https://github.com/o/r/commit/{SHA_B}) on `feat`" in text
    assert "PR #12" in text and "[CI run](https://github.com/o/r/actions/runs/1)" in text
    assert "baseline `main` at `aaaaaaaaaa`" in text
    junit = render_junit(doc)
    assert f'<property name="llmperf.commit" value="{SHA_B}"' in junit and 'name="llmperf.pr" value="12"' in junit
    # a report written before provenance existed still reads
    del data["provenance"]
    assert ReportDocument.from_json_dict(data).provenance is None


def _history_store(tmp_path, levels):
    store = BaselineStore(tmp_path / "store", keep=None)
    rng = np.random.default_rng(0)
    shas = []
    for i, level in enumerate(levels):
        sha = f"{i:02d}" + "c" * 38
        shas.append(sha)
        value = level * math.exp(rng.normal(0, 0.01))
        entry = saved.entry([saved.trial(t, stats={"tpot_p50": value * math.exp(rng.normal(0, 0.005)),
                                                   "goodput": 10.0}) for t in range(3)], slo={"tpot_p50": 0.02})
        prov = Provenance(commit=sha, branch="main", repository="https://github.com/o/r",
                          commit_url=commit_url("https://github.com/o/r", sha)) if i != 0 else None
        store.save("main", session_document({"test_chat.py::test_chat#0": entry}, provenance=prov))
    return store, shas


def test_history_names_the_commit_range_of_a_change_point(tmp_path, capsys):
    store, shas = _history_store(tmp_path, [0.007] * 10 + [0.008] * 6)
    assert cli_main(["history", "main", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "16 sessions, oldest first (commits ? .. 15cccccccc)" in out
    assert (f"change at session 11 of 16: commits 09cccccccc..10cccccccc (bisect: git bisect start {shas[10]} "
            f"{shas[9]})") in out
    assert "goodput" in out and out.count("change at session") == 1  # goodput did not move
    assert cli_main(["history", "main", "--store", str(store.root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [tpot] = [s for s in doc["series"] if s["stat"] == "tpot_p50"]
    assert tpot["change_ranges"][0]["bisect"] == f"git bisect start {shas[10]} {shas[9]}"
    assert doc["session_list"][0]["provenance"] is None and doc["session_list"][1]["provenance"]["commit"] == shas[1]
    history = load_history(store, "main")
    [series] = [s for s in history.series() if s.stat == "tpot_p50"]
    assert [r.describe() for r in series.change_ranges(history.provenance())] == ["09cccccccc..10cccccccc"]


def test_baselines_list_and_show_name_the_commit(tmp_path, capsys):
    store, shas = _history_store(tmp_path, [0.007] * 2)
    assert cli_main(["baselines", "list", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "RUNS", "LATEST", "(UTC)", "COMMIT", "FINGERPRINT"]
    assert "01cccccccc main" in out
    assert cli_main(["baselines", "show", "main", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "measured   commit 01cccccccc on main" in out
    assert f"commit url https://github.com/o/r/commit/{shas[1]}" in out


@needs_git
@pytest.mark.integration
def test_a_saved_session_records_its_git_commit_and_a_bad_revision_is_a_usage_error(pytester, tmp_path):
    repo, sha = _repo(pytester.path, remote="git@github.com:org/suite.git")
    (repo / "test_one.py").write_text(
        "from pytest_llmperf import Workload, slo\n\n\n@slo(tpot_p50=1.0)\n"
        "def test_one(llmperf):\n    llmperf.run(Workload(input_tokens=32, output_tokens=8, rate_rps=20,"
        " num_requests=6, trials=1))\n")
    store = tmp_path / "store"
    env = {k: "" for k in ("GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        result = pytester.runpytest_subprocess(str(repo / "test_one.py"), "--rootdir", str(repo), "-p",
                                               "no:cacheprovider", f"--llmperf-store={store}", "--llmperf-save",
                                               "main", "--llmperf-plots", "off",
                                               f"--llmperf-report-dir={tmp_path / 'report'}")
        assert result.ret == 0, result.stdout.str()
        result.stdout.fnmatch_lines([f"saved baseline 'main': * (commit {sha[:10]} on main*"])
        saved_run = BaselineStore(store).latest("main")
        prov = saved_run.session.provenance
        assert prov is not None and (prov.commit, prov.branch, prov.repository) == (
            sha, "main", "https://github.com/org/suite")
        report = json.loads((tmp_path / "report" / "llmperf.json").read_text())
        assert report["provenance"]["commit"] == sha
        bad = pytester.runpytest_subprocess(str(repo / "test_one.py"), "--rootdir", str(repo), "-p",
                                            "no:cacheprovider", "--llmperf-revision", "pr=x")
        assert bad.ret == 4
        bad.stderr.fnmatch_lines(["*--llmperf-revision 'pr=x': pr='x' must be a positive number*"])
