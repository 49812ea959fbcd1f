// Package natsjwt owns the keys and JWTs of natsagent's NATS decentralized
// auth (operator mode): an operator, the system account, the service
// account AGENT that holds every stream and bucket, and one account per
// tenant with its users. It writes them to a directory, renders the
// server configuration that trusts them and pushes account JWTs to
// running servers. It implements the account layout of
// docs/operations.md ("NATS JWT mode"), the same layout as
// deploy/nats/tenants.conf; it must not know about runs, streams'
// contents or the worker.
//
// The directory (0700; every file 0600, seeds and creds being secret):
//
//	DIR/natsjwt.json                 the prefix the exports were made for
//	DIR/operator.jwt                 the operator's JWT
//	DIR/keys/operator.nk             the operator's seed
//	DIR/keys/accounts/<name>.nk      each account's seed (SYS, AGENT, tenants)
//	DIR/accounts/<name>.jwt          each account's JWT
//	DIR/creds/<account>/<user>.creds each user's credentials (JWT and seed)
//	DIR/removed/<account key>.jwt    removed tenants' last JWT (every user revoked), kept for push
//
// One person or job changes a directory at a time: there is no locking.
package natsjwt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Account names the store gives the operator's own accounts. A tenant
// cannot take either name.
const (
	// SystemAccount is the NATS system account; its user SystemUser pushes
	// account JWTs.
	SystemAccount = "SYS"
	// ServiceAccount holds the streams, buckets and object store; its
	// users (gateway, worker) are the trusted services.
	ServiceAccount = "AGENT"
	// SystemUser is the system account's user.
	SystemUser = "sys"
)

// ServiceUsers are the users Init creates in the service account.
var ServiceUsers = []string{"gateway", "worker"}

// ErrExists is returned when a tenant, user or directory already exists.
var ErrExists = errors.New("already exists")

// ErrNotFound is returned for a tenant or user the store does not have.
var ErrNotFound = errors.New("not found")

// Store is a directory of keys and JWTs.
type Store struct {
	dir    string
	prefix string
}

type meta struct {
	Prefix string `json:"prefix"`
}

