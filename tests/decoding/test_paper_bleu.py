"""The paper-comparable BLEU (numformer/decoding/paper_bleu.py): Moses tokens, ##AT## compound splitting
on both sides and multi-bleu.perl's formula, checked against a hand-worked example and sacreBLEU."""
import math

import pytest
import sacrebleu

from numformer.decoding.paper_bleu import compound_split, paper_bleu, split_for_paper, tokenized_bleu

pytest.importorskip("sacremoses")

HYPS = ["Das Science-Fiction-Buch ist gut.", "Wir lesen Science-Fiction."]
REFS = ["Das Science-Fiction-Buch ist sehr gut.", "Wir lesen gern Science-Fiction."]
# What get_ende_bleu.sh hands multi-bleu.perl for them, split by hand: Moses puts the full stop apart and
# both hyphens of Science-Fiction-Buch become ##AT##-##AT## (the second one's left letter was not consumed).
HYPS_SPLIT = ["Das Science ##AT##-##AT## Fiction ##AT##-##AT## Buch ist gut .",
              "Wir lesen Science ##AT##-##AT## Fiction ."]
REFS_SPLIT = ["Das Science ##AT##-##AT## Fiction ##AT##-##AT## Buch ist sehr gut .",
              "Wir lesen gern Science ##AT##-##AT## Fiction ."]


def test_the_split_is_perls_non_overlapping_substitution():
    assert compound_split("rich-text format") == "rich ##AT##-##AT## text format"
    assert compound_split("a-b-c") == "a ##AT##-##AT## b-c"      # s///g resumes after the consumed b
    assert compound_split("ab-cd-ef") == "ab ##AT##-##AT## cd ##AT##-##AT## ef"
    assert compound_split("- x -y z-") == "- x -y z-"              # a hyphen needs a character on each side
    assert split_for_paper(HYPS, "de") == HYPS_SPLIT and split_for_paper(REFS, "de") == REFS_SPLIT


def test_ngram_counts_of_a_hand_worked_example():
    """Sentence 1: 9 hypothesis tokens, all in the reference; bigrams 7 of 8 (not 'ist gut'); trigrams 5
    of 7; 4-grams 4 of 6. Sentence 2: 6 tokens; 4 of 5 bigrams (not 'lesen Science'); 2 of 4 trigrams;
    1 of 3 4-grams. Lengths 15 against 17, so the brevity penalty is exp(1 - 17/15)."""
    scored = paper_bleu(HYPS, REFS, "de")
    assert scored["counts"] == [15, 11, 7, 5] and scored["totals"] == [15, 13, 11, 9]
    assert (scored["hyp_len"], scored["ref_len"]) == (15, 17)
    expected = 100 * math.exp(1 - 17 / 15) * math.exp(
        (math.log(15 / 15) + math.log(11 / 13) + math.log(7 / 11) + math.log(5 / 9)) / 4)
    assert scored["bleu"] == round(expected, 2)


def test_it_equals_sacrebleu_on_the_pre_split_text():
    own = sacrebleu.corpus_bleu(HYPS_SPLIT, [REFS_SPLIT], tokenize="none", smooth_method="none")
    assert paper_bleu(HYPS, REFS, "de")["bleu"] == round(own.score, 2)
    assert tokenized_bleu(HYPS_SPLIT, REFS_SPLIT)["bleu"] == own.score


def test_splitting_is_what_raises_it_here():
    """Without the split every 4-gram of this example misses (multi-bleu.perl gives 0); with it, 5 match."""
    unsplit = tokenized_bleu([h.replace(" ##AT##-##AT## ", "-") for h in HYPS_SPLIT],
                             [r.replace(" ##AT##-##AT## ", "-") for r in REFS_SPLIT])
    assert unsplit["counts"][3] == 0 and unsplit["bleu"] == 0.0
    assert paper_bleu(HYPS, REFS, "de")["bleu"] > 40
