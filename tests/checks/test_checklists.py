"""docs/layout.md's checklists, walked against toy additions made the way they say (tests/checks/toys/): a norm
(an RMSNorm: its layer file and one row of numformer/norms.py), an activation (a Mish: its layer file and one row
of numformer/activations.py), an exercise (the RMSNorm's: its file), a model option (``--norm``: one row of
numformer/training/model_flags.py) and a layer. Each toy is put in its place for the length of a test (its module
where numformer would import it from, its row in the table, its class registered as numformer.layers registers a
row's) and then every promise of the checklist is checked with no other change: the config, the model and the
parameter count take it; the grad checks and the PyTorch parity, made from the tables, pass (and fail for a
planted wrong backward); CTranslate2 holds it or refuses it in one line, as its row says, and so does Marian; an
exercise takes its place in the order, the listing and the docs' generated sections, and grades."""
import re
import sys
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest

from grad_checks import case_helpers, doc_sections, exercises, lab
from grad_checks import cases as grad_check_cases
from numformer import activations as activations_table
from numformer.activations import Activation
from numformer.finite_differences import run_case
from numformer.interop import InteropError
from numformer.interop import ctranslate2 as nct2
from numformer.interop.marian_config import from_transformers, marian_config_from_numformer
from numformer.kernels import kernel_mode
from numformer.layers import FeedForward
from numformer.layers import registry
from numformer.layers.registry import layer_class, numformer_classes
from numformer.model import Transformer
from numformer.norms import NORMS, Norm
from numformer.presets import ModelConfig, count_parameters, get_preset
from numformer.training import model_flags
from numformer.training.model_flags import ModelFlag

ROOT = Path(__file__).resolve().parents[2]


class _Vocab:
    pad_id, eos_id, bos_id, unk_id, size = 0, 3, 2, 1, 20


def _put_in_place(monkeypatch, module_name: str, toy, layer: str) -> None:
    """The toy's layer file where numformer imports it from, and its class registered as ``numformer.layers``
    registers each table row's (``registered(getattr(import_module(row.module), row.layer))``), undone after."""
    monkeypatch.setitem(sys.modules, module_name, toy)
    monkeypatch.setitem(registry._OWN, layer, getattr(toy, layer))  # the registry's own classes, put back after
    registry.registered(getattr(import_module(module_name), layer))


@pytest.fixture
def rmsnorm(monkeypatch):
    """RMSNorm added as docs/layout.md's "Adding a norm" says: its layer file and one row of the norms' table."""
    from checks.toys import rmsnorm as toy

    row = Norm("rmsnorm_toy", "ToyRMSNorm", ("weight",), "rms_norm", {"rms_norm": True}, False)
    _put_in_place(monkeypatch, row.module, toy, row.layer)
    monkeypatch.setitem(NORMS, row.name, row)
    return toy


@pytest.fixture
def mish(monkeypatch):
    """Mish added as "Adding an activation" says: its layer file and one row of the activations' table
    (transformers computes it as ``mish``; CTranslate2 has no such activation)."""
    from checks.toys import mish as toy

    row = Activation("mish_toy", "ToyMish", ("mish",), "", "mish")
    _put_in_place(monkeypatch, row.module, toy, row.layer)
    monkeypatch.setitem(activations_table.ACTIVATIONS, row.name, row)
    return toy


def _grad_checks(builder) -> list:
    """Every tensor's result of a builder's cases (as python -m grad_checks runs them)."""
    return [r for case in builder(np.random.default_rng(0)) for r in run_case(case, np.random.default_rng(1))]


def _graded_as_a_student_writes_it(ex, folder) -> None:
    """The exercise's file with numformer's answer written in checks exact; with each catalogued mistake, names it."""
    import lab_files

    result, status, message = lab.check_file(str(lab_files.write(ex, ex.target, folder)))
    assert status == 0 and result.exact, message or str(result)
    for mistake in ex.mistakes:
        result, status, _ = lab.check_file(str(lab_files.write(ex, mistake, folder)))
        assert status == 1 and result.mistake == mistake.__name__, (mistake.__name__, str(result))


