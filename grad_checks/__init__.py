"""``python -m grad_checks``: float64 finite-difference checks of every layer and the whole model.

See numformer/finite_differences/ for the method and grad_checks/cases.py for what is checked.

``python -m grad_checks exercise | check | mutants`` (grad_checks/lab.py): exercises that have a student
write a backward pass (grad_checks/exercises/, grad_checks/exercise.py), grade it against finite
differences and numformer's own backward and name the mistake (grad_checks/grading.py), and the
mutation testing of that grading (grad_checks/mutants.py). docs/exercises.md walks through them.
"""
