package deploy

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/natsagent/natsagent/internal/config"
)

// The chart is rendered and linted by Helm's own Go packages (the engine
// and linter `helm template` and `helm lint` run), offline.
const (
	chartDir       = "helm/natsagent"
	chartNamespace = "natsagent"
)

// release is what one render of the chart produced, decoded strictly into
// the Kubernetes API types of each kind.
type release struct {
	name        string
	configMap   corev1.ConfigMap
	cfg         config.Config
	services    map[string]corev1.Service
	deployments map[string]appsv1.Deployment
	pdbs        map[string]policyv1.PodDisruptionBudget
	scaled      []scaledObject
	monitors    []monitoringv1.ServiceMonitor
}

// fullname is the chart's base name for a release: the release name, with
// "-natsagent" added unless the name already says it.
func (r release) fullname() string {
	if strings.Contains(r.name, "natsagent") {
		return r.name
	}
	return r.name + "-natsagent"
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load %s: %v", chartDir, err)
	}
	return c
}

// renderChart renders the chart as `helm template NAME --namespace
// natsagent -f values` would: values are coalesced with values.yaml and
// checked against values.schema.json first.
func renderChart(t *testing.T, name, values string) (map[string]string, error) {
	t.Helper()
	c := loadChart(t)
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	opts := chartutil.ReleaseOptions{Name: name, Namespace: chartNamespace, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(c, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return engine.Engine{Strict: true}.Render(c, rv)
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// mustRender renders the chart and decodes every object it produced.
func mustRender(t *testing.T, name, values string) release {
	t.Helper()
	out, err := renderChart(t, name, values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r := release{name: name, services: map[string]corev1.Service{}, deployments: map[string]appsv1.Deployment{}, pdbs: map[string]policyv1.PodDisruptionBudget{}}
	files := make([]string, 0, len(out))
	for f := range out {
		files = append(files, f)
	}
	slices.Sort(files)
	configMaps := 0
	for _, f := range files {
		if !strings.HasSuffix(f, ".yaml") {
			continue
		}
		for _, doc := range docSeparator.Split(out[f], -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v\n%s", f, err, doc)
			}
			want := "v1"
			var err error
			switch tm.Kind {
			case "ConfigMap":
				configMaps++
				err = strict([]byte(doc), &r.configMap)
			case "Service":
				var s corev1.Service
				err = strict([]byte(doc), &s)
				r.services[s.Name] = s
			case "Deployment":
				want = "apps/v1"
				var d appsv1.Deployment
				err = strict([]byte(doc), &d)
				r.deployments[d.Name] = d
			case "PodDisruptionBudget":
				want = "policy/v1"
				var p policyv1.PodDisruptionBudget
				err = strict([]byte(doc), &p)
				r.pdbs[p.Name] = p
			case "ScaledObject":
				want = kedaAPIVersion
				var so scaledObject
				err = strict([]byte(doc), &so)
				r.scaled = append(r.scaled, so)
			case "ServiceMonitor":
				want = "monitoring.coreos.com/v1"
				var sm monitoringv1.ServiceMonitor
				err = strict([]byte(doc), &sm)
				r.monitors = append(r.monitors, sm)
			default:
				t.Fatalf("%s: kind %q is not covered by this test: add it", f, tm.Kind)
			}
			if err != nil {
				t.Fatalf("%s: %v\n%s", f, err, doc)
			}
			if tm.APIVersion != want {
				t.Errorf("%s: apiVersion %q, want %q for a %s", f, tm.APIVersion, want, tm.Kind)
			}
		}
	}
	if configMaps != 1 {
		t.Fatalf("%d ConfigMaps, want 1", configMaps)
	}
	r.cfg = loadConfigData(t, configKey, r.configMap.Data[configKey])
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func (r release) deployment(t *testing.T, component string) appsv1.Deployment {
	t.Helper()
	d, ok := r.deployments[r.fullname()+"-"+component]
	if !ok {
		t.Fatalf("no Deployment %s-%s among %v", r.fullname(), component, slices.Collect(mapKeys(r.deployments)))
	}
	return d
}

func seconds(p *int64) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprintf("%ds", *p)
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// helm lint, on the default values and on the other shapes a user picks.
func TestHelmChartLints(t *testing.T) {
	for name, values := range map[string]map[string]any{
		"defaults":       nil,
		"no autoscaling": {"worker": map[string]any{"autoscaling": map[string]any{"enabled": false}}},
		"monitored":      {"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}}},
	} {
		l := lint.All(chartDir, values, chartNamespace, false)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: helm lint: %v", name, m)
			}
		}
	}
}

// The chart renders what deploy/k8s applies, for a release of any name:
// the same pods, probes, users and security, its configuration loads, and
// the autoscaler and the disruption budgets fit the Deployments.
func TestHelmChartRendersTheDeployment(t *testing.T) {
	k := loadManifests(t)
	for _, name := range []string{"natsagent", "prod"} {
		t.Run(name, func(t *testing.T) {
			r := mustRender(t, name, "image: {registry: registry.example.com/natsagent, tag: v1.2.3}\n")
			if want := map[string]int{"Deployment": 2, "Service": 2, "PodDisruptionBudget": 2, "ScaledObject": 1, "ServiceMonitor": 0}; len(r.deployments) != want["Deployment"] ||
				len(r.services) != want["Service"] || len(r.pdbs) != want["PodDisruptionBudget"] || len(r.scaled) != want["ScaledObject"] || len(r.monitors) != want["ServiceMonitor"] {
				t.Fatalf("rendered %d Deployments, %d Services, %d PDBs, %d ScaledObjects, %d ServiceMonitors; want %v",
					len(r.deployments), len(r.services), len(r.pdbs), len(r.scaled), len(r.monitors), want)
			}
			cm := r.configMap.Name
			gw, wk := r.deployment(t, "gateway"), r.deployment(t, "worker")
			checkPod(t, gw, "registry.example.com/natsagent/gateway:v1.2.3", cm, portOf(t, r.cfg.Gateway.Listen),
				map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}, "internal/gateway/gateway.go")
			listen, ok := flagValue(container(t, wk).Args, "listen")
			if !ok {
				t.Fatalf("worker: no --listen in args %v", container(t, wk).Args)
			}
			checkPod(t, wk, "registry.example.com/natsagent/worker:v1.2.3", cm, portOf(t, listen),
				map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}, "cmd/worker/health.go")
			checkNATSUser(t, k, gw, "gateway")
			checkNATSUser(t, k, wk, "worker")

			// The same configuration and containers as the kustomize manifests.
			kcfg := loadConfigData(t, configKey, k.configMap.Data[configKey])
			if r.cfg.NATS.URL != kcfg.NATS.URL || r.cfg.NATS.Replicas != kcfg.NATS.Replicas || r.cfg.Worker.Concurrency != kcfg.Worker.Concurrency ||
				r.cfg.Worker.ShutdownGrace != kcfg.Worker.ShutdownGrace || r.cfg.Gateway.Listen != kcfg.Gateway.Listen {
				t.Errorf("chart configuration %+v / %+v differs from configmap.yaml's %+v / %+v", r.cfg.NATS, r.cfg.Worker, kcfg.NATS, kcfg.Worker)
			}
			for component, kname := range map[string]string{"gateway": gatewayName, "worker": workerName} {
				hc, kc := container(t, r.deployment(t, component)), container(t, k.deployments[kname])
				if fmt.Sprint(hc.SecurityContext) != fmt.Sprint(kc.SecurityContext) || fmt.Sprint(hc.Resources) != fmt.Sprint(kc.Resources) || fmt.Sprint(hc.Env) != fmt.Sprint(kc.Env) {
					t.Errorf("%s: the chart's container differs from deploy/k8s's in security, resources or env:\n chart %v %v %v\n k8s   %v %v %v",
						component, hc.SecurityContext, hc.Resources, hc.Env, kc.SecurityContext, kc.Resources, kc.Env)
				}
				hp, kp := r.deployment(t, component).Spec.Template.Spec.SecurityContext, k.deployments[kname].Spec.Template.Spec.SecurityContext
				if fmt.Sprint(hp) != fmt.Sprint(kp) {
					t.Errorf("%s: pod security %v, deploy/k8s has %v", component, hp, kp)
				}
			}

			// Workers: KEDA owns the count; the pod outlives the shutdown grace.
			if wk.Spec.Replicas != nil {
				t.Error("the worker Deployment sets replicas while the ScaledObject owns the count")
			}
			grace := time.Duration(r.cfg.Worker.ShutdownGrace)
			if tg := wk.Spec.Template.Spec.TerminationGracePeriodSeconds; tg == nil || time.Duration(*tg)*time.Second-grace < 5*time.Second {
				t.Errorf("terminationGracePeriodSeconds %s vs worker.shutdown_grace %s: want the grace plus 5s or more", seconds(tg), grace)
			}
			checkScaledObject(t, r.scaled[0], wk.Name, r.cfg, chartNamespace)

			// The gateway Service reaches the gateway's port.
			svc, ok := r.services[gw.Name]
			if !ok || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(gw.Spec.Template.Labels)) {
				t.Fatalf("Service %s does not select the gateway pods", gw.Name)
			}
			for _, sp := range svc.Spec.Ports {
				if p, ok := containerPort(container(t, gw), sp.TargetPort); !ok || int(p) != portOf(t, r.cfg.Gateway.Listen) {
					t.Errorf("gateway Service port %s targets %s, not the gateway's port", sp.Name, sp.TargetPort.String())
				}
			}

			// Each budget selects its own pods and no others, and lets a
			// drain go on.
			for _, d := range []appsv1.Deployment{gw, wk} {
				p, ok := r.pdbs[d.Name]
				if !ok {
					t.Fatalf("no PodDisruptionBudget %s", d.Name)
				}
				sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
				if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
					t.Errorf("PDB %s does not select its pods %v", p.Name, d.Spec.Template.Labels)
				}
				for _, other := range []appsv1.Deployment{gw, wk} {
					if other.Name != d.Name && sel.Matches(labels.Set(other.Spec.Template.Labels)) {
						t.Errorf("PDB %s also selects the %s pods", p.Name, other.Name)
					}
				}
			}
			if p := r.pdbs[gw.Name]; p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() >= int(*gw.Spec.Replicas) {
				t.Errorf("gateway PDB minAvailable %v with %d replicas: a drain could never evict one", p.Spec.MinAvailable, *gw.Spec.Replicas)
			}
			if p := r.pdbs[wk.Name]; p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() < 1 {
				t.Errorf("worker PDB maxUnavailable %v: a drain could never evict one", p.Spec.MaxUnavailable)
			}

			// A changed configuration rolls the pods: the checksum follows it.
			other := mustRender(t, name, "image: {registry: registry.example.com/natsagent, tag: v1.2.3}\nworker: {concurrency: 16}\n")
			for _, c := range []string{"gateway", "worker"} {
				a, b := r.deployment(t, c).Spec.Template.Annotations["checksum/config"], other.deployment(t, c).Spec.Template.Annotations["checksum/config"]
				if a == "" || a == b {
					t.Errorf("%s: checksum/config %q stays %q after the configuration changed", c, a, b)
				}
			}
		})
	}
}

