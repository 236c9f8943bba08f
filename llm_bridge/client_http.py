"""The HTTP side of :class:`llm_bridge.client.LLMClient`: SDK clients per event loop, attempts, backoff, budget.

Everything here goes through the ``openai`` package's public API only:

* one ``openai.AsyncOpenAI`` per event loop, built with ``max_retries=0`` and an
  ``http_client`` (``openai.DefaultAsyncHttpxClient``, the SDK's own defaults) whose
  ``response`` event hook counts every HTTP response the server sent (any status:
  :meth:`Transport.responses` tells a server that answers slowly from one that never answers);
* the retry loop is ours (:meth:`Transport.request`): each attempt is one public
  ``chat.completions.with_streaming_response.create`` call, so the loop counts attempts
  and charges the budget before each one, retries what the SDK would retry (timeouts,
  connection errors, HTTP 408/409/429/5xx, an ``x-should-retry`` header obeyed; never
  other 4xx, never a ``Retry-After`` over :data:`MAX_RETRY_AFTER_S`) and waits
  ``backoff_s``/``max_backoff_s`` with jitter, a ``Retry-After`` (read from the public
  ``APIStatusError.response.headers``) honoured up to ``max_backoff_s``;
* the body is read as a stream up to ``config.max_response_bytes`` and validated
  against a pydantic model of the Chat Completions reply.

Before, the client subclassed ``AsyncOpenAI`` to override its private per-attempt
``_prepare_request`` and ``_calculate_retry_timeout`` and called
``_parse_retry_after_header``; ``tests/test_llm_client.py`` checks by AST that no module of
``llm_bridge`` does that again.
"""
from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import math
import random
import threading
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping, NamedTuple

from kgreason.files import loads_json

if TYPE_CHECKING:
    from .client import LLMStats
    from .config import LLMConfig

_OPENAI_URL = "https://api.openai.com/v1"
#: A server asking to wait longer than this is not retried (the SDK's rule, kept: such a wait is no retry).
MAX_RETRY_AFTER_S = 120.0
#: HTTP statuses retried (as the SDK does); other 4xx are the request's fault and not retried.
RETRY_STATUSES = frozenset({408, 409, 429})


class Attempt(NamedTuple):
    """The outcome of one logical request (retries inside): a validated reply, or why not."""

    reply: Any | None
    attempts: int
    reason: str | None = None
    message: str = ""
    status: int | None = None


class _TooLarge(Exception):
    pass


# ---------------------------------------------------------------------------------------- retry rules
def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a response asks the client to wait (``retry-after-ms``, ``retry-after`` in seconds or as an
    HTTP date), or None when it asks nothing readable."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        return delay / divisor if math.isfinite(delay) else math.inf
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        when = email.utils.parsedate_tz(value)
        return None if when is None else float(email.utils.mktime_tz(when) - time.time())
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an HTTP error status is worth another attempt (the SDK's rule for its own retries)."""
    after = retry_after_s(headers)
    if after is not None and after > MAX_RETRY_AFTER_S:
        return False
    hint = headers.get("x-should-retry")
    if hint in ("true", "false"):
        return hint == "true"
    return status in RETRY_STATUSES or status >= 500


def backoff_delay(config: "LLMConfig", retry: int, rng: random.Random, headers: Mapping[str, str] | None) -> float:
    """Seconds before retry number ``retry`` (0 for the first): ``backoff_s`` doubling with jitter (x0.5-1.5),
    at most ``max_backoff_s``; a positive ``Retry-After`` lengthens it, still to at most ``max_backoff_s``
    (a wait past the call's deadline would only turn into a timeout)."""
    delay = min(config.max_backoff_s, config.backoff_s * (2 ** min(retry, 60)) * (0.5 + rng.random()))
    after = retry_after_s(headers)
    if after is not None and after == after and after > 0:
        delay = min(config.max_backoff_s, max(delay, after))
    return delay


# ---------------------------------------------------------------------------------------- replies
@functools.lru_cache(maxsize=None)
def reply_model() -> type:
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


def parse_reply(body: bytes) -> tuple[Any | None, str]:
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
        return reply_model().model_validate(data), ""
    except ValidationError as exc:
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ())) or "reply"
        return None, f"not a chat completion ({where}: {first.get('msg', 'invalid')}; {len(errs)} error(s))"


