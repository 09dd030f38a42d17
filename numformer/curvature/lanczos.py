"""Lanczos on a symmetric operator given as ``matvec`` (a block's Hessian-vector product, hvp.py): its
extreme eigenvalues, and its spectral density by stochastic Lanczos quadrature.

Lanczos (with full reorthogonalisation: every new vector is orthogonalised against all the earlier ones,
twice, so that rounding does not bring converged eigenvectors back as "ghost" copies) builds from a start
vector ``q_1`` an orthonormal basis ``Q_m`` of the Krylov space and the tridiagonal ``T_m = Q_m^T H Q_m``
(``alpha`` on the diagonal, ``beta`` beside it). The eigenvalues of ``T_m`` (Ritz values) approach H's
extreme eigenvalues first; with ``m`` equal to the dimension they are H's eigenvalues.

Stochastic Lanczos quadrature (Golub and Meurant; Ghorbani, Krishnan and Xiao 2019; Yao et al. 2020,
PyHessian): for a random start ``q_1 = z / |z|`` with Rademacher ``z``, the Ritz values ``theta_j`` of ``T_m`` with
weights ``tau_j^2`` (the squared first components of ``T_m``'s eigenvectors) are an m-point Gauss quadrature of
the spectral density ``phi(t) = (1/n) sum_i delta(t - lambda_i)`` as seen from ``z``; averaged over ``probes``
starts and smoothed by a Gaussian of width ``sigma``, they estimate it.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module, to_host


def lanczos(matvec, dim: int, steps: int, start):
    """(alpha (m,), beta (m - 1,)) of ``steps`` Lanczos steps from ``start`` (flat, any norm), m <= dim; stops
    early on an invariant subspace (beta ~ 0)."""
    xp = get_array_module(start)
    m = min(int(steps), int(dim))
    q = start / xp.sqrt((start * start).sum())
    basis, alpha, beta = [q], [], []
    for j in range(m):
        w = matvec(basis[-1])
        a = float((w * basis[-1]).sum())
        alpha.append(a)
        if j == m - 1:
            break
        Q = xp.stack(basis, axis=1)
        for _ in range(2):  # full reorthogonalisation, twice ("twice is enough")
            w = w - Q @ (Q.T @ w)
        b = float(xp.sqrt((w * w).sum()))
        if b <= 1e-10 * max(abs(a), 1e-300):  # an invariant subspace: T_j holds exact eigenvalues
            break
        beta.append(b)
        basis.append(w / b)
    return np.array(alpha), np.array(beta)


def ritz(alpha, beta):
    """(Ritz values ascending, weights = squared first components of T's eigenvectors)."""
    t = np.diag(alpha) + np.diag(beta, 1) + np.diag(beta, -1)
    values, vectors = np.linalg.eigh(t)
    return values, vectors[0] ** 2


def extreme_eigenvalues(matvec, dim: int, steps: int, rng, xp=np, top: int = 1):
    """(the ``top`` largest and the smallest eigenvalue estimates: (largest first array, smallest), Ritz values)
    from one Lanczos run of ``steps`` from a Gaussian start."""
    start = xp.asarray(rng.standard_normal(dim))
    values, _ = ritz(*lanczos(matvec, dim, steps, start))
    return values[::-1][:top], float(values[0]), values


def slq(matvec, dim: int, steps: int, probes: int, rng, xp=np):
    """Stochastic Lanczos quadrature: (nodes, weights), each (probes, m), from ``probes`` Rademacher starts."""
    nodes, weights = [], []
    for _ in range(probes):
        z = xp.asarray(rng.choice([-1.0, 1.0], size=dim))
        values, w = ritz(*lanczos(matvec, dim, steps, z))
        pad = steps - len(values)  # an early stop: fewer nodes, zero weight for the rest
        nodes.append(np.pad(values, (0, pad), constant_values=values[-1]))
        weights.append(np.pad(w, (0, pad)))
    return np.array(nodes), np.array(weights)


def density(nodes, weights, grid, sigma: float):
    """The spectral density on ``grid``: the quadrature's nodes as Gaussians of width ``sigma``, weighted, averaged
    over the probes; integrates to about 1 over a grid covering the nodes."""
    grid = np.asarray(to_host(grid), dtype=float)
    g = np.exp(-((grid[None, None, :] - nodes[:, :, None]) ** 2) / (2 * sigma ** 2)) / (sigma * np.sqrt(2 * np.pi))
    return (weights[:, :, None] * g).sum(axis=1).mean(axis=0)
