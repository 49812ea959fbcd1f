package natsconn

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/natsagent/natsagent/internal/config"
)

// startAuthServer runs a plain NATS server (no JetStream: these tests
// are about the handshake) on a random loopback port with opts' auth.
func startAuthServer(t *testing.T, opts *server.Options) string {
	t.Helper()
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

func natsConfig(url string, edit func(*config.NATS)) config.Config {
	cfg := config.Default()
	cfg.NATS.URL = url
	edit(&cfg.NATS)
	return cfg
}

// mustConnect connects with app.Connect and proves the connection works
// with a request served on it.
func mustConnect(t *testing.T, cfg config.Config) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	nc, err := Connect(cfg, "auth-test")
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	sub, err := nc.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if m, err := nc.Request("echo", []byte("hi"), 5*time.Second); err != nil || string(m.Data) != "hi" {
		t.Fatalf("request over the authenticated connection: %v", err)
	}
}

// mustRefuse connects with wrong credentials: the error is the server's
// refusal, says what to check, and carries no secret.
func mustRefuse(t *testing.T, cfg config.Config, want error, hint string, secrets ...string) {
	t.Helper()
	nc, err := Connect(cfg, "auth-test")
	if err == nil {
		nc.Close()
		t.Fatal("connected with wrong credentials")
	}
	t.Log(err)
	if want != nil && !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
	if !strings.Contains(err.Error(), hint) {
		t.Fatalf("error %q does not mention %q", err, hint)
	}
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Fatalf("error %q shows the secret %q", err, s)
		}
	}
}

func TestNATSUserPassword(t *testing.T) {
	url := startAuthServer(t, &server.Options{Users: []*server.User{{Username: "svc", Password: "right-password-1"}}})
	mustConnect(t, natsConfig(url, func(n *config.NATS) { n.User, n.Password = "svc", "right-password-1" }))
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { n.User, n.Password = "svc", "wrong-password-1" }),
		nats.ErrAuthorization, "nats.user and nats.password", "wrong-password-1")
	mustRefuse(t, natsConfig(url, func(*config.NATS) {}), nats.ErrAuthorization, "no credentials are configured")
	// Credentials in the URL work, and never show in the error.
	withUser := strings.Replace(url, "nats://", "nats://svc:url-password-9@", 1)
	mustRefuse(t, natsConfig(withUser, func(*config.NATS) {}), nats.ErrAuthorization, "nats.url", "url-password-9")
}

func TestNATSToken(t *testing.T) {
	url := startAuthServer(t, &server.Options{Authorization: "right-token-123456"})
	mustConnect(t, natsConfig(url, func(n *config.NATS) { n.Token = "right-token-123456" }))
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { n.Token = "wrong-token-123456" }),
		nats.ErrAuthorization, "nats.token", "wrong-token-123456")
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNATSNkey(t *testing.T) {
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	url := startAuthServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	mustConnect(t, natsConfig(url, func(n *config.NATS) { n.NkeySeedFile = writeFile(t, "user.nk", seed) }))

	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { n.NkeySeedFile = writeFile(t, "other.nk", otherSeed) }),
		nats.ErrAuthorization, "nats.nkey_seed_file", string(otherSeed))
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { n.NkeySeedFile = filepath.Join(t.TempDir(), "missing.nk") }),
		nil, "nats.nkey_seed_file")
}

