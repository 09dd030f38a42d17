"""BLEU computed the paper's way: tokenised, with compound splitting (Section 6.1's Table 2 figures).

The paper's 27.3 (base) and 28.4 (big) on newstest2014 English-German were not sacreBLEU: they came
from tensor2tensor's ``get_ende_bleu.sh``, which

1. tokenises hypothesis and reference with Moses' ``tokenizer.perl -l de`` (its default escaping of
   ``& < > " ' | [ ]`` included),
2. splits hyphenated compounds on both sides, ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``, so that
   ``Science-Fiction`` becomes the three tokens ``Science ##AT##-##AT## Fiction`` (the habit of GNMT
   and ConvS2S papers; it adds 0.7 to 1 BLEU),
3. scores the tokens with ``multi-bleu.perl``: case-sensitive corpus BLEU, no smoothing, brevity
   penalty ``exp(1 - r / c)`` when the c hypothesis tokens are fewer than the r reference tokens.

Here Moses' tokeniser is sacremoses (an optional extra: ``pip install sacremoses``), the split is the
same regular expression (non-overlapping left to right like Perl's ``s///g``: ``a-b-c`` becomes
``a ##AT##-##AT## b-c``), and step 3 is sacreBLEU with ``tokenize='none'`` and ``smooth_method='none'``
on the split tokens, which is multi-bleu.perl's formula. That figure is **paper-comparable**;
sacreBLEU on detokenised text (:func:`numformer.decoding.translation.score_translations`, with its
signature) is the modern standard, and the two are reported side by side, labelled.
"""
from __future__ import annotations

import re

#: The one sentence every WMT test report prints under its two BLEUs.
WHICH_FIGURE = ("The paper's Table 2 (27.3 base / 28.4 big En-De, 38.1 / 41.8 En-Fr on newstest2014) compares "
                "with the paper-comparable BLEU, not with sacreBLEU's.")
_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """``Science-Fiction`` -> ``Science ##AT##-##AT## Fiction``: get_ende_bleu.sh's Perl substitution."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """Moses' ``tokenizer.perl -l LANG`` (default escaping) on each line, through sacremoses."""
    try:
        from sacremoses import MosesTokenizer  # noqa: PLC0415  (an optional extra, only for this figure)
    except ImportError:
        from ..errors import UsageError  # noqa: PLC0415

        raise UsageError("the paper-comparable BLEU tokenises with Moses' rules through sacremoses: "
                         "pip install sacremoses") from None
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, return_str=True, escape=True) for line in lines]


def split_for_paper(lines: list[str], lang: str) -> list[str]:
    """What get_ende_bleu.sh hands multi-bleu.perl: Moses tokens with compounds split."""
    return [compound_split(line) for line in moses_tokenize(lines, lang)]


def tokenized_bleu(hypotheses: list[str], references: list[str]) -> dict:
    """multi-bleu.perl's BLEU of already tokenised lines: n-gram matches and totals for n = 1..4,
    hypothesis and reference token counts, the brevity penalty and the score (0-100)."""
    import sacrebleu  # noqa: PLC0415

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} translations but {len(references)} references: the counts must match")
    metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    score = metric.corpus_score(hypotheses, [references])
    return {"bleu": score.score, "counts": list(score.counts), "totals": list(score.totals),
            "hyp_len": score.sys_len, "ref_len": score.ref_len, "brevity_penalty": score.bp}


def paper_bleu(hypotheses: list[str], references: list[str], lang: str) -> dict:
    """The paper-comparable BLEU of detokenised hypotheses against one reference each, in target
    language ``lang`` (``de``, ``fr``): :func:`tokenized_bleu` of :func:`split_for_paper` on both sides."""
    scored = tokenized_bleu(split_for_paper(hypotheses, lang), split_for_paper(references, lang))
    scored["bleu"] = round(scored["bleu"], 2)
    scored["method"] = (f"Moses tokenizer -l {lang} (sacremoses), ##AT## compound splitting on both sides, "
                        "multi-bleu.perl's formula: tokenised, case-sensitive, no smoothing")
    return scored
