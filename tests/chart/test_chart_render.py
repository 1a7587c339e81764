"""The chart, rendered by the real Helm engine for each supported value set, is valid Kubernetes.

Built-in kinds are validated strictly (unknown fields rejected) against the
Kubernetes 1.37 OpenAPI schemas; Metacontroller kinds against Metacontroller's
CRD schema (tests/chart/data); cert-manager kinds are checked in test_chart_tls.
(Over 400 lines: one test per rendered object kind, sharing the render fixtures.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest

from praesto import names
from testkit.helm_chart import (
    CHART_DIR,
    chart_with_metacontroller_standin,
    crd_documents,
    crd_schemas,
    find,
    one,
    render,
    render_objects,
)

K8S_VERSION = "1.37.0"
DATA = Path(__file__).parent / "data"
METACONTROLLER_SCHEMAS = crd_schemas(list(crd_documents(DATA)))

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "no-cert-manager": {"webhooks": {"certManager": {"enabled": False}, "pods": {"failurePolicy": "Ignore"}}},
    "metacontroller-disabled": {"metacontroller": {"enabled": False}},
    "custom-basepath-nodeselector": {
        "localCache": {"basePath": "/mnt/fast-ssd/praesto"},
        "nodeAgent": {
            "nodeSelector": {names.LABEL_CACHE_NODE: "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "csi": {"kubeletDir": "/var/lib/k0s/kubelet"},
    },
    "pvc-only": {"nodeAgent": {"enabled": False}},
    "pinned-tags": {
        "image": {"tag": "0.6.2"},
        "downloader": {"image": {"tag": "0.6.2"}},
        "csi": {"image": {"tag": "0.6.2"}},
        "nodeAgent": {"image": {"tag": "0.6.2"}},
    },
}


def validate_object(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in METACONTROLLER_SCHEMAS:
        jsonschema.validate(obj, METACONTROLLER_SCHEMAS[key])
        return
    if obj["apiVersion"].startswith("cert-manager.io/"):
        return  # no vendored schema: structure asserted in test_chart_tls
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_rendered_object_is_valid(value_set: str) -> None:
    objects = render_objects(VALUE_SETS[value_set])
    assert objects
    for obj in objects:
        validate_object(obj)
        assert obj["metadata"].get("namespace") in (None, "praesto-system")


def test_validation_is_strict_about_unknown_fields() -> None:
    """The validators above reject a typo, so passing means something."""
    deployment = one(render_objects(), "Deployment", "praesto-hooks")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    decorator = one(render_objects(), "DecoratorController")
    decorator["spec"]["hooks"]["sync"]["webhook"]["uri"] = "http://x"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(decorator)


def test_defaults_render_every_component() -> None:
    objects = render_objects()
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {
        ("Deployment", "praesto-hooks"),
        ("Service", "praesto-hooks"),
        ("PodDisruptionBudget", "praesto-hooks"),
        ("DaemonSet", "praesto-node-agent"),
        ("CSIDriver", names.CSI_DRIVER_NAME),
        ("MutatingWebhookConfiguration", "praesto-admission"),
        ("ValidatingWebhookConfiguration", "praesto-admission"),
        ("ServiceAccount", "praesto-hooks"),
        ("ServiceAccount", "praesto-node-agent"),
        ("DecoratorController", "praesto-node-readiness"),
    } <= kinds
    assert find(objects, "CompositeController")


def test_hooks_deployment_is_hardened_and_configured() -> None:
    deployment = one(
        render_objects({"downloader": {"hfEndpoint": "https://mirror.example"}}),
        "Deployment",
        "praesto-hooks",
    )
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    by_name = {c["name"]: c for c in pod["containers"]}
    assert set(by_name) == {"hooks"}  # the orphan releaser has its own: tests/chart/test_chart_orphans.py
    for container in by_name.values():
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    for container in [by_name["hooks"]]:
        assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        env = {e["name"]: e for e in container["env"]}
        assert env["PRAESTO_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert env["PRAESTO_AGENT_SERVICE_ACCOUNT"]["value"] == "praesto-node-agent"
        assert env["PRAESTO_DOWNLOADER_IMAGE"]["value"] == "ghcr.io/praesto/praesto:0.7.0"
        assert env["PRAESTO_IMAGE"]["value"] == "ghcr.io/praesto/praesto:0.7.0"
        assert env["PRAESTO_HF_ENDPOINT"]["value"] == "https://mirror.example"
    # One listener, TLS only: Metacontroller and the API server both verify it with the chart's CA.
    assert {"--bind=0.0.0.0:8443", "--certfile=/tls/tls.crt", "--keyfile=/tls/tls.key"} <= set(
        by_name["hooks"]["args"]
    )
    assert by_name["hooks"]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_hooks_arguments_are_accepted_by_praesto_hooks() -> None:
    """The flags the chart passes parse with the real praesto-hooks argument parser."""
    server = pytest.importorskip("praesto.hooks.serving.server")
    pod = one(render_objects(), "Deployment", "praesto-hooks")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "hooks"]
    assert container["command"] == ["praesto-hooks"]
    args = server.parse_args(container["args"])
    assert args.bind
    assert not args.release_orphaned_copies  # the praesto-orphans Deployment runs the releaser


def test_service_exposes_only_https() -> None:
    ports = one(render_objects(), "Service")["spec"]["ports"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in ports] == [("https", 443, "https")]


def test_network_policy_admits_metacontroller_and_the_api_server_addresses_only() -> None:
    """#21 item 14: no Pod but Metacontroller's and the release's node agents (the credentials broker,
    hooks/broker.py) is a peer; the API server and kubelet by address."""
    policy = one(render_objects(), "NetworkPolicy", "praesto-hooks")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}]
    metacontroller = {"app.kubernetes.io/name": "metacontroller", "app.kubernetes.io/instance": "praesto"}
    agents = {
        "app.kubernetes.io/name": "praesto",
        "app.kubernetes.io/instance": "praesto",
        "app.kubernetes.io/component": "node-agent",
    }
    assert rule["from"] == [
        {"podSelector": {"matchLabels": metacontroller}},  # the policy's namespace: the release's
        {"podSelector": {"matchLabels": agents}},
        {"ipBlock": {"cidr": "0.0.0.0/0"}},
        {"ipBlock": {"cidr": "::/0"}},
    ]
    without_agents = one(render_objects({"nodeAgent": {"enabled": False}}), "NetworkPolicy", "praesto-hooks")
    assert {"podSelector": {"matchLabels": agents}} not in without_agents["spec"]["ingress"][0]["from"]
    values = {
        "hooks": {
            "networkPolicy": {
                "podCIDRs": ["10.244.0.0/16", "fd00:10::/56"],
                "apiServerCIDRs": ["0.0.0.0/0", "::/0", "172.18.0.0/24"],
                "metacontroller": [{"namespaceSelector": {"matchLabels": {"team": "platform"}}}],
                "from": [{"podSelector": {"matchLabels": {"app": "prometheus"}}}],
            }
        }
    }
    closed = one(render_objects(values), "NetworkPolicy", "praesto-hooks")["spec"]["ingress"][0]["from"]
    assert closed == [
        {"namespaceSelector": {"matchLabels": {"team": "platform"}}},
        {"podSelector": {"matchLabels": agents}},
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fd00:10::/56"]}},
        {"ipBlock": {"cidr": "172.18.0.0/24"}},  # a narrow CIDR needs no except (it must contain it)
        {"podSelector": {"matchLabels": {"app": "prometheus"}}},
    ]
    external = one(render_objects({"metacontroller": {"enabled": False}}), "NetworkPolicy", "praesto-hooks")
    assert external["spec"]["ingress"][0]["from"][0] == {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "metacontroller"}},
    }


def test_hooks_request_limits_reach_the_server() -> None:
    limits = {"maxRequestBytes": 33554432, "requestTimeoutSeconds": 5, "maxConnectionsPerClient": 40,
              "minBodyBytesPerSecond": 1048576}  # fmt: skip
    args = one(render_objects({"hooks": limits}), "Deployment",
               "praesto-hooks")["spec"]["template"]["spec"]["containers"][0]["args"]  # fmt: skip
    assert "--max-request-bytes=33554432" in args and "--request-timeout=5" in args
    assert "--max-connections-per-client=40" in args and "--min-body-rate=1048576" in args
    default_args = set(one(render_objects({}), "Deployment", "praesto-hooks")["spec"]["template"]["spec"]
                       ["containers"][0]["args"])  # fmt: skip
    assert {"--max-connections-per-client=100", "--min-body-rate=4194304"} <= default_args
    with pytest.raises(Exception, match="maxRequestBytes"):
        render({"hooks": {"maxRequestBytes": 1000}})  # under 1 MiB: admission reviews would not fit
    with pytest.raises(Exception, match="maxConnectionsPerClient"):
        render({"hooks": {"maxConnectionsPerClient": 1001}})  # over a quarter of a worker's connections


def test_webhook_configurations() -> None:
    objects = render_objects(
        {
            "webhooks": {
                "pods": {"failurePolicy": "Ignore"},
                "modelCaches": {"failurePolicy": "Ignore"},
                "timeoutSeconds": 3,
            }
        }
    )
    mutating = one(objects, "MutatingWebhookConfiguration")["webhooks"]
    validating = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert len(mutating) == len(validating) == 1
    pod_hook, mc_hook = mutating[0], validating[0]
    assert pod_hook["namespaceSelector"] == {"matchLabels": {names.LABEL_INJECTION: names.INJECTION_ENABLED}}
    # Only Pods carrying one of our annotations are sent (the real API server evaluates it: tests/cluster).
    expression = pod_hook["matchConditions"][0]["expression"]
    for annotation in (names.ANNOTATION_MODEL_MOUNTS, names.ANNOTATION_LEGACY_MODEL_CACHE):
        assert f"'{annotation}' in object.metadata.annotations" in expression
    assert pod_hook["clientConfig"]["service"]["path"] == "/admission/mutate-pod"
    assert mc_hook["clientConfig"]["service"]["path"] == "/admission/validate-modelcache"
    assert mc_hook["rules"][0]["apiGroups"] == [names.GROUP]
    assert mc_hook["rules"][0]["resources"] == [names.MODELCACHE_PLURAL]
    for hook in (pod_hook, mc_hook):
        assert hook["failurePolicy"] == "Ignore"
        assert hook["timeoutSeconds"] == 3
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["clientConfig"]["service"] == {
            **hook["clientConfig"]["service"],
            "name": "praesto-hooks",
            "namespace": "praesto-system",
            "port": 443,
        }
    defaults = render_objects()
    assert one(defaults, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Fail"


def test_each_webhook_has_its_own_failure_policy() -> None:
    """Issue 21 item 16: an Ignore for the Pod webhook no longer makes the ModelCache validator fail open."""
    objects = render_objects({"webhooks": {"pods": {"failurePolicy": "Ignore"}}})
    assert one(objects, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"
    assert one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Fail"
    with pytest.raises(helm.HelmError) as err:
        render({"webhooks": {"failurePolicy": "Ignore"}})
    assert "set webhooks.pods.failurePolicy and webhooks.modelCaches.failurePolicy instead" in str(err.value)


def test_csi_driver_object() -> None:
    driver = one(render_objects(), "CSIDriver")
    assert driver["spec"] == {
        "attachRequired": False,
        "podInfoOnMount": True,
        "volumeLifecycleModes": ["Ephemeral"],
        "fsGroupPolicy": "None",
        "requiresRepublish": False,
        "storageCapacity": False,
    }


def test_pvc_only_install_has_no_node_components() -> None:
    objects = render_objects({"nodeAgent": {"enabled": False}})
    assert not find(objects, "DaemonSet")
    assert not find(objects, "CSIDriver")
    assert not find(objects, "ClusterRole", "praesto-node-agent")
    assert find(objects, "ServiceAccount", "praesto-node-agent")  # Job/secret grants bind to it
    assert find(objects, "Deployment", "praesto-hooks")


def test_image_tags_follow_values() -> None:
    objects = render_objects(
        VALUE_SETS["pinned-tags"] | {"image": {"tag": "0.6.2", "repository": "reg.example/p"}}
    )
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    images = {c["name"]: c["image"] for c in pod["containers"]}
    assert images["agent"] == images["csi"] == "reg.example/p:0.6.2"
    assert images["livenessprobe"].startswith("registry.k8s.io/sig-storage/livenessprobe:v")
    env = {
        e["name"]: e.get("value")
        for e in one(objects, "Deployment", "praesto-hooks")["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert env["PRAESTO_DOWNLOADER_IMAGE"] == "reg.example/p:0.6.2"
    split = render_objects({"downloader": {"image": {"repository": "d.example/dl", "tag": "9"}}})
    env = {
        e["name"]: e.get("value")
        for e in one(split, "Deployment", "praesto-hooks")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["PRAESTO_DOWNLOADER_IMAGE"] == "d.example/dl:9"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"localCache": {"basepath": "/x"}}, "additional properties 'basepath' not allowed"),
        ({"webhooks": {"pods": {"failurePolicy": "Sometimes"}}}, "/webhooks/pods/failurePolicy"),
        ({"nodeAgent": {"concurrency": "8"}}, "/nodeAgent/concurrency': got string, want integer"),
        ({"webhooks": {"certManager": {"enabled": "yes"}}}, "/webhooks/certManager/enabled"),
        ({"localCache": {"basePath": "relative/path"}}, "/localCache/basePath"),
        ({"nodeAgent": {"nodeSelector": {"a": 1}}}, "/nodeAgent/nodeSelector/a"),
        ({"imagePulSecrets": []}, "additional properties 'imagePulSecrets' not allowed"),
    ],
)
def test_values_schema_rejects_typos_and_bad_types(values: dict[str, Any], expected: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert expected in str(err.value)


def test_values_schema_accepts_the_documented_defaults() -> None:
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(chart.values)


def test_helm_lint_is_clean(tmp_path: Path) -> None:
    """`helm lint --strict` (via the SDK) on the chart with the dependency present (test stand-in)."""
    chart = chart_with_metacontroller_standin(tmp_path)
    for values in VALUE_SETS.values():
        report = helm.lint(chart, values, strict=True, namespace="praesto-system", kube_version="v1.33.0")
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert problems == [], problems


def test_lint_reports_the_missing_dependency_without_it() -> None:
    """Without `helm dependency build`, lint says exactly that (and nothing else)."""
    report = helm.lint(CHART_DIR, {}, strict=True, namespace="praesto-system")
    errors = [m["error"] for m in report["messages"] if m["severity"] >= 2]
    assert errors and all("metacontroller" in e for e in errors), errors


def test_notes_tell_the_user_what_to_do_next() -> None:
    notes = render()["praesto/templates/NOTES.txt"]
    for step in (
        "kubectl label namespace <namespace> praesto.io/model-cache-injection=enabled",
        "kind: ModelCache",
        "kubectl get mc",
        "praesto.io/model-mounts",
        "kubectl apply --server-side --force-conflicts -f charts/praesto/crds/",  # run by test_crd_upgrade
        "mkdir -p /var/praesto",
    ):
        assert step in notes
    pvc_notes = render({"nodeAgent": {"enabled": False}})["praesto/templates/NOTES.txt"]
    assert "shared-PVC" in pvc_notes


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """What the kubelet does with $(VAR) references in container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def test_node_daemonset_arguments_are_accepted_by_agent_and_csi() -> None:
    """The DaemonSet's commands parse with the real praesto-agent / praesto-csi parsers."""
    agent_cli = pytest.importorskip("praesto.agent.cli")
    agent_settings = pytest.importorskip("praesto.agent.settings")
    csi_cli = pytest.importorskip("praesto.csi.cli")
    values = {"localCache": {"basePath": "/mnt/ssd/praesto"}, "nodeAgent": {"reserve": "50Gi"}}
    pod = one(render_objects(values), "DaemonSet")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    env = {"NODE_NAME": "worker-1", "POD_IP": "10.0.0.7", "POD_NAME": "agent-x", "POD_UID": "u-1"}

    agent = containers["agent"]
    assert agent["command"] == ["praesto-agent"]
    args = agent_cli.build_parser(True, {}).parse_args(_expand(agent["args"], env))
    assert agent_settings.check_arguments(args, {}) is None
    assert (args.command, args.node_name, args.base_path, args.reserve) == (
        "run",
        "worker-1",
        "/mnt/ssd/praesto",
        "50Gi",
    )
    agent_env = {e["name"]: e for e in agent["env"]}
    assert agent_env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"

    csi = containers["csi"]
    assert csi["command"] == ["praesto-csi"]
    csi_args = csi_cli.build_parser({}).parse_args(_expand(csi["args"], env))
    assert (csi_args.endpoint, csi_args.node_name, str(csi_args.base_path)) == (
        "unix:///csi/csi.sock",
        "worker-1",
        "/mnt/ssd/praesto",
    )


