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

* **HTTP** is the ``openai`` package's ``AsyncOpenAI``, with its own retries
  (``max_retries``: 408, 409, 429, 5xx, connection errors, timeouts; never
  other 4xx) and per-attempt ``timeout``.  Two of its hooks are used: the
  per-attempt request hook counts attempts (retries, the call budget) and the
  backoff hook applies ``backoff_s``/``max_backoff_s`` with jitter, honouring a
  429's ``Retry-After`` up to ``max_backoff_s``.
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
* **De-duplication**: identical prompts (same model, messages and parameters)
  are asked once per client: later ones wait for the one in flight or reuse
  its completion (an in-memory map of the last :data:`MEMO_SIZE` completions).
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
import contextlib
import contextvars
import dataclasses
import functools
import importlib.util
import logging
import math
import random
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Iterator, Mapping, NamedTuple, Sequence, TypeVar

from kgreason.errors import UserError
from kgreason.files import loads_json

from .cache import ResponseCache, request_key
from .config import LLMConfig
from .text import clean_text

__all__ = ["LLMClient", "Completion", "LLMFailure", "LLMStats", "TokenLogprob", "Messages", "FAILURE_REASONS",
           "MEMO_SIZE", "clean_text"]

log = logging.getLogger(__name__)

Messages = Sequence[Mapping[str, str]]
T = TypeVar("T")

#: Why a request produced no completion.
FAILURE_REASONS = ("budget", "timeout", "connection", "server_error", "rate_limited", "bad_request", "bad_response")
#: Version of the cached value layout; part of every cache key so an incompatible layout is a miss.
_CACHE_FORMAT = 1
_OPENAI_URL = "https://api.openai.com/v1"
#: Completions a client keeps in memory for identical prompts asked again (across batches).
MEMO_SIZE = 10_000
#: Shorter API keys are placeholders (local servers take any key) and are not scrubbed from server text.
_MIN_SECRET_CHARS = 8
#: A call waiting longer than this shows a progress bar on stderr.
_PROGRESS_AFTER_S = 1.0


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
            logprobs=tuple(None if lp is None else tuple(TokenLogprob(str(t), _finite(p)) for t, p in lp)
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
    """No completion: ``reason`` is one of :data:`FAILURE_REASONS`; ``message`` never holds the API key
    (one of 8 or more characters: shorter ones are placeholders, see ``LLMClient._scrub``)."""

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
    identical prompt in flight or asked earlier by this client (no request of their own);
    ``cache_misses``: cache lookups that found nothing; ``unstored``: completions a
    read-only cache could not keep; ``requests``: HTTP requests sent (retries and
    n-fallback samples included; this is what ``budget_calls`` limits);
    ``retries``: requests beyond the first of a logical request; ``timeouts``: logical
    requests that failed with a timeout, and prompts cut off by the deadline
    (``deadline_hits`` counts the latter alone); ``request_s``: summed latency of
    logical requests; ``wall_s``: time during which at least one call was running.
    """

    calls: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    unstored: int = 0
    deduplicated: int = 0
    requests: int = 0
    retries: int = 0
    failures: int = 0
    budget_refusals: int = 0
    timeouts: int = 0
    deadline_hits: int = 0
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
    """The outcome of one logical request (the SDK's retries inside): a validated reply, or why not."""

    reply: Any | None
    attempts: int
    reason: str | None = None
    message: str = ""
    status: int | None = None


class _Record:
    """HTTP attempts of one logical request, counted by the SDK's per-attempt hook."""

    __slots__ = ("attempts",)

    def __init__(self) -> None:
        self.attempts = 0


#: The logical request the running task is making (the SDK calls its hooks inside that task).
_CURRENT: contextvars.ContextVar[_Record | None] = contextvars.ContextVar("kgreason_llm_request", default=None)


class _BudgetRefused(Exception):
    """Raised by the per-attempt hook when the budget refuses the next HTTP request (never retried)."""


class _TooLarge(Exception):
    pass


@functools.lru_cache(maxsize=None)
def _sdk_client_class() -> type:
    """``openai.AsyncOpenAI`` with the client's per-attempt hook and backoff (built on first use)."""
    import openai

    class _SDKClient(openai.AsyncOpenAI):
        _kg_owner: "LLMClient"

        async def _prepare_request(self, request: Any) -> None:  # once per HTTP attempt, retries included
            await super()._prepare_request(request)
            owner = self._kg_owner
            refused = owner._reserve_request()
            if refused is not None:
                raise _BudgetRefused(refused)
            rec = _CURRENT.get()
            if rec is not None:
                rec.attempts += 1
                if rec.attempts > 1:
                    with owner._lock:
                        owner.stats.retries += 1

        def _calculate_retry_timeout(self, remaining_retries: int, options: Any, response_headers: Any = None) -> float:
            cfg = self._kg_owner.config
            if response_headers is not None:  # a retried HTTP error status: the server does respond
                self._kg_owner._responses += 1
            retry = max(0, cfg.max_retries - remaining_retries)
            delay = min(cfg.max_backoff_s, cfg.backoff_s * (2 ** min(retry, 60)) * (0.5 + self._kg_owner._rng.random()))
            try:
                after = self._parse_retry_after_header(response_headers)
            except Exception:  # a malformed header is no instruction
                after = None
            if after is not None and after == after and after > 0:
                delay = min(cfg.max_backoff_s, max(delay, after))
            return delay

    return _SDKClient


@functools.lru_cache(maxsize=None)
def _reply_model() -> type:
    """The pydantic model of a Chat Completions reply: only what the client reads, strictly typed."""
    from typing import Annotated

    from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

    class _Base(BaseModel):
        model_config = ConfigDict(extra="ignore", frozen=True)

    class TokenLP(_Base):
        token: StrictStr
        # NaN or +inf would become a confidence of 1 (parse.logprob_confidence clips at 0 before exp).
        logprob: Annotated[StrictFloat, Field(allow_inf_nan=False)] | StrictInt

    class Logprobs(_Base):
        content: list[TokenLP] | None = None

    class Message(_Base):
        content: StrictStr

    class Choice(_Base):
        index: StrictInt | None = None
        message: Message
        finish_reason: StrictStr | None = None
        logprobs: Logprobs | None = None

    class Usage(_Base):
        prompt_tokens: StrictInt | None = Field(default=None, ge=0)
        completion_tokens: StrictInt | None = Field(default=None, ge=0)

    class Reply(_Base):
        choices: list[Choice] = Field(min_length=1)
        model: StrictStr | None = None
        usage: Usage | None = None

    return Reply


def _parse_reply(body: bytes) -> tuple[Any | None, str]:
    """(validated reply, "") or (None, what is wrong with ``body``)."""
    from pydantic import ValidationError

    try:
        data = loads_json(body.decode("utf-8"))  # bounded: a body nested 100,000 deep was a RecursionError
    except (UnicodeDecodeError, ValueError):
        head = body[:60].decode("utf-8", "replace")
        return None, f"not JSON (starts {head!r})"
    if not isinstance(data, dict):
        return None, f"a JSON {type(data).__name__}, not an object"
    try:
        return _reply_model().model_validate(data), ""
    except ValidationError as exc:
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ())) or "reply"
        return None, f"not a chat completion ({where}: {first.get('msg', 'invalid')}; {len(errs)} error(s))"