# -- a norm --------------------------------------------------------------------------------------------------------

def test_a_norm_is_its_layer_file_and_one_row(rmsnorm):
    cfg = get_preset("tiny", vocab_size=40, norm="rmsnorm_toy")
    for pre in (False, True):
        model = Transformer(cfg.replace(pre_norm=pre))
        norms = [m for n, m in model.named_modules() if n.endswith("norm")]
        assert norms and all(type(m) is rmsnorm.ToyRMSNorm for m in norms)  # every residual's, pre-LN's final ones
        assert model.num_parameters() == count_parameters(cfg.replace(pre_norm=pre))  # one parameter per feature
    assert "ToyRMSNorm" in numformer_classes()  # swappable (--swap ToyRMSNorm=...) as a registered layer


def test_the_grad_checks_of_a_norm_come_from_its_row(rmsnorm, monkeypatch):
    made = grad_check_cases.table_builders()
    assert list(made) == ["ToyRMSNorm"]
    results = _grad_checks(made["ToyRMSNorm"])
    assert {r.layer for r in results} == {"ToyRMSNorm", "Residual", "Transformer+loss"}
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    # planted: the path through r dropped from the backward
    monkeypatch.setattr(rmsnorm, "rmsnorm_backward", lambda dy, xhat, r, gamma: (r * dy * gamma, (dy * xhat).sum(0)))
    alone = made["ToyRMSNorm"](np.random.default_rng(0))[0]
    assert alone.layer == "ToyRMSNorm" and not all(r.passed for r in run_case(alone, np.random.default_rng(1)))


def test_the_parity_of_a_norm_comes_from_its_row(rmsnorm, monkeypatch):
    from checks import test_torch_parity as parity

    made = {"ToyRMSNorm", "Transformer-ToyRMSNorm-post-LN-dropout", "Transformer-ToyRMSNorm-untied-pre-LN"}
    cases = {k: v for k, v in parity.norm_cases().items() if "ToyRMSNorm" in k}  # made from the rows: the toy's
    assert set(cases) == made
    with kernel_mode("plain"):  # the layer in both dtypes; the models in float64 (the suite runs both, for a row)
        for case_id, build in cases.items():
            for dtype in parity.DTYPES if case_id == "ToyRMSNorm" else ("float64",):
                parity.run_parity(build, case_id, dtype, record=False)
    monkeypatch.setattr(rmsnorm, "rmsnorm_backward", lambda dy, xhat, r, gamma: (r * dy * gamma, (dy * xhat).sum(0)))
    with pytest.raises(AssertionError, match="disagrees with PyTorch"):  # planted, as above
        parity.run_parity(cases["ToyRMSNorm"], "ToyRMSNorm", "float64", record=False)


