package deploy

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/natsjwt"
)

// Names the manifests agree on.
const (
	gatewayName     = "natsagent-gateway"
	workerName      = "natsagent-worker"
	configMapName   = "natsagent-config"
	configKey       = "natsagent.yaml"
	secretExample   = "secret.example.yaml"
	natsSecretFile  = "nats-secret.example.yaml"
	modelSecretName = "natsagent-model"
	natsSecretName  = "natsagent-nats"
	natsRelease     = "nats"
	kedaAPIVersion  = "keda.sh/v1alpha1"
	kedaTriggerType = "nats-jetstream"
)

// strict decodes one manifest into v: YAML to JSON, then a JSON decoder
// that refuses unknown fields, so a misspelled or misplaced field fails
// (kubectl would drop or reject it).
func strict(data []byte, v any) error {
	return yaml.UnmarshalStrict(data, v)
}

// kustomization is the part of kustomize's Kustomization used here.
type kustomization struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Namespace  string           `json:"namespace"`
	Resources  []string         `json:"resources"`
	Images     []kustomizeImage `json:"images"`
}

type kustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName"`
	NewTag  string `json:"newTag"`
}

// scaledObject is the part of KEDA's ScaledObject (keda.sh/v1alpha1) the
// manifest uses; unknown fields fail, as KEDA's CRD schema would reject
// them.
type scaledObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion,omitempty"`
			Kind       string `json:"kind,omitempty"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		PollingInterval *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
		MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
		Advanced        *struct {
			HorizontalPodAutoscalerConfig *struct {
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
			} `json:"horizontalPodAutoscalerConfig,omitempty"`
		} `json:"advanced,omitempty"`
		Triggers []struct {
			Type     string            `json:"type"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// natsJetStreamMetadata are the nats-jetstream scaler's metadata keys.
var natsJetStreamMetadata = []string{"natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold", "activationLagThreshold", "useHttps"}

// checkTriggerMetadata refuses keys the scaler does not know (KEDA ignores
// them silently, so a typo would fall back to a default) and requires the
// ones without a usable default.
func checkTriggerMetadata(md map[string]string) error {
	for k := range md {
		if !slices.Contains(natsJetStreamMetadata, k) {
			return fmt.Errorf("nats-jetstream trigger: unknown metadata %q (known: %s)", k, strings.Join(natsJetStreamMetadata, ", "))
		}
	}
	for _, k := range []string{"natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"} {
		if md[k] == "" {
			return fmt.Errorf("nats-jetstream trigger: %s is required", k)
		}
	}
	return nil
}

// natsValues is the part of the NATS Helm chart's values the file sets.
type natsValues struct {
	Config struct {
		Cluster struct {
			Enabled  bool `json:"enabled"`
			Replicas int  `json:"replicas"`
		} `json:"cluster"`
		JetStream struct {
			Enabled   bool `json:"enabled"`
			FileStore struct {
				Enabled bool   `json:"enabled"`
				Dir     string `json:"dir"`
				PVC     struct {
					Enabled          bool   `json:"enabled"`
					Size             string `json:"size"`
					StorageClassName string `json:"storageClassName,omitempty"`
				} `json:"pvc"`
			} `json:"fileStore"`
			MemoryStore struct {
				Enabled bool   `json:"enabled"`
				MaxSize string `json:"maxSize"`
			} `json:"memoryStore"`
		} `json:"jetstream"`
		Monitor struct {
			Enabled bool `json:"enabled"`
			Port    int  `json:"port"`
		} `json:"monitor"`
		// Merge is merged into nats.conf; a key "$include" becomes an
		// include directive of a file of the chart's ConfigMap.
		Merge map[string]string `json:"merge"`
	} `json:"config"`
	Container struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
		// Env is the server's environment, by name.
		Env map[string]struct {
			ValueFrom *corev1.EnvVarSource `json:"valueFrom"`
		} `json:"env"`
	} `json:"container"`
	PodTemplate struct {
		TopologySpreadConstraints map[string]struct {
			MaxSkew           int    `json:"maxSkew"`
			WhenUnsatisfiable string `json:"whenUnsatisfiable"`
		} `json:"topologySpreadConstraints"`
	} `json:"podTemplate"`
}

// manifests are the decoded files of deploy/k8s.
type manifests struct {
	kust        kustomization
	namespace   corev1.Namespace
	configMap   corev1.ConfigMap
	secrets     map[string]corev1.Secret
	services    map[string]corev1.Service
	deployments map[string]appsv1.Deployment
	scaled      scaledObject
}

