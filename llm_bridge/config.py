"""Settings of the LLM bridge, in one place: the client's :class:`LLMConfig` and the LGOT hook's
:class:`LGOTConfig`; every default and every range check of the bridge lives here.

An entry point never re-checks a value: a CLI builds the settings with
:func:`from_flags`, so a bad ``--llm-alpha 2`` and a bad ``LGOTConfig(alpha=2)``
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
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from kgreason.cli import add_settings_arguments, flag_names, number_problem, setting, settings_values, value_problem
from kgreason.errors import UserError
from kgreason.files import user_cache_dir
from llm_bridge.linking import DEFAULT_THRESHOLD
from llm_bridge.prompts import MAX_ANSWERS

__all__ = [
    "LLMConfig",
    "LGOTConfig",
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
    """``cls(**values)`` (:class:`LLMConfig`, :class:`LGOTConfig`) for a command line: a bad value is the
    dataclass's own check, its message naming the value's flag (``flags``: field -> flag) instead of the field."""
    try:
        return cls(**values)
    except SettingError as exc:
        raise exc.named({k: f for k, f in flags.items() if values.get(k) is not None}) from None


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

    # Each field's --llm-* flag (kgreason.cli.setting), its range and help, declared once: add_llm_arguments
    # makes the flags of them, __post_init__ checks the ranges, config_from_args names the flags in errors.
    base_url: str | None = setting(None, flag="--llm-base-url", metavar="URL",
                                   shown_default="$OPENAI_BASE_URL, else OpenAI",
                                   help="endpoint including /v1, e.g. http://127.0.0.1:8080/v1")
    api_key: str | None = dataclasses.field(default=None, repr=False)  # never a flag: --llm-api-key-env names it
    model: str = setting(DEFAULT_MODEL, flag="--llm-model", metavar="NAME",
                         shown_default=f"$KGREASON_LLM_MODEL, else {DEFAULT_MODEL}", help="model name")
    temperature: float = setting(0.2, flag="--llm-temperature", metavar="T", low=0.0, high=2.0,
                                 help="sampling temperature")
    n: int = setting(6, flag="--llm-n", metavar="N", integer=True, low=1, high=128, help="samples per prompt")
    max_tokens: int = setting(256, flag="--llm-max-tokens", metavar="N", integer=True, low=1,
                              help="completion tokens per sample")
    timeout_s: float = setting(60.0, flag="--llm-timeout", metavar="SECONDS", low=0.0, low_open=True,
                               help="timeout of one HTTP attempt (connect, each read)")
    deadline_s: float = setting(180.0, flag="--llm-deadline", metavar="SECONDS", low=0.0, low_open=True,
                                help="most time one stage of LLM calls may take, retries included; unanswered "
                                     "prompts then fall back to KG-only")
    max_retries: int = setting(4, flag="--llm-max-retries", metavar="N", integer=True, low=0, high=100,
                               help="retries on 408/409/429/5xx/connection errors/timeouts")
    backoff_s: float = setting(0.5, command_line=False, low=0.0, help="first retry delay")
    max_backoff_s: float = setting(20.0, command_line=False, low=0.0, help="longest delay between two attempts")
    concurrency: int = setting(8, flag="--llm-concurrency", metavar="N", integer=True, low=1, high=4096,
                               help="requests in flight at once")
    budget_calls: int | None = setting(None, flag="--llm-budget-calls", metavar="N", integer=True, low=0,
                                       shown_default="no limit",
                                       help="most LLM requests per run; then the bridge falls back to KG-only")
    budget_tokens: int | None = setting(None, flag="--llm-budget-tokens", metavar="N", integer=True, low=0,
                                        shown_default="no limit", help="most prompt+completion tokens per run")
    max_response_bytes: int = setting(DEFAULT_MAX_RESPONSE_BYTES, flag="--llm-max-response-bytes", metavar="N",
                                      integer=True, low=1024,
                                      help="largest HTTP response read; longer ones count as bad responses")
    cache_path: Path = setting(default_factory=default_cache_path, flag="--llm-cache", metavar="PATH", type=str,
                               shown_default=lambda: str(default_cache_path()), help="SQLite response cache")
    use_cache: bool = setting(True, flag="--no-llm-cache", negate=True,
                              help="read and write no LLM cache: neither the response cache nor relation-question files")
    logprobs: bool = setting(False, flag="--llm-logprobs", help="ask the server for token log-probabilities")
    json_output: str = setting("off", flag="--llm-json", choices=JSON_OUTPUT_MODES,
                               help="JSON-constrained answers: 'object' sends response_format json_object, 'schema' "
                                    "adds llama.cpp's schema (a list of strings); dropped if the server rejects it")

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

        for f in fields(self):  # the ranges declared with the fields (kgreason.cli.value_problem)
            if f.name != "cache_path":  # a path: its own words below
                problem = value_problem(f, getattr(self, f.name))
                if problem:
                    raise bad(f.name, problem)
        if isinstance(self.cache_path, str):
            object.__setattr__(self, "cache_path", Path(self.cache_path))
        if not isinstance(self.cache_path, Path) or not str(self.cache_path):
            raise bad("cache_path", f"must be a file path, got {self.cache_path!r}")
        object.__setattr__(self, "cache_path", self.cache_path.expanduser())
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
class LGOTConfig:
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
    flags of :mod:`llm_bridge.cli` (declared with the fields) and the experiments'
    ``--theta``/``--alpha``/... flags, all through :func:`from_flags`: their defaults and checks are these.
    ``LGOTSettings`` is its former name, kept for code that imports it.
    """

    mode: str = setting("lgot", flag="--llm-mode", choices=MODES,
                        help="lgot: merge filtered LLM answers into the KG's fuzzy sets; llm-only: the LLM's answers alone")
    theta: float = setting(0.3, flag="--llm-theta", metavar="T", low=0.0, high=1.0,
                           help="likelihood-ratio filter: keep an LLM answer if p(e)/p_max >= T")
    alpha: float = setting(0.1, flag="--llm-alpha", metavar="A", low=0.0, high=1.0,
                           help="merge weight: T[e] = max(T[e], A*p(e))")
    merge: str = setting("max", flag="--llm-merge", choices=MERGE_RULES,
                         help="merge rule: max or LGOT's additive min(1, T[e] + A*p(e))")
    inputs: int = setting(MAX_INPUTS, flag="--llm-inputs", metavar="K", integer=True, low=1, high=MAX_INPUTS,
                          shown_default=f"min(--top-k, {MAX_INPUTS})",
                          help="input entities per prompt: the top K of the input node")
    max_answers: int = setting(MAX_ANSWERS, command_line=False, integer=True, low=1, high=100,
                               help="answers asked for per prompt")
    confidence: str = setting("samples", flag="--llm-confidence", choices=CONFIDENCE_MODES,
                              help="p(e) from sample counts or token log-probabilities (needs --llm-logprobs)")
    relation_questions: str = setting("llm", flag="--llm-relation-questions", choices=RELATION_QUESTION_MODES,
                                      help="relation question templates: asked of the LLM once per relation or "
                                           "built from the relation's name")
    link_threshold: float = setting(DEFAULT_THRESHOLD, flag="--llm-link-threshold", metavar="S", low=0.0, high=100.0,
                                    help="fuzzy linking: accept a match with token-aligned score >= S in [0, 100] "
                                         "(calibrated: benchmarks/results/lgot/linking.md)")
    answer_check: int = setting(0, flag="--llm-answer-check", metavar="K", integer=True, low=0, high=10,
                                shown_default="0: off",
                                help="answer check (LGOT 3.3.1): ask the LLM whether each of the top K entities "
                                     "(K <= 10) of every projection answers its sub-question; rejected ones are "
                                     "scaled by --llm-check-penalty")
    check_penalty: float = setting(0.5, flag="--llm-check-penalty", metavar="P", low=0.0, high=1.0,
                                   help="factor in [0, 1] for an entity the answer check rejects")
    input_ratio: float = setting(0.3, flag="--llm-input-ratio", metavar="R", low=0.0, high=1.0,
                                 help="an entity feeds the next sub-question's prompt only if its value is >= R x "
                                      "the row's best (near-zero KG predictions no longer pad the prompt; "
                                      "benchmarks/results/lgot/metaqa.md)")

    def __post_init__(self) -> None:
        for f in fields(self):  # choices and ranges as declared with the fields (kgreason.cli.value_problem)
            problem = value_problem(f, getattr(self, f.name))
            if problem:
                raise SettingError("LGOT settings", f.name, problem)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


