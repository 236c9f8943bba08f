"""A simulated LLM: an OpenAI-compatible HTTP server that answers from an artifact's *full* KG.

::

    python -m experiments.simulate --artifact artifacts/umls-drop50 --port 8099 \\
        --recall 0.7 --hallucination 0.2 --noise 0.1 --seed 0
    # then: --llm-base-url http://127.0.0.1:8099/v1 --llm-model sim

It lets tests run the whole bridge over real HTTP and lets experiments measure
how good an LLM must be for LGOT's merge to pay.  The knowledge is
``artifact.observed`` ∪ ``artifact.missing``: the simulated LLM "knows" the
edges the engine's KG lost.

Endpoints: ``POST /v1/chat/completions`` (``n``, ``temperature``, ``seed``,
``max_tokens``, ``logprobs``/``top_logprobs`` honoured), ``GET /v1/models``,
and ``GET /stats`` (request counters, for tests).

What it answers (prompts are recognised through :mod:`llm_bridge.prompts`,
the same templates the bridge sends, never through hidden markers):

* **projection** ("Question: Who or what is the X of "A" or "B"? Answer with at
  most 10 entities as a JSON list..."): the question template is mapped back to
  a relation ``r``; the truth is ``T = {t : (e, r, t) in the full KG, e an input}``.
  Per choice, each true tail appears with probability ``π_t = clip(recall +
  noise·z_t, 0, 1)`` (``z_t`` fixed per prompt and tail, so ``noise`` makes some
  answers more consistent across the ``n`` samples than others), and
  ``Poisson(λ)`` invented answers are added with ``λ = recall·|T|·h/(1-h)``
  (``h`` = ``--hallucination``, so that about a fraction ``h`` of everything
  returned is wrong), drawn from a per-prompt pool of ``max(3, 3|T|, 3λ)``
  plausible wrong entities: other tails of ``r`` first, then any entity.
  True answers thus recur across samples and inventions mostly do not: the
  count/n signal the bridge's filter relies on.  ``T`` empty (or a question it
  cannot map to a relation) is a refusal: "I don't know."
* **nested projection** (a hop asked about the previous sub-question,
  :mod:`llm_bridge.nested`): ``T`` follows the whole relation chain from the
  inputs, and every ``π_t`` starts from ``recall ** hops`` instead of
  ``recall`` (a model must know each hop to name a final answer).
* **relation question** (LGOT §3.1): a rewrite of the relation's name as a
  question template (which it maps back again when it later sees it; rewrites
  that would coincide for two relations carry the bridge's "(relation: NAME)"
  qualifier, as the bridge's own fallback templates do).
* **answer check** (LGOT §3.3.1): "Yes" when the proposed answer is in ``T``, else "No".

Determinism: every random draw is seeded by sha256 of (``--seed``, the parsed
prompt, the choice index, what is drawn); choice ``i`` of a request with
``seed=s`` is choice ``s + i`` (so n separate requests with seeds 0..n-1 give
the same samples as one request with ``n``).  ``temperature`` 0 makes every
choice choice 0.

Failure injection: ``--fail-rate F`` makes a fraction F of requests fail,
decided per (request body, how many times that body was seen), so a retried
request eventually gets through: ``--fail-mode status`` answers
``--fail-status`` (500; 429 comes with ``Retry-After: 0``), ``hang`` sleeps
``--hang-s`` seconds (past the client's timeout) before answering, ``mixed``
does either.  ``--ignore-n`` answers one choice whatever ``n`` asks, like
llama.cpp's server.  ``--messy`` wraps answers the ways real models do (code
fences, prose, single quotes, numbered lines, altered case) to exercise the
parser and the linker.  ``--api-key-env VAR`` requires that key and, like some
real servers, echoes a wrong key in its 401 message (tests check the client
scrubs it).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kgreason.cli import (SEED_MAX, ArgumentParser, Settings, add_settings_arguments, setting, settings_from_args,
                          verify_setting)
from kgreason.constants import INVERSE_SUFFIX
from kgreason.errors import UserError, cli_main

from llm_bridge import prompts
from llm_bridge.nested import unnest

__all__ = ["SimulatorConfig", "SimulateSettings", "SimulatedLLM", "SimulatorServer", "KnowledgeBase", "start_server", "serve", "main"]

MODEL_NAME = "kgreason-simulator"
_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")
_WORDS = re.compile(r"\S+")


@dataclass(frozen=True, kw_only=True)
class SimulatorConfig(Settings):
    """The simulated LLM's quality and the server's behaviour (see the module docstring); each field's flag
    and range are declared with it (the simulators' CLIs parse straight into it).

    Every float has a finite range (NaN and infinities are out of it): ``--noise inf`` made every draw NaN
    and crashed each request handler, ``--latency-ms inf`` slept forever.  ``noise`` scales standard normal
    draws inside exp(): 10 already makes every answer all-or-nothing across samples."""

    recall: float = setting(0.7, low=0, high=1, help="per-sample probability of naming each true answer")
    hallucination: float = setting(0.2, low=0, high=1, high_open=True, help="expected fraction of invented answers")
    noise: float = setting(0.1, low=0, high=10, help="spread of the per-answer consistency across samples")
    seed: int = setting(0, low=0, high=SEED_MAX, integer=True, help="random seed, 0 to 2**32-1")
    latency_ms: float = setting(0.0, low=0, high=600_000, help="delay added to every completion")
    fail_rate: float = setting(0.0, low=0, high=1, help="fraction of requests that fail")
    fail_status: int = setting(500, low=400, high=599, integer=True, help="HTTP status of injected failures")
    fail_mode: str = setting("status", choices=("status", "hang", "mixed"), help="how an injected failure fails")
    hang_s: float = setting(60.0, low=0, high=3600, help="how long a 'hang' failure waits")
    ignore_n: bool = setting(False, help="one choice per request whatever n asks (like llama.cpp)")
    messy: bool = setting(False, help="wrap answers in fences/prose/other list styles")
    api_key: str | None = field(default=None, repr=False)  # no flag: read from --api-key-env's variable


@dataclass(frozen=True, kw_only=True)
class SimulateSettings(Settings):
    """``python -m experiments.simulate``'s flags besides the simulator's own (:class:`SimulatorConfig`)."""

    artifact: str = setting(metavar="DIR", help="artifact folder (observed + missing = its knowledge)")
    host: str = setting("127.0.0.1", help="address to listen on")
    port: int = setting(8099, low=0, high=65535, integer=True, help="0 picks a free port (printed)")
    api_key_env: str | None = setting(None, metavar="VAR", help="require the API key held in this environment variable")
    verify: bool = verify_setting()


# ------------------------------------------------------------------------------ deterministic draws
def _seed_of(*parts: Any) -> int:
    text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"), default=str)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def seeded_rng(*parts: Any) -> np.random.Generator:
    """A generator seeded by ``parts`` (the run's seed, the prompt's key, what is drawn): the same draw for
    the same prompt in every run and process, whatever was asked before (shared with :mod:`.simulate_ask`)."""
    return np.random.default_rng(_seed_of(*parts))


def seeded_uniform(*parts: Any) -> float:
    """A number in [0, 1) fixed by ``parts``, as :func:`seeded_rng` (one draw, no generator)."""
    return _seed_of(*parts) / 2.0**64


# ----------------------------------------------------------------------------------- knowledge
class KnowledgeBase:
    """The full KG (observed ∪ missing id triples) indexed by (head, relation), plus relation ↔ question maps.

    Reads only the vocabularies and triple files of an artifact folder (never its
    matrices, which can be gigabytes), verifying their sha256 against meta.json.
    """

    def __init__(self, *, entities: Sequence[str], relations: Sequence[str], triples: np.ndarray) -> None:
        self.entities = list(entities)
        self.relations = list(relations)
        n, r = len(self.entities), len(self.relations)
        triples = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
        if len(triples) and (triples.min() < 0 or triples[:, [0, 2]].max() >= n or triples[:, 1].max() >= r):
            raise UserError("simulator: triple ids out of range of the vocabularies")
        keys = (triples[:, 0] * r + triples[:, 1]) * n + triples[:, 2]
        keys = np.unique(keys)  # sorted, duplicates (observed and missing) removed
        self._hr = keys // n
        self._tails = (keys % n).astype(np.int64)
        self._entity_index = {name: i for i, name in enumerate(self.entities)}
        self._entity_folded: dict[str, int] = {}
        for i, name in enumerate(self.entities):
            self._entity_folded.setdefault(_fold(name), i)
        self._range: dict[int, np.ndarray] = {}
        self._relation_index = {name: i for i, name in enumerate(self.relations)}
        # The bridge's fallback templates (unique per artifact: colliding ones carry a qualifier)
        # and the simulator's own rewrites (made unique the same way).
        from llm_bridge.relations import RelationQuestions

        fallbacks = RelationQuestions(relations=self.relations)
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(self.relations):
            groups.setdefault(_fold_question(simulator_question(name)), []).append(i)
        self.rewrites: list[str] = []
        for i, name in enumerate(self.relations):
            q = simulator_question(name)
            if len(groups[_fold_question(q)]) > 1:
                q = prompts.render("fallback_qualified", question=q, relation=name)
            self.rewrites.append(q)
        self._questions: dict[str, int] = {}
        for i, name in enumerate(self.relations):
            for template in (self.rewrites[i], fallbacks.template(name)):
                self._questions.setdefault(_fold_question(template), i)
        self._question_keys = list(self._questions)
        self.num_triples = len(keys)

    @classmethod
    def from_artifact(cls, path: str | Path, *, verify: bool = True) -> "KnowledgeBase":
        """The KB of an artifact folder, read and checked by :mod:`kge.artifact`'s own readers
        (meta.json, format version, checksums of the four files used here unless ``verify=False``,
        i.e. ``--skip-artifact-checksums``): a UserError otherwise."""
        from kge.artifact import read_meta, read_triples, read_vocab

        path = Path(path)
        files = ("entities.tsv", "relations.tsv", "observed.tsv", "missing.tsv")
        read_meta(path, verify=verify, required=files, files=files)
        triples = np.concatenate([read_triples(path / "observed.tsv"), read_triples(path / "missing.tsv")])
        return cls(entities=read_vocab(path / "entities.tsv"), relations=read_vocab(path / "relations.tsv"),
                   triples=triples)

    def tails(self, head: int, relation: int) -> np.ndarray:
        """Sorted tail ids of (head, relation) in the full KG."""
        key = head * len(self.relations) + relation
        lo, hi = np.searchsorted(self._hr, [key, key + 1])
        return self._tails[lo:hi]

    def relation_range(self, relation: int) -> np.ndarray:
        """Sorted ids of every tail of ``relation`` (its plausible answers)."""
        hit = self._range.get(relation)
        if hit is None:
            rel = self._hr % len(self.relations) == relation
            hit = self._range[relation] = np.unique(self._tails[rel])
        return hit

    def entity(self, name: str) -> int | None:
        """Id of an entity named ``name`` (exact, else case/space-folded), or None."""
        i = self._entity_index.get(name)
        return i if i is not None else self._entity_folded.get(_fold(name))

    def relation_of_question(self, question: str) -> int | None:
        """The relation whose question template is ``question`` (a relation name also works), or None.

        Known templates: the simulator's own rewrites (:attr:`rewrites`), the bridge's fallbacks
        (:class:`llm_bridge.relations.RelationQuestions`), any template qualified with
        "(relation: NAME)"; near matches (rapidfuzz ratio >= 90 after case/space folding) count too.
        """
        if question in self._relation_index:
            return self._relation_index[question]
        qualified = _match_template(question, "fallback_qualified", "relation")
        if qualified is not None and qualified in self._relation_index:  # "... (relation: NAME)" names it
            return self._relation_index[qualified]
        folded = _fold_question(question)
        hit = self._questions.get(folded)
        if hit is not None:
            return hit
        try:
            from rapidfuzz import fuzz, process
        except ImportError:
            return None
        best = process.extractOne(folded, self._question_keys, scorer=fuzz.ratio, score_cutoff=90)
        return None if best is None else self._questions[best[0]]


def _fold(text: str) -> str:
    return " ".join(text.replace("_", " ").split()).casefold()


def _fold_question(template: str) -> str:
    return " ".join(re.sub(r"[^\w{}]+", " ", template).split()).casefold()


def simulator_question(relation: str) -> str:
    """The simulator's answer to a relation-question prompt: a question template for ``relation``."""
    words = prompts.relation_words(relation)
    if relation.endswith(INVERSE_SUFFIX):
        return f"Which entity has {prompts.ENTITY_SLOT} as its {words}?"
    return f"What is the {words} of {prompts.ENTITY_SLOT}?"


# --------------------------------------------------------------------------------------- the LLM
@dataclass
class Choice:
    """One simulated sample: its text and, per token, (token, logprob)."""

    text: str
    tokens: list[tuple[str, float]]
    finish_reason: str = "stop"


class SimulatedLLM:
    """Answers chat prompts from a :class:`KnowledgeBase` with the quality of a :class:`SimulatorConfig`."""

    def __init__(self, kb: KnowledgeBase, config: SimulatorConfig) -> None:
        self.kb = kb
        self.config = config

    # ---------------------------------------------------------------- dispatch
    def respond(self, messages: list[dict[str, Any]], *, n: int = 1, temperature: float = 1.0,
                seed: int | None = None) -> list[Choice]:
        """``n`` choices for ``messages`` (see the module docstring for what is recognised)."""
        first = int(seed or 0)
        indices = [0] * n if temperature == 0 else [first + i for i in range(n)]
        proj = prompts.parse_projection_request(messages)
        if proj is not None:
            cand = self.candidates(proj.question, proj.entities)  # once per request: shared by its choices
            return [self._projection(proj.question, proj.entities, proj.max_answers, c, cand) for c in indices]
        rq = prompts.parse_relation_question_prompt(messages)
        if rq is not None:
            return [self._relation_question(rq[0]) for _ in indices]
        user = user_text(messages)
        check = _match_template(user, "answer_check.user", "question", "answer")
        if check is not None:
            return [self._answer_check(*check) for _ in indices]
        return [_plain("I don't know.") for _ in indices]

    # ---------------------------------------------------------------- projection
    def truth(self, question: str, entities: Sequence[str]) -> tuple[int | None, list[int]]:
        """(relation id or None, sorted true tail ids) of a projection question over ``entities`` (union over inputs).

        A nested question (:mod:`llm_bridge.nested`) follows its chain of relations from
        ``entities``; the relation returned is the last one.
        """
        chain = [self.kb.relation_of_question(t) for t in unnest(question)]
        if not chain or any(r is None for r in chain):
            return None, []
        cur = {e for e in (self.kb.entity(name) for name in entities) if e is not None}
        for r in chain:
            tails: set[int] = set()
            for e in sorted(cur):
                tails.update(int(t) for t in self.kb.tails(e, r))
            cur = tails
        return chain[-1], sorted(cur)

    def recall_of(self, question: str) -> float:
        """The per-sample recall of a question: ``recall ** hops`` (a nested question over k relations must
        recall every hop; a plain one is ``recall``)."""
        return self.config.recall ** len(unnest(question))

    def candidates(self, question: str, entities: Sequence[str]) -> tuple[list[int], np.ndarray, list[int], np.ndarray, float]:
        """Per prompt: (true tails, their per-sample probabilities π, wrong pool, its weights, λ invented per sample)."""
        cfg = self.config
        r, truth = self.truth(question, entities)
        if not truth:
            return truth, np.zeros(0), [], np.zeros(0), 0.0
        rng = seeded_rng(cfg.seed, question, list(entities), "prompt")  # drawn in a fixed order: z, pool, weights
        z = rng.standard_normal(len(truth))
        recall = self.recall_of(question)
        pi = np.clip(recall + cfg.noise * z, 0.0, 1.0)
        h = cfg.hallucination
        lam = recall * len(truth) * h / (1.0 - h)
        pool: list[int] = []
        if lam > 0:
            size = max(3, 3 * len(truth), math.ceil(3 * lam))
            taken = set(truth)
            inputs = {self.kb.entity(e) for e in entities}
            for source in (self.kb.relation_range(r), None):
                cand = rng.permutation(source) if source is not None else rng.integers(0, len(self.kb.entities), 8 * size)
                for c in cand:
                    c = int(c)
                    if c not in taken and c not in inputs:
                        taken.add(c)
                        pool.append(c)
                        if len(pool) == size:
                            break
                if len(pool) == size:
                    break
        weights = np.exp(cfg.noise * rng.standard_normal(len(pool))) if pool else np.zeros(0)
        return truth, pi, pool, weights, lam

    def _projection(self, question: str, entities: list[str], max_answers: int, choice: int,
                    cand: tuple | None = None) -> Choice:
        cfg = self.config
        truth, pi, pool, weights, lam = cand if cand is not None else self.candidates(question, entities)
        rng = seeded_rng(cfg.seed, question, entities, "choice", choice)
        if not truth:
            return self._render([], {}, rng, refuse=True)
        picked: list[tuple[float, int]] = []  # (sort key, id)
        prob: dict[int, float] = {}
        for t, p in zip(truth, pi):
            if rng.random() < p:
                picked.append((-p + 0.05 * rng.random(), t))
                prob[t] = float(p)
        k = min(int(rng.poisson(lam)), len(pool)) if pool else 0
        if k:
            w = weights / weights.sum()
            wrong = rng.choice(len(pool), size=k, replace=False, p=w)
            for j in wrong:
                # Inventions come after most true answers but not always (sort key in [-0.5, 0]).
                p_j = float(min(1.0, lam * w[j]))
                picked.append((-0.5 * rng.random(), pool[int(j)]))
                prob[pool[int(j)]] = max(p_j, 1e-3)
        picked.sort()
        ids = [t for _, t in picked][:max_answers]
        return self._render(ids, prob, rng)

    def _render(self, ids: list[int], prob: dict[int, float], rng: np.random.Generator, *,
                refuse: bool = False) -> Choice:
        """The reply text of one choice as (segment, probability-or-None) pieces, tokenised with logprobs.

        ``rng`` continues the choice's stream after the selection, so the answers chosen do not
        depend on ``--messy``.
        """
        cfg = self.config
        if refuse:
            text = ["I don't know.", "I'm not sure about that.", "I don't know."][int(rng.integers(3))] if cfg.messy \
                else "I don't know."
            return _plain(text)
        names = [self.kb.entities[i] for i in ids]
        if cfg.messy:
            names = [_mess_name(nm, rng) for nm in names]
        style = int(rng.integers(6)) if cfg.messy else 0
        segs: list[tuple[str, float | None]] = []
        if style == 4:  # numbered lines
            segs.append(("Here are the answers:\n", None))
            for i, (nm, t) in enumerate(zip(names, ids), 1):
                segs += [(f"{i}. ", None), (nm, prob[t]), ("\n", None)]
        else:
            q = "'" if style == 3 else '"'
            body: list[tuple[str, float | None]] = [("[", None)]
            for i, (nm, t) in enumerate(zip(names, ids)):
                quoted = json.dumps(nm, ensure_ascii=False)[1:-1] if q == '"' else nm
                body += [((", " if i else "") + q, None), (quoted, prob[t]), (q, None)]
            body.append(("]", None))
            if style == 1:
                segs = [("```json\n", None), *body, ("\n```", None)]
            elif style == 2:
                segs = [*body, ("\nThese are the most likely answers.", None)]
            elif style == 5:
                segs = [("Sure! The answer is: ", None), *body]
            else:
                segs = body
        return _tokenise(segs)

    # ---------------------------------------------------------------- other prompts
    def _relation_question(self, relation: str) -> Choice:
        r = self.kb._relation_index.get(relation)
        if r is None:
            return _plain("I don't know.")
        return _plain(self.kb.rewrites[r])

    def _answer_check(self, question: str, answer_json: str) -> Choice:
        try:
            answer = json.loads(answer_json)
        except json.JSONDecodeError:
            answer = answer_json
        parsed = prompts.split_filled_question(question)
        if parsed is None or not isinstance(answer, str):
            return _plain("I don't know.")
        template, entities = parsed
        _, truth = self.truth(template, entities)
        a = self.kb.entity(answer)
        return _plain("Yes" if a is not None and a in truth else "No")


def _plain(text: str) -> Choice:
    return _tokenise([(text, None)])


def _tokenise(segments: Sequence[tuple[str, float | None]]) -> Choice:
    """Tokens that spell the text exactly; an entity's first token carries log p(entity), the rest ~0."""
    tokens: list[tuple[str, float]] = []
    for text, p in segments:
        pieces = _TOKEN.findall(text)
        assert "".join(pieces) == text
        for i, tok in enumerate(pieces):
            if p is None:
                lp = -0.001
            elif i == 0:
                lp = math.log(min(max(p, 1e-6), 1.0))
            else:
                lp = -0.005
            tokens.append((tok, lp))
    return Choice(text="".join(t for t, _ in tokens), tokens=tokens)


def _mess_name(name: str, rng: np.random.Generator) -> str:
    """A surface variant of an entity name, as models write them (the linker must map it back)."""
    k = int(rng.integers(5))
    if k == 1:
        return name.replace("_", " ")
    if k == 2:
        return name.lower()
    if k == 3:
        return "the " + name.replace("_", " ")
    return name


def user_text(messages: Sequence[dict[str, Any]]) -> str:
    """The content of the last user message of a chat request ("" without one)."""
    for m in reversed(messages):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"]
    return ""


_TEMPLATE_REGEX: dict[str, re.Pattern] = {}


def _match_template(text: str, name: str, *fields: str) -> Any:
    """Match ``text`` against package template ``name``; the values of ``fields`` (one, or a tuple), or None."""
    pattern = _TEMPLATE_REGEX.get(name)
    if pattern is None:
        raw = prompts.load_template(name).template
        out, pos = [], 0
        for m in re.finditer(r"\$(?:(\w+)|\{(\w+)\})", raw):
            f = m.group(1) or m.group(2)
            out.append(re.escape(raw[pos:m.start()]))
            out.append(f"(?P<{f}>[^\\n]*?)")
            pos = m.end()
        out.append(re.escape(raw[pos:]))
        pattern = _TEMPLATE_REGEX[name] = re.compile("".join(out), re.DOTALL)
    m = pattern.fullmatch(text.strip())
    if m is None:
        return None
    values = tuple(m.group(f) for f in fields)
    return values[0] if len(values) == 1 else values


# -------------------------------------------------------------------------------------- server
class SimulatorServer(ThreadingHTTPServer):
    """The HTTP server; ``base_url`` is ``http://host:port/v1``.  ``stats`` counts requests (under ``lock``)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, llm: SimulatedLLM, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.llm = llm
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.seen: dict[str, int] = {}
        self.stats = {"requests": 0, "completions": 0, "in_flight": 0, "max_in_flight": 0,
                      "injected_status": 0, "injected_hang": 0, "unauthorized": 0, "bad_requests": 0}

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def serve_forever(self, poll_interval: float = 0.05) -> None:
        """Serve until :meth:`stop`; it returns within ``poll_interval`` (socketserver's 0.5 s default cost
        every stop half a second of idle waiting: one per configuration of an experiment, per test)."""
        super().serve_forever(poll_interval)

    def stop(self) -> None:
        """Stop serving (hanging requests are released) and close the socket."""
        self.stopping.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: SimulatorServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm the second waits for the
    # client's delayed ACK (~40 ms per keep-alive request).
    disable_nagle_algorithm = True
    server_version = "kgreason-simulator/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence per-request logging
        pass

    # ---------------------------------------------------------------- helpers
    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout): nothing to answer

    def _error(self, status: int, message: str, kind: str = "invalid_request_error",
               headers: dict[str, str] | None = None) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": None}}, headers)

    def _authorised(self) -> bool:
        want = self.server.llm.config.api_key
        if want is None:
            return True
        got = self.headers.get("Authorization", "")
        got = got[7:] if got.startswith("Bearer ") else got
        if got == want:
            return True
        with self.server.lock:
            self.server.stats["unauthorized"] += 1
        # Like some real servers, echo the key received: the client must scrub it from what it reports.
        self._error(401, f"Incorrect API key provided: {got}", "invalid_api_key")
        return False

    # ---------------------------------------------------------------- routes
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?")[0].rstrip("/")
        if path == "/stats":
            with self.server.lock:
                self._send(200, dict(self.server.stats))
            return
        if not self._authorised():
            return
        if path in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [
                {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "kgreason"}]})
            return
        self._error(404, f"no route {path}", "not_found")

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        srv = self.server
        with srv.lock:
            srv.stats["requests"] += 1
            srv.stats["in_flight"] += 1
            srv.stats["max_in_flight"] = max(srv.stats["max_in_flight"], srv.stats["in_flight"])
        try:
            self._post(path, raw)
        finally:
            with srv.lock:
                srv.stats["in_flight"] -= 1

    def _post(self, path: str, raw: bytes) -> None:
        srv, cfg = self.server, self.server.llm.config
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route {path}", "not_found")
            return
        if not self._authorised():
            return
        try:
            body = json.loads(raw.decode("utf-8"))
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
                raise ValueError("'messages' must be a non-empty list of messages")
            n = body.get("n")
            n = 1 if n is None else n
            if not isinstance(n, int) or not 1 <= n <= 128:
                raise ValueError(f"'n' must be an integer in [1, 128], got {n!r}")
            temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
            seed = body.get("seed")
            if seed is not None and not isinstance(seed, int):
                raise ValueError(f"'seed' must be an integer, got {seed!r}")
            max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            with srv.lock:
                srv.stats["bad_requests"] += 1
            self._error(400, f"bad request: {exc}")
            return
        # Failure injection: decided per (body, occurrence), so a retry of the same body may pass.
        if cfg.fail_rate > 0:
            digest = hashlib.sha256(raw).hexdigest()
            with srv.lock:
                seen = srv.seen[digest] = srv.seen.get(digest, 0) + 1
            if seeded_uniform(cfg.seed, "fail", digest, seen) < cfg.fail_rate:
                mode = cfg.fail_mode
                if mode == "mixed":
                    mode = "hang" if seeded_uniform(cfg.seed, "mode", digest, seen) < 0.5 else "status"
                if mode == "status":
                    with srv.lock:
                        srv.stats["injected_status"] += 1
                    headers = {"Retry-After": "0"} if cfg.fail_status == 429 else None
                    self._error(cfg.fail_status, f"simulated failure (HTTP {cfg.fail_status})", "server_error",
                                headers)
                    return
                with srv.lock:
                    srv.stats["injected_hang"] += 1
                if srv.stopping.wait(cfg.hang_s):
                    return
        if cfg.latency_ms:
            srv.stopping.wait(cfg.latency_ms / 1000.0)
        if cfg.ignore_n:
            n = 1
        llm = srv.llm
        choices = llm.respond(messages, n=n, temperature=temperature, seed=seed)
        want_lp = bool(body.get("logprobs"))
        out = []
        completion_tokens = 0
        for i, ch in enumerate(choices):
            tokens, finish = ch.tokens, ch.finish_reason
            if isinstance(max_tokens, int) and max_tokens > 0 and len(tokens) > max_tokens:
                tokens, finish = tokens[:max_tokens], "length"
            text = "".join(t for t, _ in tokens)
            completion_tokens += len(tokens)
            item: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": text},
                                    "finish_reason": finish, "logprobs": None}
            if want_lp:
                item["logprobs"] = {"content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")),
                     "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}]
                     if body.get("top_logprobs") else []}
                    for t, lp in tokens]}
            out.append(item)
        prompt_tokens = sum(len(_WORDS.findall(m.get("content") or "")) for m in messages
                            if isinstance(m.get("content"), str))
        with srv.lock:
            srv.stats["completions"] += 1
        self._send(200, {
            "id": f"chatcmpl-sim-{hashlib.sha256(raw).hexdigest()[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or MODEL_NAME),
            "choices": out,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })


def start_server(artifact: str | Path | KnowledgeBase, config: SimulatorConfig | None = None, *,
                 host: str = "127.0.0.1", port: int = 0) -> SimulatorServer:
    """Start a simulator in a daemon thread (port 0 = a free port); call ``.stop()`` when done."""
    kb = artifact if isinstance(artifact, KnowledgeBase) else KnowledgeBase.from_artifact(artifact)
    try:
        server = SimulatorServer(SimulatedLLM(kb, config or SimulatorConfig()), host, port)
    except OSError as exc:
        raise UserError(f"simulator: cannot listen on {host}:{port} ({exc.strerror})") from None
    threading.Thread(target=server.serve_forever, name="llm-simulator", daemon=True).start()
    return server


# ------------------------------------------------------------------------------------------ CLI
def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m experiments.simulate",
                       description="Simulated OpenAI-compatible LLM answering from an artifact's full KG.")
    add_settings_arguments(p, SimulateSettings, only=("artifact", "host", "port"))
    add_settings_arguments(p, SimulatorConfig)
    add_settings_arguments(p, SimulateSettings, skip=("artifact", "host", "port"))
    return p


def parse_args(argv: Sequence[str] | None = None) -> tuple[SimulateSettings, SimulatorConfig]:
    """The server's settings and the simulator's configuration of ``argv`` (``--api-key-env``'s key read
    from the environment into the configuration, never echoed)."""
    import os

    ns = _parser().parse_args(argv)
    settings = settings_from_args(SimulateSettings, ns)
    key = None
    if settings.api_key_env:  # a key pasted as the flag's value is not echoed
        from llm_bridge.config import key_from_env

        key = key_from_env(settings.api_key_env, os.environ, "--api-key-env")
    return settings, settings_from_args(SimulatorConfig, ns, api_key=key)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args, config = parse_args(argv)
    kb = KnowledgeBase.from_artifact(args.artifact, verify=args.verify)
    return serve(SimulatedLLM(kb, config), args.host, args.port,
                 lambda url: f"simulated LLM on {url} ({len(kb.entities)} entities, {kb.num_triples} triples; "
                             f"recall {config.recall}, hallucination {config.hallucination}, noise {config.noise}, "
                             f"seed {config.seed})")


def serve(llm: "SimulatedLLM", host: str, port: int, banner) -> int:
    """Serve ``llm`` on ``host:port`` until Ctrl-C (the CLIs' foreground server); prints ``banner(url)`` once
    listening. A port that cannot be bound is a one-line :class:`UserError`."""
    try:
        server = SimulatorServer(llm, host, port)
    except (OSError, TypeError, ValueError) as exc:  # TypeError: a NUL in --host (socket.bind's own check)
        raise UserError(f"simulator: cannot listen on {host}:{port} ({getattr(exc, 'strerror', None) or exc})") from None
    print(banner(server.base_url), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
