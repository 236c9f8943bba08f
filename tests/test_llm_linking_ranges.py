"""Links that respect the relation (issue 32): wrong-kind candidates are not linked by an alias, acronym,
fuzzy or embedding rule; every false link of the issue's real-LLM run, reproduced on a KG built here;
RelationRanges' range, inverse, widening and unknown entities; the LGOT hook passing the relation."""
from __future__ import annotations

import random

import numpy as np
import pytest
import scipy.sparse as sp

from kge.artifact import Artifact
from kgreason.errors import UserError
from llm_bridge.linking import EntityLinker, RelationRanges

# A MetaQA-shaped KG: films -> persons (directed_by, starred_actors), films -> tags (has_tags), with the
# inverses as artifacts store them (relation 2k+1 = X^-1, both directions observed).
FILMS = ["Elling", "The Dead Pool", "JCVD", "Poolhall Junkies", "Gold", "Muriel's Wedding", "The Godfather",
         "Plan 9 from Outer Space", "Kitchen Stories"]
PERSONS = ["Petter Naess", "Buddy Van Horn", "Clint Eastwood", "Mabrouk El Mechri", "Mars Callahan",
           "P.J. Hogan", "Francis Ford Coppola", "Ed Wood", "Bent Hamer", "Al Pacino"]
TAGS = ["norway", "mobster", "b-movie", "gold", "clint eastwood"]
EDGES = [("Elling", "directed_by", "Petter Naess"), ("Elling", "has_tags", "norway"),
         ("The Dead Pool", "directed_by", "Buddy Van Horn"), ("The Dead Pool", "starred_actors", "Clint Eastwood"),
         ("The Dead Pool", "has_tags", "clint eastwood"), ("JCVD", "directed_by", "Mabrouk El Mechri"),
         ("Poolhall Junkies", "directed_by", "Mars Callahan"), ("Gold", "has_tags", "gold"),
         ("Muriel's Wedding", "directed_by", "P.J. Hogan"), ("The Godfather", "directed_by", "Francis Ford Coppola"),
         ("The Godfather", "starred_actors", "Al Pacino"), ("The Godfather", "has_tags", "mobster"),
         ("Plan 9 from Outer Space", "directed_by", "Ed Wood"), ("Plan 9 from Outer Space", "has_tags", "b-movie"),
         ("Kitchen Stories", "directed_by", "Bent Hamer"), ("Kitchen Stories", "has_tags", "norway")]
BASE = ["directed_by", "starred_actors", "has_tags"]
RELS = [x for b in BASE for x in (b, b + "^-1")]
NAMES = FILMS + PERSONS + TAGS


def _triples(names, edges):
    ids = {n: i for i, n in enumerate(names)}
    out = []
    for h, r, t in edges:
        k = BASE.index(r)
        out += [(ids[h], 2 * k, ids[t]), (ids[t], 2 * k + 1, ids[h])]
    return np.array(out, dtype=np.int64)


def _linker(names=NAMES, edges=EDGES, **kw):
    ranges = RelationRanges(_triples(names, edges), num_entities=len(names), num_relations=len(RELS),
                            inverse=[k ^ 1 for k in range(len(RELS))])
    return EntityLinker(names=names, ranges=ranges, **kw)


@pytest.fixture(scope="module")
def linker():
    return _linker()


R = {name: k for k, name in enumerate(RELS)}
FILMS_REL = R["directed_by^-1"]  # "Which films did X direct?": its range is films


# -------------------------------------------------------------- the issue's false links, reproduced
@pytest.mark.parametrize("text,relation,prefer,wrong", [
    ("selling", "has_tags", None, "Elling"),                        # a tag question; a film 1 letter away
    ("The Lobster", "directed_by^-1", None, "mobster"),             # films asked; a tag 1 letter away
    ("Movie B", "directed_by^-1", None, "b-movie"),                 # a placeholder; a tag at fuzzy score 100
    ("Jean-Claude Van Damme", "starred_actors", None, "JCVD"),      # a person; a film of his initials
    ("P.J", "directed_by", {"Poolhall Junkies": 0.2}, "Poolhall Junkies"),  # a partial name; a film's initials
])
def test_the_issue_false_links_of_the_wrong_kind_are_gone(linker, text, relation, prefer, wrong):
    pref = None if prefer is None else {NAMES.index(k): v for k, v in prefer.items()}
    blind = linker.link(text, prefer=pref)  # what the linker did before: no relation in hand
    assert blind.name == wrong
    link = linker.link(text, prefer=pref, relation=R[relation])
    assert link.entity is None and link.reason == "out of range"
    assert wrong in [n for n, _, _ in link.out_of_range]
    js = link.to_json()
    assert js["reason"] == "out of range" and js["out_of_range"][0][0] == wrong


