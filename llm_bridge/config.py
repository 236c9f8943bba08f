"""Settings of the LLM bridge, in one place: the client's :class:`LLMConfig` and the LGOT hook's
:class:`LGOTSettings`; every default and every range check of the bridge lives here.

An entry point never re-checks a value: a CLI builds the settings with
:func:`from_flags`, so a bad ``--llm-alpha 2`` and a bad ``LGOTSettings(alpha=2)``
fail the same check with the same words, the message naming the flag or the field
(``--llm-alpha must be in [0, 1], got 2.0`` / ``LGOT settings: alpha must be in [0, 1], got 2.0``).
Help texts read their defaults from the dataclasses.

Client settings: one frozen :class:`LLMConfig`, from code, the environment or CLI flags.

Sources, later ones winning::

    defaults  <  environment (OPENAI_BASE_URL, OPENAI_API_KEY, KGREASON_LLM_MODEL)  <  CLI flags / overrides

The API key is never taken from a command-line value (it would show in ``ps``
and shell history): ``--llm-api-key-env NAME`` names the environment variable
that holds it.  ``repr``/``str``/:meth:`LLMConfig.to_json` mask it.

CLIs share the flags through :func:`add_llm_arguments` and :func:`config_from_args`::

    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    config = config_from_args(parser.parse_args())
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import numbers
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from kgreason.errors import UserError
from kgreason.files import user_cache_dir
from llm_bridge.linking import DEFAULT_THRESHOLD
from llm_bridge.prompts import MAX_ANSWERS

__all__ = [
    "LLMConfig",
    "LGOTSettings",
    "SettingError",
    "from_flags",
    "number_problem",
    "MODES",
    "MERGE_RULES",
    "CONFIDENCE_MODES",
    "RELATION_QUESTION_MODES",
    "MAX_INPUTS",
    "DEFAULT_MODEL",
    "JSON_OUTPUT_MODES",
    "default_cache_path",
    "check_base_url",
    "looks_like_secret",
    "key_from_env",
    "add_llm_arguments",
    "config_from_args",
    "refuse_llm_flags",
]

#: Model name used when neither ``--llm-model`` nor ``KGREASON_LLM_MODEL`` is given.
#: llama.cpp's server and the simulator answer under any model name.
DEFAULT_MODEL = "gpt-4o-mini"
#: JSON-constrained output of the projection prompts (see :attr:`LLMConfig.json_output`).
JSON_OUTPUT_MODES = ("off", "object", "schema")
#: The placeholder key sent to servers that need none (vLLM, llama.cpp, Ollama, the simulator):
#: the ``openai`` package refuses to start without some key.
NO_KEY = "EMPTY"


#: Largest HTTP response body read by default (:attr:`LLMConfig.max_response_bytes`).
DEFAULT_MAX_RESPONSE_BYTES = 1 << 20


def default_cache_path() -> Path:
    """``$KGREASON_HOME/llm-cache.sqlite`` (``~/.cache/kgreason`` when KGREASON_HOME is unset or empty;
    :func:`kgreason.files.user_cache_dir`)."""
    return user_cache_dir() / "llm-cache.sqlite"


def _shown_url(url: str) -> str:
    """``url`` as an error message may quote it: a password in it (``https://user:PASSWORD@host``) masked,
    and a value that is no URL at all but reads like a key pasted into the wrong flag (:func:`looks_like_secret`)
    not shown."""
    if not url.startswith(("http://", "https://")):
        return "(a value that looks like a key; not shown)" if looks_like_secret(url) else repr(url)
    return repr(re.sub(r"^(https?://[^/@]*?:)[^/@]*@", r"\1***@", url))


def looks_like_secret(value: str) -> bool:
    """Whether ``value`` reads like an API key rather than a name or an address: a key prefix (``sk-``,
    ``gsk_``, ``AIza``, ``hf_``, ...), or one token of 20 or more letters, digits, ``-`` and ``_`` that mixes
    letters and digits with no run of a name's ``_``-separated words (each at most 16 characters).  Used to
    decide what an error message may echo; it errs towards hiding."""
    if re.match(r"(sk|pk|rk|gsk|xai|hf|ghp|gho|github_pat|glpat|AIza|ya29)[-_.]", value) or value.startswith("AIza"):
        return True
    if len(value) < 20 or not re.fullmatch(r"[A-Za-z0-9_\-]+", value):
        return False
    has_mix = re.search(r"[A-Za-z]", value) is not None and re.search(r"\d", value) is not None
    return has_mix and any(len(part) > 16 for part in re.split(r"[_\-]", value))


def check_base_url(url: object) -> str:
    """``url`` without trailing slashes if it is an ``http(s)://host[:port][/path]`` URL; else a
    :class:`ValueError` saying what is wrong (callers add the flag or variable it came from).  The message
    quotes the value with a password in it masked, and not at all when it reads like a key."""
    if not isinstance(url, str):
        raise ValueError(f"must be a string, got {type(url).__name__}")
    shown = _shown_url(url)
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"must start with http:// or https://, got {shown}")
    if re.search(r"[\s\x00-\x1f\x7f]", url):
        raise ValueError(f"must not contain spaces or control characters, got {shown}")
    try:
        parts = urlsplit(url)
        port = parts.port  # range-checked by urllib: 0..65535
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", a non-numeric port
        raise ValueError(f"is not a valid URL ({exc}), got {shown}") from None
    if not parts.hostname:
        raise ValueError(f"has no host name, got {shown}")
    if port == 0:
        raise ValueError(f"port must be in [1, 65535], got {shown}")
    if parts.query or parts.fragment:
        raise ValueError(f"must not carry a query or fragment, got {shown}")
    return url.rstrip("/")


class SettingError(UserError):
    """A bad value of one setting: ``"{owner}: {field} {problem}"``, e.g.
    ``LGOT settings: alpha must be in [0, 1], got 2.0``; :meth:`named` words it for a flag."""

    def __init__(self, owner: str, field: str, problem: str) -> None:
        super().__init__(f"{owner}: {field} {problem}")
        self.owner, self.field, self.problem = owner, field, problem

    def named(self, flags: Mapping[str, str]) -> UserError:
        """The same error naming ``flags[field]`` (``--llm-alpha must be ...``); itself for a field not in ``flags``."""
        return UserError(f"{flags[self.field]} {self.problem}") if self.field in flags else self


def from_flags(cls: type, values: Mapping[str, Any], flags: Mapping[str, str]) -> Any:
    """``cls(**values)`` (:class:`LLMConfig`, :class:`LGOTSettings`) for a command line: a bad value is the
    dataclass's own check, its message naming the value's flag (``flags``: field -> flag) instead of the field."""
    try:
        return cls(**values)
    except SettingError as exc:
        raise exc.named({k: f for k, f in flags.items() if values.get(k) is not None}) from None


def number_problem(value: Any, *, integer: bool, low: float, high: float = math.inf, low_open: bool = False,
                   optional: bool = False) -> str | None:
    """What is wrong with ``value`` as a number in ``[low, high]`` (``(low, ...`` with ``low_open``), or None.

    ``must be an integer, got 2.5`` / ``must be a number, got 'x'`` for the wrong type, else
    ``must be in [0, 1], got 1.5`` (non-finite values are out of range).  ``optional``: None is fine.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if integer else numbers.Real):
        return f"must be {'an integer' if integer else 'a number'}, got {value!r}"
    if not (math.isfinite(value) and (value > low if low_open else value >= low) and value <= high):
        lo, hi = "(" if low_open else "[", "]" if high != math.inf else ")"
        return f"must be in {lo}{low:g}, {high:g}{hi}, got {value!r}"
    return None


def _mask(key: str | None) -> str | None:
    return None if key is None else "***"


@dataclass(frozen=True, kw_only=True)
class LLMConfig:
    """Where the LLM is and how to call it.

    Attributes:
        base_url: the OpenAI-compatible endpoint including ``/v1`` (e.g.
            ``http://127.0.0.1:8080/v1``); None means OpenAI's own.
        api_key: the secret; masked in every printable form of the config.
        model: model name sent with every request (part of the cache key).
        temperature: sampling temperature (LGOT: 0.2).
        n: samples per prompt; confidence p(e) = count/n (LGOT: 6).
        max_tokens: completion token limit per sample.
        timeout_s: timeout of one HTTP attempt, seconds (connect, and each read/write: the
            ``openai`` package's ``timeout``).
        deadline_s: bound on one call of the client (:meth:`~llm_bridge.client.LLMClient.complete`
            or :meth:`~llm_bridge.client.LLMClient.complete_many`: one stage of the bridge),
            retries and backoff included; prompts still unanswered then fail with reason
            ``"timeout"``.
        max_retries: retries after the first attempt on 408/409/429/5xx/connection errors/timeouts
            (the ``openai`` package's ``max_retries``).
        backoff_s: first retry delay; doubled per retry with jitter, capped by ``max_backoff_s``.
        max_backoff_s: longest delay between two attempts (also caps a server's Retry-After).
        concurrency: most HTTP requests in flight at once.
        budget_calls: most HTTP requests per run (None: no limit); cache hits are free.
        budget_tokens: most prompt + completion tokens per run (None: no limit). Checked
            before each request, so requests already in flight may overshoot it.
        max_response_bytes: largest HTTP response body read; a longer one is a
            ``bad_response`` failure (never stored).
        cache_path: SQLite file of cached responses (default :func:`default_cache_path`).
        use_cache: read and write the response cache and the relation-question sidecars
            (False: nothing is read from or written to disk).
        logprobs: ask for token log-probabilities (servers that cannot simply omit them).
        json_output: JSON-constrained answers to the projection prompts: ``"off"``,
            ``"object"`` (``response_format={"type": "json_object"}``) or ``"schema"``
            (llama.cpp's ``{"type": "json_object", "schema": <list of strings>}``).  A
            server that rejects it (HTTP 400/422) is asked again without it, once per client.
    """

    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    model: str = DEFAULT_MODEL
    temperature: float = 0.2
    n: int = 6
    max_tokens: int = 256
    timeout_s: float = 60.0
    deadline_s: float = 180.0
    max_retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 20.0
    concurrency: int = 8
    budget_calls: int | None = None
    budget_tokens: int | None = None
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    cache_path: Path = field(default_factory=default_cache_path)
    use_cache: bool = True
    logprobs: bool = False
    json_output: str = "off"

    def __post_init__(self) -> None:
        def bad(name: str, message: str) -> UserError:
            return SettingError("LLM config", name, message)

        if self.base_url is not None:
            try:
                object.__setattr__(self, "base_url", check_base_url(self.base_url))
            except ValueError as exc:
                raise bad("base_url", str(exc)) from None
        if self.api_key is not None and not isinstance(self.api_key, str):
            raise bad("api_key", f"must be a string, got {type(self.api_key).__name__}")
        if self.api_key and not all("!" <= c <= "~" for c in self.api_key):
            # It goes into an HTTP header: a space, a line break or a non-ASCII character would fail every
            # request (as a retried "connection error", or a UnicodeEncodeError traceback).
            raise bad("api_key", "must be printable ASCII without spaces or line breaks (the value is not shown); "
                                 "check how the variable was set")
        if not isinstance(self.model, str) or not self.model.strip():
            raise bad("model", "must be a non-empty name")

        def number(name: str, **bounds: Any) -> None:
            problem = number_problem(getattr(self, name), **bounds)
            if problem:
                raise bad(name, problem)

        number("temperature", integer=False, low=0.0, high=2.0)
        number("n", integer=True, low=1, high=128)
        number("max_tokens", integer=True, low=1)
        number("timeout_s", integer=False, low=0.0, low_open=True)
        number("deadline_s", integer=False, low=0.0, low_open=True)
        number("max_response_bytes", integer=True, low=1024)
        number("max_retries", integer=True, low=0, high=100)
        number("backoff_s", integer=False, low=0.0)
        number("max_backoff_s", integer=False, low=0.0)
        number("concurrency", integer=True, low=1, high=4096)
        number("budget_calls", integer=True, low=0, optional=True)
        number("budget_tokens", integer=True, low=0, optional=True)
        if isinstance(self.cache_path, str):
            object.__setattr__(self, "cache_path", Path(self.cache_path))
        if not isinstance(self.cache_path, Path) or not str(self.cache_path):
            raise bad("cache_path", f"must be a file path, got {self.cache_path!r}")
        object.__setattr__(self, "cache_path", self.cache_path.expanduser())
        if self.json_output not in JSON_OUTPUT_MODES:
            raise bad("json_output", f"must be one of {', '.join(JSON_OUTPUT_MODES)}, got {self.json_output!r}")
        for name in ("use_cache", "logprobs"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, f"must be true or false, got {getattr(self, name)!r}")

    # The generated repr leaves api_key out (repr=False); say whether one is set without showing it.
    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "api_key":
                parts.append(f"{f.name}={_mask(value)!r}")
            else:  # a password inside base_url is masked too
                parts.append(f"{f.name}={_shown_url(value) if f.name == 'base_url' and value else repr(value)}")
        return f"LLMConfig({', '.join(parts)})"

    __str__ = __repr__

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON-ready values (api_key masked), e.g. for experiment records."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "api_key":
                value = _mask(value)
            elif isinstance(value, Path):
                value = str(value)
            out[f.name] = value
        return out

    def replace(self, **changes: Any) -> "LLMConfig":
        """A copy with ``changes`` applied (validated again); unknown names are a UserError."""
        _check_names(changes, "LLMConfig.replace")
        return dataclasses.replace(self, **changes)

    @property
    def effective_api_key(self) -> str:
        """The key to send: :attr:`api_key`, or a placeholder for servers that need none."""
        return self.api_key if self.api_key else NO_KEY

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "LLMConfig":
        """Settings from ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``KGREASON_LLM_MODEL``, then ``overrides``.

        ``env`` defaults to ``os.environ``; empty variables count as unset.
        Overrides whose value is None are ignored (so CLI defaults do not mask the environment).
        """
        _check_names(overrides, "LLMConfig.from_env")
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for var, name in (("OPENAI_BASE_URL", "base_url"), ("OPENAI_API_KEY", "api_key"),
                          ("KGREASON_LLM_MODEL", "model")):
            if env.get(var):
                values[name] = env[var]
        values.update({k: v for k, v in overrides.items() if v is not None})
        if overrides.get("api_key") is None and "api_key" in values:
            try:
                cls(api_key=values["api_key"])
            except UserError as exc:
                raise UserError(str(exc).replace("LLM config: api_key", "OPENAI_API_KEY", 1)) from None
        base_url = values.get("base_url")
        if base_url is not None:
            try:
                base_url = values["base_url"] = check_base_url(base_url)
            except ValueError as exc:
                source = "base_url" if overrides.get("base_url") is not None else "OPENAI_BASE_URL"
                raise SettingError("LLM config", source, str(exc)) from None
        if base_url and "model" not in values and urlsplit(str(base_url)).hostname != "api.openai.com":
            # The response cache is keyed by model name, not by address: a local server's answers filed
            # under the default OpenAI model name would later be replayed as that model's.
            raise UserError(f"--llm-model (or KGREASON_LLM_MODEL) is required with --llm-base-url {base_url}: "
                            f"name the model that server runs (the default {DEFAULT_MODEL} is an OpenAI model)")
        return cls(**values)


#: How the LGOT hook combines the LLM with the KG: LGOT's merge, or the LLM's answers alone.
MODES = ("lgot", "llm-only")
#: ``max``: ``T[e] = max(T[e], alpha * p(e))``; ``add``: LGOT's ``min(1, T[e] + alpha * p(e))``.
MERGE_RULES = ("max", "add")
#: p(e) from sample counts, or from token log-probabilities (first token / mean over the span).
CONFIDENCE_MODES = ("samples", "logprobs-first", "logprobs-mean")
#: Relation question templates: asked of the LLM once per relation (LGOT §3.1), or the name-based fallback.
RELATION_QUESTION_MODES = ("llm", "fallback")
#: Most input entities per prompt (LGOT's ``min(k, 10)``).
MAX_INPUTS = 10


@dataclass(frozen=True, kw_only=True)
class LGOTSettings:
    """How the bridge answers and merges (defaults: LGOT's), checked on construction.

    ``mode``: ``"lgot"`` or ``"llm-only"``; ``theta``: likelihood-ratio threshold
    in [0, 1]; ``alpha``: merge weight in [0, 1]; ``merge``: ``"max"`` or
    ``"add"``; ``inputs``: input entities per prompt (at most 10, LGOT's
    ``min(k, 10)``); ``max_answers``: answers asked for per prompt;
    ``confidence``: one of :data:`CONFIDENCE_MODES` (log-probability modes fall
    back to counts for replies without log-probabilities);
    ``relation_questions``: ``"llm"`` or ``"fallback"``; ``link_threshold``:
    fuzzy-linking score in [0, 100]; ``answer_check``: 0 (off) or K in [1, 10]:
    ask the answer-check prompt (LGOT §3.3.1) about the top K entities of every
    projection row after the merge; ``check_penalty`` in [0, 1]: the factor a
    rejected entity's value is multiplied by (rejected: ``p_yes < 0.5`` over
    the valid yes/no votes, at least one; see :mod:`llm_bridge.lgot`); ``input_ratio``
    in [0, 1]: an entity feeds the next prompt only when its value is at least
    ``input_ratio`` times the row's best value (the likelihood-ratio filter of
    the answers, applied to the inputs; 0 = the plain top ``inputs``).

    Used by :class:`llm_bridge.lgot.LGOTHook` (which re-exports it), the ``--llm-*``
    flags of :mod:`llm_bridge.cli` and the experiments' ``--theta``/``--alpha``/...
    flags, all through :func:`from_flags`: their defaults and checks are these.
    """

    mode: str = "lgot"
    theta: float = 0.3
    alpha: float = 0.1
    merge: str = "max"
    inputs: int = 10
    max_answers: int = MAX_ANSWERS
    confidence: str = "samples"
    relation_questions: str = "llm"
    link_threshold: float = DEFAULT_THRESHOLD
    answer_check: int = 0
    check_penalty: float = 0.5
    input_ratio: float = 0.3

    def __post_init__(self) -> None:
        def bad(name: str, problem: str | None) -> None:
            if problem:
                raise SettingError("LGOT settings", name, problem)

        for name, choices in (("mode", MODES), ("merge", MERGE_RULES), ("confidence", CONFIDENCE_MODES),
                              ("relation_questions", RELATION_QUESTION_MODES)):
            value = getattr(self, name)
            bad(name, None if value in choices else f"must be one of {', '.join(choices)}, got {value!r}")
        for name in ("theta", "alpha", "check_penalty", "input_ratio"):
            bad(name, number_problem(getattr(self, name), integer=False, low=0.0, high=1.0))
        for name, low, high in (("inputs", 1, MAX_INPUTS), ("max_answers", 1, 100), ("answer_check", 0, 10)):
            bad(name, number_problem(getattr(self, name), integer=True, low=low, high=high))
        bad("link_threshold", number_problem(self.link_threshold, integer=False, low=0.0, high=100.0))

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _check_names(values: Mapping[str, Any], where: str) -> None:
    known = {f.name for f in fields(LLMConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"{where}: unknown LLM setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


# ------------------------------------------------------------------------------------------ CLI
def add_llm_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the ``--llm-*`` flags to ``parser`` (as one argument group) and return the group.

    Every flag defaults to None so that :func:`config_from_args` can tell
    "not given" from a value and let the environment fill the gap.
    """
    g = parser.add_argument_group("LLM", "OpenAI-compatible server used by the LLM bridge "
                                  "(environment: OPENAI_BASE_URL, OPENAI_API_KEY, KGREASON_LLM_MODEL)")
    g.add_argument("--llm-base-url", metavar="URL", default=None,
                   help="endpoint including /v1, e.g. http://127.0.0.1:8080/v1 (default: $OPENAI_BASE_URL, else OpenAI)")
    g.add_argument("--llm-model", metavar="NAME", default=None,
                   help=f"model name (default: $KGREASON_LLM_MODEL, else {DEFAULT_MODEL})")
    g.add_argument("--llm-api-key-env", metavar="VAR", default=None,
                   help="environment variable holding the API key (default: OPENAI_API_KEY); "
                        "keys are never accepted on the command line")
    g.add_argument("--llm-temperature", metavar="T", type=float, default=None, help=f"sampling temperature (default {LLMConfig.temperature:g})")
    g.add_argument("--llm-n", metavar="N", type=int, default=None, help=f"samples per prompt (default {LLMConfig.n})")
    g.add_argument("--llm-max-tokens", metavar="N", type=int, default=None, help=f"completion tokens per sample (default {LLMConfig.max_tokens})")
    g.add_argument("--llm-timeout", metavar="SECONDS", type=float, default=None,
                   help=f"timeout of one HTTP attempt (connect, each read; default {LLMConfig.timeout_s:g})")
    g.add_argument("--llm-deadline", metavar="SECONDS", type=float, default=None,
                   help="most time one stage of LLM calls may take, retries included; unanswered prompts then "
                        f"fall back to KG-only (default {LLMConfig.deadline_s:g})")
    g.add_argument("--llm-max-response-bytes", metavar="N", type=int, default=None,
                   help=f"largest HTTP response read; longer ones count as bad responses "
                        f"(default {LLMConfig.max_response_bytes})")
    g.add_argument("--llm-max-retries", metavar="N", type=int, default=None,
                   help=f"retries on 408/409/429/5xx/connection errors/timeouts (default {LLMConfig.max_retries})")
    g.add_argument("--llm-concurrency", metavar="N", type=int, default=None, help=f"requests in flight at once (default {LLMConfig.concurrency})")
    g.add_argument("--llm-budget-calls", metavar="N", type=int, default=None,
                   help="most LLM requests per run; then the bridge falls back to KG-only (default: no limit)")
    g.add_argument("--llm-budget-tokens", metavar="N", type=int, default=None,
                   help="most prompt+completion tokens per run (default: no limit)")
    g.add_argument("--llm-logprobs", action="store_true", default=None,
                   help="ask the server for token log-probabilities")
    g.add_argument("--llm-json", choices=JSON_OUTPUT_MODES, default=None,
                   help="JSON-constrained answers: 'object' sends response_format json_object, 'schema' adds "
                        f"llama.cpp's schema (a list of strings); dropped if the server rejects it "
                        f"(default {LLMConfig.json_output})")
    g.add_argument("--llm-cache", metavar="PATH", default=None,
                   help=f"SQLite response cache (default: {default_cache_path()})")
    g.add_argument("--no-llm-cache", action="store_true", default=False,
                   help="read and write no LLM cache: neither the response cache nor relation-question files")
    return g


def refuse_llm_flags(ns: argparse.Namespace, *, also: Sequence[tuple[str, bool]] = ()) -> None:
    """Without ``--llm``: one :class:`UserError` line ``--FLAG needs --llm`` for the first LLM flag given.

    The one rule of every CLI with an ``--llm`` switch (``engine.answer``, ``engine.ask``): a flag that only
    the LLM reads is refused without it, ``--no-llm-cache`` included, rather than silently ignored.  The LLM
    flags are those whose dest is ``llm_*`` or ``no_llm_*`` (every flag of :func:`add_llm_arguments` and
    the CLI's own ``--llm-*``), given when the value is not the unset default (None or False), in the
    parser's order; ``also`` adds ``(flag, given)`` pairs for flags with another dest
    (``engine.ask``'s ``--no-llm-reasoner``).
    """
    given = [f"--{dest.replace('_', '-')}" for dest, value in vars(ns).items()
             if dest.startswith(("llm_", "no_llm_")) and value not in (None, False)]
    given += [flag for flag, on in also if on]
    if given:
        raise UserError(f"{given[0]} needs --llm")


def key_from_env(var: str, env: Mapping[str, str], flag: str) -> str:
    """The value of the environment variable ``var`` that ``flag`` names (an API key), or a one-line
    :class:`UserError`.  The flag takes a variable's NAME, and a key pasted there by mistake is never
    echoed: the name is shown (``environment variable NOPE is not set``) only when it reads like one
    (upper-case words, ``OPENAI_API_KEY``) and not like a key (:func:`looks_like_secret`)."""
    is_name = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var) is not None
    if is_name and env.get(var):
        return env[var]
    if is_name and re.fullmatch(r"[A-Z_][A-Z0-9_]*", var) and not looks_like_secret(var):
        raise UserError(f"{flag}: environment variable {var} is not set")
    raise UserError(f"{flag} expects an environment variable name like OPENAI_API_KEY; the value given is not one"
                    + (" that is set" if is_name else "") + " (not shown)")


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str] | None = None) -> LLMConfig:
    """The :class:`LLMConfig` of parsed :func:`add_llm_arguments` flags over the environment."""
    env = os.environ if env is None else env
    key_var = getattr(ns, "llm_api_key_env", None)
    overrides: dict[str, Any] = {
        "base_url": ns.llm_base_url,
        "model": ns.llm_model,
        "temperature": ns.llm_temperature,
        "n": ns.llm_n,
        "max_tokens": ns.llm_max_tokens,
        "timeout_s": ns.llm_timeout,
        "deadline_s": getattr(ns, "llm_deadline", None),
        "max_response_bytes": getattr(ns, "llm_max_response_bytes", None),
        "max_retries": getattr(ns, "llm_max_retries", None),
        "concurrency": ns.llm_concurrency,
        "budget_calls": ns.llm_budget_calls,
        "budget_tokens": ns.llm_budget_tokens,
        "logprobs": getattr(ns, "llm_logprobs", None),
        "json_output": getattr(ns, "llm_json", None),
        "cache_path": ns.llm_cache,
        "use_cache": False if getattr(ns, "no_llm_cache", False) else None,
    }
    if key_var is not None:
        overrides["api_key"] = key_from_env(key_var, env, "--llm-api-key-env")
    names = {"temperature": "--llm-temperature", "n": "--llm-n", "max_tokens": "--llm-max-tokens",
             "timeout_s": "--llm-timeout", "deadline_s": "--llm-deadline",
             "max_response_bytes": "--llm-max-response-bytes", "max_retries": "--llm-max-retries", "concurrency": "--llm-concurrency",
             "budget_calls": "--llm-budget-calls", "budget_tokens": "--llm-budget-tokens",
             "base_url": "--llm-base-url", "model": "--llm-model", "cache_path": "--llm-cache",
             "api_key": f"--llm-api-key-env {key_var}:"}
    try:
        return LLMConfig.from_env(env, **overrides)
    except SettingError as exc:
        # Name the flag rather than the dataclass field when the value came from one.
        raise exc.named({k: f for k, f in names.items() if overrides.get(k) is not None}) from None
