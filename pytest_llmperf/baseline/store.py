"""A directory of saved runs (baselines): one gzip-JSON file per run, written atomically.

Layout::

    <root>/baselines/<name>/<YYYYmmddTHHMMSSffffffZ>-<8 hex>.json.gz

``/`` in a name (branch names such as ``feature/x``) is stored as ``%2F`` so each name is one
directory; ``%`` is not allowed in names, so the mapping is reversible. There is no index file:
listing the directory is the index, so nothing can point at a file that is gone.

Each file is ``{"schema_version", "kind", "name", "saved_at", "run"}`` (``schema_version`` is the
wrapper's, 1; the saved session in ``run`` has its own, see :mod:`pytest_llmperf.baseline.schema`),
strict JSON written by
:mod:`pytest_llmperf.jsonio` (NaN as ``null``, infinities as ``"inf"``/``"-inf"``; files saved by
earlier versions spell them ``NaN``/``Infinity`` and still load). A save writes a uniquely
named hidden temporary file in the same directory, fsyncs it and ``os.replace``\\ s it into place,
so readers never see half a file and concurrent savers never share a temporary name.

**Rebase markers.** ``llmperf baselines rebase NAME --reason TEXT`` starts a name's history anew
on purpose (a new GPU, driver or engine major version): it writes
``<root>/baselines/<name>/<YYYYmmddTHHMMSSffffffZ>-<8 hex>.rebase.json``, a plain JSON document
``{"schema_version", "kind", "name", "created_at", "reason"}``, the way a save writes a run (a
unique name, atomically). Nothing existing is deleted or rewritten: history reading
(:func:`pytest_llmperf.baseline.history.load_history`) counts only the sessions whose id (its UTC
timestamp) is newer than the newest marker's. A marker is not a run (its suffix is not
``.json.gz``, so listings, ``latest`` and older plugin versions never see it), pruning never
removes one, and only deleting every run of the name does.

Corrupt files are the user's data and are never deleted or overwritten by a session: reading
one raises :class:`BaselineCorrupt` naming the file, pruning leaves it in place (and does not
count it among the ``keep`` runs) with a warning, and only an explicit ``delete`` removes it.

A root that is a URL (``s3://bucket/prefix``, ``gs://...``, ``az://...``) is a shared store on an
object store, reached through fsspec (:class:`ObjectBaselineStore`; ``file://`` URLs are local
directories). Object stores have no atomic rename, but a single PUT is never seen half-written:
each saved run is one write-once object whose key is its unique run id, so two jobs saving under
one name at once both keep their run, and listing and pruning go by key.
"""

from __future__ import annotations

import functools
import gzip
import os
import re
import secrets
import shutil
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, TypedDict

from pytest_llmperf import jsonio
from pytest_llmperf.baseline.schema import SavedSession
from pytest_llmperf.defaults import DEFAULT_KEEP, DEFAULT_STORE
from pytest_llmperf.errors import BaselineCorrupt, BaselineMissing, BaselineTooNew, StoreError, StoreWarning

SCHEMA_VERSION = 1
DOC_KIND = "pytest-llmperf.baseline"
DEFAULT_ROOT = Path(DEFAULT_STORE)
SUFFIX = ".json.gz"
REBASE_SUFFIX = ".rebase.json"
REBASE_KIND = "pytest-llmperf.rebase"

_NAME_RE = re.compile(r"^[A-Za-z0-9._/-]+$")
_RUN_ID_RE = re.compile(r"^\d{8}T\d{12}Z-[0-9a-f]{8}$")
_STAMP_FORMAT = "%Y%m%dT%H%M%S%fZ"
_MAX_DIRNAME = 200
# A temporary file this old belongs to a save that crashed; younger ones may be in flight.
_STALE_TMP_S = 3600.0


@dataclass(frozen=True)
class ObjectPath:
    """Where a saved run lives in an object store: its full URL (``s3://bucket/.../id.json.gz``)."""

    url: str

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return self.url


StorePath = Path | ObjectPath