func loadKustomization(t *testing.T) kustomization {
	t.Helper()
	var k kustomization
	if err := strict(read(t, filepath.Join(k8sDir, "kustomization.yaml")), &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Fatalf("kustomization.yaml: %s %s", k.APIVersion, k.Kind)
	}
	return k
}

// loadManifests decodes every manifest of the kustomization, plus the
// Secret example, strictly into the Kubernetes API types of its kind.
func loadManifests(t *testing.T) manifests {
	t.Helper()
	m := manifests{kust: loadKustomization(t), services: map[string]corev1.Service{}, deployments: map[string]appsv1.Deployment{}, secrets: map[string]corev1.Secret{}}
	files := append(slices.Clone(m.kust.Resources), secretExample, natsSecretFile)
	kinds := map[string]int{}
	for _, f := range files {
		data := read(t, filepath.Join(k8sDir, f))
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(data, &tm); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		kinds[tm.Kind]++
		var err error
		want := "v1"
		switch tm.Kind {
		case "Namespace":
			err = strict(data, &m.namespace)
		case "ConfigMap":
			err = strict(data, &m.configMap)
		case "Secret":
			var sec corev1.Secret
			err = strict(data, &sec)
			m.secrets[sec.Name] = sec
		case "Service":
			var s corev1.Service
			err = strict(data, &s)
			m.services[s.Name] = s
		case "Deployment":
			want = "apps/v1"
			var d appsv1.Deployment
			err = strict(data, &d)
			m.deployments[d.Name] = d
		case "ScaledObject":
			want = kedaAPIVersion
			err = strict(data, &m.scaled)
		default:
			t.Fatalf("%s: kind %q is not covered by this test: add it", f, tm.Kind)
		}
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if tm.APIVersion != want {
			t.Errorf("%s: apiVersion %q, want %q for a %s", f, tm.APIVersion, want, tm.Kind)
		}
	}
	for kind, n := range map[string]int{"Namespace": 1, "ConfigMap": 1, "Secret": 2, "Service": 1, "Deployment": 2, "ScaledObject": 1} {
		if kinds[kind] != n {
			t.Errorf("%d %s manifests, want %d", kinds[kind], kind, n)
		}
	}
	return m
}

func loadScaledObject(t *testing.T) scaledObject {
	t.Helper()
	var so scaledObject
	if err := strict(read(t, filepath.Join(k8sDir, "worker-scaledobject.yaml")), &so); err != nil {
		t.Fatalf("worker-scaledobject.yaml: %v", err)
	}
	if len(so.Spec.Triggers) != 1 {
		t.Fatalf("worker-scaledobject.yaml: %d triggers, want 1", len(so.Spec.Triggers))
	}
	return so
}

func loadConfigMapConfig(t *testing.T) config.Config {
	t.Helper()
	var cm corev1.ConfigMap
	if err := strict(read(t, filepath.Join(k8sDir, "configmap.yaml")), &cm); err != nil {
		t.Fatalf("configmap.yaml: %v", err)
	}
	data, ok := cm.Data[configKey]
	if !ok {
		t.Fatalf("configmap.yaml has no %s", configKey)
	}
	return loadConfigData(t, configKey, data)
}

func loadNATSValues(t *testing.T) natsValues {
	t.Helper()
	var v natsValues
	if err := strict(read(t, natsValuesFile), &v); err != nil {
		t.Fatalf("%s: %v", natsValuesFile, err)
	}
	return v
}

// The decoders are strict: a misspelled field fails.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		into any
		doc  string
	}{
		{"Deployment", &appsv1.Deployment{}, "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n"},
		{"container", &appsv1.Deployment{}, "spec:\n  template:\n    spec:\n      containers:\n        - name: x\n          readinessProbes: {}\n"},
		{"Service", &corev1.Service{}, "spec:\n  selectors: {a: b}\n"},
		{"ScaledObject", &scaledObject{}, "spec:\n  minReplicas: 1\n"},
		{"kustomization", &kustomization{}, "resource: [a.yaml]\n"},
		{"NATS values", &natsValues{}, "config:\n  jetStream:\n    enabled: true\n  clustre: {}\n"},
	} {
		if err := strict([]byte(tc.doc), tc.into); err == nil {
			t.Errorf("%s: a misspelled field was accepted", tc.name)
		}
	}
	if err := checkTriggerMetadata(map[string]string{"natsServerMonitoringEndpoint": "n:8222", "account": "$G", "stream": "S", "consumer": "c", "lagTreshold": "8"}); err == nil {
		t.Error("a misspelled trigger metadata key was accepted")
	}
}

