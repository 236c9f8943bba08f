"""A simulated KARPA planner/reasoner, served over HTTP by the simulator (:mod:`experiments.simulate`).

::

    python -m experiments.simulate_ask --artifact artifacts/metaqa --questions questions.jsonl \\
        --plan-error 0.2 --reason-error 0.1 --port 8099
    python -m engine.ask --artifact artifacts/metaqa --questions questions.jsonl \\
        --llm-base-url http://127.0.0.1:8099/v1 --llm-model sim

It knows the gold relation path of every benchmark question (``--questions``:
JSON lines ``{"question": ..., "path": ["r1", "r2"], "answers": [...]}``, the
format ``python -m engine.ask --questions`` reads) and answers the prompts of
:mod:`llm_bridge.karpa_loop` (recognised by parsing the real prompt text); every
other prompt goes to the LGOT simulator it extends (:class:`SimulatedLLM`).

* **planning**: with probability ``plan_error`` per question the planner is
  *wrong*: one step of the gold path (picked at random) is replaced by another
  relation of the KG, in both rounds.  Round 1 paraphrases every step
  (``directed_by`` → "director of", ``starred_actors^-1`` → "inverse of
  starring actors" ...: readable words, a synonym, filler); round 2, which shows
  candidate relations, names a step exactly when it is among the candidates
  and paraphrases it otherwise (``--no-exact-replan``: always paraphrase).  A
  question the simulator does not know gets the reply "[]".
* **failure modes** (fractions of questions, decided per question and applied to
  both rounds): ``unknown`` (a plan naming a relation the KG lacks), ``empty``
  (``[]``), ``malformed`` (prose with no JSON).  HTTP failures and timeouts
  come from the base simulator's ``--fail-rate`` / ``--fail-mode``.
* **reasoning**: returns ``{"paths": [i]}`` for the candidate path equal to the
  gold path; with probability ``reason_error`` another candidate instead; path
  1 when the gold path is not among the candidates.

Draws are seeded by sha256 of (``--seed``, the question, what is drawn), so
replies are deterministic and identical whatever the batching.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from kgreason.cli import ArgumentParser, Settings, add_settings_arguments, same_setting, setting, settings_from_args
from kgreason.constants import INVERSE_SUFFIX
from kgreason.errors import UserError, cli_main

from .simulate import (Choice, KnowledgeBase, SimulatedLLM, SimulateSettings, SimulatorConfig, SimulatorServer, seeded_rng,
                       seeded_uniform, serve, user_text)

__all__ = ["AskSimConfig", "SimulateAskSettings", "AskSimulatedLLM", "load_gold", "paraphrase", "start_ask_server", "main",
           "parse_plan_prompt", "parse_reason_prompt", "PlanPrompt", "ReasonPrompt"]

_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")
#: Words a paraphrase may swap (MetaQA's and generic relation vocabulary).
SYNONYMS = {
    "directed": ("director of", "direction by"), "starred": ("starring", "acted in by"),
    "actors": ("actors", "cast"), "written": ("writer of", "screenplay by"), "genre": ("category", "kind of genre"),
    "language": ("spoken language", "language used"), "release": ("released in", "premiere"),
    "year": ("year", "date"), "tags": ("topics", "keywords"), "imdb": ("IMDb",), "rating": ("score", "rating"),
    "votes": ("vote count", "votes"), "located": ("situated", "found"), "parent": ("mother or father", "parent"),
    "likes": ("is fond of", "likes"), "works": ("is employed", "works"),
}


@dataclass(frozen=True, kw_only=True)
class AskSimConfig(Settings):
    """The simulated planner's and reasoner's quality (fractions of questions, in [0, 1]); each field's flag
    and range are declared with it (``python -m experiments.simulate_ask`` parses straight into it)."""

    plan_error: float = setting(0.0, low=0, high=1, help="fraction of questions planned wrong")
    reason_error: float = setting(0.0, low=0, high=1, help="fraction of questions whose reasoning picks a wrong path")
    unknown: float = setting(0.0, low=0, high=1, help="fraction of plans naming an unknown relation")
    empty: float = setting(0.0, low=0, high=1, help="fraction of empty plans")
    malformed: float = setting(0.0, low=0, high=1, help="fraction of malformed planner replies")
    synonym_rate: float = setting(0.5, low=0, high=1, help="probability that a paraphrase swaps a word for a synonym")
    exact_replan: bool = setting(True, flag="--no-exact-replan", negate=True, help="paraphrase in the second round too")


# ------------------------------------------------------------------ the KARPA prompts, read back
# The prompts are llm_bridge.karpa_loop's (PLAN_USER, REASON_USER); only this simulator reads them back,
# so the readers live here, beside it, not in the library.
_QUESTION = re.compile(r"^Question: (.*)$", re.MULTILINE)
_TOPIC = re.compile(r"^Topic entity: (.*)$", re.MULTILINE)


@dataclass(frozen=True)
class PlanPrompt:
    """A planner prompt read back: question, topic, candidate relations, previous plans (None in round 1)."""

    question: str
    topic: str
    relations: tuple[str, ...]
    previous: tuple[tuple[str, ...], ...] | None


@dataclass(frozen=True)
class ReasonPrompt:
    """A reasoner prompt read back: question, topic, candidate paths (relation names)."""

    question: str
    topic: str
    paths: tuple[tuple[str, ...], ...]


def _block(text: str, start: str, stop: str) -> list[str]:
    i = text.find(start)
    if i < 0:
        return []
    body = text[i + len(start):]
    j = body.find(stop)
    return [l for l in (body if j < 0 else body[:j]).splitlines() if l.strip()]


def parse_plan_prompt(messages: Sequence[dict[str, Any]]) -> PlanPrompt | None:
    """The fields of a :func:`~llm_bridge.karpa_loop.plan_messages` prompt, or None for any other prompt."""
    text = user_text(messages)
    if not text.startswith("Task: plan relation paths."):
        return None
    q, t = _QUESTION.search(text), _TOPIC.search(text)
    if q is None or t is None:
        return None
    rels = tuple(l[2:].strip() for l in _block(text, "Candidate relations:\n", "\nReply with") if l.startswith("- "))
    previous = None
    if "Your previous plans:\n" in text:
        prev = []
        for l in _block(text, "Your previous plans:\n", "\nRevise them"):
            try:
                p = json.loads(l[2:])
            except ValueError:
                continue
            if isinstance(p, list):
                prev.append(tuple(str(x) for x in p))
        previous = tuple(prev)
        rels = tuple(r for r in rels if not r.startswith("["))
    return PlanPrompt(q.group(1), t.group(1), rels, previous)


def parse_reason_prompt(messages: Sequence[dict[str, Any]]) -> ReasonPrompt | None:
    """The fields of a :func:`~llm_bridge.karpa_loop.reason_messages` prompt, or None for any other prompt."""
    text = user_text(messages)
    if not text.startswith("Task: choose reasoning paths."):
        return None
    q, t = _QUESTION.search(text), _TOPIC.search(text)
    if q is None or t is None:
        return None
    paths = []
    for l in _block(text, "Candidate paths:\n", "\nKnowledge ("):
        m = re.match(r"(\d+)\. (.*)$", l)
        if m:
            paths.append(tuple(x.strip() for x in m.group(2).split(" -> ")))
    return ReasonPrompt(q.group(1), t.group(1), tuple(paths))


def _fold(q: str) -> str:
    return " ".join(q.split()).casefold()


def load_gold(path: str | Path, relations: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
    """question (case/space-folded) -> gold relation path, from a JSON-lines questions file.

    Errors name ``file:line``; with ``relations`` every path step must be one of them.
    """
    from kgreason.files import read_json_objects, relation_path_field, text_field

    gold: dict[str, tuple[str, ...]] = {}
    for where, obj in read_json_objects(path, what="--questions", shape='{"question": ..., "path": [...]}'):
        gold[_fold(text_field(obj, "question", where))] = relation_path_field(obj, "path", where, relations)
    if not gold:
        raise UserError(f"--questions: {path} has no questions")
    return gold


def paraphrase(name: str, rng: np.random.Generator, synonym_rate: float = 0.5) -> str:
    """A paraphrase of a relation name: its words, one swapped for a synonym with probability
    ``synonym_rate`` (when one is known), and filler; inverses keep "inverse of"."""
    inverse = name.endswith(INVERSE_SUFFIX)
    base = name[: -len(INVERSE_SUFFIX)] if inverse else name
    words = [w for w in re.split(r"[/._\s]+", base) if w]
    swappable = [i for i, w in enumerate(words) if w.lower() in SYNONYMS]
    if swappable and rng.random() < synonym_rate:
        i = swappable[int(rng.integers(len(swappable)))]
        opts = SYNONYMS[words[i].lower()]
        words[i] = opts[int(rng.integers(len(opts)))]
        words = [w for j, w in enumerate(words) if not (j == i + 1 and w.lower() in ("by", "of", "in"))]
    text = " ".join(words)
    filler = rng.random()
    if filler < 0.3:
        text = f"the {text}"
    elif filler < 0.6 or len(text.split()) == 1:
        text += " relation"  # also: a single word would be read as a relation name, not a paraphrase  # a single word would be read as a relation name, not a paraphrase
    return f"inverse of {text}" if inverse else text


def _choice(text: str) -> Choice:
    tokens = [(t, -0.001) for t in _TOKEN.findall(text)]
    return Choice(text=text, tokens=tokens)


class AskSimulatedLLM(SimulatedLLM):
    """:class:`SimulatedLLM` that also answers the KARPA loop's plan and reason prompts."""

    def __init__(self, kb: KnowledgeBase, config: SimulatorConfig, *, ask: AskSimConfig,
                 gold: Mapping[str, Sequence[str]]) -> None:
        super().__init__(kb, config)
        self.ask = ask
        self.gold = {_fold(q): tuple(p) for q, p in gold.items()}
        self.counts = {"plan": 0, "reason": 0}

    def respond(self, messages: list[dict[str, Any]], *, n: int = 1, temperature: float = 1.0,
                seed: int | None = None) -> list[Choice]:
        pp = parse_plan_prompt(messages)
        if pp is not None:
            self.counts["plan"] += 1
            return [_choice(self._plan(pp))] * n
        rp = parse_reason_prompt(messages)
        if rp is not None:
            self.counts["reason"] += 1
            return [_choice(self._reason(rp))] * n
        return super().respond(messages, n=n, temperature=temperature, seed=seed)

    def _draw(self, question: str, what: str) -> float:
        return seeded_uniform(self.config.seed, "ask", _fold(question), what)

    def _plan(self, pp) -> str:
        gold = self.gold.get(_fold(pp.question))
        if gold is None:
            return "[]"
        a = self.ask
        u = self._draw(pp.question, "failure")
        if u < a.malformed:
            return "I would follow the movies of the topic entity and then look at who made them."
        if u < a.malformed + a.empty:
            return "[]"
        if u < a.malformed + a.empty + a.unknown:
            return json.dumps([["zzglorp_quuxify"] + list(gold[1:])])
        path = list(gold)
        if self._draw(pp.question, "plan") < a.plan_error:
            rng = seeded_rng(self.config.seed, "ask-wrong", _fold(pp.question))
            j = int(rng.integers(len(path)))
            others = [r for r in self.kb.relations if r != path[j]]
            if others:
                path[j] = others[int(rng.integers(len(others)))]
        round2 = pp.previous is not None
        steps = []
        for j, r in enumerate(path):
            if round2 and a.exact_replan and r in pp.relations:
                steps.append(r)
            else:
                steps.append(paraphrase(r, seeded_rng(self.config.seed, "para", _fold(pp.question), j, round2),
                                        a.synonym_rate))
        return json.dumps([steps], ensure_ascii=False)

    def _reason(self, rp) -> str:
        gold = self.gold.get(_fold(rp.question))
        if not rp.paths:
            return json.dumps({"paths": [], "answers": []})
        right = next((i for i, p in enumerate(rp.paths, 1) if gold is not None and tuple(p) == gold), None)
        if right is None:
            return json.dumps({"paths": [1], "answers": []})
        if len(rp.paths) > 1 and self._draw(rp.question, "reason") < self.ask.reason_error:
            rng = seeded_rng(self.config.seed, "ask-reason", _fold(rp.question))
            others = [i for i in range(1, len(rp.paths) + 1) if i != right]
            return json.dumps({"paths": [others[int(rng.integers(len(others)))]], "answers": []})
        return json.dumps({"paths": [right], "answers": []})


