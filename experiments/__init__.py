"""Research tools beside the library: experiment runners, the simulated LLM servers, the entity-linking
evaluation, the synthetic-KG generator and the training-curve plot.

Each is a ``python -m experiments.<tool>`` command (``main(argv)`` -> a frozen settings dataclass ->
:func:`kgreason.errors.cli_main`, like the library's CLIs)::

    python -m experiments.lgot_eval     KG-only vs LLM-only vs LGOT on an artifact (simulated or real LLM)
    python -m experiments.metaqa_lgot   LGOT's Table 1 protocol on MetaQA (Hits@k)
    python -m experiments.metaqa_ask    the ask loop's MetaQA runs: KG-only artifact, questions, exemplars, report
    python -m experiments.linkeval      entity-linking precision/recall on a labelled MetaQA set
    python -m experiments.simulate      a simulated OpenAI-compatible server answering from an artifact's full KG
    python -m experiments.simulate_ask  the simulator plus a KARPA planner/reasoner that knows the gold paths
    python -m experiments.synthetic_kg  a synthetic Freebase-like KG (TSV for kge.build)
    python -m experiments.train_curve   PNG of an artifact's training curve

The library (``kgreason``, ``ops``, ``kge``, ``engine``, ``llm_bridge``) imports nothing from here
(tests/test_imports.py); these tools import the library like any user.  ``import experiments`` loads
nothing else.  The layout and why: docs/layout.md.
"""
