"""Validating ModelCache webhook: what the CRD schema cannot say.

Spec rules come from the shared `praesto.spec.parse_spec`, so the webhook, the
sync hook and `praesto render` refuse exactly the same things. This module
adds what needs the cluster (the StorageClass exists), the old object (spec
immutable) and advice given as AdmissionReview warnings. Whether the author may
read the Secrets and ConfigMaps a cache names is checked by the API server itself
(the chart's ValidatingAdmissionPolicy `*-modelcache-secret-access`, with the CEL
authorizer), at create and at every update that changes what is fetched (a rolling
update here: issue 37 item 1), which no webhook outage or failurePolicy can skip:
the webhook never answers "may user X read Secret Y".

`disclose=False` (the caller is not verified as the API server: chart default,
no webhooks.clientAuth): a forged review can name any namespace, so the answer
depends on nothing that namespace holds (#21 item 15). The quota is then not
checked here (the refusal, even without numbers, would let a caller bisect
another namespace's free bytes): the sync hook enforces it, and the cache's
`QuotaExceeded` condition tells the namespace's own users. The nodeSelector
advice, which reads Node labels, is left out too.
"""

from __future__ import annotations

from typing import Any

from praesto.hooks.common import section
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import image_not_allowed

from praesto import names
from praesto.kinds import KINDS
from praesto.quota import Quotas
from praesto.spec import InvalidSpec, ModelCacheSpec, parse_spec, source_of

from . import quota, review
from .lookup import Lookups, LookupUnavailable
from .review import BAD_REQUEST, FORBIDDEN, UNAVAILABLE, Refusal

MAX_LISTED_ERRORS = 10


def changed_fields(old: Any, new: Any, path: str = "spec") -> list[str]:
    """Dotted paths that differ between two specs, deepest object level first found."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out.extend(changed_fields(old.get(key), new.get(key), f"{path}.{key}"))
        return out
    return [] if old == new else [path]


# What may change after create (issue #25 part 1): the revision of a source that has revisions
# (a rolling update in local mode) and the policy that rolls it. Everything else stays as created.
MUTABLE_FIELDS = (
    *(f"spec.source.{k.form}.{k.form_revision}" for k in KINDS if k.form_revision),
    "spec.updateStrategy",
)
# Where else a version is written: `uri: hf://org/name:rev` (ms:// too), `oci://host/repo:tag` or an object
# store's `s3://bucket/prefix`, and `oci.reference`'s tag or digest. These may change only when
# nothing but the version does (Source.rolls_to: same repository or bucket).
REVISION_CARRIERS = (
    "spec.source.uri",
    *(f"spec.source.{k.form}.{k.form_reference}" for k in KINDS if k.form_reference),
)
IMMUTABLE_CAUSE = (
    "field is immutable: a ModelCache's spec cannot change after creation, but for the source's "
    "revision (source.huggingface.revision, source.modelscope.revision, the :revision of an hf:// or "
    "ms:// uri, the tag or digest of an "
    "OCI reference, the prefix of an object-store uri within its bucket: a rolling update) and "
    "spec.updateStrategy"
)


def immutable_changes(old_spec: Any, spec: Any) -> list[str]:
    """The changed paths no rolling update allows (`spec.updateStrategy.switch` is within one)."""
    changed = [
        path
        for path in changed_fields(old_spec, spec)
        if not any(path == f or path.startswith(f + ".") for f in MUTABLE_FIELDS)
    ]
    if any(path in REVISION_CARRIERS for path in changed) and _only_the_revision_moved(old_spec, spec):
        changed = [path for path in changed if path not in REVISION_CARRIERS]
    return changed


def _only_the_revision_moved(old_spec: Any, spec: Any) -> bool:
    old = source_of(section(old_spec, "source"))
    new = source_of(section(spec, "source"))
    return old is not None and new is not None and old.rolls_to(new)


def _check_update(old_spec: Any, spec: Any, namespace: str, config: HooksConfig | None) -> None:
    """An UPDATE changes only what may change, into a spec that is still valid."""
    changed = immutable_changes(old_spec, spec)
    if changed:
        raise Refusal(
            ", ".join(changed[:MAX_LISTED_ERRORS]),
            IMMUTABLE_CAUSE,
            "delete the ModelCache and create it again (or create one under a new name)",
            BAD_REQUEST,
        )
    if not changed_fields(old_spec, spec):
        return  # metadata-only change: never block finalizers or labels
    parsed = _parse(spec, namespace, config)
    moved = changed_fields(section(old_spec, "source"), section(spec, "source"), "spec.source")
    if parsed.storage_class_name and moved:
        raise Refusal(
            moved[0],
            "a shared PVC (storage.storageClassName set) holds one revision; rolling updates are for local mode",
            "create another ModelCache for the new revision",
            BAD_REQUEST,
        )


def _check_name(obj: dict[str, Any]) -> None:
    meta = section(obj, "metadata")
    name = meta.get("name")
    if isinstance(name, str) and name and not names.is_dns_label(name):
        raise Refusal(
            "metadata.name",
            f"{name[:80]!r} is not a DNS label (it becomes a directory name and a label value)",
            "use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        )


def _parse(spec: Any, namespace: str = "", config: HooksConfig | None = None) -> ModelCacheSpec:
    """The typed spec, within the platform's signing policy (praesto/trustpolicy.py) when given."""
    try:
        parsed = parse_spec(spec)
        policy = (config or HooksConfig()).trust_policy.errors(namespace, parsed.verification)
        if policy:
            raise InvalidSpec(policy)
        return parsed
    except InvalidSpec as invalid:
        shown = "; ".join(str(e) for e in invalid.errors[:MAX_LISTED_ERRORS])
        more = len(invalid.errors) - MAX_LISTED_ERRORS
        raise Refusal(
            "spec",
            f"invalid ModelCache: {shown}" + (f"; and {more} more" if more > 0 else ""),
            "correct the fields listed",
            BAD_REQUEST,
        ) from None