def test_a_one_word_name_does_not_link_a_two_word_title(linker):
    # "Deadpool" -> "The Dead Pool" (both films: no range can tell): words are joined only across punctuation
    for relation in (None, R["starred_actors^-1"]):
        link = linker.link("Deadpool", relation=relation)
        assert link.entity is None, link
    lk = EntityLinker(names=["Spider-Man", "The Dead Pool"])
    assert lk.link("Spiderman").name == "Spider-Man" and lk.link("Spiderman").method == "alias"
    assert lk.link("Dead Pool").name == "The Dead Pool"


# -------------------------------------------------------------------- no regression on the right kind
@pytest.mark.parametrize("text,relation,entity,method", [
    ("Elling", "directed_by^-1", "Elling", "exact"),
    ("Ellingg", "directed_by^-1", "Elling", "fuzzy"),
    ("Clint Eastwod", "starred_actors", "Clint Eastwood", "fuzzy"),
    ("Poolhall Junkes", "has_tags^-1", "Poolhall Junkies", "fuzzy"),
    ("Eastwood, Clint", "starred_actors", "Clint Eastwood", "fuzzy"),
    ("Godfather (film)", "starred_actors^-1", "The Godfather", "alias"),
    ("gold", "directed_by^-1", "Gold", "exact"),            # the tag is the raw name, the film is in range
    ("Gold", "has_tags", "gold", "exact"),
    ("Clint Eastwood", "has_tags", "clint eastwood", "exact"),
    ("Clint Eastwood", "starred_actors", "Clint Eastwood", "exact"),
    ("Mobster", "has_tags", "mobster", "exact"),
])
def test_right_kind_links_are_unchanged(linker, text, relation, entity, method):
    link = linker.link(text, relation=R[relation])
    assert (link.name, link.method, link.in_range) == (entity, method, True)
    assert "in_range" not in link.to_json()  # the trace of an in-range link is what it was


def test_an_exact_name_links_outside_the_range_and_says_so(linker):
    link = linker.link("JCVD", relation=R["starred_actors"])  # the LLM wrote the KG's own name
    assert (link.name, link.method, link.in_range) == ("JCVD", "exact", False)
    assert link.to_json()["in_range"] is False
    assert linker.link("jcvd", relation=R["starred_actors"]).in_range is False  # normalised exact too
    assert linker.link("JCVD").in_range is None  # no relation: no judgement


def test_relation_is_ignored_without_ranges_and_checked_with_them(linker):
    plain = EntityLinker(names=NAMES)
    assert plain.link("selling", relation=R["has_tags"]).name == "Elling"
    with pytest.raises(UserError, match=r"relation id 99 out of range \[0, 6\)"):
        linker.link("x", relation=99)
    with pytest.raises(UserError, match="relation must be an id"):
        linker.link("x", relation="has_tags")
    with pytest.raises(UserError, match="RelationRanges over the 3 names"):
        EntityLinker(names=["a", "b", "c"], ranges=linker.ranges)


def test_allowed_ids_and_masks(linker):
    persons = [NAMES.index(p) for p in PERSONS]
    assert linker.link("selling", allowed=persons).entity is None
    mask = np.zeros(len(NAMES), dtype=bool)
    mask[NAMES.index("Elling")] = True
    assert linker.link("selling", allowed=mask).name == "Elling"
    mask[:] = False  # the linker copied the mask: a reused array cannot go stale in its caches
    assert linker.link("selling", allowed=mask).entity is None
    assert [l.entity for l in linker.link_many(["selling", "Ed Wood"], allowed=persons)] == [None, NAMES.index("Ed Wood")]
    with pytest.raises(UserError, match="one value per name"):
        linker.link("x", allowed=np.zeros(3, dtype=bool))
    with pytest.raises(UserError, match="entity ids must be in"):
        linker.link("x", allowed=[len(NAMES)])


