"""Parsers of untrusted text are bounded: no recursion per nesting level, time linear in the input.

Every entry point that reads an LLM's reply (:func:`llm_bridge.parse.extract_entities`, the ask loop's
:func:`~llm_bridge.karpa_loop.parse_plan_reply` / :func:`~llm_bridge.karpa_loop.parse_reason_reply`,
:func:`~llm_bridge.parse.parse_yes_no`) and the bounded JSON reader
(:func:`kgreason.files.loads_json`, used for JSON-lines files and cache entries) gets adversarial
replies: deep nesting, brackets and quotes that never close, repeated openers, huge flat lists, long
runs of spaces after a fence, a bullet or a word.  Before this file, three of them were reported bugs
(issue 32): ``[[[[...`` was a RecursionError (and, cached, on every replay), ``[x`` repeated took the
ask loop's parser 17.5 s at 20 KB, ``['a`` repeated took LGOT's quoted-list rule 281 s at 150 KB.

The fast lane runs every case at 128 KB (the old code needed minutes to hours for most of them there,
or crashed); ``test_every_parser_is_bounded_at_the_reply_cap`` (slow; its fast twin is
``test_every_parser_is_bounded``) runs them at the client's 1 MiB reply cap.  Bounds are generous (the
machine is shared): the point is linear against quadratic, seconds against hours.
"""
from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kgreason.errors import UserError
from kgreason.files import MAX_JSON_DEPTH, json_depth, loads_json, read_json_objects
from llm_bridge.config import DEFAULT_MAX_RESPONSE_BYTES
from llm_bridge.karpa_loop import parse_plan_reply, parse_reason_reply
from llm_bridge.parse import extract_entities, iter_json_values, parse_yes_no, scan_json

CAP = DEFAULT_MAX_RESPONSE_BYTES  # 1 MiB: the largest reply the client reads


