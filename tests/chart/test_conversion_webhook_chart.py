"""The chart's conversion webhook: the Service, the certificate helm generates (or the one
given), the Deployment serving it, and the CRD pointed at it and trusting its CA."""

from __future__ import annotations

import argparse
import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helm import CHART, KUBE_VERSION, Helm, HelmError, Obj  # tests/chart is on sys.path
from glm_operator.api.crdgen import (
    GLMSERVICE_V1ALPHA1_COLUMNS,
    ConversionWebhook,
    Kind,
    Version,
    crd,
)
from glm_operator.api.glmservice import GLMService, GLMServiceSpec
from glm_operator.api.glmservice_status import GLMServiceStatus
from glm_operator.api.modelversion import ModelVersionSpec
from glm_operator.controllers.cli import add_arguments
from glm_operator.generate import GENERATED_NOTE, crd_filename

CA_PEM = """-----BEGIN CERTIFICATE-----
MIIBszCCAVmgAwIBAgIUTest
-----END CERTIFICATE-----
"""


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, [(o["kind"], o["metadata"]["name"]) for o in objs]
    return found[0]


def operator_container(objs: list[Obj]) -> Obj:
    container: Obj = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.fixture(scope="module")
def webhook_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart with a GLMService CRD served at two versions through the webhook, as
    v1alpha2 makes it (the committed one may still have one version)."""
    chart = tmp_path_factory.mktemp("chart") / "glm-operator"
    shutil.copytree(CHART, chart)
    kind = Kind(kind="GLMService", plural="glmservices", short_names=("glms",), model=GLMService,
                scale=True, conversion=ConversionWebhook(), versions=(
                    Version("v1alpha1", GLMServiceSpec, GLMServiceStatus,
                            GLMSERVICE_V1ALPHA1_COLUMNS),
                    Version("v1alpha2", ModelVersionSpec, GLMServiceStatus,
                            GLMSERVICE_V1ALPHA1_COLUMNS, storage=True)))
    text = GENERATED_NOTE + yaml.safe_dump(crd(kind), sort_keys=False, width=100,
                                           allow_unicode=True)
    (chart / "files" / "crds" / crd_filename("glmservices")).write_text(text)
    return chart


def render(helm: Helm, chart: Path, values: dict[str, Any] | None = None,
           release: str = "glm", namespace: str = "glm-system") -> list[Obj]:
    return helm.template(values, release=release, namespace=namespace, chart=chart)


def openssl(*args: str, input: bytes | None = None) -> str:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    return subprocess.run(["openssl", *args], input=input, capture_output=True, check=True,
                          timeout=30).stdout.decode()


def test_the_generated_certificate_names_the_service_and_is_signed_by_the_ca(
        helm: Helm, webhook_chart: Path, tmp_path: Path) -> None:
    objs = render(helm, webhook_chart)
    secret = one(objs, "Secret", "glm-glm-operator-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    pem = {key: base64.b64decode(value) for key, value in secret["data"].items()}
    assert set(pem) == {"ca.crt", "tls.crt", "tls.key"}
    (tmp_path / "ca.crt").write_bytes(pem["ca.crt"])
    (tmp_path / "tls.crt").write_bytes(pem["tls.crt"])
    text = openssl("x509", "-noout", "-text", "-in", str(tmp_path / "tls.crt"))
    for name in ("glm-glm-operator-webhook", "glm-glm-operator-webhook.glm-system",
                 "glm-glm-operator-webhook.glm-system.svc"):
        assert f"DNS:{name}" in text
    verified = openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt"))
    assert verified.strip().endswith(": OK")

    # The CRD trusts the same CA, in the same render.
    definition = one(objs, "CustomResourceDefinition", "glmservices.serving.glm-operator.dev")
    config = definition["spec"]["conversion"]["webhook"]["clientConfig"]
    assert base64.b64decode(config["caBundle"]) == pem["ca.crt"]
    assert config["service"] == {"name": "glm-glm-operator-webhook", "namespace": "glm-system",
                                 "path": "/convert", "port": 443}
    assert definition["spec"]["conversion"]["webhook"]["conversionReviewVersions"] == ["v1"]
    assert definition["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    # ModelVersion's versions share one schema: no webhook.
    mv = one(objs, "CustomResourceDefinition", "modelversions.serving.glm-operator.dev")
    assert "conversion" not in mv["spec"]


def test_the_service_reaches_every_replica_on_the_webhook_port(helm: Helm,
                                                               webhook_chart: Path) -> None:
    objs = render(helm, webhook_chart)
    service = one(objs, "Service", "glm-glm-operator-webhook")
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443,
                                         "targetPort": "webhook", "protocol": "TCP"}]
    pod = one(objs, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    container = operator_container(objs)
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {"scheme": "HTTPS", "path": "/healthz",
                                                      "port": "webhook"}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-tls")
    assert mount == {"name": "webhook-tls", "mountPath": "/etc/glm-operator-webhook",
                     "readOnly": True}
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == "glm-glm-operator-webhook-tls"

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    assert args.webhook_port == 9443
    assert str(args.webhook_cert_file) == f"{mount['mountPath']}/tls.crt"
    assert str(args.webhook_key_file) == f"{mount['mountPath']}/tls.key"


def test_a_certificate_of_your_own(helm: Helm, webhook_chart: Path) -> None:
    objs = render(helm, webhook_chart, {"conversionWebhook": {
        "certSecret": "my-webhook-cert", "caBundle": CA_PEM, "port": 10443}})
    assert find(objs, "Secret") == []
    definition = one(objs, "CustomResourceDefinition", "glmservices.serving.glm-operator.dev")
    config = definition["spec"]["conversion"]["webhook"]["clientConfig"]
    assert base64.b64decode(config["caBundle"]).decode() == CA_PEM
    volume = next(v for v in one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == "my-webhook-cert"
    assert "--webhook-port=10443" in operator_container(objs)["args"]


def test_a_certificate_from_cert_manager(helm: Helm, webhook_chart: Path) -> None:
    objs = render(helm, webhook_chart, {"conversionWebhook": {
        "certSecret": "glm-webhook-cert", "certManagerInjectFrom": "glm-system/glm-webhook"}})
    assert find(objs, "Secret") == []
    definition = one(objs, "CustomResourceDefinition", "glmservices.serving.glm-operator.dev")
    assert definition["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "glm-system/glm-webhook")
    assert "caBundle" not in definition["spec"]["conversion"]["webhook"]["clientConfig"]
    mv = one(objs, "CustomResourceDefinition", "modelversions.serving.glm-operator.dev")
    assert "cert-manager.io/inject-ca-from" not in mv["metadata"]["annotations"]


def test_crds_disabled_still_serve_the_webhook(helm: Helm, webhook_chart: Path) -> None:
    objs = render(helm, webhook_chart, {"crds": {"enabled": False}})
    assert find(objs, "CustomResourceDefinition") == []
    assert one(objs, "Secret")["data"]["ca.crt"]
    assert one(objs, "Service", "glm-glm-operator-webhook")


def test_long_release_names_stay_within_63(helm: Helm, webhook_chart: Path) -> None:
    release = "r" * 53
    objs = render(helm, webhook_chart, release=release)
    for name in (o["metadata"]["name"] for o in objs if o["kind"] in ("Secret", "Service")):
        assert len(name) <= 63, name
    [service] = [o for o in find(objs, "Service") if o["metadata"]["name"].endswith("-webhook")]
    definition = one(objs, "CustomResourceDefinition", "glmservices.serving.glm-operator.dev")
    assert definition["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["name"] == (
        service["metadata"]["name"])


@pytest.mark.parametrize(("values", "says"), [
    ({"certManagerInjectFrom": "ns/cert"}, "needs conversionWebhook.certSecret"),
    ({"certSecret": "mine"}, "needs conversionWebhook.caBundle"),
    ({"certSecret": "mine", "caBundle": CA_PEM, "certManagerInjectFrom": "ns/cert"},
     "exclude each other"),
    ({"port": 8082}, "must differ from healthPort and metrics.port"),
    ({"caBundle": "not a certificate"}, "caBundle"),
    ({"prot": 9443}, "prot"),
], ids=["inject-without-secret", "secret-without-ca", "both-cas", "port-clash", "bad-pem",
        "typo"])
def test_bad_webhook_values_are_refused(helm: Helm, values: dict[str, Any], says: str) -> None:
    with pytest.raises(HelmError) as failure:
        helm.run("template", "glm", str(CHART), "--kube-version", KUBE_VERSION, "--values", "-",
                 input=yaml.safe_dump({"conversionWebhook": values}))
    assert says in failure.value.stderr
