"""The LLM bridge (LGOT): every sub-question of a logical query answered by the KG engine *and* an LLM.

LGOT ("Logic Query of Thoughts") keeps the LLM answers that pass a
likelihood-ratio test, merges them into the node's fuzzy vector and feeds the
merged top answers into the next sub-question's prompt.  The bridge is an
executor hook, so KG-only, LLM-only and LGOT are three configurations of one
executor path::

    from engine.exec.executor import Executor
    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig
    from llm_bridge.lgot import LGOTHook, LGOTSettings

    with LLMClient(LLMConfig.from_env(base_url="http://127.0.0.1:8099/v1")) as client:
        hook = LGOTHook(client=client, artifact=art, settings=LGOTSettings(theta=0.3, alpha=0.1))
        results = Executor(art, hooks=[hook]).answer(queries)   # answers carry provenance, results a trace

From the command line: ``python -m engine.answer ... --llm [--llm-base-url URL]
[--llm-model NAME] [--llm-mode lgot|llm-only] [--llm-theta 0.3] [--llm-alpha 0.1]``.

Modules (imported on demand; ``import llm_bridge`` loads nothing else):

* :mod:`~llm_bridge.config`    client settings from flags and the environment
* :mod:`~llm_bridge.client`    async OpenAI-compatible client on the openai SDK: deadline, validated replies, budget, cache
* :mod:`~llm_bridge.cache`     the on-disk response cache (opens only files it created; read-only replay)
* :mod:`~llm_bridge.text`      ``clean_text``: server text cleaned on receipt (printing escapes: kgreason.text)
* :mod:`~llm_bridge.prompts`   prompts rendered from package-data templates (``llm_bridge/templates``)
* :mod:`~llm_bridge.relations` relation -> question templates (LLM-generated once, kept in a sidecar)
* :mod:`~llm_bridge.parse`     tolerant reply parsing; confidence p(e) from samples or log-probabilities
* :mod:`~llm_bridge.linking`   answer strings -> KG entity ids (exact, alias, fuzzy via rapidfuzz)
* :mod:`~llm_bridge.lgot`      the filter, the merge, LLM answer sets through i/u/n, the executor hook
* :mod:`~llm_bridge.cli`       the ``--llm`` flags of the CLIs
* :mod:`~llm_bridge.provider`  the LLM provider the engine's CLIs find through ``engine.providers``

The simulated servers, the experiment runners and the linking evaluation are tools, not library:
they live in the top-level :mod:`experiments` package (docs/layout.md).
"""
