package deploy

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/natsagent/natsagent/internal/config"
)

// loadCompose loads compose.yaml as docker compose does: compose-go
// validates it against the compose specification's JSON schema (embedded
// in the module, nothing is downloaded), interpolates ${VARS} from env
// only (not this process's environment) and resolves paths.
func loadCompose(t *testing.T, env []string) *types.Project {
	t.Helper()
	p, err := loadComposeFile(composeFile, env)
	if err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	return p
}

func loadComposeFile(path string, env []string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{path}, cli.WithEnv(env), cli.WithWorkingDirectory(filepath.Dir(path)))
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(context.Background())
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("compose.yaml has no service %s", name)
	}
	return s
}

// bindSource returns the host file bound at target in a service.
func bindSource(s types.ServiceConfig, target string) (string, bool) {
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == target {
			return v.Source, true
		}
	}
	return "", false
}

// strOf shows a compose environment value: unset, or quoted.
func strOf(v *string) string {
	if v == nil {
		return "unset"
	}
	return strconv.Quote(*v)
}

func abs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The loader enforces the schema: a misspelled key fails.
func TestComposeSchemaIsEnforced(t *testing.T) {
	data := strings.Replace(string(read(t, composeFile)), "    stop_grace_period: 30s", "    stop_grace_periods: 30s", 1)
	if !strings.Contains(data, "stop_grace_periods") {
		t.Fatal("compose.yaml no longer sets the workers' stop_grace_period")
	}
	path := filepath.Join(t.TempDir(), "compose.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadComposeFile(path, composeEnv(natsPasswords())); err == nil || !strings.Contains(err.Error(), "stop_grace_periods") {
		t.Fatalf("a misspelled key was accepted: %v", err)
	}
}

func TestComposeNATSCluster(t *testing.T) {
	p := loadCompose(t, composeEnv(natsPasswords()))
	for _, node := range natsNodes {
		s := service(t, p, node)
		if !strings.HasPrefix(s.Image, "nats:") {
			t.Errorf("%s: image %q is not the official nats image", node, s.Image)
		}
		// The node runs its own config file.
		confPath, ok := flagValue(s.Command, "config")
		if !ok {
			t.Fatalf("%s: no --config in command %v", node, s.Command)
		}
		src, ok := bindSource(s, confPath)
		if !ok || src != abs(t, filepath.Join(natsConfDir, node+".conf")) {
			t.Errorf("%s: %s is %q, want deploy/nats/%s.conf", node, confPath, src, node)
		}
		// `include tenants.conf` reads the file next to the config.
		included := path.Join(path.Dir(confPath), "tenants.conf")
		if src, ok := bindSource(s, included); !ok || src != abs(t, tenantsConf) {
			t.Errorf("%s: %s is %q, want deploy/nats/tenants.conf", node, included, src)
		}
		// tenants.conf's passwords, from the environment of compose: every
		// one it reads (a tenant added with `natsagent tenant add` too).
		for _, env := range tenantsConfPasswordEnv(t) {
			if _, ok := s.Environment[env]; !ok {
				t.Errorf("%s: %s, which tenants.conf reads, is not passed to the server", node, env)
			}
		}
		for user, env := range tenantsPasswords {
			if v := s.Environment[env]; v == nil || *v != natsPasswords()[user] {
				t.Errorf("%s: %s is %s, want the value of %s in compose's environment", node, env, strOf(v), env)
			}
		}
		// JetStream's store is a named volume that outlives the container.
		o := loadNATSConf(t, node)
		stored := slices.ContainsFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Type == types.VolumeTypeVolume && v.Target == o.StoreDir && p.Volumes[v.Source].Name != ""
		})
		if !stored {
			t.Errorf("%s: no named volume at the JetStream store_dir %s", node, o.StoreDir)
		}
		if hc := s.HealthCheck; hc == nil || !slices.ContainsFunc(hc.Test, func(a string) bool {
			return strings.Contains(a, "/healthz") && strings.Contains(a, ":"+strconv.Itoa(o.HTTPPort)+"/")
		}) {
			t.Errorf("%s: the healthcheck should ask /healthz on the monitoring port %d", node, o.HTTPPort)
		}
	}
}

