// Package natsconn dials NATS as a configuration's nats section says:
// credentials, TLS, and errors that carry no secret. Every binary and the
// CLI connect through it; it knows nothing of what runs on the connection.
package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
)

// Connect dials NATS as configured, with the credentials and TLS of
// NATSOptions; its errors carry no secret.
func Connect(cfg config.Config, name string) (*nats.Conn, error) {
	opts, err := NATSOptions(cfg.NATS)
	if err != nil {
		return nil, err
	}
	nc, err := bus.Connect(cfg.NATS.URL, name, opts...)
	if err != nil {
		return nil, connectError(cfg.NATS, err)
	}
	return nc, nil
}

// NATSOptions turns the nats section's credentials and TLS settings into
// connection options: the one place every binary gets them from. Files are
// read here, so a missing or malformed one is reported with its field
// before any connection is tried.
func NATSOptions(n config.NATS) ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case n.User != "":
		opts = append(opts, nats.UserInfo(n.User, string(n.Password)))
	case n.Token != "":
		opts = append(opts, nats.Token(string(n.Token)))
	case n.NkeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(n.NkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats.nkey_seed_file: %w", err)
		}
		opts = append(opts, o)
	case n.CredsFile != "":
		data, err := os.ReadFile(n.CredsFile)
		if err != nil {
			return nil, fmt.Errorf("nats.creds_file: %w", err)
		}
		if !strings.Contains(string(data), "BEGIN NATS USER JWT") || !strings.Contains(string(data), "USER NKEY SEED") {
			return nil, fmt.Errorf("nats.creds_file: %s is not a NATS credentials file (it needs a user JWT and a user nkey seed, as `nsc generate creds` writes)", n.CredsFile)
		}
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	}
	if t := n.TLS; t.Enabled() {
		// Secure first: it replaces the TLS config the options below fill.
		opts = append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}))
		if t.CAFile != "" {
			pem, err := os.ReadFile(t.CAFile)
			if err != nil {
				return nil, fmt.Errorf("nats.tls.ca_file: %w", err)
			}
			if !x509.NewCertPool().AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("nats.tls.ca_file: %s holds no PEM certificate", t.CAFile)
			}
			opts = append(opts, nats.RootCAs(t.CAFile))
		}
		if t.CertFile != "" || t.KeyFile != "" {
			if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
				return nil, fmt.Errorf("nats.tls.cert_file, nats.tls.key_file: %w", err)
			}
			opts = append(opts, nats.ClientCert(t.CertFile, t.KeyFile))
		}
	}
	return opts, nil
}

// connectError explains a failed connection without its secrets: URLs
// lose their user info, and a password or token found in the message is
// masked. The cause stays reachable for errors.Is.
func connectError(n config.NATS, err error) error {
	msg := redactSecrets(err.Error(), n)
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		msg += fmt.Sprintf(" (the server refused the credentials: check %s)", authSource(n))
	case strings.Contains(err.Error(), "x509:") || strings.Contains(err.Error(), "tls:"):
		msg += " (TLS failed: check nats.tls.ca_file, nats.tls.server_name and, for servers that verify clients, nats.tls.cert_file and key_file)"
	}
	return &redactedError{msg: msg, cause: err}
}

func authSource(n config.NATS) string {
	switch {
	case n.User != "":
		return "nats.user and nats.password (env " + config.EnvNATSUser + ", " + config.EnvNATSPassword + ")"
	case n.Token != "":
		return "nats.token (env " + config.EnvNATSToken + ")"
	case n.NkeySeedFile != "":
		return "nats.nkey_seed_file (env " + config.EnvNATSNkey + ")"
	case n.CredsFile != "":
		return "nats.creds_file (env " + config.EnvNATSCreds + ")"
	case strings.Contains(n.URL, "@"):
		return "the user info in nats.url"
	}
	return "the nats section: no credentials are configured (nats.user/password, token, nkey_seed_file or creds_file)"
}

type redactedError struct {
	msg   string
	cause error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.cause }

// redactSecrets masks the NATS credentials in s: the user info of the
// configured URLs (user:password@ or token@) and the password and token.
func redactSecrets(s string, n config.NATS) string {
	var secrets []string
	for _, raw := range strings.Split(n.URL, ",") {
		raw = strings.TrimSpace(raw)
		if i := strings.Index(raw, "://"); i >= 0 {
			rest := raw[i+3:]
			if at := strings.LastIndex(rest, "@"); at > 0 {
				secrets = append(secrets, rest[:at])
				if u, err := url.Parse(raw); err == nil && u.User != nil {
					secrets = append(secrets, u.User.String())
					if p, ok := u.User.Password(); ok {
						secrets = append(secrets, p)
					}
				}
			}
		}
	}
	secrets = append(secrets, string(n.Password), string(n.Token))
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "****")
		}
	}
	return s
}
