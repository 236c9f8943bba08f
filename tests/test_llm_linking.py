"""Entity linking: normalisation, exact/alias/fuzzy matches, the threshold boundary, unlinked strings reported."""
from __future__ import annotations

import pytest
from rapidfuzz import fuzz

from kgreason.errors import UserError
from llm_bridge.linking import EntityLinker, load_names_file, normalize

NAMES = ["Zoe Saldana", "The Beatles", "Paris (/m/05qtj)", "Paris (/m/0abc)", "Robert Zemeckis", "Tom Hanks",
         "Ender's Game", "AT&T", "São Paulo", "/m/027rn", "Forrest_Gump", "Cast Away (film)"]


@pytest.fixture(scope="module")
def linker():
    return EntityLinker(names=NAMES, aliases={"Bob Zemeckis": "Robert Zemeckis", "Big Apple": [5]})


@pytest.mark.parametrize("text,norm", [
    ("The Beatles", "beatles"), ("beatles, the", "beatles"), ("A Tale", "tale"), ("An Apple", "apple"),
    ("Zoë_Saldaña", "zoe saldana"), ("  ZOE   saldana ", "zoe saldana"), ("m.027rn", "/m/027rn"),
    ("/m/027rn", "/m/027rn"), ("/en/tom_hanks", "tom hanks"), ("Ender's Game", "enders game"),
    ("Ender\u2019s Game", "enders game"), ("AT&T", "at and t"), ("São-Paulo!", "sao paulo"), ("the", "the"),
    ("", ""), ("...", ""),
])
def test_normalize(text, norm):
    assert normalize(text) == norm


@pytest.mark.parametrize("text,entity,method", [
    ("Tom Hanks", "Tom Hanks", "exact"),
    ("tom hanks", "Tom Hanks", "exact"),
    ("Zoë Saldaña", "Zoe Saldana", "exact"),       # accents
    ("the beatles", "The Beatles", "exact"),       # articles
    ("Beatles", "The Beatles", "exact"),
    ("Forrest Gump", "Forrest_Gump", "exact"),     # underscores
    ("forrest_gump", "Forrest_Gump", "exact"),
    ("Enders Game", "Ender's Game", "exact"),      # punctuation
    ("AT and T", "AT&T", "exact"),
    ("SAO PAULO", "São Paulo", "exact"),
    ("m.027rn", "/m/027rn", "exact"),              # Freebase-style id
    ("Bob Zemeckis", "Robert Zemeckis", "alias"),  # caller's alias
    ("big apple", "Tom Hanks", "alias"),
    ("Cast Away", "Cast Away (film)", "alias"),    # disambiguation suffix stripped
    ("Robert Zemeckiss", "Robert Zemeckis", "fuzzy"),
    ("Tom Hank", "Tom Hanks", "fuzzy"),
])
def test_link(linker, text, entity, method):
    link = linker.link(text)
    assert (link.name, link.method) == (entity, method)
    assert link.entity == NAMES.index(entity)
    assert link.score == (100.0 if method != "fuzzy" else pytest.approx(fuzz.token_sort_ratio(normalize(text),
                                                                                             normalize(entity))))


def test_unlinked_strings_are_reported(linker):
    links = linker.link_many(["Tom Hanks", "Tim Honks", "XYZ", ""])
    assert [l.linked for l in links] == [True, False, False, False]
    assert len(links) == 4  # nothing silently dropped
    near = links[1]
    assert near.entity is None and near.method is None and near.closest == "Tom Hanks"
    assert 0 < near.score < linker.threshold
    assert near.to_json() == {"text": "Tim Honks", "entity": None, "id": None, "method": None,
                              "score": round(near.score, 2), "closest": "Tom Hanks"}


