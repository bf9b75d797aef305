"""Provenance: which commit a session measured, and which CI run measured it.

A saved session (``baseline.schema.session_document``) and every report carry a ``provenance``
object, so that main's history can say which commits lie between two sessions (the range a change
point lies in, and what ``git bisect`` needs), and a dashboard can link each point to its commit
and its CI run::

    {"commit": "<sha, or a revision given by hand>", "branch": "main",
     "commit_time": "2026-11-01T10:00:00+00:00", "repository": "https://github.com/org/repo",
     "commit_url": "https://github.com/org/repo/commit/<sha>", "run_url": "https://.../actions/runs/1",
     "pr": 12, "ci": "github-actions", "dirty": false, "source": "git"}

Every key is optional; a session saved before provenance was recorded has none, which reads as
unknown (:meth:`Provenance.from_dict` of ``None``).

**Where it comes from** (:func:`detect`), in this order:

1. ``--llmperf-revision`` (ini ``llmperf_revision``), set by hand: a bare value is the commit (or
   any revision name: a tag, an engine's version), ``key=value`` pairs separated by commas set
   several fields (``commit=abc123,branch=main,repo=https://github.com/vllm-project/vllm``; keys:
   :data:`MANUAL_KEYS`). It is for a suite that measures something other than its own repository,
   typically an engine built from another one: when it names a ``commit``, nothing is read from
   the suite's git (whose commit is not the one under test); the CI run and PR still are.
2. git, in the directory the suite runs from (pytest's rootdir): ``HEAD``'s commit and commit
   time, the branch (none on a detached ``HEAD``, which is how CI checks out), the ``origin``
   remote as a web URL (credentials stripped) and whether tracked files differ from ``HEAD``
   (``dirty``). A shallow clone still has ``HEAD``; what it lacks, the CI's environment fills.
3. the CI's environment, for what git did not give (no git, no repository, a detached ``HEAD``):
   GitHub Actions (``GITHUB_SHA``, ``GITHUB_REF``, ``GITHUB_HEAD_REF``/``GITHUB_REF_NAME``,
   ``GITHUB_SERVER_URL``/``GITHUB_REPOSITORY``, ``GITHUB_RUN_ID``, the push event's commit time),
   GitLab CI (``CI_COMMIT_SHA``, ``CI_COMMIT_BRANCH``/``CI_MERGE_REQUEST_SOURCE_BRANCH_NAME``,
   ``CI_COMMIT_TIMESTAMP``, ``CI_PROJECT_URL``, ``CI_JOB_URL``, ``CI_MERGE_REQUEST_IID``) and
   Buildkite (``BUILDKITE_COMMIT``, ``BUILDKITE_BRANCH``, ``BUILDKITE_REPO``,
   ``BUILDKITE_BUILD_URL``, ``BUILDKITE_PULL_REQUEST``). The run's URL and the PR number come from
   there only.

Nothing here fails a session: a git that is missing, slow (each call has a timeout) or refuses the
directory leaves the fields it would have given unknown.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, TypedDict

from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

GIT_TIMEOUT_S = 5.0
_SHA = re.compile(r"^[0-9a-f]{7,64}$")
_FULL_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
# Fields --llmperf-revision may set, with the spellings it accepts.
MANUAL_KEYS = {"commit": "commit", "branch": "branch", "time": "commit_time", "commit_time": "commit_time",
               "repo": "repository", "repository": "repository", "run": "run_url", "run_url": "run_url",
               "pr": "pr"}
_EVENT_MAX_BYTES = 4 << 20


class ProvenanceDict(TypedDict, total=False):
    """:meth:`Provenance.to_dict`: only the known fields are written."""

    commit: str
    branch: str
    commit_time: str
    repository: str
    commit_url: str
    run_url: str
    pr: int
    ci: str
    dirty: bool
    source: str


class RevisionError(InputError):
    """A ``--llmperf-revision`` value that cannot be read; the message says what is wrong."""


@dataclass(frozen=True)
class Provenance:
    """What a session measured (its commit) and where (its CI run); None where unknown."""

    commit: str | None = None
    branch: str | None = None
    commit_time: str | None = None  # ISO 8601, with its offset
    repository: str | None = None  # the repository's web URL, without credentials
    commit_url: str | None = None
    run_url: str | None = None
    pr: int | None = None
    ci: str | None = None  # "github-actions" | "gitlab-ci" | "buildkite"
    dirty: bool | None = None  # tracked files differed from the commit (git only)
    source: str | None = None  # where the commit came from: "git", "manual", or the CI's name

    @property
    def known(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    @property
    def short(self) -> str | None:
        """The commit as people write it: 10 hex digits of a SHA, a revision name as given."""
        if self.commit is None:
            return None
        return self.commit[:10] if _FULL_SHA.match(self.commit) else self.commit

    @property
    def link(self) -> str | None:
        """Where a click on this session goes: the commit, else the CI run."""
        return self.commit_url or self.run_url

    def describe(self) -> str:
        """One line: ``commit 0123456789 (dirty) on main, 2026-11-01 10:00 UTC, PR #12``; ``unknown``."""
        parts = []
        if self.commit is not None:
            parts.append(f"commit {self.short}" + (" (dirty)" if self.dirty else ""))
        if self.branch:
            parts.append(f"on {self.branch}")
        when = format_time(self.commit_time)
        if when:
            parts.append(when)
        if self.pr is not None:
            parts.append(f"PR #{self.pr}")
        return " ".join(parts[:2]) + (", " + ", ".join(parts[2:]) if parts[2:] else "") if parts else "unknown commit"

    def to_dict(self) -> ProvenanceDict:
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in out.items() if v is not None}  # type: ignore[return-value]

    @classmethod
    def from_dict(cls, data: object) -> Provenance | None:
        """A provenance as saved; None for an absent one (older sessions). Read leniently: a field
        of the wrong type reads as unknown (display data must never stop a reader)."""
        if not isinstance(data, dict):
            return None
        values: dict[str, object] = {}
        for f in fields(cls):
            value = data.get(f.name)
            if f.name == "pr":
                value = _pr_number(value)
            elif f.name == "dirty":
                value = value if isinstance(value, bool) else None
            elif not isinstance(value, str) or not value:
                value = None
            values[f.name] = value
        return cls(**values)  # type: ignore[arg-type]


