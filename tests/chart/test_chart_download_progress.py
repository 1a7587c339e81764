"""The chart's download-progress policy names what the code uses, and Metacontroller may grant the Role.

The policy's behaviour is proven on the real API server (tests/cluster/test_download_progress.py);
here: the names it re-types in CEL are the code's own, and RBAC's escalation check cannot refuse
the per-cache Role (Metacontroller must hold every verb it grants).
"""

from __future__ import annotations

from praesto.hooks import pvc_progress

from praesto import jobprogress, names, rbac
from testkit.helm_chart import RELEASE, one, render_objects


def test_the_policy_names_the_codes_annotation_limit_and_labels() -> None:
    objects = render_objects()
    policy = one(objects, "ValidatingAdmissionPolicy", f"{RELEASE}-download-progress")
    text = str(policy["spec"])
    assert f"'{names.ANNOTATION_DOWNLOAD_PROGRESS}'" in text
    assert f"<= {jobprogress.MAX_CHARS}" in text
    assert f"'{names.LABEL_MANAGED_BY}'" in text and f"'{names.MANAGED_BY}'" in text
    assert f"'{pvc_progress.DEFAULT_SERVICE_ACCOUNT}'" in text
    binding = one(objects, "ValidatingAdmissionPolicyBinding", f"{RELEASE}-download-progress")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_metacontroller_holds_what_the_progress_role_grants() -> None:
    grant = rbac.DOWNLOADER_PROGRESS_GRANT
    held = {(p.group, p.resource): set(p.verbs) for p in rbac.METACONTROLLER if p.group == grant.group}
    assert set(grant.verbs) <= held[(grant.group, grant.resource)]
