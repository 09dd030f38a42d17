"""Decoding (Section 6.1): greedy and beam search over the cached decoder, and text in, text out.

``search`` (the searches, as plain math: their fast pieces are in :mod:`numformer.kernels.decoding`),
``translation`` (batched translation of lines, sacreBLEU scoring).
"""
