"""Curvature of the loss of a numformer model: Hessian-vector products of a block of parameters (hvp.py) and
Lanczos for its extreme eigenvalues and, by stochastic Lanczos quadrature, its spectral density (lanczos.py)."""