func TestKustomizationCoversTheManifests(t *testing.T) {
	m := loadManifests(t)
	if m.kust.Namespace == "" || m.kust.Namespace != m.namespace.Name {
		t.Errorf("kustomization namespace %q, Namespace manifest %q", m.kust.Namespace, m.namespace.Name)
	}
	// Every YAML file here is applied, or is one of the documented
	// exceptions: a stray file would be silently left out.
	notApplied := []string{"kustomization.yaml", secretExample, natsSecretFile, filepath.Base(natsValuesFile)}
	entries, err := os.ReadDir(k8sDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yaml") && !slices.Contains(m.kust.Resources, e.Name()) && !slices.Contains(notApplied, e.Name()) {
			t.Errorf("%s is neither in kustomization.yaml resources nor a documented exception", e.Name())
		}
	}
	for _, f := range []string{secretExample, natsSecretFile} {
		if slices.Contains(m.kust.Resources, f) {
			t.Errorf("%s is applied: it would overwrite the real secrets with the placeholders", f)
		}
	}
	// Every container image is set by the kustomization's images.
	for _, d := range m.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			i := slices.IndexFunc(m.kust.Images, func(img kustomizeImage) bool { return img.Name == c.Image })
			if i < 0 || m.kust.Images[i].NewTag == "" {
				t.Errorf("%s/%s: image %q has no images entry with a newTag in kustomization.yaml", d.Name, c.Name, c.Image)
			}
		}
	}
}

func TestConfigMapConfig(t *testing.T) {
	m := loadManifests(t)
	if m.configMap.Name != configMapName {
		t.Fatalf("ConfigMap %q, want %q", m.configMap.Name, configMapName)
	}
	cfg := loadConfigData(t, configKey, m.configMap.Data[configKey])
	if cfg.NATS.Replicas != 3 {
		t.Errorf("nats.replicas %d: the NATS cluster has three nodes, every asset should be R3", cfg.NATS.Replicas)
	}
	if !cfg.UsesDemoModel() {
		t.Error("the ConfigMap configures a model: keep the model in the Secret, so the demo model is the default")
	}
	if cfg.Files.Backend != config.FilesObjectStore {
		t.Errorf("files.backend %q: workers scale and move, only the object store follows a run", cfg.Files.Backend)
	}
	for _, u := range strings.Split(cfg.NATS.URL, ",") {
		if host, port := urlPort(t, u); host != natsRelease || port != 4222 {
			t.Errorf("nats.url %q: want the client Service of Helm release %q (nats://%s:4222)", u, natsRelease, natsRelease)
		}
	}
}

// container returns the one container of a deployment.
func container(t *testing.T, d appsv1.Deployment) corev1.Container {
	t.Helper()
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", d.Name, len(d.Spec.Template.Spec.Containers))
	}
	return d.Spec.Template.Spec.Containers[0]
}

