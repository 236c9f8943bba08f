"""What goes over the wire for one prompt of :class:`llm_bridge.client.LLMClient`, adapted to the server.

* **n > 1 on servers that ignore it** (llama.cpp's server returns one choice): the missing
  samples are requested one by one, sample ``j`` with ``seed=j`` so that they differ and
  replay identically; the sampler then remembers that the server ignores ``n``.
* **response_format on servers that reject it**: a request with a ``response_format``
  answered HTTP 400/422 is sent once more without it; when that succeeds the sampler
  remembers it and drops ``response_format`` from later requests.

Each request goes through :meth:`llm_bridge.client_http.Transport.request` (attempts, backoff, budget).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .client_http import Transport, usage
from .client_types import Completion, LLMFailure, ServerText, TokenLogprob

log = logging.getLogger("llm_bridge.client")  # the client's own logger: what users filter on


class Sampler:
    """``n`` samples of one prompt's parameters as a :class:`Completion` or an :class:`LLMFailure`."""

    def __init__(self, transport: Transport, untrusted: ServerText) -> None:
        self.transport = transport
        self.stats = transport.stats
        self._lock = transport.lock
        self._untrusted = untrusted
        #: Set once a server answered n > 1 with fewer choices: later prompts go out as n single requests.
        self.server_ignores_n = False
        #: Set once a server answered a request with ``response_format`` 400/422 and the same request without it.
        self.server_rejects_response_format = False

    async def sample(self, params: dict[str, Any], n: int) -> "Completion | LLMFailure":
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
        prompt_tokens = sum(usage(p)[0] for p in pieces)
        completion_tokens = sum(usage(p)[1] for p in pieces)
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
        """One logical request (retries inside it): (validated reply or failure, HTTP requests made)."""
        if self.server_rejects_response_format and "response_format" in params:
            params = {k: v for k, v in params.items() if k != "response_format"}
            with self._lock:
                self.stats.response_format_fallbacks += 1
        outcome = await self.transport.request(params)
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


def _choice_logprobs(choice: Any, clean: Any) -> tuple[TokenLogprob, ...] | None:
    lp = choice.logprobs
    content = lp.content if lp is not None else None
    if not content:
        return None
    return tuple(TokenLogprob(clean(t.token), float(t.logprob)) for t in content)
