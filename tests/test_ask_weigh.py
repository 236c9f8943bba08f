"""How the LLM's word counts in the ask loop (AskSettings.plan_bonus / pick_bonus, docs/ask.md "Weighing the
LLM"): a plan or a reasoner's pick is evidence on the embedding-only cost scale, never an override.  A wrong
but valid proposal loses to a clearly better-worded path; a right one wins a close call.  The scripted
planner/reasoner name paths that exist from the topic (what the narrowed JSON schema allows)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.exec.ask import Asker, AskSettings, PlanReply, ReasonReply, question_text
import test_ask

kg, questions = test_ask.kg, test_ask.questions  # the same module-scoped fixtures (a KG of their own here)

BONUS = 0.3
#: "Clearly better" / "close": the cost gap beyond the bonus, in units of the vote temperature (0.1): a path
#: that far above the best weighs exp(-3) ~ 5% of it.
MARGIN = 0.3


class Plans:
    def __init__(self, path):
        self.path = path

    def plan(self, requests):
        return [PlanReply(plans=(self.path,)) for _ in requests]


class Picks:
    """Picks the candidate path ``path`` (relation names), whatever its number."""

    def __init__(self, path):
        self.path = path

    def reason(self, requests):
        return [ReasonReply(paths=tuple(i for i, p in enumerate(r.paths, 1) if tuple(p.relations) == self.path))
                for r in requests]


def costs_from_topic(asker, r):
    """Every relation sequence from the topic that reaches an entity, with its embedding-only cost."""
    seqs, _ = asker.reachable_sequences(int(r.topic_id), asker.settings.max_hops)
    cost = asker.score_sequences([seqs], [question_text(r.question)])[0]
    return {s: float(c) for s, c in zip(seqs, cost)}


def cases(kg, questions, *, k=16):
    """Per question: its embedding-only result, every path's cost, the answer sets of its candidates."""
    _, eng, ret = kg
    asker = Asker(eng, ret, settings=AskSettings(explain=False, plan_bonus=BONUS, pick_bonus=BONUS, k=k))
    out = []
    for (q, gold, answers), base in zip(questions, asker.ask([q for q, _, _ in questions])):
        out.append((q, gold, set(answers), base, costs_from_topic(asker, base)))
    return asker, out


def names(eng, rels):
    return tuple(eng.artifact.relations[x] for x in rels)


@pytest.mark.parametrize("who", ["planner", "reasoner"])
def test_a_wrong_valid_proposal_does_not_beat_a_clearly_better_path(kg, questions, who):
    """The planner (or the reasoner) proposes a path that exists from the topic and has answers, but none of
    the embedding-only first answer's, and costs more than the best candidate by over ``BONUS + MARGIN``: the
    first answer stays the embedding-only one (before: the plan ranked first, cost 0, and decided it; the
    pick decided it)."""
    # the reasoner sees every path (the worse too): half of the questions (two of each kind) keep that quick
    asker, got = cases(kg, questions if who == "planner" else questions[::2], k=16 if who == "planner" else 2000)
    eng = kg[1]
    tried = 0
    for q, gold, answers, base, cost in got:
        if not base.answers:
            continue
        best = min(p.vote_cost for p in base.paths)
        top = base.answers[0].id
        pool = base.paths  # the reasoner picks among the candidates
        if who == "planner":  # any path from the topic: also those embedding-only retrieval did not keep
            runs = [asker.ask([q], planner=Plans(names(eng, s)))[0] for s in sorted(cost, key=cost.get)[-3:]]
            pool = [p for r in runs for p in r.paths if p.source == "plan"]
        for p in pool:
            c = cost[p.relations] if p.relations in cost else p.vote_cost
            if not p.answers or any(a.id == top for a in p.answers) or c - BONUS < best + MARGIN:
                continue
            if who == "planner":
                r = asker.ask([q], planner=Plans(p.names))[0]
                assert any(x.source == "plan" and x.relations == p.relations for x in r.paths), r.trace
            else:
                r = asker.ask([q], reasoner=Picks(p.names))[0]
                assert any(t["step"] == "reason" and t["paths"] for t in r.trace)
            assert r.answers and r.answers[0].id == top, (q, p.names, c, best)
            tried += 1
            break
    assert tried >= 3, "the fixture should hold wrong proposals that cost clearly more than the best path"