# ------------------------------------------------------------------------------- a generated KG
def _generated(seed=0, films=200, people=150):
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ran", "tes", "vor", "dun", "bel", "sar", "qui", "mon", "tri"]
    word = lambda: "".join(rng.choice(syll) for _ in range(rng.randint(2, 4))).capitalize()  # noqa: E731
    persons = sorted({f"{word()} {word()}" for _ in range(people)})
    titles = sorted({f"{word()} {word()}" for _ in range(films)} - set(persons))
    # a person named one letter away from a film: "Kalomi Tesra" (film) / "Kalomi Tesran" (person)
    film = titles[0]
    person = film + "n"
    persons.append(person)
    names = titles + persons + ["noir", "heist"]
    edges = [(t, "directed_by", rng.choice(persons[:-1])) for t in titles]
    edges += [(t, "starred_actors", rng.choice(persons[:-1])) for t in titles]
    edges += [(titles[1], "starred_actors", person), (titles[2], "has_tags", "noir"), (titles[3], "has_tags", "heist")]
    return names, edges, film, person


def test_generated_kg_a_person_name_near_a_film_name():
    names, edges, film, person = _generated()
    lk = _linker(names, edges)
    near_both = film + "h"  # one letter from the film, one substitution from the person
    assert lk.link(near_both, relation=R["starred_actors^-1"]).name == film        # films asked: the film
    assert lk.link(near_both, relation=R["starred_actors"]).name == person         # actors asked: the person
    other = names[4]  # a film no person name is near
    typo = other + other[-1]
    assert lk.link(typo).name == other  # what the linker did before: a film for any question
    on_person = lk.link(typo, relation=R["directed_by"])
    assert on_person.entity is None and on_person.reason == "out of range"
    assert on_person.out_of_range[0][:2] == (other, "fuzzy")
    assert other not in [n for n, _ in on_person.nearest]  # the closest names shown are of the right kind
    assert lk.link(typo, relation=R["directed_by^-1"]).name == other
    # every film title with a typo still links to itself when films are asked (right kind: no regression)
    films = [n for n in names if any(h == n for h, _, _ in edges)]
    for t in films[:60]:
        w = t.split()
        text = " ".join(w[:-1] + [w[-1] + w[-1][-1]])
        got = lk.link(text, relation=R["directed_by^-1"])
        assert got.name == lk.link(text).name, text


# ------------------------------------------------------------------------------ RelationRanges
def test_ranges_read_tails_inverse_heads_and_unknown_entities():
    # only forward edges observed: X^-1 reaches the heads of X through the inverse pairing
    names = ["f1", "f2", "p1", "p2", "t1", "lonely"]
    trip = np.array([[0, 0, 2], [1, 0, 3], [0, 2, 4]], dtype=np.int64)
    rr = RelationRanges(trip, num_entities=6, num_relations=4, inverse=[1, 0, 3, 2])
    allowed = lambda r: [names[i] for i in np.nonzero(rr.allowed(r))[0]]  # noqa: E731
    assert allowed(0) == ["p1", "p2", "lonely"]          # directed_by: persons, + the never-mentioned entity
    assert allowed(1) == ["f1", "f2", "lonely"]          # directed_by^-1: films (siblings: has_tags^-1)
    assert allowed(2) == ["t1", "lonely"]
    assert rr.siblings(1) == [1, 3] and rr.siblings(0) == [0]
    assert list(rr.strict(3)) == [True, False, False, False, False, False]
    strict = RelationRanges(trip, num_entities=6, num_relations=4, inverse=[1, 0, 3, 2], widen=None, unknown=False)
    assert [names[i] for i in np.nonzero(strict.allowed(1))[0]] == ["f1", "f2"]
    assert not rr.allowed(0).flags.writeable  # a cached mask cannot be changed by a caller


def test_widening_takes_in_a_sparse_relation_of_the_same_kind():
    # 'composed_by' reaches 2 persons, both also directors: its range widens to all 10 directors;
    # 'has_tags' shares no entity with them and keeps its own 2 tags
    n_films, n_people = 10, 10
    people = list(range(n_films, n_films + n_people))
    trip = [[f, 0, people[f]] for f in range(n_films)]                      # directed_by: 10 persons
    trip += [[0, 2, people[0]], [1, 2, people[1]]]                         # composed_by: 2 of them
    trip += [[2, 4, 20], [3, 4, 21]]                                        # has_tags: 2 tags
    rr = RelationRanges(np.array(trip), num_entities=22, num_relations=6, inverse=[1, 0, 3, 2, 5, 4], unknown=False)
    assert int(rr.allowed(2).sum()) == 10 and set(np.nonzero(rr.allowed(2))[0]) == set(people)
    assert set(np.nonzero(rr.allowed(4))[0]) == {20, 21}  # no overlap with persons: never widened to them
    assert RelationRanges(np.array(trip), num_entities=22, num_relations=6, inverse=[1, 0, 3, 2, 5, 4],
                          widen=None).allowed(2).sum() == 2