// Values change what they say: a fixed worker count without KEDA, another
// stream prefix, more configuration under the keys the chart owns, and a
// ServiceMonitor that reaches /metrics on both kinds of pods.
func TestHelmChartValues(t *testing.T) {
	t.Run("fixed workers", func(t *testing.T) {
		r := mustRender(t, "natsagent", "worker: {replicas: 5, autoscaling: {enabled: false}}\n")
		if len(r.scaled) != 0 {
			t.Error("a ScaledObject with autoscaling off")
		}
		if wk := r.deployment(t, "worker"); wk.Spec.Replicas == nil || *wk.Spec.Replicas != 5 {
			t.Errorf("worker replicas %v, want 5", wk.Spec.Replicas)
		}
	})
	t.Run("config", func(t *testing.T) {
		r := mustRender(t, "natsagent", `
worker: {concurrency: 12, shutdownGraceSeconds: 45}
config:
  nats: {prefix: ACME, url: nats://elsewhere:4222}
  worker: {concurrency: 99, run_timeout: 7m}
`)
		if r.cfg.Worker.Concurrency != 12 || time.Duration(r.cfg.Worker.ShutdownGrace) != 45*time.Second || r.cfg.NATS.URL != "nats://nats:4222" {
			t.Errorf("the chart's own keys should win over config: concurrency %d, grace %s, url %s", r.cfg.Worker.Concurrency, time.Duration(r.cfg.Worker.ShutdownGrace), r.cfg.NATS.URL)
		}
		if r.cfg.NATS.Prefix != "ACME" || time.Duration(r.cfg.Worker.RunTimeout) != 7*time.Minute {
			t.Errorf("config's other keys should reach natsagent.yaml: prefix %q, run_timeout %s", r.cfg.NATS.Prefix, time.Duration(r.cfg.Worker.RunTimeout))
		}
		if tg := r.deployment(t, "worker").Spec.Template.Spec.TerminationGracePeriodSeconds; tg == nil || *tg != 55 {
			t.Errorf("terminationGracePeriodSeconds %s, want 45 + 10", seconds(tg))
		}
		checkScaledObject(t, r.scaled[0], r.deployment(t, "worker").Name, r.cfg, chartNamespace)
	})
	t.Run("service monitor", func(t *testing.T) {
		r := mustRender(t, "natsagent", "serviceMonitor: {enabled: true, interval: 15s, labels: {release: prometheus}}\n")
		if len(r.monitors) != 1 {
			t.Fatalf("%d ServiceMonitors, want 1", len(r.monitors))
		}
		sm := r.monitors[0]
		if sm.Labels["release"] != "prometheus" {
			t.Errorf("ServiceMonitor labels %v lack the ones given", sm.Labels)
		}
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if !r.cfg.Telemetry.Metrics.Enabled || r.cfg.Telemetry.Metrics.Listen != "" {
			t.Fatalf("metrics %+v: the processes serve /metrics on their own ports only when enabled without a listen address", r.cfg.Telemetry.Metrics)
		}
		routes := map[string]string{"gateway": "internal/gateway/gateway.go", "worker": "cmd/worker/health.go"}
		for _, component := range []string{"gateway", "worker"} {
			d := r.deployment(t, component)
			svc, ok := r.services[d.Name]
			if !ok || !sel.Matches(labels.Set(svc.Labels)) {
				t.Errorf("the ServiceMonitor does not select Service %s (labels %v)", d.Name, svc.Labels)
				continue
			}
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("Service %s does not select its pods", svc.Name)
			}
			for _, ep := range sm.Spec.Endpoints {
				i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port })
				if i < 0 {
					t.Errorf("Service %s has no port %q for the ServiceMonitor", svc.Name, ep.Port)
					continue
				}
				// The scrape goes to the pod port the process serves
				// /metrics on: the gateway's API, the worker's --listen.
				p, ok := containerPort(container(t, d), svc.Spec.Ports[i].TargetPort)
				c := container(t, d)
				want := portOf(t, r.cfg.Gateway.Listen)
				if component == "worker" {
					l, _ := flagValue(c.Args, "listen")
					want = portOf(t, l)
				}
				if !ok || int(p) != want || ep.Path != "/metrics" {
					t.Errorf("%s: ServiceMonitor scrapes %s%s, want port %d /metrics", component, svc.Spec.Ports[i].TargetPort.String(), ep.Path, want)
				}
				if !strings.Contains(string(read(t, filepath.Join(repoRoot, routes[component]))), `"GET /metrics"`) {
					t.Errorf("%s does not serve GET /metrics", routes[component])
				}
			}
		}
	})
}

// Bad values fail the install with a message that names them.
func TestHelmChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"worker: {concurrency: eight}\n", "concurrency"},
		{"gatway: {replicas: 3}\n", "gatway"},
		{"nats: {url: http://nats:4222}\n", "url"},
		{"serviceMonitor: {enabled: true}\nconfig: {telemetry: {metrics: {listen: ':9464'}}}\n", "config.telemetry.metrics.listen"},
		{"serviceMonitor: {enabled: true}\nconfig: {telemetry: {metrics: {enabled: false}}}\n", "config.telemetry.metrics.enabled"},
	} {
		_, err := renderChart(t, "natsagent", tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q: err %v, want one naming %s", tc.values, err, tc.want)
		}
	}
}
