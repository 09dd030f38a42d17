"""``python -m grad_checks``: float64 finite-difference checks of every layer and the whole model.

See numformer/gradcheck.py for the method and grad_checks/cases.py for what is checked.
"""