func TestComposeNatsagent(t *testing.T) {
	p := loadCompose(t, composeEnv(natsPasswords()))
	cfg := loadConfig(t, composeConfig)
	if cfg.NATS.Replicas != 3 {
		t.Errorf("%s: nats.replicas %d, want 3 on the 3-node cluster", composeConfig, cfg.NATS.Replicas)
	}
	// The processes connect to every node, at the node's client port.
	var hosts []string
	for _, u := range strings.Split(cfg.NATS.URL, ",") {
		host, port := urlPort(t, u)
		if port != loadNATSConf(t, natsNodes[0]).Port {
			t.Errorf("nats.url %s: port %d is not the nodes' client port", u, port)
		}
		hosts = append(hosts, host)
	}
	if !sameSet(hosts, natsNodes) {
		t.Errorf("nats.url %q, want every node of %v", cfg.NATS.URL, natsNodes)
	}
	stages := dockerfileStages(t)

	for _, tc := range []struct {
		name     string
		replicas int
		listen   func(types.ServiceConfig) string
	}{
		{"gateway", 1, func(types.ServiceConfig) string { return cfg.Gateway.Listen }},
		{"worker", 2, func(s types.ServiceConfig) string {
			v, ok := flagValue(s.Command, "listen")
			if !ok {
				t.Fatalf("worker: no --listen for the health endpoints in %v", s.Command)
			}
			return v
		}},
	} {
		s := service(t, p, tc.name)
		if s.GetScale() != tc.replicas {
			t.Errorf("%s: %d replicas, want %d", tc.name, s.GetScale(), tc.replicas)
		}
		// Built from deploy/Dockerfile's stage of the same name.
		if b := s.Build; b == nil || b.Context != abs(t, repoRoot) || b.Dockerfile != "deploy/Dockerfile" || b.Target != tc.name || stages[tc.name] == nil {
			t.Errorf("%s: build %+v, want deploy/Dockerfile target %s with the repository as context", tc.name, b, tc.name)
		}
		cfgPath, ok := flagValue(s.Command, "config")
		if !ok {
			t.Fatalf("%s: no --config in command %v", tc.name, s.Command)
		}
		if src, ok := bindSource(s, cfgPath); !ok || src != abs(t, composeConfig) {
			t.Errorf("%s: %s is %q, want deploy/%s", tc.name, cfgPath, src, composeConfig)
		}
		for _, node := range natsNodes {
			if dep, ok := s.DependsOn[node]; !ok || dep.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s: should wait for %s to be healthy (its JetStream current)", tc.name, node)
			}
		}
		// The healthcheck asks /readyz where the process listens.
		port := strconv.Itoa(portOf(t, tc.listen(s)))
		if hc := s.HealthCheck; hc == nil || len(hc.Test) != 3 || hc.Test[0] != "CMD" || hc.Test[1] != "/usr/local/bin/healthcheck" ||
			!strings.HasSuffix(hc.Test[2], ":"+port+"/readyz") {
			t.Errorf("%s: healthcheck %v, want the healthcheck binary on /readyz at port %s", tc.name, s.HealthCheck, port)
		}
	}

	// Each process connects as its own user of tenants.conf, with that
	// user's password and no other.
	for _, user := range []string{"gateway", "worker"} {
		env := service(t, p, user).Environment
		if v := env[config.EnvNATSUser]; v == nil || *v != user {
			t.Errorf("%s: %s is %s, want %s", user, config.EnvNATSUser, strOf(v), user)
		}
		if v := env[config.EnvNATSPassword]; v == nil || *v != natsPasswords()[user] {
			t.Errorf("%s: %s is %s, want the value of %s", user, config.EnvNATSPassword, strOf(v), tenantsPasswords[user])
		}
		for other, pw := range natsPasswords() {
			for k, v := range env {
				if other != user && v != nil && *v == pw {
					t.Errorf("%s: %s holds the password of %s", user, k, other)
				}
			}
		}
	}

	gw := service(t, p, "gateway")
	if len(gw.Ports) != 1 || gw.Ports[0].Target != uint32(portOf(t, cfg.Gateway.Listen)) {
		t.Errorf("gateway publishes %+v, want the listen port %s", gw.Ports, cfg.Gateway.Listen)
	}
	w := service(t, p, "worker")
	grace := time.Duration(cfg.Worker.ShutdownGrace)
	if w.StopGracePeriod == nil || time.Duration(*w.StopGracePeriod)-grace < 5*time.Second {
		t.Errorf("worker stop_grace_period %v: want worker.shutdown_grace (%s) plus at least 5s before the kill", w.StopGracePeriod, grace)
	}
}

// No password is shipped: with any of the four unset or empty, compose
// stops before anything starts, naming the variable and how to make one.
func TestComposeRequiresNATSPasswords(t *testing.T) {
	for _, missing := range tenantsPasswords {
		for _, empty := range []bool{false, true} {
			var env []string
			for _, kv := range composeEnv(natsPasswords()) {
				if strings.HasPrefix(kv, missing+"=") {
					if !empty {
						continue
					}
					kv = missing + "="
				}
				env = append(env, kv)
			}
			_, err := loadComposeFile(composeFile, env)
			if err == nil || !strings.Contains(err.Error(), "set "+missing) || !strings.Contains(err.Error(), "openssl rand") {
				t.Errorf("compose with %s unset (empty: %v): %v, want an error naming it and how to make one", missing, empty, err)
			}
		}
	}
}

// The model settings pass through from the shell; unset, the demo model runs.
func TestComposeModelEnvironment(t *testing.T) {
	modelEnv := []string{config.EnvBaseURL, config.EnvAPIKey, config.EnvModel}
	for _, name := range []string{"gateway", "worker"} {
		s := service(t, loadCompose(t, composeEnv(natsPasswords())), name)
		for _, k := range modelEnv {
			if v, ok := s.Environment[k]; !ok || v == nil || *v != "" {
				t.Errorf("%s: %s should be set and empty by default (demo model), got %v", name, k, v)
			}
		}
		s = service(t, loadCompose(t, append(composeEnv(natsPasswords()), "OPENAI_API_KEY=sk-test", "NATSAGENT_MODEL=m1", "OPENAI_BASE_URL=http://llm:8000/v1")), name)
		if v := s.Environment[config.EnvAPIKey]; v == nil || *v != "sk-test" {
			t.Errorf("%s: %s was not passed through", name, config.EnvAPIKey)
		}
		if v := s.Environment[config.EnvModel]; v == nil || *v != "m1" {
			t.Errorf("%s: %s was not passed through", name, config.EnvModel)
		}
	}
}
