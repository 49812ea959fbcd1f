package natsjwt

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
)

// share is the link of one subject between AGENT and a tenant: AGENT
// exports Remote, the tenant imports it as Local.
type share struct {
	kind   jwt.ExportType
	what   string
	remote string // in AGENT
	local  string // in the tenant's account
}

// shares are what AGENT exports to tenant and tenant imports: its
// submissions (published to P.runs.T.<thread>, served by the workers'
// submit service on P.submit.T.<thread>), its cancel and delete requests,
// and its runs' events, stored and live.
func (s *Store) shares(tenant string) []share {
	p := s.prefix
	return []share{
		{jwt.Service, "submit", p + ".submit." + tenant + ".*", p + ".runs." + tenant + ".*"},
		{jwt.Service, "cancel", p + ".ctl." + tenant + ".*.*.cancel", p + ".ctl." + tenant + ".*.*.cancel"},
		{jwt.Service, "delete-thread", p + ".ctl." + tenant + ".*.delete", p + ".ctl." + tenant + ".*.delete"},
		{jwt.Service, "delete-run", p + ".ctl." + tenant + ".*.*.delete", p + ".ctl." + tenant + ".*.*.delete"},
		{jwt.Stream, "events", p + ".events." + tenant + ".>", p + ".events." + tenant + ".>"},
		{jwt.Stream, "live", p + ".live." + tenant + ".>", p + ".live." + tenant + ".>"},
	}
}

// TenantPublish are the subjects a tenant's users may publish to.
func (s *Store) TenantPublish(tenant string) []string {
	return []string{s.prefix + ".runs." + tenant + ".*", s.prefix + ".ctl." + tenant + ".*.*.cancel",
		s.prefix + ".ctl." + tenant + ".*.delete", s.prefix + ".ctl." + tenant + ".*.*.delete"}
}

// TenantSubscribe are the subjects a tenant's users may subscribe to. The
// account has its own _INBOX namespace: no inbox prefix is needed.
func (s *Store) TenantSubscribe(tenant string) []string {
	return []string{s.prefix + ".events." + tenant + ".>", s.prefix + ".live." + tenant + ".>", "_INBOX.>"}
}

// AddTenant creates tenant's account, without JetStream, importing its
// submissions, cancels and events from AGENT; and AGENT's private exports
// of them, each activated for this account only. It changes the JWTs of
// AGENT and the tenant: push both (Push) to servers with the full
// resolver, or regenerate the server configuration for MEMORY.
func (s *Store) AddTenant(tenant string) error {
	if err := checkTenant(tenant); err != nil {
		return err
	}
	if _, err := os.Stat(s.path("accounts", tenant+".jwt")); err == nil {
		return fmt.Errorf("tenant %s: %w", tenant, ErrExists)
	}
	// Tenant tags are lower case (TenantTag): Acme's users would carry
	// acme's tag.
	tenants, err := s.Tenants()
	if err != nil {
		return err
	}
	for _, other := range tenants {
		if strings.EqualFold(other, tenant) {
			return fmt.Errorf("tenant %s: %w as %s (tenant names may not differ only in case); choose another name", tenant, ErrExists, other)
		}
	}
	agent, err := s.Account(ServiceAccount)
	if err != nil {
		return err
	}
	agentKey, err := s.accountKey(ServiceAccount)
	if err != nil {
		return err
	}
	acc, err := s.newAccount(tenant)
	if err != nil {
		return err
	}
	// No JetStream (zero limits disable it): whoever can call the API can
	// read every stream. A user issued without permissions can do nothing.
	acc.Limits.JetStreamLimits = jwt.JetStreamLimits{}
	// No leaf node connections: a tenant's creds connect clients, not
	// servers that would bridge its subjects to another network.
	acc.Limits.LeafNodeConn = 0
	denyAll(&acc.DefaultPermissions)
	for _, sh := range s.shares(tenant) {
		removeExport(agent, sh.remote)
		exp := &jwt.Export{Name: tenant + " " + sh.what, Subject: jwt.Subject(sh.remote), Type: sh.kind, TokenReq: true}
		if sh.kind == jwt.Service {
			exp.ResponseType = jwt.ResponseTypeSingleton
		}
		agent.Exports.Add(exp)
		act := jwt.NewActivationClaims(acc.Subject)
		act.Name = tenant + " " + sh.what
		act.ImportSubject = jwt.Subject(sh.remote)
		act.ImportType = sh.kind
		token, err := act.Encode(agentKey)
		if err != nil {
			return fmt.Errorf("activation of %s for %s: %w", sh.remote, tenant, err)
		}
		imp := &jwt.Import{Name: sh.what, Subject: jwt.Subject(sh.remote), Account: agent.Subject, Token: token, Type: sh.kind}
		if sh.local != sh.remote {
			imp.LocalSubject = jwt.RenamingSubject(sh.local)
		}
		// Share: the server adds Nats-Request-Info (account, user, name
		// tag, tags) to the requests it forwards, the principal the submit
		// service stamps on a run.
		imp.Share = sh.kind == jwt.Service
		acc.Imports.Add(imp)
	}
	if err := s.saveAccount(ServiceAccount, agent); err != nil {
		return err
	}
	return s.saveAccount(tenant, acc)
}

func removeExport(ac *jwt.AccountClaims, subject string) {
	out := ac.Exports[:0]
	for _, e := range ac.Exports {
		if string(e.Subject) != subject {
			out = append(out, e)
		}
	}
	ac.Exports = out
}

// RemoveTenant removes AGENT's exports to tenant and the tenant's keys,
// JWT and creds. Its last JWT, with every user revoked and no connection
// allowed, is kept in removed/ for Push, which pushes it (closing the
// tenant's connections) and then deletes the account from servers with
// the full resolver and allow_delete. It returns the account's public key.
func (s *Store) RemoveTenant(tenant string) (string, error) {
	if err := checkTenant(tenant); err != nil {
		return "", err
	}
	acc, err := s.Account(tenant)
	if errors.Is(err, ErrNotFound) {
		return "", fmt.Errorf("tenant %s: %w", tenant, ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	agent, err := s.Account(ServiceAccount)
	if err != nil {
		return "", err
	}
	for _, sh := range s.shares(tenant) {
		removeExport(agent, sh.remote)
	}
	if err := s.saveAccount(ServiceAccount, agent); err != nil {
		return "", err
	}
	acc.RevokeAt(jwt.All, time.Now())
	acc.Limits.Conn, acc.Limits.LeafNodeConn = 0, 0
	op, err := s.operatorKey()
	if err != nil {
		return "", err
	}
	token, err := acc.Encode(op)
	if err != nil {
		return "", err
	}
	if err := s.write([]byte(token), "removed", acc.Subject+".jwt"); err != nil {
		return "", err
	}
	for _, p := range []string{s.path("accounts", tenant+".jwt"), s.path("keys", "accounts", tenant+".nk")} {
		if err := os.Remove(p); err != nil {
			return "", err
		}
	}
	return acc.Subject, os.RemoveAll(s.path("creds", tenant))
}
