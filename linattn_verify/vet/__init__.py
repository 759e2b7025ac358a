"""vet: one verdict on a third-party implementation (third entry point, docs/architecture.md)."""

from .outcome import VetReport
from .runner import VetOptions, applicability, plan, vet, vet_in_process

__all__ = ["VetOptions", "VetReport", "applicability", "plan", "vet", "vet_in_process"]