def _check_storage_class(parsed: ModelCacheSpec, lookups: Lookups) -> None:
    name = parsed.storage_class_name
    if not name:
        return
    try:
        exists = lookups.storageclass_exists(name)
    except LookupUnavailable as error:
        raise Refusal(
            "spec.storage.storageClassName",
            f"Praesto could not read StorageClass {name} from the Kubernetes API: {error}",
            "retry, or check the praesto-hooks logs",
            UNAVAILABLE,
        ) from None
    if not exists:
        raise Refusal(
            "spec.storage.storageClassName",
            f"StorageClass {name!r} does not exist",
            "name a ReadWriteMany StorageClass (kubectl get storageclass), or leave it empty for local mode",
            FORBIDDEN,
        )


def _check_downloader_image(parsed: ModelCacheSpec, config: HooksConfig) -> None:
    problem = image_not_allowed(parsed, config)
    if problem:
        cause, _, fix = problem.partition("; ")
        raise Refusal("spec.downloader.image", cause, fix, FORBIDDEN)


def _reveals_placement(selector: dict[str, str]) -> bool:
    """A selector on Praesto's ready labels would say where other namespaces' caches are Ready."""
    return any(key.startswith(names.READY_LABEL_PREFIX) for key in selector)


def advice(parsed: ModelCacheSpec, lookups: Lookups, disclose: bool = True) -> list[str]:
    """Non-fatal warnings: things that work but are likely not what the user meant."""
    warnings = []
    unpinned = parsed.source.kind.unpinned_advice  # a moving name of a kind that pins (praesto/kinds.py)
    if unpinned and not parsed.source.pinned:
        warnings.append(unpinned.format(revision=parsed.source.revision))
    if parsed.storage_class_name:
        if parsed.node_selector:
            warnings.append("spec.nodeSelector is ignored in shared PVC mode (storageClassName is set)")
    else:
        if parsed.downloader:
            warnings.append("spec.downloader is ignored in local mode; it configures the shared PVC mode Job")
        if parsed.node_selector and disclose and not _reveals_placement(parsed.node_selector):
            try:
                matching = lookups.count_nodes_matching(parsed.node_selector)
            except LookupUnavailable:
                matching = -1  # advice only: never refuse for it
            if matching == 0:
                shown = ",".join(f"{k}={v}" for k, v in sorted(parsed.node_selector.items()))
                warnings.append(
                    f"spec.nodeSelector {shown} matches no nodes right now; nothing is downloaded "
                    "until a node has these labels (or a consuming Pod is scheduled)"
                )
    return warnings


def validate(
    request: review.Request,
    lookups: Lookups,
    config: HooksConfig | None = None,
    quotas: Quotas | None = None,
    disclose: bool = True,
) -> dict[str, Any]:
    """AdmissionReview response for a ModelCache CREATE or UPDATE; `disclose`: see the module docstring."""
    if request.operation not in ("CREATE", "UPDATE"):
        return review.allow(request.uid)
    obj = request.obj
    spec = obj.get("spec")
    try:
        if request.operation == "UPDATE":
            _check_update((request.old or {}).get("spec"), spec, request.namespace, config)
            return review.allow(request.uid)
        _check_name(obj)
        parsed = _parse(spec, request.namespace, config)
        _check_storage_class(parsed, lookups)
        if parsed.storage_class_name:  # local mode ignores spec.downloader (a warning says so)
            _check_downloader_image(parsed, config or HooksConfig())
        if disclose:
            quota.check(
                request.namespace,
                str(section(obj, "metadata").get("name") or ""),
                parsed,
                lookups,
                quotas if quotas is not None else (config or HooksConfig()).quotas,
            )
    except Refusal as refusal:
        return review.deny(request.uid, refusal)
    return review.allow(request.uid, advice(parsed, lookups, disclose))
