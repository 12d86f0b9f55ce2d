"""The planner's memory on the API server: a read and a guarded write of the ConfigMap that
``builders.planner_memory`` builds. What the memory holds is ``planning.history_to_json``.

The memory is not trusted as read: anyone with write access to ConfigMaps can edit it, and a
future ``lastPlanAtSeconds`` alone would stop planning for good. ``memory_problem`` names what
is wrong with a stored memory (the loop then starts from an empty one and says so).

Only a ConfigMap this PDCluster controls (controller owner reference with its uid) is read
or written as its memory: one created by someone else before the PDCluster (same name) is
left alone, neither read, nor written over, nor adopted (``ForeignMemory``); the loop holds
and says why.

Writes carry the resourceVersion that was read, as a precondition (a create when none was
read): a write that lost a race (another writer got there first, HTTP 409) does not clobber
the newer memory; it is dropped, and the next tick reads the newer one.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from kubernetes.client.exceptions import ApiException

from pdscale.operator.api.names import Owner
from pdscale.operator.clients.kube import Kube
from pdscale.operator.render.builders import PLANNER_MEMORY_KEY, planner_memory, planner_memory_name

log = logging.getLogger(__name__)

#: how far ahead of this clock a stored time may be before it is not believed (clock skew
#: between operator replicas, not a future)
MAX_CLOCK_SKEW_SECONDS = 60.0


class ForeignMemory(Exception):
    """A ConfigMap of the memory's name exists but is not controlled by this PDCluster."""


def foreign_memory_message(name: str, namespace: str) -> str:
    return (f"ConfigMap {namespace}/{name} is not controlled by this PDCluster (no controller "
            f"owner reference with its uid): it is not the planner memory and is left alone; "
            f"the planner holds until it is deleted or renamed")


class PlannerMemory:
    def __init__(self, kube: Kube):
        self.kube = kube
        #: (namespace, PDCluster) -> the resourceVersion of the memory last read
        self.versions: dict[tuple[str, str], str] = {}

    def load(self, namespace: str, cluster_name: str, uid: str | None = None) -> str | None:
        """The stored memory; None when there is none yet (a first plan, or it was deleted).
        With ``uid`` (the PDCluster's), a ConfigMap it does not control raises
        ``ForeignMemory``."""
        key = (namespace, cluster_name)
        name = planner_memory_name(cluster_name)
        stored = self.kube.get("ConfigMap", namespace, name)
        if stored is None:
            self.versions.pop(key, None)
            return None
        if uid is not None and not _controlled_by(stored, uid):
            self.versions.pop(key, None)
            raise ForeignMemory(foreign_memory_message(name, namespace))
        version = (stored.get("metadata") or {}).get("resourceVersion")
        if isinstance(version, str) and version:
            self.versions[key] = version
        text = (stored.get("data") or {}).get(PLANNER_MEMORY_KEY)
        return text if isinstance(text, str) else None

    def save(self, owner: Owner, history_json: str) -> bool:
        """Write the memory over the version last read (a create when none was). False when
        it changed since (HTTP 409): the newer memory stays, the next tick reads it."""
        key = (owner.namespace, owner.name)
        manifest = planner_memory(owner, history_json)
        version = self.versions.get(key)
        try:
            if version is None:  # none was read: it must not exist now either
                written = self.kube.create(manifest)
            else:
                manifest["metadata"]["resourceVersion"] = version  # the apply's precondition
                written = self.kube.apply(manifest, force=True)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.versions.pop(key, None)
            log.warning("planner memory of %s/%s changed since it was read (HTTP 409): not "
                        "overwritten; the next tick reads the newer one", *key)
            return False
        new_version = (written.get("metadata") or {}).get("resourceVersion")
        if isinstance(new_version, str) and new_version:
            self.versions[key] = new_version
        return True


def _controlled_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("controller") is True and ref.get("uid") == uid
               for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
               if isinstance(ref, dict))


def memory_problem(text: str, now: float, skew_seconds: float = MAX_CLOCK_SKEW_SECONDS) -> str | None:
    """What makes a stored memory unfit to plan from, or None when it is fit (pure): not a
    JSON object with ``loads`` and ``decisions`` lists, a non-finite or negative number
    anywhere, or a ``lastPlanAtSeconds`` beyond ``now`` + ``skew_seconds``."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return f"not JSON ({type(exc).__name__})"
    if not isinstance(data, dict):
        return f"not a JSON object but {type(data).__name__}"
    for field in ("loads", "decisions"):
        if not isinstance(data.get(field), list):
            return f"{field} is not a list"
    try:
        bad = _bad_number(data, "")
    except RecursionError:
        return "nested too deep"
    if bad is not None:
        return bad
    last = data.get("lastPlanAtSeconds")
    if last is not None and (not _number(last) or last > now + skew_seconds):
        return f"lastPlanAtSeconds {last!r} is in the future (now {now:.0f})" if _number(last) \
            else f"lastPlanAtSeconds {last!r} is not a time"
    for i, load in enumerate(data["loads"]):
        if load is not None and (not isinstance(load, list) or len(load) < 4
                                 or not all(_number(v) for v in load[:4])):
            return f"loads[{i}] is not a list of four numbers"
    for i, decision in enumerate(data["decisions"]):
        if not isinstance(decision, dict):
            return f"decisions[{i}] is not an object"
    return None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad_number(value: Any, path: str) -> str | None:
    """The first non-finite or negative number in a parsed document, named by its path."""
    if _number(value):
        if not math.isfinite(value):
            return f"{path or 'the document'} is not finite ({value!r})"
        if value < 0:
            return f"{path or 'the document'} is negative ({value!r})"
        return None
    children = (value.items() if isinstance(value, dict)
                else enumerate(value) if isinstance(value, list) else ())
    for key, child in children:
        name = (f"{path}.{key}" if path else key) if isinstance(key, str) else f"{path}[{key}]"
        found = _bad_number(child, name)
        if found is not None:
            return found
    return None
