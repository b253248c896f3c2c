"""Build KEDA's operator and metrics API server, trimmed to the triggers the operator renders.

The toolchain component `keda_controller` (e2e/toolchain.py; version: the `[keda]` pin of
e2e/versions.toml, v2.21.0) builds from the `github.com/kedacore/keda/v2` module, fetched
through the Go module proxy like every other component:

- `keda-operator` (the module's `cmd/operator`): reconciles ScaledObjects into the HPA
  `keda-hpa-<name>` and runs the scalers, which it serves over gRPC (port 9666);
- `keda-adapter` (`cmd/adapter`): the `external.metrics.k8s.io` API server that the HPA
  controller reads through the aggregation layer, asking the operator's gRPC service;
- KEDA's CRDs as controller-gen wrote them (`config/crd/bases`): the operator's controllers
  watch ScaledJobs, (Cluster)TriggerAuthentications and (Cluster)CloudEventSources as well
  as ScaledObjects and stop when one of those kinds is not served.

Not the admission webhooks (`cmd/webhooks`): they only validate.

**What is trimmed, and why.** KEDA's `pkg/scalers` is one Go package holding every scaler
(about 70 of them): importing it for the Prometheus scaler compiles every cloud and database
SDK they use. `go list -deps ./cmd/operator ./cmd/adapter` counts 3,710 packages untrimmed,
against 2,531 for kube-apiserver, -controller-manager, -scheduler and kubectl together. So the
module's source is copied into the build's work directory and cut there (`trim`), down to
what scaling on glm-operator's ScaledObjects needs, and only as far as is needed to compile:

1. `pkg/scalers`: every scaler source file removed except `scaler.go` (the Scaler interface
   and the shared metric helpers), `prometheus_scaler.go` (the only trigger type the operator
   renders) and `cpu_memory_scaler.go` (the resource triggers, which need no SDK); the
   sub-packages of removed scalers only (`externalscaler`, `kafka`, `liiklus`, `openstack`,
   `splunk`, `sumologic`) removed with them. One shared constant the kept files use lived in
   a removed file (`externalMetricType`, in azure_queue_scaler.go): it is declared again in
   `trimmed_shared.go`.
2. `pkg/scaling/scalers_builder.go`: the trigger switch (between KEDA's own `TRIGGERS-START`
   and `TRIGGERS-END` markers) reduced to `cpu`, `memory` and `prometheus`; any other trigger
   type gets KEDA's own "no scaler found for type" error.
3. `pkg/scalers/prometheus_scaler.go`: the cloud transports tried when the trigger has no
   `authModes` (Azure Managed Prometheus via azidentity, Google OAuth2 via the GCP SDK, AWS
   SigV4 for Amazon Managed Prometheus via aws-sdk-go-v2) cut, with their imports: the
   operator's triggers carry no authentication, so each of those was a no-op for them. The
   trigger's own `authModes` (basic, bearer, TLS, OAuth2 client credentials) are kept.
4. `pkg/scalers/aws`, `pkg/scalers/gcp`: removed (only the cut transports and the cut AWS
   secret handler used them); `pkg/scalers/azure`: reduced to the service-principal
   parameter names the resolver fills in (constants, no SDK).
5. `pkg/scaling/resolver`: the TriggerAuthentication secret sources that need a cloud SDK
   (AWS Secrets Manager, Azure Key Vault, GCP Secret Manager) replaced by stubs that fail
   with "not built into this trimmed keda-operator"; Kubernetes Secrets, environment,
   HashiCorp Vault (plain HTTP client, no cloud SDK) and bound service-account tokens kept.
6. `pkg/eventemitter`: the Azure Event Grid destination of CloudEventSources replaced by a
   stub that fails the same way (the HTTP destination kept).

That leaves about 1,600 packages. TRIM_VERSION names this list: change the trimming and
bump it, and the component's cache key changes, so it rebuilds.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import stat
from pathlib import Path

MODULE = "github.com/kedacore/keda/v2"
# Part of the cache key (toolchain.BUILD_KEYS): bump it when `trim` changes.
TRIM_VERSION = "prometheus-cpu-memory-2"
KEPT_SCALER_FILES = frozenset({"scaler.go", "prometheus_scaler.go", "cpu_memory_scaler.go"})
REMOVED_SCALER_PACKAGES = ("externalscaler", "kafka", "liiklus", "openstack", "splunk",
                           "sumologic", "aws", "gcp")
KEPT_TRIGGERS = """\
\tswitch triggerType {
\tcase "cpu":
\t\treturn scalers.NewCPUMemoryScaler(corev1.ResourceCPU, config)
\tcase "memory":
\t\treturn scalers.NewCPUMemoryScaler(corev1.ResourceMemory, config)
\tcase "prometheus":
\t\treturn scalers.NewPrometheusScaler(config)
\tdefault:
\t\treturn nil, fmt.Errorf("no scaler found for type: %s", triggerType)
\t}
"""
TRIMMED = "not built into this trimmed keda-operator (glm-operator e2e/keda_build.py)"
CRD_FILES = (
    "keda.sh_scaledobjects.yaml", "keda.sh_scaledjobs.yaml",
    "keda.sh_triggerauthentications.yaml", "keda.sh_clustertriggerauthentications.yaml",
    "eventing.keda.sh_cloudeventsources.yaml", "eventing.keda.sh_clustercloudeventsources.yaml",
)

SHARED_SCALER_CONSTANTS = """\
package scalers