def start_ask_server(artifact: str | Path | KnowledgeBase, gold: Mapping[str, Sequence[str]],
                     ask: AskSimConfig | None = None, config: SimulatorConfig | None = None, *,
                     host: str = "127.0.0.1", port: int = 0) -> SimulatorServer:
    """Start the simulator with the KARPA planner/reasoner in a daemon thread; ``.stop()`` when done."""
    import threading

    kb = artifact if isinstance(artifact, KnowledgeBase) else KnowledgeBase.from_artifact(artifact)
    llm = AskSimulatedLLM(kb, config or SimulatorConfig(), ask=ask or AskSimConfig(), gold=gold)
    try:
        server = SimulatorServer(llm, host, port)
    except OSError as exc:
        raise UserError(f"simulator: cannot listen on {host}:{port} ({exc.strerror})") from None
    threading.Thread(target=server.serve_forever, name="ask-simulator", daemon=True).start()
    return server


@dataclass(frozen=True, kw_only=True)
class SimulateAskSettings(Settings):
    """``python -m experiments.simulate_ask``'s flags besides the planner's quality (:class:`AskSimConfig`):
    the server's and the failure injection's, declared as :mod:`.simulate`'s."""

    artifact: str = same_setting(SimulateSettings, "artifact", help="artifact folder (its relations and full KG)")
    questions: str = setting(metavar="FILE",
                             help='JSON lines {"question": ..., "path": [relation names]} (the gold paths)')
    host: str = same_setting(SimulateSettings, "host")
    port: int = same_setting(SimulateSettings, "port")
    seed: int = same_setting(SimulatorConfig, "seed")
    latency_ms: float = same_setting(SimulatorConfig, "latency_ms")
    fail_rate: float = same_setting(SimulatorConfig, "fail_rate")
    fail_mode: str = same_setting(SimulatorConfig, "fail_mode")
    hang_s: float = same_setting(SimulatorConfig, "hang_s")
    verify: bool = same_setting(SimulateSettings, "verify")

    @property
    def simulator(self) -> SimulatorConfig:
        """The simulator's configuration: these failure settings, the quality defaults (the planner's
        replies come from :class:`AskSimConfig`)."""
        return SimulatorConfig(seed=self.seed, latency_ms=self.latency_ms, fail_rate=self.fail_rate,
                               fail_mode=self.fail_mode, hang_s=self.hang_s)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m experiments.simulate_ask",
                       description="Simulated KARPA planner/reasoner (OpenAI-compatible HTTP) that knows each "
                                   "benchmark question's gold relation path.")
    add_settings_arguments(p, SimulateAskSettings, only=("artifact", "questions"))
    add_settings_arguments(p, AskSimConfig)
    add_settings_arguments(p, SimulateAskSettings, skip=("artifact", "questions"))
    return p


def parse_args(argv: Sequence[str] | None = None) -> tuple[SimulateAskSettings, AskSimConfig]:
    """The server's settings and the planner's quality of ``argv``."""
    ns = _parser().parse_args(argv)
    return settings_from_args(SimulateAskSettings, ns), settings_from_args(AskSimConfig, ns)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args, ask = parse_args(argv)
    kb = KnowledgeBase.from_artifact(args.artifact, verify=args.verify)
    gold = load_gold(args.questions, kb.relations)
    return serve(AskSimulatedLLM(kb, args.simulator, ask=ask, gold=gold), args.host, args.port,
                 lambda url: f"simulated KARPA planner on {url} ({len(gold)} questions; plan error "
                             f"{ask.plan_error}, reason error {ask.reason_error})")


if __name__ == "__main__":
    sys.exit(main())
