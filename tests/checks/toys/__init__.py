"""Toy additions written the way docs/layout.md's checklists say, as the files they would be in numformer, for
tests/checks/test_checklists.py: a norm (RMSNorm, ``rmsnorm.py``, what ``numformer/layers/rmsnorm.py`` would
hold), an activation (Mish, ``mish.py``, ``numformer/layers/mish.py``), and RMSNorm's exercise
(``rmsnorm_exercise.py``, ``grad_checks/exercises/rmsnorm.py``). Nothing of numformer imports them; the test
puts each in its place for the length of a test, under a name of its own (``rmsnorm_toy``, ``ToyRMSNorm``,
``mish_toy``, ``ToyMish``), so that a real RMSNorm or Mish added to numformer later meets no toy of its name."""