@dataclass(frozen=True)
class RunEntry:
    """A saved run as listed from the directory, without reading the file."""

    name: str
    run_id: str
    path: StorePath
    saved_at: datetime


@dataclass
class SavedRun:
    """A saved run read back from disk. ``run`` is the JSON object that was passed to ``save``, or
    a whole file read without the store's wrapper (a report), as it is in the file;
    :attr:`session` is the saved session it holds, parsed and checked once, on first use."""

    name: str
    run_id: str
    path: StorePath
    saved_at: datetime
    schema_version: int
    run: dict[str, object]

    @functools.cached_property
    def session(self) -> SavedSession:
        """The saved session (:class:`~pytest_llmperf.baseline.schema.SavedSession`), every field
        checked. Raises :class:`BaselineCorrupt` (or :class:`BaselineTooNew`) naming the file and
        the path of each field that is not what a saved session holds."""
        return SavedSession.parse(self.run, source=str(self.path))

    @property
    def fingerprint(self) -> Mapping[str, object] | None:
        """The run's own fingerprint, in documents that have one at the top (unchecked, for display)."""
        value = self.run.get("fingerprint")
        return value if isinstance(value, dict) else None


class JsonDocument(Protocol):
    """A typed document that writes its own JSON form (a :class:`SavedSession`)."""

    def to_dict(self) -> dict[str, Any]: ...


class RebaseMarkDict(TypedDict):
    """:meth:`RebaseMark.to_dict`."""

    id: str
    created_at: str
    reason: str
    path: str


@dataclass(frozen=True)
class RebaseMark:
    """A marker that starts a baseline's history anew: only sessions saved after it count.

    ``created_at`` comes from the marker's id (as a run's ``saved_at`` in listings does), so the
    cut is made on the same clock, and in the same order, as the runs are listed."""

    name: str
    mark_id: str
    created_at: datetime
    reason: str
    path: StorePath

    def keeps(self, run_id: str) -> bool:
        """Whether the session with this run id was saved after the marker (ids start with their
        fixed-width UTC timestamp, so string order is time order)."""
        return run_id > self.mark_id

    def describe(self) -> str:
        return f"rebased on {self.created_at:%Y-%m-%d %H:%M} UTC: {self.reason}"

    def to_dict(self) -> RebaseMarkDict:
        return {"id": self.mark_id, "created_at": self.created_at.isoformat(), "reason": self.reason,
                "path": str(self.path)}


def validate_name(name: Any) -> str:
    """Return ``name`` if it is a valid baseline name, else raise :class:`StoreError` saying why."""
    if not isinstance(name, str) or not name:
        raise StoreError(f"baseline name must be a non-empty string, got {name!r}")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise StoreError(f"baseline name {name!r} must not be an absolute path")
    if not _NAME_RE.match(name):
        bad = sorted({c for c in name if not re.match(r"[A-Za-z0-9._/-]", c)})
        raise StoreError(
            f"baseline name {name!r} contains {''.join(bad)!r}; use letters, digits, '.', '_', '-' and '/'"
        )
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise StoreError(
            f"baseline name {name!r}: each '/'-separated part must be non-empty and not '.' or '..'"
        )
    if len(_dirname(name)) > _MAX_DIRNAME:
        raise StoreError(f"baseline name {name!r} is too long (at most about {_MAX_DIRNAME} characters)")
    return name


def _dirname(name: str) -> str:
    return name.replace("/", "%2F")


def _name_from_dirname(dirname: str) -> str:
    return dirname.replace("%2F", "/")


