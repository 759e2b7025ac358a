"""Softmax attention's folder: sim(q, k) = exp(q . k / sqrt(d))."""