// containerPort resolves a probe's or service's port (a name or a number)
// to one of the container's ports.
func containerPort(c corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// checkPod checks what the gateway and the worker share: the selector
// selects the pod, the image is the one given, the configuration comes
// from key natsagent.yaml of ConfigMap cm at the path --config names, it
// runs as the image's non-root user, and each probe is an HTTP GET on
// listenPort with the path given (handled in routesFile).
func checkPod(t *testing.T, d appsv1.Deployment, image, cm string, listenPort int, probes map[string]string, routesFile string) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("%s: selector %v does not select its pod labels %v (%v)", d.Name, d.Spec.Selector, d.Spec.Template.Labels, err)
	}
	c := container(t, d)
	if c.Image != image {
		t.Errorf("%s: image %q, want %q (set the registry in kustomization.yaml)", d.Name, c.Image, image)
	}

	cfgPath, ok := flagValue(c.Args, "config")
	if !ok {
		t.Fatalf("%s: no --config in args %v", d.Name, c.Args)
	}
	mounted := false
	for _, vm := range c.VolumeMounts {
		if path.Dir(cfgPath) != vm.MountPath {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm && path.Base(cfgPath) == configKey {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("%s: --config %s is not %s of ConfigMap %s mounted at %s", d.Name, cfgPath, configKey, cm, path.Dir(cfgPath))
	}

	uid := dockerfileUser(t)
	psc := d.Spec.Template.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != uid {
		t.Errorf("%s: the pod should run as non-root user %d, the images' USER", d.Name, uid)
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: want a read-only root filesystem and no privilege escalation", d.Name)
	}

	routes := string(read(t, filepath.Join(repoRoot, routesFile)))
	for kind, want := range probes {
		var p *corev1.Probe
		switch kind {
		case "startup":
			p = c.StartupProbe
		case "liveness":
			p = c.LivenessProbe
		case "readiness":
			p = c.ReadinessProbe
		}
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", d.Name, kind)
			continue
		}
		port, ok := containerPort(c, p.HTTPGet.Port)
		if !ok || int(port) != listenPort {
			t.Errorf("%s: %s probe port %s is not the container port the process listens on (%d)", d.Name, kind, p.HTTPGet.Port.String(), listenPort)
		}
		if p.HTTPGet.Path != want {
			t.Errorf("%s: %s probe path %q, want %q", d.Name, kind, p.HTTPGet.Path, want)
		}
		if !strings.Contains(routes, `"GET `+want+`"`) {
			t.Errorf("%s: %s probes %s, which %s does not serve", d.Name, kind, want, routesFile)
		}
	}
}

// checkNATSUser checks that a Deployment's process connects as user of
// tenants.conf: NATS_USER is the user, NATS_PASSWORD its password from the
// required NATS Secret, and no other password reaches the pod.
func checkNATSUser(t *testing.T, m manifests, d appsv1.Deployment, user string) {
	t.Helper()
	c := container(t, d)
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env[config.EnvNATSUser]; e.Value != user || e.ValueFrom != nil {
		t.Errorf("%s: %s %+v, want %q", d.Name, config.EnvNATSUser, e, user)
	}
	want := tenantsPasswords[user]
	ref := env[config.EnvNATSPassword].ValueFrom
	if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != natsSecretName || ref.SecretKeyRef.Key != want ||
		(ref.SecretKeyRef.Optional != nil && *ref.SecretKeyRef.Optional) {
		t.Errorf("%s: %s from %+v, want key %s of the required Secret %s", d.Name, config.EnvNATSPassword, ref, want, natsSecretName)
	}
	if _, ok := m.secrets[natsSecretName].StringData[want]; !ok {
		t.Errorf("%s: Secret %s (%s) has no %s", d.Name, natsSecretName, natsSecretFile, want)
	}
	for _, ef := range c.EnvFrom {
		if ef.SecretRef != nil && ef.SecretRef.Name == natsSecretName {
			t.Errorf("%s: envFrom Secret %s gives the pod every user's password", d.Name, natsSecretName)
		}
	}
}

func TestGatewayDeploymentAndService(t *testing.T) {
	m := loadManifests(t)
	cfg := loadConfigData(t, configKey, m.configMap.Data[configKey])
	d, ok := m.deployments[gatewayName]
	if !ok {
		t.Fatalf("no Deployment %s", gatewayName)
	}
	checkNATSUser(t, m, d, "gateway")
	listen := portOf(t, cfg.Gateway.Listen)
	checkPod(t, d, gatewayName, configMapName, listen, map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}, "internal/gateway/gateway.go")
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Error("run at least two gateways: a rollout or a node loss should not stop the API")
	}

	svc, ok := m.services[gatewayName]
	if !ok {
		t.Fatalf("no Service %s", gatewayName)
	}
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Service selector %v does not select the gateway pods %v", svc.Spec.Selector, d.Spec.Template.Labels)
	}
	for _, sp := range svc.Spec.Ports {
		if port, ok := containerPort(container(t, d), sp.TargetPort); !ok || int(port) != listen {
			t.Errorf("Service port %s targets %s, not the gateway's port %d", sp.Name, sp.TargetPort.String(), listen)
		}
	}
}