def _parse_run_id(run_id: str) -> datetime | None:
    if not _RUN_ID_RE.match(run_id):
        return None
    try:
        return datetime.strptime(run_id.split("-")[0], _STAMP_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def is_url(root: str | Path) -> bool:
    """Whether a store root is a URL (``s3://...``) rather than a local directory."""
    return isinstance(root, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", root) is not None


def _local_root(root: str | Path) -> Path:
    if isinstance(root, str) and root.startswith("file://"):
        return Path(root[len("file://"):] or "/")
    return Path(root)


def _check_keep(keep: Any) -> None:
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise StoreError(f"keep must be a positive integer or None, got {keep!r}")


def _new_run_id(now: datetime) -> str:
    return f"{now.strftime(_STAMP_FORMAT)}-{secrets.token_hex(4)}"


def _check_reason(name: str, reason: Any) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise StoreError(f"cannot rebase baseline {name!r}: give the reason (a new GPU, driver, engine version...)")
    return " ".join(reason.split())  # one line: it is shown in one terminal line


def _rebase_document(name: str, reason: str, now: datetime) -> bytes:
    doc = {"schema_version": SCHEMA_VERSION, "kind": REBASE_KIND, "name": name, "created_at": now.isoformat(),
           "reason": reason}
    return (jsonio.dumps(doc, indent=2) + "\n").encode()


def _parse_mark(name: str, mark_id: str, path: StorePath, read: Callable[[], bytes]) -> RebaseMark | None:
    """The marker at ``path`` (None when it is gone). An unreadable one still cuts the history
    (its id says when), with a warning and a reason that says so."""
    created = _parse_run_id(mark_id)
    assert created is not None  # listed only when the id parses
    problem: str | None = None
    try:
        doc = jsonio.loads(read())
        reason = doc["reason"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    else:
        if not isinstance(reason, str):
            problem = f"'reason' must be a string, got {type(reason).__name__}"
    if problem is not None:
        warnings.warn(f"{path}: unreadable rebase marker ({problem}); the history still starts after it",
                      StoreWarning, stacklevel=3)
        reason = "(reason unreadable)"
    return RebaseMark(name, mark_id, created, reason, path)


def _document(name: str, run: Mapping[str, object] | JsonDocument, now: datetime) -> bytes:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kind": DOC_KIND,
        "name": name,
        "saved_at": now.isoformat(),
        "run": dict(run) if isinstance(run, Mapping) else run.to_dict(),
    }
    try:
        return jsonio.dumps(doc, compact=True).encode()
    except (TypeError, ValueError) as exc:
        raise StoreError(f"cannot save baseline {name!r}: run is not JSON-serializable: {exc}") from None


class BaselineStore:
    """Saved runs under ``root`` (default ``.llmperf/``), keeping the newest ``keep`` per name
    (``keep=None`` keeps all). A URL root (``s3://bucket/prefix``) gives an
    :class:`ObjectBaselineStore`; ``file://`` URLs are local directories."""

    root: Any

    def __new__(cls, root: str | Path = DEFAULT_ROOT, keep: int | None = DEFAULT_KEEP) -> BaselineStore:
        if cls is BaselineStore and is_url(root) and not str(root).startswith("file://"):
            return super().__new__(ObjectBaselineStore)
        return super().__new__(cls)

    def __init__(self, root: str | Path = DEFAULT_ROOT, keep: int | None = DEFAULT_KEEP):
        _check_keep(keep)
        self.root = _local_root(root)
        self.keep = keep

    @property
    def baselines_dir(self) -> Path:
        return self.root / "baselines"

    def _name_dir(self, name: str) -> Path:
        return self.baselines_dir / _dirname(validate_name(name))

    # ------------------------------------------------------------------ writing

    def check_writable(self) -> None:
        """Raise :class:`StoreError` now (before any load is generated) if saving would fail."""
        target = self.baselines_dir
        try:
            target.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".probe-", suffix=".tmp", dir=target)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise StoreError(
                f"baseline store {self.root} is not writable ({exc.strerror or exc}: {exc.filename or target})",
                remedy="choose a writable directory with {flag} DIR", option="store",
            ) from None

    def _make_name_dir(self, name: str) -> Path:
        directory = self._name_dir(name)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create baseline directory {directory}: {exc.strerror or exc}",
                remedy="choose a writable directory with {flag} DIR", option="store",
            ) from None
        return directory

    def save(self, name: str, run: Mapping[str, object] | JsonDocument) -> Path:
        """Write ``run`` (a :class:`~pytest_llmperf.baseline.schema.SavedSession`, or any JSON
        object) as the newest saved run of ``name``; return the file's path."""
        validate_name(name)
        _check_run(name, run)
        directory = self._make_name_dir(name)
        now = datetime.now(timezone.utc)
        run_id = _new_run_id(now)
        final = directory / f"{run_id}{SUFFIX}"
        payload = gzip.compress(_document(name, run, now), compresslevel=6, mtime=0)
        self._write_atomic(directory, final, payload, "baseline")
        self._prune(name, protect=final)
        return final

    @staticmethod
    def _write_atomic(directory: Path, final: Path, payload: bytes, what: str) -> None:
        """Write ``payload`` as ``final``: a uniquely named hidden temporary file in the same
        directory, fsynced, then renamed into place (readers never see half a file)."""
        # mkstemp gives a name no other process can get, opened exclusively; the leading dot
        # hides it from listings until the rename.
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=directory)
        except OSError as exc:  # e.g. the directory turned read-only since check_writable()
            raise StoreError(
                f"cannot write {what} in {directory}: {exc.strerror or exc}",
                remedy="choose a writable directory with {flag} DIR", option="store",
            ) from None
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as raw:
                raw.write(payload)
                raw.flush()
                # mkstemp creates 0600; a baseline is an ordinary file others (CI artifacts,
                # teammates) read, so give it what the umask gives any new file.
                os.fchmod(raw.fileno(), 0o666 & ~_current_umask())
                os.fsync(raw.fileno())
            os.replace(tmp, final)
        except BaseException as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise StoreError(f"cannot write {what} {final}: {exc.strerror or exc}") from exc
            raise
        _fsync_dir(directory)

    def rebase(self, name: str, reason: str) -> RebaseMark:
        """Start ``name``'s history anew: write a rebase marker (see the module docstring); the
        sessions saved before it stay in the store but no longer count as history. ``name``
        need not have any session yet."""
        validate_name(name)
        reason = _check_reason(name, reason)
        directory = self._make_name_dir(name)
        now = datetime.now(timezone.utc)
        mark_id = _new_run_id(now)
        final = directory / f"{mark_id}{REBASE_SUFFIX}"
        self._write_atomic(directory, final, _rebase_document(name, reason, now), "rebase marker")
        return RebaseMark(name, mark_id, _parse_run_id(mark_id) or now, reason, final)

    def _mark_paths(self, name: str) -> list[tuple[str, StorePath]]:
        """(marker id, path) of ``name``'s rebase markers, newest first, without reading them."""
        directory = self._name_dir(name)
        if not directory.is_dir():
            return []
        found: list[tuple[str, StorePath]] = []
        for path in directory.glob(f"*{REBASE_SUFFIX}"):
            mark_id = path.name[: -len(REBASE_SUFFIX)]
            if _parse_run_id(mark_id) is not None:
                found.append((mark_id, path))
        return sorted(found, key=lambda item: item[0], reverse=True)

    def _read_bytes(self, path: StorePath) -> bytes:
        return Path(str(path)).read_bytes()

    def rebases(self, name: str) -> list[RebaseMark]:
        """``name``'s rebase markers, newest first."""
        marks = (_parse_mark(name, mark_id, path, functools.partial(self._read_bytes, path))
                 for mark_id, path in self._mark_paths(name))
        return [m for m in marks if m is not None]

    def latest_rebase(self, name: str) -> RebaseMark | None:
        """The newest rebase marker of ``name`` (None when its history was never rebased)."""
        for mark_id, path in self._mark_paths(name):
            mark = _parse_mark(name, mark_id, path, functools.partial(self._read_bytes, path))
            if mark is not None:
                return mark
        return None

    def _prune(self, name: str, protect: StorePath) -> None:
        if self.keep is None:
            return
        # The file just written always survives and counts first, whatever its timestamp says
        # (another machine's clock may run ahead).
        kept = 1
        for entry in self.runs(name):  # newest first
            if entry.path == protect:
                continue
            try:
                self.load(entry.path)
            except FileNotFoundError:
                continue  # a concurrent save pruned it first
            except (BaselineCorrupt, BaselineTooNew) as exc:
                warnings.warn(
                    f"{exc} (left in place; remove it with: llmperf baselines delete {name} --run {entry.run_id})",
                    StoreWarning,
                    stacklevel=3,
                )
                continue
            if kept < self.keep:
                kept += 1
                continue
            self._remove(entry.path)
        self._remove_stale_temps(self._name_dir(name))

    def _remove(self, path: StorePath) -> None:
        try:
            Path(str(path)).unlink()
        except FileNotFoundError:
            pass

    @staticmethod
    def _remove_stale_temps(directory: Path) -> None:
        cutoff = time.time() - _STALE_TMP_S
        for tmp in directory.glob(".*.tmp"):
            try:
                if tmp.stat().st_mtime < cutoff:
                    tmp.unlink()
            except OSError:
                pass

    def delete(self, name: str, run_id: str | None = None) -> int:
        """Delete one run (``run_id``) or every run of ``name``; return how many files went."""
        directory = self._name_dir(name)
        if run_id is None:
            entries = self.runs(name)
            if not entries:
                raise self.missing(name)
            shutil.rmtree(directory)
            return len(entries)
        path = directory / f"{run_id}{SUFFIX}"
        if not isinstance(run_id, str) or not _RUN_ID_RE.match(run_id) or not path.is_file():
            known = ", ".join(e.run_id for e in self.runs(name)[:5]) or "none"
            raise BaselineMissing(f"baseline {name!r} has no run {run_id!r} in {directory} (newest: {known})")
        path.unlink()
        if not self.runs(name) and not self._mark_paths(name):
            shutil.rmtree(directory, ignore_errors=True)
        return 1

    # ------------------------------------------------------------------ reading

    def names(self) -> list[str]:
        """Names that have at least one saved file, sorted."""
        if not self.baselines_dir.is_dir():
            return []
        out = []
        for child in self.baselines_dir.iterdir():
            if not child.is_dir():
                continue
            name = _name_from_dirname(child.name)
            try:
                validate_name(name)
            except StoreError:
                continue
            if self.runs(name):
                out.append(name)
        return sorted(out)

    def runs(self, name: str) -> list[RunEntry]:
        """The saved files of ``name``, newest first, listed without reading them."""
        directory = self._name_dir(name)
        if not directory.is_dir():
            return []
        entries = []
        for path in directory.glob(f"*{SUFFIX}"):
            run_id = path.name[: -len(SUFFIX)]
            saved_at = _parse_run_id(run_id)
            if saved_at is not None:
                entries.append(RunEntry(name, run_id, path, saved_at))
        # The id starts with the UTC timestamp, so name order is time order.
        return sorted(entries, key=lambda e: e.run_id, reverse=True)

    def latest(self, name: str) -> SavedRun:
        """The newest saved run. A corrupt newest file raises rather than silently falling back
        to an older baseline."""
        # A concurrent save (keep=1) or delete can remove the listed newest file before it is
        # read: list again rather than fail on a file that is legitimately gone.
        for _ in range(3):
            entries = self.runs(name)
            if not entries:
                raise self.missing(name)
            try:
                return self.load(entries[0].path)
            except FileNotFoundError:
                continue
        raise BaselineMissing(
            f"baseline {name!r}: the newest file in {self._name_dir(name)} kept disappearing while being read "
            "(another process is saving or deleting); try again"
        )

    def get(self, name: str, run_id: str) -> SavedRun:
        """One saved run by id."""
        for entry in self.runs(name):
            if entry.run_id == run_id:
                try:
                    return self.load(entry.path)
                except FileNotFoundError:
                    break  # deleted or pruned since the listing: it is missing now
        known = ", ".join(e.run_id for e in self.runs(name)[:5]) or "none"
        raise BaselineMissing(f"baseline {name!r} has no run {run_id!r} (newest: {known})")

    def load(self, path: str | StorePath) -> SavedRun:
        """Read a saved run, or any result file (gzip or plain JSON) the user points at."""
        return load_run(str(path) if isinstance(path, ObjectPath) else path)

    def missing(self, name: str) -> BaselineMissing:
        return BaselineMissing(f"no baseline named {name!r} in {self.baselines_dir}",
                               remedy=f"create one by running with {{flag}} {name}", option="save")