def format_time(iso: str | None) -> str | None:
    """``2026-11-01 10:00 UTC`` of an ISO time (the text as given when it does not parse)."""
    if not iso:
        return None
    try:
        when = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc)
    return f"{when:%Y-%m-%d %H:%M} UTC"


def _pr_number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.lstrip("#!").isdigit():
        return int(value.lstrip("#!")) or None
    return None


# ---------------------------------------------------------------------- by hand


def parse_revision(text: str | None) -> dict[str, object]:
    """The fields ``--llmperf-revision`` sets: a bare value is the commit, ``key=value`` pairs
    (comma-separated) name theirs. Raises :class:`RevisionError` saying what is wrong."""
    if text is None or not text.strip():
        return {}
    text = text.strip()
    if "=" not in text:
        return {"commit": _commit_text(text)}
    out: dict[str, object] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or key not in MANUAL_KEYS:
            raise RevisionError(f"{part!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(set(MANUAL_KEYS)))}")
        if not value:
            raise RevisionError(f"{key}= needs a value")
        name = MANUAL_KEYS[key]
        if name == "commit":
            out[name] = _commit_text(value)
        elif name == "commit_time":
            try:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise RevisionError(f"time={value!r} is not an ISO 8601 time (2026-11-01T10:00:00Z)") from None
            out[name] = value
        elif name in ("repository", "run_url"):
            if not re.match(r"^https?://[^\s]+$", value):
                raise RevisionError(f"{key}={value!r} must be an http(s) URL")
            out[name] = web_url(value) if name == "repository" else value
        elif name == "pr":
            number = _pr_number(value)
            if number is None:
                raise RevisionError(f"pr={value!r} must be a positive number")
            out[name] = number
        else:
            out[name] = value
    return out


def _commit_text(text: str) -> str:
    if re.search(r"\s", text):
        raise RevisionError(f"commit {text!r} must not contain spaces")
    return text.lower() if _SHA.match(text.lower()) else text


# ---------------------------------------------------------------------- git


