"""Kernelised attention's folder: sim(q, k) = phi(q) . phi(k), with its scale, eps and normalisation."""