func TestWorkerDeployment(t *testing.T) {
	m := loadManifests(t)
	cfg := loadConfigData(t, configKey, m.configMap.Data[configKey])
	d, ok := m.deployments[workerName]
	if !ok {
		t.Fatalf("no Deployment %s", workerName)
	}
	c := container(t, d)
	listen, ok := flagValue(c.Args, "listen")
	if !ok {
		t.Fatalf("%s: no --listen for the health endpoints in args %v", workerName, c.Args)
	}
	checkPod(t, d, workerName, configMapName, portOf(t, listen), map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}, "cmd/worker/health.go")
	if d.Spec.Replicas != nil {
		t.Error("the worker Deployment sets replicas: the ScaledObject owns the count, and every apply would reset it")
	}
	checkNATSUser(t, m, d, "worker")

	// Kubernetes kills the pod terminationGracePeriodSeconds after SIGTERM:
	// the worker needs its shutdown grace, then time to cancel the rest at
	// a checkpoint, hand requests back and drain.
	grace := time.Duration(cfg.Worker.ShutdownGrace)
	if d.Spec.Template.Spec.TerminationGracePeriodSeconds == nil {
		t.Fatal("worker: no terminationGracePeriodSeconds")
	}
	kill := time.Duration(*d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	if margin := kill - grace; margin < 5*time.Second || margin > time.Minute {
		t.Errorf("terminationGracePeriodSeconds %s vs worker.shutdown_grace %s: want the grace plus 5s to 1m", kill, grace)
	}

	// The model key comes from the optional Secret whose example is given.
	model, ok := m.secrets[modelSecretName]
	if !ok {
		t.Fatalf("no Secret %s in %s", modelSecretName, secretExample)
	}
	found := false
	for _, ef := range c.EnvFrom {
		if ef.SecretRef != nil && ef.SecretRef.Name == model.Name {
			found = true
			if ef.SecretRef.Optional == nil || !*ef.SecretRef.Optional {
				t.Error("the model Secret must be optional: without it the demo model runs")
			}
		}
	}
	if !found {
		t.Errorf("worker does not read Secret %s", model.Name)
	}
	for k := range model.StringData {
		if k != config.EnvAPIKey && k != config.EnvModel && k != config.EnvBaseURL {
			t.Errorf("Secret key %s is not an environment variable natsagent reads", k)
		}
	}
	if model.StringData[config.EnvAPIKey] == "" {
		t.Errorf("the Secret example should show %s", config.EnvAPIKey)
	}
}

func TestKEDAScalesWorkersOnTheirConsumerLag(t *testing.T) {
	m := loadManifests(t)
	cfg := loadConfigData(t, configKey, m.configMap.Data[configKey])
	checkScaledObject(t, m.scaled, workerName, cfg, m.kust.Namespace)
}

// checkScaledObject checks a ScaledObject against the worker Deployment it
// scales, the configuration the workers read, and the NATS release of
// nats-values.yaml in namespace.
func checkScaledObject(t *testing.T, so scaledObject, worker string, cfg config.Config, namespace string) {
	t.Helper()
	names := settingsOf(t, cfg).Names
	if so.Spec.ScaleTargetRef.Name != worker || (so.Spec.ScaleTargetRef.Kind != "" && so.Spec.ScaleTargetRef.Kind != "Deployment") {
		t.Errorf("scaleTargetRef %+v, want Deployment %s", so.Spec.ScaleTargetRef, worker)
	}
	if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < 1 {
		t.Error("minReplicaCount must be at least 1: workers also answer cancels and run background jobs")
	}
	if so.Spec.MaxReplicaCount == nil || so.Spec.MinReplicaCount == nil || *so.Spec.MaxReplicaCount < *so.Spec.MinReplicaCount {
		t.Error("maxReplicaCount must be at least minReplicaCount")
	}
	if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != kedaTriggerType {
		t.Fatalf("want one %s trigger", kedaTriggerType)
	}
	md := so.Spec.Triggers[0].Metadata
	if err := checkTriggerMetadata(md); err != nil {
		t.Fatal(err)
	}
	// The names bus provisions for the configured prefix: renaming the
	// stream or the consumer breaks this test, not the autoscaling.
	if md["stream"] != names.RunsStream() || md["consumer"] != bus.RunsConsumer {
		t.Errorf("trigger watches %s/%s, but workers consume %s/%s", md["stream"], md["consumer"], names.RunsStream(), bus.RunsConsumer)
	}
	// The NATS values include tenants.conf, whose service account AGENT
	// holds the streams; /jsz names static accounts by name (the cluster
	// test reads the lag under this account).
	if md["account"] != natsjwt.ServiceAccount {
		t.Errorf("account %q: the streams are in tenants.conf's service account %s, as /jsz names it", md["account"], natsjwt.ServiceAccount)
	}
	if n, err := strconv.Atoi(md["lagThreshold"]); err != nil || n != cfg.Worker.Concurrency {
		t.Errorf("lagThreshold %q, want worker.concurrency (%d): the lag counts held runs too", md["lagThreshold"], cfg.Worker.Concurrency)
	}
	values := loadNATSValues(t)
	wantEndpoint := fmt.Sprintf("%s-headless.%s.svc.cluster.local:%d", natsRelease, namespace, values.Config.Monitor.Port)
	if md["natsServerMonitoringEndpoint"] != wantEndpoint {
		t.Errorf("natsServerMonitoringEndpoint %q, want %q (the Helm release's headless Service, monitoring port)", md["natsServerMonitoringEndpoint"], wantEndpoint)
	}
}

