"""Text that leaves the process (issue 32, item 1): one rule, :mod:`kgreason.text`, applied where text is
printed or written.

* the helpers on random strings (hypothesis): no raw control, bidi or separator character out, printable text
  unchanged, the escaping reversible (distinct names stay distinct), JSON lines round-trip;
* end to end: ``engine.answer`` and ``engine.ask`` on a KG whose entity names hold ESC sequences, BEL, DEL, C1
  controls, bidi overrides and line separators, a questions file holding them, and a scripted LLM whose
  replies *spell* them as JSON escapes (decoded after the client's cleaning, so only the printing can catch
  them): the text output and the ``--json`` output hold none raw, and the JSON gives back the original strings;
* secrets: an API key pasted where ``--llm-api-key-env`` expects a variable name is never echoed.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from _llm_server import chat_reply, make_artifact, scripted_server  # tests/ is on sys.path
from kgreason.text import json_line, printable

#: Characters that act on a terminal or split a line: C0 (ESC, CR, BEL, NUL, LF, TAB ...), DEL, C1 (CSI 0x9b,
#: NEL 0x85), the bidi controls, the line/paragraph separators.
DANGEROUS = frozenset([*map(chr, range(0x00, 0x20)), "\x7f", *map(chr, range(0x80, 0xA0)),
                       *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)),
                       "\u200e", "\u200f", "\u061c", "\u2028", "\u2029"])


def raw_dangerous(text: str) -> list[str]:
    return sorted({c for c in text if c in DANGEROUS or 0xD800 <= ord(c) <= 0xDFFF} - {"\n"})


def unescape(text: str) -> str:
    """The inverse of :func:`printable` on text it escaped (``\\\\``, ``\\n``, ``\\xNN``, ``\\uNNNN``, ``\\UNNNNNNNN``)."""
    simple = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t"}
    return re.sub(r"\\(?:([\\nrt])|x([0-9a-f]{2})|u([0-9a-f]{4})|U([0-9a-f]{8}))",
                  lambda m: simple[m[1]] if m[1] else chr(int(m[2] or m[3] or m[4], 16)), text)


# any code point, surrogates and unassigned ones included, with the dangerous ones (and backslashes) frequent
ANY_CHAR = st.one_of(st.characters(codec=None, categories=None), st.sampled_from(sorted(DANGEROUS) + ["\\", "\ud800"]))
ANY_TEXT = st.text(ANY_CHAR, max_size=40)


# ------------------------------------------------------------------------------- the helpers
@given(ANY_TEXT)
def test_printable_output_is_one_printable_line_and_reversible(text):
    out = printable(text)
    assert out.isprintable() and not raw_dangerous(out) and "\n" not in out
    assert printable(out) == out  # applied twice: no double escaping
    if text.isprintable():
        assert out == text
    else:
        assert unescape(out) == text


@given(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E)))
def test_printable_keeps_ascii_printable_text(text):
    assert printable(text) == text


@given(ANY_TEXT, ANY_TEXT)
def test_distinct_strings_print_distinctly(a, b):
    # The one documented exception: a printable string that spells out the other's escaped form.
    if a != b and printable(a) == printable(b):
        assert (a.isprintable() and a == printable(b)) or (b.isprintable() and b == printable(a))


# Pieces whose concatenations spell out escapes next to the characters they stand for: where collisions live.
TIGHT_TEXT = st.lists(st.sampled_from(["\\", "\\x1b", "\\u202e", "\\n", "\\\\", "x1b", "\x1b", "\n", "\u202e", "a"]),
                      max_size=6).map("".join)


@given(st.lists(TIGHT_TEXT, min_size=2, max_size=12, unique=True))
def test_distinct_names_needing_escapes_stay_distinct(names):
    unsafe = [n for n in names if not n.isprintable()]
    for n in unsafe:
        assert unescape(printable(n)) == n  # reversible, hence injective on the strings it escapes
    assert len({printable(n) for n in unsafe}) == len(unsafe)
    safe = {n for n in names if n.isprintable()}
    for n in unsafe:  # the documented exception is the only way to collide with a printable name
        assert printable(n) not in safe or "\\" in printable(n)


def test_printable_examples():
    assert printable("Zoë ⟨llm⟩ —likes→ 東京") == "Zoë ⟨llm⟩ —likes→ 東京"
    assert printable("\x1b[2Jcleared") == "\\x1b[2Jcleared"
    assert printable("a\rb\x07\u202eabc\u2028\u2029\x7f\x9b\u200e\ud800\U000e0041") == \
        "a\\rb\\x07\\u202eabc\\u2028\\u2029\\x7f\\x9b\\u200e\\ud800\\U000e0041"
    # backslashes are doubled only where something else is escaped: C:\x stays, and the two below differ
    assert printable("C:\\x1b") == "C:\\x1b" and printable("C:\x1b") == "C:\\x1b"
    assert printable("C:\\x1b\n") == "C:\\\\x1b\\n" != printable("C:\x1b\n")
    names = ["A", "A\x1b", "A\x1b\x1b", "A\u202e", "A\u2028", "A\n", "A\r", "A\\\x1b"]
    assert len({printable(n) for n in names}) == len(names)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | ANY_TEXT,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
                           max_leaves=12)


@given(JSON_VALUES)
def test_json_line_round_trips_and_holds_no_raw_dangerous_character(value):
    line = json_line(value)
    assert json.loads(line) == value
    assert not raw_dangerous(line) and "\n" not in line
    assert line.isprintable()  # nothing raw but printable characters (JSON escapes the rest)


def test_json_line_stays_readable_utf8_and_takes_json_options():
    assert json_line({"name": "Zoë 東京"}) == '{"name": "Zoë 東京"}'
    assert json_line(["\u2028\u202e\x1b\x7f\x85\U000e0041"]) == '["\\u2028\\u202e\\u001b\\u007f\\u0085\\udb40\\udc41"]'
    indented = json_line({"a": ["\u2029"]}, indent=1, sort_keys=True)
    assert json.loads(indented) == {"a": ["\u2029"]} and "\u2029" not in indented


@given(ANY_TEXT)
def test_clean_text_removes_what_printable_escapes(text):
    """The client's cleaning on receipt and the printing agree on what is unsafe (one rule)."""
    from llm_bridge.text import clean_text

    out = clean_text(text)
    assert all(c in "\t\n" or c.isprintable() for c in out) and not raw_dangerous(out.replace("\t", ""))