# fsspec protocol -> the pytest-llmperf extra that installs its backend.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
           "adl": "azure"}
# Extra fsspec storage options for every store URL, as a JSON object (e.g. {"anon": true}).
STORE_OPTIONS_ENV = "LLMPERF_STORE_OPTIONS"


class ObjectBaselineStore(BaselineStore):
    """Saved runs in an object store (S3, GCS, Azure, anything fsspec reaches) under the URL
    ``root``, with the local store's layout: ``<root>/baselines/<name>/<run id>.json.gz``.

    Each save is one PUT of a new key (the run id: UTC timestamp plus random hex), never an
    overwrite, so concurrent savers cannot lose each other's runs; listings always go to the
    server (no cached directory listings). Credentials come from the cloud SDK's usual
    environment (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_*``); a
    non-AWS S3 endpoint (MinIO, Ceph...) is set with ``AWS_ENDPOINT_URL``. Messages name the
    store's URL and the failure, never a credential.
    """

    def __init__(self, root: str | Path = DEFAULT_ROOT, keep: int | None = DEFAULT_KEEP):
        _check_keep(keep)
        self.root = str(root).rstrip("/")
        self.keep = keep
        self.protocol = self.root.split("://", 1)[0].lower()
        self._fs: Any = None
        self._base = ""

    # ------------------------------------------------------------------ plumbing

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs, self._base = self._connect()
        return self._fs

    def _connect(self) -> tuple[Any, str]:
        extra = _EXTRAS.get(self.protocol)
        install = f"pip install 'pytest-llmperf[{extra}]'" if extra else "pip install fsspec and the backend for it"
        try:
            import fsspec  # noqa: PLC0415 - optional, and only shared stores need it
        except ImportError:
            raise StoreError(f"baseline store {self.root}: a {self.protocol}:// store needs fsspec; {install}") from None
        options: dict[str, object] = {"skip_instance_cache": True}
        raw = os.environ.get(STORE_OPTIONS_ENV)
        if raw:
            try:
                more = jsonio.loads(raw)
            except jsonio.JSONDecodeError as exc:
                raise StoreError(f"{STORE_OPTIONS_ENV} must be a JSON object of fsspec storage options: {exc}") from None
            if not isinstance(more, dict):
                raise StoreError(f"{STORE_OPTIONS_ENV} must be a JSON object of fsspec storage options")
            options.update(more)
        try:
            fs, base = fsspec.core.url_to_fs(self.root, **options)
        except ImportError:
            raise StoreError(f"baseline store {self.root}: the {self.protocol}:// backend is not installed; {install}") from None
        except ValueError as exc:  # unknown protocol
            raise StoreError(f"baseline store {self.root}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a backend's own setup error; its text names no secret
            raise self._failed("connect to", exc) from None
        return fs, str(base).rstrip("/")

    @staticmethod
    def _reason(exc: BaseException) -> str:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return f"access denied: {text}" if isinstance(exc, PermissionError) else text

    def _failed(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"baseline store {self.root}: cannot {what}: {self._reason(exc)}")

    def _key(self, *parts: str) -> str:
        _ = self.fs  # connects, setting _base
        return "/".join([self._base, "baselines", *parts])

    def _url(self, key: str) -> ObjectPath:
        return ObjectPath(f"{self.protocol}://{key}")

    @property
    def baselines_dir(self) -> Any:
        return f"{self.root}/baselines"

    def _name_dir(self, name: str) -> Any:
        return f"{self.baselines_dir}/{_dirname(validate_name(name))}"

    def _ls(self, key: str) -> list[dict[str, object]]:
        try:
            self.fs.invalidate_cache(key)
            return list(self.fs.ls(key, detail=True, refresh=True))
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001 - network, permissions, no such bucket
            raise self._failed(f"list {self._url(key)}", exc) from None

    # ------------------------------------------------------------------ writing

    def check_writable(self) -> None:
        key = self._key(f".probe-{secrets.token_hex(8)}")
        try:
            self.fs.pipe_file(key, b"")
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"baseline store {self.root} is not writable ({self._reason(exc)}); "
                             "choose a store this job may write to") from None
        try:
            self.fs.rm_file(key)
        except Exception:  # noqa: BLE001, S110 - a probe left behind is harmless; the write worked
            pass

    def save(self, name: str, run: Mapping[str, object] | JsonDocument) -> Any:
        validate_name(name)
        _check_run(name, run)
        now = datetime.now(timezone.utc)
        run_id = _new_run_id(now)
        payload = gzip.compress(_document(name, run, now), compresslevel=6, mtime=0)
        key = self._key(_dirname(name), f"{run_id}{SUFFIX}")
        try:
            self.fs.pipe_file(key, payload)  # one PUT: readers see all of it or nothing
        except Exception as exc:  # noqa: BLE001
            raise self._failed(f"write baseline {self._url(key)}", exc) from None
        final = self._url(key)
        self._prune(name, protect=final)
        return final

    def rebase(self, name: str, reason: str) -> RebaseMark:
        validate_name(name)
        reason = _check_reason(name, reason)
        now = datetime.now(timezone.utc)
        mark_id = _new_run_id(now)
        key = self._key(_dirname(name), f"{mark_id}{REBASE_SUFFIX}")
        try:
            self.fs.pipe_file(key, _rebase_document(name, reason, now))  # one PUT of a new key
        except Exception as exc:  # noqa: BLE001
            raise self._failed(f"write rebase marker {self._url(key)}", exc) from None
        return RebaseMark(name, mark_id, _parse_run_id(mark_id) or now, reason, self._url(key))

    def _mark_paths(self, name: str) -> list[tuple[str, StorePath]]:
        found: list[tuple[str, StorePath]] = []
        for item in self._ls(self._key(_dirname(validate_name(name)))):
            base = str(item["name"]).rsplit("/", 1)[-1]
            if item.get("type") == "directory" or not base.endswith(REBASE_SUFFIX):
                continue
            mark_id = base[: -len(REBASE_SUFFIX)]
            if _parse_run_id(mark_id) is not None:
                found.append((mark_id, self._url(str(item["name"]))))
        return sorted(found, key=lambda item: item[0], reverse=True)

    def _read_bytes(self, path: StorePath) -> bytes:
        try:
            return bytes(self.fs.cat_file(str(path).split("://", 1)[-1]))
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._failed(f"read {path}", exc) from None

    def _remove(self, path: StorePath) -> None:
        key = str(path).split("://", 1)[-1]
        try:
            self.fs.rm_file(key)
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001
            raise self._failed(f"delete {path}", exc) from None

    @staticmethod
    def _remove_stale_temps(directory: Any) -> None:
        return  # object stores have no temporary files

    def delete(self, name: str, run_id: str | None = None) -> int:
        entries = self.runs(name)
        if run_id is None:
            if not entries:
                raise self.missing(name)
            for entry in entries:
                self._remove(entry.path)
            for _, mark in self._mark_paths(name):  # the name is gone, as a local rmtree does
                self._remove(mark)
            return len(entries)
        match = [e for e in entries if e.run_id == run_id]
        if not match:
            known = ", ".join(e.run_id for e in entries[:5]) or "none"
            raise BaselineMissing(f"baseline {name!r} has no run {run_id!r} in {self._name_dir(name)} (newest: {known})")
        self._remove(match[0].path)
        return 1

    # ------------------------------------------------------------------ reading

    def names(self) -> list[str]:
        out = []
        for item in self._ls(self._key()):
            if item.get("type") != "directory":
                continue
            name = _name_from_dirname(str(item["name"]).rstrip("/").rsplit("/", 1)[-1])
            try:
                validate_name(name)
            except StoreError:
                continue
            if self.runs(name):
                out.append(name)
        return sorted(out)

    def runs(self, name: str) -> list[RunEntry]:
        entries = []
        for item in self._ls(self._key(_dirname(validate_name(name)))):
            base = str(item["name"]).rsplit("/", 1)[-1]
            if item.get("type") == "directory" or not base.endswith(SUFFIX):
                continue
            run_id = base[: -len(SUFFIX)]
            saved_at = _parse_run_id(run_id)
            if saved_at is not None:
                entries.append(RunEntry(name, run_id, self._url(str(item["name"])), saved_at))
        return sorted(entries, key=lambda e: e.run_id, reverse=True)

    def load(self, path: str | StorePath) -> SavedRun:
        if isinstance(path, Path) or (isinstance(path, str) and not is_url(path)):
            return load_run(path)  # a local file the user points at
        url = ObjectPath(str(path))
        try:
            raw = self.fs.cat_file(url.url.split("://", 1)[-1])
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._failed(f"read {url}", exc) from None
        stamp = _parse_run_id(url.name[: -len(SUFFIX)]) if url.name.endswith(SUFFIX) else None
        return parse_run(raw, url, lambda: stamp or datetime.now(timezone.utc))


