"""A model call's set-up through LiteLLM, without the per-call work the app does not use (issue 38 item 2).

`litellm.acompletion` (litellm==1.110.2, pinned) does two things per call that cost a turn start time
and CPU and that the gateway (`core.chat.llm.LLMGateway.stream`) has no use for:

- It runs the sync `completion()` (provider routing, parameter mapping, the key, the request's
  Logging object) on the event loop's default executor (`loop.run_in_executor(None, ...)`), for every
  provider, because some providers' set-up does blocking I/O (fetching cloud credentials). For an
  OpenAI-compatible route with its key given there is none (about 1.5 ms of CPU): the hop to a
  thread and back cost about a tenth of a call's set-up CPU, and at 100 calls at once the
  executor's threads fought the event loop for the GIL. `quiet_call(..., setup_on_loop=True)` runs
  that one submission inline, on the loop, during the gateway's `await litellm.acompletion(...)`;
  LiteLLM's code path is otherwise the same (its routing, parameters, errors). Every other use of
  the default executor (`asyncio.to_thread`, DNS look-ups, another provider's set-up) still goes
  to its threads.
- It prices the stream wrapper it returns, at once, into `_hidden_params["response_cost"]`: a token
  count of the whole prompt and the price list's look-ups, about a fifth of a call's set-up CPU.
  Nothing reads it: the app prices a call from its usage at the end (`core.chat.prices`). While a
  gateway call is being set up (`quiet_call`), a stream's set-up cost is left unpriced (None, as
  LiteLLM leaves it for the openai SDK's own stream objects).

See docs/ARCHITECTURE.md, "The streaming hot path". This module does not import litellm: the
gateway hands it the module.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

__all__ = ["SetupExecutor", "install_quiet_metadata", "quiet_call"]


class _Call:
    """One gateway call being set up: whether its `completion()` may run on the loop (once)."""

    __slots__ = ("inline",)

    def __init__(self, inline: bool) -> None:
        self.inline = inline


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("llm_setup_call", default=None)
_EXECUTOR_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


class SetupExecutor(ThreadPoolExecutor):
    """The loop's default executor; runs LiteLLM's `completion()` inline when the gateway's call asks for it.

    `litellm_main` is the module `litellm.main`: `acompletion` submits its `completion` wrapped in
    `functools.partial(Context.run, functools.partial(completion, ...))`.
    """

    def __init__(self, litellm_main: Any) -> None:
        super().__init__(thread_name_prefix="asyncio")
        self.litellm_main = litellm_main

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run `fn` on a thread, or inline if it is the set-up of the current gateway call asking for that."""
        call = _CALL.get()
        if call is not None and call.inline and not args and not kwargs and self._is_setup(fn):
            call.inline = False  # one set-up per call: anything else it submits goes to a thread
            future: Future[Any] = Future()
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller, as a thread's would be
                future.set_exception(exc)
            return future
        return super().submit(fn, *args, **kwargs)

    def _is_setup(self, fn: Callable[..., Any]) -> bool:
        if not isinstance(fn, functools.partial) or len(fn.args) != 1:
            return False
        inner = fn.args[0]
        return isinstance(inner, functools.partial) and inner.func is self.litellm_main.completion


def _use_setup_executor(loop: asyncio.AbstractEventLoop, litellm_main: Any) -> None:
    """Make `loop`'s default executor a `SetupExecutor` (once per loop); the one it had finishes its work."""
    if loop in _EXECUTOR_LOOPS:
        return
    previous = getattr(loop, "_default_executor", None)  # asyncio's own attribute; None until first used
    loop.set_default_executor(SetupExecutor(litellm_main))
    if isinstance(previous, ThreadPoolExecutor):
        previous.shutdown(wait=False)  # its queued calls still run; its threads then end
    _EXECUTOR_LOOPS.add(loop)


@contextmanager
def quiet_call(litellm: Any, *, setup_on_loop: bool) -> Iterator[None]:
    """Around one gateway `await litellm.acompletion(...)`: its stream left unpriced at set-up.

    With `setup_on_loop`, its `completion()` runs on the event loop: only for a provider whose set-up does
    no blocking I/O (an OpenAI-compatible route with its key given).
    """
    if setup_on_loop:
        _use_setup_executor(asyncio.get_running_loop(), litellm.main)
    token = _CALL.set(_Call(setup_on_loop))
    try:
        yield
    finally:
        _CALL.reset(token)


def install_quiet_metadata(litellm: Any) -> None:
    """Leave a gateway call's stream unpriced at set-up (the module docstring); other calls are unchanged.

    Wraps `litellm.utils.update_response_metadata`, which `acompletion`'s decorator looks up at every call.
    """
    utils = litellm.utils
    original = utils.update_response_metadata
    if getattr(original, "_quiet_stream_cost", False):
        return
    stream_wrapper = litellm.CustomStreamWrapper

    @functools.wraps(original)
    def update_response_metadata(result: Any, logging_obj: Any, *args: Any, **kwargs: Any) -> Any:
        if _CALL.get() is None or not isinstance(result, stream_wrapper) or logging_obj is None:
            return original(result, logging_obj, *args, **kwargs)
        logging_obj.response_cost_calculator = _unpriced  # this call's object only, for this step only
        try:
            return original(result, logging_obj, *args, **kwargs)
        finally:
            del logging_obj.response_cost_calculator

    update_response_metadata._quiet_stream_cost = True  # type: ignore[attr-defined]
    utils.update_response_metadata = update_response_metadata


def _unpriced(*_args: Any, **_kwargs: Any) -> None:
    return None