def test_ctranslate2_holds_a_norm_its_row_says_it_holds_and_marian_refuses_it(rmsnorm, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from interop import test_ctranslate2 as ct2_tests
    from numformer.data.vocab import SubwordVocab
    from support import TEXT

    cfg = get_preset("tiny", vocab_size=20, norm="rmsnorm_toy")
    with pytest.raises(InteropError, match="its norm is rmsnorm_toy; Marian's is layernorm"):
        marian_config_from_numformer(cfg, _Vocab())
    vocab = SubwordVocab.train(TEXT, tmp_path / "spm", 120)
    src = [vocab.encode_source([line])[0] for line in ("the cat", "a dog sat down", "hello")]
    tgt = [list(reversed(s))[:4] for s in src]
    for pre in (False, True):
        model = ct2_tests.random_model(vocab, norm="rmsnorm_toy", pre_norm=pre)
        out = nct2.export_model(model, vocab, tmp_path / f"ct2-{pre}")
        translator = ctranslate2.Translator(str(out), intra_threads=1)
        assert ct2_tests.worst_difference(model, vocab, translator, src, tgt) < ct2_tests.LOGP_TOL
    # a row that names no CTranslate2 counterpart is refused in one line
    NORMS["rmsnorm_toy"] = Norm("rmsnorm_toy", "ToyRMSNorm", ("weight",), "rms_norm", None, False)
    with pytest.raises(InteropError, match="CTranslate2 export knows the norms layernorm.*, not 'rmsnorm_toy'$"):
        nct2.check_exportable(cfg)


# -- an activation ---------------------------------------------------------------------------------------------------

def test_an_activation_is_its_layer_file_and_one_row(mish, tmp_path, monkeypatch):
    from checks import test_torch_parity as parity

    cfg = ModelConfig(activation="mish_toy").checked()
    assert type(FeedForward(4, 8, activation="mish_toy").activation) is mish.ToyMish is layer_class("ToyMish")
    made = grad_check_cases.table_builders()
    assert list(made) == ["ToyMish"]
    results = _grad_checks(made["ToyMish"])
    assert {r.layer for r in results} == {"ToyMish", "FeedForward"} and all(r.passed for r in results)
    with kernel_mode("plain"):
        for dtype in parity.DTYPES:
            parity.run_parity(lambda r, d: parity.case_activation(r, d, "mish_toy"), "ToyMish", dtype, record=False)
            parity.run_parity(lambda r, d: parity.case_feedforward(r, d, "mish_toy"), "FeedForward-ToyMish", dtype,
                              record=False)
    # its exercise, made from the row: in the activations' stage, after the table's others (what the import of
    # grad_checks.exercises computes, computed again here with the row in the table)
    generated = tuple(n for n in activations_table.ACTIVATIONS if n not in exercises.FILED)
    assert generated == exercises.GENERATED + ("mish_toy",)
    monkeypatch.setattr(exercises, "GENERATED", generated)
    order = tuple(sorted(exercises.FILED + generated, key=exercises._place))
    assert tuple(n for n in order if n != "mish_toy") == exercises.ORDER
    monkeypatch.setattr(exercises, "ORDER", order)
    activations = [n for n in order if exercises.get(n).stage == "elementwise"]
    assert activations == list(activations_table.ACTIVATIONS) and activations[-1] == "mish_toy"
    _graded_as_a_student_writes_it(exercises.get("mish_toy"), tmp_path)
    # exports: transformers computes it (Marian writes and reads its name); CTranslate2 has none (one line)
    assert "mish" in [n for row in activations_table.ACTIVATIONS.values() for n in row.transformers]
    assert from_transformers("mish") is not None  # an import accepts it
    assert marian_config_from_numformer(cfg.replace(vocab_size=20), _Vocab())["activation_function"] == "mish"
    with pytest.raises(InteropError, match="CTranslate2 export knows the activations relu, .*, not 'mish_toy'"):
        nct2.check_exportable(cfg)


# -- an exercise -------------------------------------------------------------------------------------------------

def test_an_exercise_is_its_file(rmsnorm, monkeypatch, tmp_path):
    from checks.toys import rmsnorm_exercise as toy

    name = "rmsnorm_toy"
    monkeypatch.setitem(sys.modules, f"{exercises.__name__}.{name}", toy)  # grad_checks/exercises/rmsnorm_toy.py
    order = tuple(sorted(exercises.FILED + (name,) + exercises.GENERATED, key=exercises._place))
    assert order.index("layernorm") < order.index(name) < order.index("dropout")  # its stage: the norms
    assert tuple(n for n in order if n != name) == exercises.ORDER  # nothing else moved
    monkeypatch.setattr(exercises, "FILED", exercises.FILED + (name,))
    monkeypatch.setattr(exercises, "ORDER", order)
    listing = lab.list_exercises().splitlines()
    n = order.index(name) + 1
    after = order[n]
    assert listing[n - 1].split()[:2] == [str(n), name] and listing[n].split()[:2] == [str(n + 1), after]
    assert f"1 of {len(order)} exercises check exact" in doc_sections.exercise_status({})
    # the page's listing is now stale, and what python -m grad_checks.doc_sections --write puts there lists it
    listed = next(m for m in doc_sections.MARK.finditer((ROOT / "docs" / "exercises.md").read_text())
                  if m["name"] == "exercise-list")
    written = doc_sections.rendered(listed[0], {})
    assert name not in listed[0] and f"{n:>2}  {name}" in written and f"{n + 1:>2}  {after}" in written
    _graded_as_a_student_writes_it(exercises.get(name), tmp_path)
    from grad_checks.mutation_testing import grade_mutants

    from grad_checks.mutants import equivalent

    with np.errstate(all="ignore"):
        graded = grade_mutants([name])
    survivors = {(r.mutant.exercise, r.mutant.edit) for r in graded if r.verdict not in ("wrong", "error")}
    # the mutants that survive are the ones its file declares equivalent, gathered with the others' (EQUIVALENT)
    assert graded and survivors == {(name, "minus of `-1` dropped")} and survivors <= set(equivalent())


# -- a model option ----------------------------------------------------------------------------------------------

def test_a_model_option_is_its_field_and_one_flag_row(rmsnorm, monkeypatch):
    import train
    from numformer.training.config import settle
    from reference import torch_mirror as tm

    rows = [f for f in model_flags.MODEL_FLAGS if f.flag != "--norm"]  # the row, as a norm's checklist adds it
    row = ModelFlag("--norm", "norm", "the residual sub-layers' norm", parser={"choices": list(NORMS)})
    monkeypatch.setattr(model_flags, "MODEL_FLAGS", (*rows, row))
    flags = vars(train.parse_args(["--task", "copy", "--preset", "tiny", "--norm", "rmsnorm_toy"]))
    assert settle(flags, "cpu", None, "runs/x").model["norm"] == "rmsnorm_toy"
    assert model_flags.clashing_with_init_from(flags) == ["--norm"]  # it changes the architecture
    cfg = ModelConfig(norm="rmsnorm_toy")
    assert tm.Arch.from_config(cfg).norm == "rmsnorm_toy"  # the mirror reads the field itself
    with pytest.raises(Exception, match="norm must be one of layernorm, .*rmsnorm_toy"):
        ModelConfig(norm="scalenorm").checked()


# -- a layer -----------------------------------------------------------------------------------------------------

def test_every_layer_has_its_grad_checks_registered_where_its_builder_is(monkeypatch):
    """Every registered numformer layer has a grad-check builder (a layer added without one fails here), and a
    builder registers itself: @checks("Name") where it is defined, two for one name refused."""
    assert set(numformer_classes()) <= set(grad_check_cases.BUILDERS)
    assert all(grad_check_cases.BUILDERS[name] is builder for name, builder in case_helpers.REGISTERED.items())
    monkeypatch.setattr(case_helpers, "REGISTERED", dict(case_helpers.REGISTERED))

    @case_helpers.checks("Scale")
    def scale(rng):
        return []

    assert case_helpers.REGISTERED["Scale"] is scale
    with pytest.raises(ValueError, match="two grad-check builders for Linear"):
        case_helpers.checks("Linear")(scale)


# -- the checklists themselves -----------------------------------------------------------------------------------

def test_the_checklists_name_files_that_exist():
    """Every path docs/layout.md's checklists name exists, or is the new file's own (``<name>``)."""
    text = (ROOT / "docs" / "layout.md").read_text()
    start = text.index("## Adding a layer")
    lists = text[start:text.index("## Looking inside a layer")]
    for title in ("## Adding a layer", "## Adding a norm", "## Adding an activation", "## Adding a model option",
                  "## Adding an exercise"):
        assert title in lists, title
    paths = set(re.findall(r"`((?:numformer|grad_checks|tests|docs|bench)/[\w/<>.-]+\.(?:py|md))", lists))
    assert len(paths) > 15
    missing = [p for p in sorted(paths) if "<" not in p and not (ROOT / p).exists()]
    assert not missing, missing