def load_run(path: str | Path) -> SavedRun:
    """Read one file. A store document is checked strictly; a plain JSON object without the
    store's wrapper (e.g. a result file) is taken whole as the run.

    Raises ``FileNotFoundError`` when the file is gone (callers racing a prune tolerate that),
    :class:`BaselineCorrupt` / :class:`BaselineTooNew` naming the file otherwise.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StoreError(f"{path}: cannot read baseline file: {exc.strerror or exc}") from None
    return parse_run(raw, path, lambda: datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc))


def parse_run(raw: bytes, path: StorePath, mtime_of: Callable[[], datetime]) -> SavedRun:
    """A saved run from the bytes of its file (see :func:`load_run`); ``mtime_of`` gives the
    time to use when the document has none."""
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise BaselineCorrupt(f"{path}: corrupt baseline file: gzip data is truncated or damaged ({exc})") from None
    try:
        doc = jsonio.loads(raw)
    except (UnicodeDecodeError, jsonio.JSONDecodeError) as exc:
        raise BaselineCorrupt(f"{path}: corrupt baseline file: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise BaselineCorrupt(f"{path}: corrupt baseline file: expected a JSON object, got {type(doc).__name__}")
    mtime = mtime_of()
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name.rsplit(".", 1)[0] or path.name
    if not ("run" in doc and "schema_version" in doc):
        # Not a store document (e.g. a JSON report): its own schema_version, if any, is not ours.
        return SavedRun(name=stem, run_id=stem, path=path, saved_at=mtime, schema_version=0, run=doc)
    version = doc["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise BaselineCorrupt(f"{path}: corrupt baseline file: schema_version must be a positive integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise BaselineTooNew(
            f"{path}: baseline schema version {version} is newer than this pytest-llmperf supports "
            f"(up to {SCHEMA_VERSION}); upgrade pytest-llmperf to read it"
        )
    problems = []
    if not isinstance(doc["run"], dict):
        problems.append(f"'run' must be an object, got {type(doc['run']).__name__}")
    name = doc.get("name", _parent_name(path))
    if not isinstance(name, str):
        problems.append(f"'name' must be a string, got {name!r}")
    saved_at = mtime
    if "saved_at" in doc:
        try:
            saved_at = datetime.fromisoformat(doc["saved_at"])
        except (TypeError, ValueError):
            problems.append(f"'saved_at' must be an ISO timestamp, got {doc['saved_at']!r}")
    if problems:
        raise BaselineCorrupt(f"{path}: corrupt baseline file: {'; '.join(problems)}")
    return SavedRun(name=name, run_id=stem, path=path, saved_at=saved_at, schema_version=version, run=doc["run"])


def _check_run(name: str, run: object) -> None:
    if not isinstance(run, (Mapping, SavedSession)):
        raise StoreError(f"cannot save baseline {name!r}: run must be a dict, got {type(run).__name__}")


def _parent_name(path: StorePath) -> str:
    if isinstance(path, ObjectPath):
        return _name_from_dirname(path.url.rsplit("/", 2)[-2])
    return path.parent.name


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable on POSIX; directories cannot be opened this way on Windows.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
