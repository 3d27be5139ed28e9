"""The session event log: ``events.jsonl``, content-addressed ``blobs/``, ``profiles/``.

A session is a directory. Its first line is a header (``schema: tilewright.session/1``);
every later line is one event with ``seq`` (1, 2, ...), ``t`` (seconds since the session
was created) and ``type``. Appends are one ``write`` of one whole line, flushed and
fsynced before ``append`` returns, so a kill -9 loses at most the line being written.

Loading is forgiving where it can be and loud where it must be: a torn last line is
skipped with a warning (nothing before it is lost) and cut off when the session is
reopened for appending, so the next event never glues onto the fragment; unknown event
types are kept as they are; a header from a newer schema is refused with a message
naming both versions; a missing blob is reported by its name; a binary or foreign line
(not UTF-8 JSON, not an event) is reported with its line number and skipped.

One writer at a time: ``SessionLog`` holds an exclusive ``flock`` on ``<dir>/.lock``
(which names the holder: pid and command) for as long as it is open, so a second
``auto --resume`` or a TUI on the same session is refused by name. A write that fails
(a full disk, a read-only directory) raises ``SessionWriteError``, which names the
cause; the log then refuses further events rather than leave a gap in ``seq``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tilewright.kernels.source.printable import printable_fields

if TYPE_CHECKING:
    from tilewright.sessions import events as ev

SCHEMA = "tilewright.session/1"
SCHEMA_NAME, _, _SCHEMA_VERSION = SCHEMA.rpartition("/")
SCHEMA_VERSION = int(_SCHEMA_VERSION)
EVENTS_FILE = "events.jsonl"


class SessionError(Exception):
    """A session that cannot be opened or written; the message says which and why."""


class NewerSchemaError(SessionError):
    pass


class SessionLockedError(SessionError):
    """Another process has the session open for writing."""


class SessionWriteError(SessionError):
    """The session could not be written (disk full, read-only, I/O error)."""


LOCK_FILE = ".lock"


def _write_failure(path: Path, exc: OSError, doing: str) -> SessionWriteError:
    why = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
           errno.EROFS: "the file system is read-only",
           errno.EACCES: "permission denied", errno.EPERM: "permission denied",
           errno.EIO: "an I/O error"}.get(exc.errno or 0, exc.strerror or str(exc))
    return SessionWriteError(f"{path}: cannot {doing}: {why} ({exc.strerror or exc}). "
                             "Free space or choose a writable --session-dir; events "
                             "written so far are intact and the session can be resumed.")


class MissingBlobError(SessionError):
    def __init__(self, session: Path, sha: str) -> None:
        self.sha = sha
        super().__init__(f"{session}: blob {sha} is missing from blobs/ "
                         f"(the session directory was copied incompletely?)")


def default_sessions_dir() -> Path:
    """``<user data dir>/sessions``; the data dir honours ``TILEWRIGHT_DATA_DIR`` like lessons do."""
    from tilewright.agents.memory import data_dir

    return data_dir() / "sessions"


def new_session_id(task_name: str, now: float | None = None) -> str:
    """Ids sort by creation time: ``20261129-153519-softmax-1a2b``."""
    stamp = datetime.fromtimestamp(now if now is not None else time.time(), UTC)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", task_name).strip("-")[:40] or "task"
    return f"{stamp:%Y%m%d-%H%M%S}-{slug}-{secrets.token_hex(2)}"


@dataclass
class LoadedSession:
    """What is on disk: the header, the events in order, and what had to be skipped."""

    path: Path
    header: dict[str, Any]
    # Typed by their ``type`` (sessions.events); a kind this version does not know is
    # kept as it was written, and the readers pass over it.
    events: list[ev.Event]
    warnings: list[str] = field(default_factory=list)
    torn_tail: bool = False  # the last line was incomplete (a kill during a write)
    valid_bytes: int = 0  # length of the file up to the end of the last complete line


def _check_header(path: Path, header: Any) -> dict[str, Any]:
    if not isinstance(header, dict) or not isinstance(header.get("schema"), str):
        raise SessionError(f"{path}: the first line is not a tilewright session header")
    name, _, version = header["schema"].rpartition("/")
    if name != SCHEMA_NAME or not version.isdigit():
        raise SessionError(f"{path}: unknown schema {header['schema']!r} (expected {SCHEMA})")
    if int(version) > SCHEMA_VERSION:
        raise NewerSchemaError(
            f"{path}: written by a newer tilewright (schema {header['schema']}; this version "
            f"reads up to {SCHEMA}). Upgrade tilewright to open it; the file is untouched.")
    return header


def load(path: Path | str) -> LoadedSession:
    """Read a session directory (or its events.jsonl) without changing it."""
    path = Path(path)
    if path.is_dir():
        path = path / EVENTS_FILE
    if not path.exists():
        raise SessionError(f"{path.parent}: not a session (no {EVENTS_FILE})")
    data = path.read_bytes()
    lines = data.split(b"\n")
    # A complete file ends with "\n", so the last element is b"". Anything else is a
    # line whose write was cut short.
    tail = lines.pop()
    warnings: list[str] = []
    torn = bool(tail)
    if torn:
        warnings.append(f"{path}: skipped a torn last line ({len(tail)} bytes, "
                        "an interrupted write); everything before it is intact")
    if not lines:
        raise SessionError(f"{path}: empty session file (no header)")
    try:
        header = json.loads(lines[0])
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise SessionError(f"{path}:1: the header is not valid JSON ({exc})") from exc
    header = _check_header(path.parent, header)
    events: list[ev.Event] = []
    for number, raw in enumerate(lines[1:], start=2):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
            if "\x00" in text:
                raise UnicodeDecodeError("utf-8", raw, 0, 1, "NUL byte")
            event = json.loads(text)
        except UnicodeDecodeError:
            warnings.append(f"{path}:{number}: skipped a binary line ({len(raw)} bytes, "
                            "not UTF-8 text): not written by tilewright")
            continue
        except ValueError as exc:
            warnings.append(f"{path}:{number}: skipped an unreadable line ({exc})")
            continue
        if not isinstance(event, dict) or not isinstance(event.get("type"), str) \
                or not isinstance(event.get("seq"), int):
            warnings.append(f"{path}:{number}: skipped a line that is not an event "
                            "(no integer seq and string type): not written by tilewright")
            continue
        # shown as text everywhere (replay, reports, the workbench): a forged or older
        # log's control characters never reach a terminal or a file
        events.append(cast("ev.Event", printable_fields(event)))
    valid = len(data) - len(tail)
    return LoadedSession(path.parent, header, events, warnings, torn, valid)


class SessionLog:
    """An open session directory that appends events and stores blobs."""

    def __init__(self, path: Path, header: dict[str, Any], next_seq: int,
                 created_epoch: float, lock_fd: int | None = None) -> None:
        self.path = path
        self.header = header
        self._next_seq = next_seq
        self._created = created_epoch
        self.write_error: SessionWriteError | None = None  # the first failed write
        self._lock_fd: int | None = lock(path) if lock_fd is None else lock_fd
        try:
            self._fd: int | None = os.open(path / EVENTS_FILE, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            unlock(self._lock_fd)
            self._lock_fd = None
            raise _write_failure(path, exc, "open the event log for appending") from None

    # -- opening ----------------------------------------------------------------------

    @classmethod
    def create(cls, sessions_dir: Path | str, *, task: dict[str, Any],
               backend: dict[str, Any] | None, agent: str, app_version: str,
               parent: dict[str, Any] | None = None,
               extra: dict[str, Any] | None = None) -> SessionLog:
        sessions_dir = Path(sessions_dir)
        now = time.time()
        session_id = new_session_id(task.get("name", "task"), now)
        path = sessions_dir / session_id
        try:
            (path / "blobs").mkdir(parents=True)
            (path / "profiles").mkdir()
        except OSError as exc:
            raise _write_failure(sessions_dir, exc, "create a session directory") from None
        header = {
            "schema": SCHEMA, "id": session_id,
            "created": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds"),
            "task": task, "backend": backend, "app_version": app_version, "agent": agent,
            "parent": parent, **(extra or {}),
        }
        line = (json.dumps(header, sort_keys=False) + "\n").encode()
        try:
            fd = os.open(path / EVENTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(path)
        except OSError as exc:
            raise _write_failure(path, exc, "write the session header") from None
        return cls(path, header, 1, now)

    @classmethod
    def open(cls, path: Path | str) -> tuple[SessionLog, LoadedSession]:
        """Reopen for appending (resume). A torn tail is cut off first, so the next
        event starts on a fresh line; the skipped bytes were never a whole event."""
        loaded = load(path)
        events_path = loaded.path / EVENTS_FILE
        # Lock before touching anything: a second writer must not truncate the first's tail.
        lock_fd = lock(loaded.path)
        try:
            loaded = load(path)  # re-read under the lock
            if loaded.torn_tail:
                with open(events_path, "r+b") as fh:
                    fh.truncate(loaded.valid_bytes)
                    fh.flush()
                    os.fsync(fh.fileno())
            (loaded.path / "blobs").mkdir(exist_ok=True)
            (loaded.path / "profiles").mkdir(exist_ok=True)
        except OSError as exc:
            unlock(lock_fd)
            raise _write_failure(loaded.path, exc, "reopen the session for writing") from None
        last_seq = max((e.get("seq", 0) for e in loaded.events
                        if isinstance(e.get("seq"), int)), default=0)
        created = _parse_created(loaded.header.get("created"))
        return cls(loaded.path, loaded.header, last_seq + 1, created, lock_fd), loaded

    # -- writing ----------------------------------------------------------------------

    @property
    def id(self) -> str:
        return str(self.header.get("id", self.path.name))

    def now(self) -> float:
        return round(time.time() - self._created, 3)

    def append(self, type_: ev.EventType, **fields: Any) -> ev.Event:
        """Write one event (one line, one write, fsynced) and return it."""
        if self._fd is None:
            raise SessionError(f"{self.path}: the session log is closed")
        if self.write_error is not None:
            raise self.write_error
        event = {"seq": self._next_seq, "t": self.now(), "type": type_, **fields}
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        try:
            written = os.write(self._fd, line)
            if written != len(line):  # a short write on a full disk
                raise OSError(errno.ENOSPC, f"short write ({written}/{len(line)} bytes)")
            os.fsync(self._fd)
        except OSError as exc:
            self.write_error = _write_failure(self.path, exc, f"append a {type_} event")
            raise self.write_error from None
        self._next_seq += 1
        return cast("ev.Event", event)

    def put_blob(self, data: bytes | str) -> str:
        """Store content under its sha256; writing the same content twice is free."""
        raw = data.encode() if isinstance(data, str) else data
        sha = hashlib.sha256(raw).hexdigest()
        target = self.path / "blobs" / sha
        if not target.exists():
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            try:
                with open(tmp, "wb") as fh:
                    fh.write(raw)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, target)  # atomic: a blob is whole or absent
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                self.write_error = self.write_error or _write_failure(
                    self.path, exc, "store a blob")
                raise self.write_error from None
        return sha

    def put_json_blob(self, obj: Any) -> str:
        return self.put_blob(json.dumps(obj, sort_keys=True))

    def get_blob(self, sha: str) -> bytes:
        return read_blob(self.path, sha)

    def profile_dir(self, run: str) -> Path:
        target = self.path / "profiles" / run
        target.mkdir(parents=True, exist_ok=True)
        return target

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            unlock(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> SessionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lock(path: Path) -> int:
    """Take the session's writer lock or raise ``SessionLockedError`` naming the holder.

    A raw ``flock``, not ``filelock``: the lock file holds its holder's pid and command,
    which a refused writer reads to say who has the session open; filelock manages the
    file itself (it may truncate or remove it), and the name would be lost."""
    lock_path = path / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise _write_failure(path, exc, "take the session's writer lock") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise SessionLockedError(
            f"{path}: the session is open for writing in another process ({holder}); "
            "close that one first, or open this session read-only with `tilewright "
            "replay`") from None
    owner = f"pid {os.getpid()}: {' '.join(os.path.basename(a) for a in sys.argv[:3])}"
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode(), 0)
    return fd


def unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):
        os.close(fd)  # closing releases the flock


def read_blob(session: Path | str, sha: str) -> bytes:
    session = Path(session)
    if not re.fullmatch(r"[0-9a-f]{64}", sha or ""):
        raise SessionError(f"{session}: {sha!r} is not a blob name (sha256 hex)")
    try:
        return (session / "blobs" / sha).read_bytes()
    except FileNotFoundError:
        raise MissingBlobError(session, sha) from None


def read_text_blob(session: Path | str, sha: str) -> str:
    return read_blob(session, sha).decode()


def read_json_blob(session: Path | str, sha: str) -> Any:
    return json.loads(read_blob(session, sha))


def _parse_created(value: Any) -> float:
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return time.time()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resolve(spec: str, sessions_dir: Path | str | None = None) -> Path:
    """A session directory given as a path, an id, or a unique id prefix."""
    direct = Path(spec).expanduser()
    if (direct / EVENTS_FILE).exists():
        return direct
    base = Path(sessions_dir) if sessions_dir else default_sessions_dir()
    if (base / spec / EVENTS_FILE).exists():
        return base / spec
    matches = sorted(p for p in base.glob(f"{spec}*") if (p / EVENTS_FILE).exists()) \
        if base.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        names = ", ".join(p.name for p in matches[:5])
        raise SessionError(f"{spec!r} matches several sessions in {base}: {names}")
    raise SessionError(f"no session {spec!r} (not a directory with {EVENTS_FILE}, "
                       f"nor an id in {base}); `tilewright sessions` lists them")


def list_session_dirs(sessions_dir: Path | str | None = None) -> list[Path]:
    base = Path(sessions_dir) if sessions_dir else default_sessions_dir()
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if (p / EVENTS_FILE).exists())
