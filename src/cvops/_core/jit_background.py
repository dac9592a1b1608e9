"""Loading and compiling an op's numba kernels on a worker thread, so that no call waits for numba.

A process's first numba call pays numba's import and the loading of each kernel from numba's disk cache,
and on an empty cache the compilation of every kernel it runs, which takes far longer than the call's own
work. In the default mode (``CVOPS_NUMBA`` unset, see :func:`cvops._core.jit.numba_mode`) that work is
done here, on one daemon thread, and calls that find their kernels not ready run the op's torch path:

* :func:`loaded` returns an op's kernel module once the worker has imported it, and queues the import
  on the first request;
* the module's dispatchers then do not compile on call: a call whose argument types have no compiled
  version reaches numba's ``_compile_for_args``, replaced here by a function that queues those types
  for the worker and raises :class:`KernelNotReady`, which the op's torch fallback catches
  (``with suppress(KernelNotReady): return kernels.forward(...)``);
* the worker compiles (or loads from the cache) one signature at a time with the dispatcher's own
  ``compile``, which holds numba's compiler lock and compiles the kernel's callees with it;
* :func:`compile_on_call` hands a module back to numba's usual behaviour (compile on the calling thread),
  which the waiting mode and a failed compilation use.

The torch path and the numba kernels compute the same values (bit for bit for the pure-IO ops, within
the accumulating-op tolerance for the others), so only a result's last bits can depend on when the
worker finished. :func:`compile_on_call` and the worker's deferral of a freshly imported module take
one lock, so once a waiting call (``CVOPS_NUMBA=1``, deterministic algorithms) has handed a module back,
the worker cannot defer it again: that call and every later one run the kernels.

A fork never waits for the worker. The child gets a new, empty worker (the parent's queue is dropped;
its calls queue what they need again). If the parent's worker was in the middle of a job when the fork
happened, the job's locks (numba's compiler lock, the import system's module locks) may be held in the
child by a thread that does not exist there, so that child never touches numba: its CPU ops run the
torch path (:func:`lost_at_fork`). At exit the worker's current job is waited for (LLVM must not be torn
down under it). During a job the worker lowers the GIL switch interval and turns the cyclic garbage
collector off, and restores both after it (the collector only if it was on when the job began).
"""
from __future__ import annotations

import atexit
import functools
import gc
import importlib
import os
import sys
import threading
from types import ModuleType
from typing import Callable, Optional

_SWITCH_INTERVAL_S = 1e-4   # the GIL switch interval while the worker runs
UNAVAILABLE = object()  # what loaded() holds for a module whose import failed (numba missing or broken)


class KernelNotReady(Exception):
    """A kernel has no compiled version for these argument types yet; the worker is compiling one."""


class _Worker:
    """One daemon thread running queued jobs in order, each key at most once at a time."""

    def __init__(self):
        self.cond = threading.Condition()
        self.jobs: dict = {}        # key -> job, in submission order; a job leaves once it has run
        self.thread: Optional[threading.Thread] = None
        self.closing = False
        self.running = False        # a job is under way (set and cleared under cond)
        self.submitted = 0          # jobs taken so far (tells a caller whether a call asked for any)

    def submit(self, key, job: Callable[[], None]) -> None:
        with self.cond:
            if self.closing or key in self.jobs:
                return
            self.jobs[key] = job
            self.submitted += 1
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._serve, name="cvops-numba", daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def _serve(self) -> None:
        try:
            self._run_jobs()
        finally:  # whatever ended the thread, nobody may wait for jobs it will not run
            with self.cond:
                self.jobs.clear()
                self.running = False
                self.cond.notify_all()

    def _run_jobs(self) -> None:
        while True:
            with self.cond:
                while not self.jobs and not self.closing:
                    self.cond.wait()
                if self.closing:
                    return
                key, job = next(iter(self.jobs.items()))
                self.running = True
            interval, collecting = sys.getswitchinterval(), gc.isenabled()
            # numba's import and front end are Python holding the GIL: the calls running beside them, which
            # release it in every torch call, would wait up to a switch interval (5 ms by default) to get it
            # back each time, and all of a full collection over torch's and numba's objects, which the
            # import's allocations set off. The collection runs after the job instead.
            sys.setswitchinterval(min(interval, _SWITCH_INTERVAL_S))
            gc.disable()
            try:
                job()
            except Exception:
                pass  # each job records its own failure (see _import, _compile); the worker goes on
            finally:
                sys.setswitchinterval(interval)
                if collecting:
                    gc.enable()
                with self.cond:
                    del self.jobs[key]
                    self.running = False
                    self.cond.notify_all()

    def wait_idle(self) -> None:
        with self.cond:
            while self.jobs and not self.closing:
                self.cond.wait()

    def close(self) -> None:
        """Start no further job and wait for the one running."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


_worker = _Worker()
_modules: dict = {}  # package -> kernel module (or UNAVAILABLE) once the worker imported it
_deferral = threading.Lock()  # a module's deferral (worker) and its hand-back (waiting calls), one at a time
_lost_at_fork = False  # this process was forked while the worker ran a job (see lost_at_fork)
atexit.register(lambda: _worker.close())


def _before_fork() -> None:
    # Held by the worker only between jobs, for microseconds: the fork does not wait for a job, and none
    # starts (or ends) until the fork is done, so `running` says whether one was under way.
    _worker.cond.acquire()


def _after_fork_in_parent() -> None:
    _worker.cond.release()


def _after_fork_in_child() -> None:
    global _worker, _deferral, _lost_at_fork
    _lost_at_fork = _lost_at_fork or _worker.running
    # the parent's thread does not exist here: a new worker with an empty queue, and new locks (one held by
    # another of the parent's threads would never be released here)
    _worker = _Worker()
    _deferral = threading.Lock()


def lost_at_fork() -> bool:
    """Whether this process was forked (at any depth) while the worker was importing or compiling: then
    numba's locks may be held for ever here, and the ops run their torch path (``jit.numba_mode``)."""
    return _lost_at_fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