# ------------------------------------------------------------------------------- end to end
#: Planted in entity names (a KG file cannot hold \t, \n or \r in a name: its lines are id<TAB>name).
NAME_MARKS = ["\x1b[2J", "\x07", "\u202e", "\u2028", "\u2029", "\x7f", "\x9b31m", "\u2066", "\u200f", "\x00", "\\\x1b"]


def _assert_safe_text(out: str) -> None:
    assert out, "nothing printed"
    for line in out.split("\n"):
        assert line.isprintable() and not raw_dangerous(line), repr(line)


@pytest.fixture(scope="module")
def evil_kg(tmp_path_factory) -> tuple[Path, list[str]]:
    """The tests' generated KG with every entity name carrying a dangerous mark."""
    from kge.artifact import Artifact

    root = tmp_path_factory.mktemp("evil")
    art = Artifact.load(make_artifact(root / "plain", drop=0.2))
    names = [f"{n}{NAME_MARKS[i % len(NAME_MARKS)]}x" for i, n in enumerate(art.entities)]
    Artifact(entities=names, relations=list(art.relations), matrices=art.matrices, observed=art.observed,
             missing=art.missing, meta=dict(art.meta)).save(root / "evil")
    return root / "evil", names


def _main(main, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_answer_prints_kg_names_and_query_lines_escaped(evil_kg, tmp_path):
    from engine.answer import main
    from engine.lang.query import format_name

    art, names = evil_kg
    queries = tmp_path / "queries.txt"
    quoted = format_name(names[3])  # the query language's "..." names: \" and \\ escaped, the rest raw
    queries.write_text(f"(p likes {quoted})\n(p likes #4)\n", encoding="utf-8")
    rc, out, err = _main(main, ["--artifact", str(art), "--queries", str(queries), "--top-k", "20"])
    assert rc == 0, err
    _assert_safe_text(out)
    assert printable(names[3]) in out  # the anchor, visibly escaped, in the query and the explanations
    rc, out, err = _main(main, ["--artifact", str(art), "--queries", str(queries), "--top-k", "20", "--json"])
    assert rc == 0, err
    _assert_safe_text(out)
    rows = [json.loads(line) for line in out.splitlines()]
    answers = [a["entity"] for r in rows for a in r["answers"]]
    assert answers and set(answers) <= set(names)  # the original strings, back from the JSON
    assert rows[0]["trace"]["nodes"][0]["entity"] == names[3]


def _ask_questions(tmp_path: Path, names: list[str]) -> Path:
    q = tmp_path / "questions.txt"
    q.write_text(f"who does [{names[3]}] like \x1b]0;title\x07 now\u2028\u202e?\n"
                 + json.dumps({"question": f"who likes [{names[5]}]\u2029", "answers": [names[7] + "\x1b[0m"]}) + "\n",
                 encoding="utf-8")
    return q


def test_ask_prints_questions_and_kg_names_escaped(evil_kg, tmp_path):
    from engine.ask import main

    art, names = evil_kg
    qfile = _ask_questions(tmp_path, names)
    base = ["--artifact", str(art), "--encoder", "hashing", "--encoder-kwargs", '{"dim": 32, "seed": 1}',
            "--questions", str(qfile), "--show-context"]
    rc, out, err = _main(main, base)
    assert rc == 0, err
    _assert_safe_text(out)
    _assert_safe_text(err)
    assert f"topic: {printable(names[3])}" in out
    context = out.split("  context:\n", 1)[1].split("question: ", 1)[0]
    assert printable(names[3]) in context  # one context line per line of the context, not split at U+2028
    rc, out, err = _main(main, base + ["--json"])
    assert rc == 0, err
    _assert_safe_text(out)
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows[0]["question"] == f"who does [{names[3]}] like \x1b]0;title\x07 now\u2028\u202e?"
    assert rows[1]["gold"] == [names[7] + "\x1b[0m"] and rows[0]["topic"] == names[3]
    assert {a["entity"] for r in rows for a in r["answers"]} <= set(names)


def test_paths_and_sample_print_and_write_kg_names_escaped(evil_kg, tmp_path):
    """The other CLIs that print or write KG names: engine.paths (text and --json), engine.sample's JSON lines."""
    from engine.paths.__main__ import main as paths_main
    from engine.sample import main as sample_main

    art, names = evil_kg
    argv = ["--artifact", str(art), "--from", names[3], "--plan", "likes, located_in", "--encoder", "hashing",
            "--encoder-kwargs", '{"dim": 32, "seed": 1}', "--k", "4"]
    for extra in ([], ["--json"]):
        rc, out, err = _main(paths_main, argv + extra)
        assert rc == 0, err
        _assert_safe_text(out)
    rows = json.loads(out)
    assert rows[0]["topic"] == names[3] and set(rows[0]["paths"][0]["tails"]) <= set(names)
    out_file = tmp_path / "queries.jsonl"
    rc, _, err = _main(sample_main, ["--artifact", str(art), "--structures", "1p", "2p", "--per-structure", "20",
                                     "--out", str(out_file), "--no-progress"])
    assert rc == 0, err
    text = out_file.read_text(encoding="utf-8")
    _assert_safe_text(text.rstrip("\n"))
    exprs = [json.loads(line)["expr"] for line in text.splitlines()]
    from engine.lang.query import parse

    assert len(exprs) == 40 and all(parse(e) for e in exprs)  # the names inside still parse back


#: What a hostile server's replies spell as JSON escapes: clear screen, CR, BEL, RLO, LS, a title-setting OSC.
SPELLED = ["\x1b[2Jcleared", "over\rwrite", "bel\x07", "\u202eabc", "x\u2028y", "\x1b]0;owned\x07"]


def _spelled_reply(body: dict, headers: dict):
    """The planner gets plans whose steps spell control characters, the reasoner answer names that do,
    LGOT's sub-questions answer lists that do; every reply is ASCII JSON (``\\u001b``: no raw character
    reaches the client, whose cleaning therefore cannot remove them)."""
    from experiments.simulate_ask import parse_plan_prompt

    text = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
    pp = parse_plan_prompt(body["messages"])
    if pp is not None:
        content = json.dumps({"plans": [[pp.relations[0], SPELLED[0]], [SPELLED[3], SPELLED[4]]]})
    elif "path" in text.lower() and "context" in text.lower():
        content = json.dumps({"paths": [1], "answers": SPELLED})
    else:
        content = json.dumps(["Entity_005"] + SPELLED)
    assert content.isascii()
    return 200, chat_reply(*[content] * int(body.get("n", 1))), None


def test_answer_llm_trace_prints_spelled_control_characters_escaped(tmp_path):
    """Regression: the LLM's answer list was decoded after the client's cleaning and its \\u001b[2J printed raw
    in the trace line (it cleared the screen); --json carried raw U+2028/U+202E.  (The ``llm:`` summary line
    was already ASCII JSON: checked here with a model name holding DEL and U+202E.)"""
    from engine.answer import main

    art = make_artifact(tmp_path / "art")
    with scripted_server(_spelled_reply) as srv:
        argv = ["--artifact", str(art), "--expr", "(p likes Entity_003)", "--llm", "--llm-base-url", srv.base_url,
                "--llm-model", "m\x7f\u202e", "--no-llm-cache", "--llm-relation-questions", "fallback",
                "--llm-max-retries", "0"]
        rc, out, err = _main(main, argv)
        assert rc == 0, err
        _assert_safe_text(out)
        _assert_safe_text(err)
        assert printable("\x1b[2Jcleared") in out and "trace:" in out
        assert json.loads(err.split("llm: ", 1)[1])["model"] == "m\x7f\u202e"
        rc, out, err = _main(main, argv + ["--json"])
    assert rc == 0, err
    _assert_safe_text(out)
    row = json.loads(out)
    root = row["trace"]["nodes"][-1]
    assert [a["text"] for a in root["notes"]["llm"]["answers"]][1:] == SPELLED  # the original strings, round trip


def test_ask_llm_plans_and_answers_print_escaped(evil_kg, tmp_path):
    """Regression: the ask loop printed the planner's steps (and --json carried them) with the control
    characters a reply spelled as JSON escapes."""
    from engine.ask import main

    art, names = evil_kg
    qfile = _ask_questions(tmp_path, names)
    with scripted_server(_spelled_reply) as srv:
        argv = ["--artifact", str(art), "--encoder", "hashing", "--encoder-kwargs", '{"dim": 32, "seed": 1}',
                "--questions", str(qfile), "--llm", "--llm-base-url", srv.base_url, "--llm-model", "m",
                "--no-llm-cache", "--llm-max-retries", "0"]
        rc, out, err = _main(main, argv)
        assert rc == 0, err
        _assert_safe_text(out)
        _assert_safe_text(err)
        assert printable(SPELLED[0]) in out  # the planned step, shown (escaped) in "plans:" or a warning
        rc, out, err = _main(main, argv + ["--json"])
    assert rc == 0, err
    _assert_safe_text(out)
    rows = [json.loads(line) for line in out.splitlines()]
    seen = json.dumps(rows)
    assert json.dumps(SPELLED[0]) in seen  # the original string is what the JSON gives back


# ------------------------------------------------------------------------------- secrets
KEYS = ["sk-proj-4fJ9x2LqT7vB1nM8pR3sW6yZ0aC5dE", "gsk_4fJ9x2LqT7vB1nM8pR3sW6yZ0aC5dEhK2", "AIzaSyD4fJ9x2LqT7vB1nM8pR3sW6y",
        "4fJ9X2LQT7VB1NM8PR3SW6YZ0AC5DEHK2UQ"]


@pytest.mark.parametrize("key", KEYS)
def test_a_key_given_as_the_api_key_env_flag_is_not_echoed(key, llm_artifact):
    """Regression: an API key pasted as the value of --llm-api-key-env (which names a variable) was echoed in the
    error message."""
    from engine.answer import main

    argv = ["--artifact", str(llm_artifact), "--expr", "(p likes Entity_003)", "--llm", "--llm-base-url",
            "http://127.0.0.1:9/v1", "--llm-model", "m", "--no-llm-cache", "--llm-api-key-env", key]
    rc, out, err = _main(main, argv)
    assert rc == 2 and key not in out + err and key[4:12] not in err
    assert err.startswith("error: --llm-api-key-env expects an environment variable name like OPENAI_API_KEY")
    assert "(not shown)" in err and len(err.splitlines()) == 1


def test_looks_like_secret_tells_keys_from_names():
    from llm_bridge.config import looks_like_secret

    assert all(looks_like_secret(k) for k in KEYS)
    assert not any(looks_like_secret(n) for n in ("OPENAI_API_KEY", "MY_KEY", "GROQ_API_KEY", "localhost:8080",
                                                  "127.0.0.1", "http://127.0.0.1:8080/v1", "MY_LLM_SERVER_KEY_2"))


def test_unset_variable_names_are_still_named(llm_artifact):
    from engine.answer import main

    argv = ["--artifact", str(llm_artifact), "--expr", "(p likes Entity_003)", "--llm", "--llm-base-url",
            "http://127.0.0.1:9/v1", "--llm-model", "m", "--no-llm-cache", "--llm-api-key-env", "NOPE_NOT_SET_KEY"]
    rc, _, err = _main(main, argv)
    assert rc == 2 and err == "error: --llm-api-key-env: environment variable NOPE_NOT_SET_KEY is not set\n"


@pytest.mark.parametrize("url, shown", [
    ("https://me:pa55-w0rd-secret@llm.example/v1?x=1", "'https://me:***@llm.example/v1?x=1'"),
    (KEYS[0], "(a value that looks like a key; not shown)"),
    ("localhost:8080/v1", "'localhost:8080/v1'"),
])
def test_base_url_errors_and_repr_mask_secrets(url, shown):
    from llm_bridge.config import LLMConfig, check_base_url

    with pytest.raises(ValueError) as info:
        check_base_url(url)
    assert str(info.value).endswith(f"got {shown}") and "pa55" not in str(info.value)
    cfg = LLMConfig(base_url="https://me:pa55-w0rd-secret@llm.example/v1")
    assert "pa55" not in repr(cfg) and "https://me:***@llm.example/v1" in repr(cfg)


@pytest.mark.parametrize("key", KEYS)
def test_a_key_given_as_the_simulators_api_key_env_flag_is_not_echoed(key, llm_artifact, monkeypatch):
    """The same regression in ``experiments.simulate --api-key-env`` (one shared check: config.key_from_env)."""
    from experiments.simulate import main

    monkeypatch.delenv(key, raising=False)
    rc, out, err = _main(main, ["--artifact", str(llm_artifact), "--port", "0", "--api-key-env", key])
    assert rc == 2 and key not in out + err and key[4:12] not in err
    assert err.startswith("error: --api-key-env expects an environment variable name like OPENAI_API_KEY")
