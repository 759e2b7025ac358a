"""vet: one verdict on a third-party implementation (DESIGN's third entry point)."""

from .runner import VetOptions, VetReport, plan, vet, vet_in_process
from .worker import Target

__all__ = ["Target", "VetOptions", "VetReport", "plan", "vet", "vet_in_process"]