// Trimmed: declared in azure_queue_scaler.go upstream, used by every kept scaler.
const externalMetricType = "External"
"""

AZURE_CONSTANTS = """\
// Package azure, trimmed: only the service-principal parameter names that
// pkg/scaling/resolver fills in (the SDK-based code is not built).
package azure

const (
\tServicePrincipalAuthKey                      = "azureServicePrincipal"
\tServicePrincipalTenantIDKey                  = "azureServicePrincipalTenantId"
\tServicePrincipalClientIDKey                  = "azureServicePrincipalClientId"
\tServicePrincipalCloudKey                     = "azureServicePrincipalCloud"
\tServicePrincipalActiveDirectoryEndpointKey   = "azureServicePrincipalActiveDirectoryEndpoint"
\tServicePrincipalClientSecretKey              = "azureServicePrincipalClientSecret"
\tServicePrincipalClientCertificateKey         = "azureServicePrincipalClientCertificate"
\tServicePrincipalClientCertificatePasswordKey = "azureServicePrincipalClientCertificatePassword"
)
"""

RESOLVER_STUBS = f"""\
package resolver

// Trimmed: the cloud secret sources of TriggerAuthentication, which need the AWS, Azure and
// GCP SDKs, fail instead of being built.

import (
\t"context"
\t"errors"

\t"github.com/go-logr/logr"
\tcorev1 "k8s.io/api/core/v1"
\tcorev1listers "k8s.io/client-go/listers/core/v1"
\t"sigs.k8s.io/controller-runtime/pkg/client"

\tkedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
)

var errTrimmed = errors.New("{TRIMMED}")

type AwsSecretManagerHandler struct{{}}

func NewAwsSecretManagerHandler(*kedav1alpha1.AwsSecretManager) *AwsSecretManagerHandler {{
\treturn &AwsSecretManagerHandler{{}}
}}

func (*AwsSecretManagerHandler) Initialize(context.Context, client.Client, logr.Logger, string,
\tcorev1listers.SecretLister, *corev1.PodSpec) error {{
\treturn errTrimmed
}}

func (*AwsSecretManagerHandler) Read(context.Context, logr.Logger, string, string, string,
\tstring) (string, error) {{
\treturn "", errTrimmed
}}

func (*AwsSecretManagerHandler) Stop() {{}}

type AzureKeyVaultHandler struct{{}}

func NewAzureKeyVaultHandler(*kedav1alpha1.AzureKeyVault) *AzureKeyVaultHandler {{
\treturn &AzureKeyVaultHandler{{}}
}}

func (*AzureKeyVaultHandler) Initialize(context.Context, client.Client, logr.Logger, string,
\tcorev1listers.SecretLister) error {{
\treturn errTrimmed
}}

func (*AzureKeyVaultHandler) Read(context.Context, string, string) (string, error) {{
\treturn "", errTrimmed
}}

type GCPSecretManagerHandler struct{{}}

func NewGCPSecretManagerHandler(*kedav1alpha1.GCPSecretManager) *GCPSecretManagerHandler {{
\treturn &GCPSecretManagerHandler{{}}
}}

func (*GCPSecretManagerHandler) Initialize(context.Context, client.Client, logr.Logger, string,
\tcorev1listers.SecretLister) error {{
\treturn errTrimmed
}}

func (*GCPSecretManagerHandler) Read(context.Context, string, string) (string, error) {{
\treturn "", errTrimmed
}}
"""

EVENT_GRID_STUB = f"""\
package eventemitter

// Trimmed: the Azure Event Grid destination needs the Azure SDK; it fails instead.

import (
\t"context"
\t"errors"

\t"github.com/go-logr/logr"
\tmetav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

\teventingv1alpha1 "github.com/kedacore/keda/v2/apis/eventing/v1alpha1"
\tkedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
\t"github.com/kedacore/keda/v2/pkg/eventemitter/eventdata"
)

type AzureEventGridTopicHandler struct{{}}

