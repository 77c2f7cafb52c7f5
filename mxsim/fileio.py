"""Reading untrusted files and writing output files safely: the one place for both.

Reading: text is UTF-8 (strict) and at most ``MAX_TEXT_BYTES``; YAML is screened on its
event stream for nesting depth and expanded size before anything is built; ``.npy`` and
``.npz`` arrays have their header parsed with ``numpy.lib.format`` and checked (dtype,
shape, size against the stored bytes and the memory budget) before any array memory is
allocated, and nothing is ever unpickled. Every problem is reported through the caller's
``fail(message)`` (or ``fail(member, message)``), which raises the caller's own error type
naming its file, so a config error stays a ConfigError and a trace error a TraceError.

Writing: :func:`write_atomic` (temporary file in the same directory, fsync, ``os.replace``),
:func:`replace_directory`, and for whole outputs :func:`check_output_directory` with
:func:`staged_directory`; :func:`json_text` writes standard JSON (no ``NaN``/``Infinity``);
:func:`safe_output_path` turns a free-form name (a layer name) into a file name that stays
inside an output directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import math
import os
import re
import secrets
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import yaml

from .errors import ArgumentError, BudgetError, MxsimError
from .limits import MAX_TEXT_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, check_array_budget, check_path

Fail = Callable[[str], NoReturn]
MemberFail = Callable[[str | None, str], NoReturn]
#: Errors a corrupt zip archive or member can raise while being read.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    EOFError,
    OSError,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    ValueError,
    OverflowError,
)

# ----------------------------------------------------------------------------- text and YAML

#: libyaml's safe loader where PyYAML was built with it (tens of times faster), else PyYAML's.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(_LOADER):
    """The safe loader, refusing a mapping that repeats a key (YAML itself keeps the last,
    silently); merge keys (``<<``) may still be overridden, as YAML specifies."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    mark = key_node.start_mark
                    raise _DuplicateKey(
                        f"a key repeats an earlier key of its mapping (line {mark.line + 1}, "
                        f"column {mark.column + 1}); each key once"
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    pass


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error without the file's text (PyYAML quotes the offending lines): what and where."""
    problem = (
        getattr(error, "problem", None) or getattr(error, "context", None) or type(error).__name__
    )
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return " ".join(str(problem).split())[:120] + where


def read_text(
    path: Path, fail: Fail, *, encoding: str = "utf-8", limit: int = MAX_TEXT_BYTES
) -> str:
    """The text of ``path``: a regular file of at most ``limit`` bytes (MAX_TEXT_BYTES unless the
    caller has checked a larger size against the budget), valid ``encoding``."""
    try:
        if not path.is_file():
            fail("no such file")
        size = path.stat().st_size
        if size > limit:
            fail(f"{size} bytes; text inputs are limited to {limit} bytes")
        data = path.read_bytes()
    except OSError as error:
        fail(f"cannot read: {error.strerror or error}")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        name = "UTF-8" if encoding.lower().startswith("utf-8") else encoding.upper()
        fail(
            f"not {name} text (byte 0x{data[error.start]:02x} at offset {error.start}); save it as {name}"
        )


def load_yaml(text: str, fail: Fail) -> Any:
    """``yaml.safe_load(text)`` after checking nesting depth and expanded size on the event stream.

    The event parser is iterative, so a deeply nested document is refused without recursing;
    an alias counts with the full size of what it names, so a "billion laughs" document is
    refused before it is built. A mapping may not repeat a key. Messages never quote the
    text (a file given by mistake, or on purpose, may hold secrets): they say what is wrong
    and at which line and column.
    """
    depth = 0
    counts = [0]  # nodes so far, per open collection (outermost first)
    sizes: dict[str, int] = {}
    anchors: list[str | None] = [None]
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    fail(f"YAML nested deeper than {MAX_YAML_DEPTH} levels")
                counts.append(1)
                anchors.append(event.anchor)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
                size, anchor = counts.pop(), anchors.pop()
                if anchor is not None:
                    sizes[anchor] = size
                counts[-1] += size
            elif isinstance(event, yaml.ScalarEvent):
                if event.anchor is not None:
                    sizes[event.anchor] = 1
                counts[-1] += 1
            elif isinstance(event, yaml.AliasEvent):
                counts[-1] += sizes.get(event.anchor, 1)
            if sum(counts) > MAX_YAML_NODES:
                fail(f"YAML expands to more than {MAX_YAML_NODES} nodes")
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader
    except MxsimError:
        raise
    except _DuplicateKey as error:
        fail(f"{error} (YAML would keep the last value silently)")
    except yaml.YAMLError as error:
        if "nesting depth" in str(getattr(error, "problem", "")):
            # PyYAML >= 6.0.4 stops at its own depth limit (1000) while scanning ahead,
            # before the event loop above reaches ours
            fail(f"YAML nested deeper than {MAX_YAML_DEPTH} levels")
        fail(f"not valid YAML: {_yaml_problem(error)}")
    except (RecursionError, ValueError, OverflowError, KeyError, TypeError) as error:
        # constructors of odd scalars (dates, tagged values); their messages quote the text
        fail(f"not valid YAML: a value cannot be read ({type(error).__name__})")


# ----------------------------------------------------------------------------- .npy / .npz


def _read_header(stream, where: str, fail: Fail) -> tuple[np.dtype, tuple, bool, int]:
    """Parse one .npy header from ``stream``: (dtype, shape, fortran_order, header bytes)."""
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            fail(f".npy format version {version} in {where} is not supported (accepted: 1.0, 2.0)")
    except MxsimError:
        raise
    except (
        Exception
    ) as error:  # numpy's header parser raises many kinds on hostile bytes; all mean "corrupt"
        detail = " ".join(str(error).split())[:200]
        fail(
            f"truncated or corrupt in {where}: not a valid .npy array header ({type(error).__name__}: {detail})"
        )
    return dtype, shape, fortran, stream.tell()


def read_npy(
    stream,
    stored_bytes: int,
    where: str,
    allowed_dtypes: Iterable[str],
    fail: Fail,
    expected: tuple[tuple, str] | None = None,
) -> np.ndarray:
    """One .npy array from ``stream`` whose stored size is ``stored_bytes``, checked before allocation.

    The header must declare a dtype named in ``allowed_dtypes`` (never an object or
    structured dtype) and a shape whose data is exactly the bytes stored after the header;
    the array must fit the memory budget and, if ``expected`` = (shape, dtype name) is
    given, match it. Byte order is converted to native. ``where`` names the file in messages.
    """
    allowed = tuple(allowed_dtypes)
    dtype, shape, fortran, header_bytes = _read_header(stream, where, fail)
    if dtype.hasobject:
        fail(f"is a pickled (object) array in {where}; mxsim never unpickles")
    if dtype.fields is not None or dtype.name not in allowed:
        fail(f"dtype {dtype} in {where} is not allowed (accepted: {', '.join(allowed)})")
    if expected is not None:
        expected_shape, expected_dtype = expected
        if dtype.name != expected_dtype:
            fail(f"dtype {dtype.name} in {where}, manifest says {expected_dtype}")
        if tuple(shape) != tuple(expected_shape):
            fail(f"shape {tuple(shape)} in {where}, manifest says {tuple(expected_shape)}")
    nbytes = math.prod(shape) * dtype.itemsize
    if header_bytes + nbytes != stored_bytes:
        fail(
            f"truncated or corrupt in {where}: the header declares shape {tuple(shape)} of {dtype.name} "
            f"({nbytes} bytes) but {stored_bytes - header_bytes} data bytes are stored"
        )
    try:
        check_array_budget(
            shape, dtype.itemsize, f"shape {tuple(shape)} of {dtype.name} in {where}"
        )
    except BudgetError as error:
        fail(str(error))
    buffer = bytearray(nbytes)
    try:
        got = stream.readinto(buffer) if nbytes else 0
        trailing = stream.read(1)  # reaching the end makes zipfile check the CRC
    except MxsimError:
        raise
    except _ZIP_ERRORS as error:
        fail(f"truncated or corrupt in {where} ({type(error).__name__}: {error})")
    if got != nbytes or trailing:
        fail(f"truncated or corrupt in {where} (expected {nbytes} data bytes)")
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return array.astype(dtype.newbyteorder("="), copy=False) if not dtype.isnative else array


def read_npy_file(path: Path, allowed_dtypes: Iterable[str], fail: Fail) -> np.ndarray:
    """The array of a single ``.npy`` file (see :func:`read_npy`)."""
    path = check_path(path, "path")
    try:
        if not path.is_file():
            fail("no such file")
        size = path.stat().st_size
        if size == 0:
            fail("the file is empty (0 bytes); expected a .npy array")
        with open(path, "rb") as stream:
            return read_npy(stream, size, "the file", allowed_dtypes, fail)
    except OSError as error:
        fail(f"cannot read: {error.strerror or error}")


def read_npz(
    path: Path,
    allowed_dtypes: Iterable[str],
    fail: MemberFail,
    expected: dict[str, tuple[tuple, str]] | None = None,
    label: str | None = None,
) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive, each checked as :func:`read_npy` checks it.

    ``fail(member, message)`` reports a problem (``member`` None for the archive itself);
    ``label`` names the file in messages (default: its name). With ``expected``
    ({name: (shape, dtype name)}), the archive must hold exactly those arrays. The members'
    total stored size must fit the memory budget, and each member's header is checked
    before its array is allocated.
    """
    allowed = tuple(allowed_dtypes)
    label = label or path.name
    try:
        check_array_budget((path.stat().st_size,), 1, label)
    except BudgetError as error:
        fail(None, str(error))
    except OSError as error:
        fail(None, f"cannot read {label}: {error.strerror or error}")
    try:
        with open(path, "rb") as stream:
            if stream.read(6) == b"\x93NUMPY":
                fail(None, f"{label} is a single .npy array, not an NPZ archive")
        archive = zipfile.ZipFile(path)
    except MxsimError:
        raise
    except _ZIP_ERRORS as error:
        fail(
            None,
            f"{label} is truncated or corrupt: not a readable NPZ (zip) archive ({type(error).__name__}: {error})",
        )
    with archive:
        members = {}
        for info in archive.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else None
            if name is None or info.is_dir():
                fail(None, f"{label} holds {info.filename!r}, which is not an .npy array member")
            if name in members:
                fail(name, f"is stored twice in {label}")
            members[name] = info
        if expected is not None:
            extra = sorted(set(members) - set(expected))
            if extra:
                fail(extra[0], f"{label} holds arrays the manifest does not list")
            missing = sorted(set(expected) - set(members))
            if missing:
                fail(missing[0], f"missing from {label}")
        total = sum(info.file_size for info in members.values())
        try:
            check_array_budget((total,), 1, f"{label} ({len(members)} arrays)")
        except BudgetError as error:
            fail(None, str(error))
        out = {}
        for name, info in members.items():
            try:
                with archive.open(info) as stream:
                    out[name] = read_npy(
                        stream,
                        info.file_size,
                        label,
                        allowed,
                        lambda message, _name=name: fail(_name, message),
                        None if expected is None else expected[name],
                    )
            except MxsimError:
                raise
            except _ZIP_ERRORS as error:
                fail(name, f"truncated or corrupt in {label} ({type(error).__name__}: {error})")
        return out


# ----------------------------------------------------------------------------- strict JSON

#: How JSON outputs hold the floats JSON has no literal for (``json`` would write the
#: non-standard ``NaN``/``Infinity`` that strict parsers refuse).
NONFINITE_JSON = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def json_ready(value):
    """``value`` with numpy scalars and arrays as Python values and every non-finite float as
    the string ``"inf"``, ``"-inf"`` or ``"nan"``; other objects as their ``str``."""
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return {
            str(key) if not isinstance(key, (str, int, float, bool)) else key: json_ready(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple, np.ndarray)):
        return [
            json_ready(item)
            for item in (value.tolist() if isinstance(value, np.ndarray) else value)
        ]
    return str(value)


def json_text(value, **options) -> str:
    """Standard JSON of ``value`` (see :func:`json_ready`): no ``NaN`` or ``Infinity``."""
    return json.dumps(json_ready(value), allow_nan=False, **options)


# ----------------------------------------------------------------------------- writing


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not every platform opens directories
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def write_atomic(path, data: str | bytes | Iterable[str], *, encoding: str = "utf-8") -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and ``os.replace``.

    ``data`` may also be an iterable of text pieces, written as they come (so a large file
    need not be held in memory). The temporary file is fsynced before the rename and the
    directory after it, so a reader (or a crash, or SIGKILL) sees the old complete file or the
    new complete one, never a part; an exception while the pieces are made leaves the old file.
    """
    path = check_path(path, "output file")
    pieces = [data] if isinstance(data, (str, bytes)) else data
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
    )
    try:
        with os.fdopen(descriptor, "wb") as handle:
            for piece in pieces:
                handle.write(piece.encode(encoding) if isinstance(piece, str) else piece)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual file mode
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    _fsync_directory(path.parent)