def _git(cwd: Path, *args: str) -> str | None:
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def from_git(cwd: Path) -> Provenance:
    """What git says of the tree at ``cwd`` (all unknown when it is no repository, or git is missing)."""
    head = _git(cwd, "log", "-1", "--format=%H%n%cI")
    if not head:
        return Provenance()
    commit, _, when = head.partition("\n")
    if not _FULL_SHA.match(commit):
        return Provenance()
    branch = _git(cwd, "symbolic-ref", "--short", "-q", "HEAD") or None
    remote = _git(cwd, "remote", "get-url", "origin")
    status = _git(cwd, "status", "--porcelain", "--untracked-files=no")
    repository = web_url(remote) if remote else None
    return Provenance(commit=commit, branch=branch, commit_time=when or None, repository=repository,
                      dirty=None if status is None else bool(status), source="git")


def web_url(remote: str) -> str | None:
    """A git remote as the repository's web URL: ``git@github.com:org/repo.git`` and
    ``https://user:token@github.com/org/repo.git`` both give ``https://github.com/org/repo``;
    credentials never survive. None for a local path or anything else that has no web page."""
    remote = remote.strip()
    m = re.match(r"^(?:[\w.+-]+@)?([\w.-]+\.[a-z]{2,}):(?!/)(.+?)(?:\.git)?/?$", remote, re.IGNORECASE)
    if m and "://" not in remote:
        return f"https://{m.group(1)}/{m.group(2)}"
    m = re.match(r"^(?:https?|ssh|git)://(?:[^@/]*@)?([^/:]+)(?::\d+)?/(.+?)(?:\.git)?/?$", remote, re.IGNORECASE)
    if m:
        return f"https://{m.group(1)}/{m.group(2)}"
    return None


def commit_url(repository: str | None, commit: str | None, *, gitlab: bool = False) -> str | None:
    """The web page of ``commit`` in ``repository`` (GitLab's ``/-/commit/``, else ``/commit/``)."""
    if not repository or not commit or not _SHA.match(commit):
        return None
    gitlab = gitlab or "gitlab" in repository.split("/")[2].lower()
    return f"{repository.rstrip('/')}/{'-/' if gitlab else ''}commit/{commit}"


# ---------------------------------------------------------------------- CI


def from_ci(env: Mapping[str, str]) -> Provenance:
    """What the CI's environment says (GitHub Actions, GitLab CI, Buildkite); all unknown elsewhere."""
    if env.get("GITHUB_ACTIONS") == "true":
        return _github(env)
    if env.get("GITLAB_CI") == "true":
        project = env.get("CI_PROJECT_URL") or None
        return Provenance(
            commit=_sha(env.get("CI_COMMIT_SHA")),
            branch=env.get("CI_COMMIT_BRANCH") or env.get("CI_MERGE_REQUEST_SOURCE_BRANCH_NAME")
            or env.get("CI_COMMIT_REF_NAME") or None,
            commit_time=env.get("CI_COMMIT_TIMESTAMP") or None, repository=web_url(project) if project else None,
            run_url=env.get("CI_JOB_URL") or env.get("CI_PIPELINE_URL") or None,
            pr=_pr_number(env.get("CI_MERGE_REQUEST_IID")), ci="gitlab-ci", source="gitlab-ci")
    if env.get("BUILDKITE") == "true":
        repo = env.get("BUILDKITE_REPO")
        return Provenance(
            commit=_sha(env.get("BUILDKITE_COMMIT")), branch=env.get("BUILDKITE_BRANCH") or None,
            repository=web_url(repo) if repo else None, run_url=env.get("BUILDKITE_BUILD_URL") or None,
            pr=_pr_number(env.get("BUILDKITE_PULL_REQUEST")), ci="buildkite", source="buildkite")
    return Provenance()


def _sha(value: str | None) -> str | None:
    value = (value or "").strip().lower()
    return value if _SHA.match(value) else None


def _github(env: Mapping[str, str]) -> Provenance:
    server = (env.get("GITHUB_SERVER_URL") or "https://github.com").rstrip("/")
    repo = env.get("GITHUB_REPOSITORY") or ""
    repository = f"{server}/{repo}" if repo else None
    ref = env.get("GITHUB_REF") or ""
    pr = re.match(r"^refs/pull/(\d+)/", ref)
    run_url = None
    if repository and env.get("GITHUB_RUN_ID"):
        run_url = f"{repository}/actions/runs/{env['GITHUB_RUN_ID']}"
        attempt = env.get("GITHUB_RUN_ATTEMPT")
        if attempt and attempt != "1":
            run_url += f"/attempts/{attempt}"
    commit = _sha(env.get("GITHUB_SHA"))
    return Provenance(commit=commit, branch=env.get("GITHUB_HEAD_REF") or env.get("GITHUB_REF_NAME") or None,
                      commit_time=_github_commit_time(env, commit), repository=repository, run_url=run_url,
                      pr=int(pr.group(1)) if pr else None, ci="github-actions", source="github-actions")


