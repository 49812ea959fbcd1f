package config

import (
	"testing"
)

func clearTelemetryEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{EnvOTLPEndpoint, EnvServiceName, EnvSDKDisabled, EnvModel, EnvBaseURL, EnvAPIKey} {
		t.Setenv(k, "")
	}
}

// Metrics are on and traces off by default; the file sets the traces and
// OpenTelemetry's standard variables override it.
func TestTelemetryDefaultsFileAndEnvironment(t *testing.T) {
	clearTelemetryEnv(t)
	cfg, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if tel := cfg.Telemetry; !tel.Metrics.Enabled || tel.Metrics.TenantLabel || tel.Metrics.Listen != "" || tel.Traces.Enabled || tel.Traces.SampleRatio != 1 {
		t.Fatalf("defaults %+v", tel)
	}

	p := writeConfig(t, `
telemetry:
  metrics:
    listen: ":9464"
    tenant_label: true
  traces:
    enabled: true
    endpoint: collector:4318
    insecure: true
    sample_ratio: 0.25
    service_name: from-file
`)
	cfg, err = Load(p)
	if err != nil {
		t.Fatal(err)
	}
	tr := cfg.Telemetry.Traces
	if !tr.Enabled || tr.Endpoint != "collector:4318" || !tr.Insecure || tr.SampleRatio != 0.25 || tr.ServiceName != "from-file" {
		t.Fatalf("file values not applied: %+v", tr)
	}
	if m := cfg.Telemetry.Metrics; !m.Enabled || m.Listen != ":9464" || !m.TenantLabel {
		t.Fatalf("metrics %+v", m)
	}

	t.Setenv(EnvOTLPEndpoint, "http://otel:4318")
	t.Setenv(EnvServiceName, "from-env")
	cfg, err = Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if tr := cfg.Telemetry.Traces; tr.Endpoint != "http://otel:4318" || tr.ServiceName != "from-env" || !tr.Enabled {
		t.Fatalf("environment not applied: %+v", tr)
	}
	t.Setenv(EnvSDKDisabled, "TRUE")
	if cfg, err = Load(p); err != nil || cfg.Telemetry.Traces.Enabled {
		t.Fatalf("OTEL_SDK_DISABLED=true left traces on (err %v)", err)
	}
}

func TestTelemetryRejectsBadFieldsWithTheirPath(t *testing.T) {
	clearTelemetryEnv(t)
	t.Setenv("K", "a-long-enough-api-key-for-the-test")
	cases := map[string]string{
		"telemetry:\n  metrics:\n    listen: nine\n":                                                                      "telemetry.metrics.listen",
		"telemetry:\n  traces:\n    sample_ratio: 1.5\n":                                                                  "telemetry.traces.sample_ratio",
		"telemetry:\n  traces:\n    sample_ratio: -0.1\n":                                                                 "telemetry.traces.sample_ratio",
		"telemetry:\n  traces:\n    endpoint: collector\n":                                                                "telemetry.traces.endpoint",
		"telemetry:\n  traces:\n    endpoint: grpc://c:4317\n":                                                            "telemetry.traces.endpoint",
		"telemetry:\n  traces:\n    servce_name: x\n":                                                                     "servce_name",
		"telemetry:\n  metrics:\n    tenant_label: true\ngateway:\n  api_keys:\n    - {name: a, tenant: a, key_env: K}\n": "telemetry.metrics.tenant_label",
	}
	loadRefuses(t, cases)
	// With its own address, the tenant label is allowed beside API keys.
	ok := "telemetry:\n  metrics:\n    tenant_label: true\n    listen: 127.0.0.1:9464\ngateway:\n  api_keys:\n    - {name: a, tenant: a, key_env: K}\n"
	if _, err := Load(writeConfig(t, ok)); err != nil {
		t.Errorf("tenant_label with listen and api_keys: %v", err)
	}
}

func TestParseOTLPEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"http://otel:4318":            "http://otel:4318/v1/traces",
		"http://otel:4318/":           "http://otel:4318/v1/traces",
		"https://otel.example/custom": "https://otel.example/custom",
		"otel:4318":                   "https://otel:4318/v1/traces",
	} {
		u, err := ParseOTLPEndpoint(in)
		if err != nil || u.String() != want {
			t.Errorf("ParseOTLPEndpoint(%q) = %v, %v; want %s", in, u, err, want)
		}
	}
	for _, in := range []string{"otel", "ftp://otel:21", "http://", "http://[::1"} {
		if _, err := ParseOTLPEndpoint(in); err == nil {
			t.Errorf("ParseOTLPEndpoint(%q) accepted", in)
		}
	}
}
