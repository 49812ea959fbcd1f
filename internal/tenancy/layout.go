// Package tenancy owns natsagent's NATS account layout: which account holds
// what, what the service account exports to each tenant, what each tenant
// account imports, and what a tenant's users may do. Layout describes it as
// data; static.go renders it as a nats-server configuration (accounts
// block); the JWT mode renders the same description as account claims.
//
// The layout, for prefix P and tenant T:
//   - the service account AGENT holds every stream, bucket and object
//     store; its users (gateway, worker) are the trusted services;
//   - tenant T has its own account, named T, without JetStream;
//   - AGENT exports to T alone the services P.submit.T.* (the submit
//     service, internal/intake), P.ctl.T.*.*.cancel, P.ctl.T.*.delete and
//     P.ctl.T.*.*.delete (the delete service, internal/erase), and the
//     streams P.events.T.> (stored run events) and P.live.T.> (live
//     run events: token deltas, core NATS only);
//   - T imports them as P.runs.T.* (share: the server adds
//     Nats-Request-Info, which names T's account and user), the control
//     subjects under their own names (share), P.events.T.> and
//     P.live.T.>;
//   - T's users publish only to P.runs.T.* and the control subjects and
//     subscribe only to P.events.T.>, P.live.T.> and _INBOX.>.
//
// Replies to service imports go back to the requesting client only, so a
// reply subject a tenant names never reaches a stream, a bucket or another
// tenant; each account has its own _INBOX namespace.
//
// The package describes and renders; it never connects to NATS.
package tenancy

import (
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/protocol"
)

// ServiceAccount is the account of the streams, buckets and services.
const ServiceAccount = "AGENT"

// reserved are account names a tenant may not take.
var reserved = []string{ServiceAccount, "SYS", "SYSTEM", "$G", "$SYS"}

// Kind is an export's or import's type.
type Kind string

const (
	// KindService is a request-reply service.
	KindService Kind = "service"
	// KindStream is a stream of messages (no replies).
	KindStream Kind = "stream"
)

// ResponseSingleton is a service's response type: one reply per request.
const ResponseSingleton = "singleton"

// Export is one export of the service account, usable only by the
// accounts listed (static config: `accounts: [T]`; JWT: a private export
// with token_req and an activation token for T).
type Export struct {
	Kind    Kind
	Subject string
	// ResponseType of a service ("singleton"); empty for a stream.
	ResponseType string
	// Accounts may import it: the tenant alone.
	Accounts []string
}

// Import is one import of a tenant account from the service account.
type Import struct {
	Kind Kind
	// Account exports it: ServiceAccount.
	Account string
	// Subject is the exported subject.
	Subject string
	// LocalSubject is where the tenant's clients publish (service) or
	// receive (stream) it, in the tenant's account ("to").
	LocalSubject string
	// Share makes the server add Nats-Request-Info (account, user,
	// name_tag, tags) to the requests, which the service trusts.
	Share bool
}

// Permissions of a user: what it may publish and subscribe to.
type Permissions struct {
	PublishAllow   []string
	PublishDeny    []string
	SubscribeAllow []string
	SubscribeDeny  []string
}

// TenantLayout is everything the layout says about one tenant.
type TenantLayout struct {
	Prefix string
	// Tenant is the tenant token and its account's name.
	Tenant string
	// Exports are the service account's exports for this tenant.
	Exports []Export
	// Imports are the tenant account's imports.
	Imports []Import
	// User is what every user of the tenant's account may do.
	User Permissions
}

// denied are the system subjects a tenant's users may never use: the
// JetStream API and its KV and Object Store forms, and micro service
// discovery. Permissions allow only what they list; these are spelt out
// for whoever reads the configuration.
var denied = []string{"$JS.>", "$KV.>", "$O.>", "$SRV.>"}

// CheckTenant validates a tenant name: a token (^[A-Za-z0-9_-]{1,128}$)
// that is not the name of the service or system account.
func CheckTenant(name string) error {
	if !protocol.ValidToken(name) {
		return fmt.Errorf("tenant %q is not valid: use 1 to %d characters from A-Z, a-z, 0-9, '_' and '-'", clip(name), protocol.MaxTokenLen)
	}
	for _, r := range reserved {
		if strings.EqualFold(name, r) {
			return fmt.Errorf("tenant %q is not valid: %s is the name of an account natsagent or NATS uses; choose another name", name, r)
		}
	}
	return nil
}

