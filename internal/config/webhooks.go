package config

// EnvWebhookSecret sets webhooks.secret from the environment (it wins
// over the file), so the secret need not be written in it.
const EnvWebhookSecret = "NATSAGENT_WEBHOOK_SECRET"

// Webhooks configures the delivery of runs' webhooks (a run body's
// "webhook": its final record POSTed to a URL once it ended).
type Webhooks struct {
	// Secret signs every delivery: X-Natsagent-Signature is
	// "sha256=" + hex HMAC-SHA256 of the body with it. Empty sends no
	// signature.
	Secret Secret `yaml:"secret"`
	// AllowPrivate lets webhooks reach loopback, private and link-local
	// addresses. Off: such URLs are refused at submission, and any
	// connection to such an address is refused at delivery.
	AllowPrivate bool `yaml:"allow_private"`
	// MaxAttempts bounds the POSTs of one delivery (default 5; a failed
	// one is retried after 2s, doubling, jittered).
	MaxAttempts int `yaml:"max_attempts"`
	// Timeout bounds one POST (default 10s).
	Timeout Duration `yaml:"timeout"`
}

func (w *Webhooks) applyEnv(get func(string) string) {
	if v := get(EnvWebhookSecret); v != "" {
		w.Secret = Secret(v)
	}
}

func (w *Webhooks) validate(bad func(path, format string, args ...any)) {
	if w.MaxAttempts < 0 || w.MaxAttempts > 50 {
		bad("webhooks.max_attempts", "must be 0 (default 5) to 50")
	}
	if w.Timeout < 0 {
		bad("webhooks.timeout", "must not be negative")
	}
}