func TestNATSHelmValues(t *testing.T) {
	v := loadNATSValues(t)
	cfg := loadConfigMapConfig(t)
	c := v.Config
	if !c.Cluster.Enabled || c.Cluster.Replicas != cfg.NATS.Replicas {
		t.Errorf("cluster enabled %v with %d replicas; natsagent asks for R%d", c.Cluster.Enabled, c.Cluster.Replicas, cfg.NATS.Replicas)
	}
	if !c.JetStream.Enabled || !c.JetStream.FileStore.Enabled || !c.JetStream.FileStore.PVC.Enabled || c.JetStream.FileStore.PVC.Size == "" {
		t.Error("JetStream must be on with file storage on a persistent volume")
	}
	if !c.Monitor.Enabled || c.Monitor.Port == 0 {
		t.Error("the monitoring endpoint must be on: KEDA reads the lag there")
	}
	_, require := goMod(t)
	server := require("github.com/nats-io/nats-server/v2")
	img := v.Container.Image
	if img.Repository != "nats" || !strings.HasPrefix(img.Tag, minor(server)+".") {
		t.Errorf("NATS image %s:%s, want the nats %s.x server natsagent is tested against (go.mod %s)", img.Repository, img.Tag, minor(server), server)
	}
	if composeImage := loadCompose(t, composeEnv(natsPasswords())).Services["nats-1"].Image; composeImage != img.Repository+":"+img.Tag {
		t.Errorf("compose runs %s, Kubernetes %s:%s: keep them the same", composeImage, img.Repository, img.Tag)
	}
}

// The NATS servers run with tenants.conf: the chart's ConfigMap gets the
// file (helm --set-file, as the values' header says) and nats.conf
// includes it; every password it reads comes from the NATS Secret.
func TestNATSHelmValuesAuth(t *testing.T) {
	v := loadNATSValues(t)
	m := loadManifests(t)
	const file = "tenants.conf"
	if got := v.Config.Merge["$include"]; got != file {
		t.Errorf("config.merge.$include %q, want %s: the servers would run without accounts", got, file)
	}
	// The install command of the header puts the shipped file there.
	setFile := `--set-file 'configMap.merge.data.tenants\.conf=deploy/nats/` + file + `'`
	if !strings.Contains(string(read(t, natsValuesFile)), setFile) {
		t.Errorf("%s: the helm install command should have %s", natsValuesFile, setFile)
	}
	// Every variable tenants.conf reads, and no other, from the Secret.
	want := tenantsConfPasswordEnv(t)
	var got []string
	secret := m.secrets[natsSecretName]
	for name, e := range v.Container.Env {
		got = append(got, name)
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != natsSecretName || e.ValueFrom.SecretKeyRef.Key != name {
			t.Errorf("container.env %s: %+v, want key %s of Secret %s", name, e.ValueFrom, name, natsSecretName)
		}
	}
	if !sameSet(got, want) {
		t.Errorf("container.env %v, want the variables tenants.conf reads: %v", got, want)
	}
	var keys []string
	for k := range secret.StringData {
		keys = append(keys, k)
	}
	if !sameSet(keys, want) {
		t.Errorf("Secret %s (%s) has %v, want %v", natsSecretName, natsSecretFile, keys, want)
	}
}

// tenantsConfPasswordEnv are the environment variables tenants.conf reads
// its users' passwords from.
func tenantsConfPasswordEnv(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, m := range regexp.MustCompile(`password: \$(\w+)`).FindAllStringSubmatch(string(read(t, tenantsConf)), -1) {
		names = append(names, m[1])
	}
	if len(names) < 4 {
		t.Fatalf("tenants.conf reads %v: want the passwords of gateway, worker, acme and globex", names)
	}
	return names
}
