"""The client's HTTP side (llm_bridge/client_http.py) on the openai SDK's public API only: the retry rules,
Retry-After from the public response headers, responses counted by the http client's event hook, the sync API's
event loop; and an AST check that no module of llm_bridge reaches into the SDK's privates again."""
from __future__ import annotations

import ast
import email.utils
import random
import threading
import time

import pytest

from _llm_server import HANG, ROOT, chat_reply, scripted_server
from llm_bridge import prompts
from llm_bridge.client import LLMClient
from llm_bridge.client_http import MAX_RETRY_AFTER_S, backoff_delay, retry_after_s, should_retry
from llm_bridge.config import LLMConfig

#: The private openai methods the client used to override or call (setup.py pinned openai <4 for them).
PRIVATE_HOOKS = ("_prepare_request", "_calculate_retry_timeout", "_parse_retry_after_header")
_SDK_CLIENTS = {"OpenAI", "AsyncOpenAI", "AzureOpenAI", "AsyncAzureOpenAI", "Client", "AsyncClient"}


def _cfg(base_url: str, **kw) -> LLMConfig:
    defaults = dict(base_url=base_url, model="m", n=1, timeout_s=5.0, max_retries=3, backoff_s=0.01,
                    max_backoff_s=0.05, concurrency=4, use_cache=False)
    defaults.update(kw)
    return LLMConfig(**defaults)


def _prompt(i: int = 0) -> list[dict[str, str]]:
    return prompts.projection_messages(prompts.fallback_template("likes"), [f"Entity_{i:03d}"])