def test_node_daemonset_mounts_and_privileges() -> None:
    values = VALUE_SETS["custom-basepath-nodeselector"]
    pod = one(render_objects(values), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {names.LABEL_CACHE_NODE: "true"}
    # the admin's tolerations, plus the startup taint the agent itself lifts (agent/startup_taint.py)
    startup = {"key": names.DEFAULT_STARTUP_TAINT_KEY, "operator": "Exists"}
    assert pod["tolerations"] == [*values["nodeAgent"]["tolerations"], startup]
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    assert f"--startup-taint-key={names.DEFAULT_STARTUP_TAINT_KEY}" in agent["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["store"]["hostPath"] == {"path": "/mnt/fast-ssd/praesto", "type": "Directory"}
    assert volumes["kubelet-dir"]["hostPath"]["path"] == "/var/lib/k0s/kubelet"
    containers = {c["name"]: c for c in pod["containers"]}
    # no node-driver-registrar: praesto-csi registers itself (csi/registration.py)
    assert set(containers) == {"agent", "csi", "livenessprobe"}
    for name, container in containers.items():
        privileged = container["securityContext"].get("privileged", False)
        assert privileged == (name == "csi"), name
        mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
        bidirectional = [m for m in mounts.values() if m.get("mountPropagation") == "Bidirectional"]
        assert bidirectional == ([mounts["kubelet-dir"]] if name == "csi" else []), name
        if name in ("agent", "csi"):
            assert mounts["store"]["mountPath"] == "/mnt/fast-ssd/praesto"  # same path as on the host
    agent_sc = containers["agent"]["securityContext"]
    assert agent_sc["runAsNonRoot"] is True and agent_sc["capabilities"]["drop"] == ["ALL"]
    csi = containers["csi"]
    csi_mounts = {m["name"]: m["mountPath"] for m in csi["volumeMounts"]}
    assert volumes["registration-dir"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/plugins_registry"
    assert volumes["plugin-dir"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/plugins/csi.praesto.io"
    # the plugin serves /csi/csi.sock, which the kubelet sees at <kubeletDir>/plugins/csi.praesto.io/csi.sock
    assert {
        "--endpoint=unix://" + csi_mounts["plugin-dir"] + "/csi.sock",
        "--registration-dir=" + csi_mounts["registration-dir"],
        "--kubelet-endpoint=/var/lib/k0s/kubelet/plugins/csi.praesto.io/csi.sock",
    } <= set(csi["args"])
    # the registration socket is served outside the Bidirectional kubelet-dir mount
    assert not csi_mounts["registration-dir"].startswith(csi_mounts["kubelet-dir"])