def _rep(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


#: name -> reply of about n characters
ADVERSARIAL = {
    "deep_open": lambda n: "[" * n,
    "deep_balanced": lambda n: "[" * (n // 2) + "]" * (n // 2),
    "deep_object": lambda n: _rep('{"a":', n),
    "open_x": lambda n: _rep("[x", n),  # issue 32: the ask loop's parser, 17.5 s at 20 KB
    "open_quote_single": lambda n: _rep("['a", n),  # issue 32: LGOT's quoted lists, 281 s at 150 KB
    "open_quote_double": lambda n: _rep('["a', n),
    "quotes_only": lambda n: "'" * n,
    "dquotes_only": lambda n: '"' * n,
    "flat_list": lambda n: "[" + _rep('"a", ', n - 6) + '"a"]',
    "flat_numbers": lambda n: "[" + _rep("1,", n - 3) + "1]",
    "list_of_lists_cut": lambda n: '{"plans": ' + _rep('["a", "b"], ', n),
    "nested_fail_late": lambda n: "[" * 64 + _rep("1,", n - 200) + "1]" + " x]" * 64,
    "fence_spaces": lambda n: "```" + " " * n + "x",
    "bullet_spaces": lambda n: "- a" + " " * n + "b",
    "comma_spaces": lambda n: "a" + " " * n + "b",
    "bullet_lines": lambda n: _rep("1. x\n", n),
    "mixed": lambda n: _rep('[{"name": ["a\', \'b', n),
    "open_brace_x": lambda n: _rep("{x", n),
    "backslashes": lambda n: _rep('["\\', n),
    "escaped_quotes": lambda n: '["' + _rep('\\"', n),
}


def _call(entry, text):
    try:
        return entry(text)
    except ValueError as exc:  # the karpa parsers' documented way of saying "not a reply I can use"
        return exc


ENTRIES = {
    "extract_entities": extract_entities,
    "extract_entities_limit": lambda t: extract_entities(t, limit=10),
    "parse_plan_reply": parse_plan_reply,
    "parse_reason_reply": parse_reason_reply,
    "parse_yes_no": parse_yes_no,
    "loads_json": loads_json,
    "iter_json_values": lambda t: list(iter_json_values(t)),
}


def _check_bounded(entry: str, case: str, size: int, bound_s: float) -> None:
    text = ADVERSARIAL[case](size)
    t0 = time.process_time()
    out = _call(ENTRIES[entry], text)  # no RecursionError, no other exception
    took = time.process_time() - t0
    assert took < bound_s, f"{entry} on {case} ({len(text):,} chars) took {took:.1f} s of CPU"
    if entry.startswith("extract_entities"):
        assert out.entities == [] or all(len(e) <= 200 for e in out.entities)


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_every_parser_is_bounded(entry, case):
    _check_bounded(entry, case, 128 * 1024, 5.0)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_every_parser_is_bounded_at_the_reply_cap(entry, case):
    """At the 1 MiB reply cap (fast twin: test_every_parser_is_bounded at 128 KB)."""
    _check_bounded(entry, case, CAP, 20.0)


# ------------------------------------------------------------------ the three reported bugs, at the cap
def test_deep_brackets_are_no_recursion_error():
    """issue 32 (a): ~1 KB of ``[`` passed the client's validation, then the answer parser recursed."""
    for text in ("[" * 1000, "[" * 1000 + "]" * 1000, '{"a":' * 300, "Answer: " + "[" * CAP):
        got = extract_entities(text)
        assert got.entities == [] and got.refused
        with pytest.raises(ValueError):
            parse_plan_reply(text)
        with pytest.raises(ValueError):
            parse_reason_reply(text)
    # brackets that never close are unusable; "[[[...]]]" holds (the innermost 100 levels of) an empty list
    assert [extract_entities(t).unusable for t in ("[" * 1000, '{"a":' * 300, "[" * 500 + "]" * 500)] == \
        [True, True, False]
    # a value nested deeper than MAX_JSON_DEPTH is not JSON; inside it, a shallow one still is
    assert extract_entities("[" * 5000 + '["Paris"]').entities == ["Paris"]
    assert parse_plan_reply('[["r1", "r2"]] ' + "[" * (MAX_JSON_DEPTH + 5)) == (("r1", "r2"),)


def test_the_ask_loops_reply_parser_is_linear():
    """issue 32 (b): ``[x`` repeated cost 1.0 s at 5 KB and 17.5 s at 20 KB (quadratic); now the cap."""
    text = _rep("[x", CAP)
    t0 = time.process_time()
    for parse in (parse_plan_reply, parse_reason_reply):
        with pytest.raises(ValueError, match="no JSON list or object"):
            parse(text)
    assert time.process_time() - t0 < 20.0


def test_the_quoted_list_rule_is_linear():
    """issue 32 (c): ``['a`` repeated (a quote that never closes): 75 KB took 70 s, 150 KB 281 s."""
    text = _rep("['a", CAP)
    t0 = time.process_time()
    got = extract_entities(text)
    assert time.process_time() - t0 < 10.0
    assert got.entities == [] and got.unusable
    # the same rule still reads what it is for
    assert extract_entities("['a', \"b's\", 'it's']").entities == ["a", "b's", "it's"]
    assert extract_entities("['x', 'y'] " + _rep("['a", 10_000)).entities == ["x", "y"]


# ------------------------------------------------------------------ normal replies read as before
@pytest.mark.parametrize("text, entities, how", [
    ('["Paris", "Lyon"]', ["Paris", "Lyon"], "json"),
    ('Sure! ```json\n["Paris"]\n``` hope it helps', ["Paris"], "json"),
    ('{"answers": ["a", "b"]}', ["a", "b"], "json-object"),
    ('{"data": {"answers": ["a"]}}', ["a"], "json-object"),
    ('[x, ["b"]]', ["b"], "json"),  # the outer value is not JSON: the inner one is
    ('[1, ["b"], x]', ["b"], "json"),  # the outer fails after the inner one closed
    ('[[["a"], ["b"]]]', ["a", "b"], "json"),
    ('He said "hi [ok] and ["c"]', ["c"], "json"),  # a stray quote in prose changes nothing
    ("['a', \"b's\"]", ["a", "b's"], "quoted-list"),
    ("- Paris - the capital\n- Lyon: a city", ["Paris", "Lyon"], "lines"),
    ("Answer: Paris, Lyon and Nice", ["Paris", "Lyon", "Nice"], "comma-list"),
    ("a ,  , b", ["a", "b"], "comma-list"),
    ("I don't know.", [], "refusal"),
])
def test_normal_replies_read_as_before(text, entities, how):
    got = extract_entities(text)
    assert (got.entities, got.how) == (entities, how)
    assert not got.unusable


def test_cut_off_plans_keep_their_complete_lists():
    assert parse_plan_reply('{"plans": [["a", "b"], ["c", "d') == (("a", "b"),)
    assert parse_plan_reply('[x] {"plans": [["a"], ["b"') == (("a",),)
    assert parse_plan_reply('[x, [["a"], ["b"') == (("a",),)  # the outer one cannot be closed, the inner can
    assert parse_reason_reply('{"paths": [1, 2], "answers": ["x", "y') == ((1, 2), ())
    assert parse_plan_reply('[["a", "b"], ["c", "d"]]') == (("a", "b"), ("c", "d"))


def test_a_huge_list_reads_its_first_thousand_items():
    text = json.dumps([f"name {i}" for i in range(5000)])
    got = extract_entities(text)
    assert got.entities == [f"name {i}" for i in range(1000)]
    assert got.dropped == ["... 4000 more items not read (at most 1000 are)"]
    assert extract_entities(text, limit=3).entities == ["name 0", "name 1", "name 2"]


def test_scan_json_spans_and_depth():
    assert scan_json('x [1, [2]] y "[3]"') == ([(2, 9), (6, 8), (14, 16)], [])
    assert scan_json('["]", [3]] [}] {"a": ["["]}') == ([(0, 9), (6, 8), (15, 26), (21, 25)], [])
    assert scan_json("[[[[x") == ([], [0, 1, 2, 3])
    assert scan_json("[[[[x", max_depth=2) == ([], [2, 3])
    assert scan_json("[[[[]]]]", max_depth=2) == ([(2, 5), (3, 4)], [])


_NAME = st.text(st.sampled_from("abcdefghij XYZ"), min_size=1, max_size=12).map(" ".join).map(str.split).map(" ".join)
_NAMES = st.lists(_NAME.filter(lambda s: s and s.lower() not in ("a", "an", "the")), max_size=6,
                  unique_by=lambda s: s.lower())


@settings(max_examples=150, deadline=None)
@given(_NAMES, st.integers(0, 6), st.sampled_from(["", "Answer: ", "Here they are:\n"]),
       st.sampled_from(["", "\nHope this helps.", " (from memory)"]))
def test_well_formed_replies_give_their_names(names, form, before, after):
    """Each accepted form of a list of names gives exactly those names (the property the old parser had;
    checked against the old code itself on 1,500 such replies and 1,500 short adversarial texts when this
    was written: no difference)."""
    body = [json.dumps(names), json.dumps({"answers": names}), repr(names),
            "\n".join(f"- {n}" for n in names), "\n".join(f"{i}. {n}" for i, n in enumerate(names, 1)),
            "```json\n" + json.dumps(names) + "\n```", json.dumps([{"name": n} for n in names])][form]
    if form in (3, 4):
        if not names:
            return  # no lines at all: the reply is the prose around them
        before, after = before and before.strip() + "\n", after and "\n" + after.strip()  # prose: own lines
    got = extract_entities(before + body + after)
    if names:
        assert got.entities == names
    else:
        assert got.entities == [] and got.refused


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(_NAME, min_size=1, max_size=3), min_size=1, max_size=4), st.booleans())
def test_well_formed_plans_round_trip(plans, wrapped):
    text = json.dumps({"plans": plans} if wrapped else plans)
    assert parse_plan_reply("Plan:\n" + text + "\n") == tuple(tuple(p) for p in plans)


