"""The planner's memory on the API server: a thin read and write of the ConfigMap that
``builders.planner_memory`` builds. What the memory holds is ``planning.history_to_json``."""

from __future__ import annotations

from .builders import PLANNER_MEMORY_KEY, planner_memory, planner_memory_name
from .kube import Kube
from .names import Owner


class PlannerMemory:
    def __init__(self, kube: Kube):
        self.kube = kube

    def load(self, namespace: str, cluster_name: str) -> str | None:
        """The stored memory; None when there is none yet (a first plan, or it was deleted)."""
        stored = self.kube.get("ConfigMap", namespace, planner_memory_name(cluster_name))
        if stored is None:
            return None
        text = (stored.get("data") or {}).get(PLANNER_MEMORY_KEY)
        return text if isinstance(text, str) else None

    def save(self, owner: Owner, history_json: str) -> None:
        self.kube.apply(planner_memory(owner, history_json))