// CheckPrefix validates a subject prefix as bus.NewNames does.
func CheckPrefix(prefix string) error {
	if !protocol.ValidToken(prefix) || len(prefix) > 32 {
		return fmt.Errorf("prefix %q is not valid: use 1 to 32 characters from A-Z, a-z, 0-9, '_' and '-'", clip(prefix))
	}
	return nil
}

// Layout describes tenant's exports, imports and user permissions under
// prefix ("" is "agent").
func Layout(prefix, tenant string) (TenantLayout, error) {
	if prefix == "" {
		prefix = "agent"
	}
	if err := CheckPrefix(prefix); err != nil {
		return TenantLayout{}, err
	}
	if err := CheckTenant(tenant); err != nil {
		return TenantLayout{}, err
	}
	p, t := prefix, tenant
	submit := p + ".submit." + t + ".*"
	runs := p + ".runs." + t + ".*"
	cancel := p + ".ctl." + t + ".*.*.cancel"
	deleteThread := p + ".ctl." + t + ".*.delete"
	deleteRun := p + ".ctl." + t + ".*.*.delete"
	events := p + ".events." + t + ".>"
	live := p + ".live." + t + ".>"
	only := []string{t}
	return TenantLayout{
		Prefix: p,
		Tenant: t,
		Exports: []Export{
			{Kind: KindService, Subject: submit, ResponseType: ResponseSingleton, Accounts: only},
			{Kind: KindService, Subject: cancel, ResponseType: ResponseSingleton, Accounts: only},
			{Kind: KindService, Subject: deleteThread, ResponseType: ResponseSingleton, Accounts: only},
			{Kind: KindService, Subject: deleteRun, ResponseType: ResponseSingleton, Accounts: only},
			{Kind: KindStream, Subject: events, Accounts: only},
			{Kind: KindStream, Subject: live, Accounts: only},
		},
		Imports: []Import{
			{Kind: KindService, Account: ServiceAccount, Subject: submit, LocalSubject: runs, Share: true},
			{Kind: KindService, Account: ServiceAccount, Subject: cancel, LocalSubject: cancel, Share: true},
			{Kind: KindService, Account: ServiceAccount, Subject: deleteThread, LocalSubject: deleteThread, Share: true},
			{Kind: KindService, Account: ServiceAccount, Subject: deleteRun, LocalSubject: deleteRun, Share: true},
			{Kind: KindStream, Account: ServiceAccount, Subject: events, LocalSubject: events},
			{Kind: KindStream, Account: ServiceAccount, Subject: live, LocalSubject: live},
		},
		User: Permissions{
			PublishAllow:   []string{runs, cancel, deleteThread, deleteRun},
			PublishDeny:    denied,
			SubscribeAllow: []string{events, live, "_INBOX.>"},
			SubscribeDeny:  denied,
		},
	}, nil
}

// ServicePermissions are the permissions of the service account's users
// (gateway and worker), with the reason of each subject.
func ServicePermissions(prefix string) (publish, subscribe []Subject) {
	if prefix == "" {
		prefix = "agent"
	}
	return []Subject{
			{"$JS.API.>", "provisioning, consumers, stream, KV and Object Store reads, deletes"},
			{"$JS.ACK.>", "ack, nak, in-progress and term of delivered runs and jobs"},
			{"$JS.FC.>", "flow-control replies of KV watchers"},
			{"$KV.>", "KV writes: runs, threads, checkpoints, usage, memory"},
			{"$O.>", "Object Store writes: files"},
			{"$SRV.>", "discovery of remote tools (micro services)"},
			{prefix + ".>", "runs (submissions, subagents), events, cancel, worker control, dead letters, jobs, remote tool and subagent calls"},
			{"_INBOX.>", "replies to the services' own requests"},
			{"_R_.>", "replies to the tenants' requests (submit, cancel, delete), mapped back by the server to the requester alone"},
		}, []Subject{
			{prefix + ".>", "submissions of the tenants, cancel and delete requests, worker control, thread lifecycle waits, tools refresh, subagent service"},
			{"_INBOX.>", "replies and consumer deliveries"},
			{"$JS.EVENT.ADVISORY.>", "max-deliveries advisories: runs no worker could finish are dead-lettered"},
			{"$SRV.>", "discovery (PING, INFO, STATS) of the subagent service the workers serve"},
		}
}

// Subject is a permission's subject and why it is there.
type Subject struct {
	Subject string
	Why     string
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
