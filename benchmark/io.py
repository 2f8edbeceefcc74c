"""Atomic file output: a reader never sees a half-written file or directory."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmark.errors import CorruptStateError, DapbenchError, WriteError


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and ``os.replace``."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    atomic_write_bytes(path, write)


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,199}")
"""What a name that becomes part of a file path may look like: no separators, no leading dot (so no ``..``)."""


def safe_name(value: object, what: str) -> str:
    """``value`` if it is a safe path component (``SAFE_NAME``), else a named error before anything is written."""
    text = str(value)
    if not SAFE_NAME.fullmatch(text) or ".." in text:
        raise DapbenchError(
            f"{what} {text!r} cannot name a file: use letters, digits, '_', '-', '.', '=' only, no path separators",
            f"rename the {what} (a record read from disk with such a name is not from dapbench: remove it)",
        )
    return text


def path_inside(root: str | Path, *parts: str) -> Path:
    """``root/parts...`` after checking each part with :func:`safe_name`, that no existing component below ``root``
    is a symbolic link, and that the result stays inside ``root``."""
    base = Path(root).resolve()
    walked = base
    for part in parts:
        walked = walked / safe_name(part, "path component")
        if walked.is_symlink():
            raise DapbenchError(
                f"{walked} is a symbolic link: dapbench writes and reads its files only inside {base}",
                "replace the link by a folder of its own (or remove it), or pass another --output-dir",
            )
    path = walked.resolve()
    if base != path and base not in path.parents:
        raise DapbenchError(f"{path} is outside {base}", "use plain names for profiles, methods and sequences")
    return path


def unlinked_path(root: str | Path, *parts: str) -> Path:
    """``root/parts...`` after checking that no existing component below ``root`` is a symbolic link: dapbench
    writes and deletes only inside folders of its own, never through a link to somewhere else."""
    path = Path(root)
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise DapbenchError(
                f"{path} is a symbolic link: dapbench writes and deletes files only inside its own output folder",
                f"replace the link by a folder (or remove it), or pass another --output-dir than {root}",
            )
    return path


def _file_mode() -> int:
    """0666 less the process umask: the mode ``open()`` would give a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=json_default) + "\n")


def readable_json(data: Any) -> str:
    """``data`` as JSON a reviewer reads in a diff: objects one key a line, indented by two, and every list of plain
    values on one line (a chunk list or loss log is one line, not hundreds); the values exactly as ``json.dumps``."""
    plain = json.loads(json.dumps(data, default=json_default, allow_nan=False))

    def dump(value: Any, depth: int) -> str:
        pad, inner = "  " * depth, "  " * (depth + 1)
        if isinstance(value, dict) and value:
            items = [f"{inner}{json.dumps(key)}: {dump(item, depth + 1)}" for key, item in value.items()]
            return "{\n" + ",\n".join(items) + f"\n{pad}}}"
        if isinstance(value, list) and any(isinstance(item, dict | list) for item in value):
            return "[\n" + ",\n".join(inner + dump(item, depth + 1) for item in value) + f"\n{pad}]"
        return json.dumps(value)

    return dump(plain, 0) + "\n"


