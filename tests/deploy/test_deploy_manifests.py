"""deploy/k8s as written: every kustomization's references exist, the rendered GPU overlay is a valid
Deployment, the optional ServiceMonitor stays out of the base, the HPA's metric is the one the adapter serves
and the server exports, and the grace period covers the drain. (`make check-deploy` validates the plain
resource files, the Dockerfile and the compose file.)"""

from __future__ import annotations

import copy
from dataclasses import fields
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from pcgtts.server.metrics import PREFIX
from pcgtts.server.settings import ServerSettings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.29.0"  # the oldest minor still commonly supported by managed clusters


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def json_patch(doc: dict, ops: list[dict]) -> dict:
    """The add/replace subset of RFC 6902 that the overlays use (kustomize applies the full one)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            if op["op"] == "add" and last == "-":
                node.append(op["value"])
            else:
                node[int(last)] = op["value"]
        else:
            assert op["op"] == "add" or last in node, op
            node[last] = op["value"]
    return doc


def render(kustomization: Path) -> list[dict]:
    """Resources of a kustomization: its files, its bases and components, its patches and images."""
    spec = load(kustomization)
    docs: list[dict] = []
    for ref in spec.get("resources", []) + spec.get("components", []):
        target = (kustomization.parent / ref).resolve()
        docs += render(target / "kustomization.yaml") if target.is_dir() else [load(target)]
    for patch in spec.get("patches", []):
        for doc in docs:
            if doc["kind"] == patch["target"]["kind"] and doc["metadata"]["name"] == patch["target"]["name"]:
                docs[docs.index(doc)] = json_patch(doc, yaml.safe_load(patch["patch"]))
    for image in spec.get("images", []):
        for doc in docs:
            for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if container["image"].split(":")[0] in (image["name"], image.get("newName")):
                    container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return docs


@pytest.mark.parametrize("kustomization", kustomizations(), ids=lambda p: str(p.parent.relative_to(K8S)))
def test_every_kustomization_renders_to_valid_resources(kustomization):
    spec = load(kustomization)
    for ref in spec.get("resources", []) + spec.get("components", []):
        assert (kustomization.parent / ref).exists(), ref
    for doc in render(kustomization):
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # a CRD: the Prometheus Operator's schema is not bundled
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def kinds(kustomization: Path) -> list[str]:
    return [d["kind"] for d in render(kustomization)]


def deployment(kustomization: Path) -> dict:
    return next(d for d in render(kustomization) if d["kind"] == "Deployment")


def test_servicemonitor_is_optional_and_the_gpu_overlay_asks_for_a_gpu():
    assert "ServiceMonitor" not in kinds(K8S / "kustomization.yaml")
    assert "ServiceMonitor" in kinds(K8S / "overlays" / "monitored" / "kustomization.yaml")
    assert load(K8S / "components" / "servicemonitor" / "kustomization.yaml")["kind"] == "Component"
    pod = deployment(K8S / "overlays" / "gpu" / "kustomization.yaml")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "PCGTTS_DEVICE", "value": "cuda"} in container["env"]
    assert pod["nodeSelector"] and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert container["image"].endswith("-vllm-cuda")
    # served through vLLM, from the read-only models volume, by settings the server knows
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PCGTTS_ENGINE"] == "vllm" and "engine" in {f.name for f in fields(ServerSettings)}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
    assert mount["readOnly"] and all(env[k].startswith(mount["mountPath"] + "/")
                                     for k in ("PCGTTS_MODEL", "PCGTTS_CODEC", "PCGTTS_DRAFT"))
    claim = next(v for v in pod["volumes"] if v["name"] == "models")["persistentVolumeClaim"]["claimName"]
    assert claim in {d["metadata"]["name"] for d in render(K8S / "overlays" / "gpu" / "kustomization.yaml")
                     if d["kind"] == "PersistentVolumeClaim"}


def test_hpa_scales_on_the_metric_the_adapter_serves_and_the_server_exports():
    hpa = load(K8S / "hpa.yaml")
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    rule = load(K8S / "prometheus-adapter" / "values.yaml")["rules"]["custom"][0]
    assert rule["name"]["as"] == metric
    assert rule["seriesQuery"].startswith(PREFIX + "num_requests_waiting{")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment(K8S / "kustomization.yaml")["metadata"]["name"]


def test_voices_volume_is_shared_and_the_grace_period_covers_the_drain():
    assert load(K8S / "pvc.yaml")["spec"]["accessModes"] == ["ReadWriteMany"]
    pod = deployment(K8S / "kustomization.yaml")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["PCGTTS_SHARED_VOICES"] == "1"
    drain = float(env["PCGTTS_DRAIN_TIMEOUT_S"])
    assert drain == ServerSettings().drain_timeout_s
    pre_stop = int(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + 5