def usage(reply: Any) -> tuple[int, int]:
    """(prompt, completion) tokens; estimated at 4 characters a token when the server reports none."""
    u = reply.usage
    if u is not None and u.prompt_tokens is not None:
        return int(u.prompt_tokens), int(u.completion_tokens or 0)
    chars = sum(len(c.message.content) for c in reply.choices)
    return 0, (chars + 3) // 4


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


# ---------------------------------------------------------------------------------------- transport
class _LoopState:
    """Per-event-loop resources: the SDK client (its connections) and the concurrency semaphore bind to a loop."""

    def __init__(self, transport: "Transport") -> None:
        import openai

        config = transport.config
        http = openai.DefaultAsyncHttpxClient(event_hooks={"response": [transport._on_response]})
        self.openai = openai.AsyncOpenAI(api_key=config.effective_api_key, base_url=config.base_url or _OPENAI_URL,
                                         max_retries=0, timeout=config.timeout_s, http_client=http)
        self.semaphore = asyncio.Semaphore(config.concurrency)


class Transport:
    """HTTP requests of one client: attempts with backoff, the budget, per-loop SDK clients.

    ``stats`` and ``lock`` are the owning client's (:class:`~llm_bridge.client.LLMStats`, updated under
    ``lock``); ``clean`` makes server text safe to return or log (the key scrubbed, control characters out).
    """

    def __init__(self, config: "LLMConfig", stats: "LLMStats", lock: threading.Lock, rng: random.Random,
                 clean: Callable[[str], str]) -> None:
        self.config = config
        self.stats = stats
        self.lock = lock
        self._rng = rng
        self._clean = clean
        self.responses = 0  # HTTP responses received (any status), counted by the http client's event hook
        self.budget_spent: str | None = None
        self._in_flight = 0
        self._states: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        # Per loop: public calls running now.  An SDK client outlives a call only on a loop that is
        # "pinned" (the sync API's own loop, or one where `async with client` was entered), so
        # `asyncio.run(client.complete(...))` per call leaves no connection bound to a dead loop.
        self._depth: dict[asyncio.AbstractEventLoop, int] = {}
        self.pinned: set[asyncio.AbstractEventLoop] = set()

    async def _on_response(self, response: Any) -> None:
        self.responses += 1

    # ------------------------------------------------------------------ loops
    @contextlib.asynccontextmanager
    async def loop_scope(self) -> AsyncIterator[None]:
        """Count public calls per loop; the last one out closes the loop's SDK client unless the loop is pinned."""
        loop = asyncio.get_running_loop()
        self._depth[loop] = self._depth.get(loop, 0) + 1
        try:
            yield
        finally:
            self._depth[loop] -= 1
            if self._depth[loop] == 0:
                del self._depth[loop]
                if loop not in self.pinned:
                    await self.aclose_loop(loop)

    async def aclose_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the SDK client bound to ``loop`` (the running one)."""
        self.pinned.discard(loop)
        with self.lock:
            state = self._states.pop(loop, None)
        if state is not None:
            await state.openai.close()

    def forget(self) -> None:
        """Drop every SDK client without closing it (their loops are closed or closing)."""
        self._states.clear()

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        with self.lock:  # threads in sync calls at the same time each have a loop of their own
            state = self._states.get(loop)
            if state is None:
                # Loops that ended (asyncio.run per call) take their SDK clients with them.
                for old in [lp for lp in self._states if lp.is_closed()]:
                    del self._states[old]
                state = self._states[loop] = _LoopState(self)
        return state

    # ------------------------------------------------------------------ budget
    def _reserve(self) -> str | None:
        """Count one HTTP request against the budget; the reason it is refused, or None."""
        cfg = self.config
        with self.lock:
            if self.budget_spent is None:
                if cfg.budget_calls is not None and self.stats.requests >= cfg.budget_calls:
                    self.budget_spent = f"call budget of {cfg.budget_calls} requests spent"
                elif cfg.budget_tokens is not None and self.stats.total_tokens >= cfg.budget_tokens:
                    self.budget_spent = f"token budget of {cfg.budget_tokens} tokens spent"
            if self.budget_spent is not None:
                self.stats.budget_refusals += 1
                return self.budget_spent
            self.stats.requests += 1
            return None

    # ------------------------------------------------------------------ requests
    async def request(self, params: dict[str, Any]) -> Attempt:
        """One logical request: up to ``1 + max_retries`` HTTP attempts, the reply read and validated."""
        cfg = self.config
        state = self._state()
        attempts = 0
        async with state.semaphore:
            with self.lock:
                self._in_flight += 1
                self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
            t0 = time.perf_counter()
            try:
                while True:
                    refused = self._reserve()
                    if refused is not None:
                        return Attempt(None, attempts, "budget", refused)
                    attempts += 1
                    if attempts > 1:
                        with self.lock:
                            self.stats.retries += 1
                    outcome, retry, headers = await self._once(state, params, attempts)
                    if not retry or attempts > cfg.max_retries:
                        break
                    await asyncio.sleep(backoff_delay(cfg, attempts - 1, self._rng, headers))
            finally:
                with self.lock:
                    self._in_flight -= 1
                    self.stats.request_s += time.perf_counter() - t0
        if outcome.reply is not None:
            p, c = usage(outcome.reply)
            with self.lock:
                self.stats.prompt_tokens += p
                self.stats.completion_tokens += c
                if outcome.reply.usage is None or outcome.reply.usage.prompt_tokens is None:
                    self.stats.estimated_token_requests += 1
        return outcome

    async def _once(self, state: _LoopState, params: dict[str, Any], attempts: int
                    ) -> tuple[Attempt, bool, Mapping[str, str] | None]:
        """One HTTP attempt: (outcome, whether to retry it, the response headers of a retried status)."""
        import openai

        cfg = self.config
        short = self._short
        try:
            async with state.openai.chat.completions.with_streaming_response.create(**params) as raw:
                body = await _read_capped(raw, cfg.max_response_bytes)
        except _TooLarge as exc:
            return Attempt(None, attempts, "bad_response",
                           f"response too large: {exc} (--llm-max-response-bytes {cfg.max_response_bytes})"), False, None
        except openai.APITimeoutError:
            return Attempt(None, attempts, "timeout", f"no response within {cfg.timeout_s:g} s (--llm-timeout)"), \
                True, None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc.__context__
            detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
            return Attempt(None, attempts, "connection", short(f"connection error: {detail}")), True, None
        except openai.APIStatusError as exc:
            status = int(exc.status_code)
            headers = exc.response.headers
            reason = "rate_limited" if status == 429 else "server_error" if status >= 500 else "bad_request"
            return (Attempt(None, attempts, reason, short(f"HTTP {status}: {exc.message}"), status),
                    should_retry(status, headers), headers)
        except openai.OpenAIError as exc:
            return Attempt(None, attempts, "bad_response", short(f"unreadable response: {exc}")), False, None
        except Exception as exc:  # the transport's errors while streaming the body (not retried)
            name = type(exc).__name__
            if not type(exc).__module__.startswith(("httpx", "httpcore", "anyio", "h11")):
                raise
            reason = "timeout" if "Timeout" in name else "connection"
            return Attempt(None, attempts, reason, short(f"reading the response: {name}: {exc}")), False, None
        reply, problem = parse_reply(body)
        if reply is None:
            return Attempt(None, attempts, "bad_response", short(f"unusable response: {problem}")), False, None
        return Attempt(reply, attempts), False, None

    def _short(self, text: str, limit: int = 300) -> str:
        text = " ".join(self._clean(str(text)).split())
        return text if len(text) <= limit else text[: limit - 1] + "…"