# ---------------------------------------------------------------------------------------- no private SDK use
def private_sdk_uses(source: str, name: str = "<source>") -> list[str]:
    """Where ``source`` uses the openai SDK's privates: the per-attempt hooks by name, ``openai._x`` attributes
    or modules, or a subclass of an SDK client (which exists only to override its private methods)."""
    found = []
    tree = ast.parse(source, name)
    openai_names = {"openai"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "openai" or a.name.startswith("openai."):
                    openai_names.add(a.asname or a.name.split(".")[0])
                    if any(part.startswith("_") for part in a.name.split(".")[1:]):
                        found.append(f"{name}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "openai":
            if any(part.startswith("_") for part in node.module.split(".")[1:]) or any(
                    a.name.startswith("_") for a in node.names):
                found.append(f"{name}:{node.lineno}: from {node.module} import ...")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_HOOKS:
                found.append(f"{name}:{node.lineno}: .{node.attr}")
            elif isinstance(node.value, ast.Name) and node.value.id in openai_names and node.attr.startswith("_"):
                found.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in PRIVATE_HOOKS:
            found.append(f"{name}:{node.lineno}: def {node.name}")
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if base_name in _SDK_CLIENTS:
                    found.append(f"{name}:{node.lineno}: class {node.name}({base_name})")
    return found


def test_llm_bridge_uses_no_private_sdk_hook():
    """The client reaches the SDK through public API only (which is what lets setup.py drop openai's <4 pin)."""
    files = sorted((ROOT / "llm_bridge").rglob("*.py"))
    if (ROOT / "experiments").is_dir():
        files += sorted((ROOT / "experiments").rglob("*.py"))
    assert any(f.name == "client_http.py" for f in files)
    found = [hit for f in files for hit in private_sdk_uses(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize("planted", [
    "import openai\nclass C(openai.AsyncOpenAI):\n    pass\n",
    "from openai import AsyncOpenAI as A, OpenAI\nclass C(OpenAI):\n    pass\n",
    "async def f(c, r):\n    await c._prepare_request(r)\n",
    "def g(c, h):\n    return c._parse_retry_after_header(h)\n",
    "class X:\n    def _calculate_retry_timeout(self, a, b, c=None):\n        return 0.0\n",
    "import openai as oa\nx = oa._base_client\n",
    "from openai._base_client import AsyncAPIClient\n",
])
def test_the_private_use_check_finds_planted_violations(planted):
    assert private_sdk_uses(planted)


def test_the_old_client_is_flagged():
    """The check would have failed on the client before this change (it subclassed AsyncOpenAI)."""
    old = ("import openai\nclass _SDKClient(openai.AsyncOpenAI):\n"
           "    async def _prepare_request(self, request):\n        await super()._prepare_request(request)\n")
    assert len(private_sdk_uses(old)) == 3  # the subclass, the override, the call


# ---------------------------------------------------------------------------------------- retry rules
def test_retry_after_read_from_headers():
    assert retry_after_s(None) is None and retry_after_s({}) is None
    assert retry_after_s({"retry-after-ms": "250"}) == 0.25
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25  # milliseconds first
    assert retry_after_s({"retry-after": "3"}) == 3.0 and retry_after_s({"retry-after": "1.5"}) == 1.5
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({"retry-after-ms": "x"}) is None
    assert retry_after_s({"retry-after": "1e999"}) == float("inf")  # an overflow is an excessive wait
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < retry_after_s({"retry-after": when}) <= 31  # type: ignore[operator]


@pytest.mark.parametrize("status, headers, retried", [
    (500, {}, True), (502, {}, True), (503, {}, True), (429, {}, True), (408, {}, True), (409, {}, True),
    (400, {}, False), (401, {}, False), (404, {}, False), (422, {}, False),
    (429, {"retry-after": str(MAX_RETRY_AFTER_S + 1)}, False),  # a server asking for minutes is not retried
    (429, {"retry-after": str(MAX_RETRY_AFTER_S)}, True),
    (400, {"x-should-retry": "true"}, True), (503, {"x-should-retry": "false"}, False),
])
def test_which_statuses_are_retried(status, headers, retried):
    assert should_retry(status, headers) is retried


def test_backoff_doubles_with_jitter_and_retry_after_is_capped():
    cfg = _cfg("http://127.0.0.1:9/v1", backoff_s=0.1, max_backoff_s=5.0)
    rng = random.Random(0)
    for retry in range(4):
        d = backoff_delay(cfg, retry, rng, None)
        assert 0.05 * 2 ** retry <= d <= 0.15 * 2 ** retry
    assert backoff_delay(cfg, 0, rng, {"retry-after": "2"}) == 2.0  # longer than the backoff: waited
    assert backoff_delay(cfg, 0, rng, {"retry-after": "100"}) == 5.0  # capped at max_backoff_s
    assert backoff_delay(cfg, 20, rng, None) == 5.0
    assert backoff_delay(cfg, 0, rng, {"retry-after": "-3"}) <= 0.15  # a negative wait is no instruction


# ---------------------------------------------------------------------------------------- over HTTP
def test_responses_are_counted_by_the_http_clients_event_hook():
    """The http client's response hook sees every HTTP response (a retried 500 too); a hang gives none."""
    seen = []

    def reply(req, hdrs):
        seen.append(1)
        return (500, b'{"error": {"message": "busy"}}', {}) if len(seen) == 1 else (200, chat_reply("ok"), {})

    import openai

    with scripted_server(reply) as srv, LLMClient(_cfg(srv.base_url), progress=False) as client:
        r = client.complete_sync(_prompt())
        assert r.ok and r.requests == 2 and client.stats.retries == 1 and client.stats.requests == 2
        assert client.transport.responses == 2
        sdk = next(iter(client.transport._states.values())).openai
        assert type(sdk) is openai.AsyncOpenAI and sdk.max_retries == 0  # the SDK's own client, our retries
    with scripted_server(lambda req, hdrs: HANG) as srv, \
            LLMClient(_cfg(srv.base_url, timeout_s=0.3, max_retries=1), progress=False) as client:
        r = client.complete_sync(_prompt())
        assert (r.reason, r.attempts) == ("timeout", 2) and client.transport.responses == 0


@pytest.mark.parametrize("status, headers, attempts, reason", [
    (503, {"x-should-retry": "false"}, 1, "server_error"),
    (400, {"x-should-retry": "true"}, 3, "bad_request"),
    (429, {"Retry-After": "1000"}, 1, "rate_limited"),
    (429, {"Retry-After-Ms": "10"}, 3, "rate_limited"),
])
def test_server_retry_instructions_are_obeyed(status, headers, attempts, reason):
    with scripted_server(lambda req, hdrs: (status, b'{"error": {"message": "no"}}', headers)) as srv, \
            LLMClient(_cfg(srv.base_url, max_retries=2), progress=False) as client:
        r = client.complete_sync(_prompt())
        assert (r.reason, r.status, r.attempts) == (reason, status, attempts) and srv.requests == attempts
        assert client.stats.retries == attempts - 1


def test_sync_calls_reuse_one_loop_and_threads_get_their_own():
    """The sync API runs on the client's own asyncio.Runner (one SDK client across calls); a second thread in
    a sync call at the same time gets a loop of its own, and both are answered."""
    def slow(req, hdrs):
        time.sleep(0.2)
        return 200, chat_reply("ok"), {}

    with scripted_server(slow) as srv, LLMClient(_cfg(srv.base_url), progress=False) as client:
        assert client.complete_sync(_prompt(0)).ok and client.complete_sync(_prompt(1)).ok
        assert len(client.transport._states) == 1
        results: dict[int, object] = {}

        def ask(i: int) -> None:
            results[i] = client.complete_many_sync([_prompt(10 + i), _prompt(20 + i)])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(results) == [0, 1, 2] and all(r.ok for rs in results.values() for r in rs)  # type: ignore
        assert len(client.transport._states) == 1  # the other threads' loops closed their clients
