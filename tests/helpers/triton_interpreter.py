"""Triton's CPU interpreter, minus a redundant cost: every call of a @triton.jit helper from a
kernel re-patches triton.language (`_patch_lang`: inspect.getmembers over tl, tl.tensor and
tl.math, ~0.2 ms), although the kernel's launch patched those modules already. Our kernels call
helpers in every program, so under the interpreter that re-patching was ~40% of the suite's
kernel-path time (cProfile of tests/inference/worker/test_kernel_runner.py's preemption test: 149 of 375 s).

`skip_repatching()` wraps the interpreter's `_patch_lang`: inside a launch, a helper whose
language modules (tl, tl.core) the launch has patched runs as is; anything else is patched as
before. Launch-level patching and its restore are unchanged. Test-only (the product never runs
the interpreter); a no-op where the interpreter's internals differ from what it expects.
"""
from __future__ import annotations

import inspect
import threading


class _NoPatch:
    def restore(self) -> None:
        pass


def skip_repatching() -> bool:
    """Install the wrapper; False (and nothing changed) where the interpreter lacks the hooks."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    # B004 misfires: grid_call is the method itself (wrapped and called below), not a callable() test
    patch_lang, grid_call = getattr(ti, "_patch_lang", None), getattr(ti.GridExecutor, "__call__", None)  # noqa: B004
    if patch_lang is None or grid_call is None or getattr(patch_lang, "_skips_repatching", False):
        return False
    local = threading.local()                     # .launches: per active launch, the modules it patched
    lang_ids: dict[int, set[int]] = {}

    def langs_of(fn) -> set[int]:
        key = id(fn.__globals__)
        if key not in lang_ids:
            lang_ids[key] = {id(v) for v in fn.__globals__.values()
                             if inspect.ismodule(v) and (v is tl or v is tl.core)}
        return lang_ids[key]

    def patched_once(fn):
        launches = getattr(local, "launches", None)
        langs = langs_of(fn)
        if launches and langs and langs <= launches[-1]:
            return _NoPatch()
        scope = patch_lang(fn)
        if launches:
            launches[-1].update(langs)
        return scope

    def launch(self, *args, **kwargs):
        if not hasattr(local, "launches"):
            local.launches = []
        local.launches.append(set())
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            local.launches.pop()

    patched_once._skips_repatching = True
    ti._patch_lang = patched_once
    ti.GridExecutor.__call__ = launch
    return True
