"""Replies recorded from SmolLM2-135M-Instruct (llama.cpp, temperature 0) in engine.ask's KARPA loop on MetaQA.

The real model (``-m llm``) is not needed: these are its replies as the server returned them on
2026-11-25 (benchmarks/results/ask/metaqa_smollm2.md), and what the loop must make of them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llm_bridge import local
from llm_bridge.karpa_loop import parse_plan_reply, parse_reason_reply

# The reasoner listed answer names as bullets instead of the asked-for JSON object.
BULLETS = 'The answer entities are:\n- "John Sayles"\n- "Amigo"\n- "Pamela Sue Martin"'
# Prose with no list at all, and an echo of the candidate paths' relation names.
PROSE = "I think we should look at the movies first."


def test_a_reasoner_reply_of_bulleted_names_gives_its_answers():
    assert parse_reason_reply(BULLETS) == ((), ("John Sayles", "Amigo", "Pamela Sue Martin"))
    # JSON still wins where there is some, and a reply with neither stays a clear error
    assert parse_reason_reply('{"paths": [2], "answers": ["X"]}') == ((2,), ("X",))
    with pytest.raises(ValueError, match="no JSON"):
        parse_reason_reply(PROSE)
    with pytest.raises(ValueError, match="no JSON"):
        parse_reason_reply("I don't know.")


def test_recorded_malformed_plans_stay_malformed():
    # Recorded planner replies: a bulleted list of names is ambiguous (one path or several one-step plans),
    # so it is a malformed reply and the loop falls back to embedding-only retrieval.
    for reply in ("The relation paths to follow from the topic entity to answer are:\n- starred_actors^-1\n"
                  "- has_imdb_rating^-2\n- has_genre^-1",
                  'The movie written by [Coke Sams] released in 2019.\n\nHere is a JSON list of at most 3 relation '
                  'paths:\n```json\n{\n    "relation_1": "written_by^-1"\n}\n```'):
        with pytest.raises(ValueError):
            parse_plan_reply(reply)


def test_the_loop_keeps_bulleted_answers_that_are_candidates(llm_artifact):
    """Over the real loop: the recorded bullet reply's names that are candidate answers are picked by the LLM."""
    from engine.exec.api import Engine
    from engine.exec.ask import ReasonReply
    from llm_bridge.karpa_loop import LLMReasoner

    class Recorded(LLMReasoner):
        def __init__(self):
            super().__init__(client=None)

        def reason(self, requests):
            out = []
            for req in requests:
                name = next(a for p in req.paths for a in p.answers)
                paths, answers = parse_reason_reply(f'The answer entities are:\n- "{name}"\n- "Not An Entity"')
                out.append(ReasonReply(paths=paths, answers=answers, calls=1, tokens=1))
            return out

    eng = Engine.load(llm_artifact)
    r = eng.ask("who is likes of [Entity_003]", reasoner=Recorded(), encoder="hashing")
    assert r.answers and r.answers[0].selected_by == "llm"
    assert any("not among the candidates' tails, e.g. 'Not An Entity'" in w for w in r.warnings)


def test_server_command_bounds_prompt_threads_and_fits_the_reason_prompt():
    cmd = local.server_command(Path("/m.gguf"), host="127.0.0.1", port=8123, n_threads=1)
    assert cmd[:3] == [sys.executable, "-m", "llama_cpp.server"]
    assert cmd[cmd.index("--n_threads") + 1] == "1" and cmd[cmd.index("--n_threads_batch") + 1] == "1"
    assert cmd[cmd.index("--n_ctx") + 1] == str(local.DEFAULT_N_CTX) and local.DEFAULT_N_CTX >= 4096
    assert "--n_threads_batch" not in local.server_command(Path("/m.gguf"), host="127.0.0.1", port=1)


@pytest.mark.llm
def test_smollm2_runs_the_ask_loop_end_to_end(local_llm, llm_artifact, tmp_path, monkeypatch):
    """The real model through plan, re-plan and reason: whatever it replies, answers come back and every
    failure is a trace warning (opt-in: ``pytest -m llm``)."""
    from engine.exec.api import Engine
    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig
    from llm_bridge.karpa_loop import LLMPlanner, LLMReasoner

    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    eng = Engine.load(llm_artifact)
    cfg = LLMConfig(base_url=local_llm.base_url, model="smollm2", n=1, temperature=0.0, use_cache=False,
                    concurrency=1, max_retries=0, timeout_s=300, deadline_s=900, max_tokens=96)
    with LLMClient(cfg) as client:
        r = eng.ask("who is likes of [Entity_003]", planner=LLMPlanner(client), reasoner=LLMReasoner(client),
                    encoder="hashing")
        assert client.stats.requests >= 2 and client.stats.failures == 0, client.stats.to_json()
        # JSON-constrained replies (json_output="schema"): llama.cpp's grammar leaves SmolLM2 no way to
        # write prose or a relation that is not a candidate, so no reply is malformed and every plan is used.
        s = eng.ask("who is likes of [Entity_003]", planner=LLMPlanner(client, json_output="schema"),
                    reasoner=LLMReasoner(client, json_output="schema"), encoder="hashing")
        assert client.stats.failures == 0 and client.stats.response_format_fallbacks == 0
    assert r.llm_calls >= 2 and r.llm_tokens > 0 and r.error is None
    assert r.answers and r.answers[0].selected_by in ("llm", "vote", "best-path")
    assert [t["step"] for t in r.trace if t["step"] in ("plan", "reason")][-1] == "reason"
    assert s.error is None and s.retrieval != "embedding" and s.llm_calls == 3, s.warnings
    assert not [w for w in s.warnings if "malformed" in w], s.warnings
    plan_steps = [t for t in s.trace if t["step"] == "plan"]
    assert plan_steps and all(t["ok"] and t["plans"] for t in plan_steps), plan_steps
    rels = set(eng.artifact.relations)
    assert all(x in rels for t in plan_steps for p in t["plans"] for x in p), plan_steps
