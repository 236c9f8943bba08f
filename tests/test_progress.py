"""kgreason.progress: a tqdm bar on a terminal, plain lines (no carriage return) in a log."""
from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import time

from _llm_server import chat_reply, scripted_server
from kgreason.progress import LineProgress, is_terminal, progress_bar


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_occasional_plain_lines_and_a_final_one():
    out, clock = io.StringIO(), _Clock()
    bar = LineProgress(total=100, desc="work", unit="q", file=out, interval_s=10.0, clock=clock)
    for _ in range(100):  # 100 updates over 25 s: a line at 10 s and 20 s, then the final one
        clock.t += 0.25
        bar.update(1)
        bar.set_postfix(loss="0.5")
        bar.refresh()
    bar.close()
    bar.close()  # once
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines == ["work: 40/100 q (40%), 10.0 s, 4 q/s, loss=0.5",
                     "work: 80/100 q (80%), 20.0 s, 4 q/s, loss=0.5",
                     "work: 100/100 q (100%), done in 25.0 s, 4 q/s, loss=0.5"]


def test_rate_counts_from_initial_and_needs_a_second():
    """The LLM client's bar started at the prompts already done: n/elapsed over a fresh bar read 885036 prompt/s."""
    out, clock = io.StringIO(), _Clock()
    bar = LineProgress(total=1000, initial=900, desc="llm", unit="prompt", file=out, clock=clock)
    clock.t += 0.001
    bar.close()
    assert out.getvalue() == "llm: 900/1,000 prompt (90%), done in 0.0 s\n"  # no rate over a millisecond
    out, clock = io.StringIO(), _Clock()
    bar = LineProgress(total=1000, initial=900, desc="llm", unit="prompt", file=out, clock=clock)
    clock.t += 2.0
    bar.update(10)
    bar.close()
    assert out.getvalue() == "llm: 910/1,000 prompt (91%), done in 2.0 s, 5 prompt/s\n"


def test_iteration_reset_write_and_disable():
    out = io.StringIO()
    assert list(progress_bar(range(3), desc="it", file=out, unit="x")) == [0, 1, 2]
    assert out.getvalue().startswith("it: 3/3 x (100%), done in ") and out.getvalue().count("\n") == 1
    out = io.StringIO()
    bar = progress_bar(total=5, file=out, disable=True)
    bar.update(5)
    bar.write("epoch 1: loss 0.3")  # messages still go out; the bar's lines do not
    bar.close()
    assert out.getvalue() == "epoch 1: loss 0.3\n"
    out = io.StringIO()
    with progress_bar(total=4, desc="epoch 1/2", file=out, unit="batch") as bar:
        bar.update(4)
        bar.reset()
        bar.set_description("epoch 2/2")
        bar.update(2)
    assert out.getvalue().startswith("epoch 2/2: 2/4 batch (50%), done in ")


def test_a_terminal_gets_a_tqdm_bar():
    from tqdm import tqdm

    term = _Terminal()
    assert is_terminal(term) and not is_terminal(io.StringIO()) and not is_terminal(None)
    bar = progress_bar(total=3, desc="work", file=term)
    assert isinstance(bar, tqdm)
    bar.update(3)
    bar.close()
    assert "\r" in term.getvalue() and "work" in term.getvalue()
    assert isinstance(progress_bar(total=3, file=io.StringIO()), LineProgress)


def test_closed_stream_is_not_an_error():
    out = io.StringIO()
    bar = progress_bar(total=2, file=out)
    out.close()
    assert not is_terminal(out)
    bar.update(2)
    bar.close()  # nothing to write to: progress is dropped, not raised


def _first_reply_slow():
    """A reply handler whose first reply waits longer than the client's one second before it shows progress
    (a bar drawn into the log, the regression's condition); the later ones answer at once, since another
    stage's bar adds only waiting (each reply slow: ~4.8 s of wall for ~0 s of CPU)."""
    replies = []

    def reply(req, headers):
        replies.append(req)
        if len(replies) == 1:
            time.sleep(1.6)
        return 200, chat_reply('["Entity_007"]'), {}
    return reply


def test_cli_with_stderr_in_a_file_writes_lines_and_keeps_the_llm_summary(llm_artifact, tmp_path, monkeypatch):
    """Regression: tqdm's redraws (carriage returns) shared the line of the `llm: {...}` summary in a log.

    engine.answer's main(argv) in this process with sys.stderr a real file (what `2> log` gives the process:
    not a terminal); a fresh interpreter cost ~3.5 s of CPU importing torch again.  The real entry point's
    exit status and stderr are test_engine_cli.py's."""
    from engine.answer import main

    log = tmp_path / "stderr.log"
    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with scripted_server(_first_reply_slow()) as srv, open(log, "w", encoding="utf-8") as err, \
            contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["--artifact", str(llm_artifact), "--expr", "(p likes Entity_003)", "--llm", "--llm-base-url",
                   srv.base_url, "--llm-model", "m", "--no-llm-cache", "--llm-deadline", "30"])
    text = log.read_bytes().decode("utf-8")  # not read_text: universal newlines would turn "\r" into "\n"
    assert rc == 0, text
    assert "\r" not in text, text
    lines = text.split("\n")  # a line reader's lines
    assert any(line.startswith("llm: ") and "prompt (100%), done in " in line for line in lines), text
    summary = [line for line in lines if line.startswith("llm: {")]
    assert len(summary) == 1 and '"requests": ' in summary[0], text


def _one_slow_prompt(req, headers):
    if "Entity_000" in json.dumps(req):
        time.sleep(0.8)  # the bar appears after 0.3 s (the test's), when the other 49 prompts are done
    return 200, chat_reply('["Entity_007"]'), {}


def test_llm_client_rate_counts_only_what_the_bar_saw(monkeypatch, tmp_path):
    """Regression: the client's bar began at the prompts already done and divided them by its own age:
    "885036.62prompt/s" on a terminal."""
    from llm_bridge import client as llm_client
    from llm_bridge import prompts
    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig

    batch = [prompts.projection_messages(prompts.fallback_template("likes"), [f"Entity_{i:03d}"]) for i in range(50)]
    term = _Terminal()
    # the bar after 0.3 s instead of the client's 1 s (waiting only); the other 49 prompts are cache hits, done
    # before it appears however busy the machine (the condition of the regression)
    monkeypatch.setattr(llm_client, "_PROGRESS_AFTER_S", 0.3)
    with scripted_server(_one_slow_prompt) as srv, \
            LLMClient(LLMConfig(base_url=srv.base_url, model="m", n=1, timeout_s=10.0, max_retries=0,
                                concurrency=4, cache_path=tmp_path / "cache.sqlite")) as client:
        assert all(r.ok for r in client.complete_many_sync(batch[1:]))
        monkeypatch.setattr(sys, "stderr", term)
        assert all(r.ok for r in client.complete_many_sync(batch))
    text = term.getvalue()
    rates = [float(x) for x in re.findall(r"([\d.]+)prompt/s", text)]
    assert rates and "49/50" in text, text
    # tqdm's rate: prompts done between two refreshes at least mininterval (0.5 s) apart, so 50 prompts make
    # at most 100/s; the old bar divided the prompts done before it existed by its age of microseconds
    assert max(rates) < 100, text