// TestNATSCreds runs a server in operator mode, with an operator, an
// account and users made here and the account in a memory resolver, as
// `nsc` and a production resolver would have them.
func TestNATSCreds(t *testing.T) {
	operator, _ := nkeys.CreateOperator()
	opPub, _ := operator.PublicKey()
	opJWT, err := jwt.NewOperatorClaims(opPub).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}
	account, _ := nkeys.CreateAccount()
	accPub, _ := account.PublicKey()
	accJWT, err := jwt.NewAccountClaims(accPub).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	if err := resolver.Store(accPub, accJWT); err != nil {
		t.Fatal(err)
	}
	url := startAuthServer(t, &server.Options{TrustedOperators: []*jwt.OperatorClaims{opClaims}, AccountResolver: resolver})

	creds := func(signer nkeys.KeyPair) []byte {
		user, _ := nkeys.CreateUser()
		pub, _ := user.PublicKey()
		seed, _ := user.Seed()
		userJWT, err := jwt.NewUserClaims(pub).Encode(signer)
		if err != nil {
			t.Fatal(err)
		}
		data, err := jwt.FormatUserConfig(userJWT, seed)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	mustConnect(t, natsConfig(url, func(n *config.NATS) { n.CredsFile = writeFile(t, "user.creds", creds(account)) }))

	// A user signed by an account the operator never issued.
	stranger, _ := nkeys.CreateAccount()
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { n.CredsFile = writeFile(t, "stranger.creds", creds(stranger)) }),
		nats.ErrAuthorization, "nats.creds_file")
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { n.CredsFile = writeFile(t, "bad.creds", []byte("not creds")) }),
		nil, "nats.creds_file")
}

// pki is a CA and the certificates it issued, as PEM files.
type pki struct {
	t      *testing.T
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	caFile string
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &pki{t: t, cert: cert, key: key, caFile: writeFile(t, name+"-ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// issue returns the files of a new certificate for name (a DNS name, or
// an IP address) with the given use.
func (p *pki) issue(name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	p.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		p.t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		p.t.Fatal(err)
	}
	return writeFile(p.t, name+"-cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		writeFile(p.t, name+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
}

// TestNATSMutualTLS runs a server that requires client certificates from
// its CA and whose certificate names only nats.internal (not the loopback
// address the client dials), so nats.tls.server_name is needed too.
func TestNATSMutualTLS(t *testing.T) {
	ca := newPKI(t, "natsagent-test")
	srvCert, srvKey := ca.issue("nats.internal", x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := ca.issue("worker", x509.ExtKeyUsageClientAuth)
	pair, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(ca.cert)
	url := startAuthServer(t, &server.Options{
		TLS: true, TLSVerify: true,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
	})
	good := func(n *config.NATS) {
		n.TLS = config.TLS{CAFile: ca.caFile, CertFile: cliCert, KeyFile: cliKey, ServerName: "nats.internal"}
	}
	mustConnect(t, natsConfig(url, good))

	mustRefuse(t, natsConfig(url, func(n *config.NATS) { good(n); n.TLS.ServerName = "" }), nil, "nats.tls.server_name")
	other := newPKI(t, "someone-else")
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { good(n); n.TLS.CAFile = other.caFile }), nil, "nats.tls.ca_file")
	strangerCert, strangerKey := other.issue("stranger", x509.ExtKeyUsageClientAuth)
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { good(n); n.TLS.CertFile, n.TLS.KeyFile = strangerCert, strangerKey }), nil, "nats.tls.cert_file")
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { good(n); n.TLS.CertFile, n.TLS.KeyFile = "", "" }), nil, "nats.tls.cert_file")
	mustRefuse(t, natsConfig(url, func(n *config.NATS) { good(n); n.TLS.CAFile = filepath.Join(t.TempDir(), "none.pem") }), nil, "nats.tls.ca_file")
}

func TestRedactSecrets(t *testing.T) {
	n := config.NATS{URL: "nats://svc:p%40ss@n1:4222, tls://tok3n@n2:4222", Password: "hunter22", Token: "tok3n"}
	got := redactSecrets(`parse "nats://svc:p%40ss@n1:4222": x; pass hunter22; url tls://tok3n@n2:4222`, n)
	for _, s := range []string{"p%40ss", "p@ss", "hunter22", "tok3n"} {
		if strings.Contains(got, s) {
			t.Fatalf("%q survived: %s", s, got)
		}
	}
	if !strings.Contains(got, "nats://****@n1:4222") {
		t.Fatalf("host lost: %s", got)
	}
}
