package config

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Telemetry configures metrics and traces (docs/operations.md,
// "Observability").
type Telemetry struct {
	Metrics Metrics `yaml:"metrics"`
	Traces  Traces  `yaml:"traces"`
}

// Metrics configures the Prometheus endpoint /metrics.
type Metrics struct {
	// Enabled serves /metrics (default true): on the gateway's API server
	// and on the worker's --listen health server, unless Listen is set.
	Enabled bool `yaml:"enabled"`
	// Listen, when set, serves /metrics on this address alone (e.g.
	// ":9464"), and the API server and the health server do not.
	Listen string `yaml:"listen"`
	// TenantLabel adds a tenant label to the run and token counters. Off
	// by default: tenants are unbounded and a scrape shows every tenant's
	// name; with gateway.api_keys it requires Listen, so the figures stay
	// off the API.
	TenantLabel bool `yaml:"tenant_label"`
}

// Traces configures OpenTelemetry traces, exported over OTLP/HTTP
// (protobuf). Off by default.
type Traces struct {
	Enabled bool `yaml:"enabled"`
	// Endpoint is the collector's OTLP/HTTP base URL, e.g.
	// http://otel-collector:4318 (/v1/traces is appended unless the URL
	// has a path), or host:port. Empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
	// or OTEL_EXPORTER_OTLP_ENDPOINT as the exporter reads them, else
	// localhost:4318. OTEL_EXPORTER_OTLP_ENDPOINT overrides the file.
	Endpoint string `yaml:"endpoint"`
	// Insecure sends over plain HTTP to an endpoint given as host:port
	// (an http:// URL is plain HTTP anyway).
	Insecure bool `yaml:"insecure"`
	// SampleRatio is the share of new traces recorded (default 1); a run
	// whose request carries a trace follows its sampling decision.
	SampleRatio float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name of the spans (default
	// natsagent-gateway or natsagent-worker; OTEL_SERVICE_NAME overrides).
	ServiceName string `yaml:"service_name"`
}

// Environment variables of the telemetry, OpenTelemetry's standard ones.
const (
	EnvOTLPEndpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvServiceName  = "OTEL_SERVICE_NAME"
	EnvSDKDisabled  = "OTEL_SDK_DISABLED"
)

func defaultTelemetry() Telemetry {
	return Telemetry{
		Metrics: Metrics{Enabled: true},
		Traces:  Traces{SampleRatio: 1},
	}
}

func (t *Telemetry) applyEnv(get func(string) string) {
	if v := get(EnvOTLPEndpoint); v != "" {
		t.Traces.Endpoint = v
	}
	if v := get(EnvServiceName); v != "" {
		t.Traces.ServiceName = v
	}
	if strings.EqualFold(get(EnvSDKDisabled), "true") {
		t.Traces.Enabled = false
	}
}

func (t *Telemetry) validate(apiKeys bool, bad func(path, format string, args ...any)) {
	if l := t.Metrics.Listen; l != "" {
		if _, _, err := net.SplitHostPort(l); err != nil {
			bad("telemetry.metrics.listen", "%q is not host:port (for example :9464): %v", l, err)
		}
	}
	if t.Metrics.TenantLabel && apiKeys && t.Metrics.Listen == "" {
		bad("telemetry.metrics.tenant_label", "with gateway.api_keys, set telemetry.metrics.listen too: /metrics on the API is open, and would show every tenant's name to anyone")
	}
	if r := t.Traces.SampleRatio; r < 0 || r > 1 {
		bad("telemetry.traces.sample_ratio", "must be between 0 and 1, not %g", r)
	}
	if e := t.Traces.Endpoint; e != "" {
		if _, err := ParseOTLPEndpoint(e); err != nil {
			bad("telemetry.traces.endpoint", "%v", err)
		}
	}
}

// ParseOTLPEndpoint reads an OTLP/HTTP endpoint: a URL (http or https)
// or host:port. A URL without a path gets /v1/traces.
func ParseOTLPEndpoint(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return nil, fmt.Errorf("%q is neither a URL (http://collector:4318) nor host:port", s)
		}
		return &url.URL{Scheme: "https", Host: s, Path: "/v1/traces"}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not a URL: %v", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%q: the scheme must be http or https (OTLP over HTTP)", s)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%q has no host", s)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u, nil
}
