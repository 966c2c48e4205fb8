"""Hooks into torch, placed only once the program itself has imported torch.

The agent never imports torch on its own: a program that does not use torch must not pay for
it (seconds of start-up, hundreds of MB). A one-shot import hook notices when the program
imports torch and then registers the global optimizer step post-hook, wraps the DataLoader
iterator's ``__next__``, and wraps the calls by which the host waits on the device
(``TENSOR_SYNCS``, ``CUDA_SYNCS``): each times the call on a CUDA tensor (two clock reads) and is
a plain call otherwise (one attribute test).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gputop.agent.telemetry import StepTelemetry

# Tensor methods that copy a CUDA tensor's value to the host, so the host waits until the
# device has computed it (CUDA semantics: a device-to-host copy to pageable memory is
# synchronous; a tensor's truth value or number needs its value).
TENSOR_SYNCS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
# Explicit waits: the whole device, one event, one stream.
CUDA_SYNCS = (("torch.cuda", "synchronize"), ("torch.cuda.Event", "synchronize"),
              ("torch.cuda.Stream", "synchronize"))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after the top-level module ``name`` has executed."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback
        self._looking = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self._looking:
            return None
        self._looking = True
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders' answer
        finally:
            self._looking = False
        self.remove()
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        callback = self.callback

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        try:
            loader.exec_module = exec_then_hook  # type: ignore[union-attr]
        except (AttributeError, TypeError):
            pass  # an unusual loader: hooks get placed lazily on the first request instead
        return spec

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` now if ``name`` is imported, else right after it gets imported."""
    module = sys.modules.get(name)
    if module is not None:
        spec = getattr(module, "__spec__", None)
        if not getattr(spec, "_initializing", False):
            callback(module)
            return
    sys.meta_path.insert(0, _AfterImport(name, callback))


class TorchHooks:
    """The optimizer step post-hook and the DataLoader ``__next__`` timer, placed once."""

    def __init__(self, telemetry: StepTelemetry) -> None:
        self.telemetry = telemetry
        self.step_hook: Any = None
        self.problem: str | None = "the process has not imported torch (yet)"
        self._dataloader_class: Any = None
        self._original_next: Any = None
        # (owner, name, original, whether the owner itself defined it)
        self._wrapped: list[tuple[Any, str, Any, bool]] = []

    def place(self, _torch: ModuleType | None = None) -> None:
        """Place the hooks; called on the thread that imported torch. Never raises."""
        if self.step_hook is not None:
            return
        try:
            torch = sys.modules["torch"]
            try:
                from torch.optim.optimizer import register_optimizer_step_post_hook
            except ImportError:
                self.problem = (
                    f"torch {getattr(torch, '__version__', '?')} has no global optimizer step "
                    "hook (torch 2.0 or newer is needed for step captures)"
                )
                return
            self.step_hook = register_optimizer_step_post_hook(self.telemetry.optimizer_hook)
            self.problem = None
            self._wrap_dataloader_next()
            self._wrap_syncs(torch)
        except Exception as exc:
            self.problem = f"could not hook into torch: {type(exc).__name__}: {exc}"[:300]
            self.telemetry.record_error(exc)

    def ensure_placed(self) -> str | None:
        """For requests: place late if torch got imported some way our hook missed."""
        if self.step_hook is None and "torch" in sys.modules:
            spec = getattr(sys.modules["torch"], "__spec__", None)
            if not getattr(spec, "_initializing", False):
                self.place()
        return self.problem

    def _wrap_dataloader_next(self) -> None:
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        original = cls.__dict__.get("__next__")
        if original is None or getattr(original, "_gputop_original", None) is not None:
            return
        telemetry = self.telemetry
        perf_counter = time.perf_counter

        @functools.wraps(original)
        def __next__(self: Any) -> Any:
            if not telemetry.enabled:
                return original(self)
            t0 = perf_counter()
            try:
                return original(self)
            finally:
                try:
                    telemetry.add_dataloader_wait(perf_counter() - t0)
                except Exception:
                    pass  # never mask the loader's own StopIteration or error

        __next__._gputop_original = original  # type: ignore[attr-defined]
        cls.__next__ = __next__
        self._dataloader_class, self._original_next = cls, original

    def _wrap_syncs(self, torch: ModuleType) -> None:
        telemetry = self.telemetry
        perf_counter = time.perf_counter

        def timed(original: Any, on_cuda_tensor: bool) -> Any:
            @functools.wraps(original)
            def call(*args: Any, **kwargs: Any) -> Any:
                if not telemetry.enabled or (on_cuda_tensor and not args[0].is_cuda):
                    return original(*args, **kwargs)
                t0 = perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    try:
                        telemetry.add_sync_wait(perf_counter() - t0)
                    except Exception:
                        pass  # never mask the call's own error

            call._gputop_original = original  # type: ignore[attr-defined]
            return call

        targets = [(torch.Tensor, name, True) for name in TENSOR_SYNCS]
        for owner_path, name in CUDA_SYNCS:
            owner: Any = torch
            for part in owner_path.split(".")[1:]:
                owner = getattr(owner, part, None)
            targets.append((owner, name, False))
        for owner, name, on_tensor in targets:
            original = getattr(owner, name, None) if owner is not None else None
            if original is None or getattr(original, "_gputop_original", None) is not None:
                continue
            own = name in vars(owner)
            try:
                setattr(owner, name, timed(original, on_tensor))
            except (AttributeError, TypeError):
                continue
            self._wrapped.append((owner, name, original, own))

    def remove(self) -> None:
        """Undo everything (tests, benchmarks)."""
        if self.step_hook is not None:
            self.step_hook.remove()
            self.step_hook = None
            self.problem = "the agent was shut down"
        if self._dataloader_class is not None:
            self._dataloader_class.__next__ = self._original_next
            self._dataloader_class = self._original_next = None
        for owner, name, original, own in reversed(self._wrapped):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # inherited again, as before
        self._wrapped.clear()
