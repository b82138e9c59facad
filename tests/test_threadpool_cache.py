"""The processes backend finds the BLAS/OpenMP libraries loaded (to limit
their threads before forking) once, and again only when a shared library
has been loaded since: a new one is never missed."""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
import textwrap


def test_the_libraries_are_found_again_once_another_is_loaded():
    # in a process of its own: the test session may have loaded anything
    program = textwrap.dedent("""
        import ctypes, ctypes.util
        from manymodels.engine.backends._process_start import (
            _loaded_library_count, loaded_threadpools)
        first = loaded_threadpools()
        assert loaded_threadpools() is first  # nothing loaded since: kept
        before = _loaded_library_count()
        for name in ("bz2", "lzma", "uuid", "gdbm", "tinfo", "expat", "ffi"):
            path = ctypes.util.find_library(name)
            if path:
                ctypes.CDLL(path)
                if _loaded_library_count() > before:
                    break
        else:
            raise SystemExit("no library left to load")
        again = loaded_threadpools()
        assert again is not first
        assert loaded_threadpools() is again
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_count_of_loaded_libraries_grows_as_one_is_loaded():
    from manymodels.engine.backends._process_start import _loaded_library_count

    before = _loaded_library_count()
    assert before is not None and before > 1
    path = ctypes.util.find_library("bz2")
    if path:
        ctypes.CDLL(path)
        assert _loaded_library_count() >= before
