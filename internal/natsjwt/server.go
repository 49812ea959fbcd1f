package natsjwt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// ServerConfig renders the nats-server configuration fragment that
// trusts the store's operator (include it in every server's config).
// With resolverDir "" the resolver is MEMORY and every account is
// preloaded: after a change, render it again and reload the servers. With
// a directory, the resolver is full (account JWTs kept in that
// directory, changes pushed with Push, deletes allowed) and only SYS and
// AGENT are preloaded: a preload of a tenant would bring a removed tenant
// back at the next start.
func (s *Store) ServerConfig(resolverDir string) (string, error) {
	if strings.ContainsAny(resolverDir, "\"\\\n\r") {
		return "", fmt.Errorf("resolver directory %q: use a path without quotes, backslashes or line breaks", resolverDir)
	}
	op, err := s.OperatorJWT()
	if err != nil {
		return "", err
	}
	sys, err := s.Account(SystemAccount)
	if err != nil {
		return "", err
	}
	preload := []string{SystemAccount, ServiceAccount}
	var b strings.Builder
	fmt.Fprintf(&b, "# natsagent JWT mode (prefix %q), made by `natsagent jwt server-config` from %s.\n", s.prefix, s.dir)
	fmt.Fprintf(&b, "operator: %q\n", op)
	fmt.Fprintf(&b, "system_account: %s\n", sys.Subject)
	if resolverDir == "" {
		b.WriteString("# Every account is preloaded: after a change, render this file again and reload (nats-server --signal reload).\n")
		b.WriteString("resolver: MEMORY\n")
		if preload, err = s.Accounts(); err != nil {
			return "", err
		}
	} else {
		b.WriteString("# Tenants are pushed to the resolver with `natsagent jwt push`; SYS and AGENT are preloaded.\n")
		fmt.Fprintf(&b, "resolver: {\n  type: full\n  dir: %q\n  allow_delete: true\n  interval: \"2m\"\n}\n", resolverDir)
	}
	b.WriteString("resolver_preload: {\n")
	for _, name := range preload {
		ac, err := s.Account(name)
		if err != nil {
			return "", err
		}
		token, err := s.AccountJWT(name)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "  # %s\n  %s: %q\n", name, ac.Subject, token)
	}
	b.WriteString("}\n")
	return b.String(), nil
}

// PushResult is what one push did.
type PushResult struct {
	Updated []string // account names whose JWT a server took
	Deleted []string // public keys of removed tenants deleted from the resolver
}

// claimReply is a server's answer to a claims update or delete.
type claimReply struct {
	Data *struct {
		Account string `json:"account"`
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
	Error *struct {
		Account     string `json:"account"`
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// Push sends every account JWT to the servers nc reaches (nc is the
// system account's user: creds/SYS/sys.creds), which must run the full
// resolver: SYS, AGENT, then the tenants, so that exports exist before
// imports. Then, for each removed tenant, its last JWT (every user
// revoked: the server closes their connections) and a delete signed by
// the operator; a removed tenant's file is dropped once a server deleted
// it. In a cluster the servers pass pushed JWTs on to each other.
func (s *Store) Push(ctx context.Context, nc *nats.Conn) (PushResult, error) {
	var res PushResult
	names, err := s.Accounts()
	if err != nil {
		return res, err
	}
	ordered := []string{SystemAccount, ServiceAccount}
	for _, n := range names {
		if n != SystemAccount && n != ServiceAccount {
			ordered = append(ordered, n)
		}
	}
	for _, name := range ordered {
		token, err := s.AccountJWT(name)
		if err != nil {
			return res, err
		}
		if err := claimRequest(ctx, nc, "$SYS.REQ.CLAIMS.UPDATE", []byte(token)); err != nil {
			return res, fmt.Errorf("push account %s: %w", name, err)
		}
		res.Updated = append(res.Updated, name)
	}
	removed, err := filepath.Glob(s.path("removed", "*.jwt"))
	if err != nil || len(removed) == 0 {
		return res, err
	}
	var pubs []string
	for _, p := range removed {
		token, err := os.ReadFile(p)
		if err != nil {
			return res, err
		}
		ac, err := jwt.DecodeAccountClaims(string(token))
		if err != nil {
			return res, fmt.Errorf("%s: %w", p, err)
		}
		if err := claimRequest(ctx, nc, "$SYS.REQ.CLAIMS.UPDATE", token); err != nil {
			return res, fmt.Errorf("push removed account %s (%s): %w", ac.Name, ac.Subject, err)
		}
		pubs = append(pubs, ac.Subject)
	}
	op, err := s.operatorKey()
	if err != nil {
		return res, err
	}
	opPub, _ := op.PublicKey()
	del := jwt.NewGenericClaims(opPub)
	del.Data["accounts"] = pubs
	token, err := del.Encode(op)
	if err != nil {
		return res, err
	}
	if err := claimRequest(ctx, nc, "$SYS.REQ.CLAIMS.DELETE", []byte(token)); err != nil {
		return res, fmt.Errorf("delete removed accounts %s: %w (their users are revoked and cannot connect; the servers need allow_delete: true in the resolver block to delete them)", strings.Join(pubs, ", "), err)
	}
	for _, p := range removed {
		if err := os.Remove(p); err != nil {
			return res, err
		}
	}
	res.Deleted = pubs
	return res, nil
}

func claimRequest(ctx context.Context, nc *nats.Conn, subject string, body []byte) error {
	msg, err := nc.RequestWithContext(ctx, subject, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("no server answered %s: connect with the system account's user (creds/%s/%s.creds) to servers whose resolver is full (natsagent jwt server-config --resolver-dir); servers with resolver MEMORY take changes only from their config: render it again and reload", subject, SystemAccount, SystemUser)
	}
	if err != nil {
		return err
	}
	var r claimReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return fmt.Errorf("unexpected answer to %s: %q", subject, msg.Data)
	}
	if r.Error != nil {
		return fmt.Errorf("the server refused it (%d): %s", r.Error.Code, r.Error.Description)
	}
	return nil
}
