package natsjwt

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/natsagent/natsagent/internal/protocol"
)

// servicePermissions are the gateway's and the workers' (the static
// config's NATSAGENT_SERVICE), plus _R_.>: the replies to requests that
// come through a tenant's service import (submissions, cancels) go to a
// reply subject the server mapped into this account.
func (s *Store) servicePermissions() jwt.Permissions {
	var p jwt.Permissions
	p.Pub.Allow.Add("$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>", "$O.>", "$SRV.>", s.prefix+".>", "_INBOX.>", "_R_.>")
	p.Sub.Allow.Add(s.prefix+".>", "_INBOX.>", "$JS.EVENT.ADVISORY.>", "$SRV.>")
	return p
}

// permissions are what a user of account gets.
func (s *Store) permissions(account string) jwt.Permissions {
	switch account {
	case SystemAccount:
		return jwt.Permissions{}
	case ServiceAccount:
		return s.servicePermissions()
	}
	var p jwt.Permissions
	p.Pub.Allow.Add(s.TenantPublish(account)...)
	p.Sub.Allow.Add(s.TenantSubscribe(account)...)
	// Implied by the allow lists; explicit so that a wider allow entry
	// added one day still leaves the system and JetStream APIs out.
	p.Pub.Deny.Add(tenantDeny...)
	p.Sub.Deny.Add(tenantDeny...)
	return p
}

// tenantDeny are the subjects a tenant's users never get: JetStream's API,
// KV and Object Store subjects, service discovery and the system account.
var tenantDeny = []string{"$JS.>", "$KV.>", "$O.>", "$SRV.>", "$SYS.>"}

// TenantTagPrefix starts the tag each tenant user's JWT carries: with
// the tenant's name after it (TenantTag), it tells the submit service which
// tenant a request's account is (Nats-Request-Info names the account by its
// public key in operator mode). The jwt library lower-cases tags, which is
// why no two tenants may differ only in case (AddTenant).
const TenantTagPrefix = "natsagent-tenant:"

// TenantTag is the tag of tenant's users, lower-cased as the user JWT
// stores it.
func TenantTag(tenant string) string {
	return strings.ToLower(TenantTagPrefix + tenant)
}

// AddUser issues a new user of account (a tenant, AGENT or SYS) with the
// account's permissions and writes its creds file, whose path it returns.
func (s *Store) AddUser(account, user string) (string, error) {
	if err := checkAccountName(account); err != nil {
		return "", err
	}
	if err := protocol.CheckToken("user", user); err != nil {
		return "", err
	}
	if _, err := s.Account(account); err != nil {
		return "", err
	}
	if _, err := os.Stat(s.CredsPath(account, user)); err == nil {
		return "", fmt.Errorf("user %s of %s: %w (rotate its key with user-rotate)", user, account, ErrExists)
	}
	return s.issue(account, user)
}

// issue makes a new key for user and writes its creds, replacing any.
func (s *Store) issue(account, user string) (string, error) {
	accKey, err := s.accountKey(account)
	if err != nil {
		return "", err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", err
	}
	pub, _ := kp.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = user
	uc.Permissions = s.permissions(account)
	if account != SystemAccount && account != ServiceAccount {
		uc.Tags.Add(TenantTag(account))
	}
	token, err := uc.Encode(accKey)
	if err != nil {
		return "", fmt.Errorf("user %s of %s: %w", user, account, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", err
	}
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return "", err
	}
	if err := s.write(creds, "creds", account, user+".creds"); err != nil {
		return "", err
	}
	return s.CredsPath(account, user), nil
}

// userKey is the public key in user's creds file.
func (s *Store) userKey(account, user string) (string, error) {
	if err := checkAccountName(account); err != nil {
		return "", err
	}
	if err := protocol.CheckToken("user", user); err != nil {
		return "", err
	}
	data, err := os.ReadFile(s.CredsPath(account, user))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("user %s of %s: %w (add it with user-add)", user, account, ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		return "", fmt.Errorf("%s: %w", s.CredsPath(account, user), err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return "", fmt.Errorf("%s: %w", s.CredsPath(account, user), err)
	}
	return uc.Subject, nil
}

// revoke revokes every JWT of the user key pub issued until now.
func (s *Store) revoke(account, pub string) error {
	acc, err := s.Account(account)
	if err != nil {
		return err
	}
	acc.RevokeAt(pub, time.Now())
	return s.saveAccount(account, acc)
}

// RotateUser gives user a new key and creds (written over the old file,
// whose path it returns) and revokes the old key in the account's JWT:
// once the account JWT is pushed, the old creds are refused and their
// connections closed.
func (s *Store) RotateUser(account, user string) (string, error) {
	old, err := s.userKey(account, user)
	if err != nil {
		return "", err
	}
	path, err := s.issue(account, user)
	if err != nil {
		return "", err
	}
	if err := s.revoke(account, old); err != nil {
		return "", fmt.Errorf("user %s of %s has new creds, but its old key %s is not revoked: %w (revoke it by running user-rotate again)", user, account, old, err)
	}
	return path, nil
}

// RevokeUser revokes user's key in the account's JWT and deletes its
// creds file. Once the account JWT is pushed, the server refuses the user
// and closes its connections.
func (s *Store) RevokeUser(account, user string) error {
	if account == SystemAccount && user == SystemUser {
		return fmt.Errorf("user %s of %s pushes every change, this one too: rotate it (user-rotate) instead of revoking it", user, account)
	}
	pub, err := s.userKey(account, user)
	if err != nil {
		return err
	}
	if err := s.revoke(account, pub); err != nil {
		return err
	}
	return os.Remove(s.CredsPath(account, user))
}