@pytest.mark.parametrize("kwargs,message", [
    ({"triples": [[0, 0, 5]]}, r"triple 0 \[0, 0, 5\] is outside 3 entities / 2 relations"),
    ({"triples": [[0, 2, 1]]}, "is outside"),
    ({"triples": [[0, 1]]}, r"must be \(E, 3\)"),
    ({"widen": 0.0}, r"widen must be in \(0, 1\]"),
    ({"inverse": [1]}, "inverse must give 2 relation ids"),
])
def test_ranges_errors(kwargs, message):
    args = {"triples": [[0, 0, 1]], "num_entities": 3, "num_relations": 2, **kwargs}
    with pytest.raises(UserError, match=message):
        RelationRanges(args.pop("triples"), **args)


def test_from_artifact_builds_the_ranges():
    ents = ["Elling", "Petter Naess", "norway", "Kitchen Stories", "Bent Hamer"]
    rels = ["directed_by", "directed_by^-1", "has_tags", "has_tags^-1"]
    obs = np.array([[0, 0, 1], [3, 0, 4], [0, 2, 2]], dtype=np.int64)
    n = len(ents)
    m = sp.csr_matrix((np.ones(3, np.float32), (obs[:, 1] * n + obs[:, 0], obs[:, 2])), shape=(len(rels) * n, n))
    art = Artifact(entities=ents, relations=rels, matrices=m, observed=obs, missing=np.zeros((0, 3), np.int64))
    lk = EntityLinker.from_artifact(art)
    assert lk.link("selling", relation=2).entity is None           # has_tags: Elling is a film
    assert lk.link("Ellingg", relation=1).name == "Elling"         # directed_by^-1: films
    assert EntityLinker.from_artifact(art, ranges=False).ranges is None


# --------------------------------------------------------------------------- the LGOT call site
def test_lgot_hook_links_with_the_nodes_relation():
    from engine.exec.executor import Executor
    from engine.lang.query import parse
    from llm_bridge import prompts
    from llm_bridge.client import Completion
    from llm_bridge.lgot import LGOTHook, LGOTSettings

    ents = ["Elling", "Petter Naess", "norway", "Kitchen Stories", "Bent Hamer", "sweden"]
    rels = ["directed_by", "directed_by^-1", "has_tags", "has_tags^-1"]
    obs = np.array([[0, 0, 1], [3, 0, 4], [0, 2, 2], [3, 2, 5]], dtype=np.int64)
    n = len(ents)
    rows = np.concatenate([obs[:, 1] * n + obs[:, 0], (obs[:, 1] + 1) * n + obs[:, 2]])
    cols = np.concatenate([obs[:, 2], obs[:, 0]])
    m = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(rels) * n, n))
    m.sort_indices()
    art = Artifact(entities=ents, relations=rels, matrices=m, observed=obs, missing=np.zeros((0, 3), np.int64))

    class Client:
        def complete_many_sync(self, batch, **kw):
            assert all(prompts.parse_projection_request(b) is not None for b in batch)
            return [Completion(texts=('["selling", "Swedn"]',) * 2, logprobs=(None, None),
                               finish_reasons=("stop", "stop"), prompt_tokens=1, completion_tokens=1,
                               model="scripted", n_requested=2) for _ in batch]

    hook = LGOTHook(client=Client(), artifact=art, settings=LGOTSettings(relation_questions="fallback"))
    res = Executor(art, hooks=[hook], backend="reference").answer([parse('(p has_tags "Kitchen Stories")')], k=6,
                                                                  explain=True)[0]
    llm = res.trace.root.notes["llm"]
    assert [l["entity"] for l in llm["linked"]] == ["sweden"]            # "Swedn": a tag, in range
    (lost,) = llm["unlinked"]
    assert lost["text"] == "selling" and lost["reason"] == "out of range"  # was: the film Elling, merged
    assert "Elling" not in {a.entity for a in res.answers if a.score > 0}
