"""The embedding-only path score of the ask loop: relation paths enumerated from a topic, read as text,
embedded (one cache, in memory and on disk), and scored against a question (:class:`PathScorer`).

A path's score is a *cost*, lower is better, on one scale: ``1 − cos(path text, question)`` plus a per-hop
length term, minus the answer-type, kind, lexical and exemplar terms (:class:`~engine.exec.ask_settings.
ScoreSettings`; :meth:`PathScorer.score_sequences`).  It ranks the candidate paths of a question and weighs
them in the vote (:func:`engine.exec.ask.vote_ranking`); the terms may take it below 0.

Relation paths from a topic are enumerated here only (:meth:`PathScorer.reachable_sequences`, cached per
topic and length), and embedded through one cache (:meth:`PathScorer._sequence_embeddings`).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from typing import Any, Callable, Sequence

import numpy as np

from kgreason.errors import UserError, unknown_name

from engine.exec.ask_settings import AskSettings
from engine.exec.ask_text import (WH_CENTRE, WHO_KIND, answer_phrase, content_words, kind_phrase, kind_word, lexical_f1, question_text,
                                  word_before_topic, words_match)
from engine.exec.ask_types import AskResult
from engine.paths import PathRetriever, relation_text

__all__ = ["PathScorer", "KIND_CONTAINMENT", "KIND_RELATIONS"]

#: A relation whose tails are at least this share of a larger relation's tails reads as that one's kind.
KIND_CONTAINMENT = 0.9
#: Relations named per side of a kind text (the most covering first): a bound on the text's length.
KIND_RELATIONS = 8
#: The path-embedding cache is rewritten once it would grow by 1/_CACHE_GROWTH (PathScorer._sequence_embeddings).
_CACHE_GROWTH = 8


def _read_sequence_cache(path: os.PathLike, width: int) -> dict[str, np.ndarray]:
    """The path-text -> embedding map of a path-embedding cache file (``texts``: N strings, ``emb``: (N, width)
    finite float32); ``ValueError(why)`` when it is not one (see :meth:`PathScorer._sequence_embeddings`)."""
    from engine.paths.embeddings import check_embeddings

    with np.load(path, allow_pickle=False) as z:
        texts, emb = z["texts"], z["emb"]
    if not isinstance(texts, np.ndarray) or texts.ndim != 1 or texts.dtype.kind != "U":
        raise ValueError("'texts' is not a list of strings")
    why = check_embeddings(emb, rows=len(texts), width=width)
    if why is not None:
        raise ValueError(f"'emb': {why}")
    return dict(zip(texts.tolist(), emb))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class PathScorer:
    """Scores relation paths against questions over one path retriever's KG and encoder.

    Args:
        retriever: the :class:`~engine.paths.PathRetriever` (its graph, relation embeddings and encoder).
        settings: :class:`~engine.exec.ask_settings.AskSettings` (its :class:`ScoreSettings` and ``k``,
            ``max_hops``).
        verbalizer: ``relation name -> question template`` holding one ``{entity}`` slot (an inverse
            name ``X^-1`` asks X's inverse question), e.g. ``llm_bridge.prompts.fallback_template``;
            paths are then compared with the question read as questions (:meth:`path_text`) instead of
            their comma-joined relation names.  ``None``: the names.
        exemplars: labelled questions, ``(question text, relation path as names)`` pairs (e.g.
            :func:`~engine.exec.ask_text.read_exemplars`); each candidate path's cost is then lowered by
            ``exemplar_weight`` times its kNN vote (:meth:`exemplar_votes`).  ``None`` or empty: costs
            exactly as without them.
    """

    def __init__(self, retriever: PathRetriever, *, settings: AskSettings | None = None,
                 verbalizer: Callable[[str], str] | None = None,
                 exemplars: Sequence[tuple[str, Sequence[str]]] | None = None) -> None:
        self.retriever = retriever
        self.settings = settings or AskSettings()
        self.verbalizer = verbalizer
        rel_ids = {n: i for i, n in enumerate(retriever.graph.relation_names)}
        self._ex_texts: list[str] = []
        self._ex_paths: dict[tuple[int, ...], list[int]] = {}
        for j, ex in enumerate(exemplars or ()):
            if not (isinstance(ex, (tuple, list)) and len(ex) == 2 and isinstance(ex[0], str) and ex[0].strip()
                    and isinstance(ex[1], (tuple, list)) and ex[1]):
                raise UserError(f"ask: exemplar {j + 1} must be (question text, non-empty relation path), got {ex!r}")
            ids = []
            for x in ex[1]:
                if x not in rel_ids:
                    raise unknown_name("relation", str(x), list(rel_ids), f"ask: exemplar {j + 1}")
                ids.append(rel_ids[x])
            self._ex_paths.setdefault(tuple(ids), []).append(len(self._ex_texts))
            self._ex_texts.append(question_text(ex[0]) or ex[0])
        self._ex_emb: np.ndarray | None = None
        self._path_text: dict[tuple[int, ...], str] = {}
        self._mu: np.ndarray | None = None
        self._range: np.ndarray | None = None
        self._kind: np.ndarray | None = None
        self._kind_raw: np.ndarray | None = None
        self._kind_text: list[str] | None = None
        self._wh_centre: np.ndarray | None = None
        self._rel_words: list[tuple[str, tuple[str, ...]]] | None = None
        self._names_word: dict[str, bool] = {}
        self._outrel: tuple[np.ndarray, np.ndarray] | None = None
        self._seq_emb: dict[str, np.ndarray] | None = None
        self._seq_damage: str | None = None  # why the path-embedding cache read was damaged, until rewritten
        self._seq_saved = 0  # texts in the cache file (as read or last written)
        self._seq_wrote = False  # this scorer wrote (or tried to write) the cache file
        self._seq_cache: dict[tuple[int, int], tuple[list[tuple[int, ...]], bool]] = {}
        rel = retriever.relation_emb
        self._rel_unit = rel / np.maximum(np.linalg.norm(rel, axis=1, keepdims=True), 1e-12)

    def _out_relations(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, relations): the distinct relations leaving each entity, CSR over entities."""
        if self._outrel is None:
            g = self.retriever.graph
            rels, _ = g.by_relation()
            ip = np.asarray(g.indptr, dtype=np.int64)
            heads = np.repeat(np.arange(len(ip) - 1), np.diff(ip))
            keep = np.ones(len(rels), dtype=bool)
            keep[1:] = (rels[1:] != rels[:-1]) | (heads[1:] != heads[:-1])
            counts = np.bincount(heads[keep], minlength=len(ip) - 1)
            self._outrel = (np.concatenate(([0], np.cumsum(counts))), np.asarray(rels[keep], dtype=np.int64))
        return self._outrel

    def reachable_sequences(self, topic: int, max_hops: int) -> tuple[list[tuple[int, ...]], bool]:
        """Distinct relation sequences of 1..max_hops hops that exist from ``topic`` (breadth first), and
        whether the retriever's ``max_sequences`` cap was hit.

        The same set as KARPA-H's enumeration; the last hop reads the frontier's distinct out-relations
        (a per-entity table) instead of expanding its tails, which is most of the cost on dense KGs.
        """
        key = (int(topic), int(max_hops))
        hit = self._seq_cache.get(key)
        if hit is not None:
            return hit
        out = self._reachable(int(topic), int(max_hops))
        if len(self._seq_cache) >= 100_000:  # bounded: a long-running process asks about many topics
            self._seq_cache.clear()
        self._seq_cache[key] = out
        return out

    def continuations(self, topic: int, max_hops: int) -> dict[tuple[str, ...], tuple[str, ...]]:
        """The relation names that continue each relation path existing from ``topic`` (key ``()``: those
        leaving it), from :meth:`reachable_sequences`: what a planner may name next after each prefix."""
        names = self.retriever.graph.relation_names
        out: dict[tuple[str, ...], list[str]] = {}
        for seq in self.reachable_sequences(topic, max_hops)[0]:
            out.setdefault(tuple(names[i] for i in seq[:-1]), []).append(names[seq[-1]])
        return {k: tuple(v) for k, v in out.items()}

    def _reachable(self, topic: int, max_hops: int) -> tuple[list[tuple[int, ...]], bool]:
        ip, orel = self._out_relations()
        cap = self.retriever.max_sequences
        level: list[tuple[tuple[int, ...], np.ndarray]] = [((), np.array([topic], dtype=np.int64))]
        seqs: list[tuple[int, ...]] = []
        for step in range(max_hops):
            nxt = []
            for prefix, F in level:
                if step == max_hops - 1:
                    lo, hi = ip[F], ip[F + 1]
                    lens = hi - lo
                    idx = np.repeat(lo - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(int(lens.sum()))
                    out = np.unique(orel[idx]).tolist()
                    if len(seqs) + len(out) > cap:
                        seqs.extend(prefix + (int(x),) for x in out[: cap - len(seqs)])
                        return seqs, True
                    seqs.extend(prefix + (int(x),) for x in out)
                    continue
                for x, tails in self.retriever.expand(F):
                    if len(seqs) >= cap:
                        return seqs, True
                    seqs.append(prefix + (x,))
                    nxt.append((prefix + (x,), tails))
            level = nxt
        return seqs, False

    def _sequence_cache_path(self):
        from kgreason.files import user_cache_dir

        key = json.dumps([self.retriever.encoder.name, list(self.retriever.graph.relation_names)])
        return user_cache_dir() / "ask_sequences" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"

    def _sequence_embeddings(self, texts: Sequence[str]) -> None:
        """Make ``self._seq_emb`` hold every text's embedding: from memory, the disk cache
        (``$KGREASON_HOME/ask_sequences/<encoder and relations key>.npz``), else one encoder call.

        The cache is verified when read (:func:`_read_sequence_cache`); a damaged one is dropped and
        rewritten with the texts of this run, or used from memory only when its folder cannot be written,
        with one warning (:func:`engine.paths.embeddings.cache_warning`).  Writes are atomic.  The first call
        that embeds new texts writes the file; later calls of the same scorer rewrite it only once the texts
        not in it are at least 1/:data:`_CACHE_GROWTH` of those in it, so a run of many chunks of questions
        (``engine.ask --questions``) writes ~``_CACHE_GROWTH`` times the final size in all rather than the
        whole file per chunk; what is left unwritten is recomputed, and written, by the next run."""
        from engine.paths.embeddings import cache_warning, read_cache, write_cache

        if self._seq_emb is None:
            width = int(self._rel_unit.shape[1])  # the encoder's width (the relation embeddings')
            got, self._seq_damage = read_cache(self._sequence_cache_path(),
                                               lambda p: _read_sequence_cache(p, width))
            self._seq_emb = got or {}
            self._seq_saved = len(self._seq_emb)
        todo = [t for t in dict.fromkeys(texts) if t not in self._seq_emb]
        if not todo:
            return
        self._seq_emb.update(zip(todo, np.asarray(self.retriever.encoder.encode(todo), dtype=np.float32)))
        if self._seq_wrote and (len(self._seq_emb) - self._seq_saved) * _CACHE_GROWTH < self._seq_saved:
            return
        path = self._sequence_cache_path()
        names = list(self._seq_emb)
        buf = io.BytesIO()
        np.savez(buf, texts=np.array(names, dtype=str), emb=np.stack([self._seq_emb[t] for t in names]))
        # A cache folder that cannot be written only costs the recomputation (silent unless it was damaged).
        unwritten = write_cache(path, buf.getvalue(), "path-embedding cache")
        self._seq_saved = len(names)  # written, or given up until the cache grows as much again
        self._seq_wrote = True
        if self._seq_damage is not None:
            cache_warning("path-embedding cache", path, self._seq_damage, unwritten)
            self._seq_damage = None

    def path_text(self, relations: Sequence[int]) -> str:
        """The text embedding-only retrieval compares with the question (topic mention removed).

        With a verbalizer: each hop's question template, the first with its entity slot empty (the
        question's topic is removed too) and the next ones about ``them`` (the previous hop's answers):
        ``directed_by^-1, written_by`` -> "Who or what is directed by ? Who or what is them written by?".
        Without one: the retriever's relation-name text (``inverse of directed by, written by``).
        """
        key = tuple(int(x) for x in relations)
        t = self._path_text.get(key)
        if t is None:
            if self.verbalizer is None:
                t = self.retriever.sequence_text(key)
            else:
                names = self.retriever.graph.relation_names
                parts = []
                for i, x in enumerate(key):
                    template = str(self.verbalizer(names[x]))
                    if "{entity}" not in template:
                        raise UserError(f"ask: the verbalizer's text for relation {names[x]!r} has no "
                                        f"{{entity}} slot: {template!r}")
                    parts.append(template.replace("{entity}", "them" if i else ""))
                t = " ".join(" ".join(parts).split())
            self._path_text[key] = t
        return t

    def _verbalized_mean(self) -> np.ndarray:
        """Mean embedding of every relation's verbalized 1-hop path text (the KG's relation questions).

        Every verbalized path shares the templates' wording ("Who or what is ... ?"), a common direction
        of the embeddings that dominates their cosine with any question; subtracting this KG-level mean
        from the question and the path embeddings compares what differs between relations (540 MetaQA
        dev questions, length penalty 0.05, top path's Hits@1 on 1/2/3 hops: 73/48/27 -> 76/52/34).
        """
        if self._mu is None:
            texts = [self.path_text((r,)) for r in range(len(self.retriever.graph.relation_names))]
            self._sequence_embeddings(texts)
            self._mu = np.mean(np.stack([self._seq_emb[t] for t in texts]).astype(np.float64), axis=0)
        return self._mu

    def range_text(self, relation: int) -> str:
        """The names of the ``range_examples`` most frequent tails of ``relation`` in the KG (ties by
        smaller id), comma-joined: what its answers look like ("1999, 2004, ..." or person names).
        Empty for a relation without edges."""
        g = self.retriever.graph
        rels = np.asarray(g.rels)
        tails = np.asarray(g.tails)[rels == int(relation)]
        if not len(tails):
            return ""
        ids, counts = np.unique(tails, return_counts=True)
        top = ids[np.lexsort((ids, -counts))][: self.settings.range_examples]
        return ", ".join(str(g.entity_name(int(t))) for t in top)

    def _range_embeddings(self) -> np.ndarray:
        """(R, d) unit rows: each relation's range text embedding, centred (:meth:`_centred_texts`)."""
        if self._range is None:
            self._range = self._centred_texts([self.range_text(r) for r in range(len(self.retriever.graph.relation_names))])
        return self._range

    def _centred_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), d) unit rows: each text's embedding minus the mean over the non-empty texts (the
        direction they share), renormalised; zero rows for empty texts."""
        have = [i for i, t in enumerate(texts) if t]
        E = np.zeros((len(texts), 0 if not have else 1), dtype=np.float64)
        if have:
            X = np.asarray(self.retriever.encoder.encode([texts[i] for i in have]), dtype=np.float64)
            X = _unit(X - X.mean(axis=0)) if len(have) > 1 else _unit(X)
            E = np.zeros((len(texts), X.shape[1]), dtype=np.float64)
            E[have] = X
        return E

    def kind_texts(self) -> list[str]:
        """Per relation id, the kind of entity it reaches, read from the KG: of the relation's tails, which
        base relations (inverse names read as their base) most of them (``kind_coverage``) have as heads,
        "thing with A, B" (for ``X^-1`` X itself too: leaving it out cost 1-hop questions most, MetaQA dev
        proxy 90.5 -> 77.5), and as tails, "the C or D", at most :data:`KIND_RELATIONS` each, the most
        covering, in name order: films are things with a director, a genre, a release year; people are the
        directed-by or written-by of something; years the release year.  Empty for a relation without edges
        or whose tails share no relation that widely."""
        from kge.artifact import INVERSE_SUFFIX

        g = self.retriever.graph
        names = g.relation_names
        rels = np.asarray(g.rels, dtype=np.int64)
        heads = np.repeat(np.arange(len(g.indptr) - 1), np.diff(np.asarray(g.indptr, dtype=np.int64)))
        tails = np.asarray(g.tails, dtype=np.int64)
        # Forward edges only: a graph with inverse edges holds each fact twice (h r t and t r^-1 h).
        inverse = np.array([n.endswith(INVERSE_SUFFIX) for n in names], dtype=bool)
        fwd = ~inverse[rels]
        bases = [n[: -len(INVERSE_SUFFIX)] if n.endswith(INVERSE_SUFFIX) else n for n in names]
        base_ids = sorted({bases[r] for r in range(len(names))})
        bid = {b: i for i, b in enumerate(base_ids)}
        rb = np.array([bid[b] for b in bases], dtype=np.int64)
        n_ent, n_b = len(g.indptr) - 1, len(base_ids)
        # Sparse incidence: entity x base relation, as head (attribute) and as tail (role), 0/1.
        from scipy import sparse

        def incidence(ents: np.ndarray) -> Any:
            m = sparse.coo_matrix((np.ones(len(ents), dtype=np.float32), (ents, rb[rels[fwd]])), shape=(n_ent, n_b))
            m = m.tocsr()
            m.data[:] = 1.0  # several edges of one relation count once
            return m

        as_head, as_tail = incidence(heads[fwd]), incidence(tails[fwd])
        # Relations whose tails are (almost) all tails of a larger relation read as that one: one kind, one
        # text (in_language^-1's films are among release_year^-1's), so that centring the texts does not
        # blow up the small differences between near-copies into what tells them apart.
        reach = sparse.csr_matrix((np.ones(len(rels), dtype=np.float32), (rels, tails)), shape=(len(names), n_ent))
        reach.data[:] = 1.0
        both = (reach @ reach.T).toarray()
        size = np.diag(both).copy()
        rep = [int(np.lexsort((np.arange(len(names)), -size * (both[r] >= KIND_CONTAINMENT * size[r])))[0])
               if size[r] else r for r in range(len(names))]
        out: list[str] = []
        cov = self.settings.kind_coverage
        own: dict[int, str] = {}
        for r in range(len(names)):
            if rep[r] in own:
                out.append(own[rep[r]])
                continue
            t = np.unique(tails[rels == rep[r]])
            if not len(t):
                out.append("")
                continue
            parts = []
            for m, fmt in ((as_head, "thing with {}"), (as_tail, "the {}")):
                share = np.asarray(m[t].sum(axis=0)).ravel() / len(t)
                # In name order: the same kind of entity reads the same whichever relation reached it.
                keep = sorted(b for b in np.lexsort((np.arange(n_b), -share)) if share[b] >= cov)[:KIND_RELATIONS]
                if keep:
                    joined = (", " if fmt.startswith("thing") else " or ").join(relation_text(base_ids[b]) for b in keep)
                    parts.append(fmt.format(joined))
            own[rep[r]] = "; ".join(parts)
            out.append(own[rep[r]])
        return out

    def scoring_text(self, question: str, topic: str | None, topic_id: int | None) -> str:
        """The question text paths are scored against: the question without its topic mention
        (:func:`question_text`) and, when the word right before the mention names the topic's kind, without it.

        That word (:func:`word_before_topic`) names the topic's kind when it names no relation
        (:meth:`names_relation`: those are kept for the lexical term) and its cosine with the kind text of
        some relation reaching the topic (:meth:`kind_texts`, uncentred) is at least ``topic_kind_cos``: "what
        words describe *film* [X]" asks for words, and "film" only pulled the question towards the relations
        whose questions read like a film's ("directed by", "in language"); "*describe* [X]" keeps its verb.
        The question itself when that leaves no words."""
        plain = question_text(question, topic) or question
        s = self.settings
        if topic_id is None or s.topic_kind_cos >= 1.0:
            return plain
        word = word_before_topic(question, topic)
        if word is None or self.names_relation(word):
            return plain
        reaching = self._reaching(int(topic_id))
        if not len(reaching):
            return plain
        w = _unit(np.asarray(self.retriever.encoder.encode([word]), dtype=np.float64))[0]  # the encoder caches it
        if float(np.max(self._raw_kind_embeddings()[reaching] @ w)) < s.topic_kind_cos:
            return plain
        return question_text(question, topic, drop_before=True) or plain

    def _reaching(self, entity: int) -> np.ndarray:
        """The relations (ids) with ``entity`` among their tails whose kind text is not empty."""
        index = self.retriever.graph.index  # its in-edges by tail, sorted by relation (built once)
        rels = np.unique(index.in_rel[int(index.in_ptr[entity]):int(index.in_ptr[entity + 1])])
        texts = self._kind_texts()
        return np.array([int(r) for r in rels if texts[int(r)]], dtype=np.int64)

    def _kind_texts(self) -> list[str]:
        """:meth:`kind_texts`, computed once (a pass over every edge)."""
        if self._kind_text is None:
            self._kind_text = self.kind_texts()
        return self._kind_text

    def _raw_kind_embeddings(self) -> np.ndarray:
        """(R, d) unit rows: each relation's kind text embedding, not centred (0 rows for empty texts)."""
        if self._kind_raw is None:
            texts = self._kind_texts()
            out = np.zeros((len(texts), int(self._rel_unit.shape[1])), dtype=np.float64)
            have = [i for i, t in enumerate(texts) if t]
            if have:
                out[have] = _unit(np.asarray(self.retriever.encoder.encode([texts[i] for i in have]), dtype=np.float64))
            self._kind_raw = out
        return self._kind_raw

    def _kind_embeddings(self) -> np.ndarray:
        """(R, d) unit rows: each relation's kind text (:meth:`kind_texts`) embedding, centred."""
        if self._kind is None:
            self._kind = self._centred_texts(self._kind_texts())
        return self._kind

    def relation_words(self) -> list[tuple[str, tuple[str, ...]]]:
        """Per relation id: (its base name, the words of that name that can name it in a question).

        The base name drops the inverse suffix (``directed_by^-1`` -> ``directed_by``: a question names a
        relation whichever way it is followed). Its words are :func:`content_words` of its readable text
        (:func:`engine.paths.relation_text`), less the words found in the names of more than
        ``max(2, 10%)`` of the base relations: such a word names no relation in particular (``film`` in
        most of FB15k-237's ``/film/...`` names; none of MetaQA's words is dropped).
        """
        if self._rel_words is None:
            from kge.artifact import INVERSE_SUFFIX

            names = self.retriever.graph.relation_names
            bases = [n[: -len(INVERSE_SUFFIX)] if n.endswith(INVERSE_SUFFIX) else n for n in names]
            words = {b: tuple(dict.fromkeys(content_words(relation_text(b)))) for b in dict.fromkeys(bases)}
            df: dict[str, int] = {}
            for ws in words.values():
                for w in ws:
                    df[w] = df.get(w, 0) + 1
            cap = max(2, int(0.1 * len(words)))
            self._rel_words = [(b, tuple(w for w in words[b] if df[w] <= cap)) for b in bases]
        return self._rel_words

    def named_relations(self, text: str) -> frozenset[str]:
        """The base relations (:meth:`relation_words`) that ``text`` names: one of its :func:`content_words`
        matches (:func:`words_match`) a word of the relation's name."""
        qw = set(content_words(text))
        if not qw:
            return frozenset()
        return frozenset(b for b, ws in dict(self.relation_words()).items()
                         if any(words_match(a, w) for a in qw for w in ws))

    def names_relation(self, word: str) -> bool:
        """Whether ``word`` names some relation of the KG (:func:`words_match` with a word of
        :meth:`relation_words`)."""
        hit = self._names_word.get(word)
        if hit is None:
            hit = self._names_word[word] = any(words_match(word, w) for _, ws in self.relation_words() for w in ws)
        return hit

    def named_forward(self, word: str) -> list[int]:
        """The forward relations (ids; no inverse) whose name ``word`` matches a word of (:func:`words_match`)."""
        names = self.retriever.graph.relation_names
        return [r for r, (b, ws) in enumerate(self.relation_words())
                if names[r] == b and any(words_match(word, w) for w in ws)]

    def phrase_embeddings(self, phrases: Sequence[str]) -> np.ndarray:
        """(len(phrases), d) unit rows: each answer phrase embedded, minus the mean of :data:`WH_CENTRE`'s
        (fixed, so a question's cost does not depend on the other questions asked)."""
        enc = self.retriever.encoder
        if self._wh_centre is None:
            self._wh_centre = _unit(np.asarray(enc.encode(list(WH_CENTRE)), dtype=np.float64)).mean(axis=0)
        return _unit(np.asarray(enc.encode(list(phrases)), dtype=np.float64) - self._wh_centre)

    def answer_type_scores(self, texts: Sequence[str]) -> np.ndarray:
        """(questions, R): cosine between each question's answer phrase (:func:`answer_phrase`, centred:
        :meth:`phrase_embeddings`) and each relation's centred range text (0 without edges)."""
        return self.phrase_embeddings([answer_phrase(t) or t for t in texts]) @ self._range_embeddings().T

    def kind_scores(self, texts: Sequence[str]) -> np.ndarray:
        """(questions, R): cosine between each question's kind phrase (:func:`kind_phrase`, centred:
        :meth:`phrase_embeddings`) and each relation's centred kind text (:meth:`kind_texts`; 0 when empty)."""
        s = self.settings
        phrases = [kind_phrase(t, s.kind_words, names=self.names_relation, window=s.kind_window,
                               person=WHO_KIND if s.kind_who else "") or t for t in texts]
        K = self._kind_embeddings()
        Q = self.phrase_embeddings(phrases)
        if s.kind_named and s.kind_window > 0:
            # The word naming relations stands for what they reach: the mean of their kind texts (forward
            # relations: a relation's name says what its tails are, "directed_by" -> directors), so
            # "which directors" is compared kind with kind, not with the films' text that lists "directed by".
            for i, t in enumerate(texts):
                w = kind_word(t, self.names_relation, s.kind_window)
                rows = self.named_forward(w) if w is not None else []
                if rows:
                    Q[i] = _unit(K[rows].mean(axis=0))
        out = Q @ K.T
        # A question word alone ("who", "when") names no kind of thing: its cosines with the kind texts
        # only echo the texts' wording (MiniLM puts "who" nearer "the starred actors" than "the written by").
        out[[len(p.split()) < 2 for p in phrases]] = 0.0
        return out

    def embedding_retrieve(self, topics: Sequence[int], texts: Sequence[str], *, r_progress: bool = False,
                           results: Sequence[AskResult] | None = None) -> list[list[tuple[float, tuple[int, ...]]]]:
        """Embedding-only retrieval: per topic the ``k`` cheapest reachable relation sequences, cost
        ``1 − cos(embed(path text), embed(question text)) + (length_penalty + length_prior · (length_pivot
        − question words)) · (hops − 1) − answer_type_weight · cos(answer phrase, range text of the last
        relation) − kind_weight · cos(kind phrase, kind text of the last relation) − lexical_weight ·
        F1(relations followed, relations named)`` (KARPA-H with the question as the plan, a per-hop cost that
        depends on the question's length, an answer-type term, a kind term and a lexical term, all on this
        one cost scale: :meth:`path_text`, :meth:`answer_type_scores`, :meth:`kind_scores`,
        :meth:`named_relations`); ties by
        length, then ids.  With a verbalizer the first two embeddings are centred on the mean of the
        relations' verbalized texts (:meth:`_verbalized_mean`)."""
        s = self.settings
        enumerated = []
        iterator: Any = range(len(topics))
        if r_progress:
            from kgreason.progress import progress_bar

            iterator = progress_bar(iterator, desc="ask: enumerate paths", unit="question")
        for i in iterator:
            seqs, truncated = self.reachable_sequences(int(topics[i]), s.max_hops)
            if truncated and results is not None:
                results[i].warn("retrieve", f"relation sequences capped at {len(seqs)}")
            enumerated.append(seqs)
        costs = self.score_sequences(enumerated, texts)
        out = []
        for seqs, cost in zip(enumerated, costs):
            order = sorted(range(len(seqs)), key=lambda j: (cost[j], len(seqs[j]), seqs[j]))[: s.k]
            out.append([(float(cost[j]), seqs[j]) for j in order])
        return out

    def score_sequences(self, seq_lists: Sequence[Sequence[tuple[int, ...]]], texts: Sequence[str]) -> list[np.ndarray]:
        """Embedding-only costs (:meth:`embedding_retrieve`'s formula) of any relation sequences, one list per
        question text (the sequences need not exist in the KG)."""
        if len(seq_lists) != len(texts):
            raise ValueError(f"score_sequences: {len(seq_lists)} sequence lists for {len(texts)} question texts")
        if not texts:  # no question (e.g. a run of 0 questions): an encoder gives (0, 0) for [], not (0, d)
            return []
        s = self.settings
        enc = self.retriever.encoder
        # One encoder call for every sequence text not seen before; kept across calls and on disk.
        self._sequence_embeddings([self.path_text(x) for seqs in seq_lists for x in seqs])
        q = np.asarray(enc.encode(list(texts)), dtype=np.float64)
        votes = self.exemplar_votes(q, seq_lists) if self._ex_texts and s.exemplar_weight > 0 else None
        mu = self._verbalized_mean() if self.verbalizer is not None else None
        if mu is not None:
            q = _unit(q - mu)
        types = self.answer_type_scores(texts) if s.answer_type_weight > 0 else None
        kinds = self.kind_scores(texts) if s.kind_weight > 0 else None
        out = []
        for i, seqs in enumerate(seq_lists):
            if not seqs:
                out.append(np.zeros(0, dtype=np.float64))
                continue
            E = np.stack([self._seq_emb[self.path_text(x)] for x in seqs]).astype(np.float64)
            if mu is not None:
                E = _unit(E - mu)
            per_hop = s.length_penalty + s.length_prior * (s.length_pivot - len(str(texts[i]).split()))
            cost = np.round(np.clip(1.0 - E @ q[i], 0.0, 2.0), 12) + per_hop * np.array(
                [len(x) - 1 for x in seqs], dtype=np.float64)
            if types is not None:
                cost = np.round(cost - s.answer_type_weight * types[i][[x[-1] for x in seqs]], 12)
            if kinds is not None:
                cost = np.round(cost - s.kind_weight * kinds[i][[x[-1] for x in seqs]], 12)
            if s.lexical_weight > 0:
                named = self.named_relations(texts[i])
                if named:
                    base = self.relation_words()
                    lex = np.array([lexical_f1([base[r][0] for r in x], named) for x in seqs], dtype=np.float64)
                    cost = np.round(cost - s.lexical_weight * lex, 12)
            if votes is not None:
                cost = np.round(cost - s.exemplar_weight * votes[i], 12)
            out.append(cost)
        return out

    def exemplar_votes(self, q: np.ndarray, enumerated: Sequence[Sequence[tuple[int, ...]]]) -> list[np.ndarray]:
        """Per question, each candidate path's exemplar vote: the mean of the ``exemplar_k`` highest
        cosines between the question embedding (row of ``q``, uncentred: question against question) and
        the exemplar questions labelled with that path (fewer when it has fewer); 0 for unlabelled paths."""
        k = self.settings.exemplar_k
        if self._ex_emb is None:
            self._ex_emb = _unit(np.asarray(self.retriever.encoder.encode(self._ex_texts), dtype=np.float64))
        sims = _unit(q) @ self._ex_emb.T
        out = []
        for i, seqs in enumerate(enumerated):
            v = np.zeros(len(seqs), dtype=np.float64)
            for j, x in enumerate(seqs):
                idx = self._ex_paths.get(tuple(x))
                if idx is not None:
                    row = sims[i, idx]
                    top = row if len(row) <= k else np.partition(row, len(row) - k)[len(row) - k:]
                    v[j] = float(np.mean(top))
            out.append(v)
        return out