_RENAME_EXCHANGE = 2


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    library = ctypes.util.find_library("c")
    renameat2 = (
        getattr(ctypes.CDLL(library, use_errno=True), "renameat2", None) if library else None
    )
    if renameat2 is None:
        return False
    at_cwd = -100
    result = renameat2(at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(second))


def replace_directory(staging: Path, target: Path) -> None:
    """Move the complete directory ``staging`` to ``target``, replacing any directory there.

    Where the system can swap two paths atomically (Linux), a reader or a kill at any moment
    finds the old complete directory or the new one. Elsewhere the old one is renamed aside
    first, so there is a moment with neither (never a mixture).
    """
    if not target.exists():
        os.replace(staging, target)
    elif _exchange(staging, target):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the old directory
    else:
        retired = target.parent / f".{target.name}.old-{secrets.token_hex(4)}"
        os.replace(target, retired)
        os.replace(staging, target)
        shutil.rmtree(retired, ignore_errors=True)
    _fsync_directory(target.parent)


def check_output_directory(target, is_own: Callable[[Path], bool], what: str) -> Path:
    """``target`` made absolute, if it may be replaced as a whole by a new output: absent, an empty
    directory, or a directory ``is_own`` recognises as an earlier output of the same kind.
    Anything else (a file, a symlink, a directory holding other files, the current directory
    or one of its parents) is an ArgumentError naming ``what``: replacing it would delete
    files that are not mxsim's."""
    target = check_path(target, what)
    if target.is_symlink():
        raise ArgumentError(f"{what} {target}: is a symlink; give the directory itself")
    target = target.absolute()
    if target.exists():
        if not target.is_dir():
            raise ArgumentError(f"{what} {target}: exists and is not a directory")
        if any(target.iterdir()) and not is_own(target):
            raise ArgumentError(
                f"{what} {target}: is not empty and holds no earlier output of this kind; the "
                "output directory is replaced as a whole, so give a new or empty directory"
            )
    cwd = Path.cwd()
    if target.resolve() == cwd or target.resolve() in cwd.parents:
        raise ArgumentError(
            f"{what} {target}: is the current directory or holds it; the output directory is "
            "replaced as a whole, so give another one"
        )
    return target


