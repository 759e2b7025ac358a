"""vet: one verdict on a third-party implementation (third entry point, docs/architecture.md)."""

from .runner import VetOptions, VetReport, plan, vet, vet_in_process

__all__ = ["VetOptions", "VetReport", "plan", "vet", "vet_in_process"]