func NewAzureEventGridTopicHandler(context.Context, string,
\t*eventingv1alpha1.AzureEventGridTopicSpec, map[string]string, kedav1alpha1.AuthPodIdentity,
\tlogr.Logger) (*AzureEventGridTopicHandler, error) {{
\treturn nil, errors.New("{TRIMMED}")
}}

func (*AzureEventGridTopicHandler) CloseHandler() {{}}

func (*AzureEventGridTopicHandler) SetActiveStatus(metav1.ConditionStatus) {{}}

func (*AzureEventGridTopicHandler) GetActiveStatus() metav1.ConditionStatus {{
\treturn metav1.ConditionFalse
}}

func (*AzureEventGridTopicHandler) EmitEvent(eventdata.EventData,
\tfunc(eventdata.EventData, error)) {{
}}
"""


class KedaTrimError(RuntimeError):
    """The module's source is not what `trim` expects (a new KEDA version moved something)."""


def trim_key() -> str:
    """A short hash of the trimming: part of the component's cache directory name."""
    text = "\n".join((TRIM_VERSION, *sorted(KEPT_SCALER_FILES), KEPT_TRIGGERS))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def copy_source(module_dir: Path, dest: Path) -> None:
    """The module cache is read-only: copy it and make the copy writable."""
    shutil.copytree(module_dir, dest, ignore=shutil.ignore_patterns("tests", "*_test.go"))
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def _replace(path: Path, pattern: str, replacement: str, flags: int = re.S) -> None:
    text = path.read_text()
    new, count = re.subn(pattern, lambda _: replacement, text, count=1, flags=flags)
    if count != 1:
        raise KedaTrimError(f"{path}: {pattern!r} not found; the trimming needs updating")
    path.write_text(new)


def trim(src: Path) -> None:
    """Cut the copied module down as the docstring lists (1-6)."""
    scalers = src / "pkg" / "scalers"
    for path in scalers.glob("*.go"):
        if path.name not in KEPT_SCALER_FILES:
            path.unlink()
    for package in REMOVED_SCALER_PACKAGES:
        shutil.rmtree(scalers / package)
    (scalers / "trimmed_shared.go").write_text(SHARED_SCALER_CONSTANTS)
    shutil.rmtree(scalers / "azure")
    (scalers / "azure").mkdir()
    (scalers / "azure" / "constants.go").write_text(AZURE_CONSTANTS)

    _replace(src / "pkg" / "scaling" / "scalers_builder.go",
             r"(\t// TRIGGERS-START\n).*?(\t// TRIGGERS-END)",
             "\t// TRIGGERS-START\n" + KEPT_TRIGGERS + "\t// TRIGGERS-END")

    prometheus = scalers / "prometheus_scaler.go"
    _replace(prometheus,
             r"\t\t// could be the case of azure managed prometheus\..*?"
             r"httpClient\.Transport = awsTransport\n\t\t}\n",
             "\t\t// Trimmed: the Azure, GCP and AWS transports are not built.\n")
    for package in ("aws", "azure", "gcp"):
        _replace(prometheus, rf'\t"{re.escape(MODULE)}/pkg/scalers/{package}"\n', "")
    if "errors." not in prometheus.read_text():
        _replace(prometheus, r'\t"errors"\n', "")

    resolver = src / "pkg" / "scaling" / "resolver"
    for name in ("aws_secretmanager_handler.go", "azure_keyvault_handler.go",
                 "gcp_secretmanager_handler.go"):
        (resolver / name).unlink()
    (resolver / "trimmed_cloud_secrets.go").write_text(RESOLVER_STUBS)

    emitter = src / "pkg" / "eventemitter"
    (emitter / "azure_event_grid_topic_handler.go").unlink()
    (emitter / "trimmed_azure_event_grid.go").write_text(EVENT_GRID_STUB)


def build_keda_controller(version: str, out: Path, work: Path) -> None:
    """keda-operator, keda-adapter and KEDA's CRDs from the trimmed module (see above)."""
    from e2e.toolchain import _go_build_with_progress, _module_info

    name = "keda_controller"
    info = _module_info(name, f"{MODULE}@{version}", work)
    src = work / "keda"
    copy_source(Path(info["Dir"]), src)
    trim(src)
    ldflags = (f"-s -w -X {MODULE}/version.Version={version} "
               f"-X {MODULE}/version.GitCommit=trimmed-{trim_key()}")
    _go_build_with_progress(name, src, ["./cmd/operator", "./cmd/adapter"], out, ldflags)
    (out / "operator").rename(out / "keda-operator")
    (out / "adapter").rename(out / "keda-adapter")
    for crd in CRD_FILES:
        shutil.copyfile(src / "config" / "crd" / "bases" / crd, out / crd)