// Init creates the operator, the system account with its user, and the
// service account with its users gateway and worker, in dir (created if
// missing, refused if it already holds an operator). prefix is the
// deployment's subject prefix ("" is "agent").
func Init(dir, prefix string) (*Store, error) {
	names, err := bus.NewNames(prefix)
	if err != nil {
		return nil, err
	}
	s := &Store{dir: dir, prefix: names.Prefix}
	if _, err := os.Stat(s.path("operator.jwt")); err == nil {
		return nil, fmt.Errorf("%s already holds an operator (%w): use it, or choose an empty directory", dir, ErrExists)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	data, _ := json.Marshal(meta{Prefix: s.prefix})
	if err := s.write(data, "natsjwt.json"); err != nil {
		return nil, err
	}
	op, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	if err := s.writeSeed(op, "keys", "operator.nk"); err != nil {
		return nil, err
	}
	sys, err := s.newAccount(SystemAccount)
	if err != nil {
		return nil, err
	}
	opPub, _ := op.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "natsagent"
	oc.SystemAccount = sys.Subject
	opJWT, err := oc.Encode(op)
	if err != nil {
		return nil, err
	}
	if err := s.write([]byte(opJWT), "operator.jwt"); err != nil {
		return nil, err
	}
	if err := s.saveAccount(SystemAccount, sys); err != nil {
		return nil, err
	}
	if _, err := s.AddUser(SystemAccount, SystemUser); err != nil {
		return nil, err
	}
	agent, err := s.newAccount(ServiceAccount)
	if err != nil {
		return nil, err
	}
	// JetStream for the streams, buckets and object store, without limits:
	// bound them per stream (bus.Settings), not per account.
	agent.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	denyAll(&agent.DefaultPermissions)
	if err := s.saveAccount(ServiceAccount, agent); err != nil {
		return nil, err
	}
	for _, u := range ServiceUsers {
		if _, err := s.AddUser(ServiceAccount, u); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Open opens a directory made by Init.
func Open(dir string) (*Store, error) {
	data, err := os.ReadFile(filepath.Join(dir, "natsjwt.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s holds no natsagent JWT store: create one with `natsagent jwt init --dir %s`", dir, dir)
	}
	if err != nil {
		return nil, err
	}
	var m meta
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: natsjwt.json is damaged (want {\"prefix\":\"agent\"}): %w", dir, err)
	}
	if m.Prefix == "" {
		return nil, fmt.Errorf("%s: natsjwt.json names no prefix (want {\"prefix\":\"agent\"})", dir)
	}
	if _, err := bus.NewNames(m.Prefix); err != nil {
		return nil, fmt.Errorf("%s: natsjwt.json: %w", dir, err)
	}
	return &Store{dir: dir, prefix: m.Prefix}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Prefix is the subject prefix the exports and permissions were made for.
func (s *Store) Prefix() string { return s.prefix }

// OperatorJWT is the operator's JWT.
func (s *Store) OperatorJWT() (string, error) {
	data, err := os.ReadFile(s.path("operator.jwt"))
	return string(data), err
}

// Account is the decoded JWT of the account name.
func (s *Store) Account(name string) (*jwt.AccountClaims, error) {
	if err := checkAccountName(name); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(s.path("accounts", name+".jwt"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("account %s: %w (list them with ls %s)", name, ErrNotFound, s.path("accounts"))
	}
	if err != nil {
		return nil, err
	}
	return jwt.DecodeAccountClaims(string(data))
}

// AccountJWT is the encoded JWT of the account name.
func (s *Store) AccountJWT(name string) (string, error) {
	if err := checkAccountName(name); err != nil {
		return "", err
	}
	data, err := os.ReadFile(s.path("accounts", name+".jwt"))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("account %s: %w", name, ErrNotFound)
	}
	return string(data), err
}

// Accounts lists the accounts' names: SYS, AGENT and the tenants, sorted.
func (s *Store) Accounts() ([]string, error) {
	entries, err := os.ReadDir(s.path("accounts"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".jwt"); ok {
			names = append(names, name)
		}
	}
	return names, nil
}

// Tenants lists the tenant accounts, sorted.
func (s *Store) Tenants() ([]string, error) {
	names, err := s.Accounts()
	var out []string
	for _, n := range names {
		if n != SystemAccount && n != ServiceAccount {
			out = append(out, n)
		}
	}
	return out, err
}

// CredsPath is where the creds file of account's user is.
func (s *Store) CredsPath(account, user string) string {
	return s.path("creds", account, user+".creds")
}

// checkAccountName refuses names that are not tokens: a name becomes a
// path and, for tenants, subjects.
func checkAccountName(name string) error {
	return protocol.CheckToken("account", name)
}

// checkTenant refuses a tenant name that is not a token or is one of the
// operator's own accounts.
func checkTenant(name string) error {
	if err := protocol.CheckToken("tenant", name); err != nil {
		return err
	}
	if name == SystemAccount || name == ServiceAccount {
		return fmt.Errorf("tenant %q: the name is taken by natsagent's %s account; choose another", name,
			map[string]string{SystemAccount: "system", ServiceAccount: "service"}[name])
	}
	return nil
}

func (s *Store) path(parts ...string) string {
	return filepath.Join(append([]string{s.dir}, parts...)...)
}

// write replaces the file at parts atomically, mode 0600.
func (s *Store) write(data []byte, parts ...string) error {
	p := s.path(parts...)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

func (s *Store) writeSeed(kp nkeys.KeyPair, parts ...string) error {
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	return s.write(seed, parts...)
}

func (s *Store) readKey(parts ...string) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(s.path(parts...))
	if err != nil {
		return nil, err
	}
	return nkeys.FromSeed(seed)
}

func (s *Store) operatorKey() (nkeys.KeyPair, error) { return s.readKey("keys", "operator.nk") }

func (s *Store) accountKey(name string) (nkeys.KeyPair, error) {
	return s.readKey("keys", "accounts", name+".nk")
}

// newAccount makes a key for account name and its claims, not yet saved.
func (s *Store) newAccount(name string) (*jwt.AccountClaims, error) {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	if err := s.writeSeed(kp, "keys", "accounts", name+".nk"); err != nil {
		return nil, err
	}
	pub, _ := kp.PublicKey()
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	return ac, nil
}

// saveAccount signs ac, the account name, with the operator key and
// writes it. AGENT's JWT is named by its public key: the server reports
// an account in /jsz by its JWT's name but finds it (?acc=) by its key,
// and KEDA's nats-jetstream scaler asks for one value and matches the
// other, so only a name equal to the key lets it read the workers' lag.
func (s *Store) saveAccount(name string, ac *jwt.AccountClaims) error {
	if name == ServiceAccount {
		ac.Name = ac.Subject
	}
	op, err := s.operatorKey()
	if err != nil {
		return err
	}
	token, err := ac.Encode(op)
	if err != nil {
		return fmt.Errorf("account %s: %w", name, err)
	}
	return s.write([]byte(token), "accounts", name+".jwt")
}

// denyAll makes p refuse every subject: a user issued without
// permissions can do nothing.
func denyAll(p *jwt.Permissions) {
	p.Pub.Deny.Add(">")
	p.Sub.Deny.Add(">")
}