def _github_commit_time(env: Mapping[str, str], commit: str | None) -> str | None:
    """A push event's head commit time, from the event payload (other events do not carry it)."""
    path = env.get("GITHUB_EVENT_PATH")
    if not path or commit is None:
        return None
    try:
        with open(path, "rb") as fh:
            event = json.loads(fh.read(_EVENT_MAX_BYTES))
    except (OSError, ValueError):
        return None
    head = event.get("head_commit") if isinstance(event, dict) else None
    if isinstance(head, dict) and head.get("id") == commit and isinstance(head.get("timestamp"), str):
        return str(head["timestamp"])
    return None


# ---------------------------------------------------------------------- together


def detect(cwd: Path, env: Mapping[str, str] | None = None, manual: Mapping[str, object] | None = None) -> Provenance:
    """The provenance of a session run in ``cwd`` (see the module docstring for the order);
    ``manual``: :func:`parse_revision` of ``--llmperf-revision``."""
    env = os.environ if env is None else env
    manual = dict(manual or {})
    ci = from_ci(env)
    if "commit" in manual:
        found = Provenance(source="manual")  # the suite's own git is not the tree under test
    else:
        found = from_git(cwd)
    if found.commit is None and "commit" not in manual:
        found = replace(ci, run_url=None, pr=None, ci=None)
    else:
        # A detached HEAD (how CI checks out) has no branch; the CI knows it, and where the
        # repository lives when there is no remote.
        same = ci.commit is not None and ci.commit == found.commit
        found = replace(found, branch=found.branch or (ci.branch if same or found.source == "git" else None),
                        repository=found.repository or (ci.repository if same else None),
                        commit_time=found.commit_time or (ci.commit_time if same else None))
    found = replace(found, run_url=ci.run_url, pr=ci.pr, ci=ci.ci)
    if manual:
        found = replace(found, **manual)  # type: ignore[arg-type]
        if "commit" in manual:
            found = replace(found, source="manual")
    return replace(found, commit_url=commit_url(found.repository, found.commit, gitlab=found.ci == "gitlab-ci"))


# ---------------------------------------------------------------------- ranges


@dataclass(frozen=True)
class CommitRange:
    """The commits a change between two sessions lies in: after ``good`` (the last session
    before it), up to and including ``bad`` (the first session after it)."""

    good: Provenance | None
    bad: Provenance | None

    @property
    def known(self) -> bool:
        return bool(self.good and self.good.commit and self.bad and self.bad.commit)

    def describe(self) -> str:
        """``0123456789..abcdef0123`` (git's range: after the first, up to the second), or what is known."""
        good = self.good.short if self.good is not None and self.good.commit else "?"
        bad = self.bad.short if self.bad is not None and self.bad.commit else "?"
        return f"{good}..{bad}"

    def bisect_command(self) -> str | None:
        """``git bisect start BAD GOOD`` for this range (None when either end is unknown)."""
        if not self.known:
            return None
        assert self.good is not None and self.bad is not None
        return f"git bisect start {self.bad.commit} {self.good.commit}"

    def compare_url(self) -> str | None:
        """The forge's page of the commits in the range (GitHub and GitLab: ``/compare/A...B``)."""
        if not self.known:
            return None
        assert self.good is not None and self.bad is not None
        repo = self.bad.repository or self.good.repository
        if not repo or self.good.repository not in (None, repo) or not _SHA.match(self.good.commit or "") \
                or not _SHA.match(self.bad.commit or ""):
            return None
        gitlab = "gitlab" in repo.split("/")[2].lower() or self.bad.ci == "gitlab-ci"
        return f"{repo.rstrip('/')}/{'-/' if gitlab else ''}compare/{self.good.commit}...{self.bad.commit}"


__all__ = ["GIT_TIMEOUT_S", "MANUAL_KEYS", "CommitRange", "Provenance", "ProvenanceDict", "RevisionError", "commit_url",
           "detect", "format_time", "from_ci", "from_git", "parse_revision", "web_url"]
