"""spec.verification (#25 part 3): what admission refuses (field, cause, fix), what the CRD's own
schema and CEL rule refuse, what the sync hook hands each node copy (names, never material), and
the per-cache Secret grant that covers the trust Secret only while a copy needs it."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
from praesto.hooks.modelcache import sync

from praesto import names
from praesto.spec import InvalidSpec, parse_spec
from praesto.verification import verification_from_node_spec
from testkit.hook_objects import NOW, cache_node, mcn, modelcache, node_status, sync_request
from tests.hooks.golden import CONFIG
from tests.hooks.test_crds import _cel, _rules, _schema

KEY = {"secretRef": {"name": "publisher-key", "key": "key.pub"}}


def _spec(signature: Any, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"huggingface": {"repo": "org/signed"}},
        "storage": {"size": "1Gi"},
        "verification": {"signature": signature},
    }
    spec.update(extra)
    return spec


def test_each_method_parses_and_reaches_the_node_copy_as_names_only() -> None:
    key = parse_spec(_spec({"publicKey": KEY})).verification
    assert key is not None and key.method == "publicKey" and key.path == names.DEFAULT_SIGNATURE_FILE
    assert key.to_node_dict() == {
        "method": "publicKey",
        "path": "model.sig",
        "secretRef": {"name": "publisher-key", "key": "key.pub"},
    }
    cm = parse_spec(_spec({"publicKey": {"configMapRef": {"name": "keys", "key": "key.pub"}}})).verification
    assert cm is not None and cm.secret_ref is None and cm.config_map_ref is not None
    assert verification_from_node_spec(cm.to_node_dict()) == cm
    assert cm.to_node_dict()["configMapRef"] == {"name": "keys", "key": "key.pub"}
    cert = parse_spec(_spec({"certificate": KEY, "path": "sig/model.sig"})).verification
    assert cert is not None and cert.method == "certificate" and cert.path == "sig/model.sig"
    keyless = parse_spec(_spec({"sigstore": {"identity": "me@example.com", "oidcIssuer": "https://i"}}))
    assert keyless.verification is not None
    assert verification_from_node_spec(keyless.verification.to_node_dict()) == keyless.verification
    assert parse_spec(_spec({"publicKey": KEY})).verification == verification_from_node_spec(
        key.to_node_dict()
    )


@pytest.mark.parametrize(
    ("signature", "extra", "field", "cause"),
    [
        ({}, {}, "spec.verification.signature", "no trust method"),
        ({"publicKey": KEY, "certificate": KEY}, {}, "spec.verification.signature", "publicKey and certificate"),
        ({"publicKey": {"secretRef": {"name": "k"}}}, {}, "spec.verification.signature.publicKey.secretRef",
         "secretRef.name and secretRef.key"),
        ({"publicKey": {}}, {}, "spec.verification.signature.publicKey", "secretRef, configMapRef or clusterTrust"),
        ({"certificate": {**KEY, "configMapRef": {"name": "c", "key": "ca.pem"}}}, {},
         "spec.verification.signature.certificate", "exactly one of secretRef, configMapRef and clusterTrust"),
        ({"publicKey": {"configMapRef": {"name": "Bad_Name", "key": "k"}}}, {},
         "spec.verification.signature.publicKey.configMapRef.name", "not a valid ConfigMap name"),
        ({"publicKey": {"secretRef": {"name": "Bad_Name", "key": "k"}}}, {},
         "spec.verification.signature.publicKey.secretRef.name", "not a valid Secret name"),
        ({"publicKey": KEY, "path": "../model.sig"}, {}, "spec.verification.signature.path", "relative path"),
        ({"publicKey": KEY, "path": ".praesto-manifest.json"}, {}, "spec.verification.signature.path",
         "relative path"),
        ({"sigstore": {"identity": "me@example.com"}}, {}, "spec.verification.signature.sigstore", "oidcIssuer"),
    ],
)  # fmt: skip
def test_refusals_name_the_field_the_cause_and_the_fix(
    signature: Any, extra: dict[str, Any], field: str, cause: str
) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(_spec(signature, **extra))
    found = [e for e in info.value.errors if e.field == field]
    assert found and cause in found[0].cause, info.value.errors
    assert all(e.cause and e.fix for e in info.value.errors)


def test_crd_schema_and_cel_rule_refuse_the_same() -> None:
    schema = _schema(names.MODELCACHE_KIND)
    good = modelcache("signed", spec=_spec({"publicKey": KEY}))
    jsonschema.validate(good, schema)
    typo = copy.deepcopy(good)
    typo["spec"]["verification"]["signature"]["publicKey"] = {"secretRef": {"name": "k"}}  # no key
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(typo, schema)
    rules = dict(_rules(schema))
    one_method = rules[".spec.verification.signature"]
    assert _cel(one_method, {"publicKey": KEY})
    assert not _cel(one_method, {"publicKey": KEY, "certificate": KEY})
    assert not _cel(one_method, {"path": "model.sig"})
    one_ref = rules[".spec.verification.signature.publicKey"]
    assert _cel(one_ref, KEY) and _cel(one_ref, {"configMapRef": {"name": "k", "key": "k"}})
    assert not _cel(one_ref, {**KEY, "configMapRef": {"name": "k", "key": "k"}}) and not _cel(one_ref, {})
    node_schema = _schema(names.MODELCACHENODE_KIND)
    node_copy = mcn("signed", "node-a")
    node_copy["spec"]["verification"] = parse_spec(_spec({"publicKey": KEY})).verification.to_node_dict()  # type: ignore[union-attr]
    jsonschema.validate(node_copy, node_schema)


def _sync(spec: dict[str, Any], statuses: dict[str, str | None]) -> list[dict[str, Any]]:
    parent = modelcache("signed", spec=spec)
    copies = [mcn("signed", n, node_status(p) if p else None) for n, p in statuses.items()]
    request = sync_request(parent, nodes=[cache_node("node-a"), cache_node("node-b")], children=copies)
    children: list[dict[str, Any]] = sync(request, CONFIG, NOW)["children"]
    return children


def test_sync_gives_copies_the_verification_and_grants_the_trust_secret_while_needed() -> None:
    spec = _spec({"publicKey": KEY})
    spec["source"]["huggingface"]["token"] = {"secretRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    children = _sync(spec, {})
    copies = [c for c in children if c["kind"] == names.MODELCACHENODE_KIND]
    assert len(copies) == 2
    assert all(c["spec"]["verification"]["secretRef"] == KEY["secretRef"] for c in copies)
    role = next(c for c in children if c["kind"] == "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["hf-token", "publisher-key"],
         "verbs": ["get"]}
    ]  # fmt: skip
    # no token Secret: the trust Secret alone is granted, and only while a copy needs it
    alone = _sync(_spec({"certificate": KEY}), {"node-a": names.PHASE_READY, "node-b": names.PHASE_FAILED})
    role = next(c for c in alone if c["kind"] == "Role")
    assert role["rules"][0]["resourceNames"] == ["publisher-key"]
    settled = _sync(_spec({"certificate": KEY}), {"node-a": names.PHASE_READY, "node-b": names.PHASE_READY})
    reader = names.secret_reader_role_name("signed")
    assert not [
        c for c in settled if c["kind"] in ("Role", "RoleBinding") and c["metadata"]["name"] == reader
    ]
    # the trust material stays followed by the agents while any copy exists: a Secret by `get` alone
    # (re-read every few minutes; list or watch would need Metacontroller to list every Secret)
    watched = [c for c in settled if c["kind"] in ("Role", "RoleBinding")]
    assert {c["metadata"]["name"] for c in watched} == {names.trust_reader_role_name("signed")}
    role = next(c for c in watched if c["kind"] == "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["publisher-key"], "verbs": ["get"]}
    ]
    binding = next(c for c in watched if c["kind"] == "RoleBinding")
    assert binding["subjects"][0]["name"] == CONFIG.agent_service_account
    from_config_map = _sync(_spec({"publicKey": {"configMapRef": {"name": "keys", "key": "key.pub"}}}), {})
    role = next(c for c in from_config_map if c["kind"] == "Role" and c["metadata"]["name"] == reader)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["keys"], "verbs": ["get"]}
    ]
    # a ConfigMap is followed by a watch of it alone (fieldSelector metadata.name), noticed at once
    trust_reader = names.trust_reader_role_name("signed")
    role = next(c for c in from_config_map if c["kind"] == "Role" and c["metadata"]["name"] == trust_reader)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["keys"],
         "verbs": ["get", "list", "watch"]}
    ]  # fmt: skip
    keyless = _sync(_spec({"sigstore": {"identity": "me@example.com", "oidcIssuer": "https://i"}}), {})
    assert not [c for c in keyless if c["kind"] in ("Role", "RoleBinding")]


def _failed(reason: str) -> dict[str, Any]:
    message = f"{reason}: model.sig: the files do not match the signed manifest"
    ready = {"type": "Ready", "status": "False", "reason": reason, "message": message}
    return node_status(names.PHASE_FAILED, message=message, conditions=[ready])


def test_cache_fails_with_signature_invalid_when_every_copy_refused_the_signature() -> None:
    parent = modelcache("signed", spec=_spec({"publicKey": KEY}))
    nodes = [cache_node("node-a"), cache_node("node-b")]

    def ready_of(reasons: dict[str, str]) -> dict[str, Any]:
        copies = [mcn("signed", n, _failed(r)) for n, r in reasons.items()]
        status = sync(sync_request(parent, nodes=nodes, children=copies), CONFIG, NOW)["status"]
        assert status["phase"] == names.PHASE_FAILED
        return next(c for c in status["conditions"] if c["type"] == "Ready")

    refused = ready_of({"node-a": "SignatureInvalid", "node-b": "SignatureInvalid"})
    assert refused["reason"] == names.REASON_SIGNATURE_INVALID
    assert "node-a: SignatureInvalid: " in refused["message"] and "model.sig" in refused["message"]
    mixed = ready_of({"node-a": "SignatureInvalid", "node-b": "InsufficientDiskSpace"})
    assert mixed["reason"] == "NodeFailed"  # unchanged when the copies fail for different reasons


def test_pvc_mode_job_verifies_with_the_trust_material_mounted_as_a_file() -> None:
    """Shared PVC mode runs the same `praesto-agent download`: the trust Secret or ConfigMap is
    mounted (the kubelet reads it; no grant), the flags name the file, and SignatureInvalid (exit 4)
    fails the Job at once through its podFailurePolicy."""
    from praesto.hooks.pvc_job import TRUST_DIR, TRUST_FILE, download_job

    pvc = {"size": "1Gi", "storageClassName": "rwx"}
    spec = parse_spec(_spec({"publicKey": {"configMapRef": {"name": "keys", "key": "key.pub"}}}, storage=pvc))
    job = download_job(modelcache("shared", spec=_spec({}, storage=pvc)), spec, CONFIG)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert args[args.index("--signature-public-key") + 1] == TRUST_FILE
    assert args[args.index("--signature-path") + 1] == names.DEFAULT_SIGNATURE_FILE
    trust = next(v for v in pod["volumes"] if v["name"] == "trust")
    assert trust["configMap"] == {"name": "keys", "items": [{"key": "key.pub", "path": "trust.pem"}]}
    assert {"name": "trust", "mountPath": TRUST_DIR, "readOnly": True} in container["volumeMounts"]
    rules = [r["onExitCodes"]["values"] for r in job["spec"]["podFailurePolicy"]["rules"]]
    assert rules == [[names.DOWNLOAD_EXIT_TOO_LARGE], [names.DOWNLOAD_EXIT_SIGNATURE_INVALID]]
    certificate = parse_spec(_spec({"certificate": KEY}, storage=pvc))
    cert_job = download_job(modelcache("shared", spec=_spec({}, storage=pvc)), certificate, CONFIG)
    cert_pod = cert_job["spec"]["template"]["spec"]
    assert "--signature-certificate" in cert_pod["containers"][0]["args"]
    assert (
        next(v for v in cert_pod["volumes"] if v["name"] == "trust")["secret"]["secretName"]
        == "publisher-key"
    )
    unsigned = download_job(modelcache("shared", spec=_spec({}, storage=pvc)), parse_spec(
        {"source": {"huggingface": {"repo": "org/x"}}, "storage": pvc}), CONFIG)  # fmt: skip
    assert not any(
        a.startswith("--signature") for a in unsigned["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert len(unsigned["spec"]["podFailurePolicy"]["rules"]) == 1  # unchanged without verification


def test_pvc_mode_signature_refusal_fails_the_cache_with_signature_invalid() -> None:
    from praesto.hooks.pvc import _job_state

    job = {
        "status": {
            "conditions": [
                {"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
                 "message": "Container download for pod pvc/x failed with exit code 4 matching FailJob rule at index 0"}
            ]
        }
    }  # fmt: skip
    phase, reason, message = _job_state(job)
    assert (phase, reason) == (names.PHASE_FAILED, names.REASON_SIGNATURE_INVALID)
    assert "spec.verification" in message and "Pod log" in message
