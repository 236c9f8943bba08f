"""The values :class:`llm_bridge.client.LLMClient` returns: :class:`Completion`, :class:`LLMFailure`, :class:`LLMStats`.

Re-exported by :mod:`llm_bridge.client`; kept apart so that the HTTP side (:mod:`llm_bridge.client_http`)
and the client share them without importing each other.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

__all__ = ["Completion", "LLMFailure", "LLMStats", "TokenLogprob", "Messages", "FAILURE_REASONS", "ServerText"]

Messages = Sequence[Mapping[str, str]]

#: Shorter API keys are placeholders (local servers take any key) and are not scrubbed from server text.
_MIN_SECRET_CHARS = 8

#: Why a request produced no completion.
FAILURE_REASONS = ("budget", "timeout", "connection", "server_error", "rate_limited", "bad_request", "bad_response")


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
    (one of 8 or more characters: shorter ones are placeholders, see :class:`ServerText`)."""

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


def _finite(value: Any) -> float:
    """``float(value)``, refusing NaN and infinities (ValueError): a cached NaN logprob is a damaged entry."""
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"logprob {x!r} is not finite")
    return x


class ServerText:
    """Text from the server as the client passes it on: the API key scrubbed, control characters removed.

    Every text from the server (completions, model name, error messages) goes through it before it is
    returned, logged or cached; ``api_key`` is never stored anywhere else by it.
    """

    def __init__(self, api_key: str | None) -> None:
        self._key = api_key or ""
        self._masked: "re.Pattern[str] | None" = None

    def __call__(self, text: str) -> str:
        from .text import clean_text

        return clean_text(self._scrub(text))

    def completion(self, completion: Completion) -> Completion:
        """A cached completion's texts as fresh ones would be (caches written by older versions)."""
        return dataclasses.replace(completion, texts=tuple(self(t) for t in completion.texts),
                                   model=self(completion.model))

    def _scrub(self, text: str) -> str:
        key = self._key
        # Placeholder keys for local servers ("x", "none", "EMPTY") are no secret, and replacing them would
        # mangle answers ("nonetheless", "Alexander"): only keys of _MIN_SECRET_CHARS or more are scrubbed.
        if len(key) >= _MIN_SECRET_CHARS:
            text = text.replace(key, "***")
            if len(key) > 12:
                # Servers echo keys partly masked ("sk-abc...wxyz"): replace such a token whole.  The key's
                # last four characters alone are not replaced: they also occur in honest answers ("2019").
                if self._masked is None:
                    self._masked = re.compile(re.escape(key[:3]) + r"\S*?" + re.escape(key[-4:]))
                text = self._masked.sub("***", text)
        return text

    def __repr__(self) -> str:
        return "ServerText(api_key=***)"