# ------------------------------------------------------------------ the bounded JSON reader
def test_loads_json_is_bounded_and_refuses_nan_on_request():
    for text in ("[" * CAP, "[" * (CAP // 2) + "]" * (CAP // 2), '{"a":' * 200_000):
        with pytest.raises(ValueError, match="nested too deeply"):
            loads_json(text)
    assert loads_json("[" * 100 + "]" * 100) is not None
    assert json_depth('["[[[", {"b": "]]"}]') == 2 and json_depth('"[[[') == 0
    assert loads_json('{"x": NaN}')["x"] != 0  # json's default
    for text in ('{"x": NaN}', "[Infinity]", "[-Infinity]"):
        with pytest.raises(ValueError, match="is not a number JSON allows"):
            loads_json(text, allow_nan=False)


@pytest.mark.parametrize("line, message", [
    ("[" * CAP, "not JSON (nested too deeply)"),
    ('{"a": ' * 5000, "not JSON (nested too deeply)"),
    ("{", "not JSON (Expecting property name enclosed in double quotes)"),
    ("[1]", "expected a JSON object"),
])
def test_json_lines_reader_names_file_and_line(tmp_path, line, message):
    p = tmp_path / "q.jsonl"
    p.write_text('{"question": "ok"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        list(read_json_objects(p))
    assert str(info.value) == f"{p}:3: {message}"


def test_a_deeply_nested_response_body_is_a_bad_response_not_a_crash():
    """The client's reply validation parsed the body with json.loads: 100,000 levels were a RecursionError
    out of engine.answer --llm (any server could end the run)."""
    from _llm_server import scripted_server
    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig

    body = ('{"choices": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()
    with scripted_server(lambda request, headers: (200, body, None)) as srv, \
            LLMClient(LLMConfig(base_url=srv.base_url, model="m", use_cache=False, max_retries=0)) as client:
        got = client.complete_sync([{"role": "user", "content": "x"}])
    assert not got.ok and got.reason == "bad_response" and "not JSON" in got.message
