"""What the LLM bridge reads on rank 0 of a sharded run equals what it reads in one process.

Under torchrun the LGOT hook runs on rank 0 over the shard folder's vocabulary
(:class:`engine.exec.sharded_load.ShardVocabulary`), not over the artifact.  Its relation questions are
made from examples among the observed triples, its entity linking from the relation ranges of those
triples and the names file the artifact's meta points to, and its sidecar is keyed by the artifact's
checksums.  A vocabulary without the triples and the meta (shard format 2) made other prompts than one
process: every relation question fell back to its template ("no examples").  One process, no ranks:
the same hook run over the artifact and over the vocabulary sends the same requests.
"""
from __future__ import annotations

import numpy as np
import pytest

from _llm_server import make_artifact
from engine.exec.executor import Executor
from engine.lang.query import parse
from kge.artifact import Artifact
from llm_bridge.client import LLMFailure


class RecordingClient:
    """Records every batch of messages; every request fails (the bridge then falls back, deterministically)."""

    def __init__(self) -> None:
        self.batches: list[list] = []

    def complete_many_sync(self, batch, **kw):
        self.batches.append([list(m) for m in batch])
        return [LLMFailure("server_error", "HTTP 500: recorded", 500, 1) for _ in batch]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from kge.sharding import write_shards

    d = tmp_path_factory.mktemp("bridge-vocab")
    art = Artifact.load(make_artifact(d / "art"))
    return art, {p: write_shards(art, p, d / f"s{p}") for p in (2, 3)}


def vocabulary(folder, p, verify=True):
    from engine.exec.sharded_load import ShardVocabulary
    from kge.sharding import read_shard_meta

    return ShardVocabulary.of_folder(folder, read_shard_meta(folder, p), verify=verify)


@pytest.mark.parametrize("p", [2, 3])
def test_vocabulary_carries_the_observed_triples_and_meta(folders, p):
    from llm_bridge.linking import RelationRanges, _default_names_file
    from llm_bridge.relations import _examples, artifact_key

    art, shards = folders
    vocab = vocabulary(shards[p], p)
    assert np.array_equal(np.asarray(vocab.observed), art.observed) and len(art.observed)
    assert vocab.meta == art.meta and artifact_key(vocab) == artifact_key(art) is not None
    assert _default_names_file(vocab) == _default_names_file(art)
    for r in range(art.num_relations):
        assert _examples(vocab, r) == _examples(art, r)
    a, b = RelationRanges.from_artifact(art), RelationRanges.from_artifact(vocab)
    for r in range(art.num_relations):
        assert np.array_equal(np.asarray(a.allowed(r)), np.asarray(b.allowed(r)))
        assert np.array_equal(np.asarray(a.strict(r)), np.asarray(b.strict(r)))


def test_lgot_on_the_vocabulary_sends_one_process_requests(folders):
    """The hook over the vocabulary (what rank 0 runs) asks exactly what the hook over the artifact asks: relation
    questions with their examples first, then the projection prompts."""
    from llm_bridge.lgot import LGOTHook, LGOTSettings

    art, shards = folders
    vocab = vocabulary(shards[2], 2)
    # what rank 0's hook sees: the vocabulary's names, triples, meta and folder (the matrices only run the executor)
    seen = Artifact(entities=vocab.entities, relations=vocab.relations, matrices=art.matrices,
                    observed=np.asarray(vocab.observed), missing=vocab.missing, meta=vocab.meta, path=vocab.path)
    rels = [r for r in art.relations if not r.endswith("^-1")][:2]
    anchor = art.entities[int(art.observed[0, 0])]
    queries = [f'(p {rels[0]} "{anchor}")', f'(p {rels[1]} (p {rels[0]} "{anchor}"))']
    sent = []
    for a in (art, seen):
        client = RecordingClient()
        hook = LGOTHook(client=client, artifact=a, settings=LGOTSettings(relation_questions="llm"),
                        questions_dir=str(shards[2].parent / f"rq-{len(sent)}"))
        Executor(a, hooks=[hook], backend="reference").answer([parse(q) for q in queries], k=3)
        sent.append(client.batches)
    assert sent[0] == sent[1]
    text = repr(sent[0])
    assert "example" in text.lower() and len(sent[0]) >= 2, text[:500]  # relation questions were asked


def test_a_changed_observed_file_is_one_error(folders, tmp_path):
    import shutil

    from kgreason.errors import UserError

    _, shards = folders
    bad = tmp_path / "s2"
    shutil.copytree(shards[2], bad)
    obs = np.load(bad / "observed.npy")
    obs[0, 0] = (obs[0, 0] + 1) % 150
    np.save(bad / "observed.npy", obs)
    with pytest.raises(UserError, match=r"observed.npy changed since it was written"):
        vocabulary(bad, 2)
    assert vocabulary(bad, 2, verify=False).observed[0, 0] == obs[0, 0]  # not checked: read as it is


def test_the_artifacts_own_relation_questions_travel_with_the_shards(folders, tmp_path):
    import json
    import shutil

    from engine.exec.sharded_load import ShardVocabulary
    from kge.sharding import RELATION_QUESTIONS_FILE, write_shards
    from llm_bridge.relations import ARTIFACT_FILE, RelationQuestions

    assert RELATION_QUESTIONS_FILE == ARTIFACT_FILE
    art, _ = folders
    own = tmp_path / "art"
    shutil.copytree(art.path, own)
    rel = art.relations[0]
    (own / ARTIFACT_FILE).write_text(json.dumps({"templates": {rel: "Which entity does {entity} point to?"}}))
    src = Artifact.load(own)
    vocab = vocabulary(write_shards(src, 2, tmp_path / "s2"), 2)
    assert isinstance(vocab, ShardVocabulary)
    for a in (src, vocab):
        rq = RelationQuestions.for_artifact(a)
        assert rq.source(rel) == "artifact" and rq.template(rel) == "Which entity does {entity} point to?"
