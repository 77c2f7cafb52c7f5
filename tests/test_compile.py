"""mxsim._compile: the kernel cache lives outside the package, ``import mxsim`` loads no
kernel, and compiling shows a notice on a terminal and is timed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import platformdirs

import mxsim
from mxsim import _compile

PACKAGE = Path(mxsim.__file__).parent
REPO_ROOT = PACKAGE.parent


def _python(code: str, env: dict) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _clean_env(tmp_path: Path) -> dict:
    """An environment without NUMBA_CACHE_DIR whose per-user cache directory is in tmp_path."""
    env = {k: v for k, v in os.environ.items() if k != _compile.CACHE_ENV}
    env["XDG_CACHE_HOME"] = str(tmp_path / "user-cache")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return env


def _cache_files(root: Path) -> dict:
    return {
        path: path.stat().st_mtime_ns
        for pattern in ("*.nbi", "*.nbc")
        for path in root.rglob(pattern)
    }


def test_kernel_cache_dir_is_numba_cache_dir_when_set(monkeypatch, tmp_path):
    monkeypatch.setenv(_compile.CACHE_ENV, str(tmp_path))
    assert _compile.kernel_cache_dir() == str(tmp_path)


def test_kernel_cache_dir_defaults_to_the_per_user_cache(monkeypatch):
    monkeypatch.delenv(_compile.CACHE_ENV, raising=False)
    assert _compile.kernel_cache_dir() == os.path.join(
        platformdirs.user_cache_dir("mxsim"), "numba", _compile.kernel_sources_digest()
    )


def test_a_changed_kernel_module_names_a_new_cache_directory(tmp_path):
    """Numba keys a cached kernel by its own file alone, while it carries the functions it
    calls from other modules compiled in: the per-user cache is per digest of every
    underscore module, so changing one (a callee's) names a new directory; other modules
    and packages' __init__ do not count."""
    (tmp_path / "pkg").mkdir()
    callee, caller = tmp_path / "pkg" / "_callee.py", tmp_path / "_caller.py"
    callee.write_text("x = 1\n")
    caller.write_text("from pkg._callee import x\n")
    (tmp_path / "public.py").write_text("a = 1\n")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    digest = _compile.kernel_sources_digest.__wrapped__
    before = digest(str(tmp_path))
    (tmp_path / "public.py").write_text("a = 2\n")
    (tmp_path / "pkg" / "__init__.py").write_text("# changed\n")
    assert digest(str(tmp_path)) == before
    callee.write_text("x = 2\n")
    changed = digest(str(tmp_path))
    assert changed != before and len(changed) == 16
    callee.rename(tmp_path / "pkg" / "_renamed.py")
    assert digest(str(tmp_path)) not in (before, changed)


def test_compiled_kernels_are_cached_in_the_user_cache_not_in_the_package(tmp_path):
    env = _clean_env(tmp_path)
    before = _cache_files(PACKAGE)
    out = _python(
        "import mxsim, numba, os\n"
        "mxsim.get_format('fp8_e4m3').decode_table\n"  # compiles (or loads) a kernel
        "print(numba.config.CACHE_DIR)\n",
        env,
    )
    expected = tmp_path / "user-cache" / "mxsim" / "numba" / _compile.kernel_sources_digest()
    assert out.strip() == str(expected)
    assert any(expected.rglob("*.nbi")) and any(expected.rglob("*.nbc"))
    assert _cache_files(PACKAGE) == before  # nothing written into the package


def test_cache_dir_takes_effect_when_numba_was_imported_first(tmp_path):
    env = _clean_env(tmp_path)
    out = _python("import numba\nimport mxsim\nprint(numba.config.CACHE_DIR)\n", env)
    digest = _compile.kernel_sources_digest()
    assert out.strip() == str(tmp_path / "user-cache" / "mxsim" / "numba" / digest)


def test_import_mxsim_loads_no_kernel_module(tmp_path):
    env = _clean_env(tmp_path)
    out = _python(
        "import sys, mxsim\n"
        "print(sorted(m for m in sys.modules if m == 'numba' or m.startswith('mxsim.')))\n"
        "mxsim.load_hwconfig\n"  # a public name resolves on first use
        "print('mxsim.datapath' in sys.modules)\n",
        env,
    )
    assert out.splitlines() == ["['mxsim._compile']", "True"]


def test_public_names_resolve_and_modules_are_not_shadowed():
    import importlib

    for name in mxsim.__all__:
        assert getattr(mxsim, name) is not None
    assert mxsim.quantize_mx is importlib.import_module("mxsim.quantize.mx").quantize
    assert (
        importlib.import_module("mxsim.quantize") is mxsim.quantize
    )  # the package, not a function
    import mxsim.datapath.api as api

    assert mxsim.datapath.dot is api.dot and mxsim.dot is api.dot
    # No public name of a package is also the name of one of its modules.
    import pkgutil
    import types

    packages = ["mxsim"] + [
        p.name for p in pkgutil.walk_packages(mxsim.__path__, "mxsim.") if p.ispkg
    ]
    for name in packages:
        module = importlib.import_module(name)
        for sub in pkgutil.iter_modules(module.__path__):
            value = getattr(module, sub.name, None)
            assert value is None or isinstance(value, types.ModuleType), (
                f"{name}.{sub.name} shadows a module"
            )


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_compile_notice_on_a_terminal_and_timing():
    stream = _Terminal()
    watch = _compile._CompileWatch(stream)
    watch.on_start(None)
    watch.on_start(None)  # a nested compile is part of the outer one
    time.sleep(1.0)
    watch.on_end(None)
    watch.on_end(None)
    shown = stream.getvalue()
    assert f"compiling kernels (first run only, ~{_compile.TYPICAL_COMPILE_SECONDS} s)" in shown
    assert shown.endswith("\r")  # the line is cleared afterwards
    assert 1.0 <= watch.total_seconds < 5.0


def test_one_log_line_off_a_terminal():
    """Off a terminal (a log file, a pipe) the first long compile of the process writes one
    whole line; short compiles and later ones write nothing."""
    log = io.StringIO()
    watch = _compile._CompileWatch(log)
    watch.on_start(None)
    watch.on_end(None)
    assert log.getvalue() == ""
    for _ in range(2):
        watch.on_start(None)
        time.sleep(0.7)
        watch.on_end(None)
    lines = log.getvalue().splitlines(keepends=True)
    assert len(lines) == 1 and lines[0].endswith("\n") and "\r" not in lines[0]
    assert lines[0].startswith(
        f"mxsim: compiling kernels (first run only, ~{_compile.TYPICAL_COMPILE_SECONDS} s)"
    )
    assert _compile.kernel_cache_dir() in lines[0]


def test_no_notice_for_short_compiles():
    terminal = _Terminal()
    watch = _compile._CompileWatch(terminal)
    watch.on_start(None)
    watch.on_end(None)
    assert terminal.getvalue() == ""


def _helper_and_callers(decorate):
    from numba import njit

    @decorate
    @njit
    def scaled(value, factor):
        return value * factor

    @njit
    def with_constant(value):
        return scaled(value, 3)

    @njit
    def with_variable(value, factor):
        return scaled(value, factor)

    assert with_constant(2) == 6 and with_variable(2, 5) == 10
    return scaled


def test_generic_calls_compile_one_specialisation_for_constant_arguments():
    scaled = _helper_and_callers(_compile.generic_calls)
    assert [str(s) for s in scaled.signatures] == ["(int64, int64)"]
    plain = _helper_and_callers(lambda dispatcher: dispatcher)
    assert len(plain.signatures) == 2  # what Numba does unasked: one more for Literal[int](3)


def test_waiting_for_another_process_counts_as_compiling_and_shows_the_notice(monkeypatch):
    log = io.StringIO()
    watch = _compile._CompileWatch(log)
    monkeypatch.setattr(_compile, "_watch", watch)
    before = _compile.compile_seconds()
    with _compile.compiling_elsewhere():
        time.sleep(0.7)
    assert 0.7 <= _compile.compile_seconds() - before < 5.0
    assert log.getvalue().startswith(_compile._message())


def _aged_directories(root, names, first_age: int) -> None:
    """Directories ``names`` under ``root``, the first ``first_age`` hours old, each next one
    an hour older."""
    now = time.time()
    for hours, name in enumerate(names, start=first_age):
        path = root / name
        path.mkdir(parents=True)
        (path / "index.nbi").write_bytes(b"")
        os.utime(path, (now - 3600 * hours, now - 3600 * hours))


def test_pruning_keeps_the_most_recently_used_digest_directories(tmp_path):
    digests = [f"{i:016x}" for i in range(6)]  # newest first
    _aged_directories(tmp_path, digests, 1)
    old_layout = tmp_path / f"datapath_{'a' * 40}"
    old_layout.mkdir()
    untouched = [tmp_path / "notes", tmp_path / "ABCDEF0123456789", tmp_path / f"{'b' * 17}"]
    for path in untouched:
        path.mkdir()
    (tmp_path / f"{'c' * 16}").write_text("a file named like a digest")
    removed = _compile.prune_kernel_caches(str(tmp_path), keep=2)
    assert sorted(removed) == sorted(
        [str(tmp_path / name) for name in digests[2:]] + [str(old_layout)]
    )
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == sorted([*digests[:2], *(path.name for path in untouched), "c" * 16])
    assert _compile.prune_kernel_caches(str(tmp_path / "missing"), keep=2) == []


def test_a_new_kernel_cache_prunes_the_others_and_a_used_one_is_kept(tmp_path):
    env = _clean_env(tmp_path)
    root = tmp_path / "user-cache" / "mxsim" / "numba"
    current = _compile.kernel_sources_digest()
    others = [f"{i:016x}" for i in range(5)]
    _aged_directories(root, others, 1)
    _python("import mxsim\n", env)  # a new digest: the three most recent others are kept
    kept = _compile.KEPT_KERNEL_CACHES - 1
    assert sorted(path.name for path in root.iterdir()) == sorted(others[:kept])
    (root / current).mkdir()
    os.utime(root / current, (0, 0))
    _python("import mxsim\n", env)  # a used directory: its time is now, nothing is pruned
    assert (root / current).stat().st_mtime > time.time() - 600
    assert len(list(root.iterdir())) == kept + 1