def atomic_write_bytes(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` (e.g. ``savefig``, ``torch.save``) then move the result into place.

    The temporary file is named after this host and process, so concurrent writers never share one and a
    file left by a killed process of this host is recognised and removed. A failed write (disk full, no
    permission) leaves the previous file as it was and raises :class:`WriteError`.
    """
    path = Path(path)
    _make_parent(path)
    _remove_stale_temporaries(path)
    tmp = path.with_name(f".{path.name}.{_host()}-{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        os.chmod(tmp, _file_mode())  # an ordinary, shareable file, whatever mode the writer gave it
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):  # a read-only folder refuses this too; the write error is what matters
            tmp.unlink(missing_ok=True)
        if write_failure(exc):
            raise WriteError.of(path, exc) from exc
        raise


def write_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says a file could not be written (disk full, file too large, no permission): an ``OSError``, or
    what safetensors and ``torch.save`` raise for one (they do not raise ``OSError``)."""
    if isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":
        return True
    chain = [exc, exc.__context__] if exc.__context__ is not None else [exc]
    return any(isinstance(e, RuntimeError) and any(w in str(e) for w in TORCH_WRITE_FAILURES) for e in chain)


TORCH_WRITE_FAILURES = ("PytorchStreamWriter", "inline_container", "iostream error", "write failed", "No space left")
"""Words of the ``RuntimeError`` s ``torch.save``'s C++ writer raises when the file system refuses a write."""


def _host() -> str:
    """This host's part of a temporary file's name (``.<file>.<host>-<pid>.tmp``)."""
    return socket.gethostname().replace(".", "_")


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError.of(path, exc) from exc


def _remove_stale_temporaries(path: Path) -> None:
    """Delete temporary files of ``path`` left by killed processes of this host (others may be running)."""
    host = _host()
    for tmp in path.parent.glob(f".{path.name}.{host}-*.tmp*"):
        pid = tmp.name[len(f".{path.name}.{host}-") :].split(".", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


OWNED_MARKER = ".dapbench-owned"
"""The file dapbench writes first into every folder it builds whole (:func:`atomic_directory`, scratch folders): the
proof that replacing or removing that folder later destroys nothing dapbench did not write."""


def owned_folder(path: str | Path) -> bool:
    """Whether ``path`` is a real folder (no symbolic link) that dapbench built: it holds :data:`OWNED_MARKER`, or a
    checkpoint manifest (checkpoints written before the marker existed)."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and ((path / OWNED_MARKER).is_file() or (path / MANIFEST).is_file())


def require_replaceable(path: str | Path, what: str = "output folder") -> None:
    """Refuse, before any work, a ``path`` that exists and is not a folder dapbench built: dapbench replaces or
    removes only what it wrote (a user's folder, the working folder or a file there is never deleted)."""
    path = Path(path)
    if (path.exists() or path.is_symlink()) and not owned_folder(path):
        raise DapbenchError(
            f"the {what} {path} already exists and was not written by dapbench (no {OWNED_MARKER} in it):"
            " dapbench would have to replace it",
            "pass a new folder name; dapbench replaces only folders it built itself",
        )


def mark_owned(folder: Path) -> None:
    """Create ``folder`` (if needed) and mark it as built by dapbench (:data:`OWNED_MARKER`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OWNED_MARKER).write_text("built by dapbench; dapbench may replace or remove this folder\n")


def atomic_directory(final: str | Path, fill: Callable[[Path], None]) -> Path:
    """Build a directory under a temporary name with ``fill(tmp_dir)``, then rename it to ``final``.

    An interrupted fill leaves only a ``.tmp`` directory that the next call removes, so ``final``
    exists if and only if it is complete. Only folders dapbench built are replaced or removed (both ``final`` and the
    ``.tmp`` folder must be :func:`owned_folder` s where they exist): a foreign folder is a named error, untouched.
    """
    final = Path(final)
    tmp = final.with_name(final.name + ".tmp")
    require_replaceable(final)
    require_replaceable(tmp, "temporary folder")
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        mark_owned(tmp)
        fill(tmp)
        _ordinary_modes(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if write_failure(exc) and not isinstance(exc, DapbenchError):
            raise WriteError.of(final, exc) from exc
        raise
    return final


def _ordinary_modes(folder: Path) -> None:
    """Give every file under ``folder`` the mode ``open()`` would (0666 less the umask): libraries write some files
    private (transformers' ``model.safetensors`` is 0600), which would keep the rest of a group from reading them."""
    mode = _file_mode()
    for file in folder.rglob("*"):
        if file.is_file() and not file.is_symlink():
            os.chmod(file, mode)


def built_once(final: str | Path, build: Callable[[], object]) -> Path:
    """``final``, calling ``build()`` (which writes it, atomically) only if it does not exist yet.

    Concurrent callers sharing a work folder (parallel runs, a cluster job array) wait on one lock file beside it,
    so exactly one of them builds and the others find it complete, instead of racing on its temporary folder.
    """
    from filelock import FileLock

    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            if not final.exists():
                build()
    except OSError as exc:
        raise unwritable(final, exc) from exc
    return final


def unwritable(path: Path, exc: OSError) -> DapbenchError:
    """The named error of a cache or build write that the system refused (a full disk, a file-size limit, a folder
    made read-only): what failed and how to fix it; the write was atomic, so nothing half-written is kept."""
    return DapbenchError(
        f"cannot build {path}: {exc.strerror or exc}",
        "free disk space, raise the file-size limit (ulimit -f) or make the folder writable, or pass another"
        " --work-dir; nothing half-written was kept",
    )


JSON_SIZE_LIMIT = 64 * 2**20
"""Bytes a JSON file dapbench reads may hold: its largest (a whole record with every sample) is a few MB, so a bigger
file is not one dapbench wrote, and parsing it could exhaust memory."""


def bar_disabled(show: bool) -> bool | None:
    """tqdm's ``disable`` for a bar shown when ``show``: None (tqdm's own rule: drawn on a terminal only), so a log
    written to a file gets no carriage returns and cursor escapes; True when it is not to be shown at all."""
    return None if show else True


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """Read a JSON file, turning a missing, corrupt, oversized or pathologically nested file into a
    :class:`DapbenchError`."""
    path = Path(path)
    if not path.is_file():
        raise DapbenchError(f"{what} not found: {path}", "check the path, or re-run the step that writes it")
    fix = "delete the file (it will be regenerated by re-running) or restore it from version control"
    size = path.stat().st_size
    if size > JSON_SIZE_LIMIT:
        raise DapbenchError(f"{what} {path} holds {size:,} bytes, over the {JSON_SIZE_LIMIT:,} any it writes", fix)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DapbenchError(f"{what} {path} is corrupt: {exc}", fix) from exc
    except RecursionError as exc:  # lists nested deeper than the parser's stack
        raise DapbenchError(f"{what} {path} is nested too deeply to be one dapbench wrote", fix) from exc
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise DapbenchError(f"{what} {path} holds a number dapbench cannot read: {exc}", fix) from exc


def json_default(value: Any) -> Any:
    """``json.dumps``' ``default``: serialise numpy scalars/arrays and paths that ``json`` does not know."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


MANIFEST = "dapbench-manifest.json"
"""The file in a checkpoint or cache directory that lists the SHA-256 of every other file in it."""


def write_manifest(directory: Path) -> None:
    """Record the SHA-256 of every file under ``directory`` (called last, inside an atomic fill)."""
    atomic_write_json(directory / MANIFEST, _digests(directory))


def verify_manifest(directory: Path, what: str, fix: str) -> None:
    """Raise :class:`CorruptStateError` unless every file under ``directory`` is the one its manifest lists:
    a truncated, changed, added or missing file is caught before anything is computed from it."""
    listed = directory / MANIFEST
    try:
        expected = json.loads(listed.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptStateError(f"{what} {directory} has no readable manifest ({exc})", fix) from exc
    found = _digests(directory)
    if found != expected:
        differing = sorted(set(found) ^ set(expected) | {n for n in found.keys() & expected if found[n] != expected[n]})
        raise CorruptStateError(f"{what} {directory} is corrupt: {', '.join(differing)} differ from its manifest", fix)


def _digests(directory: Path) -> dict[str, str]:
    """SHA-256 per file under ``directory`` (relative POSIX path), manifest excluded."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {file.relative_to(directory).as_posix(): file_sha256(file) for file in files}


def file_sha256(file: Path) -> str:
    """The SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    sha = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()
