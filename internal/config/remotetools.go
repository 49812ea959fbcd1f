package config

import "time"

// RemoteTools configures how workers find and call remote tools: tools any
// NATS client serves as micro endpoints on P.tools.<tenant>.<name>
// (docs/protocol.md). Profiles select them in their tools as
// "remote:<name>", a prefix such as "remote:crm_*", or all of them:
// "remote:*"; the model sees "remote__<name>". Workers look for them only
// when a profile selects some.
type RemoteTools struct {
	// RefreshInterval is how often a worker looks for remote tools
	// (default 30s); a message on P.tools.refresh asks for a look now.
	RefreshInterval Duration `yaml:"refresh_interval"`
	// DiscoveryWindow is how long one look waits for the services'
	// answers (default 500ms).
	DiscoveryWindow Duration `yaml:"discovery_window"`
	// CallTimeout bounds a call whose endpoint sets no timeout_ms
	// (default 30s).
	CallTimeout Duration `yaml:"call_timeout"`
}

func defaultRemoteTools() RemoteTools {
	return RemoteTools{
		RefreshInterval: Duration(30 * time.Second),
		DiscoveryWindow: Duration(500 * time.Millisecond),
		CallTimeout:     Duration(30 * time.Second),
	}
}

func (r *RemoteTools) validate(bad func(path, format string, args ...any)) {
	if time.Duration(r.RefreshInterval) < time.Second {
		bad("remote_tools.refresh_interval", "must be at least 1s")
	}
	if w := time.Duration(r.DiscoveryWindow); w < 10*time.Millisecond || w > 10*time.Second {
		bad("remote_tools.discovery_window", "must be from 10ms to 10s")
	} else if w >= time.Duration(r.RefreshInterval) {
		bad("remote_tools.discovery_window", "must be shorter than remote_tools.refresh_interval")
	}
	if time.Duration(r.CallTimeout) < 100*time.Millisecond {
		bad("remote_tools.call_timeout", "must be at least 100ms")
	}
}