def wait_idle() -> None:
    """Block until every queued import and compilation has finished (benchmarks, tests)."""
    _worker.wait_idle()


def jobs_submitted() -> int:
    """How many imports and compilations have been queued in this process so far."""
    return _worker.submitted


def run_until_ready(call: Callable[[], object]):
    """``call()`` after the worker is idle, again until a call queues nothing; returns that call's result,
    computed with every kernel it uses compiled (benchmarks, tests)."""
    while True:
        wait_idle()
        asked = _worker.submitted
        result = call()
        if _worker.submitted == asked:
            return result


def loaded(package: str):
    """``<package>.cpu_numba`` once the worker has imported it (:data:`UNAVAILABLE` if that failed),
    else None, queueing the import."""
    module = _modules.get(package)
    if module is None:
        _worker.submit(("import", package), functools.partial(_import, package))
    return module


def _import(package: str) -> None:
    try:
        module = importlib.import_module(f"{package}.cpu_numba")
    except Exception:
        _modules[package] = UNAVAILABLE
        return
    _defer_compilation(module)
    _modules[package] = module


def _own_dispatchers(module: ModuleType) -> list:
    """The numba dispatchers defined in ``module`` (module globals, also inside tuples of variants)."""
    from numba.core.dispatcher import Dispatcher

    found = []
    for value in vars(module).values():
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, Dispatcher) and item.py_func.__module__ == module.__name__ and item not in found:
                found.append(item)
    return found


def _defer_compilation(module: ModuleType) -> None:
    with _deferral:
        if getattr(module, "__cvops_dispatchers__", None) is not None:
            return  # a waiting call imported it first and compiles on call
        group = _own_dispatchers(module)
        module.__cvops_dispatchers__ = group
        for dispatcher in group:
            # numba's dispatcher calls this when no compiled version matches the arguments
            dispatcher._compile_for_args = functools.partial(_not_ready, dispatcher, group)


def compile_on_call(module: ModuleType) -> None:
    """Let ``module``'s kernels compile on the calling thread again, as plain numba does, from this call on
    (the worker can no longer defer them)."""
    with _deferral:
        group = getattr(module, "__cvops_dispatchers__", None)
        if group is None:
            module.__cvops_dispatchers__ = []  # never deferred from now on
        elif group:
            _hand_back(group)


def _hand_back(group: list) -> None:
    for dispatcher in group:
        dispatcher.__dict__.pop("_compile_for_args", None)
    group.clear()


def _not_ready(dispatcher, group: list, *args, **kwargs):
    types = tuple(dispatcher.typeof_pyval(a) for a in args)
    if kwargs:
        _, types = dispatcher.fold_argument_types(types, {k: dispatcher.typeof_pyval(v) for k, v in kwargs.items()})
    _queue(dispatcher, group, types, functools.partial(dispatcher.compile, types))


def compile_elsewhere(dispatcher, types: tuple, compile_now: Callable[[], None]) -> None:
    """For kernels compiled explicitly before their call (with LLVM settings of their own, see
    ``jit_intrinsics``): where ``dispatcher``'s compilation is deferred and this is not the worker, queue
    ``compile_now`` for the worker and raise :class:`KernelNotReady`; otherwise return, and the caller
    compiles."""
    deferred = vars(dispatcher).get("_compile_for_args")  # the partial of _defer_compilation: (dispatcher, group)
    if deferred is not None and threading.current_thread() is not _worker.thread:
        _queue(dispatcher, deferred.args[1], types, compile_now)


def _queue(dispatcher, group: list, types: tuple, compile_now: Callable[[], None]):
    _worker.submit(("compile", id(dispatcher), types), functools.partial(_compile, group, compile_now))
    raise KernelNotReady(f"{dispatcher.py_func.__qualname__}{types}")


def _compile(group: list, compile_now: Callable[[], None]) -> None:
    """Compile (or load from numba's cache) one signature; numba's ``compile`` takes its compiler lock and
    compiles the callees the kernel needs."""
    if not group:
        return  # handed back meanwhile: the calling thread compiles
    try:
        compile_now()
    except Exception:
        _hand_back(group)  # the calling thread compiles it again and raises the error where it belongs
