"""Async client for OpenAI-compatible Chat Completions servers (OpenAI, vLLM, llama.cpp, Ollama, the simulator).

::

    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig

    with LLMClient(LLMConfig.from_env()) as client:                 # sync callers
        results = client.complete_many_sync([messages1, messages2])
    async with LLMClient(config) as client:                          # async callers
        result = await client.complete(messages, n=6)

Every call returns a :class:`Completion` or an :class:`LLMFailure`; server
trouble never raises, so a caller can fall back to KG-only answers.

* **Retries** are done here (the ``openai`` package's own are off, so they are
  counted and bounded): on 429, 5xx, connection errors and timeouts, with
  exponential backoff and jitter, honouring a 429's ``Retry-After``; never on
  other 4xx.
* **Concurrency**: at most ``config.concurrency`` HTTP requests in flight.
* **Budget**: ``config.budget_calls`` HTTP requests and ``config.budget_tokens``
  tokens per client; once spent every further request is an
  ``LLMFailure(reason="budget")``.  Cache hits are free.
* **n > 1 on servers that ignore it** (llama.cpp's server returns one choice):
  the missing samples are requested one by one, sample ``j`` with ``seed=j``
  so that they differ and replay identically; the client then remembers that
  the server ignores ``n``.
* **response_format on servers that reject it**: a request with a
  ``response_format`` answered HTTP 400/422 is sent once more without it; when
  that succeeds the client remembers that the server rejects it and drops it
  from later requests (``stats.response_format_fallbacks`` counts them).
* **Cache**: complete responses are stored in SQLite (:mod:`llm_bridge.cache`)
  keyed by model + messages + parameters; a hit needs no server.
* **Secrets**: the API key is never logged, and is scrubbed from failure
  messages (servers sometimes echo it).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Mapping, NamedTuple, Sequence, TypeVar

from kgreason.errors import UserError

from .cache import ResponseCache, request_key
from .config import LLMConfig

__all__ = ["LLMClient", "Completion", "LLMFailure", "LLMStats", "TokenLogprob", "Messages", "FAILURE_REASONS"]

log = logging.getLogger(__name__)

Messages = Sequence[Mapping[str, str]]
T = TypeVar("T")

#: Why a request produced no completion.
FAILURE_REASONS = ("budget", "timeout", "connection", "server_error", "rate_limited", "bad_request", "bad_response")
#: Version of the cached value layout; part of every cache key so an incompatible layout is a miss.
_CACHE_FORMAT = 1
_OPENAI_URL = "https://api.openai.com/v1"


class TokenLogprob(NamedTuple):
    """One generated token and its natural-log probability."""

    token: str
    logprob: float


@dataclass(frozen=True)
class Completion:
    """The samples of one prompt.

    ``texts[i]`` is choice ``i``'s message content ("" when the server sent
    none); ``logprobs[i]`` its tokens with log-probabilities, or None where the
    server returned none.  ``len(texts)`` may be below ``n_requested`` only
    when some follow-up samples failed (``partial``); such completions are not
    cached.  ``requests`` counts HTTP requests made for it (0 for a cache hit).
    """

    texts: tuple[str, ...]
    logprobs: tuple[tuple[TokenLogprob, ...] | None, ...]
    finish_reasons: tuple[str | None, ...]
    prompt_tokens: int
    completion_tokens: int
    model: str
    n_requested: int
    cached: bool = False
    requests: int = 0
    latency_s: float = 0.0
    partial: bool = False

    ok = True

    @property
    def n(self) -> int:
        return len(self.texts)

    @property
    def has_logprobs(self) -> bool:
        return any(lp is not None for lp in self.logprobs)

    def to_json(self) -> dict[str, Any]:
        return {
            "texts": list(self.texts),
            "logprobs": [None if lp is None else [[t.token, t.logprob] for t in lp] for lp in self.logprobs],
            "finish_reasons": list(self.finish_reasons),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "model": self.model,
            "n_requested": self.n_requested,
            "cached": self.cached,
            "requests": self.requests,
            "latency_s": self.latency_s,
            "partial": self.partial,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, cached: bool | None = None) -> "Completion":
        return cls(
            texts=tuple(d["texts"]),
            logprobs=tuple(None if lp is None else tuple(TokenLogprob(str(t), float(p)) for t, p in lp)
                           for lp in d["logprobs"]),
            finish_reasons=tuple(d["finish_reasons"]),
            prompt_tokens=int(d["prompt_tokens"]),
            completion_tokens=int(d["completion_tokens"]),
            model=str(d["model"]),
            n_requested=int(d["n_requested"]),
            cached=bool(d.get("cached", False)) if cached is None else cached,
            requests=int(d.get("requests", 0)),
            latency_s=float(d.get("latency_s", 0.0)),
            partial=bool(d.get("partial", False)),
        )


@dataclass(frozen=True)
class LLMFailure:
    """No completion: ``reason`` is one of :data:`FAILURE_REASONS`; ``message`` never holds the API key."""

    reason: str
    message: str
    status: int | None = None
    attempts: int = 0

    ok = False

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "message": self.message, "status": self.status, "attempts": self.attempts}


@dataclass
class LLMStats:
    """Counters of one client (updated under a lock; read them after the calls finish).

    ``calls``: prompts asked (cache hits included); ``deduplicated``: prompts answered by an
    identical prompt already in flight (no request of their own);
    ``requests``: HTTP requests sent (retries and n-fallback samples included;
    this is what ``budget_calls`` limits); ``request_s``: summed request
    latency; ``wall_s``: time during which at least one call was running.
    """

    calls: int = 0
    cache_hits: int = 0
    deduplicated: int = 0
    requests: int = 0
    retries: int = 0
    failures: int = 0
    budget_refusals: int = 0
    timeouts: int = 0
    n_fallback_requests: int = 0
    response_format_fallbacks: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated_token_requests: int = 0
    max_in_flight: int = 0
    request_s: float = 0.0
    wall_s: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["total_tokens"] = self.total_tokens
        d["request_s"] = round(self.request_s, 6)
        d["wall_s"] = round(self.wall_s, 6)
        return d


class _Attempt(NamedTuple):
    """The outcome of one HTTP request: a parsed response, or why not and whether to retry."""

    response: Any | None
    reason: str | None = None
    message: str = ""
    status: int | None = None
    retry_after: float | None = None


class _LoopState:
    """Per-event-loop resources: the openai client and the concurrency semaphore bind to a loop."""

    def __init__(self, config: LLMConfig) -> None:
        import openai

        self.openai = openai.AsyncOpenAI(
            api_key=config.effective_api_key,
            base_url=config.base_url or _OPENAI_URL,
            max_retries=0,  # retries are ours: counted, bounded and logged without secrets
            timeout=config.timeout_s,
        )
        self.semaphore = asyncio.Semaphore(config.concurrency)


class LLMClient:
    """Chat Completions with caching, bounded concurrency, retries and a budget (see the module docstring).

    Args:
        config: the :class:`~llm_bridge.config.LLMConfig`.
        cache: a :class:`~llm_bridge.cache.ResponseCache` to share between
            clients; by default one is opened at ``config.cache_path`` when
            ``config.use_cache`` (and closed with the client).
        rng: jitter source for retry delays (tests pass a seeded one).
    """

    def __init__(self, config: LLMConfig, *, cache: ResponseCache | None = None,
                 rng: random.Random | None = None) -> None:
        if importlib.util.find_spec("openai") is None:
            raise UserError("the LLM bridge needs the 'openai' package: pip install -e \".[llm]\"")
        self.config = config
        self.stats = LLMStats()
        self._own_cache = cache is None and config.use_cache
        self.cache: ResponseCache | None = cache if cache is not None else (
            ResponseCache(config.cache_path) if config.use_cache else None)
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._states: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        # Per loop: public calls running now.  An HTTP client outlives a call only on a loop that
        # is "pinned" (the sync API's own loop, or one where `async with client` was entered), so
        # `asyncio.run(client.complete(...))` per call leaves no connection bound to a dead loop.
        self._depth: dict[asyncio.AbstractEventLoop, int] = {}
        self._pinned: set[asyncio.AbstractEventLoop] = set()
        self._pending: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Future] = {}
        self._in_flight = 0
        self._active_calls = 0
        self._active_since = 0.0
        self._budget_spent: str | None = None
        #: Set once a server answered n > 1 with fewer choices: later prompts go out as n single requests.
        self.server_ignores_n = False
        #: Set once a server answered a request with ``response_format`` 400/422 and the same request without it.
        self.server_rejects_response_format = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
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
        server could not be used (budget spent, timeouts, errors).
        """
        self._check_open()
        async with self._loop_scope():
            return await self._complete(messages, n=n, temperature=temperature, response_format=response_format)

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
                if hit is not None:
                    try:
                        completion = Completion.from_json(hit, cached=True)
                    except (KeyError, TypeError, ValueError):
                        completion = None  # an unreadable entry is a miss; the fresh response overwrites it
                    if completion is not None:
                        with self._lock:
                            self.stats.cache_hits += 1
                        return dataclasses.replace(completion, requests=0, latency_s=0.0)
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
                result = await self._sample(params, n)
                if self.cache is not None and isinstance(result, Completion) and not result.partial:
                    self.cache.put(key, result.to_json(), model=cfg.model, request={"n": n, **params})
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

    async def complete_many(self, batch: Sequence[Messages], *, n: int | None = None,
                            temperature: float | None = None,
                            response_format: Mapping[str, Any] | None = None) -> "list[Completion | LLMFailure]":
        """:meth:`complete` for every element of ``batch``, concurrently; results in input order."""
        self._check_open()
        batch = list(batch)
        for i, messages in enumerate(batch):
            try:
                _check_messages(messages)
            except ValueError as exc:
                raise ValueError(f"batch[{i}]: {exc}") from None
        async with self._loop_scope():
            coros = [self._complete(m, n=n, temperature=temperature, response_format=response_format) for m in batch]
            return list(await asyncio.gather(*coros))

    def complete_sync(self, messages: Messages, **kwargs: Any) -> "Completion | LLMFailure":
        """:meth:`complete` for callers without an event loop."""
        self._check_open()
        return self._run_sync(self.complete(messages, **kwargs))

    def complete_many_sync(self, batch: Sequence[Messages], **kwargs: Any) -> "list[Completion | LLMFailure]":
        """:meth:`complete_many` for callers without an event loop (may be called any number of times)."""
        self._check_open()
        return self._run_sync(self.complete_many(batch, **kwargs))

    @property
    def budget_spent(self) -> bool:
        """True once the call or token budget refused a request."""
        return self._budget_spent is not None

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the HTTP clients, the background loop (if the sync API started one) and an owned cache."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None and self._thread is not None:
            states = [s for loop, s in self._states.items() if loop is self._loop]
            if states:
                fut = asyncio.run_coroutine_threadsafe(_close_states(states), self._loop)
                try:
                    fut.result(timeout=10)
                except Exception:  # closing is best effort; the process may be shutting down
                    pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
            self._loop = self._thread = None
        self._states.clear()
        if self._own_cache and self.cache is not None:
            self.cache.close()

    async def aclose(self) -> None:
        """Async :meth:`close`: also closes the HTTP client bound to the running loop."""
        loop = asyncio.get_running_loop()
        self._pinned.discard(loop)
        state = self._states.pop(loop, None)
        if state is not None:
            await _close_states([state])
        self.close()

    def __enter__(self) -> "LLMClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "LLMClient":
        self._pinned.add(asyncio.get_running_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("LLMClient is closed")

    def _run_sync(self, coro: Awaitable[T]) -> T:
        self._check_open()
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    self._pinned.add(loop)
                    loop.run_forever()

                thread = threading.Thread(target=run, name="llm-client-loop", daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
        if threading.current_thread() is self._thread:
            raise RuntimeError("the sync LLM API cannot be called from inside its own event loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def _loop_scope(self) -> AsyncIterator[None]:
        """Count public calls per loop; the last one out closes the loop's HTTP client unless the loop is pinned."""
        loop = asyncio.get_running_loop()
        self._depth[loop] = self._depth.get(loop, 0) + 1
        try:
            yield
        finally:
            self._depth[loop] -= 1
            if self._depth[loop] == 0:
                del self._depth[loop]
                if loop not in self._pinned:
                    state = self._states.pop(loop, None)
                    if state is not None:
                        await _close_states([state])

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            # Loops that ended (asyncio.run per call) take their HTTP clients with them.
            for old in [lp for lp in self._states if lp.is_closed()]:
                del self._states[old]
            state = self._states[loop] = _LoopState(self.config)
        return state

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

    def _reserve_request(self) -> str | None:
        """Count one HTTP request against the budget; the reason it is refused, or None."""
        cfg = self.config
        with self._lock:
            if self._budget_spent is None:
                if cfg.budget_calls is not None and self.stats.requests >= cfg.budget_calls:
                    self._budget_spent = f"call budget of {cfg.budget_calls} requests spent"
                elif cfg.budget_tokens is not None and self.stats.total_tokens >= cfg.budget_tokens:
                    self._budget_spent = f"token budget of {cfg.budget_tokens} tokens spent"
            if self._budget_spent is not None:
                self.stats.budget_refusals += 1
                return self._budget_spent
            self.stats.requests += 1
            return None

    async def _sample(self, params: dict[str, Any], n: int) -> "Completion | LLMFailure":
        """``n`` choices: one request with ``n``, topped up by single requests when the server ignores ``n``."""
        t0 = time.perf_counter()
        pieces: list[Any] = []
        requests = 0
        if not (self.server_ignores_n and n > 1):
            first, attempts = await self._request({**params, "n": n})
            requests += attempts
            if isinstance(first, LLMFailure):
                return first
            pieces.append(first)
        have = sum(len(p.choices) for p in pieces)
        if have < n:
            if pieces and n > 1 and not self.server_ignores_n:
                log.info("server returned %d of %d choices; requesting the rest one by one", have, n)
                self.server_ignores_n = True
            # Sample j carries seed=j (sample 0 none) so the samples differ yet replay identically.
            extra = [self._request({**params, "n": 1, **({"seed": j} if j else {})}) for j in range(have, n)]
            with self._lock:
                self.stats.n_fallback_requests += len(extra) if pieces else len(extra) - 1
            outcomes = await asyncio.gather(*extra)
            failures = []
            for resp, attempts in outcomes:
                requests += attempts
                if isinstance(resp, LLMFailure):
                    failures.append(resp)
                else:
                    pieces.append(resp)
            if not pieces:
                return failures[0]
        choices = [c for p in pieces for c in sorted(p.choices, key=lambda c: c.index or 0)][:n]
        if not choices:
            return LLMFailure("bad_response", "the server returned no choices", attempts=requests)
        texts = tuple((c.message.content or "") if c.message is not None else "" for c in choices)
        logprobs = tuple(_choice_logprobs(c) for c in choices)
        prompt_tokens = sum(_usage(p)[0] for p in pieces)
        completion_tokens = sum(_usage(p)[1] for p in pieces)
        return Completion(
            texts=texts,
            logprobs=logprobs,
            finish_reasons=tuple(c.finish_reason for c in choices),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            model=str(pieces[0].model or params["model"]),
            n_requested=n,
            cached=False,
            requests=requests,
            latency_s=time.perf_counter() - t0,
            partial=len(choices) < n,
        )

    async def _request(self, params: dict[str, Any]) -> "tuple[Any | LLMFailure, int]":
        """One logical request with retries: (response or failure, HTTP requests made)."""
        cfg = self.config
        attempts = 0
        if self.server_rejects_response_format and "response_format" in params:
            params = {k: v for k, v in params.items() if k != "response_format"}
            with self._lock:
                self.stats.response_format_fallbacks += 1
        while True:
            refused = self._reserve_request()
            if refused is not None:
                return LLMFailure("budget", refused, attempts=attempts), attempts
            attempts += 1
            outcome = await self._attempt(params)
            if outcome.response is not None:
                return outcome.response, attempts
            if outcome.status in (400, 422) and "response_format" in params:
                # Perhaps a server without JSON-constrained output: ask once more without it.
                params = {k: v for k, v in params.items() if k != "response_format"}
                log.info("LLM request with response_format refused (%s); asking again without it", outcome.message)
                resp, more = await self._request(params)
                if not isinstance(resp, LLMFailure):
                    with self._lock:
                        if not self.server_rejects_response_format:
                            log.warning("the LLM server rejects response_format (%s); sending requests without it",
                                        outcome.message)
                        self.server_rejects_response_format = True
                        self.stats.response_format_fallbacks += 1
                return resp, attempts + more
            retryable = outcome.reason in ("timeout", "connection", "server_error", "rate_limited")
            if not retryable or attempts > cfg.max_retries:
                with self._lock:
                    self.stats.failures += 1
                log.info("LLM request failed after %d attempt(s): %s", attempts, outcome.message)
                return LLMFailure(outcome.reason or "bad_response", outcome.message, outcome.status, attempts), attempts
            delay = min(cfg.max_backoff_s, cfg.backoff_s * (2 ** (attempts - 1)) * (0.5 + self._rng.random()))
            if outcome.retry_after is not None:
                delay = min(cfg.max_backoff_s, max(delay, outcome.retry_after))
            with self._lock:
                self.stats.retries += 1
            log.info("LLM request attempt %d: %s; retrying in %.2f s", attempts, outcome.message, delay)
            await asyncio.sleep(delay)

    async def _attempt(self, params: dict[str, Any]) -> _Attempt:
        import openai

        cfg = self.config
        state = self._state()
        async with state.semaphore:
            with self._lock:
                self._in_flight += 1
                self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
            t0 = time.perf_counter()
            try:
                # A hard deadline over the whole request: httpx's timeouts are per read, and a
                # server that trickles bytes would never trip them.
                resp = await asyncio.wait_for(state.openai.chat.completions.create(**params), cfg.timeout_s)
            except (TimeoutError, openai.APITimeoutError):
                with self._lock:
                    self.stats.timeouts += 1
                return _Attempt(None, "timeout", f"no response within {cfg.timeout_s:g} s")
            except openai.APIConnectionError as exc:
                return _Attempt(None, "connection", self._scrub(f"connection error: {exc}"))
            except openai.APIStatusError as exc:
                status = int(exc.status_code)
                reason = "rate_limited" if status == 429 else "server_error" if status >= 500 else "bad_request"
                return _Attempt(None, reason, self._scrub(f"HTTP {status}: {_short(exc.message)}"), status,
                                _retry_after(exc) if status == 429 else None)
            except (openai.APIResponseValidationError, json.JSONDecodeError, ValueError) as exc:
                return _Attempt(None, "bad_response", self._scrub(f"unreadable response: {_short(str(exc))}"))
            finally:
                with self._lock:
                    self._in_flight -= 1
                    self.stats.request_s += time.perf_counter() - t0
        if not hasattr(resp, "choices") or resp.choices is None:
            return _Attempt(None, "bad_response", "response has no 'choices'")
        p, c = _usage(resp)
        with self._lock:
            self.stats.prompt_tokens += p
            self.stats.completion_tokens += c
            if getattr(resp, "usage", None) is None:
                self.stats.estimated_token_requests += 1
        return _Attempt(resp)

    def _scrub(self, text: str) -> str:
        key = self.config.api_key
        if key:
            text = text.replace(key, "***")
            if len(key) > 12:  # servers echo keys partly masked, e.g. "sk-abc...wxyz"
                text = text.replace(key[:8], "***").replace(key[-4:], "***")
        return text


# ---------------------------------------------------------------------------------------- helpers
def _check_messages(messages: Messages) -> list[dict[str, str]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} mappings")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be a mapping with string 'role' and 'content', got {m!r}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _choice_logprobs(choice: Any) -> tuple[TokenLogprob, ...] | None:
    lp = getattr(choice, "logprobs", None)
    content = getattr(lp, "content", None) if lp is not None else None
    if not content:
        return None
    return tuple(TokenLogprob(str(t.token), float(t.logprob)) for t in content)


def _usage(resp: Any) -> tuple[int, int]:
    """(prompt, completion) tokens; estimated at 4 characters a token when the server reports none."""
    usage = getattr(resp, "usage", None)
    if usage is not None and usage.prompt_tokens is not None:
        return int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)
    chars = sum(len((c.message.content or "") if c.message else "") for c in resp.choices or [])
    return 0, (chars + 3) // 4


def _retry_after(exc: Any) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return max(0.0, float(value)) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _close_states(states: list[_LoopState]) -> None:
    for s in states:
        await s.openai.close()