def test_fuzzy_threshold_boundary():
    names = ["Robert Zemeckis", "Tom Hanks"]
    text = "Robert Zemekis"
    score = fuzz.token_sort_ratio(normalize(text), normalize("Robert Zemeckis"))
    at = EntityLinker(names=names, threshold=score)
    assert at.link(text).method == "fuzzy" and at.link(text).score == pytest.approx(score)  # >= accepts
    above = EntityLinker(names=names, threshold=min(100.0, score + 0.01))
    assert above.link(text).entity is None and above.link(text).closest == "Robert Zemeckis"


def test_short_strings_are_not_fuzzy_matched():
    lk = EntityLinker(names=["Abc", "Xyz"], threshold=50)
    assert lk.link("Abd").entity is None  # 3 characters < min_fuzzy_chars
    assert EntityLinker(names=["Abc"], threshold=50, min_fuzzy_chars=1).link("Abd").name == "Abc"
    assert EntityLinker(names=["Robert Zemeckis"], fuzzy=False).link("Robert Zemeckiss").entity is None


def test_ambiguous_forms_prefer_then_smaller_id(linker):
    plain = linker.link("Paris")
    assert plain.name == "Paris (/m/05qtj)" and plain.candidates == 2 and plain.method == "alias"
    preferred = linker.link("paris", prefer={3: 0.7})
    assert preferred.name == "Paris (/m/0abc)"
    # an entity's own name beats another entity's alias
    lk = EntityLinker(names=["Apple", "Apple Inc."], aliases={"apple": "Apple Inc."})
    assert lk.link("APPLE").name == "Apple" and lk.link("APPLE").method == "exact"


def test_bad_settings_and_aliases():
    with pytest.raises(UserError, match="threshold"):
        EntityLinker(names=["a"], threshold=101)
    with pytest.raises(UserError, match="scorer"):
        EntityLinker(names=["a"], scorer="levenshtein")
    with pytest.raises(UserError, match="unknown entity"):
        EntityLinker(names=["a"], aliases={"x": "nope"})
    with pytest.raises(UserError, match="out of range"):
        EntityLinker(names=["a"], aliases={"x": 3})


def test_names_file_id2ent(tmp_path):
    # FB15k-237's id2ent.tsv layout; artifact names come from name_kgbert, disambiguated with the mid
    f = tmp_path / "id2ent.tsv"
    f.write_text("id\tmid\tname_kgbert\twikidata_label\n"
                 "0\t/m/027rn\tDominican Republic\tDominican Republic\n"
                 "1\t/m/06cx9\tRepublic\trepublic\n"
                 "2\t/m/05qtj\tParis\tParis\n"
                 "3\t/m/0abc\tParis\tParis, Texas\n"
                 "4\t/m/0zzz\tNot In Artifact\tx\n", encoding="utf-8")
    names = ["Dominican Republic", "Republic", "Paris (/m/05qtj)", "Paris (/m/0abc)"]
    aliases = load_names_file(f, names)
    assert aliases["/m/027rn"] == [0]
    assert aliases["Paris, Texas"] == [3]
    assert sorted(aliases["Paris"]) == [2, 3]
    assert "x" not in aliases  # rows of no artifact entity are skipped
    lk = EntityLinker(names=names, aliases=aliases)
    assert lk.link("Paris, Texas").name == "Paris (/m/0abc)"
    assert lk.link("m.06cx9").name == "Republic"


def test_names_file_entity2text(tmp_path):
    f = tmp_path / "entity2text.txt"
    f.write_text("/m/027rn\tDominican Republic\n/m/06cx9\tRepublic\n", encoding="utf-8")
    aliases = load_names_file(f, ["/m/027rn", "/m/06cx9"])  # an artifact named by mids
    lk = EntityLinker(names=["/m/027rn", "/m/06cx9"], aliases=aliases)
    assert lk.link("the Dominican Republic").entity == 0
    assert lk.link("republic").entity == 1


def test_names_file_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_names_file(tmp_path / "nope.tsv", ["a"])
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"id\tname\n0\t\xff\xfe\n")
    with pytest.raises(UserError, match="not UTF-8"):
        load_names_file(bad, ["a"])
