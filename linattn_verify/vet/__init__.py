"""vet: one verdict on a third-party implementation (DESIGN's third entry point)."""

from .runner import VetOptions, VetReport, plan, vet, vet_in_process

__all__ = ["VetOptions", "VetReport", "plan", "vet", "vet_in_process"]