@pytest.mark.parametrize("who", ["planner", "reasoner"])
def test_a_right_proposal_wins_a_close_call(kg, questions, who):
    """Where embedding-only answers wrong but the gold path costs less than ``BONUS - MARGIN/3`` above the best
    candidate, proposing the gold path makes the first answer right (a right LLM still helps); with a
    bonus of 0 it does not (the proposal is what decides)."""
    asker, got = cases(kg, questions)
    _, eng, ret = kg
    flat = Asker(eng, ret, settings=AskSettings(explain=False, plan_bonus=0.0, pick_bonus=0.0))
    eng_rel = list(eng.artifact.relations)
    tried = 0
    for q, gold, answers, base, cost in got:
        g = tuple(eng_rel.index(x) for x in gold)
        if not base.answers or base.answers[0].entity in answers or g not in cost:
            continue
        best = min(p.vote_cost for p in base.paths)
        if cost[g] - BONUS > best - MARGIN / 3 or (who == "reasoner" and g not in {p.relations for p in base.paths}):
            continue
        if who == "planner":
            r, r0 = (a.ask([q], planner=Plans(gold))[0] for a in (asker, flat))
        else:
            r, r0 = (a.ask([q], reasoner=Picks(tuple(gold)))[0] for a in (asker, flat))
        assert r.answers and r.answers[0].entity in answers, (q, gold, cost[g], best)
        assert r.answers[0].selected_by == ("llm" if who == "reasoner" else "vote")
        assert not (r0.answers and r0.answers[0].entity in answers)
        tried += 1
    assert tried >= 2, "the fixture should hold close calls that embedding-only gets wrong"


def test_llm_decides_restores_the_override(kg, questions):
    """``llm_decides``: the plan ranked first and the pick decides, whatever the costs (the loop before)."""
    _, eng, ret = kg
    q, gold, _ = questions[0]
    base = eng.ask(q, retriever=ret)
    worst = max((p for p in base.paths if p.answers), key=lambda p: p.vote_cost)
    r = eng.ask(q, retriever=ret, planner=Plans(worst.names), llm_decides=True, replan=False)
    src = [p.source for p in r.paths]
    assert worst.names in [p.names for p in r.paths if p.source == "plan"] and src == sorted(src, key=lambda x: x != "plan")
    assert r.answers[0].path in [p.names for p in r.paths if p.source == "plan"]
    r = eng.ask(q, retriever=ret, reasoner=Picks(worst.names), llm_decides=True)
    assert r.answers and all(a.path == worst.names and a.selected_by == "llm" for a in r.answers)


def test_bonus_settings_are_checked():
    from kgreason.errors import UserError

    for name in ("plan_bonus", "pick_bonus"):
        for bad in (-0.1, 11.0, True, "x"):
            with pytest.raises(UserError, match=f"--{name.replace('_', '-')} must"):
                AskSettings(**{name: bad})
    with pytest.raises(UserError, match="must be true or false"):
        AskSettings(llm_decides="yes")


def test_a_planned_path_weighs_its_cost_less_the_bonus(kg, questions):
    """The trace's ranking and the paths' vote cost: embedding-only cost, less plan_bonus for the plan."""
    _, eng, ret = kg
    q, gold, _ = questions[0]
    r = eng.ask(q, retriever=ret, planner=Plans(gold), replan=False, plan_bonus=0.5)
    plan = [p for p in r.paths if p.source == "plan"]
    assert plan and all(p.plan_bonus == 0.5 and p.vote_cost == pytest.approx(p.embedding_cost - 0.5) for p in plan)
    assert all(p.plan_bonus == 0.0 and p.vote_cost == p.embedding_cost for p in r.paths if p.source != "plan")
    assert [p.cost for p in r.paths] == sorted(p.cost for p in r.paths)
    assert np.allclose([p.cost for p in r.paths], [p.vote_cost for p in r.paths])