#: The former name of :class:`LGOTConfig` (settings classes are named by docs/cli.md's rule).
LGOTSettings = LGOTConfig


def _check_names(values: Mapping[str, Any], where: str) -> None:
    known = {f.name for f in fields(LLMConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"{where}: unknown LLM setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


# ------------------------------------------------------------------------------------------ CLI
#: The flag that names the environment variable holding the API key (the key itself is never a flag).
API_KEY_ENV_FLAG = "--llm-api-key-env"


def add_llm_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the ``--llm-*`` flags to ``parser`` (as one argument group) and return the group: one per flagged
    :class:`LLMConfig` field (:func:`kgreason.cli.add_settings_arguments`), and ``--llm-api-key-env``.

    Every flag defaults to None so that :func:`config_from_args` can tell
    "not given" from a value and let the environment fill the gap; the help shows LLMConfig's default.
    """
    g = parser.add_argument_group("LLM", "OpenAI-compatible server used by the LLM bridge "
                                  "(environment: OPENAI_BASE_URL, OPENAI_API_KEY, KGREASON_LLM_MODEL)")
    add_settings_arguments(g, LLMConfig, unset=True)  # --llm-base-url ... --no-llm-cache, from LLMConfig's fields
    g.add_argument(API_KEY_ENV_FLAG, metavar="VAR", default=None,
                   help="environment variable holding the API key (default: OPENAI_API_KEY); "
                        "keys are never accepted on the command line")
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
    overrides: dict[str, Any] = settings_values(LLMConfig, ns)  # the flags given (add_llm_arguments: None if not)
    names = flag_names(LLMConfig)
    if key_var is not None:
        overrides["api_key"] = key_from_env(key_var, env, API_KEY_ENV_FLAG)
        names["api_key"] = f"{API_KEY_ENV_FLAG} {key_var}:"
    try:
        return LLMConfig.from_env(env, **overrides)
    except SettingError as exc:
        # Name the flag rather than the dataclass field when the value came from one.
        raise exc.named({k: f for k, f in names.items() if overrides.get(k) is not None}) from None
