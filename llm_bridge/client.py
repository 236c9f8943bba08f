"""Async client for OpenAI-compatible Chat Completions servers (OpenAI, vLLM, llama.cpp, Ollama, the simulator).

::

    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig

    with LLMClient(LLMConfig.from_env()) as client:                 # sync callers (the client's own event loop)
        results = client.complete_many_sync([messages1, messages2])
    async with LLMClient(config) as client:                          # async callers
        result = await client.complete(messages, n=6)

Every call returns a :class:`Completion` or an :class:`LLMFailure`; server
trouble never raises, so a caller can fall back to KG-only answers.

* **HTTP** is the ``openai`` package's ``AsyncOpenAI`` through its public API only
  (:mod:`llm_bridge.client_http`): ``max_retries=0`` and the per-attempt ``timeout``,
  with an ``http_client`` whose response event hook counts the server's responses.
  The retries are the client's own loop over public calls: it counts every attempt
  (retries, the call budget), retries what the SDK would (408, 409, 429, 5xx,
  connection errors, timeouts; never other 4xx) and waits ``backoff_s``/``max_backoff_s``
  with jitter, honouring a ``Retry-After`` up to ``max_backoff_s``.
* **Deadline**: one call (:meth:`LLMClient.complete`, :meth:`LLMClient.complete_many`
  and their sync forms) takes at most ``config.deadline_s``, retries and backoff
  included; prompts unanswered by then are ``LLMFailure(reason="timeout")``.
  While a call waits longer than a second a progress bar runs on stderr.
* **Replies are validated** against a schema of the Chat Completions reply
  (pydantic, on the raw JSON): anything else -- not JSON, no or malformed
  ``choices``, non-string ``content``, non-numeric ``usage``, a body over
  ``config.max_response_bytes`` -- is ``LLMFailure(reason="bad_response")`` and is
  never cached.
* **Untrusted text**: every text from the server (completions, model name,
  error messages) has the API key scrubbed (keys of 8 or more characters, also
  echoed partly masked) and control characters / ANSI
  escapes removed (:func:`llm_bridge.text.clean_text`) before it is returned,
  logged or cached.
* **Concurrency**: at most ``config.concurrency`` requests in flight.
* **Budget**: ``config.budget_calls`` HTTP requests and ``config.budget_tokens``
  tokens per client; once spent every further request is an
  ``LLMFailure(reason="budget")``.  Cache hits are free.
* **De-duplication** (the bridge's one layer: the LGOT hook passes its prompts as they are):
  identical prompts (same model, messages and parameters) are asked once per client: later ones wait for the one in flight or reuse its completion (an in-memory map of
  the last :data:`MEMO_SIZE` completions).
* **n > 1 on servers that ignore it** (llama.cpp's server returns one choice):
  the missing samples are requested one by one, sample ``j`` with ``seed=j``
  so that they differ and replay identically; the client then remembers that
  the server ignores ``n``.
* **response_format on servers that reject it**: a request with a
  ``response_format`` answered HTTP 400/422 is sent once more without it; when
  that succeeds the client remembers that the server rejects it and drops it
  from later requests (``stats.response_format_fallbacks`` counts them).
* **Cache**: complete responses are stored in SQLite (:mod:`llm_bridge.cache`)
  keyed by model + messages + parameters; a hit needs no server.  A read-only
  cache serves its hits; misses are asked and not stored (one warning).
* **Secrets**: the API key is never logged, printed or stored.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib.util
import logging
import random
import sys
import threading
import time
from typing import Any, Awaitable, Callable, Iterator, Mapping, Sequence, TypeVar

from kgreason.errors import UserError

from .cache import ResponseCache, request_key
from .client_http import Transport, reply_model
from .client_sampling import Sampler
from .client_types import FAILURE_REASONS, Completion, LLMFailure, LLMStats, Messages, ServerText, TokenLogprob
from .config import LLMConfig
from .text import clean_text

__all__ = ["LLMClient", "Completion", "LLMFailure", "LLMStats", "TokenLogprob", "Messages", "FAILURE_REASONS",
           "MEMO_SIZE", "clean_text"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Version of the cached value layout; part of every cache key so an incompatible layout is a miss.
_CACHE_FORMAT = 1
#: Completions a client keeps in memory for identical prompts asked again (across batches).
MEMO_SIZE = 10_000
#: A call waiting longer than this shows a progress bar on stderr.
_PROGRESS_AFTER_S = 1.0


class LLMClient:
    """Chat Completions with caching, bounded concurrency, retries, a deadline and a budget (see the module docstring).

    Args:
        config: the :class:`~llm_bridge.config.LLMConfig`.
        cache: a :class:`~llm_bridge.cache.ResponseCache` to share between
            clients; by default one is opened at ``config.cache_path`` when
            ``config.use_cache`` (and closed with the client).
        rng: jitter source for retry delays (tests pass a seeded one).
        progress: show a progress bar on stderr while a call waits longer than a
            second (default True).
    """

    def __init__(self, config: LLMConfig, *, cache: ResponseCache | None = None,
                 rng: random.Random | None = None, progress: bool = True) -> None:
        if importlib.util.find_spec("openai") is None:
            raise UserError("the LLM bridge needs the 'openai' package: pip install -e \".[llm]\"")
        import openai  # noqa: F401  the SDK's first import takes a second or more: now, not in a call's deadline

        reply_model()
        self.config = config
        self.stats = LLMStats()
        self.progress = progress
        self._own_cache = cache is None and config.use_cache
        self.cache: ResponseCache | None = cache if cache is not None else (
            ResponseCache(config.cache_path) if config.use_cache else None)
        self._lock = threading.Lock()
        #: Makes server text safe to return, log or cache (the key scrubbed, control characters removed).
        self._untrusted = ServerText(config.api_key)
        #: The HTTP side: SDK clients per event loop, attempts, backoff and the budget.
        self.transport = Transport(config, self.stats, self._lock, rng or random.Random(), self._untrusted)
        self._pending: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Future] = {}
        self._memo: collections.OrderedDict[str, Completion] = collections.OrderedDict()
        self._active_calls = 0
        self._active_since = 0.0
        self._warned_unstored = False
        self._scope_depth = 0  # deadline_scope() blocks open
        self._unresponsive = False  # inside a scope: a call ended at its deadline without any HTTP response
        #: What goes over the wire for one prompt: n samples and response_format, adapted to the server.
        self.sampler = Sampler(self.transport, self._untrusted)
        # The sync API's event loop (made on first use, reused so connections persist) and who holds it.
        self._runner: asyncio.Runner | None = None
        self._runner_lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"LLMClient(config={self.config!r})"

    # ------------------------------------------------------------------ public API
    async def complete(self, messages: Messages, *, n: int | None = None, temperature: float | None = None,
                       response_format: Mapping[str, Any] | None = None) -> "Completion | LLMFailure":
        """``n`` samples (default ``config.n``) of the chat ``messages``.

        ``messages`` is a list of ``{"role": ..., "content": ...}``;
        ``response_format`` is passed through (e.g. ``{"type": "json_object"}``).
        Returns a :class:`Completion`, or an :class:`LLMFailure` when the
        server could not be used (budget spent, timeouts, errors, the deadline).
        """
        self._check_open()
        _check_messages(messages)
        return (await self.complete_many([messages], n=n, temperature=temperature,
                                         response_format=response_format))[0]

    async def complete_many(self, batch: Sequence[Messages], *, n: int | None = None,
                            temperature: float | None = None,
                            response_format: "Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None" = None
                            ) -> "list[Completion | LLMFailure]":
        """:meth:`complete` for every element of ``batch``, concurrently; results in input order.

        ``response_format``: one mapping for every prompt, or a list of ``len(batch)`` mappings or
        None, one per prompt (e.g. JSON schemas naming each prompt's own candidates).
        The whole call takes at most ``config.deadline_s`` seconds.
        """
        self._check_open()
        batch = list(batch)
        for i, messages in enumerate(batch):
            try:
                _check_messages(messages)
            except ValueError as exc:
                raise ValueError(f"batch[{i}]: {exc}") from None
        formats = _per_prompt_formats(response_format, len(batch))
        if not batch:
            return []
        async with self.transport.loop_scope():
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.config.deadline_s
            responses_before = self.transport.responses
            done = [0]

            async def one(m: Messages, fmt: Mapping[str, Any] | None) -> "Completion | LLMFailure":
                try:
                    return await self._bounded(m, deadline, n=n, temperature=temperature, response_format=fmt)
                finally:
                    done[0] += 1

            ticker = loop.create_task(self._progress(done, len(batch))) if self.progress else None
            try:
                results = list(await asyncio.gather(*(one(m, f) for m, f in zip(batch, formats))))
                if self._scope_depth and not self._unresponsive and self.transport.responses == responses_before and any(
                        isinstance(r, LLMFailure) and r.reason == "timeout" for r in results):
                    log.warning("the LLM server did not respond (no HTTP response before the timeouts and the "
                                "--llm-deadline of %g s); the remaining LLM calls of this run are not made "
                                "(cache hits still count; other rows are KG-only)", self.config.deadline_s)
                    self._unresponsive = True
                return results
            finally:
                if ticker is not None:
                    ticker.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await ticker

    def complete_sync(self, messages: Messages, **kwargs: Any) -> "Completion | LLMFailure":
        """:meth:`complete` for callers without an event loop."""
        self._check_open()
        return self._run_sync(self.complete(messages, **kwargs))

    def complete_many_sync(self, batch: Sequence[Messages], **kwargs: Any) -> "list[Completion | LLMFailure]":
        """:meth:`complete_many` for callers without an event loop (may be called any number of times)."""
        self._check_open()
        return self._run_sync(self.complete_many(batch, **kwargs))

    @contextlib.contextmanager
    def deadline_scope(self) -> "Iterator[None]":
        """Inside the block, a server that let a call time out without any response is not asked again.

        Each call ends by ``config.deadline_s`` in any case.  Inside the block,
        once a call ended in timeouts (its requests', or the deadline) without a
        single HTTP response from the server (of any status), later prompts that
        are not cache hits fail at once with reason ``"timeout"`` (one warning
        line).  ``engine.answer --llm`` runs in one
        scope, so a server that never answers costs one ``--llm-deadline`` for
        the command, not one per stage; a slow server that does answer is
        unaffected.
        """
        self._scope_depth += 1
        try:
            yield
        finally:
            self._scope_depth -= 1
            if not self._scope_depth:
                self._unresponsive = False

    @property
    def server_ignores_n(self) -> bool:
        """True once a server answered n > 1 with fewer choices: later prompts go out as n single requests."""
        return self.sampler.server_ignores_n

    @property
    def server_rejects_response_format(self) -> bool:
        """True once a server refused a request with ``response_format`` (400/422) and answered it without."""
        return self.sampler.server_rejects_response_format

    @property
    def budget_spent(self) -> bool:
        """True once the call or token budget refused a request."""
        return self.transport.budget_spent is not None

    # ------------------------------------------------------------------ one prompt
    async def _bounded(self, messages: Messages, deadline: float, **kwargs: Any) -> "Completion | LLMFailure":
        """:meth:`_complete` cut off at ``deadline`` (the event loop's clock)."""
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            if remaining <= 0:
                raise asyncio.TimeoutError
            return await asyncio.wait_for(self._complete(messages, **kwargs), remaining)
        except asyncio.TimeoutError:
            with self._lock:
                self.stats.timeouts += 1
                self.stats.deadline_hits += 1
                self.stats.failures += 1
            return LLMFailure("timeout", f"no answer within the deadline of {self.config.deadline_s:g} s "
                                         "(--llm-deadline)")

    async def _complete(self, messages: Messages, *, n: int | None, temperature: float | None,
                        response_format: Mapping[str, Any] | None) -> "Completion | LLMFailure":
        msgs = _check_messages(messages)
        cfg = self.config
        n = cfg.n if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        temperature = cfg.temperature if temperature is None else float(temperature)
        params: dict[str, Any] = {
            "model": cfg.model,
            "messages": msgs,
            "temperature": temperature,
            "max_tokens": cfg.max_tokens,
        }
        if response_format is not None:
            params["response_format"] = dict(response_format)
        if cfg.logprobs:
            params["logprobs"] = True
        key = request_key({"format": _CACHE_FORMAT, "n": n, **params})
        self._enter_call()
        try:
            if self.cache is not None:
                hit = self.cache.get(key)
                completion = None
                if hit is not None:
                    try:
                        completion = self._untrusted.completion(Completion.from_json(hit, cached=True))
                    except (KeyError, TypeError, ValueError):
                        completion = None  # an unreadable entry is a miss; the fresh response overwrites it
                if completion is not None:
                    with self._lock:
                        self.stats.cache_hits += 1
                    return dataclasses.replace(completion, requests=0, latency_s=0.0)
                with self._lock:
                    self.stats.cache_misses += 1
            with self._lock:
                memo = self._memo.get(key)
                if memo is not None:
                    self._memo.move_to_end(key)
                    self.stats.deduplicated += 1
            if memo is not None:
                return dataclasses.replace(memo, requests=0, latency_s=0.0)
            if self._scope_depth and self._unresponsive:
                with self._lock:
                    self.stats.failures += 1
                    self.stats.timeouts += 1
                return LLMFailure("timeout", "not asked: the LLM server did not respond to an earlier call of this run")
            # The same prompt already on its way (a batch's rows often share one): wait for it.
            loop = asyncio.get_running_loop()
            pending = self._pending.get((loop, key))
            if pending is not None:
                try:
                    result = await asyncio.shield(pending)
                except asyncio.CancelledError:
                    if not pending.cancelled():
                        raise  # this call itself was cancelled
                    result = None  # the first asker was cancelled: ask ourselves
                if result is not None:
                    with self._lock:
                        self.stats.deduplicated += 1
                    return dataclasses.replace(result, requests=0, latency_s=0.0) \
                        if isinstance(result, Completion) else result
            future: asyncio.Future = loop.create_future()
            self._pending[(loop, key)] = future
            try:
                result = await self.sampler.sample(params, n)
                if isinstance(result, Completion) and not result.partial:
                    self._remember(key, result, params, n)
                future.set_result(result)
            except BaseException:
                future.cancel()  # waiters then ask on their own
                raise
            finally:
                if self._pending.get((loop, key)) is future:
                    del self._pending[(loop, key)]
            return result
        finally:
            self._exit_call()

    def _remember(self, key: str, result: "Completion", params: Mapping[str, Any], n: int) -> None:
        with self._lock:
            self._memo[key] = result
            self._memo.move_to_end(key)
            while len(self._memo) > MEMO_SIZE:
                self._memo.popitem(last=False)
        if self.cache is None:
            return
        stored = self.cache.put(key, result.to_json(), model=self.config.model, request={"n": n, **params})
        if not stored:
            with self._lock:
                self.stats.unstored += 1
                warn, self._warned_unstored = not self._warned_unstored, True
            if warn:
                log.warning("LLM cache %s is read-only: answers not in it are asked of the server and not stored",
                            self.cache.path)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the HTTP clients, the sync API's event loop (calls still on it, after a Ctrl-C, are cancelled
        first) and an owned cache."""
        if self._closed:
            return
        self._closed = True
        runner, self._runner = self._runner, None
        if runner is not None:
            def shut() -> None:
                try:
                    runner.run(_shutdown(self.transport))
                finally:
                    runner.close()

            try:
                _outside_any_loop(shut)
            except BaseException:  # closing is best effort; the process may be shutting down
                pass
        self.transport.forget()
        if self._own_cache and self.cache is not None:
            self.cache.close()

    async def aclose(self) -> None:
        """Async :meth:`close`: also closes the HTTP client bound to the running loop."""
        await self.transport.aclose_loop(asyncio.get_running_loop())
        self.close()

    def __enter__(self) -> "LLMClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "LLMClient":
        self.transport.pinned.add(asyncio.get_running_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _run_sync(self, coro: Awaitable[T]) -> T:
        """Run one public coroutine for a sync caller.

        The sync API needs the async machinery (``config.concurrency`` requests in flight, the deadline, the
        shared in-flight de-duplication), so it runs the coroutine on an event loop rather than on the SDK's
        sync ``OpenAI`` client.  The loop is the client's own ``asyncio.Runner``, reused across calls (the
        HTTP connections persist) and run in the caller's thread: a Ctrl-C cancels the call and surfaces as
        ``KeyboardInterrupt``, with nothing left running.  Where that loop cannot be used -- a loop already
        runs in this thread, or another thread is in a sync call -- the call gets a loop of its own.
        """
        self._check_open()
        if not asyncio.iscoroutine(coro):
            raise TypeError("a coroutine is required")
        if _loop_running_here() or not self._runner_lock.acquire(blocking=False):
            return _outside_any_loop(functools.partial(asyncio.run, coro))
        try:
            if self._runner is None:
                self._runner = asyncio.Runner()
                self.transport.pinned.add(self._runner.get_loop())
            return self._runner.run(coro)
        finally:
            self._runner_lock.release()

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("LLMClient is closed")

    async def _progress(self, done: list[int], total: int) -> None:
        """A progress bar on stderr once a call has waited :data:`_PROGRESS_AFTER_S`, refreshed every second."""
        await asyncio.sleep(_PROGRESS_AFTER_S)
        from kgreason.progress import progress_bar

        # counting from the prompts already done: a rate over them and a bar a moment old was nonsense
        bar = progress_bar(total=total, initial=done[0], desc="llm", unit="prompt", file=sys.stderr, leave=False,
                           mininterval=0.5)
        try:
            while True:
                bar.update(done[0] - bar.n)
                with self._lock:
                    retries = self.stats.retries
                bar.set_postfix_str(f"{retries} retries, deadline {self.config.deadline_s:g} s", refresh=False)
                bar.refresh()
                await asyncio.sleep(1.0)
        finally:
            bar.update(done[0] - bar.n)
            bar.close()

    def _enter_call(self) -> None:
        with self._lock:
            self.stats.calls += 1
            if self._active_calls == 0:
                self._active_since = time.perf_counter()
            self._active_calls += 1

    def _exit_call(self) -> None:
        with self._lock:
            self._active_calls -= 1
            if self._active_calls == 0:
                self.stats.wall_s += time.perf_counter() - self._active_since


# ---------------------------------------------------------------------------------------- helpers
def _per_prompt_formats(response_format: Any, size: int) -> list[Mapping[str, Any] | None]:
    """``complete_many``'s ``response_format`` as one entry per prompt (ValueError when it does not fit)."""
    if response_format is None or isinstance(response_format, Mapping):
        return [response_format] * size
    if isinstance(response_format, (str, bytes)) or not isinstance(response_format, Sequence):
        raise ValueError(f"response_format must be a mapping, a list of them or None, got {response_format!r}")
    formats = list(response_format)
    if len(formats) != size:
        raise ValueError(f"response_format has {len(formats)} entries for a batch of {size} prompts")
    for i, f in enumerate(formats):
        if f is not None and not isinstance(f, Mapping):
            raise ValueError(f"response_format[{i}] must be a mapping or None, got {f!r}")
    return formats


def _check_messages(messages: Messages) -> list[dict[str, str]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} mappings")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be a mapping with string 'role' and 'content', got {m!r}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _outside_any_loop(fn: Callable[[], T]) -> T:
    """``fn()``, in a helper thread when an event loop runs in this one (asyncio cannot nest loops)."""
    if not _loop_running_here():
        return fn()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llm-client") as pool:
        return pool.submit(fn).result()


async def _shutdown(transport: Transport) -> None:
    """Cancel the loop's other tasks (calls cut short by Ctrl-C), wait for them, close the loop's HTTP client."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    await transport.aclose_loop(asyncio.get_running_loop())
