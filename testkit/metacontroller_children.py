"""Metacontroller 4.17.2's writes to children (`pkg/controller/common/manage_children.go`, dynamic-apply).

Observed children not desired are deleted (background propagation, uid
precondition); desired ones are created with the last-applied annotation and a
controller ownerReference with blockOwnerDeletion, or updated by the 3-way
merge per the child's update strategy (OnDelete never, Recreate deletes and a
later pass creates, InPlace updates). Conflicts, AlreadyExists and NotFound are
swallowed: the cache was behind, and the event that proves it brings another
pass. Adoption and release rewrite ownerReferences atomically
(`pkg/dynamic/controllerref/unstructured.go`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from testkit.kube_apply import Kube
from testkit.metacontroller_apply import LAST_APPLIED, apply_update, encode
from testkit.metacontroller_base import Obj, Pass, atomic_update, group_key, meta, object_key

CONTROLLER_UID = "controller-uid"


def controller_ref_to(parent: Obj) -> Obj:
    """`MakeControllerRef`."""
    return {
        "apiVersion": parent["apiVersion"],
        "kind": parent["kind"],
        "name": meta(parent)["name"],
        "uid": meta(parent)["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


class ChildWriter:
    """The child writes of one controller, with its update strategies (`(group, plural) -> method`)."""

    def __init__(self, kube: Kube, strategies: dict[tuple[str, str], str]) -> None:
        self.kube, self.strategies = kube, strategies

    def set_owner(self, child: Obj, parent: Obj, *, own: bool, record: Pass) -> bool:
        """Adopt (add our controller ref) or release (drop refs to the parent's uid), atomically."""
        uid = meta(parent)["uid"]

        def change(live: Obj) -> bool:
            refs = [r for r in meta(live).get("ownerReferences") or [] if r.get("uid") != uid]
            meta(live)["ownerReferences"] = [*refs, controller_ref_to(parent)] if own else refs
            return True

        resource = self.kube.resource(child["apiVersion"], child["kind"])
        done = atomic_update(resource, child, change) is not None
        if done:
            record.writes.append(f"{'adopt' if own else 'release'} {child['kind']} {object_key(child)}")
        return done

    def manage(
        self, parent: Obj, observed: dict[str, dict[str, Obj]], desired: list[Obj], record: Pass
    ) -> list[str]:
        """`common.ManageChildren`: delete the undesired, then create or update the desired; errors collected."""
        wanted: dict[str, dict[str, Obj]] = {}
        for child in desired:
            wanted.setdefault(group_key(child), {})[object_key(child)] = child
        errors: list[str] = []
        for group, objects in observed.items():
            for key, obj in objects.items():
                if not meta(obj).get("deletionTimestamp") and key not in wanted.get(group, {}):
                    self._attempt(errors, lambda obj=obj: self._delete(obj, record))  # type: ignore[misc]
        for group, objects in wanted.items():
            for key, child in objects.items():
                current = observed.get(group, {}).get(key)
                if current is None:
                    self._attempt(errors, lambda child=child: self._create(parent, child, record))  # type: ignore[misc]
                else:
                    self._attempt(errors, lambda c=current, d=child: self._update(c, d, record))  # type: ignore[misc]
        return errors

    @staticmethod
    def _attempt(errors: list[str], write: Callable[[], None]) -> None:
        try:
            write()
        except Exception as error:  # keep going: a failed delete must not block a create
            errors.append(f"{type(error).__name__}: {str(error)[:300]}")

    def _delete(self, obj: Obj, record: Pass) -> None:
        resource = self.kube.resource(obj["apiVersion"], obj["kind"])
        body = {"propagationPolicy": "Background", "preconditions": {"uid": meta(obj)["uid"]}}
        try:
            resource.delete(name=meta(obj)["name"], namespace=meta(obj).get("namespace"), body=body)
        except NotFoundError:
            return
        record.writes.append(f"delete {obj['kind']} {object_key(obj)}")

    def _create(self, parent: Obj, child: Obj, record: Pass) -> None:
        body = copy.deepcopy(child)
        body["metadata"].setdefault("annotations", {})[LAST_APPLIED] = encode(child)
        refs = body["metadata"].get("ownerReferences") or []
        if not any(r.get("uid") == meta(parent)["uid"] for r in refs):
            body["metadata"]["ownerReferences"] = [*refs, controller_ref_to(parent)]
        try:
            self.kube.create(body)
        except ConflictError:  # AlreadyExists: the cache had not seen it yet
            return
        record.writes.append(f"create {child['kind']} {object_key(child)}")

    def _update(self, observed: Obj, desired: Obj, record: Pass) -> None:
        merged = apply_update(observed, desired)
        if merged == observed or meta(observed).get("deletionTimestamp"):
            return
        group = observed["apiVersion"].rpartition("/")[0]
        resource = self.kube.resource(observed["apiVersion"], observed["kind"])
        method = self.strategies.get((group, resource.name), "OnDelete")
        if method in ("OnDelete", ""):
            return
        if method in ("Recreate", "RollingRecreate"):
            self._delete(observed, record)  # created again by a later pass
            return
        try:
            resource.replace(body=merged, namespace=meta(observed).get("namespace"))
        except (NotFoundError, ConflictError):
            return  # changed since the cache saw it: its event brings another pass
        record.writes.append(f"update {observed['kind']} {object_key(observed)}")
