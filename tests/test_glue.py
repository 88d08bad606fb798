"""course_lib.glue: a study's named facts reach myst-nb's glue, Markdown as Markdown, bad names refused."""

import pytest
from IPython.display import Markdown

from course_lib import glue as G
from course_lib.tables import errata_table, markdown_table


@pytest.fixture
def glued(monkeypatch):
    calls = []
    monkeypatch.setattr(G, "glue", lambda name, value, display=True: calls.append((name, value, display)))
    return calls


def test_glue_facts_glues_each_fact_out_of_sight_and_markdown_as_markdown(glued):
    table = markdown_table(["a"], [(1,)])
    G.glue_facts({"ratio": 1.25, "phrase": G.Prose("in *every* run"), "table": table, "n": 3})
    assert [(n, d) for n, _, d in glued] == [("ratio", False), ("phrase", False), ("table", False), ("n", False)]
    values = {n: v for n, v, _ in glued}
    assert values["ratio"] == 1.25 and values["n"] == 3
    assert isinstance(values["phrase"], Markdown) and values["phrase"].data == "in *every* run"
    assert isinstance(values["table"], Markdown) and values["table"].data == str(table)


@pytest.mark.parametrize("facts, error, match", [
    ([("a", 1)], TypeError, "mapping"),
    ({1: 2}, TypeError, "strings"),
    ({"ok": 1, "two words": 2}, ValueError, "without spaces"),
    ({"": 2}, ValueError, "non-empty"),
])
def test_glue_facts_refuses_bad_input_before_gluing_anything(glued, facts, error, match):
    with pytest.raises(error, match=match):
        G.glue_facts(facts)
    assert glued == []


def test_glue_errata_glues_the_claim_measured_table(glued):
    G.glue_errata("errata", [("FP16 is enough.", "It flushed 12%."), ("a|b", "c")])
    (name, value, _), = glued
    assert name == "errata"
    assert value.data.splitlines() == ["| claim | measured |", "|---|---|", "| FP16 is enough. | It flushed 12%. |",
                                       "| a\\|b | c |"]
    assert value.data == str(errata_table([("FP16 is enough.", "It flushed 12%."), ("a|b", "c")]))
    with pytest.raises(ValueError, match="at least one"):
        errata_table([])


def test_count_word():
    from course_lib.glue import count_word

    assert [count_word(n) for n in (0, 1, 3, 12, 13, 32)] == ["no", "one", "three", "twelve", "13", "32"]
    with pytest.raises(TypeError, match="count must be an int"):
        count_word(True)
    with pytest.raises(ValueError, match="must not be negative"):
        count_word(-1)


def test_plural_and_and_list():
    from course_lib.glue import and_list, plural

    assert (plural(1, "step"), plural(0, "step"), plural(3, "step")) == ("1 step", "0 steps", "3 steps")
    assert plural(2, "back-off") == "2 back-offs" and plural(2, "index", "indices") == "2 indices"
    with pytest.raises(TypeError, match="count must be an int"):
        plural(True, "step")
    assert (and_list(["a"]), and_list(["a", "b"]), and_list(["a", "b", "c"])) == ("a", "a and b", "a, b and c")
    for bad in ([], "abc"):
        with pytest.raises(ValueError, match="non-empty sequence"):
            and_list(bad)


def test_sig3_keeps_three_significant_digits_without_an_exponent():
    from course_lib.glue import sig3

    assert [sig3(v) for v in (0.00725, 0.013, 0.15, 2.9, 49.4, 653, 99.96, 1234.5)] == [
        "0.00725", "0.0130", "0.150", "2.90", "49.4", "653", "100", "1,230"]
    assert (sig3(0.0), sig3(-2.5)) == ("0", "-2.5")
    with pytest.raises(TypeError, match="real number"):
        sig3("2.9")
    with pytest.raises(ValueError, match="finite"):
        sig3(float("inf"))


def test_bold_marks_a_computed_number_in_glued_markdown():
    assert G.bold(4) == "**4**" and G.bold("2,048") == "**2,048**"
    assert G.Prose(f"skips step {G.bold(4)}") == "skips step **4**"
    with pytest.raises(ValueError, match="empty"):
        G.bold(" ")


def test_percent_text_never_rounds_a_nonzero_share_to_zero():
    from course_lib.glue import percent_text
    assert [percent_text(v) for v in (0.003, 0.0000725, 0.2, 1.534, 0)] == [
        "0.300%", "0.00725%", "20.0%", "153%", "0%"]
    with pytest.raises(ValueError, match="non-negative"):
        percent_text(-0.1)
    with pytest.raises(TypeError, match="real number"):
        percent_text("0.1")


def test_percent_places_never_rounds_a_share_to_100_or_0_that_is_not():
    from course_lib.glue import percent_places
    assert percent_places(99.8046875) == "99.80%" and percent_places(100.0) == "100.00%"
    assert percent_places(99.998) == "99.998%" and percent_places(99.99951) == "99.9995%"
    assert percent_places(0.001) == "0.001%" and percent_places(0.0) == "0.00%"
    assert percent_places(12.345, 1) == "12.3%"
    for bad in (100.5, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="pct must be a percentage"):
            percent_places(bad)
    with pytest.raises(ValueError, match="places must be"):
        percent_places(50.0, -1)


def test_one_sign_odds_counts_either_sign_over_independent_pairs():
    import itertools

    from course_lib.glue import one_sign_odds

    for n in range(1, 7):   # every sign pattern of n pairs, equally likely: the share that has one sign
        patterns = list(itertools.product((-1, 1), repeat=n))
        one_sign = sum(len(set(p)) == 1 for p in patterns)
        assert one_sign_odds(n) == len(patterns) // one_sign
    assert one_sign_odds(3) == 4
    with pytest.raises(ValueError, match="n must be at least 1"):
        one_sign_odds(0)
    with pytest.raises(TypeError, match="n must be an int, got float"):
        one_sign_odds(3.0)