@contextlib.contextmanager
def staged_directory(target: Path):
    """A fresh hidden directory beside ``target`` to write a whole output into; on a normal
    exit it replaces ``target`` (:func:`replace_directory`: a kill at any moment leaves the
    old complete output or the new one), on an exception it is removed. Check ``target``
    with :func:`check_output_directory` first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes 0700; give the usual directory mode
    replace_directory(staging, target)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def safe_file_stem(name: str, limit: int = 100, default: str = "unnamed") -> str:
    """``name`` as a file name stem: runs of characters other than letters, digits, ``.``,
    ``_`` and ``-`` become ``_``, leading and trailing dots and underscores are dropped (no
    hidden files, no ``..``), cut to ``limit`` characters; ``default`` if nothing is left."""
    return (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or default)[:limit]


def safe_output_path(directory, name: str, suffix: str = "") -> Path:
    """A path for ``name`` (e.g. a layer name) inside ``directory``, whatever ``name`` holds.

    The file name is :func:`safe_file_stem` of ``name`` plus ``suffix``; the result is
    checked to lie directly inside ``directory``.
    """
    if not isinstance(name, str):
        raise ArgumentError(f"output name: expected a string, got {type(name).__name__}")
    stem = safe_file_stem(name)
    root = Path(directory).resolve()
    path = root / f"{stem}{suffix}"
    if path.parent != root:
        raise ArgumentError(f"output name {name!r} does not give a file inside {directory}")
    return path