async def _read_capped(raw: Any, limit: int) -> bytes:
    """The body of the SDK's streamed response, refusing more than ``limit`` bytes."""
    declared = raw.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge(f"the server announced {int(declared):,} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in raw.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise _TooLarge(f"more than {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class _LoopState:
    """Per-event-loop resources: the openai client and the concurrency semaphore bind to a loop."""

    def __init__(self, owner: "LLMClient") -> None:
        config = owner.config
        self.openai = _sdk_client_class()(
            api_key=config.effective_api_key,
            base_url=config.base_url or _OPENAI_URL,
            max_retries=config.max_retries,
            timeout=config.timeout_s,
        )
        self.openai._kg_owner = owner
        self.semaphore = asyncio.Semaphore(config.concurrency)


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
        _sdk_client_class()  # import the SDK now: its first import takes a second or more, not a call's deadline
        _reply_model()
        self.config = config
        self.stats = LLMStats()
        self.progress = progress
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
        self._memo: collections.OrderedDict[str, Completion] = collections.OrderedDict()
        self._in_flight = 0
        self._active_calls = 0
        self._active_since = 0.0
        self._budget_spent: str | None = None
        self._warned_unstored = False
        self._scope_depth = 0  # deadline_scope() blocks open
        self._unresponsive = False  # inside a scope: a call ended at its deadline without any HTTP response
        self._responses = 0  # HTTP responses read (any status)
        #: Set once a server answered n > 1 with fewer choices: later prompts go out as n single requests.
        self.server_ignores_n = False
        #: Set once a server answered a request with ``response_format`` 400/422 and the same request without it.
        self.server_rejects_response_format = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._masked_key_re: "re.Pattern[str] | None" = None

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
        async with self._loop_scope():
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.config.deadline_s
            responses_before = self._responses
            done = [0]

            async def one(m: Messages, fmt: Mapping[str, Any] | None) -> "Completion | LLMFailure":
                try:
                    return await self._bounded(m, deadline, n=n, temperature=temperature, response_format=fmt)
                finally:
                    done[0] += 1

            ticker = loop.create_task(self._progress(done, len(batch))) if self.progress else None
            try:
                results = list(await asyncio.gather(*(one(m, f) for m, f in zip(batch, formats))))
                if self._scope_depth and not self._unresponsive and self._responses == responses_before and any(
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
    def budget_spent(self) -> bool:
        """True once the call or token budget refused a request."""
        return self._budget_spent is not None

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
                        completion = self._clean(Completion.from_json(hit, cached=True))
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
                result = await self._sample(params, n)
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
        """Close the HTTP clients, the background loop (if the sync API started one) and an owned cache.

        Calls still running on the sync API's loop (after a Ctrl-C) are cancelled first.
        """
        if self._closed:
            return
        self._closed = True
        if self._loop is not None and self._thread is not None:
            states = [s for loop, s in self._states.items() if loop is self._loop]
            fut = asyncio.run_coroutine_threadsafe(_shutdown(states), self._loop)
            try:
                fut.result(timeout=10)
            except BaseException:  # closing is best effort; the process may be shutting down
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
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
            if asyncio.iscoroutine(coro):
                coro.close()
            raise RuntimeError("the sync LLM API cannot be called from inside its own event loop")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return fut.result()
        except BaseException:
            # Ctrl-C (or SIGTERM turned into an exception) while waiting: cancel the call on the loop
            # so that nothing keeps running or dies later with a traceback; close() waits for it.
            fut.cancel()
            raise

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
            state = self._states[loop] = _LoopState(self)
        return state

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
        prompt_tokens = sum(_usage(p)[0] for p in pieces)
        completion_tokens = sum(_usage(p)[1] for p in pieces)
        return Completion(
            texts=tuple(self._untrusted(c.message.content) for c in choices),
            logprobs=tuple(_choice_logprobs(c, self._untrusted) for c in choices),
            finish_reasons=tuple(None if c.finish_reason is None else self._untrusted(c.finish_reason)
                                 for c in choices),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            model=self._untrusted(pieces[0].model or params["model"]),
            n_requested=n,
            cached=False,
            requests=requests,
            latency_s=time.perf_counter() - t0,
            partial=len(choices) < n,
        )

    async def _request(self, params: dict[str, Any]) -> "tuple[Any | LLMFailure, int]":
        """One logical request (the SDK retries inside it): (validated reply or failure, HTTP requests made)."""
        if self.server_rejects_response_format and "response_format" in params:
            params = {k: v for k, v in params.items() if k != "response_format"}
            with self._lock:
                self.stats.response_format_fallbacks += 1
        outcome = await self._attempt(params)
        attempts = outcome.attempts
        if outcome.reply is not None:
            return outcome.reply, attempts
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
        with self._lock:
            self.stats.failures += 1
            if outcome.reason == "timeout":
                self.stats.timeouts += 1
        log.info("LLM request failed after %d attempt(s): %s", attempts, outcome.message)
        return LLMFailure(outcome.reason or "bad_response", outcome.message, outcome.status, attempts), attempts

    async def _attempt(self, params: dict[str, Any]) -> _Attempt:
        """The SDK's request (with its retries), the body read up to the size cap and validated."""
        import openai

        cfg = self.config
        state = self._state()
        rec = _Record()
        token = _CURRENT.set(rec)
        try:
            async with state.semaphore:
                with self._lock:
                    self._in_flight += 1
                    self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
                t0 = time.perf_counter()
                try:
                    async with state.openai.chat.completions.with_streaming_response.create(**params) as raw:
                        self._responses += 1
                        body = await _read_capped(raw, cfg.max_response_bytes)
                except _BudgetRefused as exc:
                    return _Attempt(None, rec.attempts, "budget", str(exc))
                except _TooLarge as exc:
                    return _Attempt(None, rec.attempts, "bad_response",
                                    f"response too large: {exc} (--llm-max-response-bytes {cfg.max_response_bytes})")
                except openai.APITimeoutError:
                    return _Attempt(None, rec.attempts, "timeout",
                                    f"no response within {cfg.timeout_s:g} s (--llm-timeout)")
                except openai.APIConnectionError as exc:
                    cause = exc.__cause__ or exc.__context__
                    detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
                    return _Attempt(None, rec.attempts, "connection", self._untrusted_short(f"connection error: {detail}"))
                except openai.APIStatusError as exc:
                    self._responses += 1
                    status = int(exc.status_code)
                    reason = "rate_limited" if status == 429 else "server_error" if status >= 500 else "bad_request"
                    return _Attempt(None, rec.attempts, reason,
                                    self._untrusted_short(f"HTTP {status}: {exc.message}"), status)
                except openai.OpenAIError as exc:
                    return _Attempt(None, rec.attempts, "bad_response",
                                    self._untrusted_short(f"unreadable response: {exc}"))
                except Exception as exc:  # the transport's errors while streaming the body (not retried)
                    name = type(exc).__name__
                    if not type(exc).__module__.startswith(("httpx", "httpcore", "anyio", "h11")):
                        raise
                    reason = "timeout" if "Timeout" in name else "connection"
                    return _Attempt(None, rec.attempts, reason, self._untrusted_short(f"reading the response: {name}: {exc}"))
                finally:
                    with self._lock:
                        self._in_flight -= 1
                        self.stats.request_s += time.perf_counter() - t0
        finally:
            _CURRENT.reset(token)
        reply, problem = _parse_reply(body)
        if reply is None:
            return _Attempt(None, rec.attempts, "bad_response", self._untrusted_short(f"unusable response: {problem}"))
        p, c = _usage(reply)
        with self._lock:
            self.stats.prompt_tokens += p
            self.stats.completion_tokens += c
            if reply.usage is None or reply.usage.prompt_tokens is None:
                self.stats.estimated_token_requests += 1
        return _Attempt(reply, rec.attempts)

    # ------------------------------------------------------------------ untrusted text
    def _scrub(self, text: str) -> str:
        key = self.config.api_key
        # Placeholder keys for local servers ("x", "none", "EMPTY") are no secret, and replacing them would
        # mangle answers ("nonetheless", "Alexander"): only keys of _MIN_SECRET_CHARS or more are scrubbed.
        if key and len(key) >= _MIN_SECRET_CHARS:
            text = text.replace(key, "***")
            if len(key) > 12:
                # Servers echo keys partly masked ("sk-abc...wxyz"): replace such a token whole.  The key's
                # last four characters alone are not replaced: they also occur in honest answers ("2019").
                text = self._masked_key().sub("***", text)
        return text

    def _masked_key(self) -> "re.Pattern[str]":
        key = self.config.api_key or ""
        if self._masked_key_re is None:
            self._masked_key_re = re.compile(re.escape(key[:3]) + r"\S*?" + re.escape(key[-4:]))
        return self._masked_key_re

    def _untrusted(self, text: str) -> str:
        """Server text as the client passes it on: the key scrubbed, control characters removed."""
        return clean_text(self._scrub(text))

    def _untrusted_short(self, text: str) -> str:
        return _short(self._untrusted(text))

    def _clean(self, completion: "Completion") -> "Completion":
        """A cached completion's texts as fresh ones would be (caches written by older versions)."""
        return dataclasses.replace(
            completion, texts=tuple(self._untrusted(t) for t in completion.texts),
            model=self._untrusted(completion.model))


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


def _choice_logprobs(choice: Any, clean: Any) -> tuple[TokenLogprob, ...] | None:
    lp = choice.logprobs
    content = lp.content if lp is not None else None
    if not content:
        return None
    return tuple(TokenLogprob(clean(t.token), float(t.logprob)) for t in content)


def _finite(value: Any) -> float:
    """``float(value)``, refusing NaN and infinities (ValueError): a cached NaN logprob is a damaged entry."""
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"logprob {x!r} is not finite")
    return x


def _usage(reply: Any) -> tuple[int, int]:
    """(prompt, completion) tokens; estimated at 4 characters a token when the server reports none."""
    usage = reply.usage
    if usage is not None and usage.prompt_tokens is not None:
        return int(usage.prompt_tokens), int(usage.completion_tokens or 0)
    chars = sum(len(c.message.content) for c in reply.choices)
    return 0, (chars + 3) // 4


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _close_states(states: list[_LoopState]) -> None:
    for s in states:
        await s.openai.close()


async def _shutdown(states: list[_LoopState]) -> None:
    """Cancel the loop's other tasks (calls cut short by Ctrl-C), wait for them, close the HTTP clients."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    await _close_states(states)
